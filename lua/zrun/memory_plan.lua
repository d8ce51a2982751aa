-- zr.memory.plan{...}: the per-rank peak of every memory category (params, grads, optimizer,
-- activations, comm, workspace) on the training device and in host memory, predicted from the
-- model config and the DeepSpeed config before anything is allocated, following what zrun's
-- engine (runtime/zero/engine.c, lua/zrun/engine.lua) and ops actually allocate — not DeepSpeed's
-- rules of thumb. Activations come from replaying the Llama forward and backward on a model of
-- the autograd tape (which op allocates what, what each node saves, when backward frees it).
-- Also `fit` advice (which settings fit a GPU) and the `zrun plan` command.
local E = require "zrun.memory_estimate"
local llama_activations = require("zrun.memory_sim").llama_activations
local Off = require "zrun.memory_offload"

local M = {}
local fmt, floor, ceil, max, min, concat = string.format, math.floor, math.ceil, math.max, math.min, table.concat

-- When Lua collects the tensors a step leaves behind. LuaJIT's collector does not see tensor
-- memory, so an op's output lives until it is freed, not until its last use. In every mode the
-- Llama forward frees what it made and does not return when it returns, and zr.checkpoint a
-- segment's tensors right after its no-grad forward and after its recomputation + backward (a
-- checkpointed model holds the segment inputs plus one segment's activations); then:
--   "backward" what zrun does: engine:backward collects right before loss:backward() when that
--              could free more than 1/256 of the device's live bytes;
--   "none"     a what-if with no collection during a step;
--   "ideal"    a what-if where tensors die with their last Lua reference (as with refcounting).
-- The step modelled is a plain loop (out = engine(ids, ids); engine:backward(out.loss);
-- engine:step()), so the previous step's batch, hidden states and loss are garbage until a
-- collection (the Trainer frees its own at once).
M.DEFAULT_GC = "backward"

local DTYPE_BYTES = { f32 = 4, float32 = 4, bf16 = 2, bfloat16 = 2, f16 = 2, fp16 = 2, float16 = 2 }
local function canon_dtype(d)
  if d == "float32" then return "f32" end
  if d == "bfloat16" then return "bf16" end
  if d == "fp16" or d == "float16" then return "f16" end
  return d
end

local human = require("zrun.format").human

-- ---------------------------------------------------------------------------------------------
-- The plan
-- ---------------------------------------------------------------------------------------------

local function parse_bytes(s)
  if type(s) == "number" then return s end
  local n, u = tostring(s):match("^%s*([%d%.]+)%s*(%a*)%s*$")
  n = tonumber(n)
  if not n then error(fmt("cannot read '%s' as a memory size (e.g. 80GB, 24GiB, 512MB)", tostring(s)), 0) end
  u = u:lower()
  local mult = ({ [""] = 1, b = 1, k = 2 ^ 10, kb = 2 ^ 10, kib = 2 ^ 10, m = 2 ^ 20, mb = 2 ^ 20, mib = 2 ^ 20,
    g = 2 ^ 30, gb = 2 ^ 30, gib = 2 ^ 30, t = 2 ^ 40, tb = 2 ^ 40, tib = 2 ^ 40 })[u]
  if not mult then error(fmt("unknown memory unit '%s' in '%s' (use GB, GiB, MB, ...)", u, s), 0) end
  return floor(n * mult)
end
M.parse_bytes = parse_bytes

