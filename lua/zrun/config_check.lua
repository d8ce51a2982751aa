-- DeepSpeed's checks across keys of a config (config.lua runs them once every key passed its own
-- check): the batch-size rule, which derives what is missing, and the rules that read several sections.
-- Errors and warnings go to the check's lists (ctx.errors, ctx.warnings).
local U = require "zrun.config_util"
local S = require "zrun.config_schema"
local M = {}
local floor = math.floor
local fmt = string.format
local type, ipairs, tostring = type, ipairs, tostring
local fmtnum, show, add_error, add_warning = U.fmtnum, U.show, U.add_error, U.add_warning
local OFFLOAD_PARAM, OFFLOAD_OPTIMIZER = S.OFFLOAD_PARAM, S.OFFLOAD_OPTIMIZER

-- DeepSpeed's batch rule, train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps
-- × world size: checked when all three are given, else the missing ones derived (meta.src: "derived").
local function batch_rule(vals, ctx, meta)
  local tb, mb, ga, ws = vals.train_batch_size, vals.train_micro_batch_size_per_gpu, vals.gradient_accumulation_steps,
    ctx.world_size
  for _, v in ipairs { tb, mb, ga } do if v ~= nil and type(v) ~= "number" then return end end
  local function derive(key, v, note)
    vals[key] = v
    meta.src[key] = { kind = "derived", note = note }
  end
  local function divides(total, by, what, key)
    if total % by ~= 0 then
      add_error(ctx, "train_batch_size %d is not divisible by %s = %d, so %s cannot be derived; " ..
        "set it explicitly or change train_batch_size", total, what, by, key)
      return false
    end
    return true
  end
  if tb and mb and ga then
    if tb ~= mb * ga * ws then
      -- the usual cause: the file was written for another number of GPUs
      local n = tb / (mb * ga)
      local hint = (n >= 1 and n == floor(n)) and fmt("; it holds for a world size of %d (%d processes, or " ..
        "zrun check --world-size %d)", n, n, n) or fmt('; set train_batch_size to %d, or "auto" to derive it', mb * ga * ws)
      add_error(ctx, "train_batch_size must equal train_micro_batch_size_per_gpu × gradient_accumulation_steps × " ..
        "world size: %d ≠ %d × %d × %d = %d%s", tb, mb, ga, ws, mb * ga * ws, hint)
    end
  elseif tb and mb then
    if divides(tb, mb * ws, fmt("train_micro_batch_size_per_gpu × world size (%d × %d)", mb, ws), "gradient_accumulation_steps") then
      derive("gradient_accumulation_steps", tb / (mb * ws), fmt("train_batch_size %d / (micro %d × world %d)", tb, mb, ws))
    end
  elseif tb and ga then
    if divides(tb, ga * ws, fmt("gradient_accumulation_steps × world size (%d × %d)", ga, ws), "train_micro_batch_size_per_gpu") then
      derive("train_micro_batch_size_per_gpu", tb / (ga * ws), fmt("train_batch_size %d / (accumulation %d × world %d)", tb, ga, ws))
    end
  elseif mb and ga then
    derive("train_batch_size", mb * ga * ws, fmt("micro %d × accumulation %d × world %d", mb, ga, ws))
  elseif tb then
    derive("gradient_accumulation_steps", 1, "1: only train_batch_size was given")
    if divides(tb, ws, fmt("the world size (%d)", ws), "train_micro_batch_size_per_gpu") then
      derive("train_micro_batch_size_per_gpu", tb / ws, fmt("train_batch_size %d / world %d", tb, ws))
    end
  elseif mb then
    derive("gradient_accumulation_steps", 1, "1: only train_micro_batch_size_per_gpu was given")
    derive("train_batch_size", mb * ws, fmt("micro %d × world %d", mb, ws))
  else
    add_error(ctx, 'set train_batch_size or train_micro_batch_size_per_gpu (a number, or "auto" to take it ' ..
      "from the training arguments); DeepSpeed derives the rest from train_batch_size = " ..
      "train_micro_batch_size_per_gpu × gradient_accumulation_steps × world size")
  end
end

