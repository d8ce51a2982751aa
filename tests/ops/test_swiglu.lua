-- The fused SwiGLU zr.swiglu(gate, up) = silu(gate) * up: forward against the formula evaluated
-- element by element in Lua (f32, bf16, awkward shapes), float64 finite-difference gradchecks,
-- agreement with the unfused `gate:silu() * up` and its gradients, what backward keeps, errors.
local zr = require "zrun"
local T = zr.testing
local exp, abs, max = math.exp, math.abs, math.max
zr.manual_seed(23)

local SHAPES = { { 1 }, { 7 }, { 3, 5, 17 } }
local function r(shape, s) return (zr.randn(shape, { dtype = "f64" }) * (s or 1)):detach():requires_grad_(true) end
local function c(shape) return zr.randn(shape, { dtype = "f64" }) end
local function name(shape) return "(" .. table.concat(shape, ",") .. ")" end

-- silu(x) * u from the (already dtype-rounded) values of the inputs, in Lua doubles.
local function formula(g, u)
  local fg, fu, out = g:flat_table(), u:flat_table(), {}
  for i = 1, #fg do out[i] = fg[i] / (1 + exp(-fg[i])) * fu[i] end
  return out
end

local function maxabs(t)
  local m = 0
  for _, v in ipairs(T.flat(t)) do m = max(m, abs(v)) end
  return m
end

T.test("swiglu forward matches x / (1 + exp(-x)) * u (f32, bf16; shapes 1, 7, (3,5,17))", function()
  for _, dt in ipairs { "f32", "bf16" } do
    for _, sh in ipairs(SHAPES) do
      local g = (zr.randn(sh) * 4):to(dt) -- wide enough to reach both tails of the sigmoid
      local u = zr.randn(sh):to(dt)
      local h = zr.swiglu(g, u)
      T.eq(h:dtype(), dt, "dtype")
      T.eq(name(h:shape()), name(sh), "shape")
      T.eq(h:category(), "activations", "category")
      -- f32: a few roundings of f32 arithmetic; bf16: computed in f32, rounded once (half an ulp,
      -- 2^-9 relative; allow a whole ulp)
      local rtol = dt == "f32" and 1e-6 or 2 ^ -8
      T.near(h, formula(g, u), 1e-30, rtol, ("swiglu %s %s"):format(dt, name(sh)))
    end
  end
end)

T.test("swiglu by hand, 0-dim and empty tensors", function()
  local g = zr.tensor({ 0, 1, -1, 2, -30, 30 }, { dtype = "f64" })
  local u = zr.tensor({ 5, 2, 3, -1, 7, 0.5 }, { dtype = "f64" })
  local s1, s2 = 1 / (1 + exp(-1)), 1 / (1 + exp(-2))
  T.near(zr.swiglu(g, u), { 0, 2 * s1, -3 * (1 - s1), -2 * s2, -30 * 7 / (1 + exp(30)), 15 / (1 + exp(-30)) },
    1e-15, 1e-14)
  local x = zr.tensor(2.5, { dtype = "f64" })
  T.near(zr.swiglu(x, x):item(), 2.5 / (1 + exp(-2.5)) * 2.5, 0, 1e-15, "0-dim")
  local e = zr.swiglu(zr.zeros({ 0, 5 }, { requires_grad = true }), zr.zeros({ 0, 5 }))
  T.eq(e:numel(), 0)
  e:sum():backward()
  -- the method form
  T.near(g:swiglu(u), zr.swiglu(g, u), 0)
end)

T.test("gradcheck swiglu (f64 central differences)", function()
  local f = function(g, u) return zr.swiglu(g, u) end
  for _, sh in ipairs(SHAPES) do
    T.gradcheck(f, { r(sh, 3), r(sh) })
  end
  -- only one input requiring grad
  T.gradcheck(f, { r({ 7 }, 3), c({ 7 }) })
  T.gradcheck(f, { c({ 2, 7 }), r({ 2, 7 }) })
  -- strided inputs (a transposed gate, a narrowed up)
  T.gradcheck(function(g, u) return zr.swiglu(g:transpose(1, 2), u:narrow(2, 2, 3)) end,
    { r({ 3, 5 }, 2), r({ 5, 4 }) })
  -- sigmoid tails: silu' -> 0 below, -> 1 above
  T.gradcheck(f, { zr.tensor({ -12, -6, 6, 12 }, { dtype = "f64", requires_grad = true }), r({ 4 }) })
end)

-- The fused op against the unfused pair on the same gate and up (dtype dt, shape sh): values and both gradients.
-- bf16: the pair rounds twice (the activation's output, then the product; in backward the gradient reaching the
-- activation), the fused op once: a couple of ulps, judged at each tensor's scale. scaled: the f32/f64 forward and dup
-- judged at their scale too (GELU's 1 + tanh(u) cancels for negative gates, as in gelu's own op). Returns h and dgate.
local function vs_pair(fused, pair, dt, sh, what, scaled)
  local g0, u0, w = (zr.randn(sh) * 3):to(dt), zr.randn(sh):to(dt), zr.randn(sh)
  local function run(f)
    local g, u = g0:detach():requires_grad_(true), u0:detach():requires_grad_(true)
    local h = f(g, u)
    ;(h:to("f64") * w:to("f64")):sum():backward()
    return h, g.grad, u.grad
  end
  local h1, dg1, du1 = run(fused)
  local h2, dg2, du2 = run(pair)
  if dt == "bf16" then
    local e = 2 ^ -7
    T.near(h1:float(), h2:float(), e * maxabs(h2:float()), e, "forward " .. what)
    T.near(dg1:float(), dg2:float(), e * maxabs(dg2:float()), e, "dgate " .. what)
    T.near(du1:float(), du2:float(), e * maxabs(du2:float()), e, "dup " .. what)
  else
    local tol = dt == "f64" and 1e-14 or 1e-6
    T.near(h1, h2, scaled and tol * maxabs(h2) or 1e-30, tol, "forward " .. what)
    T.near(dg1, dg2, tol * maxabs(dg2), tol, "dgate " .. what)
    T.near(du1, du2, scaled and tol * maxabs(du2) or 1e-30, tol, "dup " .. what)
  end
  return h1, dg1, du1
