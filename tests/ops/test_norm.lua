-- rms_norm, layer_norm and their residual-add forms (add_rms_norm, add_layer_norm): values derived
-- by hand or by a naive loop, float64 finite-difference gradient checks, bf16 rounding like
-- LlamaRMSNorm, errors.
local zr = require "zrun"
local T = zr.testing
local sqrt = math.sqrt
zr.manual_seed(11)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
local function c(...) return zr.randn({ ... }, { dtype = "f64" }) end

-- ---------------------------------------------------------------- rms_norm

T.test("rms_norm by hand", function()
  local x = zr.tensor({ { 1, 2, 3, 4 }, { -2, 0, 0, 0 } }, { dtype = "f64" })
  local w = zr.tensor({ 1, 0.5, 2, -1 }, { dtype = "f64" })
  -- row 1: mean(x^2) = 30/4 = 7.5; row 2: mean = 4/4 = 1
  local r1, r2 = 1 / sqrt(7.5 + 1e-6), 1 / sqrt(1 + 1e-6)
  T.near(x:rms_norm(w, 1e-6), { r1, 2 * 0.5 * r1, 3 * 2 * r1, -4 * r1, -2 * r2, 0, 0, 0 }, 1e-14)
  T.near(zr.rms_norm(x, nil, 0), { 1 / sqrt(7.5), 2 / sqrt(7.5), 3 / sqrt(7.5), 4 / sqrt(7.5), -2, 0, 0, 0 }, 1e-14)
  -- f32 agrees to float precision and keeps the dtype
  local y = x:float():rms_norm(w:float(), 1e-6)
  T.eq(y:dtype(), "f32")
  T.near(y, x:rms_norm(w, 1e-6), 1e-6)
end)

T.test("gradcheck rms_norm", function()
  T.gradcheck(function(a, w) return a:rms_norm(w, 1e-5) end, { r(2, 7, 5), r(5) })
  T.gradcheck(function(a, w) return a:rms_norm(w, 0.1) end, { r(3, 6), r(6) })
  T.gradcheck(function(a) return a:rms_norm(nil, 1e-6) end, { r(1, 6) })
  T.gradcheck(function(a, w) return a:rms_norm(w) end, { c(4, 5), r(5) }) -- weight only
end)

T.test("rms_norm bf16 rounds like LlamaRMSNorm", function()
  local x = zr.randn(3, 7):bfloat16()
  local w = (zr.rand(7) + 0.5):bfloat16()
  local y = x:rms_norm(w, 1e-6)
  T.eq(y:dtype(), "bf16")
  -- reference: normalise in f32, round to bf16, multiply by the weight in f32, round to bf16
  local h = x:float():rms_norm(nil, 1e-6):bfloat16():float()
  T.near(y:float(), (h * w:float()):bfloat16():float(), 0)
end)

