-- cat and split (ops/view.h): values, float64 finite-difference gradient check, split + cat
-- round trip with gradients. (Views themselves: tests/lua/test_autograd.lua.)
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(11)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end

-- ---------------------------------------------------------------- cat / split

T.test("cat values and gradcheck", function()
  local a = zr.tensor({ { 1, 2 }, { 3, 4 } })
  local b = zr.tensor({ { 5 }, { 6 } })
  T.near(zr.cat({ a, b }, 2), { 1, 2, 5, 3, 4, 6 }, 0)
  T.near(zr.cat({ a, a:narrow(1, 1, 1) }), { 1, 2, 3, 4, 1, 2 }, 0)
  T.gradcheck(function(x, y, z) return zr.cat({ x, y, z }, 2) end, { r(2, 3, 4), r(2, 1, 4), r(2, 5, 4) })
  T.gradcheck(function(x, y) return zr.cat({ x, y, x }, -1) end, { r(3, 2), r(3, 5) })
  T.raises(function() zr.cat({ a, b }, 1) end, "tensor 2 has shape (2,1) but tensor 1 has shape (2,2)")
end)

T.test("split + cat round trip with gradients", function()
  local x = r(5, 7)
  local parts = x:split(3, 2)
  T.eq(#parts, 3)
  T.eq(parts[3]:shape()[2], 1)
  T.near(zr.cat(parts, 2), x, 0)
  local sized = x:split({ 2, 4, 1 }, 2)
  T.eq(sized[2]:shape()[2], 4)
  T.near(sized[2], x:narrow(2, 3, 4), 0)
  -- gradients flow through the views, also when pieces are reordered and reused
  T.gradcheck(function(a)
    local p = a:split({ 2, 4, 1 }, 2)
    return zr.cat({ p[3], p[1] * p[1], p[2], p[3] }, 2)
  end, { x })
  T.gradcheck(function(a) return zr.cat(a:split(2, 1), 1) * 3 end, { r(5, 3) })
  T.raises(function() x:split({ 2, 2 }, 2) end, "sizes sum to 4 but dim 2")
end)

T.done()
