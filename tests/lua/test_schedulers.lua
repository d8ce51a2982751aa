-- Learning-rate schedulers against values worked out by hand from DeepSpeed's formulas
-- (deepspeed/runtime/lr_schedules.py): warmup boundaries, log and linear warmup, decay, cosine, the
-- one-cycle shape with stairs and post-cycle decay, the range test, param groups and resume.
local zr = require "zrun"
local T = zr.testing
local S = require "zrun.schedulers"
local config = require "zrun.config"

local function opt(...)
  local groups = {}
  for i, lr in ipairs { ... } do groups[i] = { lr = lr, betas = { 0.9, 0.999 } } end
  return { param_groups = groups, defaults = { betas = { 0.9, 0.999 } } }
end

-- lr of group 1 after stepping to each iteration in `at` (iterations count from 0)
local function lrs_at(s, at)
  local out, it = {}, s.last_batch_iteration
  for _, target in ipairs(at) do
    while it < target do s:step(); it = it + 1 end
    out[#out + 1] = s:get_last_lr()[1]
  end
  return out
end

T.test("WarmupLR log warmup", function()
  -- gamma = log(it + 1) / log(10); log(5)/log(10) = log10(5) = 0.69897000433601880
  local s = S.WarmupLR.new(nil, { warmup_min_lr = 0.0, warmup_max_lr = 0.01, warmup_num_steps = 10 })
  T.near(s:get_last_lr(), { 0.0 }, 0, 0, "before the first step: min lr")
  local got = lrs_at(s, { 0, 1, 4, 9, 10, 50 })
  T.near(got, { 0.0, 0.01 * 0.30102999566398120, 0.01 * 0.69897000433601880, 0.01, 0.01, 0.01 }, 1e-15)
end)

T.test("WarmupLR linear warmup and boundaries", function()
  -- min 0.001, max 0.01: lr = 0.001 + 0.009 * it / 10 while it < 10
  local o = opt(0.5)
  local s = S.WarmupLR.new(o, { warmup_min_lr = 0.001, warmup_max_lr = 0.01, warmup_num_steps = 10,
    warmup_type = "linear" })
  T.near(o.param_groups[1].lr, 0.001, 0, 0, "constructor sets min lr")
  local got = lrs_at(s, { 0, 3, 9, 10, 11 })
  T.near(got, { 0.001, 0.0037, 0.0091, 0.01, 0.01 }, 1e-15)
  T.near(o.param_groups[1].lr, 0.01, 1e-15, 0, "group lr follows")
  -- warmup_num_steps below 2 becomes 2: it=0 → 0, it=1 → 1/2
  local s1 = S.WarmupLR.new(nil, { warmup_max_lr = 1.0, warmup_num_steps = 1, warmup_type = "linear" })
  T.near(lrs_at(s1, { 0, 1, 2 }), { 0.0, 0.5, 1.0 }, 1e-15)
  -- no warmup_max_lr: the optimizer's lr is the target
  local s2 = S.WarmupLR.new(opt(0.25), { warmup_num_steps = 4, warmup_type = "linear" })
  T.near(lrs_at(s2, { 2, 4 }), { 0.125, 0.25 }, 1e-15)
  -- ... each group's own (DeepSpeed: warmup_max_lr = [group['lr'] for group in param_groups])
  local o3 = opt(0.25, 0.5)
  local s3 = S.WarmupLR.new(o3, { warmup_num_steps = 4, warmup_type = "linear" })
  lrs_at(s3, { 2 })
  T.near({ o3.param_groups[1].lr, o3.param_groups[2].lr }, { 0.125, 0.25 }, 1e-15)
end)

T.test("WarmupDecayLR", function()
  -- total 20, warmup 5 (linear), max 0.1: it/5 × 0.1, then 0.1 × (20 - it) / 15, floored at 0
  local s = S.WarmupDecayLR.new(nil, { total_num_steps = 20, warmup_num_steps = 5, warmup_max_lr = 0.1,
    warmup_type = "linear" })
  local got = lrs_at(s, { 0, 2, 4, 5, 8, 19, 20, 25 })
  T.near(got, { 0.0, 0.04, 0.08, 0.1, 0.08, 0.1 / 15, 0.0, 0.0 }, 1e-15)
  -- log warmup: it=1 of 4 → log 2 / log 4 = 1/2
  local l = S.WarmupDecayLR.new(nil, { total_num_steps = 10, warmup_num_steps = 4, warmup_max_lr = 0.2 })
  T.near(lrs_at(l, { 1, 3, 4 }), { 0.1, 0.2, 0.2 }, 1e-15) -- it=3: log 4 / log 4 = 1; it=4: (10-4)/(10-4)
end)

T.test("WarmupCosineLR", function()
  -- peak 0.1 (the group lr), total 12, warmup 4 linear from ratio 0.2, cosine to ratio 0.01
  local o = opt(0.1)
  local s = S.WarmupCosineLR.new(o, { total_num_steps = 12, warmup_num_steps = 4, warmup_min_ratio = 0.2,
    cos_min_ratio = 0.01, warmup_type = "linear" })
  T.near(o.param_groups[1].lr, 0.0, 0, 0, "constructor sets 0")
  local cos_pi_8 = math.sqrt(2 + math.sqrt(2)) / 2          -- cos(π/8)
  local cos_5pi_8 = -math.sqrt(2 - math.sqrt(2)) / 2        -- cos(5π/8)
  local function after(c) return 0.1 * (0.01 + 0.99 * (1 + c) / 2) end
  local got = lrs_at(s, { 0, 2, 3, 4, 8, 11, 15 })
  T.near(got, { 0.02, 0.06, 0.08, after(cos_pi_8), after(cos_5pi_8), 0.001, 0.001 }, 1e-15)
  -- log warmup: it=1 of 4: log 2 / log 4 = 1/2 → ratio 0.2 + 0.5 × 0.8 = 0.6
  local l = S.WarmupCosineLR.new(opt(0.1), { total_num_steps = 12, warmup_num_steps = 4, warmup_min_ratio = 0.2 })
  T.near(lrs_at(l, { 1 }), { 0.06 }, 1e-15)
  T.raises(function() S.WarmupCosineLR.new(nil, { total_num_steps = 3 }) end, "needs an optimizer")
end)

T.test("OneCycle: cycle, decay, momentum", function()
  -- min 0.01, max 0.1, up 4 steps, down 6: scale at batch b = it + 1 is b/4 up to 4, then (10 - b)/6
  local o = opt(0.5)
  local s = S.OneCycle.new(o, { cycle_min_lr = 0.01, cycle_max_lr = 0.1, cycle_first_step_size = 4,
    cycle_second_step_size = 6, decay_lr_rate = 0.5, decay_step_size = 2, cycle_min_mom = 0.85, cycle_max_mom = 0.95 })
  T.near(o.param_groups[1].lr, 0.01, 0, 0, "constructor sets min lr")
  T.near(o.param_groups[1].betas, { 0.85, 0.99 }, 0, 0, "constructor sets min momentum, beta2 0.99")
  T.raises(function() s:get_last_lr() end, "need to call step() first")
  local lr = function(scale) return 0.01 + 0.09 * scale end
  local got = lrs_at(s, { 0, 2, 3, 6, 8, 9 })
  T.near(got, { lr(0.25), lr(0.75), lr(1.0), lr(0.5), lr(1 / 6), lr(0) }, 1e-15)
  -- after the cycle: min_lr / (1 + 0.5 × (it - 10 + 1) / 2)
  T.near(lrs_at(s, { 10, 13 }), { 0.01 / 1.25, 0.01 / 2 }, 1e-15)
  -- momentum: 0.95 - 0.1 × scale in the cycle; 0.95 after (decay_mom_rate 0)
  local m = S.OneCycle.new(opt(1), { cycle_min_lr = 0, cycle_max_lr = 1, cycle_first_step_size = 4,
    cycle_second_step_size = 6, cycle_min_mom = 0.85, cycle_max_mom = 0.95 })
  m:step()
  T.near(m.param_groups[1].betas, { 0.95 - 0.1 * 0.25, 0.99 }, 1e-15)
  for _ = 1, 11 do m:step() end
  T.near(m:get_mom()[1], { 0.95, 0.99 }, 1e-15)
  T.near(m:get_last_lr(), { 0 }, 1e-15, 0, "no decay: stays at min lr")
  -- second step size defaults to the first; no optimizer means no momentum
  local d = S.OneCycle.new(nil, { cycle_min_lr = 0, cycle_max_lr = 1, cycle_first_step_size = 3 })
  T.near(lrs_at(d, { 0, 2, 3, 5 }), { 1 / 3, 1, 2 / 3, 0 }, 1e-15)
  T.eq(d:get_mom(), nil)
end)

T.test("OneCycle: a value per param group, as DeepSpeed's _format_param takes it", function()
  -- DeepSpeed 0.19.8, two AdamW groups: OneCycle(o, cycle_min_lr=[0.01, 0.02], cycle_max_lr=[0.1, 0.3],
  -- cycle_first_step_size=4, cycle_second_step_size=6, cycle_min_mom=[0.85, 0.8], cycle_max_mom=[0.95, 0.9])
  local o = opt(0.5, 0.5)
  local s = S.OneCycle.new(o, { cycle_min_lr = { 0.01, 0.02 }, cycle_max_lr = { 0.1, 0.3 }, cycle_first_step_size = 4,
    cycle_second_step_size = 6, cycle_min_mom = { 0.85, 0.8 }, cycle_max_mom = { 0.95, 0.9 } })
  T.near({ o.param_groups[1].lr, o.param_groups[2].lr }, { 0.01, 0.02 }, 0)
  T.near(o.param_groups[2].betas, { 0.8, 0.99 }, 0)
  local want = { { 0.0325, 0.09, 0.925, 0.875 }, { 0.055, 0.16, 0.9, 0.85 }, { 0.0775, 0.23, 0.875, 0.825 } }
  for k = 1, 3 do
    s:step()
    local lr = s:get_last_lr()
    T.near({ lr[1], lr[2], o.param_groups[1].betas[1], o.param_groups[2].betas[1] }, want[k], 1e-15, 0, "step " .. k)
  end
  T.raises(function() S.OneCycle.new(opt(0.5, 0.5), { cycle_min_lr = { 0.01 }, cycle_max_lr = 0.1 }) end,
    "OneCycle: expected 2 values for cycle_min_lr (one per param group), got 1")
end)

T.test("OneCycle stairs", function()
  -- 2 stairs per half, up 4 / down 6: floor(b × 2 / 4) / 2 rising, floor((10 - b) × 2 / 6) / 2 falling
  local s = S.OneCycle.new(nil, { cycle_min_lr = 0.0, cycle_max_lr = 1.0, cycle_first_step_size = 4,
    cycle_second_step_size = 6, cycle_first_stair_count = 2 })
  local got = lrs_at(s, { 0, 1, 2, 3, 4, 6, 7, 8 })
  T.near(got, { 0, 0.5, 0.5, 1, 0.5, 0.5, 0, 0 }, 0)
end)

T.test("LRRangeTest continuous and staircase", function()
  -- min 0.001 × (1 + 2 × interval), interval = (it + 1) / 4, floored for the staircase
  local o = opt(9)
  local s = S.LRRangeTest.new(o, { lr_range_test_min_lr = 0.001, lr_range_test_step_size = 4, lr_range_test_step_rate = 2 })
  T.near(o.param_groups[1].lr, 0.001, 0, 0)
  T.near(lrs_at(s, { 0, 2, 6 }), { 0.0015, 0.0025, 0.0045 }, 1e-15)
  local st = S.LRRangeTest.new(nil, { lr_range_test_min_lr = 0.001, lr_range_test_step_size = 4,
    lr_range_test_step_rate = 2, lr_range_test_staircase = true })
  T.near(lrs_at(st, { 0, 2, 3, 6, 7 }), { 0.001, 0.001, 0.003, 0.003, 0.005 }, 1e-15)
end)

T.test("param groups, resume, errors", function()
  -- per-group lists
  local o = opt(1, 1, 1)
  local s = S.WarmupLR.new(o, { warmup_min_lr = { 0, 0.1, 0.2 }, warmup_max_lr = { 1, 1.1, 1.2 }, warmup_num_steps = 5,
    warmup_type = "linear" })
  s:step(); s:step(); s:step() -- it = 2 → gamma 0.4
  T.near({ o.param_groups[1].lr, o.param_groups[2].lr, o.param_groups[3].lr }, { 0.4, 0.5, 0.6 }, 1e-15)
  T.raises(function() S.WarmupLR.new(o, { warmup_min_lr = { 0, 1 } }) end, "expected 3 values for warmup_min_lr")
  -- resume: a fresh scheduler loaded from state_dict continues identically
  local a = S.WarmupDecayLR.new(opt(0.1), { total_num_steps = 30, warmup_num_steps = 7 })
  for _ = 1, 12 do a:step() end
  local sd = a:state_dict()
  T.eq(sd.last_batch_iteration, 11)
  local b = S.WarmupDecayLR.new(opt(0.1), { total_num_steps = 30, warmup_num_steps = 7 })
  b:load_state_dict(sd)
  for _ = 1, 5 do a:step(); b:step(); T.near(b:get_last_lr(), a:get_last_lr(), 0, 0) end
  -- explicit iteration
  b:step(29)
  T.near(b:get_last_lr(), { 0.001 * 1 / 23 }, 1e-15) -- default max 0.001, (30 - 29) / (30 - 7)
  T.raises(function() S.WarmupLR.new(nil, { warmup_max_lr = 1, warmup_steps = 3 }) end,
    'unknown parameter "warmup_steps"; did you mean "warmup_num_steps"?')
  T.raises(function() S.WarmupDecayLR.new(nil, {}) end, "total_num_steps is required")
  T.raises(function() S.new("WarmupCosine", nil, {}) end, 'did you mean "WarmupCosineLR"?')
  T.raises(function() S.WarmupDecayLR.new(nil, { total_num_steps = "auto" }) end, 'still "auto"')
end)

T.test("scheduler from a resolved config", function()
  local cfg = config.load("configs/ds_config.json", { args = { max_steps = 40, warmup_steps = 4 } })
  local o = opt(cfg.optimizer.params.lr)
  local s = S.from_config(cfg.scheduler, o)
  -- linear warmup to 2e-5 over 4 steps, then 2e-5 × (40 - it) / 36
  T.near(lrs_at(s, { 1, 4, 22, 40 }), { 0.5e-5, 2e-5, 2e-5 * 18 / 36, 0 }, 1e-20)
  T.eq(S.from_config(nil, o), nil)
end)

T.done()
