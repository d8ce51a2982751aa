-- zr.memory.plan against what the engine really allocates: a tiny Llama trained through
-- zr.initialize at ZeRO stages 0-3 (one process), each with and without activation
-- checkpointing, with micro-batches and sequence lengths that make activations dominate. zrun
-- runs as it is: a plain loop (out = engine(ids, ids); engine:backward(out.loss); engine:step())
-- with no collectgarbage of ours, so only the engine's and zr.checkpoint's collections free Lua
-- garbage. The allocator's peak per category must be within 10% of the plan for params, grads,
-- optimizer and activations; the stage-3 parameter peaks are also checked against hand-computed
-- sizes. Also the partition arithmetic for several ranks (worked by hand) and the fit advice.
local zr = require "zrun"
local T = zr.testing
local P = require "zrun.memory_plan"
local Module = require "zrun.nn.module"
local mem = zr.memory

local CATS = { "params", "grads", "optimizer", "activations" }
local STEPS = 3 -- steps 2.. see the previous step's batch, logits and loss as uncollected garbage

local CLASS = { llama = "LlamaForCausalLM", mistral = "MistralForCausalLM", qwen2 = "Qwen2ForCausalLM",
  qwen3 = "Qwen3ForCausalLM" }
local batch = T.token_batch -- a causal-LM batch as a collator builds it (category "other")

-- Builds the model and the engine, then trains STEPS steps. Returns the peak of each category
-- during setup (construction + zr.initialize) and during training, above the baseline, and the plan.
local function measure(c)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.model_type = c.model_type or cfg.model_type -- Mistral, Qwen2: the same shapes (Qwen2 with q/k/v biases)
  cfg.num_hidden_layers = c.layers
  cfg.tie_word_embeddings = c.tied or false
  cfg.vocab_size = c.V or cfg.vocab_size
  -- the baseline: earlier cases' memory freed (not a measured run), or a late free during this case
  -- would lower its measured peaks (T.collect_all: compiled traces flushed, then collections until
  -- nothing more is freed)
  T.collect_all()
  local base = mem.stats()
  mem.reset_peak()
  zr.manual_seed(7)
  -- stage 3 in one process keeps every parameter resident unless ZRUN_STAGE3_GATHER=1 asks for
  -- the partitioned path a rank of a multi-rank run takes (what most cases here measure)
  zr.setenv("ZRUN_STAGE3_GATHER", c.stage == 3 and not c.solo and "1" or nil)
  zr.setenv("ZRUN_OFFLOAD_GRADS", c.offload) -- where offloaded gradients live: "device" or "host"
  local model = zr.models.llama[CLASS[cfg.model_type]](cfg)
  -- LoRA: the base frozen, adapters on the targets (PEFT's get_peft_model), before zr.initialize as in a script
  local lcfg = c.lora and zr.peft.LoraConfig { r = c.lora.r, lora_alpha = 2 * c.lora.r,
    lora_dropout = c.lora.lora_dropout, target_modules = c.lora.target_modules }
  if lcfg then zr.peft.get_peft_model(model, lcfg) end
  if c.ckpt then model:gradient_checkpointing_enable() end
  local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = c.B, steps_per_print = 1e6,
    optimizer = { type = "AdamW", params = { lr = 1e-3 } },
    zero_optimization = { stage = c.stage, stage3_param_persistence_threshold = c.persist or 0,
      stage3_prefetch_bucket_size = c.prefetch, stage3_max_reuse_distance = c.reuse,
      offload_optimizer = c.offload and { device = "cpu" } or nil } } })
  local st = mem.stats()
  local setup, train = {}, {}
  for _, k in ipairs(CATS) do setup[k] = st[k].peak - base[k].current end
  setup.total = st.total_peak - base.total_current -- the most live at once
  local offload_grads = engine.offload_grads
  mem.reset_peak()
  for s = 1, STEPS do
    local ids = batch(c.B, c.T, s)
    local opts = c.dft and { loss_type = "dft" } or c.chunked and { chunked_loss = c.chunked } or nil
    if c.packed then -- each row c.T / c.packed sequences of c.packed tokens, told apart by their positions
      opts = { position_ids = T.packed_positions(c.B, c.T, c.packed) }
    end
    local out = engine(ids, ids, opts)
    engine:backward(out.loss)
    engine:step()
  end
  st = mem.stats()
  for _, k in ipairs(CATS) do train[k] = st[k].peak - base[k].current end
  train.comm = st.comm.peak - base.comm.current
  -- stage 3 installs global module hooks: remove them so later cases run without
  for _, h in ipairs(engine.hook_handles or {}) do h.remove() end
  Module.fetch = nil
  engine, model = nil, nil
  collectgarbage(); collectgarbage()
  zr.setenv("ZRUN_STAGE3_GATHER", nil)
  zr.setenv("ZRUN_OFFLOAD_GRADS", nil)
  local o = { stage3_gather = c.stage == 3 and not c.solo, model = cfg, micro_batch = c.B, seq_len = c.T, stage = c.stage,
    world_size = 1,
    gradient_checkpointing = c.ckpt, device = "cpu", dtype = "f32", persistence_threshold = c.persist or 0,
    prefetch_bucket_size = c.prefetch, max_reuse_distance = c.reuse, offload_optimizer = c.offload and true,
    offload_grads = offload_grads, loss_type = c.dft and "dft" or nil, chunked_loss = c.chunked, packed = c.packed,
    lora = lcfg }
  local plan = P.plan(o)
  o.lora = nil -- (what the plan said before it knew LoRA: every parameter trained, the fused projections)
  return train, setup, plan, offload_grads, lcfg and P.plan(o)
end

local function within(name, measured, planned, report)
  if measured <= 0 then error(name .. ": nothing measured\n" .. report, 0) end
  local r = planned / measured
  if r < 0.9 or r > 1.1 then
    error(("%s: plan/measured = %.3f (outside 0.9..1.1)\n%s"):format(name, r, report), 0)
  end
end

-- tiny-llama, f32, one rank: per layer q, o 4,096; k, v 2,048; gate/up/down 11,264; norms 64
-- -> 46,208; embed and lm_head 259 x 64 = 16,576 each; final norm 64. As Qwen2: + the q, k, v
-- biases, 64 + 32 + 32 = 128 per layer; as Qwen3: + q_norm and k_norm, 16 + 16 = 32 per layer.
local EXTRA = { qwen2 = 128, qwen3 = 32 }
local function total_params(layers, tied, V, model_type)
  return layers * (46208 + (EXTRA[model_type] or 0)) + (V or 259) * 64 * (tied and 1 or 2) + 64