-- Settings from the arguments and the DeepSpeed config (arguments win).
local function settings(o, cfg_model)
  local W = o.world_size or ((o.gpus_per_node or 1) * (o.nodes or o.num_nodes or 1))
  local ds = {}
  if o.config then
    ds = require("zrun.config").load(o.config, { world_size = W, hidden_size = cfg_model.hidden_size or cfg_model.n_embd })
  end
  local zc = ds.zero_optimization or {}
  local s = { world_size = W, gpus_per_node = o.gpus_per_node or W, nodes = o.nodes or o.num_nodes or 1 }
  s.stage = o.stage or zc.stage or 0
  s.offload_optimizer = o.offload_optimizer
  if s.offload_optimizer == nil then s.offload_optimizer = zc.offload_optimizer and zc.offload_optimizer.device == "cpu" or false end
  -- the optimizer's f32 states beside the master weights: AdamW and Lamb 2, Lion/Adagrad 1, SGD 1 with momentum
  local op = ds.optimizer
  s.opt_states = o.opt_states or not op and 2 or (op.type == "Lion" or op.type == "Adagrad") and 1 or
    op.type == "SGD" and ((op.params.momentum or 0) ~= 0 and 1 or 0) or 2
  s.offload_param = o.offload_param
  if s.offload_param == nil then s.offload_param = zc.offload_param and zc.offload_param.device == "cpu" or false end
  -- offload_optimizer.ratio (the share of the optimizer states on the host), pin_memory, and where
  -- the gradients live (ZRUN_OFFLOAD_GRADS / offload_grads: device, host, or auto by GPU memory)
  local oo = zc.offload_optimizer or {}
  s.offload_ratio = o.offload_ratio or oo.ratio or 1
  if type(s.offload_ratio) ~= "number" or s.offload_ratio < 0 or s.offload_ratio > 1 then
    error(fmt("memory plan: offload_optimizer.ratio must be between 0 and 1, got %s", tostring(s.offload_ratio)), 0)
  end
  -- ratio < 1 works at stages 1-3 (config.lua warns below stage 3, where DeepSpeed refuses it)
  s.pin_memory = o.pin_memory
  if s.pin_memory == nil then s.pin_memory = oo.pin_memory ~= false end
  -- offload_param.pin_memory (DeepSpeed's default true): the host parameter shard page-locked on a GPU
  s.param_pin_memory = o.param_pin_memory
  if s.param_pin_memory == nil then
    s.param_pin_memory = not zc.offload_param or zc.offload_param.pin_memory ~= false
  end
  s.offload_grads = Off.grads_setting(o.offload_grads)
  s.device = o.device or "cuda"
  -- a CPU run keeps the gradients with the master unless told (engine.lua offload_grads_place)
  if s.device == "cpu" and s.offload_grads == "auto" then s.offload_grads = "host" end
  -- below ratio 1 the device part reads the gradients on the device (engine.lua offload_grads_place)
  if s.offload_optimizer and s.offload_ratio < 1 then
    if s.offload_grads == "host" then
      error(fmt("memory plan: offload_optimizer.ratio = %g keeps the gradients on the GPU; offload_grads host " ..
        "needs ratio 1", s.offload_ratio), 0)
    end
    s.offload_grads = "device"
  end
  -- ZenFlow (zrun.zenflow) reads each micro-batch's gradient on the device: the gradients stay there
  s.zenflow = type(zc.zenflow) == "table" and zc.zenflow or nil
  if s.zenflow and s.offload_optimizer and s.device ~= "cpu" then
    if s.offload_grads == "host" then
      error("memory plan: zero_optimization.zenflow keeps the gradients on the GPU; offload_grads host is refused with it", 0)
    end
    s.offload_grads = "device"
  end
  -- overlap_comm: DeepSpeed's default is on at stage 3 and off below (zrun follows the config)
  if o.overlap_comm ~= nil then s.overlap_comm = o.overlap_comm
  elseif type(zc.overlap_comm) == "boolean" then s.overlap_comm = zc.overlap_comm
  else s.overlap_comm = s.stage == 3 end
  -- a value given here or in the config, else DeepSpeed's default (from config.lua, its one home)
  local function zero(opt, key)
    local v = o[opt] or zc[key]
    if type(v) == "number" then return v end
    return require("zrun.config").default("zero_optimization." .. key)
  end
  s.persistence_threshold = zero("persistence_threshold", "stage3_param_persistence_threshold")
  s.prefetch_bucket_size = zero("prefetch_bucket_size", "stage3_prefetch_bucket_size")
  s.max_live_parameters = zero("max_live_parameters", "stage3_max_live_parameters")
  s.max_reuse_distance = zero("max_reuse_distance", "stage3_max_reuse_distance")
  s.reduce_bucket_size = zero("reduce_bucket_size", "reduce_bucket_size")
  s.allgather_bucket_size = zero("allgather_bucket_size", "allgather_bucket_size")
  local dt = o.dtype
  if not dt then
    if ds.bf16 and ds.bf16.enabled == true then dt = "bf16"
    elseif ds.fp16 and ds.fp16.enabled == true then dt = "f16"
    else dt = "f32" end
  end
  s.dtype = canon_dtype(dt)
  s.dtype_bytes = DTYPE_BYTES[s.dtype]
  if not s.dtype_bytes then error(fmt("memory plan: dtype must be f32, bf16 or f16, got '%s'", tostring(dt)), 0) end
  -- gradient buckets (zero.c): communication_data_type, else the parameters' dtype; fp32 in a
  -- single process, which communicates nothing
  local function ds_bytes(v) -- a DeepSpeed dtype name ("fp16", "bf16", "fp32") or a zrun one
    return type(v) == "string" and DTYPE_BYTES[canon_dtype(({ fp16 = "f16", fp32 = "f32" })[v] or v)] or nil
  end
  local cdt = o.communication_data_type or ds.communication_data_type
  s.comm_bytes = W == 1 and 4 or cdt and ds_bytes(cdt) or s.dtype_bytes
  -- the gradient partition (and stage 0-1's full .grad): data_types.grad_accum_dtype, else fp32
  -- bf16.bf16_master_weights_and_grads / bf16_optimizer_states (o.master_dtype, o.state_dtype: "bf16"):
  -- the master partition and its gradients, and the optimizer's states, in 2 bytes instead of 4
  local Eng = require "zrun.engine" -- the config's rule, as the engine applies it
  local mdt = o.master_dtype or Eng.master_dtype(ds)
  local sdt = o.state_dtype or Eng.state_dtype(ds)
  s.master_bytes, s.state_bytes = ds_bytes(mdt) or 4, ds_bytes(sdt) or 4
  local gad = o.grad_accum_dtype or (ds.data_types and ds.data_types.grad_accum_dtype) or
    (s.master_bytes == 2 and "bf16" or nil)
  s.grad_bytes = ds_bytes(gad) or 4
  local mb = o.micro_batch or ds.train_micro_batch_size_per_gpu
  s.micro_batch = type(mb) == "number" and mb or 1
  s.seq_len = o.seq_len or 1024
  s.gradient_checkpointing = o.gradient_checkpointing and true or false
  if o.loss_type ~= nil and o.loss_type ~= "nll" and o.loss_type ~= "dft" and o.loss_type ~= "chunked_nll" then
    error(fmt("memory plan: loss_type must be \"nll\", \"chunked_nll\" or \"dft\", got %s", tostring(o.loss_type)), 0)
  end
  s.loss_type = o.loss_type == "dft" and "dft" or nil
  -- chunked_loss (the models' forward option: use_liger_kernel, TRL's chunked_nll): the LM head and loss without
  -- the logits, a slice of the vocabulary at a time (true: the default slices; a number: its columns)
  local cl = o.chunked_loss or (o.loss_type == "chunked_nll" or nil)
  if cl ~= nil and cl ~= false and cl ~= true and not (type(cl) == "number" and cl >= 1 and cl % 1 == 0) then
    error(fmt("memory plan: chunked_loss must be true or a whole number of vocabulary columns, got %s", tostring(cl)), 0)
  end
  if cl and s.loss_type then error("memory plan: chunked_loss computes the plain loss; loss_type dft needs the logits", 0) end
  s.chunked_loss = cl or nil
  -- padding-free batches (packed sequences, TRL's bfd packing or padding_free): packed = the sequences' length
  -- (true: seq_len): on the segments (the CPU; a GPU at head_dim 64, 128, 256 or padded between 64 and 128, in 16 bits) the per-token rope rows and the
  -- segments, elsewhere the attention's row gathers, counted for sequences of that one length
  s.packed = o.packed == true and s.seq_len or o.packed or nil
  if s.packed and (type(s.packed) ~= "number" or s.packed < 1 or s.packed % 1 ~= 0 or
      (s.micro_batch * s.seq_len) % s.packed ~= 0) then
    error(fmt("memory plan: packed must be true or a sequence length dividing micro_batch x seq_len = %d, got %s",
      s.micro_batch * s.seq_len, tostring(o.packed)), 0)
  end
  s.gc = o.gc or M.DEFAULT_GC
  s.gas = type(ds.gradient_accumulation_steps) == "number" and ds.gradient_accumulation_steps or 1
  if s.stage < 0 or s.stage > 3 or s.stage ~= floor(s.stage) then
    error("memory plan: zero_optimization.stage must be 0, 1, 2 or 3, got " .. tostring(s.stage), 0)
  end
  if s.offload_param and s.stage ~= 3 then
    error("memory plan: zero_optimization.offload_param needs stage 3 (got stage " .. s.stage .. ")", 0)
  end
  if s.offload_optimizer and s.stage == 0 then
    error("memory plan: zero_optimization.offload_optimizer needs stage 1, 2 or 3", 0)
  end
  if s.seq_len < 2 then error("memory plan: seq_len must be at least 2 (the causal LM loss shifts by one)", 0) end
  if s.micro_batch < 1 or s.micro_batch ~= floor(s.micro_batch) or s.micro_batch == math.huge then
    error("memory plan: micro_batch must be a positive integer, got " .. tostring(s.micro_batch), 0)
  end
  return s
end

-- LoRA (zr.peft, PEFT's adapters): o.lora = { r =, target_modules = {...} | "all-linear" | a regex, lora_dropout = },
-- or a zr.peft.LoraConfig. Returns nil without it, else { r =, dropout =, targets = {<module name> = {in, out}},
-- names = (the adapted projections' last components, sorted), adapters = {{numel =, module =}} (lora_A then lora_B
-- of each target, in the model's order: the trained parameters), trained =, frozen = (the base's elements) }.
-- The base list is the config's (a live PEFT model lists its adapters among its parameters).
local PROJ = { q_proj = "q", k_proj = "k", v_proj = "v", o_proj = "o", gate_proj = "g", up_proj = "u", down_proj = "d",
  qkv_proj = "qkv", gate_up_proj = "gu" } -- (Phi-3's fused modules)
M.LORA_DEFAULT_TARGETS = { "q_proj", "v_proj" } -- (PEFT's for the Llama family)
local function lora_setting(lo, cfg, name)
  if lo == nil or lo == false then return nil end
  if lo.adapters and lo.frozen then return lo end -- (a plan's settings.lora_plan, handed back by fit)
  if type(lo) ~= "table" then
    error(fmt("memory plan: lora must be a table { r =, target_modules =, lora_dropout = } or a zr.peft.LoraConfig, " ..
      "got %s", type(lo)), 0)
  end
  if E.family(cfg) == "gpt2" then
    error("memory plan: lora is planned for the Llama family only (gpt2's activations are not modelled); plan " ..
      "without lora for its model states", 0)
  end
  local r, p, tm = lo.r, lo.lora_dropout or 0, lo.target_modules
  if type(r) ~= "number" or r < 1 or r % 1 ~= 0 or r == math.huge then
    error(fmt("memory plan: lora.r must be a positive integer (the adapters' rank, e.g. 16), got %s", tostring(r)), 0)
  end
  if type(p) ~= "number" or p < 0 or p >= 1 then
    error(fmt("memory plan: lora.lora_dropout must be a number in [0, 1), got %s", tostring(p)), 0)
  end
  -- (what the plan does not model: whole modules and biases trained beside the adapters, ranks per module; the
  -- Trainer then plans a full fine-tune, an upper bound, and says so)
  for _, k in ipairs { "modules_to_save", "rank_pattern" } do
    if type(lo[k]) == "table" and next(lo[k]) ~= nil then
      error(fmt("memory plan: lora.%s is not planned (the plan knows adapters of one rank r only); plan without " ..
        "lora for an upper bound (a full fine-tune)", k), 0)
    end
  end
  if lo.bias ~= nil and lo.bias ~= "none" then
    error(fmt("memory plan: lora.bias = \"%s\" is not planned (trained biases); plan without lora for an upper " ..
      "bound (a full fine-tune)", tostring(lo.bias)), 0)
  end
  local ex, lt = lo.exclude_modules, lo.layers_to_transform
  if type(lt) == "number" then lt = { lt } end
  if type(lt) == "table" and next(lt) == nil then lt = nil end
  if lt and type(lt) ~= "table" or ex and type(ex) ~= "table" and type(ex) ~= "string" then
    error("memory plan: lora.layers_to_transform must be layer numbers and exclude_modules names or a regex", 0)
  end
  if tm == nil or tm == false then tm = M.LORA_DEFAULT_TARGETS end
  local all = type(tm) == "string" and tm:lower() == "all-linear"
  if type(tm) ~= "table" and type(tm) ~= "string" then
    error(fmt("memory plan: lora.target_modules must be a list of module names, \"all-linear\" or a regex, got %s",
      type(tm)), 0)
  end
  local function listed(l, key)
    for _, t in ipairs(l) do
      if type(t) ~= "string" then error("memory plan: lora.target_modules must list module names (strings)", 0) end
      if key == t or key:sub(-#t - 1) == "." .. t then return true end
    end
    return false
  end
  local function match(key) -- PEFT's check_target_module_exists: exclusions, a name list by suffix, a string whole,
    -- then the layer numbers (the Llama family's layer list: model.layers.<i>)
    if type(ex) == "string" and require("zrun.peft").fullmatch(ex, key) or type(ex) == "table" and listed(ex, key) then
      return false
    end
    if lt then
      local i = tonumber(key:match("^model%.layers%.(%d+)%."))
      local hit = false
      for _, v in ipairs(lt) do if v == i then hit = true end end
      if not hit then return false end
    end
    if all then return PROJ[key:match("[^.]+$")] ~= nil end
    if type(tm) == "string" then return require("zrun.peft").fullmatch(tm, key) end
    return listed(tm, key)
  end
  local L = { r = r, dropout = p, targets = {}, adapters = {}, trained = 0, frozen = 0 }
  local seen, names = {}, {}
  for _, q in ipairs(E.param_list({ config = cfg, name = name })) do
    L.frozen = L.frozen + q.numel
    if q.name:match("%.weight$") and #q.shape == 2 and match(q.module) then
      local last = q.module:match("[^.]+$")
      if not PROJ[last] then
        error(fmt("memory plan: lora target %s is not planned (the plan adapts the attention and MLP projections, " ..
          "q_proj ... down_proj, Phi-3's qkv_proj and gate_up_proj); leave it out of target_modules", q.module), 0)
      end
      local out, inn = q.shape[1], q.shape[2]
      L.targets[q.module] = { inn, out }
      for _, n in ipairs { r * inn, out * r } do
        L.adapters[#L.adapters + 1] = { numel = n, module = q.module }
        L.trained = L.trained + n
      end
      if not seen[last] then seen[last] = true; names[#names + 1] = last end
    end
  end
  if #L.adapters == 0 then
    error(fmt("memory plan: lora.target_modules {%s} matches no projection of this model (q_proj, k_proj, v_proj, " ..
      "o_proj, gate_proj, up_proj, down_proj; Phi-3's qkv_proj, gate_up_proj)", type(tm) == "table" and concat(tm, ", ") or tm), 0)
  end
  table.sort(names, function(a, b)
    local order = { q_proj = 1, k_proj = 2, v_proj = 3, qkv_proj = 3.5, o_proj = 4, gate_proj = 5, up_proj = 6,
      gate_up_proj = 6.5, down_proj = 7 }
    return order[a] < order[b]
  end)
  L.names = names
  return L
end

local CATS = { "params", "grads", "optimizer", "activations", "comm", "workspace" }
M.categories = CATS

-- One plan for settings s whose gradient placement is settled (counted: E.count's results).
local function build(o, s, counted)
  local total, largest, list, r = unpack(counted)
  local cfg = r.config or {}
  -- LoRA: the engine's partitions, gradients, master, optimizer states and buckets hold the adapters only
  -- (engine.lua flatten_groups keeps frozen parameters out of ZeRO); the frozen base stays whole on every rank,
  -- in the model's dtype (zr.initialize casts every parameter), with no gradient, at stage 3 too
  local lora = s.lora_plan
  local frozen = 0
  if lora then
    list, frozen, total = lora.adapters, lora.frozen, lora.frozen + lora.trained
  end
  local trained = total - frozen -- (the parameters ZeRO holds)
  local W, b = s.world_size, s.dtype_bytes
  local Wc = s.stage == 0 and 1 or W -- chunks per parameter (zero.c: stage 0 keeps W = 1)
  -- stage 3 in one process with the parameters on their device (zero.c: solo3): nothing to
  -- gather, so the engine keeps every parameter resident and runs as stage 2's direct mode
  -- (stage3_gather = true, or ZRUN_STAGE3_GATHER=1: the partitioned path even in one process)
  local g3 = o.stage3_gather
  if g3 == nil then g3 = (os.getenv("ZRUN_STAGE3_GATHER") or "0"):match("^0?$") == nil end
  local stage = (s.stage == 3 and Wc == 1 and not s.offload_param and (not s.offload_optimizer or s.device == "cpu")
    and not g3) and 2 or s.stage
  local S, max_c, maxn, maxn2 = 0, 0, 0, 0
  for _, p in ipairs(list) do
    local c = ceil(p.numel / Wc)
    S = S + c
    if c > max_c then max_c = c end
    if p.numel > maxn then maxn, maxn2 = p.numel, maxn
    elseif p.numel > maxn2 then maxn2 = p.numel end
  end
  local dev = { params = 0, grads = 0, optimizer = 0, activations = 0, comm = 0, workspace = 0 }
  local host = { params = 0, grads = 0, optimizer = 0, activations = 0, comm = 0, workspace = 0 }
  local notes = {}
  local offload_gpu = s.offload_optimizer and s.device ~= "cpu" -- the master on the host, the parameters on a GPU

  -- comm buckets (zero.c): their size, in partition elements per rank
  local cap = floor(s.reduce_bucket_size / Wc)
  if cap < max_c then cap = max_c end
  if cap > S then cap = S end
  -- the stage 1-2 all-gather of the new weights (engine.c gather_cap): allgather_bucket_size elements
  local gcap = min(max(floor(s.allgather_bucket_size / Wc), max_c), S)
  -- model states (zero.c: zr_zero_new)
  local pinned = 0
  if s.offload_optimizer then -- memory_offload.lua's table, by where the gradients live
    pinned = Off.place(s, S, cap, dev, host)
  else
    -- the master and the optimizer's states (AdamW: exp_avg, exp_avg_sq): fp32, or bf16 (bf16 section)
    dev.optimizer = S * (s.master_bytes + s.opt_states * s.state_bytes)
    dev.grads = S * s.grad_bytes -- reduced gradient partition (fp32 unless grad_accum_dtype)
  end
  if s.zenflow then -- zrun.zenflow: the selected columns' f32 moments (1-D parameters whole) on the device,
    -- and their gradients' reduction buffer
    local zf, bytes, most = s.zenflow, 0, 0
    for _, p in ipairs(list) do
      local sh = p.shape
      local n = (sh and #sh == 2) and sh[1] * floor((zf.topk_ratio or 0.1) * sh[2]) or p.numel
      bytes, most = bytes + 3 * 4 * n, math.max(most, n)
    end
    local line
    if zf.offload then -- the moments on the host; one weight's visit the device at its update
      local moments = bytes * 2 / 3
      dev.optimizer = dev.optimizer + bytes / 3 + 2 * 4 * most
      host.optimizer = host.optimizer + moments
      line = fmt("ZenFlow: the selected columns' gradients %s on the GPU, their moments %s on the host (offload; " ..
        "one weight's %s on the GPU at a time)", human(bytes / 3), human(moments), human(2 * 4 * most))
    else
      dev.optimizer = dev.optimizer + bytes
      line = fmt("ZenFlow: the selected columns' moments and gradients, %s on the GPU", human(bytes))
    end
    if s.stage == 2 and W > 1 then -- engine.c's keep_grads: each micro-step's .grad stays until the next
      dev.grads = dev.grads + trained * s.grad_bytes
      line = line .. fmt("; the micro-step's whole gradient %s (read after backward)", human(trained * s.grad_bytes))
    end
    if zf.update_interval == nil or zf.update_interval == "auto" then -- zrun.zenflow's judge: each micro-step's
      -- own gradient mass; one rank keeps the last micro-step's sum of every measured weight (f32), several
      -- ranks up to two f32 copies during backward (the window's sum before it, the reduced difference)
      local measured = 0
      for _, p in ipairs(list) do
        local sh = p.shape
        if sh and #sh == 2 and sh[1] > 1 then measured = measured + p.numel end
      end
      local copies = W > 1 and 2 or 1
      dev.grads = dev.grads + copies * 4 * measured
      line = line .. fmt("; update_interval auto: %s the micro-step's gradient mass needs (%s)",
        human(copies * 4 * measured),
        W > 1 and "up to two f32 copies of the measured weights' gradients during backward" or
        "the last micro-step's gradients of the measured weights, kept")
    end
    if zf.overlap_step then -- engine_async.c's background step: the window's gradient snapshot on the device,
      -- a second moment set and the new weights waiting for the next boundary on the host
      dev.grads = dev.grads + S * s.grad_bytes
      host.optimizer = host.optimizer + 2 * S * 4
      host.params = host.params + S * b
      line = line .. fmt("; overlap_step: the window's gradients %s on the GPU, a second moment set %s and the " ..
        "new weights %s on the host", human(S * s.grad_bytes), human(2 * S * 4), human(S * b))
    end
    notes[#notes + 1] = line
  end
  -- direct mode (zero.c): one chunk per parameter and the partition on the device: .grad are views
  -- into the partition, weights views into one flat buffer, no reduce buckets
  local direct = Wc == 1 and stage <= 2 and (not offload_gpu or s.offload_grads == "device")
  if stage <= 1 and not direct then dev.grads = dev.grads + trained * s.grad_bytes end -- full .grad per parameter
  if stage <= 2 then
    dev.params = total * b
  else -- the 16-bit shard; gathered parameters are added below (one module's at a time)
    local shard = s.offload_param and host or dev
    shard.params = shard.params + S * b
    dev.params = dev.params + frozen * b -- (a frozen base is neither partitioned nor offloaded)
    if s.offload_param and s.param_pin_memory and s.device ~= "cpu" then -- engine.c pin_shard
      pinned = pinned + S * b
    end
    -- parameters below stage3_param_persistence_threshold are never released (zero.c)
    for _, p in ipairs(list) do
      if p.numel < s.persistence_threshold then dev.params = dev.params + p.numel * b end
    end
  end
  -- comm buckets (zero.c): send W*cap in the comm dtype, plus compaction copy and receive buffer
  -- when W > 1
  local cb = s.comm_bytes
  dev.comm = direct and 0 or (cap * Wc * cb + (Wc > 1 and (cap * Wc * cb + cap * cb) or 0))
  -- overlap_comm keeps a second buffer set so a bucket can be reduced while the next one fills
  if s.overlap_comm and Wc > 1 and not direct then dev.comm = dev.comm * 2 end
  -- transient: the all-gather of updated weights at the optimizer step (stages 1-2 over several
  -- ranks); stage 3 all-gathers straight into the parameters' storage (counted as params), but
  -- with offload_param the host shard's slice is staged on the device first (during forward and
  -- backward)
  local step_comm, fb_comm = 0, 0
  if Wc > 1 and stage <= 2 then step_comm = gcap * b + gcap * Wc * b end
  if stage == 3 and s.offload_param then fb_comm = ceil(maxn / Wc) * b end
  local states = { params = dev.params, grads = dev.grads, optimizer = dev.optimizer, comm = dev.comm }
  dev.comm = dev.comm + max(step_comm, fb_comm)

  -- activations
  local act
  local function states_bytes(st, h) -- what the device holds besides the step's own tensors
    local n = st.params + st.grads + st.optimizer + st.comm
    if h then n = n + h.params + h.grads + h.optimizer + h.comm end -- a CPU run: the same memory
    return n
  end
  -- a sliding window that masks keys (a sequence longer than it) runs on the segments (llama.lua), where they
  -- run: the CPU, a GPU's flash kernels at head_dim 64, 128, 256 or padded between 64 and 128, in 16 bits; elsewhere plain rows run the
  -- composition masked by each row's window and packed ones are refused (noted below)
  local window, window_refused
  if not o.param_numels and E.family(cfg) ~= "gpt2" then
    local fam = E.family(cfg) == "gemma3_text" and "gemma3_text" or nil
    local ok, nc = pcall(function() return require("zrun.models.llama").normalize_config(cfg, fam) end)
    local w, full
    if ok and nc then w, full = require("zrun.models.hf_config").attention_window(nc) end
    if w and (s.packed or s.seq_len) > w then
      local D = cfg.head_dim or floor(cfg.hidden_size / cfg.num_attention_heads)
      if s.device == "cpu" or (require("zrun.memory_sim").flash_dim(D) and b == 2) then
        window = { size = w, full = full, sliding = {} }
        for l = 1, nc.num_hidden_layers do
          window.sliding[l] = require("zrun.models.hf_config").layer_window(nc, l) ~= nil
        end
      else window_refused = w end
    end
  end
  if o.param_numels then -- model states only (zr.initialize's host check: any nn.Module)
  elseif E.family(cfg) ~= "gpt2" then
    act = llama_activations(cfg, { micro_batch = s.micro_batch, seq_len = s.seq_len, dtype_bytes = b,
      stage = stage, stage3 = stage == 3, gradient_checkpointing = s.gradient_checkpointing, gc = s.gc,
      loss_type = s.loss_type, chunked_loss = s.chunked_loss, packed = s.packed, lora = lora, window = window,
      direct = direct, persistence_threshold = s.persistence_threshold,
      prefetch = s.prefetch_bucket_size, max_live = s.max_live_parameters, max_reuse = s.max_reuse_distance,
      dw_in_place = direct and s.device ~= "cpu", gpu = s.device ~= "cpu", trace = o.trace,
      states_bytes = states_bytes(states, s.device == "cpu" and host) })
    dev.activations = act.activations
    dev.grads = dev.grads + act.leaf_grads
    dev.workspace = act.workspace
  else
    notes[#notes + 1] = "activations are modelled for the Llama family only; gpt2 shows model states"
  end
  if stage == 3 then
    -- ZeRO-3 gathers a module's parameters (full size, 16-bit, on the device) for its forward and
    -- again for its backward, and releases them after; saved weights are the parameters
    -- themselves, so nothing pins a released copy. The embedding (its input needs no gradient)
    -- and a tied LM head (fetched outside its module) stay gathered until backward ends.
    local gathered = act and act.gathered or (maxn + (cfg.tie_word_embeddings and maxn2 or 0)) * b
    dev.params = dev.params + gathered
  end
  -- engine:step: the global gradient norm reads the fp32 partition once (a fused kernel on the
  -- GPU, an OpenMP reduction on the host): no temporary
  if s.device == "cpu" and b ~= 4 then
    notes[#notes + 1] = "16-bit on the CPU: ops widen inputs to fp32 copies that this plan does not count"
  end
  if window_refused and s.packed then
    notes[#notes + 1] = fmt("%s: a packed sequence of %d tokens is longer than sliding_window (%d), and zrun's attention " ..
      "windows packed sequences only on the CPU or a GPU in bf16/f16 at head_dim 64, 128, 256 or a multiple of 8 between 64 and 128, " ..
      "so training refuses it here", cfg.model_type, s.packed, window_refused)
  elseif window_refused then
    notes[#notes + 1] = fmt("%s: rows of %d tokens are longer than sliding_window (%d): the attention runs its f32 " ..
      "composition masked by each row's window, planned here without the masks ((B, T, T) bytes a sliding layer more)",
      cfg.model_type, s.seq_len, window_refused)
  end
  if s.gc ~= M.DEFAULT_GC then
    notes[#notes + 1] = fmt("gc = \"%s\" is a what-if: zrun's models and checkpointed segments free their " ..
      "temporaries when they return, and a collection runs before backward when it could free more than 1/256 " ..
      "of the device's bytes (gc = \"backward\")", s.gc)
  end

  local function sum(t)
    local n = 0
    for _, c in ipairs(CATS) do n = n + t[c] end
    return n
  end
  dev.sum = sum(dev)
  host.sum = sum(host)
  -- Setup (model construction + zr.initialize), before the first step: zrun builds the model
  -- whole in its training dtype, and zr_zero_new allocates the states, the buckets and (stage 3)
  -- the shard before it releases the full parameters. Only at stage 3 can this exceed training.
  -- Each category's own peak; the total is the most live at once. Direct mode copies the
  -- parameters into one flat buffer (freeing the originals as it goes) before it makes the
  -- gradient partition (zero.c flatten_params): the copy or the partition, never both.
  local setup = { params = total * b + (direct and S * b or 0), grads = states.grads, optimizer = states.optimizer,
    comm = states.comm }
  if stage == 3 and not s.offload_param then setup.params = setup.params + S * b end
  setup.total = setup.params + setup.grads + setup.optimizer + setup.comm
  if direct then setup.total = setup.total - min(S * b, setup.grads) end
  if stage == 3 then
    notes[#notes + 1] = fmt("stage 3: the model is built whole before zr.initialize partitions it; that setup " ..
      "peak is %s per rank (the whole model in %s%s, and the states)", human(setup.total), s.dtype,
      s.offload_param and "" or ", its shard")
  end
  -- The time-line: the model states stay from setup on; on them, a micro-batch's forward and
  -- backward (the simulation's live bytes: activations, gradients before their bucket, workspace,
  -- gathered parameters, the batch), every micro-batch alike, then the optimizer step (what
  -- backward left live and the all-gather buffers). The host holds its buffers from the first
  -- step on.
  local base = states.params + states.grads + states.optimizer + states.comm
  local fb_in = act and act.live_peak_in or "forward"
  local timeline = {
    { phase = "setup", device = setup.total, host = host.sum - host.comm },
    { phase = fb_in, device = base + (act and act.live_peak or 0) + fb_comm, host = host.sum },
    { phase = "optimizer step", device = base + (act and act.live_after_backward or 0) + step_comm, host = host.sum },
  }
  -- what the training peak is made of, by zr.memory's categories (the allocator's at_peak):
  -- the states, and the simulation's live bytes at its peak or, at the step, after backward
  local function made_of(live, comm, params)
    live = live or {}
    return { params = states.params + (params and live.params or 0), grads = states.grads + (live.grads or 0),
      optimizer = states.optimizer, activations = live.act or 0, comm = states.comm + comm,
      workspace = live.ws or 0, other = live.other or 0 }
  end
  local at_peak = timeline[3].device > timeline[2].device and made_of(act and act.live_after, step_comm, false)
    or made_of(act and act.live_at_peak, fb_comm, true)
  local peak_in = {}
  for _, side in ipairs { "device", "host" } do
    local t = side == "device" and dev or host
    t.total = 0
    for _, ph in ipairs(timeline) do
      if ph[side] > t.total then t.total, peak_in[side] = ph[side], ph.phase end
    end
  end

  local plan = { device = dev, host = host, setup = setup, training_total = max(timeline[2].device, timeline[3].device),
    training_at_peak = at_peak,
    timeline = timeline, peak_in = peak_in, settings = s, notes = notes, total_params = total,
    largest_layer_params = largest, partition_numel = S, name = r.name, pinned = pinned,
    activations_forward = act and act.forward, host_per_node = host.total * s.gpus_per_node }
  return setmetatable(plan, { __tostring = M.format })
end

-- zr.memory.plan{model=, config=, micro_batch=, seq_len=, gradient_checkpointing=, loss_type=, packed=, world_size= |
-- gpus_per_node= + nodes=, dtype=, stage=, offload_optimizer=, offload_param=, offload_ratio=,
-- offload_grads= ("device" | "host" | "auto"), grad_accum_dtype=, pin_memory=, param_pin_memory=, gpu_memory=, gc=,
-- device=, lora=} (pin_memory: offload_optimizer's; param_pin_memory: offload_param's; lora: LoRA fine-tuning, a
-- zr.peft.LoraConfig or {r =, target_modules = (names, "all-linear" or a regex; nil: q_proj, v_proj), lora_dropout =}:
-- the base frozen, whole and 16-bit, the adapters trained; a PEFT model passed as model is planned with its peft_config)
-- Returns {device = {<category> = peak bytes, total=, sum=}, host = {...}, timeline = {{phase=,
-- device=, host=}}, settings=, notes=, ...}: each category's own peak, and as `total` the most
-- live at once over setup and a training step (`sum` adds the categories' own peaks instead);
-- training_total is the most live once training runs, and training_at_peak = {<category> = bytes}
-- what it is made of, in zr.memory's categories ("other" included: the batch, the rope tables), to
-- set beside zr.memory.stats(dev)[category].at_peak. With optimizer offload on a GPU and offload_grads "auto" (the default, unless
-- ZRUN_OFFLOAD_GRADS is set), the gradients stay on the GPU as the engine chooses: when their
-- partition takes at most half of what gpu_memory (or the visible GPU) leaves free after the
-- weights; a note says whether the other placement fits. tostring(plan) is the printed table.
function M.plan(o)
  o = o or {}
  if o.model == nil and not o.param_numels then
    error("zr.memory.plan: `model` (a model, a config or a model name) is required", 2)
  end
  local counted
  if o.param_numels then -- parameter sizes instead of a model: model states only, no activations
    local list, total, largest = {}, 0, 0
    for i, n in ipairs(o.param_numels) do
      list[i] = { numel = n }
      total, largest = total + n, max(largest, n)
    end
    counted = { total, largest, list, { config = {}, name = o.name } }
  else
    counted = { E.count(o.model) }
  end
  local s = settings(o, counted[4].config or {})
  -- LoRA: asked for, or the model passed is a PEFT model (its peft_config)
  local lo = o.lora
  if lo == nil and counted[4].module and require("zrun.peft").is_peft_model(counted[4].module) then
    lo = counted[4].module.peft_config
  end
  if lo and o.param_numels then error("memory plan: lora needs the model's config (not param_numels)", 0) end
  s.lora_plan = lora_setting(lo, counted[4].config or {}, counted[4].name)
  if not s.offload_optimizer or s.device == "cpu" then return build(o, s, counted) end
  local function with(grads)
    local t = {}
    for k, v in pairs(s) do t[k] = v end
    t.offload_grads = grads
    return build(o, t, counted)
  end
  if s.offload_grads ~= "auto" then
    local p = build(o, s, counted)
    p.notes[#p.notes + 1] = s.zenflow and "gradients on the GPU: ZenFlow reads each micro-batch's there" or
      fmt("gradients on the %s, as asked (--offload-grads / ZRUN_OFFLOAD_GRADS %s)",
        s.offload_grads == "device" and "GPU" or "host", s.offload_grads)
    return p
  end
  -- the engine's choice (memory_offload.lua device_grads_fit): the gradient partition on the GPU
  -- when it takes at most half of the memory free at zr.initialize, where the model's weights
  -- already are (free: the usable memory less the weights)
  local gpu = o.gpu_memory and parse_bytes(o.gpu_memory) or Off.detect_gpu_memory()
  local pd, ph = with("device"), with("host")
  if not gpu then
    ph.notes[#ph.notes + 1] = fmt("gradients on the host (no GPU size known: --gpu-memory lets the plan choose as " ..
      "the engine does); on the GPU (ZRUN_OFFLOAD_GRADS=device) GPU %s, host %s per rank", human(pd.device.total),
      human(pd.host.total))
    return ph
  end
  local usable = Off.usable(gpu)
  local free, part = usable - pd.total_params * s.dtype_bytes, pd.partition_numel * s.grad_bytes
  local why = fmt("the partition, %s, takes %s half of the %s free after the weights (of %s usable)", human(part),
    Off.device_grads_fit(pd.partition_numel, s.grad_bytes, free) and "at most" or "more than", human(free), human(usable))
  local function other(q, env)
    return q.device.total <= usable and fmt("%s fits too: GPU %s, host %s per rank", env, human(q.device.total),
      human(q.host.total)) or fmt("%s would need GPU %s per rank", env, human(q.device.total))
  end
  if Off.device_grads_fit(pd.partition_numel, s.grad_bytes, free) then
    pd.notes[#pd.notes + 1] = fmt("gradients on the GPU, as the engine chooses: %s; %s", why,
      pd.device.total <= usable and other(ph, "ZRUN_OFFLOAD_GRADS=host") or
      fmt("but this plan needs %s, more than the usable: ZRUN_OFFLOAD_GRADS=host (GPU %s, host %s per rank)",
        human(pd.device.total), human(ph.device.total), human(ph.host.total)))
    return pd
  end
  ph.notes[#ph.notes + 1] = fmt("gradients on the host, as the engine chooses: %s; %s", why,
    other(pd, "ZRUN_OFFLOAD_GRADS=device"))
  return ph
end

-- What of plan p (made from options o) does not fit `avail` bytes of host memory per node or the
-- locked-memory limit `memlock` (bytes; nil: unlimited), and each setting that fixes it with the
-- memory it leaves, one line each; {} when everything fits. `avail_note` follows the available
-- figure in the message. zr.initialize's check and `zrun plan --host-memory` print these.
function M.host_check(p, o, avail, memlock, avail_note)
  local function plan_with(changes)
    local t = {}
    for k, v in pairs(o) do t[k] = v end
    t.offload_grads = p.settings.offload_grads -- the placement the plan settled on, unless changed
    for k, v in pairs(changes) do t[k] = v end
    return M.plan(t)
  end
  return Off.check_lines(p, avail, memlock, plan_with, avail_note)
end

-- Plan p (from M.plan) as text, tostring(p): the model and its parameter count, the settings, each
-- category's peak on the device and the host, the peak totals and where they fall, the host memory
-- per node (several ranks per node, with host memory in use) and the plan's notes.
function M.format(p)
  local s = p.settings
  local lines = {}
  lines[1] = fmt("memory plan for %s (%s parameters), per rank", p.name or "model", require("zrun.memory_describe").commas(p.total_params))
  local off = ""
  if s.offload_optimizer then
    off = fmt(", optimizer offloaded%s%s", s.offload_ratio < 1 and fmt(" (ratio %g)", s.offload_ratio) or "",
      s.device ~= "cpu" and fmt(", gradients on the %s", s.offload_grads == "device" and "GPU" or "host") or "")
  end
  lines[2] = fmt("  ZeRO stage %d, %d rank%s (%d per node x %d node%s), %s, micro-batch %d x %d tokens%s%s%s%s",
    s.stage, s.world_size, s.world_size > 1 and "s" or "", s.gpus_per_node, s.nodes, s.nodes > 1 and "s" or "",
    s.dtype, s.micro_batch, s.seq_len, (s.grad_bytes == 2 and ", 16-bit gradients" or "") ..
      (s.master_bytes == 2 and ", bf16 master" or "") .. (s.state_bytes == 2 and ", bf16 optimizer states" or ""),
    s.gradient_checkpointing and ", activation checkpointing" or "", off, (s.offload_param and ", params offloaded" or "") ..
      (s.packed and fmt(", packed sequences of %d", s.packed) or "") .. (s.loss_type and ", dft loss" or "") ..
      (s.chunked_loss and ", chunked LM head + loss" or "") ..
      (s.lora_plan and fmt(", LoRA r %d on %s%s: %s trained", s.lora_plan.r, concat(s.lora_plan.names, ", "),
        s.lora_plan.dropout > 0 and fmt(" (dropout %g)", s.lora_plan.dropout) or "",
        require("zrun.memory_describe").commas(s.lora_plan.trained)) or ""))
  lines[#lines + 1] = fmt("  %-12s %14s %14s", "category", s.device == "cpu" and "device (cpu)" or "GPU", "host")
  for _, c in ipairs(CATS) do
    lines[#lines + 1] = fmt("  %-12s %14s %14s", c, human(p.device[c]), human(p.host[c]))
  end
  lines[#lines + 1] = fmt("  %-12s %14s %14s", "peak total", human(p.device.total), human(p.host.total))
  lines[#lines + 1] = fmt("  (the most live at once: %s in %s, host %s; the categories' own peaks add up to %s / %s)",
    s.device == "cpu" and "device" or "GPU", p.peak_in.device, p.host.total == 0 and "none" or
    p.peak_in.host == "setup" and "in setup" or "from the first step on", human(p.device.sum), human(p.host.sum))
  if s.gpus_per_node > 1 and p.host.total > 0 then
    lines[#lines + 1] = fmt("  host memory per node (%d ranks): %s", s.gpus_per_node, human(p.host_per_node))
  end
  for _, n in ipairs(p.notes) do lines[#lines + 1] = "  note: " .. n end
  return concat(lines, "\n")
end

-- ---------------------------------------------------------------------------------------------
-- Fit: the cheapest settings that fit, in DeepSpeed's usual order.
-- ---------------------------------------------------------------------------------------------

local function biggest(p)
  local best, bv = nil, -1
  for _, c in ipairs(CATS) do if p.device[c] > bv then best, bv = c, p.device[c] end end
  return best, bv
end

-- zr.memory.fit{model=, config=, micro_batch=, seq_len=, gpu_memory=, host_memory=, gpus_per_node=,
-- nodes=, headroom=} -> {fits=, plan=, settings=, steps = {{change=, reason=, plan=, fits=}}, text=}
function M.fit(o)
  local gpu = parse_bytes(o.gpu_memory or error("zr.memory.fit: gpu_memory is required (e.g. \"80GB\")", 2))
  local hostmem = o.host_memory and parse_bytes(o.host_memory)
  -- CUDA context, allocator rounding and fragmentation: keep 5% and 1 GiB free
  local usable = floor(gpu * (1 - (o.headroom or 0.05))) - (o.reserve or 2 ^ 30)
  local cur = {}
  for k, v in pairs(o) do cur[k] = v end
  local base = M.plan(cur)
  for k, v in pairs(base.settings) do if cur[k] == nil then cur[k] = v end end
  cur.stage, cur.micro_batch = base.settings.stage, base.settings.micro_batch
  local steps = {}
  local function fits(p)
    if p.device.total > usable then return false end
    if hostmem and p.host_per_node > hostmem then return false end
    return true
  end
  local function try(change, mutate, why)
    local nxt = {}
    for k, v in pairs(cur) do nxt[k] = v end
    mutate(nxt)
    local p = M.plan(nxt)
    steps[#steps + 1] = { change = change, reason = why, plan = p, fits = fits(p) }
    cur = nxt
    return p
  end
  local p = base
  steps[1] = { change = "as configured", reason = "", plan = p, fits = fits(p) }
  local accepted = p
  local function why_not(pl)
    local c, v = biggest(pl)
    local hostmsg = ""
    if hostmem and pl.host_per_node > hostmem then
      hostmsg = fmt("; host memory per node %s > %s", human(pl.host_per_node), human(hostmem))
    end
    return fmt("needs %s per GPU > %s usable (largest: %s %s)%s", human(pl.device.total), human(usable), c, human(v), hostmsg)
  end
  local order = {
    { "stage 2", function(t) return t.stage < 2 end, function(t) t.stage = 2 end,
      "shards gradients and optimizer states over the ranks (ZeRO-2)" },
    { "stage 3", function(t) return t.stage < 3 end, function(t) t.stage = 3 end,
      "shards the 16-bit parameters too (ZeRO-3)" },
    { "offload_optimizer: cpu", function(t) return not t.offload_optimizer end,
      function(t) t.offload_optimizer = true; if t.stage < 1 then t.stage = 2 end end, -- offload needs stage >= 1
      "moves fp32 master weights and optimizer states to host memory (and the gradients, unless the GPU holds them)" },
    { "offload_param: cpu", function(t) return t.stage == 3 and not t.offload_param end, function(t) t.offload_param = true end,
      "keeps parameter shards in host memory" },
    { "activation checkpointing", function(t) return not t.gradient_checkpointing end,
      function(t) t.gradient_checkpointing = true end, "keeps only each layer's input and recomputes the rest in backward" },
  }
  local i = 1
  while not steps[#steps].fits do
    local st = order[i]
    if st then
      i = i + 1
      if st[2](cur) then
        local before = accepted
        local reason = why_not(before)
        local prev = cur
        local np = try(st[1], st[3], st[4])
        local saved = before.device.total - np.device.total
        local last = steps[#steps]
        if saved <= 0 and not last.fits then -- no gain with zrun's allocation pattern: not kept
          cur, last.skipped = prev, true
          last.reason = fmt("%s: %s; saves nothing here with zrun's allocations, so it is not kept", reason, st[4])
        else
          accepted = np
          last.reason = fmt("%s: %s; saves %s per GPU", reason, st[4], human(saved))
        end
      end
    elseif cur.micro_batch > 1 then
      local before = accepted
      local reason = why_not(before)
      local mb = floor(cur.micro_batch / 2)
      accepted = try(fmt("micro-batch %d (gradient accumulation x2 keeps the global batch)", mb),
        function(t) t.micro_batch = mb end, "")
      steps[#steps].reason = reason .. ": activations scale with the micro-batch"
    else
      break
    end
  end
  local last = steps[#steps]
  if last.skipped then for k = #steps, 1, -1 do if not steps[k].skipped then last = steps[k]; break end end end
  local lines = { fmt("fit on %s GPUs (%s usable after 5%% and 1 GiB headroom)%s:", human(gpu), human(usable),
    hostmem and (", " .. human(hostmem) .. " host memory per node") or "") }
  for k, st in ipairs(steps) do
    lines[#lines + 1] = fmt("  %d. %-40s GPU %12s  host/node %12s  %s", k, st.change, human(st.plan.device.total),
      human(st.plan.host_per_node), st.fits and "fits" or (st.skipped and "skipped" or "does not fit"))
    if st.reason ~= "" then lines[#lines + 1] = "       why: " .. st.reason end
  end
  if last.fits then
    local ss = last.plan.settings
    lines[#lines + 1] = fmt("proposal: zero_optimization.stage %d%s%s, micro-batch %d%s", ss.stage,
      ss.offload_optimizer and fmt(", offload_optimizer cpu (gradients on the %s)", ss.offload_grads == "device" and "GPU"
      or "host") or "", ss.offload_param and ", offload_param cpu" or "",
      ss.micro_batch, ss.gradient_checkpointing and ", activation checkpointing on" or "")
  else
    lines[#lines + 1] = "nothing fits: use more GPUs (stage 3 divides the states by the number of ranks), " ..
      "a shorter sequence length, or GPUs with more memory"
  end
  local res = { fits = last.fits, plan = last.plan, settings = last.plan.settings, steps = steps, usable = usable }
  res.text = concat(lines, "\n")
  return setmetatable(res, { __tostring = function(t) return t.text end })
end

-- ---------------------------------------------------------------------------------------------
-- zrun plan MODEL [--config ds.json] [--micro-batch B] [--seq-len T] [--gpus-per-node N --nodes M]
--                 [--stage S] [--dtype bf16] [--gradient-checkpointing] [--offload-optimizer]
--                 [--offload-param] [--offload-ratio R] [--offload-grads device|host|auto]
--                 [--grad-accum-dtype fp32|bf16|fp16] [--gc none|backward|ideal]
--                 [--loss-type nll|chunked_nll|dft] [--packed LEN] [--lora-r R [--lora-target-modules q_proj,v_proj|all-linear]
--                 [--lora-dropout P]] [--gpu-memory 141GB] [--host-memory 128GB] [--fit]
-- ---------------------------------------------------------------------------------------------
local USAGE = [==[usage: zrun plan MODEL [--config ds.json] [--micro-batch B] [--seq-len T]
                 [--gpus-per-node N] [--nodes M] [--stage 0-3] [--dtype f32|bf16|f16]
                 [--gradient-checkpointing] [--offload-optimizer] [--offload-param]
                 [--offload-ratio R] [--offload-grads device|host|auto]
                 [--grad-accum-dtype fp32|bf16|fp16] [--device cuda|cpu] [--gc none|backward|ideal]
                 [--loss-type nll|chunked_nll|dft] [--packed LEN]
                 [--lora-r R [--lora-target-modules q_proj,v_proj|all-linear] [--lora-dropout P]]
                 [--gpu-memory 141GB] [--host-memory 128GB] [--fit]
  MODEL: a Hugging Face model dir, a config.json, a cached hub id, or a built-in name
  --loss-type: TRL's SFTConfig loss_type; dft keeps a second logits-sized gradient; chunked_nll
        (TRL's default; the Trainer's use_liger_kernel) makes no full logits: a slice at a time
  --packed: padding-free batches (TRL's packing / padding_free) of sequences of LEN tokens
  --lora-r: LoRA fine-tuning (zr.peft, PEFT's adapters) of rank R: the base frozen (16-bit,
        whole on every rank, no gradient or optimizer state), the adapters trained;
        --lora-target-modules: the adapted projections, comma-separated, or all-linear
        (default q_proj,v_proj, PEFT's for Llama); --lora-dropout: LoraConfig's lora_dropout
  --offload-ratio: offload_optimizer.ratio, the share of the optimizer states on the host
  --offload-grads: where offloaded training keeps the gradients; auto (the default, as the
        engine, unless ZRUN_OFFLOAD_GRADS is set): on the GPU when they take at most half of
        what --gpu-memory (or the GPU this process sees) leaves free after the weights
  --grad-accum-dtype: data_types.grad_accum_dtype, the gradients' dtype (fp32 by default)
  --host-memory: says what does not fit this much host memory per node and what fixes it
  --gc: when Lua's collector frees what a step leaves; the default, backward, is what zrun
        does (it collects before backward when that frees more than 1/256 of the device's
        bytes); none and ideal are what-ifs]==]

local MEMORY_OPTIONS = { "gpu-memory", "host-memory" }

-- `zrun plan`: args, the words after it (USAGE above). Prints the plan; with --gpu-memory (no --fit)
-- whether it fits, with --host-memory what does not fit there and what fixes it, with --fit the fit
-- advice (M.fit). Returns the exit status: 0, or 1 after the usage without exactly one MODEL (0 with
-- --help). Raises for a bad option or value (--fit without --gpu-memory too).
function M.main_plan(args)
  local flags = { help = true, fit = true, ["gradient-checkpointing"] = true, ["offload-optimizer"] = true,
    ["offload-param"] = true }
  local o, pos = E.parse_args(args or {}, flags, E.usage_options(USAGE, "gpus"), "plan", USAGE)
  if o.help or #pos ~= 1 then
    print(USAGE)
    return o.help and 0 or 1
  end
  local known = { config = 1, ["micro-batch"] = 1, ["seq-len"] = 1, ["gpus-per-node"] = 1, gpus = 1, nodes = 1, stage = 1,
    dtype = 1, ["gradient-checkpointing"] = 1, ["offload-optimizer"] = 1, ["offload-param"] = 1, device = 1, gc = 1,
    fit = 1, ["gpu-memory"] = 1, ["host-memory"] = 1, help = 1, ["offload-ratio"] = 1, ["offload-grads"] = 1,
    ["grad-accum-dtype"] = 1, ["loss-type"] = 1, packed = 1, ["lora-r"] = 1, ["lora-target-modules"] = 1,
    ["lora-dropout"] = 1 }
  for k in pairs(o) do if not known[k] then error(fmt("zrun plan: unknown option --%s\n%s", k, USAGE), 0) end end
  local function int(k, min) -- min: 1 for counts (a micro-batch of 0 planned zero), else 0
    if o[k] == nil then return nil end
    local n = tonumber(o[k])
    if not n or n ~= floor(n) or n == math.huge then
      error(fmt("zrun plan: --%s must be an integer, got '%s'", k, o[k]), 0)
    end
    if n < (min or 0) then error(fmt("zrun plan: --%s must be at least %d, got %s", k, min or 0, o[k]), 0) end
    return n
  end
  local gc = o.gc
  if gc and gc ~= "none" and gc ~= "backward" and gc ~= "ideal" then error("zrun plan: --gc must be none, backward or ideal", 0) end
  local ratio = o["offload-ratio"]
  if ratio ~= nil then
    ratio = tonumber(ratio)
    if not ratio or ratio < 0 or ratio > 1 then
      error(fmt("zrun plan: --offload-ratio must be a number from 0 to 1, got '%s'", o["offload-ratio"]), 0)
    end
  end
  local gad = o["grad-accum-dtype"]
  if gad ~= nil and gad ~= "fp32" and gad ~= "bf16" and gad ~= "fp16" then
    error(fmt("zrun plan: --grad-accum-dtype must be fp32, bf16 or fp16, got '%s'", gad), 0)
  end
  -- LoRA: --lora-r turns it on; the other two refine it
  local lora
  if o["lora-r"] then
    lora = { r = int("lora-r", 1), target_modules = o["lora-target-modules"] }
    local tm = lora.target_modules
    if tm and tm ~= "all-linear" then
      local l = {}
      for name in (tm .. ","):gmatch("([^,]*),") do
        name = name:match("^%s*(.-)%s*$")
        if name == "" or not PROJ[name] then
          error(fmt("zrun plan: --lora-target-modules takes q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, " ..
            "down_proj (comma-separated) or all-linear, got '%s'", tm), 0)
        end
        l[#l + 1] = name
      end
      lora.target_modules = l
    end
    local p = o["lora-dropout"]
    if p ~= nil then
      lora.lora_dropout = tonumber(p)
      if not lora.lora_dropout or lora.lora_dropout < 0 or lora.lora_dropout >= 1 then
        error(fmt("zrun plan: --lora-dropout must be a number from 0 to below 1 (e.g. 0.05), got '%s'", p), 0)
      end
    end
  elseif o["lora-target-modules"] or o["lora-dropout"] then
    error("zrun plan: --lora-target-modules and --lora-dropout need --lora-r (the adapters' rank, e.g. --lora-r 16)", 0)
  end
  for _, k in ipairs(MEMORY_OPTIONS) do -- (a bad size stops here, not after the plan is printed)
    if o[k] then parse_bytes(o[k]) end
  end
  if (ratio or o["offload-grads"]) and not o["offload-optimizer"] and not o.config then
    error("zrun plan: --offload-ratio and --offload-grads need --offload-optimizer (or a config that offloads)", 0)
  end
  local opts = { model = pos[1], config = o.config, micro_batch = int("micro-batch", 1), seq_len = int("seq-len"),
    gpus_per_node = int("gpus-per-node", 1) or int("gpus", 1) or 1, nodes = int("nodes", 1) or 1, stage = int("stage"),
    dtype = o.dtype, gradient_checkpointing = o["gradient-checkpointing"] or nil,
    offload_optimizer = o["offload-optimizer"] or nil, offload_param = o["offload-param"] or nil,
    offload_ratio = ratio, offload_grads = o["offload-grads"], grad_accum_dtype = gad,
    device = o.device, gc = gc, gpu_memory = o["gpu-memory"], host_memory = o["host-memory"],
    loss_type = o["loss-type"], packed = int("packed", 1), lora = lora }
  if opts.dtype == nil and not opts.config and (opts.device or "cuda") ~= "cpu" then opts.dtype = "bf16" end
  local p = M.plan(opts)
  print(tostring(p))
  if o["gpu-memory"] and not o.fit then
    local gpu = parse_bytes(o["gpu-memory"])
    print(fmt("GPU memory: %s per rank %s the %s usable of %s (5%% and 1 GiB kept; --fit proposes settings)",
      human(p.device.total), p.device.total <= Off.usable(gpu) and "fits" or "does not fit", human(Off.usable(gpu)),
      human(gpu)))
  end
  if o["host-memory"] then
    local lines = M.host_check(p, opts, parse_bytes(o["host-memory"]))
    print(#lines > 0 and concat(lines, "\n") or fmt("host memory: %s per node fits %s", human(p.host_per_node),
      human(parse_bytes(o["host-memory"]))))
  end
  if o.fit then
    if not o["gpu-memory"] then error("zrun plan --fit needs --gpu-memory (e.g. --gpu-memory 80GB)", 0) end
    print("")
    print(tostring(M.fit(opts)))
  end
  return 0
end

return M
