-- Lamb (zr.optim.Lamb and the engine's kernel zr._C.lamb_step) against a naive Lamb written here in
-- plain Lua from DeepSpeed's FusedLamb formula (fused_lamb_cuda_kernel.cu): several steps with weight
-- decay, bias_correction false, eps inside the square root, a zero-norm parameter (trust ratio 1),
-- ratios clamped at max_coeff and at min_coeff, segments with their own lr and weight decay.
local zr = require "zrun"
local T = zr.testing
local optim = zr.optim

local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "lamb_ref.lua")
local lamb_ref, with = R.step, R.hp

-- Runs `steps` steps of zr.optim.Lamb (options h) on tensors made from the value lists `init`
-- with gradients grad_of(k, step, values), and the naive Lamb alongside; compares every step.
-- Returns the ratios the reference used (ratios[step][k]).
local function run(h, init, grad_of, steps, tol)
  local params, theta, state = {}, {}, {}
  for k, vals in ipairs(init) do
    params[k] = zr.tensor(vals):requires_grad_()
    theta[k], state[k] = { unpack(vals) }, { m = {}, v = {} }
  end
  local opt = optim.Lamb(params, h)
  local ratios = {}
  for t = 1, steps do
    ratios[t] = {}
    for k, p in ipairs(params) do
      local g = grad_of(k, t, theta[k])
      p.grad = zr.tensor(g)
      ratios[t][k] = lamb_ref(theta[k], g, state[k], with(h), t)
    end
    opt:step()
    for k, p in ipairs(params) do T.near(p, theta[k], tol, tol, ("step %d param %d"):format(t, k)) end
  end
  for k, p in ipairs(params) do
    T.eq(opt.state[p].step, steps)
    T.near(opt.state[p].exp_avg, state[k].m, tol, tol, "exp_avg " .. k)
    T.near(opt.state[p].exp_avg_sq, state[k].v, tol, tol, "exp_avg_sq " .. k)
  end
  return ratios, opt, params
end

-- gradient = c + w (the loss sum(c w) + |w|^2 / 2), c a fixed pseudo-random list per tensor
local function consts(n, seed)
  local c, x = {}, seed
  for i = 1, n do x = (x * 1103515245 + 12345) % 2147483648; c[i] = x / 2147483648 * 2 - 1 end
  return c
end
local C = { consts(7, 1), consts(12, 2), consts(3, 3) }
local function quad(k, _, w)
  local g = {}
  for i = 1, #w do g[i] = C[k][i] + w[i] end
  return g
end
local INIT = { consts(7, 11), consts(12, 12), consts(3, 13) }

T.test("Lamb: 6 steps on three tensors with weight decay match the naive Lamb", function()
  local ratios = run({ lr = 0.02, weight_decay = 0.1, betas = { 0.8, 0.99 } }, INIT, quad, 6, 2e-6)
  -- the ratios differ per tensor and are not clamped here: the per-tensor norm is what is tested
  assert(math.abs(ratios[1][1] - ratios[1][2]) > 1e-3, "ratios of two tensors are equal")
  for _, r in ipairs(ratios[6]) do assert(r > 0.01 and r < 10, "ratio clamped: " .. r) end
end)

T.test("Lamb: bias_correction false", function()
  run({ lr = 0.01, weight_decay = 0.05, bias_correction = false }, INIT, quad, 4, 2e-6)
end)

T.test("Lamb: eps_inside_sqrt with a large eps", function()
  run({ lr = 0.01, eps = 1e-2, eps_inside_sqrt = true, weight_decay = 0.01 }, INIT, quad, 4, 2e-6)
end)

T.test("Lamb: a zero-norm parameter takes trust ratio 1 (not min_coeff)", function()
  local zero = { 0, 0, 0, 0, 0 }
  local ratios = run({ lr = 0.01 }, { zero }, function(_, t) return { 1, -2, 0.5, 3, -1 * t } end, 1, 2e-6)
  T.eq(ratios[1][1], 1)
  -- after one step from zero each element moved by lr * m / (sqrt(v) + eps) * bias terms: not 0
  local ratios2, _, params = run({ lr = 0.01 }, { zero }, function(_, t) return { 1, -2, 0.5, 3, -1 * t } end, 3, 2e-6)
  assert(params[1]:abs():sum():item() > 0.01, "the zero parameter did not move")
  assert(ratios2[2][1] ~= 1, "later steps have a nonzero norm")
  -- a zero gradient and no weight decay: u = 0, the ratio is 1 and nothing moves
  local r3, _, p3 = run({ lr = 0.01 }, { { 1, 2, 3 } }, function() return { 0, 0, 0 } end, 2, 0)
  T.eq(r3[2][1], 1)
  T.near(p3[1], { 1, 2, 3 }, 0, 0)
end)

T.test("Lamb: the trust ratio is clamped at max_coeff and at min_coeff", function()
  local big, tiny = {}, {}
  for i = 1, 9 do big[i] = 50 + i; tiny[i] = 1e-5 * i end
  local signs = function(_, t) local g = {}; for i = 1, 9 do g[i] = (i % 2 == 0 and 1 or -1) * (0.5 + t) end; return g end
  local r = run({ lr = 0.01, max_coeff = 4 }, { big }, signs, 3, 1e-5)
  for t = 1, 3 do T.eq(r[t][1], 4, "clamped at max_coeff, step " .. t) end
  r = run({ lr = 0.01, min_coeff = 0.05 }, { tiny }, signs, 3, 2e-6)
  for t = 1, 3 do T.eq(r[t][1], 0.05, "clamped at min_coeff, step " .. t) end
  -- DeepSpeed's order: max first, then min, so min_coeff wins when they cross
  r = run({ lr = 0.01, max_coeff = 0.1, min_coeff = 0.2 }, { big }, signs, 2, 1e-5)
  T.eq(r[1][1], 0.2)
end)

