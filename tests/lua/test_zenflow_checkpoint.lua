-- ZenFlow across save_checkpoint / load_checkpoint: a run resumed from a checkpoint continues bit for
-- bit as the uninterrupted run (the selected columns, their moments, the step count, the rate the
-- next selective update takes and update_interval "auto"'s window statistic come back);
-- a save inside an update window is refused; a checkpoint without ZenFlow state selects afresh. With
-- overlap_step: saves at several boundaries (right after warm-up, either moment set last written) resume
-- bit for bit, parameters and losses, against the uninterrupted run; mutant loads must differ.
local zr = require "zrun"
local T = zr.testing

local ZF = { topk_ratio = 0.3, update_interval = 3, select_strategy = "step", select_interval = 12 }
local function config(zf)
  return { train_micro_batch_size_per_gpu = 4, gradient_accumulation_steps = 1, steps_per_print = 1000,
    gradient_clipping = 0, -- (the "auto" cases' window lengths below are those of the unclipped gradients)
    optimizer = { type = "AdamW", params = { lr = 2e-2, betas = { 0.9, 0.99 }, eps = 1e-8, weight_decay = 0.05 } },
    -- a warm-up schedule: the rate changes at every micro-step (ZenFlow steps it there)
    scheduler = { type = "WarmupLR", params = { warmup_min_lr = 0, warmup_max_lr = 2e-2, warmup_num_steps = 30 } },
    zero_optimization = { stage = 2, offload_optimizer = { device = "cpu" }, zenflow = zf } }
end
local function engine(zf)
  zr.manual_seed(7)
  local model = zr.nn.Sequential(zr.nn.Linear(6, 10), zr.nn.Tanh(), zr.nn.Linear(10, 3))
  return zr.initialize { model = model, config = config(zf) }
end
local function micro(e, t) -- micro-step t (0-based) on its own batch; returns whether it ended a window
  zr.manual_seed(100 + t)
  local x, y = zr.randn(4, 6), zr.randn(4, 3)
  e:backward((e(x) - y):square():mean())
  return e:step()
end
local function params(e)
  local out = {}
  for i, p in ipairs(e:parameters()) do out[i] = p:detach():flat_table() end
  return out
end
local function same(a, b)
  for i = 1, #a do for j = 1, #a[i] do if a[i][j] ~= b[i][j] then return false end end end
  return true
end
local dir = os.tmpname(); os.remove(dir)

-- the uninterrupted run: 9 micro-steps, saved after the window ending at micro-step 5 (0-based)
local ref = engine(ZF)
for t = 0, 5 do micro(ref, t) end
T.eq(ref.zenflow.fresh, true, "micro-step 5 ends a window")
ref:save_checkpoint(dir, "w2")
for t = 6, 13 do micro(ref, t) end
local want = params(ref)

T.test("zenflow resumes bit for bit from a checkpoint (columns, moments, step count)", function()
  local e = engine(ZF)
  e:load_checkpoint(dir, "w2")
  for t = 6, 13 do micro(e, t) end
  assert(same(params(e), want), "the resumed run differs from the uninterrupted one")
end)

T.test("zenflow: saving a checkpoint leaves the run unchanged", function()
  local e = engine(ZF)
  for t = 0, 13 do micro(e, t) end
  assert(same(params(e), want), "the run with a save in the middle differs from the one without")
end)

T.test("zenflow: the saved master is the model (what zero_to_fp32 consolidates)", function()
  local e = engine(ZF)
  e:load_checkpoint(dir, "w2")
  local z = e.zero
  local ms = z:state(0):flat_table()
  for i, p in ipairs(e:parameters()) do
    local off = z:layout(i)
    local v = p:detach():flat_table()
    for j = 1, #v do
      if ms[off + j] ~= v[j] then error(("parameter %d element %d: master %g, model %g"):format(i, j, ms[off + j], v[j])) end
    end
  end
end)

T.test("zenflow without its saved state would differ (the test can fail)", function()
  local e = engine(ZF)
  e:load_checkpoint(dir, "w2")
  for _, q in ipairs(e.zenflow.p) do q.m:zero_(); q.v:zero_() end -- as if the moments were not saved
  for t = 6, 13 do micro(e, t) end
  assert(not same(params(e), want), "zeroed moments gave the same parameters: the state is not exercised")
end)

T.test("zenflow: save_checkpoint inside an update window is refused in one line", function()
  local e = engine(ZF)
  micro(e, 0)
  T.raises(function() e:save_checkpoint(dir, "mid") end, "inside a ZenFlow update window")
end)

T.test("zenflow resumed from a checkpoint without ZenFlow state selects columns afresh", function()
  local plain = engine(nil)
  for t = 0, 2 do micro(plain, t) end
  plain:save_checkpoint(dir, "plain")
  local e = engine(ZF)
  e:load_checkpoint(dir, "plain")
  T.eq(e.zenflow.force_select, true, "a selection is due")
  micro(e, 3)
  for _, q in ipairs(e.zenflow.p) do
    if q.two then assert(q.idx and q.idx:numel() == q.k, "a 2-D weight has its selected columns") end
  end
  T.eq(e.zenflow.force_select, nil, "the selection happened")
end)
-- overlap_step: the host update of each window lands one window late. Boundaries (warm-up 2, U = 3,
-- select_interval 12) at micro-steps 0, 1 (warm-up), 4 (the first after it: nothing to apply), 7, 10,
-- 11, 13, ...; a save at 4 or later has an update pending, its moments in one of the two sets.
local OV = { topk_ratio = 0.3, update_interval = 3, select_strategy = "step", select_interval = 12,
  full_warm_up_rounds = 2, overlap_step = true }
local LAST = 22
local function run_ov(e, from, to, losses)
  for t = from, to do
    zr.manual_seed(100 + t)
    local x, y = zr.randn(4, 6), zr.randn(4, 3)
    local loss = (e(x) - y):square():mean()
    losses[t] = loss:item()
    e:backward(loss)
    e:step()
  end
end
local ov_losses = {}
local ov_ref = engine(OV)
run_ov(ov_ref, 0, LAST, ov_losses)
local ov_want = params(ov_ref)
local SAVES = { 1, 4, 7, 11, 13 } -- right after warm-up, the first window after it, both moment sets
do -- the same run with saves in it
  local e, losses = engine(OV), {}
  local at = 0
  for _, k in ipairs(SAVES) do
    run_ov(e, at, k, losses)
    T.eq(e.zenflow.fresh, true, "micro-step " .. k .. " ends a window")
    e:save_checkpoint(dir, "ov" .. k)
    at = k + 1
  end
  run_ov(e, at, LAST, losses)
  T.test("zenflow overlap_step: saving checkpoints leaves the run unchanged", function()
    assert(same(params(e), ov_want), "the run with saves differs from the one without")
    for t = 0, LAST do T.eq(losses[t], ov_losses[t], "loss at micro-step " .. t) end
  end)
end
-- resumes from checkpoint ov<k> (tamper(e): a mutant of the load) -> parameters, losses
local function resume_ov(k, tamper)
  local e, losses = engine(OV), {}
  e:load_checkpoint(dir, "ov" .. k)
  if tamper then tamper(e) end
  run_ov(e, k + 1, LAST, losses)
  return params(e), losses
end

T.test("zenflow overlap_step resumes bit for bit (pending weights, both moment sets, master)", function()
  for _, k in ipairs(SAVES) do
    local got, losses = resume_ov(k)
    for t = k + 1, LAST do T.eq(losses[t], ov_losses[t], ("resumed from %d: loss at micro-step %d"):format(k, t)) end
    assert(same(got, ov_want), "resumed from micro-step " .. k .. ": the parameters differ from the uninterrupted run")
  end
end)

T.test("zenflow overlap_step: the checkpoint holds an update pending after warm-up, none during it", function()
  local w = engine(OV)
  w:load_checkpoint(dir, "ov1")
  T.eq(w.zero:async_pending(), false, "nothing pending after warm-up's last window")
  T.eq(w.zenflow.first_after_warm, true, "the first boundary after warm-up has nothing to apply")
  local e = engine(OV)
  e:load_checkpoint(dir, "ov7")
  T.eq(e.zero:async_pending(), true, "the window's new weights are pending")
  T.eq(e.zenflow.first_after_warm, false, "the next boundary applies them")
end)

T.test("zenflow overlap_step: what the checkpoint restores is exercised (mutants differ)", function()
  local mutants = {
    ["pending weights dropped"] = function(e) e.zero:set_async_pending(false); e.zenflow.first_after_warm = true end,
    ["moment sets swapped"] = function(e)
      local z = e.zero
      for k = 1, 2 do
        local a, b = z:state(k):clone(), z:async_state(k, true)
        z:set_state(k, b:clone()); b:copy_(a)
      end
    end,
    ["master from the model"] = function(e) e.zenflow:sync_master() end,
  }
  for name, tamper in pairs(mutants) do
    -- sets 0 and 1 last written; from 11 the selection at 12 syncs the master anyway
    for _, k in ipairs(name == "master from the model" and { 7, 13 } or { 7, 11 }) do
      local got = resume_ov(k, tamper)
      assert(not same(got, ov_want), name .. " (from " .. k .. ") gave the same parameters: not exercised")
    end
  end
end)

T.test("zenflow overlap_step: the saved master is the model; a load without overlap_step continues from it", function()
  local noov = {}
  for k, v in pairs(OV) do noov[k] = v end
  noov.overlap_step = false
  local e = engine(noov)
  e:load_checkpoint(dir, "ov7")
  local ref = engine(OV)
  run_ov(ref, 0, 7, {})
  assert(same(params(e), params(ref)), "the loaded parameters are not the model at the save")
end)

T.test("zenflow overlap_step loads a checkpoint saved without it: nothing pending, even mid-run", function()
  local e = engine(OV)
  run_ov(e, 0, 7, {})
  e.zero:async_wait() -- (the flag is set when the update in flight is joined)
  T.eq(e.zero:async_pending(), true, "the run has an update pending before the load")
  e:load_checkpoint(dir, "w2") -- saved without overlap_step
  T.eq(e.zero:async_pending(), false, "the checkpoint's model is not overwritten by the old pending weights")
  T.eq(e.zenflow.first_after_warm, true, "the next boundary has nothing to apply")
  run_ov(e, 6, 9, {})
end)

-- update_interval "auto": the adaptive window's state comes back with the rest. Inputs of very
-- different scales make windows of several micro-steps (as in test_zenflow_auto.lua).
local SCALE = zr.tensor({ 4, 1, 0.5, 0.25, 0.1, 0.05 }):view(1, 6)
local AUTO_LAST = 30
-- micro-steps from..AUTO_LAST; saves at the boundaries in save (a set); returns the boundary string
local function run_auto(e, from, save, name)
  local b = {}
  for t = from, AUTO_LAST do
    zr.manual_seed(100 + t)
    local x, y = zr.randn(4, 6) * SCALE, zr.randn(4, 3)
    e:backward((e(x) - y):square():mean())
    local ended = e:step()
    b[#b + 1] = ended and "1" or "0"
    if ended and save and save[t] then e:save_checkpoint(dir, name .. t) end
  end
  return table.concat(b)
end
-- auto_ratio 1: windows of 4-5 micro-steps; 0.99 (with these 2 weights: either one) also windows of
-- one micro-step, where the verdict saved at a boundary ends the next window
local CASES = { { ratio = 1 }, { ratio = 1, overlap = true }, { ratio = 0.99 } }
for n, c in ipairs(CASES) do
  c.zf = { topk_ratio = 0.2, update_interval = "auto", auto_ratio = c.ratio, overlap_step = c.overlap }
  c.name = "auto" .. n
  local ref = engine(c.zf)
  c.b = run_auto(ref, 0)
  c.p = params(ref)
  local saves = {}
  c.at = {}
  for t = 1, #c.b - 1 do -- every boundary after the first, up to the last micro-step but one
    if c.b:sub(t + 1, t + 1) == "1" then saves[t], c.at[#c.at + 1] = true, t end
  end
  local e0 = engine(c.zf)
  local b0 = run_auto(e0, 0, saves, c.name)
  T.test(("zenflow update_interval \"auto\" (auto_ratio %g%s): saves leave the run unchanged, resumes are " ..
    "bit for bit"):format(c.ratio, c.overlap and ", overlap_step" or ""), function()
    T.eq(b0, c.b, "boundaries with saves in the run")
    assert(same(params(e0), c.p), "the run with saves differs from the one without")
    T.eq(#c.at >= 4, true, "several saves (" .. c.b .. ")")
    for _, k in ipairs(c.at) do
      local e = engine(c.zf)
      e:load_checkpoint(dir, c.name .. k)
      T.eq(run_auto(e, k + 1), c.b:sub(k + 2), "boundaries resumed from micro-step " .. k)
      assert(same(params(e), c.p), "resumed from micro-step " .. k .. ": the parameters differ")
    end
  end)
end

T.test('zenflow "auto": the window statistic is what the resume needs (mutants differ)', function()
  T.eq(CASES[1].b:find("0000") ~= nil and CASES[3].b:find("11", 2) ~= nil, true, "long windows and windows of one")
  local mutants = {
    ["sums zeroed"] = function(z) for _, q in ipairs(z.p) do q.avg, q.non = 0, 0 end end,
    ["verdicts cleared"] = function(z) z.need = { false, false } end,
    ["window length reset"] = function(z) z.win = 0 end,
  }
  for what, tamper in pairs(mutants) do
    local differs = false
    for _, c in ipairs(CASES) do
      for _, k in ipairs(c.at) do
        local e = engine(c.zf)
        e:load_checkpoint(dir, c.name .. k)
        tamper(e.zenflow)
        run_auto(e, k + 1)
        differs = differs or not same(params(e), c.p)
      end
    end
    assert(differs, what .. " gave the same parameters from every save: not exercised")
  end
end)

os.execute("rm -rf '" .. dir .. "'")
T.done()
