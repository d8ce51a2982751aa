-- ZeRO equivalence: a tiny Llama trained for a few steps through zr.initialize (any stage,
-- offload, world size, accumulation, clipping) must match an independent single-process
-- reference — plain zr.optim.AdamW on the whole global batch with torch-style clipping —
-- computed on every rank. Usage: zrun zero_check.lua STAGE OFFLOAD(0/1) GAS CLIP [PERSIST]
-- PERSIST: stage3_param_persistence_threshold (default 0: every parameter is partitioned)
-- ZERO_CHECK_MODEL=gpt2: a tiny GPT-2 instead of the tiny Llama. Both also count the fused ops the
-- model runs in place of module calls (at every stage; at stage 3 with the ZeRO hooks around them).
-- ZRUN_CHECK_DEVICE=cuda: each rank trains on its local rank's GPU (zrun picks it under mpirun;
-- NCCL collectives) and computes the reference there too (tests/cuda/test_zero_multi_gpu.sh).
-- Tolerance: fp32 with a different summation order (reduce-scatter vs one sum): losses 2e-5,
-- weights 2e-5 absolute after 4 steps of lr 1e-3 (one Adam step moves a weight by ~1e-3).
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local stage, offload, gas, clip = tonumber(arg[1] or 2), arg[2] == "1", tonumber(arg[3] or 1), tonumber(arg[4] or 0)
local persist = tonumber(arg[5] or 0)
local overlap = arg[6] == "1" -- zero_optimization.overlap_comm (default off)
-- stage 3: stage3_prefetch_bucket_size and stage3_max_live_parameters (defaults 5e7 and 1e9)
local prefetch, max_live = tonumber(arg[7] or 5e7), tonumber(arg[8] or 1e9)
local ckpt = arg[9] == "1" -- gradient checkpointing in the engine's model (recomputation inside backward)
local reuse = tonumber(arg[10] or 1e9) -- stage3_max_reuse_distance
local W, r = dist.world_size(), dist.rank()
local name = (os.getenv("ZERO_CHECK_MODEL") == "gpt2" and "gpt2 " or "") .. ("stage %d%s np=%d gas=%d clip=%g%s"):format(stage, offload and " offload" or "", W, gas, clip,
  persist > 0 and (" persistence<" .. persist) or "") .. (overlap and " overlap_comm" or "") ..
  (arg[7] and (" prefetch=" .. prefetch) or "") .. (arg[8] and (" max_live=" .. max_live) or "") ..
  (ckpt and " checkpointing" or "") .. (arg[10] and (" max_reuse=" .. reuse) or "")
local STEPS, MB, TLEN = 4, 2, 12
local dev = os.getenv("ZRUN_CHECK_DEVICE") == "cuda" and "cuda" or nil

-- ZERO_CHECK_MODEL=gpt2: a tiny GPT-2 (no dropout) in place of the tiny Llama
local gpt2 = os.getenv("ZERO_CHECK_MODEL") == "gpt2"
local cfg = gpt2 and { n_embd = 64, n_layer = 2, n_head = 4, vocab_size = 259, n_positions = 32, resid_pdrop = 0,
  embd_pdrop = 0, attn_pdrop = 0 } or zr.models.llama.config("zrun/tiny-llama")
cfg.device = dev
local function make_model()
  zr.manual_seed(1234)
  return gpt2 and zr.models.gpt2.GPT2LMHeadModel(cfg) or zr.models.llama.LlamaForCausalLM(cfg)
end
-- global batch for (step, micro): W*MB rows of random ids; rank k takes rows k*MB+1..(k+1)*MB
local function batch(step, micro, rank)
  zr.manual_seed(1000 * step + micro)
  local ids = (zr.rand({ W * MB, TLEN }) * 250):to("i64")
  if rank ~= nil then ids = ids:narrow(1, rank * MB + 1, MB):contiguous() end
  return dev and ids:to(dev) or ids
end

-- reference: one process, whole global batch
local ref = make_model()
local rparams = ref:parameters()
local opt = zr.optim.AdamW(rparams, { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 })
local ref_losses = {}
for s = 1, STEPS do
  opt:zero_grad()
  local tot = 0
  for m = 1, gas do
    local ids = batch(s, m)
    local loss = ref(ids, ids).loss
    tot = tot + loss:item()
    local scaled = loss * (1 / gas)
    scaled:backward()
  end
  if clip > 0 then require("zrun.nn.utils").clip_grad_norm_(rparams, clip) end
  opt:step()
  ref_losses[s] = tot / gas
end

