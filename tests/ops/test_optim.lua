-- zr.optim: AdamW and SGD against scalar reference loops written here from the torch.optim
-- documentation (independent of the C kernels), with weight decay, param groups, bf16 grads,
-- the OpenMP path at an awkward size, state_dict round trips and argument errors.
local zr = require "zrun"
local T = zr.testing
local optim = zr.optim
zr.manual_seed(5)

-- ---------- reference arithmetic (torch docs) ----------

-- AdamW, one step on a list of numbers. s = {m = {}, v = {}, t = 0}.
--   theta <- theta - lr*wd*theta;  m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2
--   m_hat = m / (1 - b1^t);  v_hat = v / (1 - b2^t);  theta <- theta - lr m_hat / (sqrt(v_hat) + eps)
local function adamw_ref(theta, g, s, h)
  s.t = s.t + 1
  local b1, b2 = h.betas[1], h.betas[2]
  for i = 1, #theta do
    s.m[i], s.v[i] = s.m[i] or 0, s.v[i] or 0
    theta[i] = theta[i] - h.lr * h.weight_decay * theta[i]
    s.m[i] = b1 * s.m[i] + (1 - b1) * g[i]
    s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i]
    local mhat = s.m[i] / (1 - b1 ^ s.t)
    local vhat = s.v[i] / (1 - b2 ^ s.t)
    theta[i] = theta[i] - h.lr * mhat / (math.sqrt(vhat) + h.eps)
  end
end

-- SGD, one step. s = {b = nil}.
--   g <- g + wd theta;  b <- g (first) or mu b + (1 - tau) g;  g <- g + mu b (nesterov) or b
--   theta <- theta - lr g
local function sgd_ref(theta, g, s, h)
  local first = s.b == nil
  s.b = s.b or {}
  for i = 1, #theta do
    local d = g[i] + h.weight_decay * theta[i]
    if h.momentum ~= 0 then
      if first then s.b[i] = d else s.b[i] = h.momentum * s.b[i] + (1 - h.dampening) * d end
      if h.nesterov then d = d + h.momentum * s.b[i] else d = s.b[i] end
    end
    theta[i] = theta[i] - h.lr * d
  end
end

local function copy(t) local o = {}; for i, v in ipairs(t) do o[i] = v end; return o end

-- The test problem: loss = sum_k sum(c_k * w_k) + 0.5 * sum(w_k^2), so grad_k = c_k + w_k.
-- Gradients come from autograd; the reference recomputes them from its own parameters.
local function problem(dtype, shapes)
  local params, consts = {}, {}
  for k, sh in ipairs(shapes) do
    params[k] = zr.randn(sh, { dtype = dtype }):requires_grad_()
    consts[k] = zr.randn(sh, { dtype = dtype })
  end
  local function backward()
    local loss
    for k, p in ipairs(params) do
      local term = (p * consts[k]):sum() + (p * p):sum() * 0.5
      loss = loss and (loss + term) or term
    end
    loss:backward()
  end
  local function ref_grad(k, theta)
    local c, g = consts[k]:flat_table(), {}
    for i = 1, #theta do g[i] = c[i] + theta[i] end
    return g
  end
  return params, backward, ref_grad
end

