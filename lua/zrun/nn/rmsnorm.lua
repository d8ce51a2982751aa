-- nn.RMSNorm over the last dim: y = x / sqrt(mean(x^2) + eps) * weight, weight initialised to
-- ones. eps defaults to 1e-6 (the Hugging Face Llama value).
local zr = require "zrun"
local Module = require "zrun.nn.module"
local init = require "zrun.nn.init_fns"

local RMSNorm = Module:extend("RMSNorm")

-- RMSNorm(dim [, eps=1e-6 [, {elementwise_affine=true, dtype=, device=}]])
function RMSNorm:__init(dim, eps, opts)
  if type(eps) == "table" then opts, eps = eps, nil end
  opts = require("zrun.kwargs").check("RMSNorm", opts, { "eps", "elementwise_affine", "dtype", "device" })
  assert(type(dim) == "number", "RMSNorm(dim [, eps]): dim must be a number")
  self.dim, self.eps = dim, eps or opts.eps or 1e-6
  self.elementwise_affine = opts.elementwise_affine ~= false
  if self.elementwise_affine then
    self.weight = Module.Parameter(init.ones_(zr.empty({ dim }, { dtype = opts.dtype or "f32", device = opts.device or "cpu" })))
  end
end

-- zr.rms_norm(x, weight, eps) over x's last dim (of size dim); nil weight without
-- elementwise_affine. Returns a tensor of x's shape.
function RMSNorm:forward(x) return zr.rms_norm(x, self.weight, self.eps) end

-- "(dim,), eps=..., elementwise_affine=...", e.g. "(2048,), eps=1e-06, elementwise_affine=true".
function RMSNorm:extra_repr()
  return ("(%d,), eps=%g, elementwise_affine=%s"):format(self.dim, self.eps, tostring(self.elementwise_affine))
end

return RMSNorm