-- engine run
local model = make_model()
if ckpt then model:gradient_checkpointing_enable() end
local engine = zr.initialize({ model = model, config = {
  train_micro_batch_size_per_gpu = MB, gradient_accumulation_steps = gas, gradient_clipping = clip,
  steps_per_print = 1000000,
  optimizer = { type = "AdamW", params = { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
  zero_optimization = { stage = stage, reduce_bucket_size = 3000, allgather_bucket_size = 3000,
    stage3_param_persistence_threshold = persist,
    overlap_comm = overlap, stage3_prefetch_bucket_size = prefetch, stage3_max_live_parameters = max_live,
    stage3_max_reuse_distance = reuse,
    offload_optimizer = offload and { device = "cpu" } or nil },
} })
-- stage 3: gathered + in-flight elements seen when a module starts (after its own gather and
-- the prefetch it starts), and the most parameters one op holds whole: a module's own, or those of
-- the modules llama.lua runs as one op (q/k/v, gate/up; Module.call_group runs their hooks one
-- module after the other, the probe's too: it reads only, so it is registered as acting on a
-- module's own parameters, and the fused ops still run)
local Module = require "zrun.nn.module"
local live_max, own_max = 0, 0
local probe = stage == 3 and Module.register_module_forward_pre_hook(function(m)
  local n = 0
  for _, p in ipairs(m:parameters(false)) do n = n + p:numel() end
  if n == 0 or engine.global_steps == 0 then return end
  own_max = math.max(own_max, n)
  live_max = math.max(live_max, engine.zero:live_numel())
end, true)
if stage == 3 then -- (counted on the reference model: the engine's are partitioned)
  local function numel(...)
    local n = 0
    for _, m in ipairs { ... } do for _, p in ipairs(m:parameters(false)) do n = n + p:numel() end end
    return n
  end
  if gpt2 then
    local mlp = ref.transformer.h[1].mlp
    own_max = numel(mlp.c_fc, mlp.c_proj)
  else
    local l1 = ref.model.layers[1]
    own_max = math.max(numel(l1.self_attn.q_proj, l1.self_attn.k_proj, l1.self_attn.v_proj),
      numel(l1.mlp.gate_proj, l1.mlp.up_proj))
  end
end
-- The fused ops the models run in place of module calls, counted: they run at every stage and
-- world size (at stage 3 on several ranks with the ZeRO hooks around them). Each Llama forward runs
-- zr.linear_multi twice a layer (q/k/v, gate/up) and zr.add_rms_norm twice a layer (a residual add
-- with the next norm) less the first layer's input norm, plus the final norm's; a GPT-2 forward
-- zr.mlp_gelu once a block (c_fc, GELU, c_proj) and zr.add_layer_norm twice, as Llama's norms.
local calls = gpt2 and { mlp_gelu = 0, add_layer_norm = 0 } or { linear_multi = 0, add_rms_norm = 0 }
for k in pairs(calls) do
  local f = zr[k]
  zr[k] = function(...) calls[k] = calls[k] + 1; return f(...) end
end
-- the embeddings' elements: their inputs need no gradient, so they stay gathered through a step
local emb = gpt2 and ref.transformer.wte.weight:numel() + ref.transformer.wpe.weight:numel() or
  ref.model.embed_tokens.weight:numel()
local losses = {}
for s = 1, STEPS do
  local tot = 0
  for m = 1, gas do
    local ids = batch(s, m, r)
    local loss = engine(ids, ids).loss
    tot = tot + loss:item()
    engine:backward(loss)
    engine:step()
  end
  local t = zr.tensor({ tot / gas }, { dtype = "f64" })
  dist.all_reduce(t, "avg")
  losses[s] = t:item()
end

if probe then probe.remove() end
local function check()
  T.near(losses, ref_losses, 2e-5, 0, "losses")
  local L, forwards = cfg.num_hidden_layers or cfg.n_layer, STEPS * gas
  local proj, norm, per = "linear_multi", "add_rms_norm", 2 -- products a layer
  if gpt2 then proj, norm, per = "mlp_gelu", "add_layer_norm", 1 end
  if ckpt then -- recomputation runs each layer's ops again; the layers' last adds are not fused
    assert(calls[proj] == 2 * per * L * forwards,
      ("checkpointing: zr.%s ran %d times, expected %d"):format(proj, calls[proj], 2 * per * L * forwards))
    assert(calls[norm] > 0, "checkpointing: zr." .. norm .. " never ran")
  else
    T.eq(calls[proj], per * L * forwards, "zr." .. proj .. " calls (projections as one op)")
    T.eq(calls[norm], 2 * L * forwards, "zr." .. norm .. " calls (each residual add with the next norm)")
  end
  if stage == 3 and persist == 0 and prefetch == 0 and reuse > 0 then
    -- stage3_max_reuse_distance without prefetch: what is live beyond the running module was kept
    assert(live_max - emb - own_max > 0, ("reuse: nothing kept from forward (live max %d)"):format(live_max))
  end
  if stage == 3 and persist == 0 and reuse == 0 then -- (kept parameters would count as live too)
    -- the embeddings (Llama's 16,576 elements) stay gathered through a step: beyond that and the running module,
    -- live parameters are prefetched ones, which the budget and the live bound limit
    local extra = live_max - emb - own_max
    if prefetch >= 1e5 and max_live >= 1e9 then
      assert(extra > 0, ("prefetch: nothing in flight ahead (live max %d, own max %d)"):format(live_max, own_max))
    end
    if prefetch == 0 then assert(extra <= 0, ("prefetch off but %d elements ahead"):format(extra)) end
    if max_live < 1e9 then -- a prefetch starts parameters only while fewer than max_live are live
      -- (DeepSpeed's rule: the one crossing the bound starts too, so up to the largest parameter above it)
      local largest, total = 0, 0
      for _, p in ipairs(ref:parameters()) do largest, total = math.max(largest, p:numel()), total + p:numel() end
      assert(live_max < math.max(max_live, own_max + emb) + largest,
        ("live %d elements, above stage3_max_live_parameters %d + the largest parameter %d"):format(live_max, max_live,
          largest))
      assert(live_max < total, ("max_live %d bounds nothing: all %d elements live"):format(max_live, live_max))
    end
  end
  local ps = engine:gather_parameters() -- stage 3 keeps them partitioned: whole, to compare
  for i, p in ipairs(ps) do T.near(p, rparams[i], 2e-5, 0, "weights of parameter " .. i) end
end
if r == 0 then T.test(name, check) else check() end
T.done()
