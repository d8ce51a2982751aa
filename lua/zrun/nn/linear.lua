-- nn.Linear: y = x W^T + b, W (out_features, in_features). torch's initialisation: W from
-- kaiming_uniform(a = sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)), and b from the same bound.
local zr = require "zrun"
local Module = require "zrun.nn.module"
local init = require "zrun.nn.init_fns"

local Linear = Module:extend("Linear")

-- Linear(in, out [, {bias=true, dtype="f32", device="cpu"}]) or Linear(in, out, false).
function Linear:__init(in_features, out_features, opts)
  if type(opts) == "boolean" then opts = { bias = opts } end
  opts = require("zrun.kwargs").check("Linear", opts, { "bias", "dtype", "device" })
  assert(type(in_features) == "number" and type(out_features) == "number",
    "Linear(in_features, out_features [, opts]): sizes must be numbers")
  self.in_features, self.out_features = in_features, out_features
  local td = { dtype = opts.dtype or "f32", device = opts.device or "cpu" }
  local w = zr.empty({ out_features, in_features }, td)
  init.kaiming_uniform_(w, math.sqrt(5))
  self.weight = Module.Parameter(w)
  if opts.bias ~= false then
    local bound = in_features > 0 and 1 / math.sqrt(in_features) or 0
    self.bias = Module.Parameter(init.uniform_(zr.empty({ out_features }, td), -bound, bound))
  end
end

-- x W^T + b (zr.linear; no b without a bias): x (..., in_features) -> (..., out_features).
function Linear:forward(x) return zr.linear(x, self.weight, self.bias) end

-- "in_features=..., out_features=..., bias=true|false", e.g. "in_features=4, out_features=3, bias=true".
function Linear:extra_repr()
  return ("in_features=%d, out_features=%d, bias=%s"):format(self.in_features, self.out_features,
    tostring(self.bias ~= nil))
end

return Linear
