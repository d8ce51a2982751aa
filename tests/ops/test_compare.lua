-- Comparisons (u8 masks), where and masked_fill: values, float64 finite-difference gradient
-- check of where, zero gradient under masked_fill's mask, broadcast errors.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(11)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
local function c(...) return zr.randn({ ... }, { dtype = "f64" }) end

-- ---------------------------------------------------------------- where / masked_fill / compare

T.test("comparisons", function()
  local x = zr.tensor({ 1, -2, 3, 0 })
  T.eq(x:gt(0):dtype(), "u8")
  T.near(x:gt(0), { 1, 0, 1, 0 }, 0)
  T.near(x:lt(0), { 0, 1, 0, 0 }, 0)
  T.near(zr.eq(x, 3), { 0, 0, 1, 0 }, 0)
  T.near(x:ge(zr.tensor({ 1, 1, 4, -1 })), { 1, 0, 0, 1 }, 0)
  T.near(x:ne(0):logical_not(), { 0, 0, 0, 1 }, 0)
  local ids = zr.tensor({ 128000, -100, 7 }, { dtype = "i64" })
  T.near(ids:eq(-100), { 0, 1, 0 }, 0)
end)

T.test("where values and gradcheck", function()
  local cond = zr.tensor({ 1, 0, 1 }, { dtype = "u8" })
  T.near(zr.where(cond, zr.tensor({ 1, 2, 3 }), zr.tensor({ -1, -2, -3 })), { 1, -2, 3 }, 0)
  T.near(zr.where(cond, zr.tensor({ 1, 2, 3 }), 0), { 1, 0, 3 }, 0)
  local m = zr.rand(4, 5):gt(0.5)
  T.gradcheck(function(a, b) return zr.where(m, a, b) end, { r(3, 1, 5), r(4, 5) })
  T.gradcheck(function(a) return zr.where(m, a, -1) end, { r(5) })
  T.raises(function() zr.where(zr.ones(3), zr.ones(3), zr.ones(3)) end, "u8 mask")
end)

T.test("masked_fill: values and zero gradient under the mask", function()
  local mask = zr.tensor({ 0, 1, 1, 0 }, { dtype = "u8" })
  local x = zr.tensor({ { 1, 2, 3, 4 }, { 5, 6, 7, 8 } }, { dtype = "f64", requires_grad = true })
  local y = x:masked_fill(mask, -1e9)
  T.near(y, { 1, -1e9, -1e9, 4, 5, -1e9, -1e9, 8 }, 0)
  local w = c(2, 4);
  (y * w):sum():backward()
  local expect, fw = {}, w:flat_table()
  for i = 1, 8 do expect[i] = ((i - 1) % 4 == 1 or (i - 1) % 4 == 2) and 0 or fw[i] end
  T.near(x.grad, expect, 0)
  T.gradcheck(function(a) return a:masked_fill(mask, 2.5) end, { r(3, 4) })
  -- causal mask built from comparisons: future positions filled with -inf
  local pos = zr.arange(0, 3, 1)
  local future = pos:view(3, 1):lt(pos:view(1, 3))
  local s = zr.zeros(3, 3):masked_fill(future, -math.huge):flat_table()
  local want = { 0, -math.huge, -math.huge, 0, 0, -math.huge, 0, 0, 0 }
  for i = 1, 9 do T.eq(s[i], want[i], "causal mask element " .. i) end
  T.raises(function() x:masked_fill(zr.ones(3, { dtype = "u8" }), 0) end, "does not broadcast to x's shape (2,4)")
end)

T.done()
