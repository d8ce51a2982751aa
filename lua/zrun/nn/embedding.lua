-- nn.Embedding: a (num_embeddings, embedding_dim) table looked up by integer ids; weight
-- initialised from N(0, 1) as in torch.
local zr = require "zrun"
local Module = require "zrun.nn.module"
local init = require "zrun.nn.init_fns"

local Embedding = Module:extend("Embedding")

-- Embedding(num_embeddings, embedding_dim [, {dtype=, device=}])
function Embedding:__init(num_embeddings, embedding_dim, opts)
  opts = require("zrun.kwargs").check("Embedding", opts, { "dtype", "device" })
  assert(type(num_embeddings) == "number" and type(embedding_dim) == "number",
    "Embedding(num_embeddings, embedding_dim [, opts]): sizes must be numbers")
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  local w = zr.empty({ num_embeddings, embedding_dim }, { dtype = opts.dtype or "f32", device = opts.device or "cpu" })
  self.weight = Module.Parameter(init.normal_(w, 0, 1))
end

-- The rows of weight at ids (an integer tensor of any shape): a tensor of shape ids' shape +
-- (embedding_dim).
function Embedding:forward(ids) return zr.embedding(self.weight, ids) end

-- "num_embeddings, embedding_dim", e.g. "50257, 768".
function Embedding:extra_repr() return ("%d, %d"):format(self.num_embeddings, self.embedding_dim) end

return Embedding