-- DeepSpeed's rules for Lamb (runtime/engine.py): dynamic loss scaling (fp16.loss_scale 0), and
-- under ZeRO (stage >= 1) FusedLamb is not in ZERO_SUPPORTED_OPTIMIZERS, so it needs
-- zero_allow_untested_optimizer. zrun runs it at every stage with one trust ratio per parameter
-- tensor (the stage 0 result); DeepSpeed's ZeRO hands FusedLamb each rank's flat partition instead.
local function lamb_checks(vals, ctx)
  local opt, stage = vals.optimizer, vals.zero_optimization.stage
  if not (opt and opt.type == "Lamb") then return end
  local ls = vals.fp16 and vals.fp16.loss_scale
  if type(ls) == "number" and ls ~= 0 then
    add_error(ctx, 'optimizer.type "Lamb" requires dynamic loss scaling, as DeepSpeed asserts: fp16.loss_scale ' ..
      "must be 0, got %s", fmtnum(ls))
  end
  if type(stage) ~= "number" or stage < 1 then return end
  if vals.zero_allow_untested_optimizer ~= true then
    add_error(ctx, 'optimizer.type "Lamb" at zero_optimization.stage %d: DeepSpeed stops here ("You are using an ' ..
      'untested ZeRO Optimizer"); add "zero_allow_untested_optimizer": true to run it', stage)
  else
    add_warning(ctx, 'optimizer.type "Lamb" at zero_optimization.stage %d: zrun computes each trust ratio over ' ..
      "the whole parameter tensor, as at stage 0; DeepSpeed's ZeRO would compute one per rank's flat partition, " ..
      "so its results differ from zrun's", stage)
  end
end

-- DeepSpeed runs an optimizer type it does not define (SGD) as torch.optim's, and under ZeRO (stage >= 1)
-- torch.optim.SGD is not in ZERO_SUPPORTED_OPTIMIZERS (zero/utils.py), so DeepSpeed stops unless
-- zero_allow_untested_optimizer (HF's Trainer sets it for its own optimizers). zrun's ZeRO runs SGD at
-- every stage with the stage 0 result: it says so instead of stopping.
local function sgd_checks(vals, ctx)
  local opt, stage = vals.optimizer, vals.zero_optimization.stage
  if not (opt and opt.type == "SGD") or type(stage) ~= "number" or stage < 1 then return end
  if vals.zero_allow_untested_optimizer ~= true then
    add_warning(ctx, 'optimizer.type "SGD" at zero_optimization.stage %d: DeepSpeed stops here ("You are using an ' ..
      'untested ZeRO Optimizer") unless "zero_allow_untested_optimizer": true; zrun runs it (the same updates as ' ..
      "at stage 0)", stage)
  end
end

-- DeepSpeed's bf16.bf16_master_weights_and_grads and bf16_optimizer_states (runtime/config.py,
-- base_optimizer.py _configure_master_weights, stage_1_and_2.py at edaa72212): what DeepSpeed asserts
-- against, and what zrun's engine does not run (it rounds AdamW's states once per step, as FusedAdam
-- and DeepSpeedCPUAdam do; other optimizers and torch_adam round after every torch op).
local function bf16_lp_checks(vals, ctx, stage)
  local b = vals.bf16
  local master, states = b.bf16_master_weights_and_grads == true, b.bf16_optimizer_states == true
  if not (master or states) then return end
  local zo, opt = vals.zero_optimization, vals.optimizer
  local oo = zo.offload_optimizer
  local offload = oo and oo.device ~= "none"
  local keys = master and states and "bf16.bf16_master_weights_and_grads and bf16_optimizer_states" or
    master and "bf16.bf16_master_weights_and_grads" or "bf16.bf16_optimizer_states"
  if states and not master then
    add_error(ctx, "bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads: true (as DeepSpeed asserts); " ..
      "add it, or remove bf16_optimizer_states")
  end
  if stage == 0 then
    add_error(ctx, "%s need zero_optimization.stage 1, 2 or 3 (as DeepSpeed asserts), got 0", keys)
  end
  if b.enabled ~= true and b.enabled ~= "auto" then
    add_error(ctx, "%s keep the ZeRO master in bf16: set bf16.enabled to true", keys)
  end
  if master and not states and not offload then
    add_error(ctx, "bf16.bf16_master_weights_and_grads without bf16_optimizer_states keeps Adam's states in fp32, " ..
      "which DeepSpeed runs only with zero_optimization.offload_optimizer {\"device\": \"cpu\"}: add it, or set " ..
      "bf16.bf16_optimizer_states to true")
  end
  if opt and opt.type ~= "Adam" and opt.type ~= "AdamW" then
    add_error(ctx, "%s with optimizer %s: zrun runs them with AdamW only (DeepSpeed's FusedAdam and " ..
      "DeepSpeedCPUAdam); set optimizer.type to AdamW", keys, tostring(opt.type))
  elseif opt and opt.params and opt.params.torch_adam == true then
    add_error(ctx, "%s with optimizer.params.torch_adam: torch's AdamW rounds the bf16 states after every op, zrun's " ..
      "once per step (as FusedAdam): remove torch_adam", keys)
  end
  if offload and oo.ratio ~= 1 then
    add_error(ctx, "%s with zero_optimization.offload_optimizer.ratio = %s: zrun keeps a bf16 master on one side " ..
      "only; set ratio to 1", keys, fmtnum(oo.ratio))
  end
  if zo.zenflow then
    add_error(ctx, "%s with zero_optimization.zenflow: DeepSpeed asserts DeepSpeedCPUAdam for bf16 master weights " ..
      "and ZenFlow brings its own CPU Adam; remove one of them", keys)
  end
  local gad = vals.data_types.grad_accum_dtype
  if master and gad ~= nil and gad ~= "bf16" then
    add_error(ctx, "bf16.bf16_master_weights_and_grads keeps the gradients in bf16, but data_types.grad_accum_dtype " ..
      "is %s: remove grad_accum_dtype (or set it to \"bf16\")", show(gad))
  end
