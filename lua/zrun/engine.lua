-- The training engine: zr.initialize{model=, model_parameters=, config=, training_data=} returns
-- engine, optimizer, dataloader, scheduler, as deepspeed.initialize does. The engine owns the
-- ZeRO partitioning (runtime/zero.c), mixed precision, gradient accumulation and clipping, the
-- LR schedule, and checkpoints (zrun.checkpoint).
local zr = require "zrun"
local C = zr._C
local dist = require "zrun.dist"
local Module = require "zrun.nn.module"

local M = {}
local Engine = {}
Engine.__index = Engine
M.Engine = Engine

local fmt = string.format
-- The ZeRO engine's optimizer (bind_zero.c's names) for each canonical optimizer.type.
local OPTIMIZER_KIND = { Adam = "adamw", AdamW = "adamw", Lion = "lion", Adagrad = "adagrad", SGD = "sgd",
  Lamb = "lamb" }
-- How many f32 states beside the master weights each keeps (runtime: zr_optim_states).
local OPTIMIZER_STATES = { adamw = function() return 2 end, lion = function() return 1 end,
  adagrad = function() return 1 end, sgd = function(op) return (op.momentum or 0) ~= 0 and 1 or 0 end,
  lamb = function() return 2 end }

-- The optimizer the engine hands back: param_groups with lr (the scheduler writes them), and a
-- zero_grad that explains why it must not be called by hand.
local Facade = {}
Facade.__index = Facade
function Facade:zero_grad()
  error("optimizer:zero_grad() must not be called when the engine owns the optimizer: engine:step() " ..
    "zeroes gradients at the accumulation boundary (calling it mid-accumulation would drop gradients)", 2)
end
function Facade:step()
  error("optimizer:step() must not be called directly: call engine:step() after engine:backward(loss)", 2)
end

local function timer() return C.now() end

