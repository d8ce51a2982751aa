-- zr.memory.plan{...}: the per-rank peak of every memory category (params, grads, optimizer,
-- activations, comm, workspace) on the training device and in host memory, predicted from the
-- model config and the DeepSpeed config before anything is allocated, following what zrun's
-- engine (runtime/zero/engine.c, lua/zrun/engine.lua) and ops actually allocate — not DeepSpeed's
-- rules of thumb. Activations come from replaying the Llama forward and backward on a model of
-- the autograd tape (which op allocates what, what each node saves, when backward frees it).
-- Also `fit` advice (which settings fit a GPU) and the `zrun plan` command.
local E = require "zrun.memory_estimate"
local llama_activations = require("zrun.memory_sim").llama_activations

local M = {}
local fmt, floor, ceil, max, min, concat = string.format, math.floor, math.ceil, math.max, math.min, table.concat

-- When Lua collects the tensors a step leaves behind. LuaJIT's collector does not see tensor
-- memory, so an op's output lives until a collection, not until its last use:
--   "backward" what zrun does: engine:backward collects right before loss:backward(), so only
--              what autograd saved survives into backward; zr.checkpoint collects right after a
--              segment's no-grad forward and after each segment's recomputation + backward, so
--              a checkpointed model holds the segment inputs plus one segment's activations;
--   "none"     a what-if with no collection during a step (zrun before those collections);
--   "ideal"    a what-if where tensors die with their last Lua reference (as with refcounting).
-- The step modelled is a plain loop (out = engine(ids, ids); engine:backward(out.loss);
-- engine:step()), so the previous step's batch, logits and loss are garbage until the first
-- collection of the next step.
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
  -- the optimizer's f32 states beside the master weights: AdamW 2, Lion/Adagrad 1, SGD 1 with momentum
  local op = ds.optimizer
  s.opt_states = not op and 2 or (op.type == "Lion" or op.type == "Adagrad") and 1 or
    op.type == "SGD" and ((op.params.momentum or 0) ~= 0 and 1 or 0) or 2
  s.offload_ratio = o.offload_ratio or (zc.offload_optimizer and zc.offload_optimizer.ratio) or 1
  s.offload_param = o.offload_param
  if s.offload_param == nil then s.offload_param = zc.offload_param and zc.offload_param.device == "cpu" or false end
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
  local gad = o.grad_accum_dtype or (ds.data_types and ds.data_types.grad_accum_dtype)
  s.grad_bytes = ds_bytes(gad) or 4
  local mb = o.micro_batch or ds.train_micro_batch_size_per_gpu
  s.micro_batch = type(mb) == "number" and mb or 1
  s.seq_len = o.seq_len or 1024
  s.gradient_checkpointing = o.gradient_checkpointing and true or false
  s.gc = o.gc or M.DEFAULT_GC
  s.device = o.device or "cuda"
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

local CATS = { "params", "grads", "optimizer", "activations", "comm", "workspace" }
M.categories = CATS

