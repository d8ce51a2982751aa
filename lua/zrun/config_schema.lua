-- DeepSpeed's config schema, as zrun reads it: every key DeepSpeed accepts, its default (DeepSpeed's,
-- from its source), its limits, and what zrun does with a feature it does not implement. config.lua
-- walks it; nothing here validates or resolves anything.
local M = {}
local fmt = string.format

-- Schema ------------------------------------------------------------------------------------------
-- Leaves carry a type, DeepSpeed's default, limits, and `auto` when "auto" may stand for a value that
-- is resolved from the training arguments. Sections are either always present (filled with defaults)
-- or `optional` (absent stays nil, as DeepSpeed's None). `opaque` sections are accepted for
-- compatibility and kept as given; zrun does not use them. `variant` sections (optimizer, scheduler)
-- pick their params schema by `type`.
--
-- What DeepSpeed does with keys it does not know depends on how it reads the section: a `strict`
-- section is a pydantic model (extra="forbid": an unknown key is an error; "auto" is dropped, so the
-- field takes its default), any other section is read with dict.get (an unknown key is ignored: a
-- warning here). A leaf's `alias` is the other name pydantic accepts for it (DeepSpeed's field name
-- where zrun keeps the stage3_ alias). `off` is the value under which a feature zrun does not
-- implement changes nothing; another value is an `effect` = "warn" (DeepSpeed would train the same)
-- or "error" (results would differ).

local function leaf(ty, default, opts)
  local o = {} -- a fresh node: option tables such as NONNEG are shared between leaves
  for k, v in pairs(opts or {}) do o[k] = v end
  o.kind, o.type, o.default = "leaf", ty, default
  return o
end
local function int(d, o) return leaf("int", d, o) end
local function num(d, o) return leaf("number", d, o) end
local function bool(d, o) return leaf("bool", d, o) end
local function str(d, o) return leaf("string", d, o) end
local function enum(values, d, o)
  local n = leaf("enum", d, o)
  n.values = values
  return n