-- Splits model_parameters into {params, weight_decay per param, group index}.
local function flatten_groups(model, model_parameters, default_wd)
  local groups = {}
  if model_parameters == nil then
    groups[1] = { params = model:parameters() }
  elseif model_parameters[1] and C.is_tensor(model_parameters[1]) then
    groups[1] = { params = model_parameters }
  else
    groups = model_parameters
  end
  local params, wds, gidx, seen = {}, {}, {}, {}
  for gi, g in ipairs(groups) do
    for _, p in ipairs(g.params or {}) do
      if seen[p] then error("a parameter appears in two parameter groups", 0) end
      seen[p] = true
      if p.requires_grad then
        params[#params + 1] = p
        wds[#wds + 1] = g.weight_decay or default_wd
        gidx[#gidx + 1] = gi
      end
    end
  end
  if #params == 0 then error("zr.initialize: no trainable parameters (none requires grad)", 0) end
  return params, wds, gidx, groups
end

-- Maps every parameter to its index in the engine and each module to its direct parameters.
-- Every tensor in model_parameters must be one of the model's parameters: one that is not (a list
-- taken from another model, or copies) would be updated while the model never changes.
local function index_modules(model, params)
  local owned = {}
  for _, p in ipairs(model:parameters()) do owned[p] = true end
  local pos = {}
  for i, p in ipairs(params) do
    if not owned[p] then
      error(fmt("zr.initialize: model_parameters entry %d (%s (%s)) is not a parameter of the model: pass " ..
        "model:parameters() (or groups of them) taken from this model", i, p:dtype(), table.concat(p:shape(), ",")), 0)
    end
    pos[p] = i
  end
  local direct = {}
  for _, m in ipairs(model:modules()) do
    local l = {}
    for _, n in ipairs(m._param_order) do
      local i = pos[m._parameters[n]]
      if i then l[#l + 1] = i end
    end
    direct[m] = l
  end
  return pos, direct
end

-- Each parameter's dotted name, in the engine's order (collective timeout and debug messages).
local function param_names(model, params)
  local by = {}
  for n, p in model:named_parameters() do by[p] = n end
  local names = {}
  for i, p in ipairs(params) do names[i] = by[p] end
  return names
end


-- zr.initialize{...}, deepspeed.initialize's analogue. opts: model (an nn.Module), model_parameters (a list
-- of parameters or HF-style groups {params=, weight_decay=}), config (a DeepSpeed JSON path or table),
-- args (TrainingArguments-like, fills "auto"), overrides, num_training_steps, training_data (rows
-- or a zrun.datasets Dataset) with collate_fn, seed, shuffle, lr_scheduler (one of your own), device.
-- Returns engine, optimizer, dataloader (nil without training_data), lr_scheduler (nil without one).
function M.initialize(opts)
  opts = require("zrun.kwargs").check("zr.initialize", opts, { "model", "model_parameters", "config", "args",
    "overrides", "num_training_steps", "training_data", "collate_fn", "seed", "shuffle", "lr_scheduler", "device" })
  local model = opts.model
  if not (type(model) == "table" and Module.is_module(model)) then
    error("zr.initialize: `model` must be an nn.Module", 2)
  end
  local info = dist.init()
  local W, rank = info.world_size, info.rank
  local cfgmod = require "zrun.config"
  local cfg = cfgmod.load(opts.config or {}, { world_size = W, args = opts.args, overrides = opts.overrides,
    hidden_size = model.config and model.config.hidden_size, num_training_steps = opts.num_training_steps })
  -- Every value below is the resolved config's: DeepSpeed's defaults live in config.lua only.
  cfgmod.settle(cfg)
  if rank == 0 then -- what `zrun check` warns about (keys DeepSpeed ignores, features zrun lacks)
    for _, w in ipairs(cfg:warnings()) do io.stderr:write("[zrun] warning: config: ", w, "\n") end
  end
  local zc = cfg.zero_optimization
  local stage = zc.stage
  local precision = (cfg.bf16 and cfg.bf16.enabled) and "bf16" or ((cfg.fp16 and cfg.fp16.enabled) and "f16" or "f32")

  local self = setmetatable({
    module = model, config = cfg, world_size = W, global_rank = rank, local_rank = info.local_rank,
    stage = stage, precision = precision, global_steps = 0, micro_steps = 0, skipped_steps = 0,
    gas = cfg.gradient_accumulation_steps, micro_batch = cfg.train_micro_batch_size_per_gpu,
    clip = cfg.gradient_clipping, steps_per_print = cfg.steps_per_print,
    wall_clock_breakdown = cfg.wall_clock_breakdown, timers = { forward = 0, backward = 0, step = 0 },
  }, Engine)

  -- device and precision of the model's parameters
  local p0 = model:parameters()[1]
  self.device = opts.device or (p0 and p0:device()) or "cpu"
  if precision ~= "f32" then M.cast_module(model, precision, cfg) end

  -- optimizer hyperparameters: AdamW ("Adam" too), Lion, Adagrad, SGD or Lamb (config.load refuses the
  -- optimizers zrun does not run, with the message `zrun check` prints); no optimizer section:
  -- DeepSpeed's AdamW defaults
  local ocfg = cfg.optimizer or cfgmod.default_optimizer()
  local op = ocfg.params
  self.optimizer_type = OPTIMIZER_KIND[ocfg.type] or error(fmt("optimizer.type %s: not an optimizer zrun runs", ocfg.type), 0)
  self.hp = { lr = op.lr, betas = op.betas or { 0, 0 }, eps = op.eps or 0, weight_decay = op.weight_decay,
    extra = { optimizer = self.optimizer_type, momentum = op.momentum, dampening = op.dampening,
      nesterov = op.nesterov, lr_decay = op.lr_decay, bias_correction = op.bias_correction,
      eps_inside_sqrt = op.eps_inside_sqrt, max_coeff = op.max_coeff, min_coeff = op.min_coeff } }

  local params, wds, gidx, groups = flatten_groups(model, opts.model_parameters, self.hp.weight_decay)
  self.params = params
  self.param_pos, self.module_params = index_modules(model, params)
  self.param_numel = {} -- whole sizes (at stage 3 a released parameter has 0 elements)
  for i, p in ipairs(params) do self.param_numel[i] = p:numel() end
  local off = zc.offload_optimizer and zc.offload_optimizer.device
  local offp = zc.offload_param and zc.offload_param.device
  self.offload_optimizer = off == "cpu"
  self.offload_param = offp == "cpu"
  if W > 1 and params[1] and params[1]:device():match("^cuda") then
    M.check_gpus_per_node(dist.local_size(), C.cuda.device_count(), params[1]:device())
  end
  local S = M.partition_numel(params, W, stage)
  self.grad_dtype = M.grad_accum_dtype(cfg) or "f32" -- the gradient partition's (and stage 0-1's .grad) dtype
  local gbytes = ({ f32 = 4, bf16 = 2, f16 = 2 })[self.grad_dtype]
  -- offload_optimizer.ratio: the host's share of the optimizer states (ZeRO-Offload++)
  self.offload_ratio = self.offload_optimizer and zc.offload_optimizer.ratio or 1
  if self.offload_optimizer then
    self.offload_grads = M.offload_grads_place(S, gbytes, self.device, self.offload_ratio, zc.zenflow ~= nil)
  end
  local mdt, sdt = M.master_dtype(cfg), M.state_dtype(cfg) -- nil: f32
  self.master_dtype, self.state_dtype = mdt or "f32", sdt or "f32"
  local on_gpu = C.cuda and params[1] and params[1]:device():match("^cuda") and true or false
  -- offload_param.pin_memory (DeepSpeed's default true): the host parameter shard page-locked
  self.param_pin_memory = self.offload_param and zc.offload_param.pin_memory ~= false and on_gpu
  if self.offload_optimizer or self.offload_param then
    local pin = self.offload_optimizer and zc.offload_optimizer.pin_memory and on_gpu
    M.check_host_memory(params, W, stage, self.offload_param, pin, OPTIMIZER_STATES[self.optimizer_type](op),
      { offload_optimizer = self.offload_optimizer, device = self.device:match("^cuda") and "cuda" or "cpu",
        dtype = precision, grad_accum_dtype = cfg.data_types and cfg.data_types.grad_accum_dtype, ratio = self.offload_ratio,
        master_dtype = mdt, state_dtype = sdt,
        reduce_bucket_size = zc.reduce_bucket_size, param_pin_memory = self.param_pin_memory,
        offload_grads = self.offload_grads }) -- where this engine keeps offloaded gradients
  end
  self.zero = C.zero_new({ stage = stage, reduce_bucket_size = zc.reduce_bucket_size,
    allgather_bucket_size = zc.allgather_bucket_size, offload_optimizer = self.offload_optimizer,
    offload_param = self.offload_param, offload_grads_on_device = self.offload_grads == "device",
    offload_ratio = self.offload_ratio,
    keep_grads = zc.zenflow ~= nil and stage == 2 and W > 1, -- zrun.zenflow reads each micro-step's own gradient
    persistence_threshold = zc.stage3_param_persistence_threshold,
    pin_memory = zc.offload_optimizer and zc.offload_optimizer.pin_memory, param_pin_memory = self.param_pin_memory,
    overlap_comm = zc.overlap_comm, max_live_parameters = zc.stage3_max_live_parameters,
    comm_dtype = M.comm_dtype(cfg), grad_dtype = M.grad_accum_dtype(cfg), names = param_names(model, params),
    optimizer = self.optimizer_type, momentum = op.momentum, initial_accumulator_value = op.initial_accumulator_value,
    master_dtype = mdt, state_dtype = sdt },
    params, wds)
  if self.offload_optimizer and self.offload_ratio < 1 then
    local split, S0 = self.zero:split(), self.zero:partition_numel()
    dist.print0(fmt("[zrun] offload_optimizer: ratio %g: the optimizer states of %.1f%% of the partition on the host, " ..
      "%.1f%% on %s (updated there at the same time); gradients accumulate on %s until the step", self.offload_ratio,
      S0 > 0 and 100 * (S0 - split) / S0 or 0, S0 > 0 and 100 * split / S0 or 0, self.device, self.device))
  elseif self.offload_optimizer then
    dist.print0(fmt("[zrun] offload_optimizer: %s on the host, %s; ZRUN_OFFLOAD_GRADS=%s to change", ocfg.type,
      self.offload_grads == "device" and fmt("gradients accumulate on %s until the step", self.device) or
      "gradients go to the host bucket by bucket during backward", self.offload_grads == "device" and "host" or "device"))
  end
  self.prefetch_budget = zc.stage3_prefetch_bucket_size
  self.max_reuse_distance = zc.stage3_max_reuse_distance
  self.max_live_parameters = zc.stage3_max_live_parameters

  -- optimizer facade with param groups (the scheduler sets group.lr)
  local fgroups = {}
  for gi, g in ipairs(groups) do
    fgroups[gi] = { lr = g.lr or self.hp.lr, weight_decay = g.weight_decay or self.hp.weight_decay,
      -- (the optimizers with betas hold them in each group, as torch's do: OneCycle's momentum cycle moves them)
      betas = op.betas and { op.betas[1], op.betas[2] } or nil }
  end
  self.group_of = gidx
  self.optimizer = setmetatable({ param_groups = fgroups, engine = self }, Facade)

  -- scheduler
  if cfg.scheduler and cfg.scheduler.type then
    self.lr_scheduler = require("zrun.schedulers").from_config(cfg.scheduler, self.optimizer)
  end
  if opts.lr_scheduler then self.lr_scheduler = opts.lr_scheduler end

  -- fp16 dynamic loss scaling (DeepSpeed's DynamicLossScaler)
  if precision == "f16" then
    local f = cfg.fp16
    local static = f.loss_scale > 0
    -- without ZeRO DeepSpeed's FP16_Optimizer: no hysteresis, and at min_loss_scale it goes on skipping
    local h = stage == 0 and 1 or f.hysteresis
    self.scaler = { scale = static and f.loss_scale or 2 ^ f.initial_scale_power, dynamic = not static,
      window = f.loss_scale_window, hysteresis = h, cur_hysteresis = h,
      min_scale = f.min_loss_scale, good = 0, no_zero = stage == 0 }
  end

  -- stage 3 in one process keeps every parameter resident (nothing to gather): no module hooks
  if stage == 3 and not self.zero:is_resident() then self:install_zero3_hooks() end

  -- DeepSpeed's monitors (tensorboard, csv_monitor) on rank 0: events at every optimizer step
  self.monitor = require("zrun.monitor").from_config(cfg, rank)

  -- data
  local loader
  if opts.training_data then
    loader = M.dataloader(opts.training_data, { batch_size = self.micro_batch, rank = rank, world_size = W,
      collate_fn = opts.collate_fn, seed = opts.seed or 42, shuffle = opts.shuffle, drop_last = cfg.dataloader_drop_last })
    self.training_dataloader = loader
  end
  if zc.zenflow then -- DeepSpeed replaces gradient_accumulation_steps by update_interval
    self.zenflow = require("zrun.zenflow").new(self, zc.zenflow, loader and loader:len() or nil)
    local U = zc.zenflow.update_interval
    -- "auto": DeepSpeed sets gradient_accumulation_steps to 0 and then leaves the loss unscaled (its
    -- releases up to 0.18.2: the window's gradients are summed; later ones divide by that 0)
    self.gas = U == "auto" and 1 or U
    dist.print0(fmt("[zrun] zenflow: top %g of each weight's columns updated every micro-batch on %s, the rest on " ..
      "the host %s", zc.zenflow.topk_ratio, self.device, U == "auto" and fmt("when the unselected columns' " ..
      "gradients have caught up (update_interval \"auto\", auto_ratio %g; the window's loss is summed, as in " ..
      "DeepSpeed)", zc.zenflow.auto_ratio) or fmt("every %d micro-batches (gradient_accumulation_steps becomes " ..
      "update_interval, as in DeepSpeed)", U)))
  end
  -- the parameters as the model held them (f32 before a bf16 cast, unsharded before ZeRO-3) are garbage now:
  -- free them before the first forward, which would otherwise run with both copies (Lua does not see
  -- tensor memory; the first collection would come in the first backward)
  collectgarbage("collect")
  return self, self.optimizer, loader, self.lr_scheduler
end

-- DeepSpeed 0.19.8's cast of the model under fp16 / bf16 (engine._cast_module_mixed_precision): the
-- parameters take the training dtype; floating buffers keep the dtype they came with (an fp32 buffer
-- stays fp32, as DeepSpeed keeps rotary tables and routing biases), unless data_types.buffer_dtype
-- names one. Integer buffers never change. The floating buffers data_types.keep_in_fp32_modules names
-- (runtime/keep_in_fp32.py) are made fp32 and left out of buffer_dtype's cast.
local DTYPE_OF = { fp16 = "f16", bf16 = "bf16", fp32 = "f32" }
local FLOAT = { f32 = true, f64 = true, bf16 = true, f16 = true }

-- The Lua patterns of the buffer names to keep in fp32: the setting's names, or for "auto" each module's
-- _keep_in_fp32_modules_strict (and under fp16 _keep_in_fp32_modules) lists, under that module's name.
local KEEP_ATTRS = { "_keep_in_fp32_modules_strict", "_keep_in_fp32_modules" } -- (the second under fp16 only)
local function keep_patterns(model, setting, precision)
  local U, pats = require "zrun.config_util", {}
  local function add(name, prefix)
    local p, err = U.name_pattern(name)
    if not p then error("data_types.keep_in_fp32_modules: " .. err, 0) end
    pats[#pats + 1] = prefix ~= "" and ("^" .. prefix:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0") .. "%..*" .. p) or p
  end
  if type(setting) == "table" then
    for _, n in ipairs(setting) do add(n, "") end
    return pats
  end
  for prefix, m in model:named_modules() do
    for i = 1, precision == "f16" and 2 or 1 do
      local names = m[KEEP_ATTRS[i]]
      if type(names) == "table" then for _, n in ipairs(names) do add(n, prefix) end end
    end
  end
  return pats
end

function M.cast_module(model, precision, cfg)
  local dts = cfg.data_types or {}
  local dt = dts.buffer_dtype
  local pats = keep_patterns(model, dts.keep_in_fp32_modules, precision)
  local buffers = {} -- {module, name, tensor, kept} as they were before the parameters' cast
  for prefix, m in model:named_modules() do
    for _, n in ipairs(m._buffer_order) do
      local full, kept = prefix == "" and n or (prefix .. "." .. n), false
      for _, p in ipairs(pats) do kept = kept or full:find(p) ~= nil end
      buffers[#buffers + 1] = { m, n, m._buffers[n], kept }
    end
  end
  local p0 = model:parameters()[1]
  if p0 and p0:dtype() ~= precision then model:to(precision) end
  for _, b in ipairs(buffers) do
    local t = b[3]
    if FLOAT[t:dtype()] then
      local want = b[4] and "f32" or (dt and DTYPE_OF[dt])
      if want and t:dtype() ~= want then t = t:to(want) end
    end
    b[1]._buffers[b[2]] = t
  end
end

-- NCCL needs one GPU per process: more processes on a node than GPUs would share one (NCCL
-- then fails with a duplicate-GPU error deep inside the first collective).
function M.check_gpus_per_node(local_ranks, gpus, device)
  if local_ranks > gpus then
    error(fmt("ZeRO on %s: %d processes on this node but %d GPU%s: NCCL needs one GPU per process; start at " ..
      "most %d rank%s per node (mpirun -np %d on one node), or train on the CPU (device \"cpu\", MPI backend)",
      device, local_ranks, gpus, gpus == 1 and "" or "s", gpus, gpus == 1 and "" or "s", gpus), 0)
  end
end

-- Gradient buckets and their reduction in DeepSpeed's communication_data_type ("fp16", "bf16",
-- "fp32"); unset (nil here): the parameters' dtype, as DeepSpeed does (bf16 training reduces bf16).
local COMM_DTYPES = { fp16 = "f16", bf16 = "bf16", fp32 = "f32" }
function M.comm_dtype(cfg)
  local v = cfg.communication_data_type
  return v ~= nil and COMM_DTYPES[v] or nil
end

-- DeepSpeed's data_types.grad_accum_dtype: the dtype gradients accumulate (and the optimizer
-- reads them) in; unset: fp32, or bf16 with bf16.bf16_master_weights_and_grads.
function M.grad_accum_dtype(cfg)
  local v = cfg.data_types and cfg.data_types.grad_accum_dtype
  if v == nil and M.master_dtype(cfg) then return "bf16" end
  return v ~= nil and COMM_DTYPES[v] or nil
end

-- The ZeRO master partition's dtype: "bf16" with DeepSpeed's bf16.bf16_master_weights_and_grads,
-- else nil (f32).
function M.master_dtype(cfg)
  return cfg.bf16 and cfg.bf16.bf16_master_weights_and_grads == true and "bf16" or nil
end
-- The dtype of AdamW's moments: "bf16" with DeepSpeed's bf16.bf16_optimizer_states, else nil (f32).
function M.state_dtype(cfg)
  return cfg.bf16 and cfg.bf16.bf16_optimizer_states == true and "bf16" or nil
end

-- The locked-memory limit (ulimit -l) in bytes from /proc/self/limits; nil when unlimited or unknown.
function M.memlock_limit(path)
  local f = io.open(path or "/proc/self/limits")
  if not f then return nil end
  local lim
  for line in f:lines() do
    local soft = line:match("^Max locked memory%s+(%S+)")
    if soft then lim = soft ~= "unlimited" and tonumber(soft) or nil end
  end
  f:close()
  return lim
end

-- Elements of one rank's partition: every parameter's chunk (ceil(numel / W); whole at stage 0).
function M.partition_numel(params, W, stage)
  local S, Wc = 0, stage == 0 and 1 or W
  for _, p in ipairs(params) do S = S + math.ceil(p:numel() / Wc) end
  return S
end

-- Optimizer offload: where the gradient partition (S elements of `grad_bytes`) accumulates
-- (runtime/zero/offload.h): "device" (on the GPU until the step, as without offload) or "host"
-- (bucket by bucket to the host during backward). ZRUN_OFFLOAD_GRADS forces it; unset: the device
-- when it is a GPU and the partition takes at most half of its free memory now (the rest is left
-- for activations), else the host. Partial offload (ratio < 1) always keeps them on the device:
-- the device part of the optimizer reads them there (host gradients are for a device too small
-- for the gradient partition, which then cannot hold optimizer states either).
function M.offload_grads_place(S, grad_bytes, device, ratio, zenflow)
  local e = os.getenv("ZRUN_OFFLOAD_GRADS")
  if e and e ~= "" and e ~= "device" and e ~= "host" then
    error(fmt('ZRUN_OFFLOAD_GRADS must be "device" (gradients accumulate on the GPU until the step) or ' ..
      '"host" (they leave bucket by bucket during backward), got "%s"; unset it to choose by free GPU memory', e), 0)
  end
  -- ZenFlow reads each micro-batch's gradient on the parameters' device (zrun.zenflow refuses host)
  if zenflow and e ~= "host" and tostring(device):match("^cuda") then return "device" end
  if (ratio or 1) < 1 then
    if e == "host" then
      error(fmt("ZRUN_OFFLOAD_GRADS=host: offload_optimizer.ratio = %g keeps part of the optimizer states on the " ..
        "GPU, which reads the gradients there; unset ZRUN_OFFLOAD_GRADS (or set it to device), or set ratio 1 " ..
        "to send the gradients to the host", ratio), 0)
    end
    return "device"
  end
  if e and e ~= "" then return e end
  local idx = tostring(device):match("^cuda:?(%d*)$")
  if not idx or not C.cuda then return "host" end
  local m = C.cuda.memory_summary(tonumber(idx) or 0)
  if (m.device_total or 0) == 0 then return "host" end
  local fit = require("zrun.memory_offload").device_grads_fit
  return fit(S, grad_bytes, m.device_free + m.cached) and "device" or "host"
end

-- Before offloading, checks that this node's free RAM holds what every local rank will put there
-- (zr.memory.plan's host column for these parameters: fp32 master, the optimizer's `states` (AdamW
-- 2), the step's ring, and with gradients on the host their partition (fp32, or grad_accum_dtype)
-- and staging bucket, or with offload_param the 16-bit shard) and, with pin_memory, that the
-- page-locked part (what DMA touches: the ring, staging and host gradients; with
-- o.param_pin_memory the host parameter shard too) is within
-- the locked-memory limit (ulimit -l). Stops with what does not fit and each setting that fixes
-- it, one line each. o (optional): offload_optimizer (default true), device, dtype,
-- grad_accum_dtype and ratio (DeepSpeed's names), offload_grads ("device" | "host": where the
-- engine keeps the gradients), reduce_bucket_size.
function M.check_host_memory(params, W, stage, offload_param, pin_memory, states, o)
  o = o or {}
  local numels = {}
  for i, p in ipairs(params) do numels[i] = p:numel() end
  local popts = { param_numels = numels, name = "the model", world_size = W, gpus_per_node = dist.local_size(),
    stage = stage, offload_optimizer = o.offload_optimizer ~= false, offload_param = offload_param or false, opt_states = states or 2,
    pin_memory = pin_memory and true or false, param_pin_memory = o.param_pin_memory or false,
    device = o.device or ((pin_memory or o.param_pin_memory) and "cuda" or "cpu"),
    dtype = o.dtype or "bf16", grad_accum_dtype = o.grad_accum_dtype, offload_ratio = o.ratio,
    offload_grads = o.offload_grads or "host", reduce_bucket_size = o.reduce_bucket_size,
    master_dtype = o.master_dtype, state_dtype = o.state_dtype }
  local plan = require "zrun.memory_plan"
  local p = plan.plan(popts)
  local avail
  local f = io.open("/proc/meminfo")
  if f then
    for line in f:lines() do
      local v = line:match("^MemAvailable:%s+(%d+) kB")
      if v then avail = tonumber(v) * 1024 end
    end
    f:close()
  end
  local h = zr.memory.human
  local lim = (pin_memory or o.param_pin_memory) and M.memlock_limit(M.limits_file)
  local lines = plan.host_check(p, popts, avail and math.floor(avail * 0.9), lim or nil,
    avail and (" (90% of MemAvailable " .. h(avail) .. ")"))
  if #lines > 0 then error(table.concat(lines, "\n"), 0) end
end

-- A rank-sharded loader over a dataset of rows (zrun.datasets) or a list of samples, as DeepSpeed's
-- deepspeed_io builds it: torch's DistributedSampler (every rank the same number of rows, padded by
-- wrapping), micro-batches of o.batch_size, a last shorter one unless o.drop_last (the config's
-- dataloader_drop_last).
function M.dataloader(data, o)
  local D = require "zrun.datasets"
  local rows = data.rows or data
  local sampler = D.DistributedSampler.new(#rows, { rank = o.rank, world_size = o.world_size, seed = o.seed,
    shuffle = o.shuffle })
  local collate = o.collate_fn or D.causal_lm_collator()
  local class = { __name = "DataLoader" }
  local cut = o.drop_last and math.floor or math.ceil
  function class:set_epoch(e) sampler:set_epoch(e) end
  function class:len() return cut(sampler.num_samples / o.batch_size) end -- also #loader
  function class:iter() return D.batches({ rows = rows }, sampler, o.batch_size, collate, o.drop_last) end
  return require("zrun.data").sized({ sampler = sampler, batch_size = o.batch_size }, class)
end

-- ZeRO-3: parameters are whole only while their module runs (forward) and during its backward.
-- Prefetch (stage3_prefetch_bucket_size): the first forward records the order in which modules
-- run; afterwards each module, once its own parameters are gathered, starts the all-gathers of
-- the modules that follow it (in forward) or precede it (in backward) while the elements started
-- are below that many and below stage3_max_live_parameters minus the live ones (DeepSpeed's rule:
-- the parameter crossing the bound starts too), so the next module's parameters arrive while this
-- one computes. Recomputation inside backward (checkpointing) neither records nor prefetches.
-- stage3_max_reuse_distance: after its forward a module keeps its parameters when their next use
-- (its backward) comes within that many parameters — twice those of the modules after it — and
-- the live ones stay within stage3_max_live_parameters, as DeepSpeed does.
function Engine:install_zero3_hooks()
  local z, direct = self.zero, self.module_params
  local budget, max_reuse, max_live = self.prefetch_budget, self.max_reuse_distance, self.max_live_parameters
  local trace = { nxt = {}, prv = {}, fwd = {}, bwd = {}, after = {} }
  self.z3trace = trace
  local function first_tensor(args)
    for i = 1, args.n do if C.is_tensor(args[i]) then return i end end
  end
  -- the parameters of the modules along a chain (nxt or prv) from m, up to the budget
  local function chain(m, links, cache)
    local list = cache[m]
    if list then return list end
    list = {}
    local total, k = 0, links[m]
    while k and total < budget do
      for _, i in ipairs(direct[k]) do list[#list + 1] = i; total = total + self.param_numel[i] end
      k = links[k]
    end
    cache[m] = list
    return list
  end
  -- parameters of the modules that run after m in forward (the trace's chain), cached
  local function after(m)
    local a = trace.after[m]
    if a then return a end
    a = 0
    local k = trace.nxt[m]
    while k do
      for _, i in ipairs(direct[k]) do a = a + self.param_numel[i] end
      k = trace.nxt[k]
    end
    trace.after[m] = a
    return a
  end
  -- Both act on a module's own parameters only (true below), so the models' fused ops may run them
  -- for several modules around one op (Module.call_group: q/k/v as one product, a residual add with
  -- its norm) and skip the calls of modules holding none (decoder layers).
  self.hook_handles = {
    Module.register_module_forward_pre_hook(function(m, ...)
      local idx = direct[m]
      if not idx or #idx == 0 then return nil end
      local fresh = not self.in_backward
      if fresh and trace.recording then -- first-occurrence links of the forward order
        local last = trace.last
        if last and last ~= m and not trace.nxt[last] and not trace.prv[m] then trace.nxt[last], trace.prv[m] = m, last end
        trace.last = m
      end
      z:gather(idx)
      if fresh and budget > 0 and not trace.recording then
        local pre = chain(m, trace.nxt, trace.fwd)
        if #pre > 0 then z:prefetch(pre, budget) end
      end
      local args = { n = select("#", ...), ... }
      local k = first_tensor(args)
      if k then
        args[k] = z:boundary(args[k], 0, idx) -- backward: release after this module's backward
        return { unpack(args, 1, args.n) }
      end
    end, true),
    Module.register_module_forward_hook(function(m, out)
      local idx = direct[m]
      if not idx or #idx == 0 then return nil end
      -- (only when a backward will release them: the output carries a gradient)
      local keep = not self.in_backward and not trace.recording and C.is_tensor(out) and out.requires_grad and
        2 * after(m) < max_reuse and z:live_numel() <= max_live
      if not keep then z:release(idx) end
      if C.is_tensor(out) then -- backward: gather first, then prefetch the modules before this one
        if budget > 0 and not trace.recording then return z:boundary(out, 1, idx, chain(m, trace.prv, trace.bwd), budget) end
        return z:boundary(out, 1, idx)
      end
    end, true),
  }
  -- A model may use a submodule's parameter outside that module's call (a tied LM head): it asks
  -- Module.fetch(p), which gathers it here; it stays whole until the end of backward.
  Module.fetch = function(p) return self:fetch(p) end
end

-- Makes every parameter whole (stage 3: to compare or read them all; release_all partitions
-- them again); a no-op at the other stages. Returns the parameters.
function Engine:gather_parameters()
  if self.stage == 3 then
    local all = {}
    for i = 1, #self.params do all[i] = i end
    self.zero:gather(all)
  end
  return self.params
end

-- Makes a parameter whole for use outside its module (stage 3); a no-op otherwise.
function Engine:fetch(p)
  if self.stage == 3 then
    local i = self.param_pos[p]
    if i then self.zero:gather({ i }) end
  end
  return p
end

-- The factor engine:backward scales the loss by: 1/gradient_accumulation_steps, times the fp16
-- loss scale.
local function loss_grad_scale(self)
  local scale = (self.loss_weight or 1) / self.gas
  if self.scaler then scale = scale * self.scaler.scale end
  return scale
end

-- Weights the next micro-batch's loss by w (> 0) on top of 1/gradient_accumulation_steps, until
-- engine:backward has run it: the Trainer's token-count normalisation (transformers'
-- num_items_in_batch: a micro-batch's mean loss times its share of the step's tokens x accumulation
-- x ranks). Set it before engine:forward, which tells the loss the seed it will get.
function Engine:set_loss_weight(w)
  if type(w) ~= "number" or not (w > 0) or w == math.huge then
    error(("engine:set_loss_weight: the weight must be a positive finite number, got %s"):format(tostring(w)), 2)
  end
  self.loss_weight = w
end

function Engine:__call(...) return self:forward(...) end
-- engine(...) is engine:forward(...): the model's forward with the same arguments and results,
-- timed for wall_clock_breakdown; at stage 3 the first call records the module order for prefetching.
-- It tells autograd the gradient engine:backward will seed the loss with (zr.set_loss_grad_hint),
-- so that a loss on the GPU can make its gradient in the same pass as its value.
function Engine:forward(...)
  local t0 = timer()
  dist.set_step(self.global_steps + 1) -- named by collective timeout messages
  C.set_loss_grad_hint(loss_grad_scale(self))
  local tr = self.z3trace
  if tr then -- stage 3: the first forward records the module order for prefetching
    tr.recording = self.micro_steps == 0 and self.global_steps == 0
    tr.last = nil
  end
  local out = { self.module(...) }
  self.timers.forward = self.timers.forward + (timer() - t0)
  return unpack(out)
end

-- Whether the next engine:step() ends an accumulation window (and steps the optimizer): every
-- gradient_accumulation_steps micro-batches, unless set_gradient_accumulation_boundary says.
function Engine:is_gradient_accumulation_boundary()
  if self.zenflow then return self.zenflow:is_boundary(self.micro_steps) end
  if self.forced_boundary ~= nil then return self.forced_boundary end
  return (self.micro_steps + 1) % self.gas == 0
end

-- DeepSpeed's engine.set_gradient_accumulation_boundary: true or false decides whether the next
-- micro-batch ends its accumulation window (set it before that micro-batch's forward), until set
-- again; nil goes back to every gradient_accumulation_steps micro-batches. The Trainer sets it for
-- every micro-batch, as accelerate does, so that an epoch's last window may be shorter. A shorter
-- window's gradient is its micro-batches' sum / gradient_accumulation_steps: weigh the losses
-- (set_loss_weight) for the mean you want.
function Engine:set_gradient_accumulation_boundary(is_boundary)
  if is_boundary ~= nil and type(is_boundary) ~= "boolean" then
    error("engine:set_gradient_accumulation_boundary: expected true, false or nil, got " .. tostring(is_boundary), 2)
  end
  if self.zenflow and is_boundary ~= nil then
    error("engine:set_gradient_accumulation_boundary: ZenFlow sets its own update windows (zenflow.update_interval)", 2)
  end
  self.forced_boundary = is_boundary
end

-- Scales the loss for accumulation (and fp16 loss scale) and runs backward through the engine.
function Engine:backward(loss)
  if not C.is_tensor(loss) then error("engine:backward(loss): loss must be the forward's scalar loss tensor, got " .. type(loss), 2) end
  local t0 = timer()
  dist.set_step(self.global_steps + 1)
  local scale = loss_grad_scale(self)
  if self.monitor then self.monitor:backward(loss, self.gas) end -- Train/Samples/train_loss
  local boundary = self:is_gradient_accumulation_boundary()
  self.zero:backward_begin(boundary)
  if self.zenflow then self.zenflow:before_backward(self.micro_steps) end
  -- Lua does not see tensor memory: collect forward temporaries that nothing references any more
  -- (only autograd's saved tensors stay), so they do not add to backward's peak. A full collection
  -- walks the whole Lua heap (0.2-1 ms; a tokenized dataset of 50k rows: ~130 ms), so it runs only
  -- when it could free more than 1/256 of the device's live bytes: zrun's models free their own
  -- temporaries when their forward returns (Module:temporaries_scope). The per-op profile
  -- (bench_llama breakdown=2) shows it as its own entry, not as the next op's.
  C.collect_tensor_garbage(self.device)
  C.autograd_profile_mark("lua gc (engine:backward)", self.device)
  local l = scale ~= 1 and loss * scale or loss
  self.in_backward = true
  l:backward()
  self.in_backward = false
  self.loss_weight = nil
  if self.z3trace then self.z3trace.recording = false end
  self.zero:backward_end()
  if self.zenflow then self.zenflow:after_backward(self.micro_steps, boundary) end
  self.timers.backward = self.timers.backward + (timer() - t0)
end

-- DeepSpeed's engine accessors: the batch sizes and accumulation the config resolved, ZeRO's stage, the
-- training precision, the last step's gradient norm (nil before the first) and whether that step was
-- applied (false when an fp16 overflow skipped it, or before any step).
function Engine:train_batch_size() return self.config.train_batch_size end
function Engine:train_micro_batch_size_per_gpu() return self.micro_batch end
function Engine:gradient_accumulation_steps() return self.gas end
function Engine:zero_optimization_stage() return self.stage end
function Engine:bfloat16_enabled() return self.precision == "bf16" end
function Engine:fp16_enabled() return self.precision == "f16" end
function Engine:get_global_grad_norm() return self.last_grad_norm end
function Engine:was_step_applied() return self.step_applied == true end

-- The learning rate of each optimizer param group, as the schedule last set it: {lr1, lr2, ...}.
function Engine:get_lr()
  local out = {}
  for i, g in ipairs(self.optimizer.param_groups) do out[i] = g.lr end
  return out
end

-- At the accumulation boundary: reduce, clip, optimizer step on the partition, refresh the
-- parameters, schedule, zero the gradients.
function Engine:step()
  local t0 = timer()
  local boundary = self:is_gradient_accumulation_boundary()
  local zf = self.zenflow
  if zf then zf:sync_lr(self:param_lrs()) end
  self.micro_steps = self.micro_steps + 1
  if not boundary then
    -- ZenFlow: every micro-step is a step of the selected columns, and the schedule steps with it
    if zf and self.lr_scheduler then self.lr_scheduler:step() end
    return false
  end
  local z = self.zero
  z:reduce()
  local inv = 1 / self.world_size
  if self.scaler then inv = inv / self.scaler.scale end
  local norm = z:grad_norm(inv)
  self.last_grad_norm = norm
  local overflow = norm ~= norm or norm == math.huge
  if overflow and self.scaler then
    self.last_grad_norm = math.huge -- DeepSpeed's global norm of a skipped step, NaN gradients or not
    self.step_applied = false
    self:update_scale(true)
    self.skipped_steps = self.skipped_steps + 1
    z:zero_grad()
    self.global_steps = self.global_steps + 1
    self.timers.step = self.timers.step + (timer() - t0)
    if self.monitor then self.monitor:step(self) end
    return true
  elseif overflow then
    error(fmt("gradient norm is %s at step %d: the loss diverged (try a lower learning rate or gradient_clipping)",
      tostring(norm), self.global_steps + 1), 0)
  end
  local coef = inv
  if self.clip and self.clip > 0 then
    local c = self.clip / (norm + 1e-6)
    if c < 1 then coef = coef * c end
  end
  self.opt_steps, self.step_applied = (self.opt_steps or 0) + 1, true
  -- ZenFlow's host update takes the micro-step count for its bias correction, as DeepSpeed's does
  local pb = zf and self:param_betas()
  if zf and (pb[1] ~= self.hp.betas[1] or pb[2] ~= self.hp.betas[2]) then
    error("ZenFlow with a scheduler that moves the betas (OneCycle's cycle_momentum): ZenFlow's updates take the " ..
      "config's betas; set scheduler.params.cycle_momentum = false", 0)
  end
  if zf and zf.overlap then zf:host_step(coef, self.micro_steps - 1, self:param_lrs())
  else
    local b = self:param_betas()
    z:step(coef, zf and self.micro_steps or self.opt_steps, self:param_lrs(), b[1], b[2], self.hp.eps, self.hp.extra)
  end
  if zf then zf:after_cpu_step(self.micro_steps - 1) end
  if self.scaler then self:update_scale(false) end
  if self.lr_scheduler then self.lr_scheduler:step() end
  z:zero_grad()
  self.global_steps = self.global_steps + 1
  self.timers.step = self.timers.step + (timer() - t0)
  if self.monitor then self.monitor:step(self) end
  if self.steps_per_print and self.steps_per_print > 0 and self.global_steps % self.steps_per_print == 0 then
    self:report()
  end
  return true
end

-- The learning rate of each parameter: its group's, as the scheduler (or the user) left it; a
-- single number when every group has the same one.
function Engine:param_lrs()
  local groups, gidx = self.optimizer.param_groups, self.group_of
  local lr1, same = groups[1].lr, true
  for _, g in ipairs(groups) do
    if type(g.lr) ~= "number" then error(fmt("optimizer param group lr must be a number, got %s", tostring(g.lr)), 0) end
    same = same and g.lr == lr1
  end
  if same then return lr1 end
  local out = {}
  for i = 1, #gidx do out[i] = groups[gidx[i]].lr end
  return out
end

-- The optimizer's betas for this step: the config's, or the ones a scheduler set on the param groups
-- (OneCycle's cycle_momentum moves beta1 each step, as DeepSpeed's does through its param groups), which
-- every group must then share.
function Engine:param_betas()
  local groups = self.optimizer.param_groups
  local b = groups[1].betas
  if type(b) ~= "table" then return self.hp.betas end
  for _, g in ipairs(groups) do
    if type(g.betas) ~= "table" or g.betas[1] ~= b[1] or g.betas[2] ~= b[2] then
      error("optimizer param groups with different betas: the engine steps every group with one pair", 0)
    end
  end
  return b
end

-- fp16: DeepSpeed's dynamic loss scaling after a step (DynamicLossScaler.update_scale, 0.19.8).
-- An overflow spends one unit of `hysteresis`, or, with none left, halves the scale down to
-- min_loss_scale; an overflow at min_loss_scale ends the run, as DeepSpeed's "Current loss scale
-- already at minimum" does (the gradients are inf/NaN at any scale: training would only skip
-- steps). A good step after loss_scale_window good steps since the last overflow (not counting
-- itself) doubles the scale and refills the hysteresis. Without ZeRO (stage 0) DeepSpeed's
-- FP16_Optimizer._update_scale instead: no hysteresis, and at min_loss_scale it skips on.
function Engine:update_scale(overflow)
  local s = self.scaler
  if not s.dynamic then
    if overflow then dist.print0(fmt("[zrun] OVERFLOW! Skipping step with static loss scale %g", s.scale)) end
    return
  end
  if overflow then
    local old = s.scale
    if s.cur_hysteresis > 1 then
      dist.print0(fmt("[zrun] OVERFLOW! Rank %d Skipping step. Attempted loss scale: %.0f, but hysteresis is %d. " ..
        "Reducing hysteresis to %d", self.global_rank, old, s.cur_hysteresis, s.cur_hysteresis - 1))
      s.cur_hysteresis = s.cur_hysteresis - 1
    elseif old <= s.min_scale and not s.no_zero then
      error(fmt("fp16: the gradients overflow at step %d with the loss scale already at fp16.min_loss_scale (%g): " ..
        "they are inf/NaN at any scale, so the loss diverged (DeepSpeed stops here too); lower the learning rate, " ..
        "add gradient_clipping, or train in bf16", self.global_steps + 1, old), 0)
    elseif old <= s.min_scale then
      dist.print0(fmt("[zrun] OVERFLOW! Skipping step %d at fp16.min_loss_scale (%g): the gradients are inf/NaN at " ..
        "any scale (DeepSpeed without ZeRO skips on too); lower the learning rate or train in bf16",
        self.global_steps + 1, old))
    else
      s.scale = math.max(old / 2, s.min_scale)
      dist.print0(fmt("[zrun] OVERFLOW! Rank %d Skipping step. Attempted loss scale: %.0f, reducing to %.0f",
        self.global_rank, old, s.scale))
    end
    s.good = 0
  else
    s.good = s.good + 1 -- good steps since the last overflow, this one included
    if s.good > 1 and (s.good - 1) % s.window == 0 then
      s.scale = s.scale * 2
      s.cur_hysteresis = s.hysteresis
    end
  end
end

-- The steps_per_print line (step, skipped steps, lr, gradient norm, loss scale) and, with
-- wall_clock_breakdown, the forward/backward/step times since the last report; rank 0 prints.
function Engine:report()
  local lr = self:get_lr()[1]
  local line = fmt("step=%d, skipped=%d, lr=%s", self.global_steps, self.skipped_steps, tostring(lr))
  if self.last_grad_norm then line = line .. fmt(", grad_norm=%.4f", self.last_grad_norm) end
  if self.scaler then line = line .. fmt(", loss_scale=%g", self.scaler.scale) end
  dist.print0("[zrun] " .. line)
  if self.wall_clock_breakdown then
    local t = self.timers
    dist.print0(fmt("[zrun] time (ms) | forward: %.2f | backward: %.2f | step: %.2f",
      t.forward * 1000, t.backward * 1000, t.step * 1000))
    t.forward, t.backward, t.step = 0, 0, 0
    if self.monitor then self.monitor:timers_reset() end
  end
end

-- The model's training / evaluation mode (dropout); engine:parameters() lists the trained parameters.
function Engine:train() self.module:train(); return self end
function Engine:eval() self.module:eval(); return self end
function Engine:parameters() return self.params end

-- Checkpoints live in zrun.checkpoint (save/load, resharding, zero-to-fp32).
function Engine:save_checkpoint(dir, tag, client_state, ...)
  if select("#", ...) > 0 then -- (DeepSpeed's save_latest and exclude_frozen_parameters: refused, not dropped)
    error("save_checkpoint(dir, tag, client_state): DeepSpeed's further arguments (save_latest, " ..
      "exclude_frozen_parameters) are not implemented: every save rewrites `latest` and holds every parameter", 2)
  end
  return require("zrun.checkpoint").save(self, dir, tag, client_state)
end
-- Returns client_state and the tag folder it loaded (DeepSpeed returns them the other way round);
-- tag defaults to dir/latest; opts: DeepSpeed's load_optimizer_states, load_lr_scheduler_states,
-- load_module_only, load_module_strict (zrun.checkpoint.load). Collective: every rank calls it.
function Engine:load_checkpoint(dir, tag, opts)
  return require("zrun.checkpoint").load(self, dir, tag, opts)
end
-- A Hugging Face model folder with the weights in the training dtype (zrun.checkpoint.save_16bit_model).
function Engine:save_16bit_model(dir, opts)
  return require("zrun.checkpoint").save_16bit_model(self, dir, opts)
end

return M