end

T.test("swiglu equals gate:silu() * up, values and gradients (f64, f32, bf16)", function()
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    for _, sh in ipairs(SHAPES) do
      local _, dg1, du1 = vs_pair(zr.swiglu, function(g, u) return g:silu() * u end, dt, sh,
        ("%s %s"):format(dt, name(sh)))
      T.eq(dg1:dtype(), dt, "gate grad dtype")
      T.eq(du1:dtype(), dt, "up grad dtype")
    end
  end
end)

T.test("swiglu keeps gate and up for backward, not the silu output", function()
  local n = 4099
  local g = zr.randn({ n }, { requires_grad = true })
  local u = zr.randn({ n }, { requires_grad = true })
  collectgarbage(); collectgarbage()
  local before = zr.memory_stats().activations.current
  local h = zr.swiglu(g, u)
  local fused = zr.memory_stats().activations.current - before
  T.eq(h.grad_fn, "swiglu", "node name")
  -- the output only (gate and up are leaves held by the caller); the unfused pair also keeps silu's
  assert(fused <= n * 4 + 1024, "swiglu grew activations by " .. fused .. " bytes")
  local h2 = g:silu() * u
  local unfused = zr.memory_stats().activations.current - before - fused
  assert(unfused >= 2 * n * 4, "silu * up grew activations by only " .. unfused .. " bytes")
  h:sum():backward()
  T.eq(g.grad:numel(), n)
  h2 = nil
end)

-- GeGLU (Gemma's MLP): zr.geglu(gate, up, approximate) = gelu(gate, approximate) * up, and its packed form
T.test("geglu equals gate:gelu(approximate) * up, values and gradients; gradcheck; packed = two tensors", function()
  for _, ap in ipairs { "tanh", "none" } do
    for _, dt in ipairs { "f64", "f32", "bf16" } do
      local what = ("geglu %s %s"):format(ap, dt)
      local h1 = vs_pair(function(g, u) return zr.geglu(g, u, ap) end, function(g, u) return g:gelu(ap) * u end, dt,
        { 3, 5, 17 }, what, true)
      T.eq(h1.grad_fn == nil and "none" or tostring(h1.grad_fn), "geglu", what .. " node")
    end
    T.gradcheck(function(g, u) return zr.geglu(g, u, ap) end, { r({ 4, 6 }, 3), r({ 4, 6 }) })
    T.gradcheck(function(gu) return zr.geglu(gu, nil, ap) end, { r({ 3, 8 }, 3) })
    local gu = zr.randn({ 2, 3, 10 }, { dtype = "f64" }) * 2
    T.near(zr.geglu(gu, nil, ap), zr.geglu(gu:narrow(3, 1, 5), gu:narrow(3, 6, 5), ap), 0, 0, "packed " .. ap)
  end
  -- the default is torch's exact GELU, as F.gelu's
  local g, u = zr.randn({ 9 }, { dtype = "f64" }), zr.randn({ 9 }, { dtype = "f64" })
  T.near(zr.geglu(g, u), g:gelu("none") * u, 1e-15, 1e-14, "default approximate")
  T.raises(function() zr.geglu(g, u, "erf") end, 'geglu: approximate must be "none" or "tanh"')
  T.raises(function() zr.geglu(zr.zeros({ 3, 4 }), zr.zeros({ 4, 3 }), "tanh") end,
    "geglu: gate (3,4) and up (4,3) must have the same shape")
  T.raises(function() zr.geglu(zr.zeros({ 3, 5 }), nil, "tanh") end, "geglu: one tensor holds gate and up packed")
end)

T.test("swiglu errors name the op, the shapes, dtypes and devices", function()
  T.raises(function() zr.swiglu(zr.zeros({ 3, 4 }), zr.zeros({ 4, 3 })) end,
    "swiglu: gate (3,4) and up (4,3) must have the same shape")
  T.raises(function() zr.swiglu(zr.zeros({ 1, 7 }), zr.zeros({ 7 })) end, "gate (1,7) and up (7)")
  T.raises(function() zr.swiglu(zr.zeros({ 5 }), zr.zeros({ 5 }, { dtype = "bf16" })) end,
    "swiglu: gate is f32 but up is bf16")
  T.raises(function() zr.swiglu(zr.zeros({ 5 }, { dtype = "i64" }), zr.zeros({ 5 })) end,
    "swiglu: expected a floating-point tensor, got i64")
  T.raises(function() zr.swiglu(zr.zeros({ 5 })) end, "tensor")
  if zr.cuda.is_available() then
    T.raises(function() zr.swiglu(zr.zeros({ 5 }), zr.zeros({ 5 }, { device = "cuda" })) end,
      "swiglu: input 2 is on cuda:0 but input 1 is on cpu")
    T.raises(function() zr.swiglu(zr.zeros({ 5 }, { device = "cuda", dtype = "f64" }),
      zr.zeros({ 5 }, { device = "cuda", dtype = "f64" })) end, "swiglu on cuda:0: f64 is not supported")
  else
    T.raises(function() zr.swiglu(zr.zeros({ 5 }), zr.zeros({ 5 }, { device = "cuda" })) end, "CUDA")
  end
end)

T.done()