end

-- fp16 without ZeRO: DeepSpeed 0.19.8 runs FP16_Optimizer (FP16_UnfusedOptimizer for optimizers other
-- than FusedAdam), whose dynamic scaler has no hysteresis (fp16/fused_optimizer.py _update_scale): a
-- hysteresis given in the file is said to be unused there, not dropped in silence.
local function fp16_stage0_checks(vals, ctx)
  local f = vals.fp16
  if not (f and f.enabled == true and vals.zero_optimization.stage == 0) then return end
  local src = ctx.src["fp16.hysteresis"]
  if src and src.kind ~= "default" and f.hysteresis ~= 1 and (f.loss_scale or 0) == 0 then
    add_warning(ctx, "fp16.hysteresis = %s is not used at zero_optimization.stage 0: DeepSpeed's FP16_Optimizer " ..
      "(no ZeRO) halves the loss scale at every overflow, and so does zrun", show(f.hysteresis))
  end
end

-- data_types.param_dtype must be the training precision (DeepSpeed's _assert_valid_mixed_precision_config);
-- buffer_dtype is read only under fp16 / bf16 (engine._cast_module_mixed_precision).
local function data_types_checks(vals, ctx)
  local dt = vals.data_types
  local f16, b16 = vals.fp16.enabled, vals.bf16.enabled
  if type(f16) ~= "boolean" or type(b16) ~= "boolean" then return end
  local prec = f16 and "fp16" or b16 and "bf16" or "fp32"
  if dt.param_dtype ~= nil and dt.param_dtype ~= prec then
    add_error(ctx, 'data_types.param_dtype = "%s" conflicts with the training precision (%s), as DeepSpeed asserts: ' ..
      'set the matching fp16/bf16 "enabled" flag or remove data_types.param_dtype', dt.param_dtype, prec)
  end
  if type(dt.keep_in_fp32_modules) == "table" then
    for _, n in ipairs(dt.keep_in_fp32_modules) do
      local ok, err = U.name_pattern(n)
      if not ok then add_error(ctx, "data_types.keep_in_fp32_modules: %s", err) end
    end
  end
  if dt.buffer_dtype ~= nil and prec == "fp32" then
    add_warning(ctx, 'data_types.buffer_dtype = "%s" has no effect without fp16 or bf16: DeepSpeed casts buffers ' ..
      "only in 16-bit training, and so does zrun", dt.buffer_dtype)
  end
end

-- The rules that read several keys (offload and stage, precision, Lamb, SGD's nesterov, the
-- scheduler's steps, ZenFlow), and the deprecated spellings moved to their new keys (take: config.lua's
-- reader of a raw value against its schema node, which fills a section's defaults).
local function cross_checks(vals, ctx, take)
  local zo = vals.zero_optimization
  local stage = zo.stage
  lamb_checks(vals, ctx)
  sgd_checks(vals, ctx)
  fp16_stage0_checks(vals, ctx)
  -- torch.optim.SGD's own check (a ValueError in its constructor)
  local opt = vals.optimizer
  if opt and opt.type == "SGD" and opt.params and opt.params.nesterov == true then
    local mo, damp = opt.params.momentum, opt.params.dampening
    if type(mo) == "number" and type(damp) == "number" and (mo <= 0 or damp ~= 0) then
      add_error(ctx, "optimizer.params.nesterov = true needs momentum > 0 and dampening = 0 (got momentum %s, " ..
        "dampening %s), as torch.optim.SGD requires", fmtnum(mo), fmtnum(damp))
    end
  end
  -- Deprecated spellings.
  if zo.cpu_offload ~= nil then
    add_warning(ctx, "zero_optimization.cpu_offload is deprecated; use zero_optimization.offload_optimizer")
    if zo.cpu_offload and not zo.offload_optimizer then
      zo.offload_optimizer = take(OFFLOAD_OPTIMIZER, { device = "cpu" }, "zero_optimization.offload_optimizer", ctx)
    end
  end
  if zo.cpu_offload_param ~= nil then
    add_warning(ctx, "zero_optimization.cpu_offload_param is deprecated; use zero_optimization.offload_param")
    if zo.cpu_offload_param and not zo.offload_param then
      zo.offload_param = take(OFFLOAD_PARAM, { device = "cpu" }, "zero_optimization.offload_param", ctx)
    end
  end
  if zo.cpu_offload_use_pin_memory ~= nil then
    add_warning(ctx, "zero_optimization.cpu_offload_use_pin_memory is deprecated; use pin_memory in offload_*")
  end
  if zo.stage3_gather_fp16_weights_on_model_save ~= nil then
    add_warning(ctx, "zero_optimization.stage3_gather_fp16_weights_on_model_save is deprecated; use " ..
      "stage3_gather_16bit_weights_on_model_save")
    if ctx.src["zero_optimization.stage3_gather_16bit_weights_on_model_save"].kind == "default" then
      zo.stage3_gather_16bit_weights_on_model_save = zo.stage3_gather_fp16_weights_on_model_save
    end
  end
  if type(stage) ~= "number" then return end
  local op, oo = zo.offload_param, zo.offload_optimizer

  if op and op.device ~= "none" then
    if stage < 3 then -- DeepSpeed's stage 1/2 optimizer never reads offload_param
      add_warning(ctx, "zero_optimization.offload_param (device %s) has no effect at stage %d, as in DeepSpeed: " ..
        "only stage 3 shards (and offloads) parameters; use stage 3 to offload them", show(op.device), stage)
      op.device = "none"
      ctx.src["zero_optimization.offload_param.device"].note = "stage < 3: no parameter offload"
    end
    if op.device == "nvme" and not op.nvme_path then
      add_error(ctx, 'zero_optimization.offload_param.nvme_path is required when device is "nvme"')
    end
  end
  if oo and oo.device ~= "none" then
    if stage == 0 then
      add_error(ctx, "zero_optimization.offload_optimizer (device %s) needs zero_optimization.stage 1, 2 or 3, got 0",
        show(oo.device))
    elseif oo.device == "nvme" and stage < 3 then
      add_error(ctx, 'zero_optimization.offload_optimizer.device "nvme" needs zero_optimization.stage 3, got %d ' ..
        '(stages 1 and 2 offload to "cpu" only)', stage)
    end
    if oo.device == "nvme" and not oo.nvme_path then
      add_error(ctx, 'zero_optimization.offload_optimizer.nvme_path is required when device is "nvme"')
    end
    -- partial offload (ZeRO-Offload++): DeepSpeed asserts stage 3 (zero/config.py offload_ratio_check)
    -- and DeepSpeedCPUAdam (stage3.py); zrun's engine splits the partition at any offloading stage
    -- and for every optimizer it runs, and says where it goes beyond DeepSpeed
    if oo.ratio ~= 1 and (stage == 1 or stage == 2) then
      add_warning(ctx, "zero_optimization.offload_optimizer.ratio = %s at stage %d: DeepSpeed accepts a ratio below " ..
        "1 only at stage 3 (it refuses this config); zrun runs partial offload at stages 1 and 2 too", fmtnum(oo.ratio),
        stage)
    end
    if oo.ratio ~= 1 and stage >= 1 and opt and opt.type ~= "Adam" and opt.type ~= "AdamW" then
      add_warning(ctx, "zero_optimization.offload_optimizer.ratio = %s with optimizer %s: DeepSpeed runs partial " ..
        "offload with its CPU Adam only; zrun runs %s on both parts", fmtnum(oo.ratio), tostring(opt.type),
        tostring(opt.type))
    end
  end  for _, o in ipairs { { op, "offload_param" }, { oo, "offload_optimizer" } } do
    if o[1] and o[1].device == "nvme" and o[1].nvme_path then
      add_warning(ctx, 'zero_optimization.%s.device = "nvme": zrun does not implement NVMe offload; it offloads ' ..
        'to "cpu" (host memory) instead, which trains the same', o[2])
      o[1].device = "cpu"
      ctx.src["zero_optimization." .. o[2] .. ".device"].note = 'nvme: zrun offloads to "cpu"'
    end
  end
  bf16_lp_checks(vals, ctx, stage)
  data_types_checks(vals, ctx)
  if vals.fp16.enabled == true and vals.bf16.enabled == true then
    add_error(ctx, "fp16.enabled and bf16.enabled are both true; enable one of them (bf16 needs no loss scaling)")
  end
  if vals.amp.enabled then
    add_error(ctx, "amp.enabled: NVIDIA Apex AMP is not available in zrun; use bf16.enabled or fp16.enabled")
  end
  if vals.torch_autocast.enabled then
    if vals.bf16.enabled == true or vals.fp16.enabled == true then -- e.g. DeepSpeedExamples' bf16_full.json
      add_error(ctx, "torch_autocast.enabled with %s.enabled: zrun has no torch.autocast (under it PyTorch keeps " ..
        "norms, softmax and the loss in fp32 tensors); remove the torch_autocast section: zrun's 16-bit model " ..
        "computes those in fp32 and stores 16-bit results", vals.bf16.enabled == true and "bf16" or "fp16")
    else
      add_error(ctx, "torch_autocast.enabled: zrun has no torch.autocast; use bf16.enabled or fp16.enabled")
    end
  end
  if zo.zenflow then -- DeepSpeed's checks of the section, and what zrun does not implement (zrun.zenflow)
    require("zrun.zenflow").check(vals, function(...) add_error(ctx, ...) end, function(...) add_warning(ctx, ...) end)
  end
  for _, m in ipairs { "wandb", "comet" } do
    if vals[m].enabled then
      add_error(ctx, "%s.enabled = true: zrun cannot reach %s (no Python client, no network); use tensorboard or " ..
        "csv_monitor (zrun writes both), or set %s.enabled to false", m, m, m)
    end
  end
  local sch = vals.scheduler
  if sch then
    local p = sch.params
    if type(p.warmup_num_steps) == "number" and type(p.total_num_steps) == "number" and
      p.total_num_steps < p.warmup_num_steps then
      add_warning(ctx, "scheduler.params.total_num_steps %d is less than warmup_num_steps %d",
        p.total_num_steps, p.warmup_num_steps)
    end
    -- (lr_schedules.py 0.19.8 raises "warmup_num_steps must be a positive integer"; its earlier rule,
    -- max(2, n), is what zrun runs: a first step at the minimum)
    if p.warmup_num_steps == 0 then
      add_warning(ctx, "scheduler.params.warmup_num_steps = 0: DeepSpeed 0.19.8's %s refuses it; zrun warms up over " ..
        "2 steps as earlier DeepSpeed did (the first at its minimum lr); give warmup_num_steps >= 1 (the Trainer: " ..
        "warmup_steps)", sch.type)
    end
    if sch.type == "OneCycle" and type(p.cycle_min_lr) == "number" and type(p.cycle_max_lr) == "number" and
      p.cycle_max_lr < p.cycle_min_lr then
      add_warning(ctx, "scheduler.params.cycle_max_lr %s is below cycle_min_lr %s",
        fmtnum(p.cycle_max_lr), fmtnum(p.cycle_min_lr))
    end
  end
end

M.batch_rule, M.cross_checks = batch_rule, cross_checks
return M
