-- Lua side of the Tensor class: arithmetic operators, torch-style printing, convenience casts.
local C = require "zrun._C"
local M = {}

local fmt, concat, floor, abs, huge = string.format, table.concat, math.floor, math.abs, math.huge

-- Formats all values with one width, like torch: integers plainly, floats with 4 decimals, or
-- scientific notation when magnitudes are very large or small.
local function formatter(vals, dtype)
  local isint = dtype == "i32" or dtype == "i64" or dtype == "u8"
  local maxa, mina, allint = 0, huge, true
  for i = 1, #vals do
    local v = vals[i]
    if v ~= v or v == huge or v == -huge then
      -- nan/inf: handled by tostring below
    else
      local a = abs(v)
      if a > maxa then maxa = a end
      if a ~= 0 and a < mina then mina = a end
      if v ~= floor(v) then allint = false end
    end
  end
  local f
  if isint then
    f = function(v) return fmt("%d", v) end
  elseif allint and maxa < 1e8 then
    f = function(v) return (v ~= v or abs(v) == huge) and tostring(v) or fmt("%.0f.", v) end
  elseif maxa >= 1e8 or (mina < 1e-4 and mina ~= huge) then
    f = function(v) return fmt("%.4e", v) end
  else
    f = function(v) return (v ~= v or abs(v) == huge) and tostring(v) or fmt("%.4f", v) end
  end
  local w = 0
  for i = 1, #vals do
    local s = f(vals[i])
    if #s > w then w = #s end
  end
  return function(v) local s = f(v); return string.rep(" ", w - #s) .. s end
end

-- Returns the printed body of a tensor: nested brackets, "..." for long dims (edge 3).
local function body(t)
  local shape, n = t:shape(), t:numel()
  local summarize = n > 1000
  local flat = t:flat_table()
  local f = formatter(flat, t:dtype())
  local nd = #shape
  if nd == 0 then return f(flat[1]) end
  local strides = {}
  local s = 1
  for d = nd, 1, -1 do strides[d] = s; s = s * shape[d] end
  local function rec(d, base, indent)
    local parts = {}
    local sz = shape[d]
    local idxs = {}
    if summarize and sz > 6 then idxs = { 1, 2, 3, false, sz - 2, sz - 1, sz }
    else for i = 1, sz do idxs[#idxs + 1] = i end end
    for _, i in ipairs(idxs) do
      if not i then parts[#parts + 1] = "..."
      elseif d == nd then parts[#parts + 1] = f(flat[base + (i - 1) * strides[d] + 1])
      else parts[#parts + 1] = rec(d + 1, base + (i - 1) * strides[d], indent .. " ") end
    end
    if d == nd then return "[" .. concat(parts, ", ") .. "]" end
    local sep = "," .. string.rep("\n", nd - d) .. indent .. " "
    return "[" .. concat(parts, sep) .. "]"
  end
  return rec(1, 0, "       ")
end

-- A tensor as PyTorch prints it: tensor([...], dtype=..., device=..., grad_fn=<...>).
function M.tostring(t)
  local extra = {}
  local dt, dev = t:dtype(), t:device()
  if dt ~= "f32" then extra[#extra + 1] = "dtype=" .. dt end
  if dev ~= "cpu" then extra[#extra + 1] = "device='" .. dev .. "'" end
  if t.grad_fn then extra[#extra + 1] = "grad_fn=<" .. t.grad_fn .. ">"
  elseif t.requires_grad then extra[#extra + 1] = "requires_grad=true" end
  local b
  if t:numel() == 0 then b = "[]" .. ", size=(" .. concat(t:shape(), ",") .. ")" else b = body(t) end
  if #extra > 0 then return "tensor(" .. b .. ", " .. concat(extra, ", ") .. ")" end
  return "tensor(" .. b .. ")"
end

-- Gives tensors their Lua side: arithmetic operators, printing and the methods written in Lua.
function M.install(zr)
  local mt = C.tensor_metatable()
  local methods = C.tensor_methods()
  mt.__add = C.add
  mt.__sub = C.sub
  mt.__mul = C.mul
  mt.__div = C.div
  mt.__unm = C.neg
  mt.__pow = function(a, p) return C.pow(a, p) end
  mt.__tostring = M.tostring
  mt.__len = function(t) return t:size(1) end
  methods.float = function(t) return t:to("f32") end
  methods.double = function(t) return t:to("f64") end
  methods.bfloat16 = function(t) return t:to("bf16") end
  methods.half = function(t) return t:to("f16") end
  methods.long = function(t) return t:to("i64") end
  methods.int = function(t) return t:to("i32") end
  methods.cpu = function(t) return t:to("cpu") end
  methods.cuda = function(t, i) return t:to(i and ("cuda:" .. i) or "cuda") end
  -- Nested Lua table of the values.
  methods.tolist = function(t)
    local shape, flat = t:shape(), t:flat_table()
    if #shape == 0 then return flat[1] end
    local pos = 0
    local function rec(d)
      local r = {}
      for i = 1, shape[d] do
        if d == #shape then pos = pos + 1; r[i] = flat[pos] else r[i] = rec(d + 1) end
      end
      return r
    end
    return rec(1)
  end
  zr.Tensor = methods
end

return M