-- Gemma's RMSNorm (Gemma3RMSNorm): x normalised in f32 times (1 + weight) in f32, rounded to x's dtype once
T.test("rms_norm unit_offset (Gemma's 1 + weight): by hand, gradcheck, rounded once in bf16", function()
  local x = zr.tensor({ { 1, 2, 3, 4 }, { -2, 0, 0, 0 } }, { dtype = "f64" })
  local w = zr.tensor({ 0, -0.5, 1, -2 }, { dtype = "f64" })
  local r1, r2 = 1 / sqrt(7.5 + 1e-6), 1 / sqrt(1 + 1e-6)
  T.near(zr.rms_norm(x, w, 1e-6, true), { r1, 2 * 0.5 * r1, 3 * 2 * r1, -4 * r1, -2 * r2, 0, 0, 0 }, 1e-14)
  T.gradcheck(function(a, v) return zr.rms_norm(a, v, 1e-5, true) end, { r(2, 7, 5), r(5) })
  T.gradcheck(function(a, b, v)
    local h, y = zr.add_rms_norm(a, b, v, 1e-5, true)
    return y + h * 0.5
  end, { r(3, 6), r(3, 6), r(6) })
  -- bf16: the reference rounds once (transformers: (x.float() normalised * (1 + w.float())).type_as(x)); the
  -- weights near zero, as Gemma's start
  local xb = zr.randn(5, 33):bfloat16()
  for _, wd in ipairs { "bf16", "f32" } do
    local wb = (zr.randn(33) * 0.05):to(wd)
    local want = (xb:float():rms_norm(nil, 1e-6) * (wb:float() + 1)):bfloat16()
    T.near(zr.rms_norm(xb, wb, 1e-6, true):float(), want:float(), 0, 0, "bf16 x, " .. wd .. " weight")
    local h, y = zr.add_rms_norm(xb, xb * 0.5, wb, 1e-6, true)
    T.near(y:float(), zr.rms_norm(h, wb, 1e-6, true):float(), 0, 0, "add_rms_norm unit_offset")
  end
  -- Llama's norm rounds the normalised x first: the two differ somewhere in bf16
  local wb = (zr.randn(33) * 0.05 + 1):bfloat16()
  local one = zr.rms_norm(xb, wb - 1, 1e-6, true):float()
  assert(((one - zr.rms_norm(xb, wb, 1e-6):float()):abs():max():item()) > 0, "one rounding vs two")
  T.raises(function() zr.rms_norm(xb, nil, 1e-6, true) end, "unit_offset (Gemma's 1 + weight) needs a weight")
end)

T.test("rms_norm errors", function()
  T.raises(function() zr.randn(2, 6):rms_norm(zr.ones(5)) end, "weight has shape (5) but x is (2,6); expected (6)")
  T.raises(function() zr.zeros(2, 3, { dtype = "i64" }):rms_norm() end, "floating-point")
end)

-- ---------------------------------------------------------------- add_rms_norm

T.test("add_rms_norm: h = x + r and y = rms_norm(h) by a naive loop", function()
  local x, rr, w = c(3, 5), c(3, 5), c(5)
  local h, y = zr.add_rms_norm(x, rr, w, 1e-5)
  local X, R, W, H, Y = T.flat(x), T.flat(rr), T.flat(w), T.flat(h), T.flat(y)
  for i = 0, 2 do
    local ss = 0
    for j = 1, 5 do ss = ss + (X[i * 5 + j] + R[i * 5 + j]) ^ 2 end
    local rs = 1 / sqrt(ss / 5 + 1e-5)
    for j = 1, 5 do
      local k = i * 5 + j
      T.near(H[k], X[k] + R[k], 1e-15)
      T.near(Y[k], (X[k] + R[k]) * rs * W[j], 1e-14)
    end
  end
  T.near(select(2, x:add_rms_norm(rr)), (x + rr):rms_norm(), 1e-15) -- the method form; weight optional
end)

T.test("gradcheck add_rms_norm (h's own gradient and the norm's)", function()
  T.gradcheck(function(a, b, w)
    local h, y = zr.add_rms_norm(a, b, w, 1e-5)
    return y + h * 0.3
  end, { r(2, 3, 7), r(2, 3, 7), r(7) })
  T.gradcheck(function(a, b, w) return select(2, zr.add_rms_norm(a, b, w, 0.1)) end, { r(4, 6), r(4, 6), r(6) })
  T.gradcheck(function(a, b) return select(2, zr.add_rms_norm(a, b, nil, 1e-6)) end, { r(1, 5), r(5) }) -- broadcast r
end)

T.test("add_rms_norm bf16: h rounded to bf16 before the norm", function()
  local x, rr = zr.randn(3, 9):bfloat16(), zr.randn(3, 9):bfloat16()
  local w = (zr.rand(9) + 0.5):bfloat16()
  local h, y = zr.add_rms_norm(x, rr, w, 1e-6)
  T.eq(h:dtype(), "bf16")
  T.eq(y:dtype(), "bf16")
  local hr = (x:float() + rr:float()):bfloat16()
  T.near(h:float(), hr:float(), 0)
  T.near(y:float(), hr:rms_norm(w, 1e-6):float(), 0)
end)