end

local cases = {
  { stage = 0, B = 5, T = 67, layers = 2 },
  { stage = 0, B = 5, T = 67, layers = 2, ckpt = true },
  { stage = 1, B = 3, T = 89, layers = 3 },
  { stage = 1, B = 3, T = 89, layers = 3, ckpt = true },
  { stage = 2, B = 1, T = 301, layers = 2 },                -- B = 1: the loss narrows without a copy
  { stage = 2, B = 1, T = 301, layers = 2, ckpt = true },
  -- stage 3 without prefetch and reuse (stage3_prefetch_bucket_size 0, stage3_max_reuse_distance
  -- 0): one module gathered at a time
  { stage = 3, B = 4, T = 97, layers = 3, prefetch = 0, reuse = 0 },
  { stage = 3, B = 4, T = 97, layers = 3, ckpt = true, prefetch = 0, reuse = 0 },
  { stage = 3, B = 2, T = 131, layers = 2, tied = true, prefetch = 0, reuse = 0 }, -- a tied head stays gathered through backward
  { stage = 3, B = 2, T = 131, layers = 2, tied = true, ckpt = true, prefetch = 0, reuse = 0 },
  -- reuse only: modules whose backward comes within 60,000 parameters keep theirs from forward on
  { stage = 3, B = 4, T = 97, layers = 3, prefetch = 0, reuse = 60000 },
  -- with DeepSpeed's default prefetch (5e7 elements, more than this model): from the second step
  -- the first module's prefetch brings every other module in
  { stage = 3, B = 4, T = 97, layers = 3 },
  { stage = 3, B = 2, T = 131, layers = 2, tied = true, ckpt = true },
  -- a bucket of 20,000 elements: a few modules ahead
  { stage = 3, B = 4, T = 97, layers = 3, prefetch = 20000, reuse = 0 },
  -- DeepSpeed's default persistence threshold (1e5): every parameter of the tiny model stays whole
  { stage = 3, B = 4, T = 97, layers = 3, persist = 1e5 },
  -- one process, plainly: nothing to gather, so stage 3 keeps the model resident as stage 2 does
  { stage = 3, B = 4, T = 97, layers = 3, solo = true },
  -- optimizer offload on the CPU, in one process: direct mode with the gradients either in the
  -- device partition (copied to the host through the step's ring by memcpy) or in the host one
  { stage = 2, B = 1, T = 301, layers = 2, offload = "device" },
  { stage = 2, B = 1, T = 301, layers = 2, offload = "host" },
  -- TRL's dft loss (loss_type = "dft"): the plain per-token cross-entropy, whose backward makes a second
  -- logits-sized gradient (the fused loss writes it over the logits); a vocabulary of 4,096 (ids below 259), so
  -- that the logits make the peak as in a real model; each after the same without dft (the peak it adds is checked)
  { stage = 0, B = 5, T = 67, layers = 2, V = 4096 },
  { stage = 0, B = 5, T = 67, layers = 2, V = 4096, dft = true },
  { stage = 2, B = 3, T = 89, layers = 3, V = 4096, ckpt = true },
  { stage = 2, B = 3, T = 89, layers = 3, V = 4096, ckpt = true, dft = true },
  -- the chunked LM head + loss (use_liger_kernel, TRL's chunked_nll): no logits, a slice at a time; each after the
  -- same with the logits (the peak it saves is checked)
  { stage = 0, B = 5, T = 67, layers = 2, V = 4096, chunked = 512, ref = 4 },
  { stage = 2, B = 3, T = 89, layers = 3, V = 4096, ckpt = true, chunked = 1024, ref = 3 },
  -- the default slices of so few rows: their logits (4.4 MB) kept from forward to backward (zr_linear_ce_keeps)
  { stage = 2, B = 3, T = 89, layers = 3, V = 4096, ckpt = true, chunked = true, kept = true },
  -- packed sequences (a padding-free batch: position_ids restarting every `packed` tokens), whose attention
  -- gathers the rows by group and back (zrun.models.packed)
  { stage = 0, B = 2, T = 128, layers = 2, packed = 32 },
  { stage = 0, B = 2, T = 128, layers = 2, packed = 32, ckpt = true },
  { stage = 2, B = 1, T = 256, layers = 3, packed = 64 },
  -- LoRA (zr.peft.get_peft_model before zr.initialize): the base frozen (no gradient, no optimizer state, whole),
  -- the adapters trained; adapted projections run as zr.lora_multi (q/k/v and gate/up one op each when one of them is
  -- adapted), each op keeping its input and its (N, Σ r) product
  { stage = 0, B = 5, T = 67, layers = 2, lora = { r = 4 } }, -- PEFT's default targets: q_proj, v_proj
  { stage = 0, B = 5, T = 67, layers = 2, lora = { r = 4 }, ckpt = true },
  { stage = 2, B = 3, T = 89, layers = 3, lora = { r = 8, target_modules = "all-linear", lora_dropout = 0.1 } },
  { stage = 2, B = 3, T = 89, layers = 3, lora = { r = 8, target_modules = "all-linear", lora_dropout = 0.1 },
    ckpt = true },
  { stage = 0, B = 2, T = 128, layers = 2, lora = { r = 16, target_modules = { "k_proj", "o_proj", "up_proj" },
    lora_dropout = 0.05 } },
  { stage = 2, B = 1, T = 301, layers = 2, lora = { r = 2, target_modules = { "v_proj", "down_proj" } } },
  { stage = 3, B = 4, T = 97, layers = 3, prefetch = 0, reuse = 0, lora = { r = 4, target_modules = "all-linear" } },
  -- a bucket of 1,000 elements: the prefetch chain runs through the groups' adapters (lora_A, lora_B in module order)
  { stage = 3, B = 4, T = 97, layers = 3, prefetch = 1000, reuse = 0, lora = { r = 4, target_modules = "all-linear" } },
  -- a regex: layer 0 untouched (nothing recorded through it), q and gate adapted in layers 1 and 2
  { stage = 0, B = 3, T = 64, layers = 3, lora = { r = 4, target_modules = ".*\\.layers\\.[12]\\..*(q|gate)_proj" } },
  -- packed sequences (SFT's packing with LoRA): the lora_multi q/k/v product gathered into the group as the plain one
  { stage = 2, B = 2, T = 128, layers = 2, packed = 32, lora = { r = 8, lora_dropout = 0.1 } },
  { stage = 2, B = 2, T = 128, layers = 2, packed = 32, lora = { r = 8, lora_dropout = 0.1 }, ckpt = true },
}
-- Mistral and Qwen2 (llama.lua's model types): Qwen2's q/k/v biases are parameters of their own (a bias in the
-- fused q/k/v product, zr.linear_multi), gathered at stage 3 with their weights, prefetched after them, and kept
-- whole below the persistence threshold by their own size
-- Qwen3: the q/k/v product split into views, q_norm / k_norm (small parameters of their own, gathered at stage 3
-- between the product and o_proj) and the unfused attention path (llama.lua), byte-exact on the time-line
-- (tests/mpi/plan_timeline_check.lua) and within these tolerances here
local PLAN_TYPES = { "qwen2", "mistral", "qwen3" }
for _, mt in ipairs(PLAN_TYPES) do
  for _, c in ipairs {
    { stage = 0, B = 5, T = 67, layers = 2 },
    { stage = 1, B = 3, T = 89, layers = 3, ckpt = true },
    { stage = 2, B = 1, T = 301, layers = 2 },
    { stage = 3, B = 4, T = 97, layers = 3, prefetch = 0, reuse = 0 },
    { stage = 3, B = 4, T = 97, layers = 3 },
    { stage = 3, B = 2, T = 131, layers = 2, tied = true, ckpt = true },
    { stage = 3, B = 4, T = 97, layers = 3, prefetch = 20000, reuse = 0 },
    { stage = 3, B = 4, T = 97, layers = 3, prefetch = 0, reuse = 60000 },
    { stage = 0, B = 5, T = 67, layers = 2, lora = { r = 4 } },
    { stage = 2, B = 3, T = 89, layers = 3, lora = { r = 8, target_modules = "all-linear", lora_dropout = 0.1 },
      ckpt = true },
    { stage = 3, B = 4, T = 97, layers = 3, prefetch = 0, reuse = 0, lora = { r = 4, target_modules = "all-linear" } },
  } do
    c.model_type = mt
    cases[#cases + 1] = c
  end
end
local results = {}
for i, c in ipairs(cases) do
  local name = ("plan within 10%% of measured peaks: stage %d, B=%d T=%d, %d layers%s%s%s%s%s%s"):format(c.stage, c.B, c.T,
    c.layers, c.solo and ", resident (one process)" or "", c.tied and ", tied" or "", c.ckpt and ", checkpointing" or "",
    c.prefetch and (", prefetch " .. c.prefetch) or "", c.reuse and (", reuse " .. c.reuse) or "",
    c.offload and (", optimizer offload, gradients in the " .. c.offload .. " partition") or "") ..
    (c.V and (", vocabulary " .. c.V) or "") .. (c.dft and ", loss_type dft" or "") ..
    (c.chunked and (", chunked loss " .. tostring(c.chunked)) or "") ..
    (c.packed and (", packed sequences of " .. c.packed) or "") .. (c.lora and (", LoRA r " .. c.lora.r .. " on " ..
    (type(c.lora.target_modules) == "table" and table.concat(c.lora.target_modules, "/") or c.lora.target_modules or
    "q_proj/v_proj") .. (c.lora.lora_dropout and (", dropout " .. c.lora.lora_dropout) or "")) or "")
  if c.model_type then name = c.model_type .. ": " .. name end
  T.test(name, function()
    local m, setup, plan, offload_grads, plain = measure(c)
    results[i] = m
    local lines = {}
    for _, k in ipairs(CATS) do
      lines[#lines + 1] = ("%-12s measured %9d planned %9d"):format(k, m[k], plan.device[k] + plan.host[k])
    end
    lines[#lines + 1] = ("%-12s measured %9d planned %9d"):format("setup params", setup.params, plan.setup.params)
    local report = table.concat(lines, "\n")
    print(report)
    for _, k in ipairs(CATS) do within(k, m[k], plan.device[k] + plan.host[k], report) end
    within("setup params", setup.params, plan.setup.params, report)
    if c.lora then
      -- the plan that ignored LoRA (every parameter trained, fused projections) is far off: it fails here
      local off = 0
      for _, k in ipairs { "grads", "optimizer", "activations" } do
        local r = (plain.device[k] + plain.host[k]) / m[k]
        if r < 0.9 or r > 1.1 then off = off + 1 end
      end
      T.eq(off >= 2, true, "a plan without lora misses at least two categories by more than 10%")
      local base, trained = total_params(c.layers, c.tied, nil, c.model_type), plan.settings.lora_plan.trained
      T.eq(plan.settings.lora_plan.frozen, base, "the frozen base: the model's parameters")
      T.eq(plan.total_params, base + trained)
      if c.stage == 3 then
        -- the frozen base stays whole beside the adapters' shard (the whole adapter set on one rank), plus the
        -- adapters gathered at once: a group's (q/k/v, gate/up: one zr.lora_multi, Module.call_group running the
        -- hooks of every lora_A and lora_B of the group around it), the largest gate/up's: 2 x (A 4 x 64 + B 176 x 4)
        -- = 1,920 (q/k/v's 1,280; o's 512; down's 960)
        if c.prefetch == 0 and c.reuse == 0 then
          T.eq(plan.device.params, (base + trained + 1920) * 4, "planned: base + adapter shard + gate/up's adapters")
          T.eq(m.params, (base + trained + 1920) * 4, "measured: base + adapter shard + gate/up's adapters")
        else -- (prefetched adapters beside them: more)
          T.eq(m.params > (base + trained + 1920) * 4, true, "measured: more gathered with a bucket")
          T.eq(plan.device.params, m.params, "planned stage 3 params with a bucket")
        end
      else
        T.eq(m.params, (base + trained) * 4, "the frozen base and the adapters, once each")
        T.eq(setup.params, (base + 2 * trained) * 4, "setup: + the adapters' flat copy (direct mode)")
      end
      T.eq(m.grads >= trained * 4, true)
      T.eq(m.optimizer, 12 * trained, "master + exp_avg + exp_avg_sq of the adapters only")
    elseif c.offload then
      -- by hand (f32, one rank: the partition is the model, n elements): direct mode keeps the
      -- model in one flat buffer, copied from the model as built (setup: both, 8n bytes), with
      -- .grad views into the f32 gradient partition (4n) and no buckets; master + exp_avg +
      -- exp_avg_sq 12n. The flat copy is made before the gradient partition: the setup's peak is
      -- 12n + 8n, not 12n + 8n + 4n. The ring (offload.c) holds 3 chunks of min(2^24, n) = n
      -- elements, each an f32 in-slot (3 x n x 4 bytes), made when the gradients come from the
      -- device partition (with them in the host partition the step reads them in place); no
      -- out-slots: on the CPU the new weights are written into the flat buffer in place.
      local n = total_params(c.layers, c.tied, nil, c.model_type)
      T.eq(offload_grads, c.offload, "the engine's placement")
      T.eq(m.params, 4 * n, "offload: the model once"); T.eq(setup.params, 8 * n, "offload setup: model + flat copy")
      T.eq(m.grads, 4 * n, "offload: the gradient partition, no .grad besides")
      T.eq(m.optimizer, 12 * n, "offload: master + states")
      local ring = c.offload == "device" and 3 * n * 4 or 0
      T.eq(m.comm, ring, "offload: the ring, nothing else")
      T.eq(plan.device.comm + plan.host.comm, ring, "planned ring")
      T.eq(plan.device.comm, 0, "direct mode: no buckets planned")
      T.eq(plan.setup.params, 8 * n, "planned setup: model + flat copy")
      -- on the CPU the plan's device column (the model, its flat copy, a device gradient
      -- partition) and its host column (the states; host gradients) are the same memory
      T.eq(plan.setup.total, 8 * n, "planned setup peak, device column: model + flat copy, the gradients after")
      if c.offload == "device" then
        T.eq(plan.timeline[1].host, 12 * n, "planned setup, host column: master + states")
        within("setup total", setup.total, 20 * n, report .. ("\nsetup total measured %d"):format(setup.total))
      end
    elseif c.solo then
      -- the model once (no shard beside it, nothing gathered), and no gradient buckets
      T.eq(m.params, total_params(c.layers, c.tied, nil, c.model_type) * 4, "stage 3 in one process: the model once")
      T.eq(plan.device.comm, 0, "stage 3 in one process: no buckets planned")
    elseif c.stage == 3 and c.persist then
      -- persistent parameters are never released: the whole model stays beside its shard
      -- (+ the largest parameter: refreshing a persistent parameter after the step gathers its new
      -- copy before the old one is freed)
      T.eq(m.params, (2 * total_params(c.layers, c.tied, nil, c.model_type) + 16576) * 4, "stage 3 persistent params = model + shard")
    elseif c.stage == 3 and c.prefetch == nil then
      -- by hand: the shard plus the whole model (everything prefetched at once)
      local n = total_params(c.layers, c.tied, nil, c.model_type)
      T.eq(m.params, 2 * n * 4, "stage 3 params with prefetch = shard + whole model")
      T.eq(plan.device.params, 2 * n * 4, "planned stage 3 params with prefetch (Qwen2: the biases prefetched too)")
    elseif c.stage == 3 and (c.prefetch > 0 or c.reuse > 0) then
      -- more than one module, less than the model: the bucket bounds what is ahead
      local n = total_params(c.layers, c.tied, nil, c.model_type)
      T.eq(m.params > (n + 16576) * 4 and m.params < 2 * n * 4, true, "stage 3 params with a small bucket / reuse")
      T.eq(plan.device.params, m.params, "planned stage 3 params with a small bucket / reuse")
    elseif c.stage == 3 then
      -- by hand: the 16-bit shard (the whole model on one rank) plus the largest set gathered at
      -- once: the parameters of one op, gate/up (2 x 176 x 64 = 22,528: llama.lua runs them as one
      -- product, their modules' hooks around it), and with a tied head the embedding (259 x 64,
      -- kept until backward ends) too
      local n = total_params(c.layers, c.tied, nil, c.model_type)
      local gathered = c.tied and (16576 + 22528) or 22528
      T.eq(m.params, (n + gathered) * 4, "stage 3 params = shard + gathered")
      T.eq(plan.device.params, (n + gathered) * 4, "planned stage 3 params")
      -- setup: the whole model, built before zr.initialize partitions it, plus its shard
      T.eq(setup.params, 2 * n * 4, "stage 3 setup params = model + shard")
    else
      T.eq(m.params, total_params(c.layers, c.tied, c.V, c.model_type) * 4, "stages 0-2 keep the whole model")
    end
    if c.dft then
      -- the peak of the same run without (the one before) + at least half a logits-sized f32 tensor (B x T x V x 4
      -- bytes; measured: 0.79 and 0.75 of one, the peak falls elsewhere than the second gradient's whole size)
      local nll = results[i - 1]
      T.eq(nll ~= nil and m.activations - nll.activations >= c.B * c.T * c.V * 2, true,
        ("dft adds a logits-sized gradient: %d -> %d"):format(nll and nll.activations or -1, m.activations))
    elseif c.chunked and not c.kept then
      -- the peak of the same run with the logits (c.ref cases before) less at least half the f32 logits (B x T x V x 4)
      local full = results[i - c.ref]
      T.eq(full ~= nil and full.activations - m.activations >= c.B * c.T * c.V * 2, true,
        ("the chunked loss keeps no logits: %d -> %d"):format(full and full.activations or -1, m.activations))
    elseif c.V then -- (the larger head's parameters outweigh the activations: the next case compares with this one)
    elseif c.lora and c.stage == 3 then
    elseif not c.ckpt then
      -- activations dominate these runs, so a plan that ignored them would fail
      T.eq(m.activations > m.params + m.grads + m.optimizer, true, "activations are significant")
    else
      -- the collections in zr.checkpoint make checkpointing pay: compare with the run before
      local full = results[i - 1]
      T.eq(full ~= nil and m.activations < 0.8 * full.activations, true, "checkpointing saves activations")
    end
  end)
end

T.test("gc: the default is what zrun does; other modes are what-ifs", function()
  T.eq(P.DEFAULT_GC, "backward")
  local o = { model = "zrun/tiny-llama", micro_batch = 3, seq_len = 89, stage = 2, device = "cpu", dtype = "f32",
    gradient_checkpointing = true }
  local p = P.plan(o)
  T.eq(p.settings.gc, "backward")
  T.eq(tostring(p):find("what-if", 1, true), nil, "no what-if note for zrun's behaviour")
  o.gc = "none" -- nothing collected in the step: the previous step's leftovers stay (segments still free theirs)
  local pn = P.plan(o)
  T.eq(pn.device.activations > p.device.activations, true)
  T.eq(tostring(pn):find("what-if", 1, true) ~= nil, true)
  o.gc = "ideal"
  T.eq(P.plan(o).device.activations <= p.device.activations, true)
end)

T.test("partitions over several ranks (hand-computed)", function()
  -- tiny-llama over 3 ranks, chunk = ceil(n/3): embed and lm_head 16,576 -> 5,526 each;
  -- per layer q, o 4,096 -> 1,366; k, v 2,048 -> 683; gate/up/down 11,264 -> 3,755; norms 64 -> 22
  -- layer = 2*1,366 + 2*683 + 3*3,755 + 2*22 = 15,407; x2 = 30,814; + 2*5,526 + 22 -> S = 41,888
  local p = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 2, micro_batch = 1, seq_len = 8, device = "cpu", dtype = "f32" }
  T.eq(p.partition_numel, 41888)
  T.eq(p.device.optimizer, 3 * 41888 * 4, "master + exp_avg + exp_avg_sq")
  -- data_types.grad_accum_dtype bf16 (GPU): the gradient partition in 2 bytes, states unchanged
  local pg = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 2, micro_batch = 1, seq_len = 8,
    device = "cuda", dtype = "bf16", grad_accum_dtype = "bf16" }
  T.eq(pg.setup.grads, 41888 * 2, "bf16 gradient partition")
  pg = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 2, micro_batch = 1, seq_len = 8,
    device = "cuda", dtype = "bf16", config = { train_micro_batch_size_per_gpu = 1,
    data_types = { grad_accum_dtype = "bf16" } } }
  T.eq(pg.setup.grads, 41888 * 2, "from the DeepSpeed config")
  T.eq(pg.device.optimizer, 3 * 41888 * 4)
  local pf32 = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 2, micro_batch = 1, seq_len = 8,
    device = "cuda", dtype = "bf16" }
  T.eq(pf32.setup.grads, 41888 * 4, "fp32 by default")
  -- bf16 stage 3 with offloaded optimizer and params: shard (2 bytes) and states on the host;
  -- on the device only the gathered parameters (the largest op's, gate/up: 22,528 x 2 bytes)
  p = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 3, micro_batch = 1, seq_len = 8, dtype = "bf16",
    offload_optimizer = true, offload_param = true, persistence_threshold = 0, prefetch_bucket_size = 0,
    max_reuse_distance = 0 }
  T.eq(p.host.optimizer, 3 * 41888 * 4); T.eq(p.host.params, 41888 * 2); T.eq(p.device.optimizer, 0)
  T.eq(p.device.params, 22528 * 2)
  -- offload_optimizer.ratio 0.25: a quarter of the master and states (ceil(0.25 x 41,888) = 10,472
  -- elements) on the host, the rest on the device, and the gradients on the device
  local pr = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 3, micro_batch = 1, seq_len = 8, dtype = "bf16",
    offload_optimizer = true, offload_ratio = 0.25, persistence_threshold = 0 }
  T.eq(pr.host.optimizer, 3 * 10472 * 4); T.eq(pr.device.optimizer, 3 * (41888 - 10472) * 4)
  T.eq(pr.host.grads, 0); T.eq(pr.device.grads >= 41888 * 4, true, "the gradient partition on the device")
  pr = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 3, micro_batch = 1, seq_len = 8, dtype = "bf16",
    config = { train_micro_batch_size_per_gpu = 1, zero_optimization = { stage = 3,
      offload_optimizer = { device = "cpu", ratio = 0.25 } } } }
  T.eq(pr.host.optimizer, 3 * 10472 * 4, "ratio from the DeepSpeed config")
  -- stage 3 on the device over 3 ranks: shard + the largest op's parameters (gate/up); setup:
  -- whole model + shard
  p = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 3, micro_batch = 1, seq_len = 8, dtype = "bf16",
    persistence_threshold = 0, prefetch_bucket_size = 0, max_reuse_distance = 0 }
  T.eq(p.device.params, (41888 + 22528) * 2)
  -- the same with the default prefetch (5e7 > the whole model of 125,632): shard + every module
  local pf = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 3, micro_batch = 1, seq_len = 8, dtype = "bf16",
    persistence_threshold = 0 }
  T.eq(pf.device.params, (41888 + 125632) * 2)
  -- stage3_max_live_parameters bounds it: a prefetch starts parameters only while fewer than that
  -- many elements are live (DeepSpeed's rule: the one crossing the bound starts too), so the live
  -- ones stay below the bound + the largest parameter (gate, up or down: 11,264); an op's own
  -- parameters are gathered whatever the bound (gate/up's 22,528 above 20,000)
  for _, ml in ipairs { 30000, 20000 } do
    pf = P.plan { model = "zrun/tiny-llama", world_size = 3, stage = 3, micro_batch = 1, seq_len = 8, dtype = "bf16",
      persistence_threshold = 0, max_live_parameters = ml, max_reuse_distance = 0 }
    local live = pf.device.params / 2 - 41888
    T.eq(live >= 22528 and live < ml + 11264, true, ("max_live %d bound: %d live"):format(ml, live))
  end
  T.eq(p.setup.params, (125632 + 41888) * 2)
  -- stage 0 keeps whole parameters: S = P = 125,632
  p = P.plan { model = "zrun/tiny-llama", world_size = 4, stage = 0, micro_batch = 1, seq_len = 8 }
  T.eq(p.partition_numel, 125632)
  T.raises(function() P.plan { model = "zrun/tiny-llama", stage = 2, offload_param = true } end, "needs stage 3")
  T.raises(function() P.plan { model = "zrun/tiny-llama", seq_len = 1 } end, "at least 2")
end)

T.test("the GPU plan of the tiny Llama is the H200's measured peak (issue 17)", function()
  -- tests/cuda/test_plan_timeline_gpu.sh on one H200 (RESULTS.md, session 6): stage 0, B=4 T=97,
  -- 2 layers, bf16, measured 7,781,262 B. head_dim 16 runs CUDA's f32 attention composition, whose
  -- (B, Hq, T, T) scores the plan once left out (it planned the flash kernel: 4,955,688 B).
  local cfg = require("zrun.models.llama").config("zrun/tiny-llama")
  cfg.num_hidden_layers = 2
  local ds = { train_micro_batch_size_per_gpu = 4, optimizer = { type = "AdamW", params = { lr = 1e-3 } },
    bf16 = { enabled = true }, zero_optimization = { stage = 0 } }
  local p = P.plan { model = cfg, config = ds, seq_len = 97, device = "cuda" }
  -- After qkv_rope (session 7: no q/k copies, f32 rope tables) the H200 measured 7,663,310 B, planned
  -- to the byte (sh tests/cuda/test_plan_timeline_gpu.sh, RESULTS.md session 7). The loss's gradient
  -- written over the logits (cross_entropy inplace) plans 151,320 B less: 7,511,990 B, what the H200
  -- measured in session 21 before zr.qkv_rope_sdpa came back; its composition (head_dim 16 is not
  -- the Hopper kernels') releases q, k, v and the attention's output in C: the H200 measured
  -- 7,362,998 B (`sh tests/cuda/test_plan_timeline_gpu.sh`, RESULTS.md session 21).
  T.eq(p.training_total, 7362998)
  -- what the peak is made of adds up to it
  local n = 0
  for _, v in pairs(p.training_at_peak) do n = n + v end
  T.eq(n, p.training_total)
end)

T.test("peak total is the time-line's maximum (hand-computed, stage 2 on 2 ranks)", function()
  -- tiny-llama, f32, 2 ranks, micro-batch 1 x 8 tokens: P = 125,632; S = sum ceil(n/2) = 62,816
  -- (per layer q, o 2,048; k, v 1,024; gate/up/down 5,632; norms 32 -> 23,104; x2 + embed and
  -- head 8,288 each + final norm 32). The bucket holds S elements (5e8/2 is larger).
  local P_, S = 125632, 62816
  local p = P.plan { model = "zrun/tiny-llama", stage = 2, world_size = 2, micro_batch = 1, seq_len = 8, device = "cpu",
    dtype = "f32" }
  T.eq(p.partition_numel, S)
  -- from setup on: the whole model 4P, the gradient partition 4S, master + exp_avg + exp_avg_sq
  -- 12S, the buckets: send 2S, its compaction 2S and the receive buffer S, f32
  local states = 4 * P_ + 4 * S + 12 * S + (2 * S + 2 * S + S) * 4
  T.eq(p.timeline[1].phase, "setup"); T.eq(p.timeline[1].device, states)
  -- at the optimizer step: + the all-gather of the new weights (send S, receive 2S, f32) + what
  -- backward left live: the final hidden states 8 x 64 f32 (out keeps them for its lazy logits;
  -- the logits became the loss's gradient and died in backward), the loss (4 bytes), the batch's
  -- ids (8 x i64), and the model's cached rope tables (cos and sin, 8 positions x head_dim 16, f32);
  -- the previous step's hidden states, loss and ids too: garbage, but 2,116 bytes are less than
  -- 1/256 of the ~3.5 MB live, so engine:backward ran no collection (C.collect_tensor_garbage)
  local left = 8 * 64 * 4 + 4 + 8 * 8
  local step = states + (S + 2 * S) * 4 + 2 * left + 2 * 8 * 16 * 4
  T.eq(p.timeline[3].phase, "optimizer step"); T.eq(p.timeline[3].device, step)
  T.eq(p.device.total, step, "the peak is the step's (the activations here are a few KiB)")
  T.eq(p.peak_in.device, "optimizer step")
  -- each category's own peak added up counts the step's all-gather (comm) and the backward's
  -- activations and gradients at once: more than ever is live
  T.eq(p.device.sum > p.device.total, true)
  T.eq(p.device.comm, (5 * S + 3 * S) * 4, "comm's own peak: the buckets + the all-gather")
  T.eq(tostring(p):find("the most live at once: device in optimizer step", 1, true) ~= nil, true, tostring(p))
end)

T.test("fit follows stage 2, stage 3, offload, checkpointing, micro-batch", function()
  -- Llama-3.2-1B in bf16 on one 24 GB GPU: stage 0 needs > 30 GiB (fp32 grads + Adam states),
  -- stage 2 still holds 13.8 GiB of optimizer states; on one rank stage 3 shards nothing (and
  -- the model is built whole first), so it is skipped and the optimizer goes to the host
  local f = P.fit { model = "meta-llama/Llama-3.2-1B", micro_batch = 1, seq_len = 1024, dtype = "bf16", gpu_memory = "24GB" }
  T.eq(f.fits, true)
  T.eq(f.settings.stage, 2); T.eq(f.settings.offload_optimizer, true); T.eq(f.settings.micro_batch, 1)
  T.eq(f.steps[2].change, "stage 2")
  T.eq(f.steps[3].change, "stage 3"); T.eq(f.steps[3].skipped, true)
  T.eq(f.text:find("why:", 1, true) ~= nil, true)
  -- Llama-3-8B on 8 x 40 GB: stage 2 keeps the 15 GiB of 16-bit weights on every rank and does
  -- not fit (44.4 GiB at its peak: on 48 GB GPUs it would); stage 3 keeps 1/8 of them plus the
  -- largest gathered module (the 128,256 x 4,096 embedding, 1 GiB) and fits; its setup peak
  -- (whole model + shard + states) fits too
  f = P.fit { model = "meta-llama/Meta-Llama-3-8B", micro_batch = 1, seq_len = 2048, dtype = "bf16",
    gpus_per_node = 8, gpu_memory = "40GB" }
  T.eq(f.fits, true); T.eq(f.settings.stage, 3); T.eq(f.settings.offload_optimizer, false)
  T.eq(#f.steps, 3); T.eq(f.steps[3].change, "stage 3")
  local s2, s3 = f.steps[2].plan, f.steps[3].plan
  T.eq(s2.device.params, 8030261248 * 2)
  -- + the norm weights (65 of 4,096), below the default persistence threshold 1e5, kept whole,
  -- + what the embedding's prefetch (5e7 elements) starts: q, k, v, o of layer 1 (4,096^2 twice,
  -- 4,096 x 1,024 twice: 41.9 M) and the gate projection (14,336 x 4,096), which crosses the bucket
  -- and starts too (DeepSpeed's rule), + the up projection, which q/k/v's prefetch starts (the others
  -- are in flight already)
  T.eq(s3.device.params, math.ceil(8030261248 / 8) * 2 + 128256 * 4096 * 2 + 65 * 4096 * 2 +
    (2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 14336 * 4096) * 2)
  T.eq(s3.device.total < s2.device.total, true, "stage 3 saves parameter memory")
  T.eq(s3.setup.params, 8030261248 * 2 + math.ceil(8030261248 / 8) * 2)
  -- an H200 fits the 1B model as configured
  f = P.fit { model = "meta-llama/Llama-3.2-1B", micro_batch = 1, seq_len = 1024, dtype = "bf16", gpu_memory = "141GB" }
  T.eq(#f.steps, 1); T.eq(f.fits, true)
  -- nothing fits a 2 GB GPU: it says so
  f = P.fit { model = "meta-llama/Meta-Llama-3-8B", micro_batch = 2, seq_len = 512, dtype = "bf16", gpu_memory = "2GB" }
  T.eq(f.fits, false); T.eq(f.text:find("nothing fits", 1, true) ~= nil, true)
  T.eq(P.parse_bytes("80GB"), 80 * 2 ^ 30); T.eq(P.parse_bytes("512 MiB"), 512 * 2 ^ 20)
  T.raises(function() P.parse_bytes("lots") end, "memory size")
end)

T.test("Mistral's and Qwen2's sliding window: a longer sequence runs where the window does, else the composition is noted", function()
  local function has_note(p) return tostring(p):find("longer than sliding_window", 1, true) ~= nil end
  local o = { model = { model_type = "mistral", hidden_size = 64, intermediate_size = 176, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, vocab_size = 259, sliding_window = 64 }, micro_batch = 1,
    seq_len = 65, stage = 0, device = "cpu", dtype = "f32" }
  T.eq(has_note(P.plan(o)), false, "the CPU masks 65 tokens with a window of 64")
  o.device = "cuda"
  local p = P.plan(o)
  T.eq(has_note(p), true, "a GPU in f32")
  T.eq(tostring(p):find("mistral: rows of 65 tokens are longer than sliding_window (64): the attention runs its f32 " ..
    "composition masked by each row's window, planned here without the masks", 1, true) ~= nil, true, tostring(p))
  o.dtype = "bf16"
  T.eq(has_note(P.plan(o)), true, "a GPU in bf16 at head_dim 16")
  o.model.head_dim = 64
  T.eq(has_note(P.plan(o)), false, "a GPU in bf16 at head_dim 64: the flash kernels take the window")
  o.model.head_dim = 96
  T.eq(has_note(P.plan(o)), false, "head_dim 96: padded to 128")
  o.model.head_dim, o.dtype = nil, "f32"
  o.seq_len = 64
  T.eq(has_note(P.plan(o)), false, "64 tokens: causal")
  o.seq_len, o.packed = 256, 32 -- packed sequences: each attends to itself
  T.eq(has_note(P.plan(o)), false, "packed sequences of 32 fit")
  o.model.sliding_window, o.packed, o.seq_len = false, nil, 65 -- (Mistral v0.3: none)
  T.eq(has_note(P.plan(o)), false, "no window")
  o.model = { model_type = "qwen2", hidden_size = 64, intermediate_size = 176, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, vocab_size = 259, use_sliding_window = true, sliding_window = 64,
    max_window_layers = 1 }
  T.eq(has_note(P.plan(o)), true, "Qwen2 on a GPU in f32: layer 1 slides")
  o.model.use_sliding_window = false
  T.eq(has_note(P.plan(o)), false, "Qwen2: use_sliding_window false")
end)

T.test("zrun plan refuses counts of zero and non-integers (issue 16: --micro-batch 0 planned zero)", function()
  local function plan(...) return P.main_plan({ "zrun/tiny-llama", "--device", "cpu", ... }) end
  T.raises(function() plan("--micro-batch", "0") end, "zrun plan: --micro-batch must be at least 1, got 0")
  T.raises(function() plan("--micro-batch", "-3") end, "zrun plan: --micro-batch must be at least 1, got -3")
  T.raises(function() plan("--micro-batch", "2.5") end, "zrun plan: --micro-batch must be an integer, got '2.5'")
  T.raises(function() plan("--micro-batch", "1e400") end, "zrun plan: --micro-batch must be an integer, got '1e400'")
  T.raises(function() plan("--nodes", "0") end, "zrun plan: --nodes must be at least 1, got 0")
  T.raises(function() plan("--gpus-per-node", "0") end, "zrun plan: --gpus-per-node must be at least 1, got 0")
  T.raises(function() plan("--seq-len", "1") end, "seq_len must be at least 2")
  T.raises(function() P.plan { model = "zrun/tiny-llama", micro_batch = 0 } end,
    "memory plan: micro_batch must be a positive integer, got 0")
  T.raises(function() P.plan { model = "zrun/tiny-llama", config = { train_micro_batch_size_per_gpu = 0 } } end,
    "train_micro_batch_size_per_gpu")
  local out = {}
  local print0 = print
  print = function(s) out[#out + 1] = s end -- luacheck: ignore
  local ok, rc = pcall(plan, "--micro-batch", "1", "--seq-len", "8")
  print = print0 -- luacheck: ignore
  T.eq(ok and rc, 0, "a micro-batch of 1 plans")
  T.eq(table.concat(out, "\n"):find("micro-batch 1 x 8 tokens", 1, true) ~= nil, true)
  -- SFT's settings: TRL's loss_type and padding-free batches, said in the plan's settings line
  out = {}
  print = function(s) out[#out + 1] = s end -- luacheck: ignore
  ok, rc = pcall(plan, "--micro-batch", "2", "--seq-len", "64", "--loss-type", "dft", "--packed", "32")
  print = print0 -- luacheck: ignore
  T.eq(ok and rc, 0, tostring(rc))
  T.eq(table.concat(out, "\n"):find("micro-batch 2 x 64 tokens, packed sequences of 32, dft loss", 1, true) ~= nil, true)
  T.raises(function() plan("--loss-type", "focal") end, 'memory plan: loss_type must be "nll", "chunked_nll" or "dft", got focal')
  T.raises(function() plan("--packed", "0") end, "zrun plan: --packed must be at least 1, got 0")
  T.raises(function() plan("--micro-batch", "1", "--seq-len", "100", "--packed", "7") end,
    "packed must be true or a sequence length dividing micro_batch x seq_len = 100, got 7")
  -- LoRA: --lora-r on, said in the settings line with the adapted projections and the trained count
  -- (tiny-llama, r 4 on all seven projections of 2 layers: q, o 2 x 256; k, v 256 + 128; gate, up, down 256 + 704
  -- -> 4,672 a layer, 9,344)
  out = {}
  print = function(s) out[#out + 1] = s end -- luacheck: ignore
  ok, rc = pcall(plan, "--micro-batch", "2", "--seq-len", "16", "--lora-r", "4", "--lora-target-modules", "all-linear",
    "--lora-dropout", "0.05")
  print = print0 -- luacheck: ignore
  T.eq(ok and rc, 0, tostring(rc))
  local text = table.concat(out, "\n")
  T.eq(text:find("micro-batch 2 x 16 tokens, LoRA r 4 on q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, " ..
    "down_proj (dropout 0.05): 9,344 trained", 1, true) ~= nil, true, text)
  out = {}
  print = function(s) out[#out + 1] = s end -- luacheck: ignore
  ok, rc = pcall(plan, "--seq-len", "16", "--lora-r", "2", "--lora-target-modules", "v_proj, down_proj")
  print = print0 -- luacheck: ignore
  T.eq(ok and rc, 0, tostring(rc))
  -- v: 2 x 64 + 32 x 2; down: 2 x 176 + 64 x 2 -> 672 a layer
  T.eq(table.concat(out, "\n"):find("LoRA r 2 on v_proj, down_proj: 1,344 trained", 1, true) ~= nil, true)
  T.raises(function() plan("--lora-r", "0") end, "zrun plan: --lora-r must be at least 1, got 0")
  T.raises(function() plan("--lora-r", "1.5") end, "zrun plan: --lora-r must be an integer, got '1.5'")
  T.raises(function() plan("--lora-r", "8", "--lora-dropout", "1") end,
    "zrun plan: --lora-dropout must be a number from 0 to below 1 (e.g. 0.05), got '1'")
  T.raises(function() plan("--lora-r", "8", "--lora-target-modules", "q_proj,lm_head") end,
    "zrun plan: --lora-target-modules takes q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj " ..
    "(comma-separated) or all-linear, got 'q_proj,lm_head'")
  T.raises(function() plan("--lora-dropout", "0.1") end,
    "zrun plan: --lora-target-modules and --lora-dropout need --lora-r (the adapters' rank, e.g. --lora-r 16)")
  T.raises(function() P.main_plan { "gpt2", "--lora-r", "8" } end,
    "memory plan: lora is planned for the Llama family only")
end)

T.test("LoRA model states by hand (Llama-3-8B, r 16 on q_proj / v_proj, bf16, stage 2 on 8 ranks); fit keeps it", function()
  -- per layer q: A 16 x 4,096 + B 4,096 x 16 = 131,072; v: 65,536 + 1,024 x 16 = 81,920 -> 212,992; x 32 layers
  -- = 6,815,744 trained (PEFT's print_trainable_parameters says the same); every count divides by 8: S = 851,968
  local o = { model = "meta-llama/Meta-Llama-3-8B", micro_batch = 1, seq_len = 1024, dtype = "bf16", stage = 2,
    gpus_per_node = 8, lora = zr.peft.LoraConfig { r = 16, lora_alpha = 32 } }
  local p = P.plan(o)
  local base, trained, S = 8030261248, 6815744, 851968
  T.eq(p.settings.lora_plan.trained, trained); T.eq(p.settings.lora_plan.frozen, base)
  T.eq(p.partition_numel, S)
  T.eq(p.device.params, (base + trained) * 2, "the frozen base and the adapters, 16-bit, whole on every rank")
  T.eq(p.setup.grads, S * 4, "the fp32 gradient partition of the adapters")
  T.eq(p.device.optimizer, S * 12, "master + exp_avg + exp_avg_sq of the adapters")
  o.lora = nil
  local full = P.plan(o)
  T.eq(full.device.optimizer, math.ceil(base / 8) * 12, "(without LoRA: the whole model's)")
  T.eq(full.device.total - p.device.total > 10 * 2 ^ 30, true, "LoRA saves more than 10 GiB per rank here")
  -- stage 3: the base stays whole (not partitioned), the adapters' shard beside it; every adapter (65,536 elements at
  -- most) is below DeepSpeed's persistence threshold (1e5), so all stay whole too; with the threshold 0 and no
  -- prefetch or reuse, one layer's q/k/v adapters are gathered at a time (q, k, v run as one zr.lora_multi, the hooks
  -- of q's and v's lora_A and lora_B around it: 131,072 + 81,920 = 212,992)
  o.lora, o.stage = { r = 16 }, 3
  T.eq(P.plan(o).device.params, (base + S + trained) * 2, "stage 3: base + shard + persistent adapters")
  o.persistence_threshold, o.prefetch_bucket_size, o.max_reuse_distance = 0, 0, 0
  T.eq(P.plan(o).device.params, (base + S + 212992) * 2, "stage 3: base + shard + one layer's q/v adapters gathered")
  o.persistence_threshold, o.prefetch_bucket_size, o.max_reuse_distance = nil, nil, nil
  -- a PEFT model passed as the model is planned with its own peft_config
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.num_hidden_layers = 2
  local m = zr.peft.get_peft_model(zr.models.llama.LlamaForCausalLM(cfg), zr.peft.LoraConfig { r = 4 })
  local pm = P.plan { model = m, micro_batch = 2, seq_len = 16, device = "cpu", dtype = "f32" }
  T.eq(pm.settings.lora_plan.trained, 1792); T.eq(pm.total_params, 125632 + 1792)
  -- the targets as PEFT picks them: the plan's trained count is the model's (exclude_modules, layers_to_transform,
  -- a regex, all-linear)
  cfg.num_hidden_layers = 3
  for _, lc in ipairs { { r = 4, target_modules = { "q_proj", "o_proj", "up_proj" }, layers_to_transform = { 1 },
    exclude_modules = { "o_proj" } }, { r = 4, target_modules = { "q_proj", "down_proj" }, layers_to_transform = 2,
    exclude_modules = ".*down_proj" }, { r = 4, target_modules = ".*\\.layers\\.[02]\\..*_proj" },
    { r = 4, target_modules = "all-linear" } } do
    m = zr.peft.get_peft_model(zr.models.llama.LlamaForCausalLM(cfg), zr.peft.LoraConfig(lc))
    pm = P.plan { model = m, micro_batch = 1, seq_len = 8, device = "cpu", dtype = "f32" }
    T.eq(pm.settings.lora_plan.trained, (m:get_nb_trainable_parameters()))
  end
  -- fit: every step plans with lora (Llama-3-8B with LoRA on one 24 GB GPU: activation checkpointing fits)
  local f = P.fit { model = "meta-llama/Meta-Llama-3-8B", micro_batch = 4, seq_len = 1024, dtype = "bf16",
    gpu_memory = "24GB", lora = { r = 16 } }
  T.eq(f.fits, true)
  for _, st in ipairs(f.steps) do T.eq(st.plan.settings.lora_plan.trained, trained, st.change) end
  T.eq(f.settings.gradient_checkpointing, true)
  T.raises(function() P.plan { model = "zrun/tiny-llama", lora = { r = 0 } } end, "lora.r must be a positive integer")
  T.raises(function() P.plan { model = "zrun/tiny-llama", lora = { r = 4, target_modules = { "lm_head" } } } end,
    "lora target lm_head is not planned")
  T.raises(function() P.plan { model = "zrun/tiny-llama", lora = { r = 4, lora_dropout = 1 } } end,
    "lora.lora_dropout must be a number in [0, 1)")
  T.raises(function() P.plan { model = "zrun/tiny-llama", lora = { r = 4, layers_to_transform = "0" } } end,
    "lora.layers_to_transform must be layer numbers")
end)

T.done()
