-- DeepSpeed config: defaults, every kind of error message, "auto" from training arguments, the batch
-- rule, overrides with type coercion, source tracking, `zrun check`, and the shipped configs/*.json.
local zr = require "zrun"
local T = zr.testing
local config = require "zrun.config"
local cjson = require "cjson"

-- world size 1 unless a test says otherwise (load() would read a launcher's environment)
local function load(t, opts)
  opts = opts or {}
  if opts.world_size == nil then opts.world_size = 1 end
  return config.load(t, opts)
end

T.test("defaults filled (DeepSpeed's values)", function()
  local c = load({ train_batch_size = 8 })
  T.eq(c.train_micro_batch_size_per_gpu, 8, "micro derived")
  T.eq(c.gradient_accumulation_steps, 1, "accumulation derived")
  T.eq(c.steps_per_print, nil); T.eq(c.wall_clock_breakdown, false); T.eq(c.gradient_clipping, 1.0)
  T.eq(c.prescale_gradients, false); T.eq(c.gradient_predivide_factor, 1)
  T.eq(c.fp16.enabled, false); T.eq(c.fp16.loss_scale, 0); T.eq(c.fp16.initial_scale_power, 16)
  T.eq(c.fp16.loss_scale_window, 1000); T.eq(c.fp16.hysteresis, 2); T.eq(c.fp16.min_loss_scale, 1)
  T.eq(c.fp16.consecutive_hysteresis, false); T.eq(c.bf16.enabled, false)
  local z = c.zero_optimization
  T.eq(z.stage, 0); T.eq(z.allgather_partitions, true); T.eq(z.allgather_bucket_size, 5e8)
  T.eq(z.reduce_scatter, true); T.eq(z.reduce_bucket_size, 5e8); T.eq(z.contiguous_gradients, true)
  T.eq(z.overlap_comm, false, "overlap_comm off below stage 3"); T.eq(z.sub_group_size, 1e9)
  T.eq(z.stage3_max_live_parameters, 1e9); T.eq(z.stage3_max_reuse_distance, 1e9)
  T.eq(z.stage3_prefetch_bucket_size, 5e7); T.eq(z.stage3_param_persistence_threshold, 1e5)
  T.eq(z.stage3_gather_16bit_weights_on_model_save, false); T.eq(z.round_robin_gradients, false)
  T.eq(z.zero_hpz_partition_size, 1)
  T.eq(z.offload_optimizer, nil, "no offload section unless given"); T.eq(z.offload_param, nil)
  local ac = c.activation_checkpointing
  T.eq(ac.partition_activations, false); T.eq(ac.cpu_checkpointing, false)
  T.eq(ac.contiguous_memory_optimization, false); T.eq(ac.number_checkpoints, nil)
  T.eq(ac.synchronize_checkpoint_boundary, false); T.eq(ac.profile, false)
  T.eq(c.zero_allow_untested_optimizer, false); T.eq(c.communication_data_type, nil)
  T.eq(c.optimizer, nil); T.eq(c.scheduler, nil)
  T.eq(c:source("steps_per_print"), "default"); T.eq(c:source("train_batch_size"), "file")
  T.eq(c:source("gradient_accumulation_steps"), "derived")
  -- stage-dependent default, offload section defaults, optimizer/scheduler defaults
  local c3 = load({ train_batch_size = 8, zero_optimization = { stage = 3, offload_optimizer = { device = "cpu" } },
    optimizer = { type = "adamw" }, scheduler = { type = "WarmupLR" } })
  T.eq(c3.zero_optimization.overlap_comm, true, "overlap_comm on at stage 3")
  local oo = c3.zero_optimization.offload_optimizer
  T.eq(oo.device, "cpu"); T.eq(oo.buffer_count, 4); T.eq(oo.ratio, 1); T.eq(oo.fast_init, false)
  T.eq(c3.optimizer.type, "AdamW", "type is case-insensitive, stored canonical")
  T.eq(c3.optimizer.params.lr, 1e-3); T.eq(c3.optimizer.params.eps, 1e-8); T.eq(c3.optimizer.params.weight_decay, 0)
  T.near(c3.optimizer.params.betas, { 0.9, 0.999 })
  local sp = c3.scheduler.params
  -- WarmupLR's warmup_max_lr left out: None in DeepSpeed 0.19.8 (each param group's own lr), not 0.001
  T.eq(sp.warmup_min_lr, 0); T.eq(sp.warmup_max_lr, nil); T.eq(sp.warmup_num_steps, 1000); T.eq(sp.warmup_type, "log")
  local cd = load({ train_batch_size = 8, scheduler = { type = "WarmupDecayLR", params = { total_num_steps = 10 } } })
  T.eq(cd.scheduler.params.warmup_max_lr, 0.001, "WarmupDecayLR's own default")
end)

-- DeepSpeed 0.19.8 (engine.py get_optimizer_configuration): torch_adam builds torch.optim.AdamW, whose
-- weight_decay defaults to 0.01; FusedAdam's (no torch_adam) to 0
T.test("optimizer.params.torch_adam: weight_decay defaults to torch AdamW's 0.01", function()
  for _, ty in ipairs { "Adam", "AdamW" } do
    local c = load({ train_batch_size = 2, optimizer = { type = ty, params = { torch_adam = true } } })
    T.eq(c.optimizer.params.weight_decay, 0.01, ty)
    c = load({ train_batch_size = 2, optimizer = { type = ty, params = { torch_adam = true, weight_decay = 0 } } })
    T.eq(c.optimizer.params.weight_decay, 0, ty .. " given 0")
    T.eq(load({ train_batch_size = 2, optimizer = { type = ty } }).optimizer.params.weight_decay, 0, ty .. " FusedAdam")
  end
end)

-- keys DeepSpeed 0.19.8 reads that change nothing zrun computes: accepted, a line when set away from
-- the default; fp32_optimizer_states false (bf16 moments in DeepSpeedCPUAdam) refused with the key that does it
T.test("compute_grad_norm, parameter_alignment, set_grad_none, fp32_optimizer_states", function()
  local c = load({ train_batch_size = 2, zero_optimization = { stage = 2, compute_grad_norm = false,
    parameter_alignment = true }, optimizer = { type = "AdamW", params = { set_grad_none = false, fp32_optimizer_states = true } } })
  local w = table.concat(c:warnings(), "\n")
  for _, part in ipairs { "zero_optimization.compute_grad_norm = false: zrun does not implement this (DeepSpeed would train the same)",
    "zero_optimization.parameter_alignment = true: zrun does not implement this",
    "optimizer.params.set_grad_none = false: zrun does not implement this (DeepSpeed would train the same)" } do
    assert(w:find(part, 1, true), w)
  end
  T.eq(#c:warnings(), 3)
  T.raises(function() load({ train_batch_size = 2, optimizer = { type = "AdamW", params = { fp32_optimizer_states = false } } }) end,
    "optimizer.params.fp32_optimizer_states = false: zrun does not implement this and the results would differ " ..
    "from DeepSpeed's; allowed: true; bf16.bf16_optimizer_states keeps AdamW's moments in bf16")
end)

T.test("warmup_num_steps 0 (DeepSpeed 0.19.8 refuses it): runs DeepSpeed's earlier 2-step rule and says so", function()
  local c = load({ train_batch_size = 2, scheduler = { type = "WarmupDecayLR", params = { warmup_num_steps = 0,
    total_num_steps = 10 } } })
  T.eq(c.scheduler.params.warmup_num_steps, 0)
  local w = table.concat(c:warnings(), "\n")
  assert(w:find("scheduler.params.warmup_num_steps = 0: DeepSpeed 0.19.8's WarmupDecayLR refuses it", 1, true), w)
  T.eq(#load({ train_batch_size = 2, scheduler = { type = "WarmupLR", params = { warmup_num_steps = 1 } } }):warnings(), 0)
end)

T.test("WarmupLR without warmup_max_lr warms each param group up to its own lr (engine)", function()
  local m = zr.nn.Sequential(zr.nn.Linear(3, 4), zr.nn.Linear(4, 2))
  local ps = m:parameters()
  local e = zr.initialize({ model = m, model_parameters = { { params = { ps[1], ps[2] } }, { params = { ps[3], ps[4] }, lr = 0.5 } },
    config = { train_batch_size = 2, optimizer = { type = "AdamW", params = { lr = 0.25 } },
      scheduler = { type = "WarmupLR", params = { warmup_num_steps = 4, warmup_type = "linear" } } } })
  for i = 1, 5 do
    e:backward(m(zr.randn({ 2, 3 })):sum())
    e:step()
    -- the schedule's iteration i - 1 of 4 (DeepSpeed steps it after each optimizer step)
    if i == 4 then T.near(e:get_lr(), { 0.25 * 3 / 4, 0.5 * 3 / 4 }, 1e-15, 0, "warming up") end
  end
  T.near(e:get_lr(), { 0.25, 0.5 }, 1e-15, 0, "after warmup")
end)

local function contains(text, part)
  if not text:find(part, 1, true) then error(("expected %q in:\n%s"):format(part, text), 2) end
end

-- the warnings of a config that loads
local function warnings(t) return table.concat(load(t):warnings(), "\n") end

T.test('"zero_optimization": true / false, DeepSpeed\'s deprecated form: stage 1 (allgather_size its bucket) / 0', function()
  local c = load({ train_batch_size = 8, zero_optimization = true, allgather_size = 1e8 })
  T.eq(c.zero_optimization.stage, 1)
  T.eq(c.zero_optimization.allgather_bucket_size, 1e8)
  contains(table.concat(c:warnings(), "\n"), "deprecated form, read as {\"stage\": 1}")
  assert(not table.concat(c:warnings(), "\n"):find("allgather_size", 1, true), "allgather_size is read, not unknown")
  T.eq(load({ train_batch_size = 8, zero_optimization = true }).zero_optimization.allgather_bucket_size, 5e8)
  T.eq(load({ train_batch_size = 8, zero_optimization = false }).zero_optimization.stage, 0)
end)

T.test("unknown keys name a suggestion", function()
  -- top level: DeepSpeed ignores what it does not know, so zrun warns (once per key)
  contains(warnings({ train_batch_size = 8, zero_optimisation = { stage = 1 } }),
    'unknown key "zero_optimisation" at the top level is ignored, as DeepSpeed ignores it; did you mean "zero_optimization"?')
  -- JSON's 1e400 is infinity: refused, not printed as a size
  T.raises(function() load(require("cjson").decode('{"train_micro_batch_size_per_gpu": 1e400}')) end,
    "train_micro_batch_size_per_gpu must be a positive integer")
  T.raises(function() load({ train_batch_size = 8, optimizer = { type = "AdamW", params = { lr = math.huge } } }) end,
    "optimizer.params.lr")
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { stgae = 1 } }) end,
    'unknown key "zero_optimization.stgae"; did you mean "zero_optimization.stage"?')
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { stage3_max_live_params = 1 } }) end,
    'did you mean "zero_optimization.stage3_max_live_parameters"?')
  -- a key in the wrong section
  contains(warnings({ train_batch_size = 8, stage = 2 }),
    'unknown key "stage" at the top level is ignored, as DeepSpeed ignores it; did you mean "zero_optimization.stage"?')
  T.raises(function() load({ train_batch_size = 8, optimizer = { type = "AdamW", params = { betas1 = 0.9 } } }) end,
    'unknown key "optimizer.params.betas1"; did you mean "optimizer.params.betas"?')
  T.raises(function() load({ train_batch_size = 8, optimizer = { type = "AdamWW" } }) end,
    'did you mean "AdamW"?')
  local e = warnings({ train_batch_size = 8, qqqqqqqqqq = 1 })
  contains(e, 'unknown key "qqqqqqqqqq" at the top level is ignored, as DeepSpeed ignores it (the nearest known key is')
  assert(not e:find("did you mean"), "no suggestion for a far-off key: " .. e)
  -- a parameter of another optimizer: what this one takes, not itself as the suggestion
  e = T.raises(function() load({ train_batch_size = 8, optimizer = { type = "AdamW", params = { momentum = 0.9 } } }) end,
    'unknown key "optimizer.params.momentum"; AdamW takes lr, betas, eps, weight_decay')
  assert(not e:find("did you mean"), "no suggestion of the key itself: " .. e)
  -- max_grad_norm: deepspeed.initialize refuses it for every optimizer, pointing to gradient_clipping
  e = T.raises(function() load({ train_batch_size = 8, optimizer = { type = "AdamW", params = { max_grad_norm = 1 } } }) end,
    "optimizer.params.max_grad_norm: DeepSpeed does not take max_grad_norm as an optimizer parameter " ..
    "(deepspeed.initialize raises a ValueError); use the top-level gradient_clipping")
  assert(not e:find("unknown key"), "one message: " .. e)
  T.eq(config.distance("stage", "stgae"), 1, "transposition counts once")
  T.eq(config.distance("kitten", "sitting"), 3)
end)

T.test("DeepSpeed's tuning keys zrun does not apply: silent at their defaults, a warning naming each when changed", function()
  local zo = { stage = 3, sub_group_size = 1e12, round_robin_gradients = true, contiguous_gradients = false,
    reduce_scatter = false, allgather_partitions = false, use_multi_rank_bucket_allreduce = false,
    elastic_checkpoint = true, stage3_model_persistence_threshold = 1e6, stage3_module_granularity_threshold = 10,
    stage3_use_all_reduce_for_fetch_params = true, stage3_allgather_sequential = true,
    ignore_unused_parameters = false, memory_efficient_linear = false, override_module_apply = false,
    log_trace_cache_warnings = true, enable_sanity_checks = true,
    offload_optimizer = { device = "cpu", super_offload = true, cpuadam_cores_perc = 0.5 } }
  local w = warnings({ train_batch_size = 8, zero_optimization = zo, bf16 = { enabled = true,
    immediate_grad_update = true, check_grad_overflow = false }, checkpoint = { tag_validation = "Fail" },
    timers = { throughput = { enabled = true } } })
  local all = w
  for k in pairs(zo) do
    if k ~= "stage" and k ~= "offload_optimizer" then
      T.eq(all:find("zero_optimization." .. k .. " = ", 1, true) ~= nil, true, k .. " warned: " .. all)
    end
  end
  for _, k in ipairs { "offload_optimizer.super_offload", "offload_optimizer.cpuadam_cores_perc", "bf16.immediate_grad_update",
    "bf16.check_grad_overflow", "checkpoint.tag_validation", '"timers"' } do
    T.eq(all:find(k, 1, true) ~= nil, true, k .. " warned: " .. all)
  end
  -- the same keys at DeepSpeed's defaults (as most configs write them): nothing to say
  w = warnings({ train_batch_size = 8, zero_optimization = { stage = 3, sub_group_size = 1e9,
    round_robin_gradients = false, contiguous_gradients = true, reduce_scatter = true, allgather_partitions = true,
    ignore_unused_parameters = true }, bf16 = { enabled = true, check_grad_overflow = true },
    checkpoint = { tag_validation = "warn" }, timers = { throughput = { enabled = false } } })
  T.eq(w, "", "no warning")
end)

T.test("wrong types and values name the key, the value and what is allowed", function()
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { stage = 4 } }) end,
    "zero_optimization.stage must be 0, 1, 2 or 3, got 4")
  T.raises(function() load({ train_batch_size = 8, fp16 = { enabled = "yes" } }) end,
    'fp16.enabled must be true or false, got "yes"')
  T.raises(function() load({ train_micro_batch_size_per_gpu = 2.5 }) end,
    "train_micro_batch_size_per_gpu must be a positive integer, got 2.5")
  T.raises(function() load({ train_batch_size = 8, gradient_clipping = -1 }) end,
    "gradient_clipping must be a non-negative number, got -1")
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { offload_optimizer = { device = "gpu" } } }) end,
    'zero_optimization.offload_optimizer.device must be "none", "cpu" or "nvme", got "gpu"; did you mean "cpu"?')
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { stage = 2, offload_optimizer = { ratio = 2 } } }) end,
    "zero_optimization.offload_optimizer.ratio must be a number between 0 and 1, got 2")
  T.raises(function() load({ train_batch_size = 8, zero_optimization = 3 }) end,
    "zero_optimization must be an object {...}, got 3")
  T.raises(function() load({ train_batch_size = 8, optimizer = { type = "Adam", params = { betas = { 0.9 } } } }) end,
    "optimizer.params.betas must be a list of 2 numbers, got [0.9]")
  -- OneCycle's bounds: a number or one a param group (DeepSpeed's _format_param), never negative
  local oc = load({ train_batch_size = 8, scheduler = { type = "OneCycle", params = { cycle_min_lr = { 1e-4, 2e-4 },
    cycle_max_lr = 1e-3, cycle_min_mom = { 0.8, 0.85 } } } }).scheduler.params
  T.eq(oc.cycle_min_lr[2], 2e-4); T.eq(oc.cycle_max_lr, 1e-3); T.eq(oc.cycle_min_mom[2], 0.85)
  T.raises(function() load({ train_batch_size = 8, scheduler = { type = "OneCycle", params = { cycle_min_lr = { -1, 0 },
    cycle_max_lr = 1 } } }) end, "scheduler.params.cycle_min_lr must be a number or a list of numbers (each >= 0), got [-1, 0]")
  T.raises(function() load({ train_batch_size = 8, scheduler = { type = "OneCycle", params = { cycle_min_lr = -1,
    cycle_max_lr = 1 } } }) end, "scheduler.params.cycle_min_lr must be a number or a list of numbers (each >= 0), got -1")
  T.raises(function() load({ train_batch_size = 8, steps_per_print = "auto" }) end,
    'steps_per_print does not accept "auto"; it must be a positive integer')
  T.raises(function() load({ train_batch_size = 8, scheduler = { type = "WarmupDecayLR" } }) end,
    'scheduler.params.total_num_steps is required (a value, or "auto")')
  local e = T.raises(function() load({ train_batch_size = 8, zero_optimization = { stage = 9 }, fp16 = { hysteresis = 0 } }) end,
    "2 problems")
  assert(e:find("zero_optimization.stage must be", 1, true) and e:find("fp16.hysteresis must be a positive integer, got 0", 1, true), e)
end)

T.test("batch rule: any two give the third, mismatch shows the numbers", function()
  local function b(t, ws)
    local c = load(t, { world_size = ws })
    return c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps
  end
  local tb, mb, ga = b({ train_micro_batch_size_per_gpu = 3, gradient_accumulation_steps = 5 }, 7)
  T.eq(tb, 105); T.eq(mb, 3); T.eq(ga, 5)
  tb, mb, ga = b({ train_batch_size = 105, train_micro_batch_size_per_gpu = 3 }, 7)
  T.eq(ga, 5)
  tb, mb, ga = b({ train_batch_size = 105, gradient_accumulation_steps = 5 }, 7)
  T.eq(mb, 3)
  tb, mb, ga = b({ train_batch_size = 14 }, 7)
  T.eq(mb, 2); T.eq(ga, 1)
  tb, mb, ga = b({ train_micro_batch_size_per_gpu = 1 }, 1)
  T.eq(tb, 1); T.eq(ga, 1)
  T.raises(function() load({ train_batch_size = 32, train_micro_batch_size_per_gpu = 4, gradient_accumulation_steps = 4 },
    { world_size = 1 }) end, "32 ≠ 4 × 4 × 1 = 16")
  T.raises(function() load({ train_batch_size = 30, train_micro_batch_size_per_gpu = 4 }, { world_size = 2 }) end,
    "train_batch_size 30 is not divisible by train_micro_batch_size_per_gpu × world size (4 × 2) = 8")
  T.raises(function() load({ gradient_accumulation_steps = 4 }) end, "set train_batch_size or train_micro_batch_size_per_gpu")
end)

T.test("impossible requests name the key", function()
  -- offload_param below stage 3: DeepSpeed's stage 1/2 optimizer ignores it (a warning; nothing offloaded)
  local c2 = load({ train_batch_size = 8, zero_optimization = { stage = 2, offload_param = { device = "cpu" } } })
  T.eq(c2.zero_optimization.offload_param.device, "none")
  contains(c2:warnings()[1], "zero_optimization.offload_param (device \"cpu\") has no effect at stage 2, as in DeepSpeed")
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { stage = 0, offload_optimizer = { device = "cpu" } } }) end,
    "zero_optimization.offload_optimizer (device \"cpu\") needs zero_optimization.stage 1, 2 or 3, got 0")
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { stage = 3, offload_param = { device = "nvme" } } }) end,
    "zero_optimization.offload_param.nvme_path is required")
  T.raises(function() load({ train_batch_size = 8, bf16 = { enabled = true }, fp16 = { enabled = true } }) end,
    "fp16.enabled and bf16.enabled are both true")
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { stage = 1 }, optimizer = { type = "Lamb" } }) end,
    'optimizer.type "Lamb" at zero_optimization.stage 1: DeepSpeed stops here')
  -- offload_param with device "none" below stage 3 is harmless, as in DeepSpeed
  load({ train_batch_size = 8, zero_optimization = { stage = 2, offload_param = { device = "none" } } })
end)

T.test("auto resolved from training arguments", function()
  local args = { per_device_train_batch_size = 4, gradient_accumulation_steps = 2, learning_rate = 3e-4,
    adam_beta1 = 0.8, weight_decay = 0.1, warmup_ratio = 0.1, max_steps = 50, bf16 = true, max_grad_norm = 0.5,
    hidden_size = 64 }
  local c = load("configs/zero3.json", { world_size = 3, args = args })
  T.eq(c.train_micro_batch_size_per_gpu, 4); T.eq(c.gradient_accumulation_steps, 2)
  T.eq(c.train_batch_size, 24, "3 × 4 × 2")
  T.eq(c.gradient_clipping, 0.5); T.eq(c.bf16.enabled, true); T.eq(c.fp16.enabled, false)
  local p = c.optimizer.params
  T.eq(p.lr, 3e-4); T.near(p.betas, { 0.8, 0.999 }); T.eq(p.eps, 1e-8); T.eq(p.weight_decay, 0.1)
  local s = c.scheduler.params
  T.eq(s.warmup_min_lr, 0); T.eq(s.warmup_max_lr, 3e-4); T.eq(s.warmup_num_steps, 5, "ceil(50 × 0.1)")
  local z = c.zero_optimization
  T.eq(z.reduce_bucket_size, 64 * 64); T.eq(z.stage3_prefetch_bucket_size, 3686, "floor(0.9 × 4096)")
  T.eq(z.stage3_param_persistence_threshold, 640)
  for _, k in ipairs { "train_batch_size", "optimizer.params.lr", "scheduler.params.warmup_num_steps",
    "zero_optimization.reduce_bucket_size", "bf16.enabled" } do
    T.eq(c:source(k), "auto", k)
  end
  local _, note = c:source("optimizer.params.lr")
  T.eq(note, "args.learning_rate")
  T.eq(#c:pending(), 0)
  -- missing arguments take TrainingArguments' defaults
  local d = load("configs/zero2.json")
  T.eq(d.train_micro_batch_size_per_gpu, 8); T.eq(d.optimizer.params.lr, 5e-5); T.eq(d.gradient_clipping, 1)
  T.eq(d.scheduler.params.warmup_num_steps, 0)
end)

T.test("auto: steps from epochs and dataset size, pending, finalize", function()
  -- 2000 rows on 2 ranks: 1000 per rank, 250 micro-batches of 4, 31 updates of 8 and one of 2, × 3 epochs
  local c = load("configs/ds_config.json", { world_size = 2, args = { train_dataset_size = 2000, warmup_steps = 7 } })
  T.eq(c.train_batch_size, 64)
  T.eq(c.scheduler.params.total_num_steps, 96)
  T.eq(c.scheduler.params.warmup_num_steps, 7)
  T.eq(c.scheduler.params.warmup_max_lr, 2e-5, "follows the optimizer lr when args has none")
  -- ... the file's lr, not the schema's default (1e-3) when the file has none: then args.learning_rate's
  -- default, 5e-5, as transformers' fill_match does
  local nolr = load({ train_micro_batch_size_per_gpu = 2, optimizer = { type = "AdamW", params = {} },
    scheduler = { type = "WarmupLR", params = { warmup_max_lr = "auto", warmup_num_steps = 2 } } }, { args = {} })
  T.eq(nolr.scheduler.params.warmup_max_lr, 5e-5, "args.learning_rate's default")
  local p = load("configs/ds_config.json", { args = { warmup_ratio = 0.25 } })
  T.eq(p.scheduler.params.total_num_steps, "auto")
  T.eq(#p:pending(), 2)
  T.eq(p:source("scheduler.params.total_num_steps"), "auto")
  config.finalize(p, { num_training_steps = 41 })
  T.eq(p.scheduler.params.total_num_steps, 41); T.eq(p.scheduler.params.warmup_num_steps, 11, "ceil(41 × 0.25)")
  T.eq(#p:pending(), 0)
  -- transformers 5: warmup_steps below 1 is a fraction of the steps (get_warmup_steps), at or above 1 its integer part
  local f = load("configs/ds_config.json", { args = { warmup_steps = 0.1, max_steps = 41 } })
  T.eq(f.scheduler.params.warmup_num_steps, 5, "ceil(41 × 0.1)")
  T.eq(load("configs/ds_config.json", { args = { warmup_steps = 3.0, max_steps = 41 } }).scheduler.params.warmup_num_steps, 3)
  T.eq(config.warmup_steps(0.1, 0, 41), 5); T.eq(config.warmup_steps(7.5, 0.5, 41), 7); T.eq(config.warmup_steps(0, 0.5, 41), 21)
  local z = load("configs/zero3_offload.json")
  T.eq(z.zero_optimization.reduce_bucket_size, "auto")
  config.finalize(z, { model = { config = { hidden_size = 10 } } })
  T.eq(z.zero_optimization.reduce_bucket_size, 100); T.eq(z.zero_optimization.stage3_prefetch_bucket_size, 90)
  T.eq(z.zero_optimization.stage3_param_persistence_threshold, 100)
end)

T.test("args.bf16 / args.fp16 with no such section in the file: added and enabled, as HF's Trainer does", function()
  local base = { train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = 1, zero_optimization = { stage = 2 } }
  local c = load(base, { args = { bf16 = true } })
  T.eq(c.bf16.enabled, true); T.eq(c.fp16.enabled, false)
  local kind, note = c:source("bf16.enabled")
  T.eq(kind, "auto"); T.eq(note, "args.bf16")
  T.eq(base.bf16, nil, "the caller's table is left as it was")
  local f = load(base, { args = { fp16 = true } })
  T.eq(f.fp16.enabled, true); T.eq(f.bf16.enabled, false)
  local n = load(base, { args = { bf16 = false } })
  T.eq(n.bf16.enabled, false); T.eq(n.fp16.enabled, false)
  T.eq(load(base).bf16.enabled, false, "no arguments: DeepSpeed's default")
  -- a section the file has is the file's: a disagreeing explicit argument stays an error
  T.raises(function() load({ train_batch_size = 8, bf16 = { enabled = false } }, { args = { bf16 = true } }) end,
    "bf16.enabled = false (file) but args.bf16 = true")
  -- the other precision enabled in the file is refused (accelerate refuses it)
  T.raises(function() load({ train_batch_size = 8, fp16 = { enabled = true } }, { args = { bf16 = true } }) end,
    "args.bf16 = true but the config enables fp16")
  T.raises(function() load({ train_batch_size = 8, bf16 = { enabled = true } }, { args = { fp16 = true } }) end,
    "args.fp16 = true but the config enables bf16")
  -- "auto" in the other section is the argument's (false), not a conflict
  local a = load({ train_batch_size = 8, fp16 = { enabled = "auto" } }, { args = { bf16 = true } })
  T.eq(a.bf16.enabled, true); T.eq(a.fp16.enabled, false)
end)

T.test("file values that disagree with explicit arguments are errors", function()
  T.raises(function() load("configs/ds_config.json", { args = { learning_rate = 1e-4, max_steps = 10 } }) end,
    "optimizer.params.lr = 2e-05 (file) but args.learning_rate = 0.0001")
  T.raises(function() load("configs/ds_config.json", { args = { per_device_train_batch_size = 2, max_steps = 10 } }) end,
    "train_micro_batch_size_per_gpu = 4 (file) but args.per_device_train_batch_size = 2")
  -- one disagreement is one line, with the fix; several are listed a line each
  T.raises(function() load("configs/ds_config.json", { args = { per_device_train_batch_size = 2, max_steps = 10 } }) end,
    'configs/ds_config.json: the config disagrees with the training arguments: train_micro_batch_size_per_gpu = 4 (file) ' ..
    'but args.per_device_train_batch_size = 2; set them equal, or set the config value to "auto"')
  local e = T.raises(function() load("configs/ds_config.json", { args = { per_device_train_batch_size = 2,
    learning_rate = 1e-4, max_steps = 10 } }) end, "the config disagrees with the training arguments (set them equal")
  T.eq(select(2, e:gsub("\n", "")), 2, "a line each: " .. e)
  -- equal values are fine
  load("configs/ds_config.json", { args = { learning_rate = 2e-5, per_device_train_batch_size = 4, bf16 = true } })
end)

T.test("overrides with type coercion and sources", function()
  local c = load("configs/ds_config.json", { args = { max_steps = 20 }, overrides = {
    "zero_optimization.stage=3", "bf16.enabled=false", "optimizer.params.betas=[0.9,0.95]",
    "zero_optimization.offload_optimizer.device=cpu", "steps_per_print=5", "gradient_clipping=0.25",
    "zero_optimization.reduce_bucket_size=5e7", "communication_data_type=fp32" } })
  T.eq(c.zero_optimization.stage, 3); T.eq(type(c.zero_optimization.stage), "number")
  T.eq(c.bf16.enabled, false); T.near(c.optimizer.params.betas, { 0.9, 0.95 })
  T.eq(c.zero_optimization.offload_optimizer.device, "cpu"); T.eq(c.zero_optimization.offload_optimizer.buffer_count, 4)
  T.eq(c.steps_per_print, 5); T.eq(c.gradient_clipping, 0.25); T.eq(c.zero_optimization.reduce_bucket_size, 5e7)
  T.eq(c.communication_data_type, "fp32")
  T.eq(c.zero_optimization.overlap_comm, true)
  for _, k in ipairs { "zero_optimization.stage", "bf16.enabled", "optimizer.params.betas", "steps_per_print",
    "zero_optimization.offload_optimizer.device" } do
    T.eq(c:source(k), "override", k)
  end
  T.eq(c:source("zero_optimization.offload_optimizer.pin_memory"), "default")
  T.eq(c:source("train_micro_batch_size_per_gpu"), "file")
  -- map form with Lua values
  local m = load({ train_batch_size = 8 }, { overrides = { ["zero_optimization.stage"] = 2 } })
  T.eq(m.zero_optimization.stage, 2)
  T.raises(function() load({ train_batch_size = 8 }, { overrides = { "zero_optimization.stag=2" } }) end,
    'override unknown key "zero_optimization.stag"; did you mean "zero_optimization.stage"?')
  T.raises(function() load({ train_batch_size = 8 }, { overrides = { "fp16.enabled=maybe" } }) end,
    "fp16.enabled=maybe: expected true or false")
  T.raises(function() load({ train_batch_size = 8 }, { overrides = { "zero_optimization.stage=5" } }) end,
    "zero_optimization.stage must be 0, 1, 2 or 3, got 5")
  T.raises(function() load({ train_batch_size = 8 }, { overrides = { "stage" } }) end, "must look like key.sub=value")
  T.raises(function() load({ train_batch_size = 8 }, { overrides = { "optimizer.params.lr=1" } }) end,
    "set optimizer.type first")
end)

T.test("describe shows every value with its source", function()
  local c = load("configs/ds_config.json", { args = { max_steps = 12 }, overrides = { "zero_optimization.stage=1" } })
  local s = config.format(c)
  local function row(key, value, src)
    local pat = "\n" .. key:gsub("%.", "%%.") .. "%s+" .. value:gsub("[%.%[%]%-]", "%%%0") .. "%s+" .. src
    assert(s:find(pat), ("no row %s %s %s in:\n%s"):format(key, value, src, s))
  end
  row("train_micro_batch_size_per_gpu", "4", "file")
  row("train_batch_size", "32", "auto")
  row("zero_optimization.stage", "1", "override")
  row("steps_per_print", "10", "file")
  row("fp16.initial_scale_power", "16", "default")
  row("scheduler.params.total_num_steps", "12", "auto")
  row("optimizer.params.betas", "[0.9, 0.999]", "file")
  row("zero_optimization.allgather_bucket_size", "500000000", "default")
  local d = load({ train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = 3 }, { world_size = 5 })
  assert(config.format(d):find("\ntrain_batch_size%s+30%s+derived%s+micro 2 × accumulation 3 × world 5"), config.format(d))
end)

T.test("JSON files: syntax errors with line numbers, round trip", function()
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write('{\n  "train_batch_size": 8,\n  "fp16": { "enabled": true, }\n}\n')
  f:close()
  T.raises(function() load(path) end, "not valid JSON (line 3")
  os.remove(path)
  T.raises(function() load("/nonexistent/ds.json") end, "cannot open /nonexistent/ds.json")
  local c = load("configs/ds_config.json", { args = { max_steps = 9 } })
  local again = load(cjson.decode(c:to_json()))
  T.eq(again.scheduler.params.total_num_steps, 9); T.eq(again.train_batch_size, 32)
  T.eq(again.zero_optimization.overlap_comm, true)
end)

T.test("configs/*.json load and validate", function()
  local want = { zero0 = 0, zero1 = 1, zero2 = 2, zero3 = 3, zero2_offload = 2, zero3_offload = 3, ds_config = 2 }
  local n = 0
  for name, stage in pairs(want) do
    local c = load("configs/" .. name .. ".json", { world_size = 2, args = { max_steps = 10, hidden_size = 32 } })
    T.eq(c.zero_optimization.stage, stage, name)
    T.eq(#c:pending(), 0, name .. " pending")
    T.eq(c.train_batch_size, c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * 2, name)
    local off = name:find("offload") ~= nil
    T.eq(c:get("zero_optimization.offload_optimizer.device", "none") == "cpu", off, name .. " offload_optimizer")
    T.eq(c:get("zero_optimization.offload_param.device", "none") == "cpu", name == "zero3_offload", name .. " offload_param")
    n = n + 1
  end
  local ds = load("configs/ds_config.json", { args = { max_steps = 10 } })
  T.eq(ds.train_micro_batch_size_per_gpu, 4); T.eq(ds.gradient_accumulation_steps, 8); T.eq(ds.bf16.enabled, true)
  T.eq(ds.optimizer.type, "AdamW"); T.eq(ds.scheduler.type, "WarmupDecayLR")
  T.eq(n, 7)
end)

T.test("zrun check: exit status and output", function()
  local function run(...)
    local cmd = (os.getenv("ZRUN_BIN") or "./zrun") .. " -e 'os.exit(require(\"zrun.config\").check_main(arg))' " .. table.concat({ ... }, " ")
    local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
    local out = p:read("*a")
    p:close()
    return tonumber(out:match("rc=(%d+)%s*$")), out
  end
  local rc, out = run("configs/zero3.json", "zero_optimization.stage=2", "--world-size", "2",
    "args.per_device_train_batch_size=3")
  T.eq(rc, 0, out)
  assert(out:find("\nzero_optimization.stage%s+2%s+override"), out)
  assert(out:find("\ntrain_batch_size%s+6%s+auto"), out)
  rc, out = run("configs/zero3.json", "zero_optimization.stage=4")
  T.eq(rc, 1, out)
  assert(out:find("zero_optimization.stage must be 0, 1, 2 or 3, got 4", 1, true), out)
  rc, out = run()
  T.eq(rc, 2, out)
  -- args.NAME=VALUE go through the Trainer's check (were resolved into the config as they came, a misspelt one ignored)
  rc, out = run("configs/zero2.json", "args.learning_rate=abc")
  T.eq(rc, 2, out)
  assert(out:find('zrun check: TrainingArguments: learning_rate must be a number >= 0, got "abc"', 1, true), out)
  rc, out = run("configs/zero2.json", "args.lerning_rate=1")
  T.eq(rc, 2, out)
  assert(out:find("'lerning_rate' is not supported by zrun's Trainer; did you mean 'learning_rate'?", 1, true), out)
end)

T.test("DeepSpeed's field names and their stage3_ aliases are one setting", function()
  local c = load({ train_batch_size = 8, zero_optimization = { stage = 3, max_live_parameters = 7, max_reuse_distance = 8,
    prefetch_bucket_size = 9, param_persistence_threshold = 10, gather_16bit_weights_on_model_save = true,
    model_persistence_threshold = 11, module_granularity_threshold = 12, use_all_reduce_for_fetch_params = true,
    allgather_sequential = true } })
  local z = c.zero_optimization
  T.eq(z.stage3_max_live_parameters, 7); T.eq(z.stage3_max_reuse_distance, 8); T.eq(z.stage3_prefetch_bucket_size, 9)
  T.eq(z.stage3_param_persistence_threshold, 10); T.eq(z.stage3_gather_16bit_weights_on_model_save, true)
  T.eq(z.stage3_model_persistence_threshold, 11); T.eq(z.stage3_module_granularity_threshold, 12)
  T.eq(z.stage3_use_all_reduce_for_fetch_params, true); T.eq(z.stage3_allgather_sequential, true)
  T.eq(z.max_live_parameters, nil, "the resolved config keeps one spelling")
  T.eq(select(2, c:source("zero_optimization.stage3_max_live_parameters")), "given as max_live_parameters")
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { max_live_parameters = 1,
    stage3_max_live_parameters = 2 } }) end,
    "zero_optimization.max_live_parameters and zero_optimization.stage3_max_live_parameters are the same setting")
  -- an override by either name replaces the file's value under the other
  c = load({ train_batch_size = 8, zero_optimization = { max_live_parameters = 1 } },
    { overrides = { "zero_optimization.stage3_max_live_parameters=5" } })
  T.eq(c.zero_optimization.stage3_max_live_parameters, 5)
  c = load({ train_batch_size = 8, zero_optimization = { stage3_max_reuse_distance = 1 } },
    { overrides = { "zero_optimization.max_reuse_distance=6" } })
  T.eq(c.zero_optimization.stage3_max_reuse_distance, 6)
  T.eq(c:source("zero_optimization.stage3_max_reuse_distance"), "override")
end)

T.test("unknown keys: refused in DeepSpeed's pydantic sections, warned about where it ignores them", function()
  for _, s in ipairs { "zero_optimization", "fp16", "bf16", "tensorboard", "csv_monitor", "wandb", "comms_logger", "compile" } do
    T.raises(function() load({ train_batch_size = 8, [s] = { bogus_key = 1 } }) end, ('unknown key "%s.bogus_key"'):format(s))
  end
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { offload_optimizer = { device = "cpu", x = 1 } } }) end,
    'unknown key "zero_optimization.offload_optimizer.x"')
  for _, s in ipairs { "activation_checkpointing", "flops_profiler", "checkpoint", "aio", "data_types" } do
    contains(warnings({ train_batch_size = 8, [s] = { bogus_key = 1 } }),
      ('unknown key "%s.bogus_key" is ignored, as DeepSpeed ignores it'):format(s))
  end
  -- once per key, however often the config is walked
  local w = load({ train_batch_size = 8, _comment = "x" }):warnings()
  T.eq(#w, 1, table.concat(w, "\n"))
  contains(w[1], 'unknown key "_comment" at the top level is ignored')
end)

T.test("values DeepSpeed accepts: \"auto\" in pydantic sections, torch dtypes, newer keys", function()
  local c = load({ train_batch_size = 8, zero_optimization = { stage = 3, stage3_gather_16bit_weights_on_model_save = "auto" } })
  T.eq(c.zero_optimization.stage3_gather_16bit_weights_on_model_save, false, "DeepSpeed drops \"auto\": the default")
  T.eq(c:source("zero_optimization.stage3_gather_16bit_weights_on_model_save"), "auto")
  -- a field whose default is "auto" itself (ZenFlow's adaptive intervals): the user's value, DeepSpeed's mode
  c = load({ train_batch_size = 8, bf16 = { enabled = true }, zero_optimization = { stage = 2,
    offload_optimizer = { device = "cpu" }, zenflow = { update_interval = "auto" } } })
  T.eq(c.zero_optimization.zenflow.update_interval, "auto")
  T.eq(c:source("zero_optimization.zenflow.update_interval"), "file", "ZenFlow's own \"auto\", not HF's")
  c = load({ train_batch_size = 8, zero_optimization = { stage = 3, overlap_comm = "auto" } })
  T.eq(c.zero_optimization.overlap_comm, true, "\"auto\" takes the stage-dependent default")
  for _, d in ipairs { "torch.bfloat16", "bf16", "bfloat16", "torch.float16", "fp16", "half" } do
    T.eq(load({ train_batch_size = 8, torch_autocast = { dtype = d } }).torch_autocast.dtype, d)
  end
  T.raises(function() load({ train_batch_size = 8, torch_autocast = { dtype = "torch.bf16" } }) end,
    'torch_autocast.dtype must be "torch.bfloat16"')
  T.raises(function() load({ train_batch_size = 8, torch_autocast = { enabled = true } }) end,
    "torch_autocast.enabled: zrun has no torch.autocast; use bf16.enabled or fp16.enabled")
  T.raises(function() load({ train_batch_size = 8, bf16 = { enabled = true }, torch_autocast = { enabled = true } }) end,
    "torch_autocast.enabled with bf16.enabled: zrun has no torch.autocast")
  T.raises(function() load({ train_batch_size = 8, bf16 = { enabled = true }, torch_autocast = { enabled = true } }) end,
    "remove the torch_autocast section")
  c = load({ train_batch_size = 8, zero_optimization = { stage = 3, leaf_module = { classes = { "X" } },
    offload_optimizer = { device = "cpu", super_offload = true, cpuadam_cores_perc = 0.5 } },
    compile = { deepcompile = false }, comet = { enabled = false }, bf16 = { check_grad_overflow = false } })
  T.eq(c.zero_optimization.offload_optimizer.cpuadam_cores_perc, 0.5)
  T.eq(load({ train_batch_size = 8 }).bf16.check_grad_overflow, true, "DeepSpeed's current default")
end)

-- Keys DeepSpeed 0.19.8 reads that zrun took for unknown ones ("ignored, as DeepSpeed ignores it")
T.test("disable_python_gc, datastates_ckpt, checkpoint.writer, data_types.keep_in_fp32_modules: DeepSpeed's keys", function()
  contains(warnings({ train_batch_size = 8, disable_python_gc = true }),
    "disable_python_gc = true: zrun does not implement this (DeepSpeed would train the same)")
  T.eq(#load({ train_batch_size = 8, disable_python_gc = false, datastates_ckpt = false,
    compile = { autoep_non_moe = true } }):warnings(), 0)
  contains(warnings({ train_batch_size = 8, datastates_ckpt = {} }), '"datastates_ckpt" is accepted for compatibility')
  contains(warnings({ train_batch_size = 8, checkpoint = { writer = { type = "fast" } } }), '"checkpoint.writer" is accepted')
  T.eq(load({ train_batch_size = 8 }).data_types.keep_in_fp32_modules, "auto")
  T.eq(load({ train_batch_size = 8, data_types = { keep_in_fp32_modules = { "a.*b" } } }).data_types.keep_in_fp32_modules[1],
    "a.*b")
  T.raises(function() load({ train_batch_size = 8, data_types = { keep_in_fp32_modules = 5 } }) end,
    'data_types.keep_in_fp32_modules must be "auto" or a list of name patterns, got 5')
  T.raises(function() load({ train_batch_size = 8, data_types = { keep_in_fp32_modules = { "a(b" } } }) end,
    'data_types.keep_in_fp32_modules: "a(b": a name pattern takes letters')
end)

T.test("what zrun does not implement: a warning when DeepSpeed trains the same, an error when results differ", function()
  contains(warnings({ train_batch_size = 8, prescale_gradients = true }),
    "prescale_gradients = true: zrun does not implement this (DeepSpeed would train the same)")
  contains(warnings({ train_batch_size = 8, zero_optimization = { stage = 3, zero_hpz_partition_size = 8 } }),
    "zero_optimization.zero_hpz_partition_size = 8: zrun does not implement this")
  contains(warnings({ train_batch_size = 8, activation_checkpointing = { partition_activations = true } }),
    "activation_checkpointing.partition_activations = true")
  contains(warnings({ train_batch_size = 8, autotuning = { enabled = true } }), '"autotuning" is accepted')
  T.eq(#load({ train_batch_size = 8, autotuning = { enabled = false } }):warnings(), 0, "a disabled feature changes nothing")
  local cases = {
    { { gradient_allreduce_op = "sum" }, 'gradient_allreduce_op = "sum": zrun does not implement this and the results ' ..
      'would differ from DeepSpeed\'s; allowed: "mean"' },
    { { fp16 = { consecutive_hysteresis = true } }, "fp16.consecutive_hysteresis = true" },
    { { bf16 = { enabled = true, bf16_master_weights_and_grads = true, bf16_optimizer_states = true },
      zero_optimization = { stage = 2 }, optimizer = { type = "Lion", params = {} } }, "set optimizer.type to AdamW" },
    { { zero_optimization = { stage = 3, zero_quantized_gradients = true } }, "zero_optimization.zero_quantized_gradients" },
    { { data_types = { param_dtype = "bf16" } }, 'data_types.param_dtype = "bf16" conflicts with the training ' ..
      "precision (fp32), as DeepSpeed asserts" },
    { { optimizer = { type = "Adam", params = { bias_correction = false } } }, "optimizer.params.bias_correction = false" },
    { { optimizer = { type = "Adam", params = { adam_w_mode = false } } }, "optimizer.params.adam_w_mode = false" },
    { { optimizer = { type = "AdamW", params = { amsgrad = true } } }, "optimizer.params.amsgrad = true" },
    { { managed_gradient_accumulation = false }, "managed_gradient_accumulation = false: zrun does not implement " ..
      "this and the results would differ from DeepSpeed's; allowed: true; zrun's engine ends a window every " ..
      "gradient_accumulation_steps micro-batches, or where engine:set_gradient_accumulation_boundary(true) says" },
    { { zero_optimization = { stage = 2, load_from_fp32_weights = false } },
      "zero_optimization.load_from_fp32_weights = false: zrun does not implement this and the results would differ" },
    { { progressive_layer_drop = { enabled = true } }, '"progressive_layer_drop" is set' },
    { { wandb = { enabled = true } }, "wandb.enabled = true: zrun cannot reach wandb" },
    { { comet = { enabled = true } }, "comet.enabled = true" },
  }
  for _, c in ipairs(cases) do
    local t = c[1]
    t.train_batch_size = 8
    T.raises(function() load(t) end, c[2])
  end
  -- AdamW is decoupled whatever adam_w_mode says (DeepSpeed: name == "adamw" or adam_w_mode)
  load({ train_batch_size = 8, optimizer = { type = "AdamW", params = { adam_w_mode = false } } })
  -- NVMe offload: zrun offloads to host memory, which trains the same
  local c = load({ train_batch_size = 8, zero_optimization = { stage = 3, offload_param = { device = "nvme", nvme_path = "/x" } } })
  T.eq(c.zero_optimization.offload_param.device, "cpu")
  contains(table.concat(c:warnings(), "\n"), 'zero_optimization.offload_param.device = "nvme"')
end)

T.test("offload_optimizer.ratio: accepted at stages 1-3; a warning where DeepSpeed would refuse (stage < 3, not Adam)", function()
  local function w(stage, ratio, opt)
    return table.concat(load({ train_batch_size = 8, optimizer = opt, zero_optimization = { stage = stage,
      offload_optimizer = { device = "cpu", ratio = ratio } } }):warnings(), "\n")
  end
  T.eq(w(3, 0.3), "", "stage 3 with AdamW (DeepSpeed's ZeRO-Offload++): no warning")
  T.eq(w(3, 0), "", "ratio 0 at stage 3")
  T.eq(w(2, 1), "", "ratio 1 (the default) at stage 2")
  contains(w(2, 0.3), "zero_optimization.offload_optimizer.ratio = 0.3 at stage 2: DeepSpeed accepts a ratio below 1 " ..
    "only at stage 3 (it refuses this config); zrun runs partial offload at stages 1 and 2 too")
  contains(w(1, 0), "ratio = 0 at stage 1")
  contains(w(3, 0.5, { type = "Lion", params = { lr = 1e-4 } }),
    "ratio = 0.5 with optimizer Lion: DeepSpeed runs partial offload with its CPU Adam only; zrun runs Lion on both parts")
  T.eq(w(3, 0.5, { type = "Adam", params = { lr = 1e-4 } }), "", "Adam")
  T.raises(function() load({ train_batch_size = 8, zero_optimization = { stage = 0,
    offload_optimizer = { device = "cpu", ratio = 0.5 } } }) end, "needs zero_optimization.stage 1, 2 or 3, got 0")
end)

T.test("optimizers zrun does not implement: one plain message, no near-miss suggestion", function()
  for _, ty in ipairs { "OneBitAdam", "onebitadam", "OnebitLamb", "ZeroOneAdam", "RMSprop", "Muon" } do
    local e = T.raises(function() load({ train_batch_size = 8, optimizer = { type = ty } }) end,
      ('optimizer.type "%s": zrun\'s ZeRO engine does not implement'):format(ty))
    assert(not e:find("did you mean"), e)
    T.eq(e, "config: " .. config.unimplemented_optimizer_message(ty))
  end
  T.raises(function() load({ train_batch_size = 8, optimizer = { type = "Adamm" } }) end, 'did you mean "Adam"?')
  -- torch.optim names are exact (getattr(torch.optim, name)); DeepSpeed's own are case-insensitive
  T.raises(function() load({ train_batch_size = 8, optimizer = { type = "sgd" } }) end, 'optimizer.type must be')
end)

T.test("a batch size that holds at another world size says which", function()
  T.raises(function() load({ train_batch_size = 32, train_micro_batch_size_per_gpu = 4, gradient_accumulation_steps = 2 }) end,
    "32 ≠ 4 × 2 × 1 = 8; it holds for a world size of 4 (4 processes, or zrun check --world-size 4)")
  local e = T.raises(function() load({ train_batch_size = 30, train_micro_batch_size_per_gpu = 4, gradient_accumulation_steps = 2 }) end,
    "30 ≠ 4 × 2 × 1 = 8; set train_batch_size to 8, or \"auto\" to derive it")
  assert(not e:find("holds for"), e)
  load({ train_batch_size = 32, train_micro_batch_size_per_gpu = 4, gradient_accumulation_steps = 2 }, { world_size = 4 })
end)

T.done()