T.test("add_rms_norm errors", function()
  T.raises(function() zr.add_rms_norm(zr.randn(2, 6), zr.randn(2, 6), zr.ones(5)) end,
    "add_rms_norm: weight has shape (5) but x is (2,6); expected (6)")
  T.raises(function() zr.add_rms_norm(zr.randn(2, 6), zr.zeros(2, 6, { dtype = "i64" })) end, "floating-point")
  T.raises(function() zr.add_rms_norm(zr.randn(2, 6), zr.randn(3, 6)) end, "add")
end)

-- ---------------------------------------------------------------- layer_norm

T.test("layer_norm by hand", function()
  local x = zr.tensor({ { 1, 2, 3, 4 } }, { dtype = "f64" })
  local w = zr.tensor({ 2, 1, 1, 0.5 }, { dtype = "f64" })
  local b = zr.tensor({ 0, 1, -1, 0 }, { dtype = "f64" })
  -- mean 2.5, biased variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
  local s = 1 / sqrt(1.25 + 1e-5)
  T.near(x:layer_norm(w, b, 1e-5), { -1.5 * s * 2, -0.5 * s + 1, 0.5 * s - 1, 1.5 * s * 0.5 }, 1e-14)
  T.near(x:layer_norm(), { -1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s }, 1e-14)
end)

T.test("gradcheck layer_norm", function()
  T.gradcheck(function(a, w, b) return a:layer_norm(w, b, 1e-5) end, { r(2, 7, 5), r(5), r(5) })
  T.gradcheck(function(a, w, b) return a:layer_norm(w, b, 0.01) end, { r(1, 6), r(6), r(6) })
  T.gradcheck(function(a) return a:layer_norm() end, { r(3, 6) })
  T.gradcheck(function(a, b) return a:layer_norm(nil, b) end, { r(3, 5), r(5) })
end)

-- ---------------------------------------------------------------- add_layer_norm

T.test("add_layer_norm: h = x + r and y = layer_norm(h) by a naive loop", function()
  local x, rr, w, b = c(3, 7), c(3, 7), c(7), c(7)
  local h, y = zr.add_layer_norm(x, rr, w, b, 1e-5)
  local X, R, W, B, H, Y = T.flat(x), T.flat(rr), T.flat(w), T.flat(b), T.flat(h), T.flat(y)
  for i = 0, 2 do
    local s, ss = 0, 0
    for j = 1, 7 do s = s + X[i * 7 + j] + R[i * 7 + j] end
    local mu = s / 7
    for j = 1, 7 do ss = ss + (X[i * 7 + j] + R[i * 7 + j] - mu) ^ 2 end
    local rs = 1 / sqrt(ss / 7 + 1e-5) -- biased variance, as torch.nn.LayerNorm
    for j = 1, 7 do
      local k = i * 7 + j
      T.near(H[k], X[k] + R[k], 1e-15)
      T.near(Y[k], (X[k] + R[k] - mu) * rs * W[j] + B[j], 1e-13)
    end
  end
  -- the method form; weight and bias optional, eps 1e-5 by default
  T.near(select(2, x:add_layer_norm(rr)), (x + rr):layer_norm(nil, nil, 1e-5), 1e-15)
  T.near(select(2, x:add_layer_norm(rr, nil, b, 0.5)), (x + rr):layer_norm(nil, b, 0.5), 1e-15)
end)

T.test("gradcheck add_layer_norm (y alone, h alone, both)", function()
  T.gradcheck(function(a, bb, w, bias)
    local h, y = zr.add_layer_norm(a, bb, w, bias, 1e-5)
    return y + h * 0.3
  end, { r(2, 3, 7), r(2, 3, 7), r(7), r(7) })
  T.gradcheck(function(a, bb, w, bias) return select(2, zr.add_layer_norm(a, bb, w, bias, 0.1)) end,
    { r(4, 5), r(4, 5), r(5), r(5) })
  T.gradcheck(function(a, bb) return (zr.add_layer_norm(a, bb, nil, nil, 1e-5)) end, { r(3, 1), r(3, 1) })
  T.gradcheck(function(a, bb, w) return select(2, zr.add_layer_norm(a, bb, w, nil, 1e-6)) end, { r(1, 5), r(5), r(5) }) -- broadcast r
end)

