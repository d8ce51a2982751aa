-- ZenFlow (zero_optimization.zenflow) against a naive Lua re-implementation of DeepSpeed's algorithm
-- (runtime/zero/zenflow.c's notes): column selection, selective AdamW, host AdamW on the accumulated
-- window with clipping and the micro-step bias correction, warm-up, re-selection; the settings that
-- reduce to plain offloaded AdamW; learning; the section's config checks.
local zr = require "zrun"
local T = zr.testing
local C = zr._C

local function mlp(bias)
  zr.manual_seed(7)
  return zr.nn.Sequential(zr.nn.Linear(6, 10, bias), zr.nn.Tanh(), zr.nn.Linear(10, 3, bias))
end

local function config(zf, extra)
  local c = { train_micro_batch_size_per_gpu = 4, gradient_accumulation_steps = 1, steps_per_print = 1000,
    optimizer = { type = "AdamW", params = { lr = 2e-2, betas = { 0.9, 0.99 }, eps = 1e-8, weight_decay = 0.05 } },
    zero_optimization = { stage = 2, offload_optimizer = { device = "cpu" }, zenflow = zf } }
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

local function batch(t)
  zr.manual_seed(100 + t)
  return zr.randn(4, 6), zr.randn(4, 3)
end
local function loss_of(model, x, y) return (model(x) - y):square():mean() end

-- DeepSpeed's ZenFlow, fixed update_interval, one rank, in plain Lua numbers. overlap_step: the host
-- update of a window reaches the parameters at the next boundary (warm-up: at once; the first window
-- after warm-up has nothing to apply before it), with two moment sets alternating by window parity.
local function reference(zf, steps, clip, lr, b1, b2, eps, wd)
  local model = mlp(true)
  local ps = model:parameters()
  local P, master, G, sel = {}, {}, {}, {}
  local ms, vs = { [0] = {}, {} }, { [0] = {}, {} } -- host moments, sets 0 and 1 (overlap_step)
  local stale, first_after_warm = nil, true
  for i, p in ipairs(ps) do
    P[i] = p:detach():flat_table()
    master[i], G[i] = {}, {}
    for s = 0, 1 do ms[s][i], vs[s][i] = {}, {} end
    local sh = p:shape()
    sel[i] = { rows = #sh == 2 and sh[1] or 1, cols = #sh == 2 and sh[2] or p:numel(), two = #sh == 2 }
    for j = 1, #P[i] do
      master[i][j], G[i][j] = P[i][j], 0
      for s = 0, 1 do ms[s][i][j], vs[s][i][j] = 0, 0 end
    end
  end
  local U, W = zf.update_interval, zf.full_warm_up_rounds or 0
  local si = zf.select_strategy == "step" and zf.select_interval or 0 -- the engine's (no dataloader)
  local si_opt = zf.select_strategy == "step" and zf.select_interval or
    (zf.select_strategy == "epoch" and zf.select_interval or 1) * (zf.steps_per_epoch or 0)
  local nsel = 0
  local function adamw(x, g, mm, vv, j, s, step, c1)
    x[j] = x[j] * (1 - lr * wd)
    mm[s] = b1 * mm[s] + (1 - b1) * g
    vv[s] = b2 * vv[s] + (1 - b2) * g * g
    x[j] = x[j] - lr / (1 - b1 ^ step) * mm[s] / (math.sqrt(vv[s]) / math.sqrt(1 - b2 ^ step) + eps)
  end
  local function selective(g)
    nsel = nsel + 1
    for i, q in ipairs(sel) do
      local cols = q.two and q.idx or nil
      local k = cols and #cols or q.cols
      for r = 1, q.rows do
        for c = 1, k do
          local j = (r - 1) * q.cols + (cols and cols[c] or c)
          adamw(P[i], g[i][j], q.m, q.v, j, (r - 1) * k + c, nsel)
        end
      end
    end
  end
  local out = {}
  for t = 0, steps - 1 do
    local boundary = t + 1 < W or (t + 1 - W) % U == 0 or (si ~= 0 and (t + 1) % si == 0)
    local select = t - W >= 0 and (t - W == 0 or (si_opt ~= 0 and t % si_opt == 0))
    if select then
      if t > 0 then for i = 1, #P do for j = 1, #P[i] do master[i][j] = P[i][j] end end end
      for _, q in ipairs(sel) do q.m, q.v = {}, {} end
    end
    -- this micro-step's gradient of loss / update_interval at P
    zr.set_grad_enabled(false)
    for i, p in ipairs(ps) do p:detach():copy_(zr.tensor(P[i]):view(unpack(p:shape()))) end
    zr.set_grad_enabled(true)
    model:zero_grad(true)
    local x, y = batch(t)
    local l = loss_of(model, x, y) * (1 / U)
    l:backward()
    local g = {}
    for i, p in ipairs(ps) do g[i] = p.grad:flat_table() end
    if select then
      for i, q in ipairs(sel) do
        if q.two then
          local sums, order = {}, {}
          for c = 1, q.cols do
            local s = 0
            for r = 1, q.rows do s = s + math.abs(g[i][(r - 1) * q.cols + c]) end
            sums[c], order[c] = s, c
          end
          table.sort(order, function(a, b) return sums[a] > sums[b] end)
          q.idx = {}
          for c = 1, math.floor(zf.topk_ratio * q.cols) do q.idx[c] = order[c] end
          table.sort(q.idx)
        end
      end
    end
    for _, q in ipairs(sel) do
      if select or not q.m then
        local k = q.two and #(q.idx or {}) or q.cols
        q.m, q.v = {}, {}
        for s = 1, q.rows * k do q.m[s], q.v[s] = 0, 0 end
      end
    end
    for i = 1, #G do for j = 1, #G[i] do G[i][j] = G[i][j] + g[i][j] end end
    if t >= W and not boundary then selective(g) end
    if boundary then
      local ss = 0
      for i = 1, #G do for j = 1, #G[i] do ss = ss + G[i][j] ^ 2 end end
      local coef = 1
      if clip and clip > 0 and clip / (math.sqrt(ss) + 1e-6) < 1 then coef = clip / (math.sqrt(ss) + 1e-6) end
      local keep = {}
      for i = 1, #P do keep[i] = { unpack(P[i]) } end
      local set = zf.overlap_step and (t < W and t or math.floor(t / U)) % 2 or 0
      if zf.overlap_step and t >= W then -- the last window's update arrives now
        if first_after_warm then first_after_warm = false
        else for i = 1, #P do P[i] = { unpack(stale[i]) } end end
      end
      for i = 1, #P do
        for j = 1, #P[i] do
          adamw(master[i], G[i][j] * coef, ms[set][i], vs[set][i], j, j, t + 1)
          G[i][j] = 0
        end
      end
      stale = {}
      for i = 1, #P do stale[i] = { unpack(master[i]) } end
      if not zf.overlap_step or t < W then P = stale end
      if t >= W then -- the selected columns and 1-D parameters keep their values, then their own update
        for i, q in ipairs(sel) do
          local cols = q.two and q.idx or nil
          for r = 1, q.rows do
            for c = 1, cols and #cols or q.cols do
              local j = (r - 1) * q.cols + (cols and cols[c] or c)
              P[i][j] = keep[i][j]
            end
          end
        end
        selective(g)
      end
    end
    out[t + 1] = {}
    for i = 1, #P do out[t + 1][i] = { unpack(P[i]) } end
  end
  return out
end

local function run_engine(cfg, steps, bias)
  local model = mlp(bias)
  local e = zr.initialize { model = model, config = cfg }
  local out = {}
  for t = 0, steps - 1 do
    local x, y = batch(t)
    e:backward(loss_of(e, x, y))
    e:step()
    out[t + 1] = {}
    for i, p in ipairs(e:parameters()) do out[t + 1][i] = p:detach():flat_table() end
  end
  return out, e
end

local function max_diff(a, b)
  local d = 0
  for t = 1, #a do
    for i = 1, #a[t] do
      for j = 1, #a[t][i] do d = math.max(d, math.abs(a[t][i][j] - b[t][i][j])) end
    end
  end
  return d
end

local function compare(zf, steps, clip)
  local got = run_engine(config(zf, { gradient_clipping = clip }), steps, true)
  local want = reference(zf, steps, clip, 2e-2, 0.9, 0.99, 1e-8, 0.05)
  local d = max_diff(got, want)
  if d > 2e-5 then error(string.format("parameters differ from the reference by %g", d)) end
  -- and the selection matters: the parameters moved away from the start
  local start = mlp(true):parameters()[1]:detach():flat_table()
  T.eq(math.abs(got[steps][1][1] - start[1]) > 1e-4, true, "the first weight moved")
end

T.test("zenflow equals DeepSpeed's algorithm: warm-up, windows, re-selection, clipping", function()
  -- boundaries t = 0 (warm-up), 1, 4, 7, 10, 13 (update_interval 3), 5, 11 (before a selection);
  -- selections at t = 2, 6, 12; t = 3 updates the columns from a window already holding t = 2's gradient
  compare({ topk_ratio = 0.3, select_strategy = "step", select_interval = 6, update_interval = 3,
    full_warm_up_rounds = 2 }, 14, 0.05)
end)

T.test("zenflow: re-selection inside a window (epoch strategy, steps_per_epoch from the config)", function()
  -- DeepSpeed: no dataloader, so the engine never ends a window for a selection, while the optimizer
  -- re-selects every steps_per_epoch = 5 micro-steps: t = 5 selects from its own gradient mid-window
  compare({ topk_ratio = 0.5, select_strategy = "epoch", select_interval = 1, steps_per_epoch = 5,
    update_interval = 2 }, 11, 0)
end)

T.test("zenflow overlap_step equals DeepSpeed's: each window's host update lands one window late", function()
  -- as the first test, with the host update of the window ending at t applied at the next boundary
  -- (t = 4 applies nothing: it is the first after warm-up), moment sets alternating, and the
  -- selections at t = 6, 12 waiting for the update in flight before the master takes the weights
  compare({ topk_ratio = 0.3, select_strategy = "step", select_interval = 6, update_interval = 3,
    full_warm_up_rounds = 2, overlap_step = true }, 14, 0.05)
  compare({ topk_ratio = 0.5, select_strategy = "epoch", select_interval = 1, steps_per_epoch = 5,
    update_interval = 2, overlap_step = true, pt_reserved_cores_perc = 0.5 }, 11, 0)
  compare({ topk_ratio = 0.3, update_interval = 2, full_warm_up_rounds = 3, overlap_step = true }, 9, 0)
end)

T.test("zenflow overlap_step: engine:step returns while the host update still runs", function()
  local model = mlp(true)
  local e = zr.initialize { model = model, config = config({ topk_ratio = 0.3, update_interval = 2,
    overlap_step = true }) }
  local z = e.zero
  local function micro(t)
    local x, y = batch(t)
    e:backward(loss_of(e, x, y))
    e:step()
  end
  C.zenflow_hold(true) -- the background update waits after its work until released
  local ok, err = pcall(function()
    micro(0)
    micro(1) -- boundary: the first window's update starts and is held
    T.eq(z:async_busy(), true, "the update is still running after the boundary step")
    micro(2) -- the next window's micro-step runs (selected columns updated) meanwhile
    T.eq(z:async_busy(), true, "still running during the next window")
  end)
  C.zenflow_hold(false)
  if not ok then error(err, 0) end
  micro(3) -- boundary: joins it, applies its weights and starts the window ending at t = 3
  z:async_wait()
  T.eq(z:async_busy(), false, "joined")
  micro(4) -- inside the next window: a save is refused as without overlap_step
  T.raises(function() e:save_checkpoint(os.tmpname() .. ".d") end, "inside a ZenFlow update window")
end)

T.test("zenflow overlap_step: the background update's threads leave pt_reserved_cores_perc to training", function()
  local zfm = require "zrun.zenflow"
  T.eq(zfm.host_threads(0.5, 8), 4, "half of 8")
  T.eq(zfm.host_threads(0.3, 10), 7, "ceil(3) reserved")
  T.eq(zfm.host_threads(0, 6), 6, "nothing reserved: all")
  T.eq(zfm.host_threads(1, 6), 6, "everything reserved: both share all, as DeepSpeed")
  T.eq(zfm.host_threads(0.5, 1), 1, "one core")
end)

local function plain(bias, steps)
  return run_engine(config(nil), steps, bias)
end

T.test("zenflow with nothing selected and update_interval 1 is plain offloaded AdamW, bit for bit", function()
  local got = run_engine(config({ topk_ratio = 0, update_interval = 1 }), 6, false)
  T.eq(max_diff(got, plain(false, 6)), 0, "max difference")
end)

T.test("zenflow inside full_warm_up_rounds is plain offloaded AdamW, bit for bit", function()
  local got = run_engine(config({ topk_ratio = 0.5, update_interval = 1, full_warm_up_rounds = 10 }), 6, true)
  T.eq(max_diff(got, plain(true, 6)), 0, "max difference")
end)

local function learns(overlap)
  zr.manual_seed(3)
  local model = zr.nn.Sequential(zr.nn.Linear(16, 32), zr.nn.ReLU(), zr.nn.Linear(32, 1))
  local e = zr.initialize { model = model, config = config({ topk_ratio = 0.1, update_interval = 4,
    select_strategy = "step", select_interval = 8, overlap_step = overlap }, { gradient_clipping = 1.0 }) }
  zr.manual_seed(4)
  local x = zr.randn(4, 16)
  local y = x:sum(2, true):mul(0.25)
  local first, last
  for i = 1, 80 do
    local l = loss_of(e, x, y)
    e:backward(l)
    e:step()
    first = first or l:item()
    last = l:item()
  end
  if not (last < 0.5 * first) then error(string.format("loss %g -> %g did not halve", first, last)) end
  T.eq(e.last_grad_norm > 0, true, "gradient norm > 0")
end
T.test("zenflow learns: the loss falls by half with a non-zero gradient norm", function() learns(false) end)
T.test("zenflow learns with overlap_step too", function() learns(true) end)

T.test("zenflow config: auto_ratio and pt_reserved_cores_perc where they have no effect are warnings", function()
  local cfgmod = require "zrun.config"
  local function zf_warnings(zf)
    local out = {}
    for _, w in ipairs(cfgmod.load(config(zf)):warnings()) do if w:find("zenflow", 1, true) then out[#out + 1] = w end end
    return out
  end
  local w = zf_warnings({ update_interval = 4, auto_ratio = 0.9, pt_reserved_cores_perc = 0.3 })
  T.eq(#w, 2, "two warnings")
  assert(w[1]:find('auto_ratio = 0.9 acts only with update_interval "auto"', 1, true), w[1])
  assert(w[2]:find("pt_reserved_cores_perc = 0.3 acts only with overlap_step", 1, true), w[2])
  T.eq(#zf_warnings({ update_interval = 4, overlap_step = true, pt_reserved_cores_perc = 0.3 }), 0, "used with overlap_step")
  T.eq(#zf_warnings({ update_interval = 4 }), 0, "defaults: no warning")
end)

T.test("zenflow config: DeepSpeed's refusals and zrun's limits, one line each", function()
  local cfgmod = require "zrun.config"
  local function refused(zf, pattern, extra)
    local c = config(zf, extra)
    T.raises(function() cfgmod.load(c) end, pattern)
  end
  local ok = cfgmod.load(config({ topk_ratio = 0.05, update_interval = 4, full_warm_up_rounds = 0,
    select_strategy = "auto", select_interval = "auto", pt_reserved_cores_perc = 0.5, auto_ratio = 0.99 }))
  T.eq(ok.zero_optimization.zenflow.update_interval, 4, "accepted")
  refused({ update_interval = 4, select_interval = "often" }, 'select_interval is "often": a string must be "auto"')
  refused({ update_interval = "later" }, 'update_interval is "later"')
  refused({ update_interval = 4, select_strategy = "auto", select_interval = 2 }, 'DeepSpeed refuses select_interval = 2')
  refused({ update_interval = 4, select_strategy = "step" }, 'select_strategy "step" needs a number select_interval')
  refused({ update_interval = 4, select_strategy = "step", select_interval = 2 }, "must be >= update_interval")
  refused({ update_interval = "auto" }, 'update_interval "auto" (adaptive, auto_ratio) is not implemented')
  refused({ update_interval = 4, offload = true }, "offload = true")
  refused({ update_interval = 4, topk_ratio = 1.5 }, "topk_ratio")
  refused({ update_interval = 4, select_strategy = "random" }, "select_strategy")
  refused({ update_interval = 4 }, 'needs offload_optimizer.device "cpu"',
    { zero_optimization = { stage = 2, zenflow = { update_interval = 4 } } })
  refused({ update_interval = 4 }, "needs zero_optimization.stage 1 or 2",
    { zero_optimization = { stage = 3, offload_optimizer = { device = "cpu" }, zenflow = { update_interval = 4 } } })
  refused({ update_interval = 4 }, 'optimizer.type must be "Adam" or "AdamW"',
    { optimizer = { type = "Lion", params = { lr = 1e-3 } } })
  refused({ update_interval = 4 }, "use bf16", { fp16 = { enabled = true } })
  refused({ update_interval = 0 }, "update_interval must be")
  local shipped = cfgmod.load("configs/zero2_offload_zenflow.json", { args = { train_dataset_size = 100 } })
  T.eq(shipped.zero_optimization.zenflow.topk_ratio, 0.05, "configs/zero2_offload_zenflow.json loads")
end)

T.test("zenflow at the engine: host-side gradients are refused in one line", function()
  local zf = require "zrun.zenflow"
  local e = { world_size = 2, offload_grads = "host", device = "cuda" }
  T.raises(function() zf.new(e, { update_interval = 4 }) end, "unset ZRUN_OFFLOAD_GRADS=host")
end)

T.done()