local function check_adamw(dtype, tol)
  local params, backward, ref_grad = problem(dtype, { { 3 }, { 2, 2 }, { 5 } })
  local groups = {
    { params = { params[1], params[2] }, lr = 0.1, weight_decay = 0.1 },
    { params = { params[3] }, lr = 0.05, weight_decay = 0, betas = { 0.8, 0.99 }, eps = 1e-6 },
  }
  local opt = optim.AdamW(groups, { lr = 1e-3 }) -- default lr is overridden by both groups
  local hyper = {
    { lr = 0.1, weight_decay = 0.1, betas = { 0.9, 0.999 }, eps = 1e-8 },
    { lr = 0.1, weight_decay = 0.1, betas = { 0.9, 0.999 }, eps = 1e-8 },
    { lr = 0.05, weight_decay = 0, betas = { 0.8, 0.99 }, eps = 1e-6 },
  }
  local theta, state = {}, {}
  for k, p in ipairs(params) do theta[k] = p:flat_table(); state[k] = { m = {}, v = {}, t = 0 } end
  for step = 1, 3 do
    opt:zero_grad()
    backward()
    opt:step()
    for k = 1, 3 do adamw_ref(theta[k], ref_grad(k, theta[k]), state[k], hyper[k]) end
    for k, p in ipairs(params) do T.near(p, theta[k], tol, tol, ("%s step %d param %d"):format(dtype, step, k)) end
  end
  for k, p in ipairs(params) do
    local s = opt.state[p]
    T.eq(s.step, 3)
    T.near(s.exp_avg, state[k].m, tol, tol, "exp_avg")
    T.near(s.exp_avg_sq, state[k].v, tol, tol, "exp_avg_sq")
    T.eq(s.exp_avg:category(), "optimizer"); T.eq(s.exp_avg_sq:category(), "optimizer")
  end
end

T.test("AdamW: 3 steps, two param groups, weight decay (f64)", function() check_adamw("f64", 1e-12) end)
T.test("AdamW: 3 steps, two param groups, weight decay (f32)", function() check_adamw("f32", 2e-6) end)

T.test("AdamW: changing a group's lr between steps takes effect", function()
  local params, backward, ref_grad = problem("f64", { { 4 } })
  local opt = optim.AdamW(params, { lr = 0.1, weight_decay = 0.05 })
  local theta, s = params[1]:flat_table(), { m = {}, v = {}, t = 0 }
  for step = 1, 3 do
    local lr = 0.1 / step
    opt.param_groups[1].lr = lr
    opt:zero_grad(); backward(); opt:step()
    adamw_ref(theta, ref_grad(1, theta), s, { lr = lr, weight_decay = 0.05, betas = { 0.9, 0.999 }, eps = 1e-8 })
  end
  T.near(params[1], theta, 1e-12, 1e-12)
end)

T.test("AdamW: bf16 gradients for f32 parameters", function()
  local p = zr.tensor({ 0.5, -1, 2, 0.25, 3 }):requires_grad_()
  local gs = { { 0.5, -1.25, 3, 0.0078125, -2 }, { 1, 1, -0.5, 0.75, 0.125 } } -- exact in bf16
  local opt = optim.AdamW({ p }, { lr = 0.01, weight_decay = 0.1 })
  local theta, s = p:flat_table(), { m = {}, v = {}, t = 0 }
  for _, g in ipairs(gs) do
    p.grad = zr.tensor(g, { dtype = "bf16" })
    opt:step()
    adamw_ref(theta, g, s, { lr = 0.01, weight_decay = 0.1, betas = { 0.9, 0.999 }, eps = 1e-8 })
  end
  T.near(p, theta, 1e-6, 1e-6)
end)

T.test("AdamW kernel: threaded path at an awkward size (100003)", function()
  local n = 100003
  local p = zr.randn(n):requires_grad_()
  local grads = { zr.randn(n), zr.randn(n) }
  local opt = optim.AdamW({ p }, { lr = 0.003, betas = { 0.85, 0.995 }, eps = 1e-7, weight_decay = 0.2 })
  local theta, s = p:flat_table(), { m = {}, v = {}, t = 0 }
  local h = { lr = 0.003, betas = { 0.85, 0.995 }, eps = 1e-7, weight_decay = 0.2 }
  for _, g in ipairs(grads) do
    p.grad = g
    opt:step()
    adamw_ref(theta, g:flat_table(), s, h)
  end
  T.near(p, theta, 1e-6, 1e-5)
end)

