-- dropout: statistics and determinism per seed; backward reuses the forward mask.
local zr = require "zrun"
local T = zr.testing
local abs = math.abs
zr.manual_seed(11)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end

-- ---------------------------------------------------------------- dropout

T.test("dropout statistics and determinism", function()
  local n, p = 100000, 0.3
  local x = zr.ones(n)
  zr.manual_seed(5)
  local y = x:dropout(p)
  local kept = y:ne(0):to("f64"):sum():item() / n
  assert(abs(kept - (1 - p)) < 0.01, "kept fraction " .. kept)
  T.near(y:mean(), 1, 0.01)
  T.near(y:max(), 1 / (1 - p), 1e-6) -- kept values are scaled by 1/(1-p)
  zr.manual_seed(5)
  T.near(x:dropout(p), y, 0, 0, "same seed, same mask")
  T.near(x:dropout(p, false), x, 0)
  T.near(x:dropout(0), x, 0)
  T.near(x:dropout(1), zr.zeros(n), 0)
  T.raises(function() x:dropout(1.5) end, "p must be in [0, 1]")
end)

T.test("dropout backward uses the forward mask", function()
  local x = zr.ones(1000, { dtype = "f64", requires_grad = true })
  local y = x:dropout(0.4)
  y:sum():backward()
  T.near(x.grad, y, 0) -- d(sum)/dx = mask/(1-p) = y when x = 1
  T.gradcheck(function(a) zr.manual_seed(3); return a:dropout(0.4) end, { r(5, 7) })
end)

T.done()
