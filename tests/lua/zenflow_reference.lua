-- A naive Lua re-statement of DeepSpeed's ZenFlow (runtime/zero/zenflow.c's notes), one rank, in plain
-- Lua numbers, with the tiny model, config and batches the ZenFlow tests share (test_zenflow.lua,
-- test_zenflow_auto.lua): R.reference(...) -> the parameters after each micro-step and the boundaries.
local zr = require "zrun"

local R = {}

function R.mlp(bias)
  zr.manual_seed(7)
  return zr.nn.Sequential(zr.nn.Linear(6, 10, bias), zr.nn.Tanh(), zr.nn.Linear(10, 3, bias))
end

function R.config(zf, extra)
  local c = { train_micro_batch_size_per_gpu = 4, gradient_accumulation_steps = 1, steps_per_print = 1000,
    optimizer = { type = "AdamW", params = { lr = 2e-2, betas = { 0.9, 0.99 }, eps = 1e-8, weight_decay = 0.05 } },
    zero_optimization = { stage = 2, offload_optimizer = { device = "cpu" }, zenflow = zf } }
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

function R.batch(t)
  zr.manual_seed(100 + t)
  return zr.randn(4, 6), zr.randn(4, 3)
end
function R.loss_of(model, x, y) return (model(x) - y):square():mean() end

-- DeepSpeed's ZenFlow, one rank. overlap_step: the host update of a window reaches the parameters at
-- the next boundary (warm-up: at once; the first window after warm-up has nothing to apply before it),
-- with two moment sets alternating by window parity. update_interval "auto": written as DeepSpeed
-- 0.17.5-0.18.2's engine and optimizer keep it (zenflow_state toggled at each backward, then the
-- optimizer's prologue; the statistic in _process_selected_fp32_groups_grad), the loss unscaled.
-- Returns out[t+1][i] (parameter i's values after micro-step t), bounds[t+1] (t ended a window) and
-- latest[t+1][i]: with overlap_step, parameter i with the pending host update on its unselected
-- columns (what the next boundary gives them), else out's.
function R.reference(zf, steps, clip, lr, b1, b2, eps, wd)
  local model = R.mlp(true)
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
  local auto = U == "auto"
  -- DeepSpeed's auto state: zenflow_need_update, zenflow_state, the optimizer's update_interval,
  -- each weight's avg_critic_sum and non_critic_sum; num_total_param counts the parameters not 1-D
  local need, state, ui, avg, non, ntotal = { [0] = false, [1] = false }, 0, 0, {}, {}, 0
  for i, p in ipairs(ps) do
    avg[i], non[i] = 0, 0
    if #p:shape() ~= 1 then ntotal = ntotal + 1 end
  end
  local bounds = {}
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
  local out, latest, pending = {}, {}, false
  for t = 0, steps - 1 do
    local boundary
    if auto then
      state = 1 - state
      boundary = t + 1 <= W or need[1 - state] or (si ~= 0 and (t + 1) % si == 0)
      need[state] = false
      if need[1 - state] then
        ui = 0
        for i in ipairs(non) do non[i] = 0 end
      end
      ui = ui + 1
    else
      boundary = t + 1 < W or (t + 1 - W) % U == 0 or (si ~= 0 and (t + 1) % si == 0)
    end
    bounds[t + 1] = boundary
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
    local x, y = R.batch(t)
    local l = R.loss_of(model, x, y) * (auto and 1 or 1 / U)
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
    if auto and t >= W then
      local count = 0
      for i, q in ipairs(sel) do
        if q.two and q.rows > 1 then
          local total, crit, chosen = 0, 0, {}
          for _, c in ipairs(q.idx or {}) do chosen[c] = true end
          for r = 1, q.rows do
            for c = 1, q.cols do
              local a = math.abs(g[i][(r - 1) * q.cols + c])
              total = total + a
              if chosen[c] then crit = crit + a end
            end
          end
          avg[i] = (avg[i] * (ui - 1) + crit) / ui / (zf.topk_ratio * 10)
          non[i] = non[i] + (total - crit) / ((1 - zf.topk_ratio) * 10)
          if non[i] >= avg[i] then count = count + 1 end
          if count >= math.floor((zf.auto_ratio or 0.99) * ntotal) then need[state] = true end
        end
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
      local set = zf.overlap_step and (t < W and t or auto and state or math.floor(t / U)) % 2 or 0
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
      pending = zf.overlap_step and t >= W
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
    latest[t + 1] = {}
    for i = 1, #P do
      out[t + 1][i] = { unpack(P[i]) }
      local l = { unpack(pending and stale[i] or P[i]) }
      local q = sel[i]
      if pending then -- the selected columns (a 1-D parameter: all) keep their values
        local cols = q.two and q.idx or nil
        for r = 1, q.rows do
          for c = 1, cols and #cols or q.cols do
            local j = (r - 1) * q.cols + (cols and cols[c] or c)
            l[j] = P[i][j]
          end
        end
      end
      latest[t + 1][i] = l
    end
  end
  return out, bounds, latest
end

-- The engine's run of the same micro-steps: the parameters after each and whether it ended a window.
function R.run_engine(cfg, steps, bias)
  local model = R.mlp(bias)
  local e = zr.initialize { model = model, config = cfg }
  local out, bounds = {}, {}
  for t = 0, steps - 1 do
    local x, y = R.batch(t)
    e:backward(R.loss_of(e, x, y))
    bounds[t + 1] = e:step()
    out[t + 1] = {}
    for i, p in ipairs(e:parameters()) do out[t + 1][i] = p:detach():flat_table() end
  end
  return out, e, bounds
end

function R.max_diff(a, b)
  local d = 0
  for t = 1, #a do
    for i = 1, #a[t] do
      for j = 1, #a[t][i] do d = math.max(d, math.abs(a[t][i][j] - b[t][i][j])) end
    end
  end
  return d
end


return R