T.test("AdamW: parameters without gradients are skipped", function()
  local a, b = zr.randn(3):requires_grad_(), zr.randn(3):requires_grad_()
  local b0 = b:flat_table()
  local opt = optim.AdamW({ a, b }, { lr = 0.1 })
  a.grad = zr.ones(3)
  opt:step()
  T.near(b, b0, 0, 0)
  T.eq(opt.state[b], nil)
  T.eq(opt.state[a].step, 1)
  -- b gets its first gradient later: its own step count starts at 1
  a.grad, b.grad = zr.ones(3), zr.ones(3)
  opt:step()
  T.eq(opt.state[a].step, 2); T.eq(opt.state[b].step, 1)
  -- first AdamW step with constant grad 1 and no decay moves by lr * 1/(1 + eps) exactly
  local expect = {}
  for i, v in ipairs(b0) do expect[i] = v * (1 - 0.1 * 0.01) - 0.1 / (1 + 1e-8) end
  T.near(b, expect, 1e-6)
end)

local function check_sgd(h, tol)
  local params, backward, ref_grad = problem("f64", { { 3 }, { 2, 3 } })
  local opt = optim.SGD(params, h)
  local theta, state = {}, {}
  for k, p in ipairs(params) do theta[k] = p:flat_table(); state[k] = {} end
  for step = 1, 3 do
    opt:zero_grad(); backward(); opt:step()
    for k = 1, 2 do sgd_ref(theta[k], ref_grad(k, theta[k]), state[k], h) end
    for k, p in ipairs(params) do T.near(p, theta[k], tol, tol, ("step %d param %d"):format(step, k)) end
  end
  return opt, params
end

T.test("SGD with momentum, dampening and weight decay", function()
  local opt, params = check_sgd({ lr = 0.1, momentum = 0.9, dampening = 0.1, weight_decay = 0.01, nesterov = false }, 1e-12)
  T.eq(opt.state[params[1]].momentum_buffer:category(), "optimizer")
end)
T.test("SGD with nesterov momentum", function()
  check_sgd({ lr = 0.05, momentum = 0.8, dampening = 0, weight_decay = 0.1, nesterov = true }, 1e-12)
end)
T.test("SGD without momentum keeps no state", function()
  local opt, params = check_sgd({ lr = 0.2, momentum = 0, dampening = 0, weight_decay = 0.3, nesterov = false }, 1e-12)
  T.eq(opt.state[params[1]], nil)
end)
T.test("SGD f32", function()
  local p = zr.tensor({ 1, -2, 0.5 }):requires_grad_()
  local opt = optim.SGD({ p }, { lr = 0.1, momentum = 0.5 })
  local theta, s = p:flat_table(), {}
  for _, g in ipairs { { 1, 2, 3 }, { -1, 0.5, 0 } } do
    p.grad = zr.tensor(g)
    opt:step()
    sgd_ref(theta, g, s, { lr = 0.1, momentum = 0.5, dampening = 0, weight_decay = 0 })
  end
  T.near(p, theta, 1e-6, 1e-6)
end)

