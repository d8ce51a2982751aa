-- nn.LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * weight + bias, weight ones and
-- bias zeros. eps defaults to 1e-5 as in torch.
local zr = require "zrun"
local Module = require "zrun.nn.module"
local init = require "zrun.nn.init_fns"

local LayerNorm = Module:extend("LayerNorm")

-- LayerNorm(dim [, eps=1e-5 [, {elementwise_affine=true, bias=true, dtype=, device=}]])
function LayerNorm:__init(dim, eps, opts)
  if type(eps) == "table" then opts, eps = eps, nil end
  opts = require("zrun.kwargs").check("LayerNorm", opts, { "eps", "elementwise_affine", "bias", "dtype", "device" })
  assert(type(dim) == "number", "LayerNorm(dim [, eps]): dim must be a number (the last dim's size)")
  self.dim, self.eps = dim, eps or opts.eps or 1e-5
  self.elementwise_affine = opts.elementwise_affine ~= false
  local td = { dtype = opts.dtype or "f32", device = opts.device or "cpu" }
  if self.elementwise_affine then
    self.weight = Module.Parameter(init.ones_(zr.empty({ dim }, td)))
    if opts.bias ~= false then self.bias = Module.Parameter(init.zeros_(zr.empty({ dim }, td))) end
  end
end

-- zr.layer_norm(x, weight, bias, eps) over x's last dim (of size dim); nil weight and bias without
-- elementwise_affine. Returns a tensor of x's shape.
function LayerNorm:forward(x) return zr.layer_norm(x, self.weight, self.bias, self.eps) end

-- "(dim,), eps=..., elementwise_affine=...", e.g. "(768,), eps=1e-05, elementwise_affine=true".
function LayerNorm:extra_repr()
  return ("(%d,), eps=%g, elementwise_affine=%s"):format(self.dim, self.eps, tostring(self.elementwise_affine))
end

return LayerNorm