-- the op against add then layer_norm, run separately: values and the gradients of x, r, weight
-- and bias, with y only, h only and both used (h's own gradient plus the norm's)
T.test("add_layer_norm equals add then layer_norm, f32 and bf16, odd widths", function()
  local uses = {
    y = function(h, y) return y end,
    h = function(h) return h * 0.7 end,
    both = function(h, y) return zr.cat({ h, y }, 1) end,
  }
  for _, dt in ipairs { "f32", "bf16" } do
    for _, sh in ipairs { { 1, 1 }, { 3, 13 }, { 2, 5, 127 } } do
      local D = sh[#sh]
      local x0, r0, w0, b0 = zr.randn(sh):to(dt), zr.randn(sh):to(dt), zr.randn(D):to(dt), zr.randn(D):to(dt)
      for use, f in pairs(uses) do
        local function run(fused)
          local x, rr, w, b = x0:clone():requires_grad_(true), r0:clone():requires_grad_(true),
            w0:clone():requires_grad_(true), b0:clone():requires_grad_(true)
          local h, y
          if fused then h, y = zr.add_layer_norm(x, rr, w, b, 1e-5)
          else h = x + rr; y = zr.layer_norm(h, w, b, 1e-5) end
          local out = f(h, y)
          zr.manual_seed(5)
          ;(out:float() * zr.randn(out:shape())):sum():backward()
          return out, { x.grad, rr.grad, w.grad, b.grad }
        end
        local o1, g1 = run(true)
        local o2, g2 = run(false)
        local what = ("%s %s %s"):format(dt, table.concat(sh, ","), use)
        T.eq(o1:dtype(), dt, what)
        T.near(o1:float(), o2:float(), 0, 0, what .. " forward")
        for i, name in ipairs { "x", "r", "weight", "bias" } do
          if use == "h" and i > 2 then
            assert(not g1[i] or g1[i]:abs():max():item() == 0, what .. ": " .. name .. " has a gradient")
          else
            T.near(g1[i]:float(), g2[i]:float(), 0, 0, what .. " grad " .. name)
          end
        end
      end
    end
  end
end)

T.test("add_layer_norm bf16: h rounded to bf16 before the norm", function()
  local x, rr = zr.randn(3, 9):bfloat16(), zr.randn(3, 9):bfloat16()
  local w, b = (zr.rand(9) + 0.5):bfloat16(), zr.randn(9):bfloat16()
  local h, y = zr.add_layer_norm(x, rr, w, b, 1e-5)
  T.eq(h:dtype(), "bf16")
  T.eq(y:dtype(), "bf16")
  local hr = (x:float() + rr:float()):bfloat16()
  T.near(h:float(), hr:float(), 0)
  -- the norm of the rounded h (in f32, then rounded), not of the exact sum
  T.near(y:float(), hr:float():layer_norm(w:float(), b:float(), 1e-5):bfloat16():float(), 0)
end)

T.test("add_layer_norm errors", function()
  T.raises(function() zr.add_layer_norm(zr.randn(2, 6), zr.randn(2, 6), zr.ones(5)) end,
    "add_layer_norm: weight has shape (5) but x is (2,6); expected (6)")
  T.raises(function() zr.add_layer_norm(zr.randn(2, 6), zr.randn(2, 6), zr.ones(6), zr.zeros(7)) end,
    "add_layer_norm: bias has shape (7) but x is (2,6); expected (6)")
  T.raises(function() zr.add_layer_norm(zr.randn(2, 6), zr.zeros(2, 6, { dtype = "i64" })) end, "floating-point")
  T.raises(function() zr.add_layer_norm(zr.randn(2, 6), zr.randn(3, 6)) end, "add")
end)

T.done()