T.test("Lamb: param groups with their own lr and weight decay; bf16 gradients", function()
  local a, b = zr.tensor(INIT[1]):requires_grad_(), zr.tensor(INIT[2]):requires_grad_()
  local opt = optim.Lamb({ { params = { a }, lr = 0.03, weight_decay = 0.2 }, { params = { b }, lr = 0.01 } })
  local ta, tb, sa, sb = { unpack(INIT[1]) }, { unpack(INIT[2]) }, { m = {}, v = {} }, { m = {}, v = {} }
  for t = 1, 3 do
    local ga, gb = zr.tensor(quad(1, t, ta)):to("bf16"), zr.tensor(quad(2, t, tb)):to("bf16")
    a.grad, b.grad = ga, gb
    lamb_ref(ta, ga:to("f32"):flat_table(), sa, with { lr = 0.03, weight_decay = 0.2 }, t)
    lamb_ref(tb, gb:to("f32"):flat_table(), sb, with { lr = 0.01 }, t)
    opt:step()
  end
  T.near(a, ta, 2e-6, 2e-6)
  T.near(b, tb, 2e-6, 2e-6)
end)

T.test("lamb_step (engine kernel): segments of a flat buffer, each its own tensor; the rest untouched", function()
  zr.manual_seed(3)
  local n = 70000 -- the OpenMP path (above 65536 elements in a segment)
  local segs = { { start = 1, n = 5, lr = 0.01, weight_decay = 0.1 }, { start = 9, n = 66000, lr = 0.03, weight_decay = 0 },
    { start = 66010, n = 0, lr = 0.1, weight_decay = 0 }, { start = 66020, n = 3980, lr = 0.02, weight_decay = 0.3 } }
  local p, m, v = zr.randn({ n }), zr.zeros({ n }), zr.zeros({ n })
  local p0 = p:flat_table()
  local h = with { betas = { 0.85, 0.995 }, eps = 1e-6, max_coeff = 10, min_coeff = 0.01 }
  local ref = {}
  for k, s in ipairs(segs) do
    ref[k] = { p = {}, s = { m = {}, v = {} } }
    for i = 1, s.n do ref[k].p[i] = p0[s.start + i - 1] end
  end
  for t = 1, 3 do
    local g = zr.randn({ n })
    zr._C.lamb_step(p, m, v, g, segs, { beta1 = 0.85, beta2 = 0.995, eps = 1e-6, max_coeff = 10, min_coeff = 0.01 }, t, 0.5)
    local gv = g:flat_table()
    for k, s in ipairs(segs) do
      local gs = {}
      for i = 1, s.n do gs[i] = gv[s.start + i - 1] * 0.5 end
      local hk = with(h)
      hk.lr, hk.weight_decay = s.lr, s.weight_decay
      lamb_ref(ref[k].p, gs, ref[k].s, hk, t)
    end
  end
  local got = p:flat_table()
  local inseg = {}
  for k, s in ipairs(segs) do
    for i = 1, s.n do
      inseg[s.start + i - 1] = true
      local d = math.abs(got[s.start + i - 1] - ref[k].p[i])
      if d > 1e-5 then error(("segment %d element %d: %g vs %g"):format(k, i, got[s.start + i - 1], ref[k].p[i])) end
    end
  end
  for i = 1, n do if not inseg[i] then T.eq(got[i], p0[i], "element " .. i .. " outside the segments changed") end end
end)

T.test("Lamb: argument errors", function()
  local p = zr.randn(2):requires_grad_()
  T.raises(function() optim.Lamb({ p }, { amsgrad = true }) end, "amsgrad is not supported")
  T.raises(function() optim.Lamb({ p }, { max_grad_norm = 1 }) end, "unknown option 'max_grad_norm'")
  T.raises(function() optim.Lamb({ p }, { min_coeff = -1 }) end, "min_coeff must be a number >= 0")
  T.raises(function() optim.Lamb({ p }, { betas = { 1, 0.9 } }) end, "betas[1] must be in [0, 1)")
  local q = zr.randn(3, { dtype = "f64" }):requires_grad_()
  q.grad = zr.randn(3, { dtype = "f64" })
  T.raises(function() optim.Lamb({ q }):step() end, "lamb: parameters must be a contiguous f32 tensor")
  local r = zr.randn(3):requires_grad_()
  r.grad = zr.randn(4)
  T.raises(function() optim.Lamb({ r }):step() end, "lamb: gradient")
  T.raises(function() zr._C.lamb_step(zr.zeros({ 3 }), zr.zeros({ 3 }), zr.zeros({ 2 }), zr.zeros({ 3 }),
    { { start = 1, n = 3, lr = 1 } }, {}, 1) end, "lamb: state")
  T.raises(function() zr._C.lamb_step(zr.zeros({ 3 }), zr.zeros({ 3 }), zr.zeros({ 3 }), zr.zeros({ 3 }),
    { { start = 1, n = 3, lr = 1 } }, {}, 0) end, "step must be >= 1")
end)

T.done()
