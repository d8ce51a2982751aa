-- softmax and log_softmax: float64 finite-difference gradient checks on several dims, values
-- and numerical stability.
local zr = require "zrun"
local T = zr.testing
local exp, log = math.exp, math.log
zr.manual_seed(7)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end

-- ---------- softmax ----------

T.test("gradcheck softmax / log_softmax on dims 1 and -1", function()
  for _, d in ipairs { 1, -1, 2 } do
    T.gradcheck(function(x) return x:softmax(d) end, { r(3, 4, 5) })
    T.gradcheck(function(x) return x:log_softmax(d) end, { r(3, 4, 5) })
  end
  T.gradcheck(function(x) return zr.softmax(x) end, { r(7) })
end)

T.test("softmax values and stability", function()
  local x = zr.tensor({ { 1, 2, 3 }, { 1000, 1000, 1000 } }, { dtype = "f64" })
  local z = exp(1) + exp(2) + exp(3)
  T.near(x:softmax(), { exp(1) / z, exp(2) / z, exp(3) / z, 1 / 3, 1 / 3, 1 / 3 }, 1e-15)
  T.near(x:log_softmax(-1), { 1 - log(z), 2 - log(z), 3 - log(z), -log(3), -log(3), -log(3) }, 1e-12)
  local c = x:softmax(1) -- along columns: [1, 1000] per column
  T.near(c, { exp(-999), exp(-998), exp(-997), 1, 1, 1 }, 1e-15)
  local big = zr.tensor({ 1e4, 0, -1e4 }):softmax()
  T.near(big, { 1, 0, 0 })
  T.raises(function() x:softmax(3) end, "out of range")
end)

T.done()