T.test("optimizer state_dict round trip continues identically", function()
  local function make()
    zr.manual_seed(42)
    return problem("f64", { { 4 }, { 3 } })
  end
  local pa, backa = make()
  local pb, backb = make()
  local groups = function(ps) return { { params = { ps[1] }, lr = 0.1 }, { params = { ps[2] }, lr = 0.01, weight_decay = 0 } } end
  local a = optim.AdamW(groups(pa))
  for _ = 1, 2 do a:zero_grad(); backa(); a:step() end
  local sd = a:state_dict()
  T.eq(#sd.param_groups, 2)
  T.eq(sd.param_groups[2].params[1], 2)
  T.eq(sd.state[1].step, 2)
  -- b: same parameters, fresh optimizer with other hyperparameters, then the loaded state
  for k = 1, 2 do pb[k]:copy_(pa[k]) end
  local b = optim.AdamW(groups(pb))
  b.param_groups[1].lr = 123
  b:load_state_dict(sd)
  T.eq(b.param_groups[1].lr, 0.1)
  T.near(b.state[pb[1]].exp_avg, a.state[pa[1]].exp_avg, 0, 0)
  T.eq(b.state[pb[1]].exp_avg:category(), "optimizer")
  a:zero_grad(); backa(); a:step()
  b:zero_grad(); backb(); b:step()
  for k = 1, 2 do T.near(pb[k], pa[k], 0, 0) end
  T.eq(b.state[pb[2]].step, 3)
  -- loaded state is a copy
  a.state[pa[1]].exp_avg:fill_(7)
  T.eq(b.state[pb[1]].exp_avg:flat_table()[1] ~= 7, true)
  T.raises(function() b:load_state_dict({ state = {}, param_groups = { sd.param_groups[1] } }) end, "has 1 parameter groups, the optimizer 2")
end)

T.test("zero_grad: set_to_none (default) and zeroing in place", function()
  local p = zr.randn(3):requires_grad_()
  local opt = optim.SGD({ p }, { lr = 0.1 })
  ;(p * p):sum():backward()
  opt:zero_grad(false)
  T.near(p.grad, { 0, 0, 0 })
  opt:zero_grad()
  T.eq(p.grad, nil)
end)

T.test("optimizer state memory is tagged 'optimizer'", function()
  collectgarbage(); collectgarbage()
  local before = zr.memory_stats().optimizer.current
  local p = zr.randn(1000):requires_grad_()
  local opt = optim.AdamW({ p })
  p.grad = zr.ones(1000)
  opt:step()
  T.eq(zr.memory_stats().optimizer.current - before >= 2 * 1000 * 4, true)
end)

T.test("argument errors", function()
  local p = zr.randn(2):requires_grad_()
  T.raises(function() optim.AdamW({ p }, { lr = -1 }) end, "lr must be a number >= 0")
  T.raises(function() optim.AdamW({ p }, { betas = { 0.9, 1 } }) end, "betas[2] must be in [0, 1)")
  T.raises(function() optim.AdamW({ p }, { weight_decay = -0.1 }) end, "weight_decay must be >= 0")
  T.raises(function() optim.AdamW({ p }, { momentum = 0.9 }) end, "unknown option 'momentum'")
  T.raises(function() optim.AdamW({}) end, "empty parameter list")
  T.raises(function() optim.AdamW({ { params = { p } }, { params = { p } } }) end, "more than one parameter group")
  T.raises(function() optim.AdamW({ p * 2 }) end, "non-leaf")
  T.raises(function() optim.AdamW({ p }, { amsgrad = true }) end, "amsgrad is not supported")
  T.raises(function() optim.SGD({ p }, { lr = 0.1, nesterov = true }) end, "nesterov momentum requires momentum > 0")
  -- the C layer checks shapes and dtypes
  local q = zr.randn(3):requires_grad_()
  q.grad = zr.randn(4)
  T.raises(function() optim.AdamW({ q }):step() end, "does not match parameter")
  T.raises(function() zr.adamw_step(zr.randn(3, { dtype = "i64" }), zr.randn(3), zr.zeros(3), zr.zeros(3), { lr = 1, step = 1 }) end, "contiguous f32 (or f64)")
  T.raises(function() zr.adamw_step(q, zr.randn(3), zr.zeros(3), zr.zeros(3), { lr = 1, step = 0 }) end, "step must be >= 1")
end)


-- zr._C.optim_step: the ZeRO engine's Lion/Adagrad/SGD kernel (optim_step_cpu) on flat segments
-- with their own lr and weight decay, scaled bf16 or f32 gradients, against plain Lua
-- arithmetic; elements between segments stay untouched.
T.test("optim_step (engine kernel): Lion, Adagrad, SGD on segments match the formulas", function()
  local sqrt = math.sqrt
  local function sign(x) return x > 0 and 1 or (x < 0 and -1 or 0) end
  local segs = { { start = 1, n = 5, lr = 0.01, weight_decay = 0.1 }, { start = 9, n = 13, lr = 0.03, weight_decay = 0 } }
  local n = 23
  local inseg = {}
  for _, s in ipairs(segs) do for i = s.start, s.start + s.n - 1 do inseg[i] = s end end
  local CASES = {
    { optimizer = "lion", beta1 = 0.9, beta2 = 0.99 },
    { optimizer = "adagrad", eps = 1e-10, lr_decay = 0.05 },
    { optimizer = "sgd", momentum = 0.9, dampening = 0.2 },
    { optimizer = "sgd", momentum = 0.7, nesterov = true },
    { optimizer = "sgd" },
  }
  for _, h in ipairs(CASES) do
    for _, gdt in ipairs { "f32", "bf16" } do
      zr.manual_seed(8)
      local p = zr.randn({ n })
      local has_state = not (h.optimizer == "sgd" and not h.momentum)
      local s = has_state and (h.optimizer == "adagrad" and zr.full({ n }, 0.1) or zr.zeros({ n })) or nil
      local pv = p:flat_table()
      local sv = s and s:flat_table() or {}
      local p0 = p:flat_table()
      for t = 1, 3 do
        local g = zr.randn({ n }):to(gdt)
        zr._C.optim_step(p, s, g, segs, h, t, 0.5)
        local gv = g:to("f32"):flat_table()
        for i = 1, n do
          local sg = inseg[i]
          if sg then
            local gi, lr, wd = gv[i] * 0.5, sg.lr, sg.weight_decay
            if h.optimizer == "lion" then
              local c = h.beta1 * sv[i] + (1 - h.beta1) * gi
              pv[i] = pv[i] * (1 - lr * wd) - lr * sign(c)
              sv[i] = h.beta2 * sv[i] + (1 - h.beta2) * gi
            elseif h.optimizer == "adagrad" then
              gi = gi + wd * pv[i]
              sv[i] = sv[i] + gi * gi
              pv[i] = pv[i] - lr / (1 + (t - 1) * h.lr_decay) * gi / (sqrt(sv[i]) + h.eps)
            else
              local d = gi + wd * pv[i]
              if h.momentum then
                sv[i] = t == 1 and d or h.momentum * sv[i] + (1 - (h.dampening or 0)) * d
                d = h.nesterov and d + h.momentum * sv[i] or sv[i]
              end
              pv[i] = pv[i] - lr * d
            end
          end
        end
      end
      local got = p:flat_table()
      local what = ("%s %s grads"):format(h.optimizer, gdt)
      for i = 1, n do
        if inseg[i] then T.near(got[i], pv[i], 1e-5, 1e-5, what .. " element " .. i)
        else T.eq(got[i], p0[i], what .. ": element " .. i .. " outside the segments changed") end
      end
      if s then T.near(s, zr.tensor(sv), 1e-5, 1e-5, what .. " state") end
    end
  end
  T.raises(function() zr._C.optim_step(zr.zeros({ 3 }), nil, zr.zeros({ 3 }), { { start = 1, n = 3, lr = 1 } },
    { optimizer = "lion" }, 1) end, "state is missing")
  T.raises(function() zr._C.optim_step(zr.zeros({ 3 }), zr.zeros({ 3 }), zr.zeros({ 3 }), { { start = 2, n = 3, lr = 1 } },
    { optimizer = "sgd", momentum = 0.9 }, 1) end, "segment 1 [1, +3) is outside the 3 parameters")
  T.raises(function() zr._C.optim_step(zr.zeros({ 3 }), nil, zr.zeros({ 3 }), {}, { optimizer = "lamb" }, 1) end,
    'optimizer must be "lion", "adagrad" or "sgd", got "lamb"')
end)

T.done()
