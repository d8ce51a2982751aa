-- ZeRO-3 with offload_param on one GPU (runtime/zero/engine.c shard_upload): the 16-bit parameter shard
-- on the host, each module's slice uploaded when it is gathered. With offload_param.pin_memory (DeepSpeed's
-- default) the shard is page-locked and a slice goes up by DMA on the comm stream beside the compute; without
-- it, through the driver's pageable staging. A tiny Llama trained 4 steps x 2 micro-batches must give the
-- same losses and weights, bit for bit, pinned or not and with every module prefetched ahead or none (the
-- same bytes, only when and how they travel differ), and within 1e-5 (lr 3e-3 a step) of stage 3 with the
-- shard on the GPU (on a CPU run that one is resident, its gradients views, not buckets: another order of
-- float additions, which Adam's division spreads to ~1e-6). The losses must fall (the same micro-batches every step).
-- Run on the GPU machine: zrun tests/cuda/offload_param_check.lua (in tests/cuda/test_offload_pipeline.sh).
local zr = require "zrun"
local T = zr.testing
local STEPS, GAS, MB, TLEN = 4, 2, 2, 16
local cfg = zr.models.llama.config("zrun/tiny-llama")
cfg.device = "cuda"

local function batch(_, micro) -- the same two micro-batches every step: the loss must fall
  return T.rank_batch(1, micro, { rank = 0, world_size = 1, mb = MB, tlen = TLEN, device = "cuda" })
end

-- offload: nil (the shard on the GPU) or {pin = bool, prefetch = elements}
local function train(offload)
  zr.manual_seed(1234)
  local zc = { stage = 3, offload_optimizer = { device = "cpu" }, stage3_param_persistence_threshold = 0,
    stage3_prefetch_bucket_size = offload and offload.prefetch or 0 }
  if offload then zc.offload_param = { device = "cpu", pin_memory = offload.pin } end
  local engine = zr.initialize({ model = zr.models.llama.LlamaForCausalLM(cfg), config = {
    train_micro_batch_size_per_gpu = MB, gradient_accumulation_steps = GAS, gradient_clipping = 1.0,
    steps_per_print = 1000000, bf16 = { enabled = false },
    optimizer = { type = "AdamW", params = { lr = 3e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
    zero_optimization = zc } })
  if offload then T.eq(engine.zero:is_resident(), false, "offload_param: gathered from the host shard") end
  T.eq(engine.zero:shard_pinned(), offload ~= nil and offload.pin, "the host shard page-locked as pin_memory says")
  local losses = T.train_steps(engine, batch, 1, STEPS, GAS)
  local ps = {}
  for i, p in ipairs(engine:gather_parameters()) do ps[i] = p:to("cpu"):clone() end
  return losses, ps
end

T.test("stage 3 offload_param: pinned DMA uploads = pageable = prefetched, and the device shard within 1e-5", function()
  local rl, rp = train(nil)
  local pl, pp = train({ pin = true, prefetch = 0 })
  T.eq(pl[STEPS] < pl[1] - 0.05, true, ("losses fall: %.4f -> %.4f"):format(pl[1], pl[STEPS]))
  for name, o in pairs { pageable = { pin = false, prefetch = 0 }, prefetched = { pin = true, prefetch = 1e9 },
    ["pageable, prefetched"] = { pin = false, prefetch = 1e9 } } do
    local l, p = train(o)
    T.near(l, pl, 0, 0, name .. ": losses")
    for i, w in ipairs(p) do T.near(w, pp[i], 0, 0, name .. ": parameter " .. i) end
  end
  T.near(pl, rl, 1e-5, 0, "losses against the device shard")
  for i, w in ipairs(pp) do T.near(w, rp[i], 1e-5, 0, "parameter " .. i .. " against the device shard") end
end)
T.done()