-- zr.memory.plan{model=, config=, micro_batch=, seq_len=, gradient_checkpointing=, world_size= |
-- gpus_per_node= + nodes=, dtype=, stage=, offload_optimizer=, offload_ratio=, offload_param=, gc=, device=}
-- Returns {device = {<category> = peak bytes, total=}, host = {...}, settings=, notes=, ...};
-- tostring(plan) is the printed table.
function M.plan(o)
  o = o or {}
  if o.model == nil then error("zr.memory.plan: `model` (a model, a config or a model name) is required", 2) end
  local total, largest, list, r = E.count(o.model)
  local cfg = r.config or {}
  local s = settings(o, cfg)
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
  local opt = s.offload_optimizer and host or dev

  -- model states (zero.c: zr_zero_new); offload_optimizer.ratio (s.offload_ratio) below 1: the
  -- host keeps that share of the master and states (engine.c: S - split), the device the rest, and
  -- the gradient partition stays on the device
  local ratio = s.offload_optimizer and s.offload_ratio or 1
  local hS = s.offload_optimizer and ceil(ratio * S) or 0
  opt.optimizer = (1 + s.opt_states) * (s.offload_optimizer and hS or S) * 4 -- fp32 master and the states (AdamW: exp_avg, exp_avg_sq)
  if s.offload_optimizer then dev.optimizer = (1 + s.opt_states) * (S - hS) * 4 end
  local gplace = (s.offload_optimizer and ratio >= 1) and host or dev
  gplace.grads = S * s.grad_bytes -- reduced gradient partition (fp32 unless grad_accum_dtype)
  -- direct mode (zero.c): one chunk per parameter and the partition on the device: .grad are views
  -- into the partition, weights views into one flat buffer, no reduce buckets
  local direct = Wc == 1 and stage <= 2 and (not s.offload_optimizer or s.device == "cpu") -- on the CPU offload moves nothing
  if stage <= 1 and not direct then dev.grads = dev.grads + total * s.grad_bytes end -- full .grad per parameter
  if stage <= 2 then
    dev.params = total * b
  else -- the 16-bit shard; gathered parameters are added below (one module's at a time)
    local shard = s.offload_param and host or dev
    shard.params = S * b
    -- parameters below stage3_param_persistence_threshold are never released (zero.c)
    for _, p in ipairs(list) do
      if p.numel < s.persistence_threshold then dev.params = dev.params + p.numel * b end
    end
  end
  -- comm buckets (zero.c): send W*cap in the comm dtype, plus compaction copy and receive buffer
  -- when W > 1
  local cap, cb = floor(s.reduce_bucket_size / Wc), s.comm_bytes
  if cap < max_c then cap = max_c end
  if cap > S then cap = S end
  dev.comm = direct and 0 or (cap * Wc * cb + (Wc > 1 and (cap * Wc * cb + cap * cb) or 0))
  -- overlap_comm keeps a second buffer set so a bucket can be reduced while the next one fills
  if s.overlap_comm and Wc > 1 and not direct then dev.comm = dev.comm * 2 end
  local comm_tr = 0
  if Wc > 1 and stage <= 2 then comm_tr = cap * b + cap * Wc * b end -- all-gather of updated weights
  -- stage 3 all-gathers straight into the parameters' storage (counted as params); with
  -- offload_param the host shard's slice is staged on the device first
  if stage == 3 and s.offload_param then comm_tr = max(comm_tr, ceil(maxn / Wc) * b) end
  dev.comm = dev.comm + comm_tr
  if s.offload_optimizer and not direct then
    -- zero/offload.c: a pinned staging bucket for gradients that are added to the partition (all
    -- but the first of a step after zero_grad; made once, on the first step)
    host.comm = cap * 4
    -- the new 16-bit weights are written into a pinned host buffer and uploaded from there (one
    -- world: into each parameter; stage 3: into the device shard)
    if (stage < 3 and Wc == 1) or (stage == 3 and not s.offload_param) then host.params = host.params + S * b end
  end

  -- activations
  local fam = E.family(cfg)
  local act
  if fam ~= "gpt2" then
    act = llama_activations(cfg, { micro_batch = s.micro_batch, seq_len = s.seq_len, dtype_bytes = b,
      stage = stage, stage3 = stage == 3, gradient_checkpointing = s.gradient_checkpointing, gc = s.gc,
      direct = direct, persistence_threshold = s.persistence_threshold,
      prefetch = s.prefetch_bucket_size, max_live = s.max_live_parameters, max_reuse = s.max_reuse_distance,
      dw_in_place = direct and s.device ~= "cpu", gpu = s.device ~= "cpu", trace = o.trace })
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
  if s.gradient_checkpointing and s.gc == "none" then
    notes[#notes + 1] = "checkpointing frees nothing while Lua does not collect during the step: the " ..
      "recomputed and the discarded activations stay until a collection (gc = \"none\")"
  end
  if s.gc ~= M.DEFAULT_GC then
    notes[#notes + 1] = fmt("gc = \"%s\" is a what-if: zrun collects before backward and around checkpointed " ..
      "segments (gc = \"backward\")", s.gc)
  end

  local function sum(t)
    local n = 0
    for _, c in ipairs(CATS) do n = n + t[c] end
    return n
  end
  dev.total = sum(dev)
  host.total = sum(host)
  -- Setup (model construction + zr.initialize), before the first step: zrun builds the model
  -- whole in its training dtype, and zr_zero_new allocates the states, the buckets and (stage 3)
  -- the shard before it releases the full parameters. Only at stage 3 can this exceed training.
  local setup = { params = total * b + (direct and S * b or 0), -- direct: the flat copy, then originals freed
    grads = (stage <= 1 and not direct and total * s.grad_bytes or 0) + (s.offload_optimizer and 0 or S * s.grad_bytes),
    optimizer = s.offload_optimizer and 0 or 3 * S * 4, comm = dev.comm - comm_tr }
  if stage == 3 and not s.offload_param then setup.params = setup.params + S * b end
  setup.total = setup.params + setup.grads + setup.optimizer + setup.comm
  if stage == 3 then
    notes[#notes + 1] = fmt("stage 3: the model is built whole before zr.initialize partitions it; that setup " ..
      "peak is %s per rank (the whole model in %s%s, and the states)", human(setup.total), s.dtype,
      s.offload_param and "" or ", its shard")
  end
  local training_total = dev.total
  if setup.total > dev.total then dev.total = setup.total end

  local plan = { device = dev, host = host, setup = setup, training_total = training_total, settings = s, notes = notes, total_params = total,
    largest_layer_params = largest, partition_numel = S, name = r.name,
    activations_forward = act and act.forward, host_per_node = host.total * s.gpus_per_node }
  return setmetatable(plan, { __tostring = M.format })
end

function M.format(p)
  local s = p.settings
  local lines = {}
  lines[1] = fmt("memory plan for %s (%s parameters), per rank", p.name or "model", require("zrun.memory_describe").commas(p.total_params))
  lines[2] = fmt("  ZeRO stage %d, %d rank%s (%d per node x %d node%s), %s, micro-batch %d x %d tokens%s%s%s",
    s.stage, s.world_size, s.world_size > 1 and "s" or "", s.gpus_per_node, s.nodes, s.nodes > 1 and "s" or "",
    s.dtype, s.micro_batch, s.seq_len, s.gradient_checkpointing and ", activation checkpointing" or "",
    s.offload_optimizer and ", optimizer offloaded" or "", s.offload_param and ", params offloaded" or "")
  lines[#lines + 1] = fmt("  %-12s %14s %14s", "category", s.device == "cpu" and "device (cpu)" or "GPU", "host")
  for _, c in ipairs(CATS) do
    lines[#lines + 1] = fmt("  %-12s %14s %14s", c, human(p.device[c]), human(p.host[c]))
  end
  lines[#lines + 1] = fmt("  %-12s %14s %14s", "peak total", human(p.device.total), human(p.host.total))
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
      "moves fp32 master weights, Adam states and reduced gradients to pinned host memory" },
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
      ss.offload_optimizer and ", offload_optimizer cpu" or "", ss.offload_param and ", offload_param cpu" or "",
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
--                 [--offload-param] [--gc none|backward|ideal] [--fit --gpu-memory 80GB [--host-memory 512GB]]
-- ---------------------------------------------------------------------------------------------
local USAGE = [==[usage: zrun plan MODEL [--config ds.json] [--micro-batch B] [--seq-len T]
                 [--gpus-per-node N] [--nodes M] [--stage 0-3] [--dtype f32|bf16|f16]
                 [--gradient-checkpointing] [--offload-optimizer] [--offload-param]
                 [--device cuda|cpu] [--gc none|backward|ideal]
                 [--fit --gpu-memory 80GB [--host-memory 512GB]]
  MODEL: a Hugging Face model dir, a config.json, a cached hub id, or a built-in name
  --gc: when Lua's collector frees forward temporaries; the default, backward, is what zrun
        does (it collects before backward and around checkpointed segments); none and ideal
        are what-ifs]==]

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
    fit = 1, ["gpu-memory"] = 1, ["host-memory"] = 1, help = 1 }
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
  local opts = { model = pos[1], config = o.config, micro_batch = int("micro-batch", 1), seq_len = int("seq-len"),
    gpus_per_node = int("gpus-per-node", 1) or int("gpus", 1) or 1, nodes = int("nodes", 1) or 1, stage = int("stage"),
    dtype = o.dtype, gradient_checkpointing = o["gradient-checkpointing"] or nil,
    offload_optimizer = o["offload-optimizer"] or nil, offload_param = o["offload-param"] or nil,
    device = o.device, gc = gc, gpu_memory = o["gpu-memory"], host_memory = o["host-memory"] }
  if opts.dtype == nil and not opts.config and (opts.device or "cuda") ~= "cpu" then opts.dtype = "bf16" end
  print(tostring(M.plan(opts)))
  if o.fit then
    if not o["gpu-memory"] then error("zrun plan --fit needs --gpu-memory (e.g. --gpu-memory 80GB)", 0) end
    print("")
    print(tostring(M.fit(opts)))
  end
  return 0
end

return M
