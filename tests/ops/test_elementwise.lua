-- Elementwise ops: float64 finite-difference gradient checks of the unary ops at awkward sizes,
-- the binary ops with broadcasting, and the scalar operators.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(1)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
local function pos(...) return (zr.rand({ ... }, { dtype = "f64" }) + 0.5):detach():requires_grad_() end

local unary = { "neg", "exp", "sqrt", "rsqrt", "relu", "silu", "sigmoid", "tanh", "square", "abs" }
for _, name in ipairs(unary) do
  T.test("gradcheck " .. name, function()
    local x = (name == "sqrt" or name == "rsqrt") and pos(7, 3) or r(7, 3)
    T.gradcheck(function(a) return a[name](a) end, { x })
  end)
end
T.test("gradcheck log", function() T.gradcheck(function(a) return a:log() end, { pos(5) }) end)
T.test("gradcheck gelu erf", function() T.gradcheck(function(a) return a:gelu() end, { r(13) }) end)
T.test("gradcheck gelu tanh", function() T.gradcheck(function(a) return a:gelu("tanh") end, { r(13) }) end)
T.test("gradcheck pow", function() T.gradcheck(function(a) return a:pow(3) end, { pos(3, 5) }) end)
T.test("gradcheck reciprocal", function() T.gradcheck(function(a) return a:reciprocal() end, { pos(1, 7) }) end)

for _, op in ipairs { "add", "sub", "mul", "div" } do
  T.test("gradcheck broadcast " .. op, function()
    local a, b = r(3, 1, 5), (op == "div") and pos(4, 1) or r(4, 1)
    T.gradcheck(function(x, y) return x[op](x, y) end, { a, b })
  end)
end
T.test("scalar operators", function()
  local x = r(2, 3)
  T.gradcheck(function(a) return (2 - a) * 3 / 4 + 1 end, { x })
  T.gradcheck(function(a) return 1 / (a * a + 1) end, { x })
end)

T.done()
