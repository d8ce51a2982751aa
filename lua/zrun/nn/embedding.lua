-- nn.Embedding: a (num_embeddings, embedding_dim) table looked up by integer ids; weight
-- initialised from N(0, 1) as in torch, with torch's padding_idx (a row that the lookup gives no
-- gradient, zero at init).
local zr = require "zrun"
local Module = require "zrun.nn.module"
local init = require "zrun.nn.init_fns"

local Embedding = Module:extend("Embedding")

-- Embedding(num_embeddings, embedding_dim [, {dtype=, device=, padding_idx=}])
-- padding_idx (0-based; negative counts from the end, as torch): the row of that id gets no
-- gradient from the lookup (a tied head's gradient still reaches it) and starts at zero.
function Embedding:__init(num_embeddings, embedding_dim, opts)
  opts = require("zrun.kwargs").check("Embedding", opts, { "dtype", "device", "padding_idx" })
  assert(type(num_embeddings) == "number" and type(embedding_dim) == "number",
    "Embedding(num_embeddings, embedding_dim [, opts]): sizes must be numbers")
  self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
  local pad = opts.padding_idx
  if pad ~= nil then
    if type(pad) ~= "number" or pad ~= math.floor(pad) or pad < -num_embeddings or pad >= num_embeddings then
      error(("Embedding: padding_idx must be an integer in [%d, %d), got %s"):format(-num_embeddings, num_embeddings,
        tostring(pad)), 2)
    end
    if pad < 0 then pad = pad + num_embeddings end
    rawset(self, "padding_idx", pad)
  end
  local w = zr.empty({ num_embeddings, embedding_dim }, { dtype = opts.dtype or "f32", device = opts.device or "cpu" })
  self.weight = Module.Parameter(init.normal_(w, 0, 1))
  self:zero_padding_row()
end

-- Zeroes the padding_idx row of weight (torch's reset_parameters; transformers' _init_weights), if any.
function Embedding:zero_padding_row()
  local pad = rawget(self, "padding_idx")
  if pad then init.zeros_(self.weight:narrow(1, pad + 1, 1)) end
end

-- The rows of weight at ids (an integer tensor of any shape): a tensor of shape ids' shape +
-- (embedding_dim). With padding_idx, the positions holding it pass no gradient to the table (when
-- one is recorded: one more elementwise pass over the output).
function Embedding:forward(ids)
  local h = zr.embedding(self.weight, ids)
  local pad = rawget(self, "padding_idx")
  if pad and h.requires_grad then h = zr.where(ids:eq(pad):unsqueeze(-1), h:detach(), h) end
  return h
end

-- "num_embeddings, embedding_dim", e.g. "50257, 768".
function Embedding:extra_repr() return ("%d, %d"):format(self.num_embeddings, self.embedding_dim) end

return Embedding
