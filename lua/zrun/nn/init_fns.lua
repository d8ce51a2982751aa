-- Parameter initialisers with torch.nn.init semantics (fills in place, no autograd, returns the
-- tensor): uniform_, normal_, constant_, zeros_, ones_, xavier_*, kaiming_*, calculate_gain.
-- Fan computation follows torch: fan_in = size(2) * receptive field, fan_out = size(1) * rf.
-- no_init(fn, ...) runs fn with every initialiser a no-op, as transformers' no_init_weights does.
local C = require "zrun._C"
local M = {}
local sqrt, fmt = math.sqrt, string.format

local skipping = false
-- Runs fn(...) with the initialisers below leaving tensors as they are (allocated, not filled):
-- for building a model whose weights are about to be overwritten by a load. Returns fn's results.
function M.no_init(fn, ...)
  local prev = skipping
  skipping = true
  local res = { pcall(fn, ...) }
  skipping = prev
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end
-- Whether initialisers are being skipped (inside no_init).
function M.skipping() return skipping end

-- torch's recommended gain for a nonlinearity (default "leaky_relu", param its negative slope, 0.01):
-- 1 for linear/conv/sigmoid, 5/3 tanh, sqrt(2) relu, 3/4 selu, sqrt(2 / (1 + slope^2)) leaky_relu.
function M.calculate_gain(nonlinearity, param)
  nonlinearity = nonlinearity or "leaky_relu"
  local linear = { linear = 1, identity = 1, conv1d = 1, conv2d = 1, conv3d = 1, sigmoid = 1,
    conv_transpose1d = 1, conv_transpose2d = 1, conv_transpose3d = 1 }
  if linear[nonlinearity] then return 1 end
  if nonlinearity == "tanh" then return 5 / 3 end
  if nonlinearity == "relu" then return sqrt(2) end
  if nonlinearity == "selu" then return 3 / 4 end
  if nonlinearity == "leaky_relu" then
    local slope = param or 0.01
    if type(slope) ~= "number" then error("calculate_gain: negative_slope must be a number", 2) end
    return sqrt(2 / (1 + slope * slope))
  end
  error(fmt("calculate_gain: unsupported nonlinearity '%s'", tostring(nonlinearity)), 2)
end

-- fan_in, fan_out of a weight of 2 or more dims: size(2) and size(1) times the receptive field.
function M.calculate_fan_in_and_fan_out(t)
  local shape = t:shape()
  if #shape < 2 then
    error(fmt("fan in and fan out cannot be computed for a tensor with fewer than 2 dims (shape (%s))",
      table.concat(shape, ",")), 2)
  end
  local rf = 1
  for d = 3, #shape do rf = rf * shape[d] end
  return shape[2] * rf, shape[1] * rf
end

local function fan(t, mode)
  local fin, fout = M.calculate_fan_in_and_fan_out(t)
  if mode == "fan_in" or mode == nil then return fin end
  if mode == "fan_out" then return fout end
  error(fmt("kaiming init: mode must be 'fan_in' or 'fan_out', got '%s'", tostring(mode)), 3)
end

-- Fills t from U(a, b) (defaults 0, 1); returns t.
function M.uniform_(t, a, b) return t:uniform_(a or 0, b or 1) end
-- Fills t from N(mean, std^2) (defaults 0, 1); returns t.
function M.normal_(t, mean, std) return t:normal_(mean or 0, std or 1) end
-- Fills t with v; returns t.
function M.constant_(t, v) return t:fill_(v) end
-- Fills t with 0; returns t.
function M.zeros_(t) return t:fill_(0) end
-- Fills t with 1; returns t.
function M.ones_(t) return t:fill_(1) end

-- Glorot: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)) (gain default 1); returns t.
function M.xavier_uniform_(t, gain)
  local fin, fout = M.calculate_fan_in_and_fan_out(t)
  local a = (gain or 1) * sqrt(6 / (fin + fout))
  return t:uniform_(-a, a)
end

-- Glorot: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)) (gain default 1); returns t.
function M.xavier_normal_(t, gain)
  local fin, fout = M.calculate_fan_in_and_fan_out(t)
  return t:normal_(0, (gain or 1) * sqrt(2 / (fin + fout)))
end

-- kaiming_uniform_(t, a=0, mode="fan_in", nonlinearity="leaky_relu"): U(-b, b) with
-- b = gain * sqrt(3 / fan). nn.Linear uses a = sqrt(5), which gives b = 1 / sqrt(fan_in).
function M.kaiming_uniform_(t, a, mode, nonlinearity)
  local f = fan(t, mode)
  if f == 0 then return t end -- torch warns and leaves zero-element tensors alone
  local bound = M.calculate_gain(nonlinearity or "leaky_relu", a or 0) * sqrt(3 / f)
  return t:uniform_(-bound, bound)
end

-- kaiming_normal_(t, a=0, mode="fan_in", nonlinearity="leaky_relu"): N(0, std^2) with
-- std = gain / sqrt(fan); returns t (a zero-element t is left alone, as torch does).
function M.kaiming_normal_(t, a, mode, nonlinearity)
  local f = fan(t, mode)
  if f == 0 then return t end
  return t:normal_(0, M.calculate_gain(nonlinearity or "leaky_relu", a or 0) / sqrt(f))
end

-- Normal(mean, std) truncated to [a, b] (defaults -2, 2): rejection by redrawing the elements
-- outside the range; fine for the usual |a|, |b| >= std.
function M.trunc_normal_(t, mean, std, a, b)
  mean, std, a, b = mean or 0, std or 1, a or -2, b or 2
  if not (a < b) then error("trunc_normal_: need a < b", 2) end
  t:normal_(mean, std)
  local n = t:numel()
  for i = 1, n do
    local v = t:get_flat(i)
    local tries = 0
    while v < a or v > b do
      local r = C.randn({ 1 }, { dtype = "f64" }):item()
      v = mean + std * r
      tries = tries + 1
      if tries > 1000 then v = math.min(math.max(v, a), b) end
    end
    t:set_flat(i, v)
  end
  return t
end

-- Inside no_init every filling initialiser returns its tensor untouched.
for _, name in ipairs { "uniform_", "normal_", "constant_", "zeros_", "ones_", "xavier_uniform_",
  "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_" } do
  local fill = M[name]
  M[name] = function(t, ...)
    if skipping then return t end
    return fill(t, ...)
  end
end

return M
