-- Reductions: float64 finite-difference gradient checks of sum, mean and max over dims, and
-- values by hand (max with its 1-based indices).
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(1)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end

T.test("gradcheck sum/mean/max", function()
  local x = r(3, 5, 2)
  T.gradcheck(function(a) return a:sum() end, { x })
  T.gradcheck(function(a) return a:sum(2) end, { x })
  T.gradcheck(function(a) return a:mean({ 1, 3 }, true) end, { x })
  T.gradcheck(function(a) return a:max(-1) end, { x })
  T.gradcheck(function(a) return a:max() end, { x })
end)

T.test("sum values", function()
  local x = zr.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  T.near(x:sum(), 21)
  T.near(x:sum(1), { 5, 7, 9 })
  T.near(x:sum(2), { 6, 15 })
  T.near(x:mean(-1), { 2, 5 })
  local v, i = x:max(2)
  T.near(v, { 3, 6 }); T.near(i, { 3, 3 })
  T.eq(#x:sum(2, true):shape(), 2)
end)

T.done()