end
local function numlist(d, o) return leaf("numlist", d, o) end -- a number, or one per param group
local function list(d, o) return leaf("list", d, o) end       -- a list of numbers
local function opaque(o) o = o or {}; o.kind = "opaque"; return o end
local function section(entries, o)
  o = o or {}
  o.kind, o.keys, o.map, o.aliases = "section", {}, {}, {}
  for _, e in ipairs(entries) do
    local name, child = e[1], e[2]
    o.keys[#o.keys + 1] = name
    o.map[name] = child
    if child.alias then o.aliases[child.alias] = name end
    if o.strict and child.kind == "leaf" then child.drop_auto = true end
  end
  return o
end
-- Marks a feature zrun does not implement: `off` is the value that leaves training unchanged.
local function warn_unless(off, node) node.off, node.effect = off, "warn"; return node end
local function refuse_unless(off, node, hint) node.off, node.effect, node.hint = off, "error", hint; return node end
local function variant(types, o)
  o = o or {}
  o.kind, o.types, o.names = "variant", {}, {}
  for _, e in ipairs(types) do
    o.types[e[1]] = e[2]
    o.names[#o.names + 1] = e[1]
  end
  return o
end

local POS = { min = 1 }
local NONNEG = { min = 0 }

-- Optimizer params, per type. Defaults are those of DeepSpeed's optimizer constructors (FusedAdam),
-- not torch's: weight_decay 0, and "Adam" is AdamW-style (adam_w_mode true). DeepSpeed passes params
-- to the constructor as keyword arguments, so an unknown one is an error (a TypeError there).
local function adam_params(adamw)
  return section {
    { "lr", num(1e-3, { min = 0, auto = true }) },
    { "betas", list({ 0.9, 0.999 }, { len = 2, auto = true }) },
    { "eps", num(1e-8, { min = 0, auto = true }) },
    -- with torch_adam DeepSpeed builds torch.optim.AdamW ("Adam" too: adam_w_mode), whose default is 0.01
    { "weight_decay", num(function(v) return v.optimizer.params.torch_adam == true and 0.01 or 0.0 end,
      { min = 0, auto = true }) },
    { "bias_correction", refuse_unless(true, bool(true)) },
    -- "AdamW" is decoupled whatever adam_w_mode says; "Adam" with false is L2-regularised Adam
    { "adam_w_mode", adamw and bool(true) or refuse_unless(true, bool(true)) },
    { "torch_adam", bool(false) }, -- (torch's AdamW and FusedAdam take the same step; zrun's is FusedAdam's)
    { "amsgrad", refuse_unless(false, bool(false)) },
    -- FusedAdam's: gradients set to None instead of zeroed; zrun's engine clears them either way (said when false)
    { "set_grad_none", warn_unless(true, bool(true)) },
    -- DeepSpeedCPUAdam's (offload_optimizer): false keeps the moments in the parameters' dtype
    { "fp32_optimizer_states", refuse_unless(true, bool(true), "bf16.bf16_optimizer_states keeps AdamW's moments in bf16") },
  }
end
local OPTIMIZER = variant({
  { "Adam", adam_params(false) },
  { "AdamW", adam_params(true) },
  -- DeepSpeed's FusedLion (DeepSpeedCPULion under offload_optimizer takes the same values)
  { "Lion", section {
    { "lr", num(1e-3, { min = 0, auto = true }) },
    { "betas", list({ 0.9, 0.999 }, { len = 2, auto = true }) },
    { "weight_decay", num(0.0, { min = 0, auto = true }) },
    { "set_grad_none", warn_unless(true, bool(true)) },
  } },
  -- torch.optim.Adagrad, which DeepSpeed builds for "Adagrad" (weight_decay is L2: added to the gradient)
  { "Adagrad", section {
    { "lr", num(1e-2, { min = 0, auto = true }) },
    { "lr_decay", num(0.0, NONNEG) },
    { "weight_decay", num(0.0, { min = 0, auto = true }) },
    { "initial_accumulator_value", num(0.0, NONNEG) },
    { "eps", num(1e-10, NONNEG) },
    { "foreach", bool(nil, { nullable = true }) },
    { "maximize", refuse_unless(false, bool(false)) },
    { "differentiable", bool(false) },
    { "fused", bool(nil, { nullable = true }) },
  } },
  -- DeepSpeed's FusedLamb (deepspeed/ops/lamb/fused_lamb.py), its constructor's arguments but
  -- max_grad_norm, which deepspeed.initialize refuses for every optimizer (config.lua says so)
  { "Lamb", section {
    { "lr", num(1e-3, { min = 0, auto = true }) },
    { "bias_correction", bool(true) },
    { "betas", list({ 0.9, 0.999 }, { len = 2, auto = true }) },
    { "eps", num(1e-8, { min = 0, auto = true }) },
    { "eps_inside_sqrt", bool(false) },
    { "weight_decay", num(0.0, { min = 0, auto = true }) },
    { "max_coeff", num(10.0, NONNEG) },
    { "min_coeff", num(0.01, NONNEG) },
    { "amsgrad", refuse_unless(false, bool(false)) },
  } },
  -- torch.optim.SGD (exact name, as DeepSpeed looks it up in torch.optim); weight_decay is L2
  { "SGD", section {
    { "lr", num(1e-3, { min = 0, auto = true }) },
    { "momentum", num(0.0, NONNEG) },
    { "dampening", num(0.0) },
    { "weight_decay", num(0.0, { min = 0, auto = true }) },
    { "nesterov", bool(false) },
    { "maximize", refuse_unless(false, bool(false)) },
    { "foreach", bool(nil, { nullable = true }) },
    { "differentiable", bool(false) },
    { "fused", bool(nil, { nullable = true }) },
  } },
}, { ci = true, exact = { SGD = true }, extra = section { { "legacy_fusion", bool(false) } } })

-- Optimizers DeepSpeed builds (its own, matched case-insensitively, and torch.optim's by exact
-- name) that zrun's ZeRO engine does not implement: refused by `zrun check` and zr.initialize alike.
local DS_OPTIMIZERS = { "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "MuAdam", "MuAdamW", "MuSGD", "Muon" }
local TORCH_OPTIMIZERS = { "Adadelta", "Adamax", "ASGD", "LBFGS", "NAdam", "RAdam", "RMSprop", "Rprop", "SparseAdam",
  "Adafactor" }

-- The canonical name of an optimizer DeepSpeed knows and zrun does not implement, or nil.
local function unimplemented_optimizer(ty)
  if type(ty) ~= "string" then return nil end
  for _, n in ipairs(DS_OPTIMIZERS) do if n:lower() == ty:lower() then return n end end
  for _, n in ipairs(TORCH_OPTIMIZERS) do if n == ty then return n end end
  return nil
end

-- The one message for an optimizer zrun does not implement (zrun check and zr.initialize).
function M.unimplemented_optimizer_message(ty)
  return fmt('optimizer.type "%s": zrun\'s ZeRO engine does not implement %s yet; use "AdamW" (or "Adam", which ' ..
    "DeepSpeed runs as AdamW), \"Lion\", \"Adagrad\", \"SGD\" or \"Lamb\"", ty, unimplemented_optimizer(ty) or ty)
end

-- Scheduler params, per type: the constructor arguments of deepspeed/runtime/lr_schedules.py.
local WARMUP_TYPE = enum({ "log", "linear" }, "log")
local LAST = int(-1, { min = -1 })
local SCHEDULER = variant({
  { "WarmupLR", section {
    { "warmup_min_lr", numlist(0.0, { auto = true }) },
    -- left out: each param group's own lr (WarmupLR's None); WarmupDecayLR's default is 0.001
    { "warmup_max_lr", numlist(nil, { auto = true, nullable = true }) },
    { "warmup_num_steps", int(1000, { min = 0, auto = true }) },
    { "warmup_type", WARMUP_TYPE },
    { "last_batch_iteration", LAST },
  } },
  { "WarmupDecayLR", section {
    { "total_num_steps", int(nil, { min = 1, auto = true, required = true }) },
    { "warmup_min_lr", numlist(0.0, { auto = true }) },
    { "warmup_max_lr", numlist(0.001, { auto = true }) },
    { "warmup_num_steps", int(1000, { min = 0, auto = true }) },
    { "warmup_type", WARMUP_TYPE },
    { "last_batch_iteration", LAST },
  } },
  { "WarmupCosineLR", section {
    { "total_num_steps", int(nil, { min = 1, auto = true, required = true }) },
    { "warmup_min_ratio", num(0.0, { min = 0, max = 1 }) },
    { "warmup_num_steps", int(1000, { min = 0, auto = true }) },
    { "cos_min_ratio", num(0.0001, { min = 0, max = 1 }) },
    { "warmup_type", WARMUP_TYPE },
    { "last_batch_iteration", LAST },
  } },
  { "OneCycle", section {
    { "cycle_min_lr", numlist(nil, { min = 0, required = true }) },
    { "cycle_max_lr", numlist(nil, { min = 0, required = true }) },
    { "decay_lr_rate", num(0.0, NONNEG) },
    { "cycle_first_step_size", int(2000, POS) },
    { "cycle_second_step_size", int(nil, { min = 1, nullable = true }) },
    { "cycle_first_stair_count", int(0, NONNEG) },
    { "cycle_second_stair_count", int(nil, { min = 0, nullable = true }) },
    { "decay_step_size", int(0, NONNEG) },
    { "cycle_momentum", bool(true) },
    { "cycle_min_mom", numlist(0.8, NONNEG) },
    { "cycle_max_mom", numlist(0.9, NONNEG) },
    { "decay_mom_rate", num(0.0, NONNEG) },
    { "last_batch_iteration", LAST },
  } },
  { "LRRangeTest", section {
    { "lr_range_test_min_lr", numlist(1e-3) },
    { "lr_range_test_step_size", int(2000, POS) },
    { "lr_range_test_step_rate", num(1.0) },
    { "lr_range_test_staircase", bool(false) },
    { "last_batch_iteration", LAST },
  } },
})

-- Offload devices: "none" is DeepSpeed's default inside a present section. "nvme" is resolved to
-- "cpu" with a warning (cross_checks): zrun offloads to host memory only.
local DEVICE = enum({ "none", "cpu", "nvme" }, "none")
local OFFLOAD_PARAM = section({
  { "device", DEVICE },
  { "nvme_path", str(nil, { nullable = true }) },
  { "pin_memory", bool(true) },
  { "buffer_count", int(5, NONNEG) },
  { "buffer_size", int(1e8, NONNEG) },
  { "max_in_cpu", int(1e9, NONNEG) },
}, { optional = true, strict = true })
local OFFLOAD_OPTIMIZER = section({
  { "device", DEVICE },
  { "nvme_path", str(nil, { nullable = true }) },
  { "pin_memory", bool(true) },
  { "buffer_count", int(4, NONNEG) },
  { "pipeline_read", bool(false) },
  { "pipeline_write", bool(false) },
  { "fast_init", bool(false) },
  { "ratio", num(1.0, { min = 0, max = 1 }) },
  { "super_offload", warn_unless(false, bool(false)) },
  { "cpuadam_cores_perc", warn_unless(0.8, num(0.8, { min = 0, max = 1 })) },
}, { optional = true, strict = true })

-- ZenFlow (zero_optimization.zenflow): the top-k gradient columns updated every micro-step, the rest
-- by the offloaded optimizer every update_interval (lua/zrun/zenflow.lua checks the values).
local ZENFLOW = section({
  { "topk_ratio", num(0.1, { min = 0, max = 1 }) },
  { "select_strategy", enum({ "auto", "step", "epoch" }, "auto") },
  { "select_interval", leaf("any", "auto") },
  { "update_interval", leaf("any", "auto") },
  { "overlap_step", bool(false) },
  { "offload", bool(false) },
  { "auto_ratio", num(0.99, { min = 0, max = 1 }) },
  { "full_warm_up_rounds", int(0) },
  { "pt_reserved_cores_perc", num(0.5, { min = 0, max = 1 }) },
  { "steps_per_epoch", int(nil, { nullable = true }) },
}, { optional = true, strict = true })

-- DeepSpeed's field names (max_live_parameters, ...) and their stage3_ aliases are both accepted;
-- the resolved config keeps the stage3_ spelling, which the rest of zrun reads.
local ZERO = section({
  { "stage", int(0, { values = { 0, 1, 2, 3 } }) },
  -- DeepSpeed's implementation choices that zrun makes its own way (the results are the same): a value
  -- other than the default is warned about as having no effect here
  { "allgather_partitions", warn_unless(true, bool(true)) },
  { "allgather_bucket_size", int(5e8, NONNEG) },
  -- DeepSpeed's default depends on the stage: on for stage 3, off below.
  { "overlap_comm", bool(function(v) return v.zero_optimization.stage == 3 end) },
  { "reduce_scatter", warn_unless(true, bool(true)) },
  { "reduce_bucket_size", int(5e8, { min = 0, auto = true }) },
  { "contiguous_gradients", warn_unless(true, bool(true)) },
  { "use_multi_rank_bucket_allreduce", warn_unless(true, bool(true)) },
  -- false: DeepSpeed skips the norm when nothing reads it (gradient_clipping 0); zrun always takes it
  { "compute_grad_norm", warn_unless(true, bool(true)) },
  { "parameter_alignment", warn_unless(false, bool(false)) }, -- padding between parameters in the flat buffers
  -- false: DeepSpeed rebuilds the fp32 master weights from the 16-bit ones on load (a resumed run then
  -- differs from the uninterrupted one); zrun always loads the saved fp32 masters
  { "load_from_fp32_weights", refuse_unless(true, bool(true)) },
  { "elastic_checkpoint", warn_unless(false, bool(false)) }, -- zrun's checkpoints load at any world size
  { "offload_param", OFFLOAD_PARAM },
  { "offload_optimizer", OFFLOAD_OPTIMIZER },
  { "zenflow", ZENFLOW },
  { "sub_group_size", warn_unless(1e9, int(1e9, NONNEG)) }, -- zrun steps offloaded states in ZRUN_OFFLOAD_CHUNK chunks
  -- DeepSpeed's code default (5e7); its documentation table says 5e8.
  { "stage3_prefetch_bucket_size", int(5e7, { min = 0, auto = true, alias = "prefetch_bucket_size" }) },
  { "stage3_param_persistence_threshold", int(1e5, { min = 0, auto = true, alias = "param_persistence_threshold" }) },
  { "stage3_model_persistence_threshold", -- sys.maxsize
    warn_unless(2 ^ 63, int(2 ^ 63, { min = 0, alias = "model_persistence_threshold" })) },
  { "stage3_max_live_parameters", int(1e9, { min = 0, alias = "max_live_parameters" }) },
  { "stage3_max_reuse_distance", int(1e9, { min = 0, alias = "max_reuse_distance" }) },
  { "stage3_gather_16bit_weights_on_model_save", bool(false, { alias = "gather_16bit_weights_on_model_save" }) },
  { "stage3_module_granularity_threshold", warn_unless(0, int(0, { alias = "module_granularity_threshold" })) },
  { "stage3_use_all_reduce_for_fetch_params", warn_unless(false, bool(false, { alias = "use_all_reduce_for_fetch_params" })) },
  { "stage3_allgather_sequential", warn_unless(false, bool(false, { alias = "allgather_sequential" })) },
  -- false: DeepSpeed stops when a parameter got no gradient; zrun trains on (its gradient stays 0)
  { "ignore_unused_parameters", warn_unless(true, bool(true)) },
  { "legacy_stage1", bool(false) },
  { "round_robin_gradients", warn_unless(false, bool(false)) },
  { "zero_hpz_partition_size", warn_unless(1, int(1, NONNEG)) },
  { "zero_quantized_weights", refuse_unless(false, bool(false)) },
  { "zero_quantized_nontrainable_weights", refuse_unless(false, bool(false)) },
  { "zero_quantized_gradients", refuse_unless(false, bool(false)) },
  { "mics_shard_size", warn_unless(-1, int(-1, { min = -1 })) },
  { "mics_hierarchical_params_gather", bool(false) },
  { "memory_efficient_linear", warn_unless(true, bool(true)) },
  { "pipeline_loading_checkpoint", bool(false) },
  { "override_module_apply", warn_unless(true, bool(true)) },
  { "log_trace_cache_warnings", warn_unless(false, bool(false)) },
  { "enable_sanity_checks", warn_unless(false, bool(false)) },
  { "save_muon_momentum_buffer_in_memory", bool(false) },
  { "zeropp_loco_param", opaque() },
  { "leaf_module", opaque() },
  -- Deprecated spellings, translated after validation (with a warning).
  { "cpu_offload", bool(nil, { nullable = true, deprecated = "offload_optimizer" }) },
  { "cpu_offload_param", bool(nil, { nullable = true, deprecated = "offload_param" }) },
  { "cpu_offload_use_pin_memory", bool(nil, { nullable = true, deprecated = "pin_memory" }) },
  { "stage3_gather_fp16_weights_on_model_save", bool(nil, { nullable = true,
    deprecated = "stage3_gather_16bit_weights_on_model_save" }) },
}, { strict = true })

-- The monitors (zrun.monitor writes TensorBoard event files and DeepSpeed's CSV files).
local MONITOR = function(job)
  return section({
    { "enabled", bool(false) },
    { "output_path", str("") },
    { "job_name", str(job) },
  }, { strict = true })
end

-- A section zrun does not implement changes something when present and not disabled; `active`
-- says when (default: enabled is not false).
local function feature(effect, active) return opaque { effect = effect, active = active } end
local function when_true(key) return function(v) return type(v) == "table" and v[key] == true end end

-- torch_autocast.dtype: DeepSpeed's DtypeEnum spellings.
local DTYPES = { "torch.bfloat16", "bf16", "bfloat16", "torch.float16", "fp16", "float16", "half",
  "torch.float32", "fp32", "float32", "float", "torch.int8", "int8" }

local SCHEMA = section {
  { "train_batch_size", int(nil, { min = 1, auto = true, nullable = true }) },
  { "train_micro_batch_size_per_gpu", int(nil, { min = 1, auto = true, nullable = true }) },
  { "gradient_accumulation_steps", int(nil, { min = 1, auto = true, nullable = true }) },
  -- DeepSpeed clips at 1.0 unless told otherwise (its default since PR #8068, in 0.19.8); 0: no clipping
  { "gradient_clipping", num(1.0, { min = 0, auto = true }) },
  { "steps_per_print", int(nil, { min = 1, nullable = true }) }, -- left out: no step lines (DeepSpeed 0.19.8: None)
  { "wall_clock_breakdown", bool(false) },
  { "memory_breakdown", warn_unless(false, bool(false)) },
  { "dump_state", warn_unless(false, bool(false)) },
  { "disable_python_gc", warn_unless(false, bool(false)) }, -- Python's cyclic garbage collector, off during training
  { "prescale_gradients", warn_unless(false, bool(false)) },
  { "gradient_predivide_factor", warn_unless(1, num(1.0, { min = 0, open_min = true })) },
  { "gradient_allreduce_op", refuse_unless("mean", enum({ "mean", "sum" }, "mean")) },
  { "sparse_gradients", warn_unless(false, bool(false)) },
  { "fp32_allreduce", warn_unless(false, bool(false)) },
  { "communication_data_type", enum({ "fp16", "bf16", "fp32" }, nil, { nullable = true }) },
  { "seq_parallel_communication_data_type", enum({ "fp16", "bf16", "fp32" }, "fp32") },
  { "disable_allgather", warn_unless(false, bool(false)) },
  { "zero_allow_untested_optimizer", bool(false) },
  { "zero_force_ds_cpu_optimizer", bool(true) },
  { "dataloader_drop_last", bool(false) },
  -- false (DeepSpeed 0.19): every engine.step() ends an accumulation window, however many backward() came before
  { "managed_gradient_accumulation", refuse_unless(true, bool(true), "zrun's engine ends a window every " ..
    "gradient_accumulation_steps micro-batches, or where engine:set_gradient_accumulation_boundary(true) says") },
  { "graph_harvesting", warn_unless(false, bool(false)) },
  { "use_data_before_expert_parallelism", bool(false) },
  { "vocabulary_size", int(nil, { nullable = true }) },
  { "log_level", leaf("any", nil, { nullable = true }) },
  { "fp16", section({
    { "enabled", bool(false, { auto = true }) },
    { "auto_cast", warn_unless(false, bool(false)) },
    { "loss_scale", num(0.0, NONNEG) }, -- 0: dynamic loss scaling
    { "initial_scale_power", int(16, NONNEG) },
    { "loss_scale_window", int(1000, POS) },
    { "hysteresis", int(2, POS) },
    { "consecutive_hysteresis", refuse_unless(false, bool(false)) },
    { "min_loss_scale", int(1, POS) }, -- an int in DeepSpeed (0.5 is refused there too)
    { "fp16_master_weights_and_grads", refuse_unless(false, bool(false)) },
  }, { strict = true }) },
  { "bf16", section({
    { "enabled", bool(false, { auto = true }) },
    { "immediate_grad_update", warn_unless(false, bool(false)) },
    -- DeepSpeed skips a step whose gradients overflow; zrun stops with an error instead (false: warned)
    { "check_grad_overflow", warn_unless(true, bool(true)) },
    -- the ZeRO master partition (and its gradients) / AdamW's moments in bf16 (config_check.lua's
    -- bf16_lp_checks: which combinations DeepSpeed and zrun run)
    { "bf16_master_weights_and_grads", bool(false) },
    { "bf16_optimizer_states", bool(false) },
  }, { strict = true }) },
  { "amp", section({ { "enabled", bool(false) }, { "opt_level", str("O1") } }, { open = true }) },
  { "torch_autocast", section {
    { "enabled", bool(false) },
    { "dtype", enum(DTYPES, "torch.bfloat16") },
    { "lower_precision_safe_modules", opaque() },
  } },
  { "optimizer", OPTIMIZER },
  { "scheduler", SCHEDULER },
  { "zero_optimization", ZERO },
  -- DeepSpeed's activation checkpointing applies to models that call deepspeed.checkpointing;
  -- zrun models use zr.checkpoint, so these only matter when changed (warning).
  { "activation_checkpointing", section {
    { "partition_activations", warn_unless(false, bool(false)) },
    { "cpu_checkpointing", warn_unless(false, bool(false)) },
    { "contiguous_memory_optimization", warn_unless(false, bool(false)) },
    { "number_checkpoints", warn_unless(nil, int(nil, { min = 1, nullable = true })) },
    { "synchronize_checkpoint_boundary", warn_unless(false, bool(false)) },
    { "profile", warn_unless(false, bool(false)) },
  } },
  { "flops_profiler", section {
    { "enabled", warn_unless(false, bool(false)) },
    { "recompute_fwd_factor", num(0.0, NONNEG) },
    { "profile_step", int(1, POS) },
    { "module_depth", int(-1, { min = -1 }) },
    { "top_modules", int(1, POS) },
    { "detailed", bool(true) },
    { "output_file", str(nil, { nullable = true }) },
  } },
  { "tensorboard", MONITOR("DeepSpeedJobName") },
  { "csv_monitor", MONITOR("DeepSpeedJobName") },
  { "wandb", section({
    { "enabled", bool(false) },
    { "group", str(nil, { nullable = true }) },
    { "team", str(nil, { nullable = true }) },
    { "project", str("deepspeed") },
  }, { strict = true }) },
  { "comet", section({
    { "enabled", bool(false) },
    { "samples_log_interval", int(100) },
    { "project", str(nil, { nullable = true }) },
    { "workspace", str(nil, { nullable = true }) },
    { "api_key", str(nil, { nullable = true }) },
    { "experiment_name", str(nil, { nullable = true }) },
    { "experiment_key", str(nil, { nullable = true }) },
    { "online", bool(nil, { nullable = true }) },
    { "mode", str(nil, { nullable = true }) },
  }, { strict = true }) },
  { "comms_logger", section({
    { "enabled", warn_unless(false, bool(false)) },
    { "verbose", bool(false) },
    { "prof_all", bool(true) },
    { "debug", bool(false) },
    { "prof_ops", opaque() },
  }, { strict = true }) },
  { "checkpoint", section {
    { "tag_validation", warn_unless("Warn", enum({ "Ignore", "Warn", "Fail" }, "Warn", { ci = true })) },
    { "load_universal", warn_unless(false, bool(false)) },
    { "use_node_local_storage", warn_unless(false, bool(false)) },
    { "parallel_write", opaque() },
    -- (DeepSpeed's torch.save format and its FastPersist checkpoint writer: the same checkpoint contents)
    { "checkpoint_serialization", warn_unless(true, bool(true)) },
    { "writer", feature("warn", function(v) return type(v) == "table" end) },
  } },
  { "data_types", section {
    { "grad_accum_dtype", enum({ "fp32", "fp16", "bf16" }, nil, { nullable = true }) },
    -- must name the training precision, as DeepSpeed asserts (config_check.lua)
    { "param_dtype", enum({ "fp32", "fp16", "bf16" }, nil, { nullable = true }) },
    -- unset: under fp16 / bf16 floating buffers keep their dtype (DeepSpeed casts the parameters only);
    -- set: they are cast to it (engine.cast_module)
    { "buffer_dtype", enum({ "fp32", "fp16", "bf16" }, nil, { nullable = true }) },
    -- buffers kept (or made) fp32 under fp16 / bf16: "auto" (the modules' _keep_in_fp32_modules_strict, and
    -- under fp16 _keep_in_fp32_modules, lists) or name patterns with * (engine.cast_module)
    { "keep_in_fp32_modules", leaf("names", "auto") },
  } },
  -- DeepSpeed's CompileConfig (pydantic; since DeepCompile it has no "backend" or "disable"): only
  -- deepcompile changes anything, and not the results.
  { "compile", section({
    { "deepcompile", warn_unless(false, bool(false)) }, { "autoep_non_moe", bool(false) },
    { "free_activation", bool(false) }, { "free_activation_threshold", int(10 * 1024 * 1024) },
    { "offload_activation", bool(false) }, { "offload_activation_pin_memory", bool(true) },
    { "offload_opt_states", bool(false) }, { "double_buffer", bool(true) }, { "symmetric_memory", bool(false) },
    { "debug_log", bool(false) }, { "offload_parameters", bool(false) }, { "sync_before_reduce", bool(false) },
    { "sync_after_reduce", bool(false) }, { "sync_before_allgather", bool(false) },
    { "sync_after_allgather", bool(false) }, { "keep_int_input_tensors", bool(true) },
    { "keep_all_input_tensors", bool(false) }, { "passes", leaf("any", nil, { nullable = true }) },
  }, { strict = true }) },
  { "aio", section {
    { "block_size", int(1048576, POS) },
    { "queue_depth", int(8, POS) },
    { "thread_count", int(1, POS) },
    { "single_submit", bool(false) },
    { "overlap_events", bool(true) },
  } },
  -- Accepted so that existing DeepSpeed files load; zrun does not implement these features. Present
  -- and active, one that would change the results is refused, any other warned about.
  { "autotuning", feature("warn") }, { "elasticity", feature("error") },
  { "compression_training", feature("error", function() return true end) },
  { "data_efficiency", feature("error") }, { "curriculum_learning", feature("error") },
  { "pipeline", feature("warn") }, { "sparse_attention", feature("error", function() return true end) },
  { "hybrid_engine", feature("warn") },
  { "tensor_parallel", feature("error", function(v) return type(v) == "table" and (tonumber(v.autotp_size) or 1) > 1 end) },
  { "expert_parallel", feature("error", when_true("enabled")) }, { "nebula", feature("warn") },
  { "eigenvalue", feature("warn") },
  -- DataStates-LLM asynchronous checkpointing (any value but false turns it on): the same checkpoints, written later
  { "datastates_ckpt", feature("warn", function(v) return v ~= false end) },
  { "progressive_layer_drop", feature("error") },
  -- (DeepSpeed reads quantize_training and eigenvalue only for compression_training's weight
  -- quantization, which is refused above: alone they change nothing)
  { "quantize_training", feature("warn", function() return true end) },
  { "weight_quantization", feature("error", function() return true end) },
  -- timers.throughput: DeepSpeed's samples/s line every steps_per_print (zrun's progress line shows tok/s)
  { "timers", feature("warn", function(v)
    return type(v) == "table" and type(v.throughput) == "table" and v.throughput.enabled == true
  end) },
}

M.SCHEMA, M.OPTIMIZER, M.OFFLOAD_PARAM, M.OFFLOAD_OPTIMIZER = SCHEMA, OPTIMIZER, OFFLOAD_PARAM, OFFLOAD_OPTIMIZER
M.unimplemented_optimizer = unimplemented_optimizer
return M
