-- ZeRO optimizer offload, the step pipeline's two gradient places on the CPU (memcpy for the
-- copies): a tiny Llama trained through zr.initialize with the gradients kept on the "device"
-- (accumulated as without offload, fetched chunk by chunk at the step) must end with the same
-- losses and weights, bit for bit, as with host gradients (bucket by bucket into the host
-- partition): the same additions in the same order, the same sum of squares, and AdamW is
-- elementwise, so chunking cannot change a bit (except one rank, see check()). With GRAD_DTYPE bf16 (data_types.grad_accum_dtype,
-- device mode only) the gradients are rounded to bf16 after every addition: Adam divides by
-- sqrt(v), so where a gradient is near zero the rounding may flip an update's sign (a weight then
-- ends up to 2 lr per step away); losses must agree within 1e-3 and weights within 2 lr x steps.
-- And 16-bit gradients on the host (accumulated bucket by bucket into a 16-bit host partition,
-- each sum rounded) against the device mode at the same GRAD_DTYPE: on CPU ranks the same
-- roundings of the same additions in the same order, bit for bit. On one GPU the device mode is
-- direct (the weight-gradient GEMM may add into the 16-bit .grad in place, one rounding) and the
-- host mode bucketed (the micro-batch's gradient rounded, then added: two), so there the 16-bit
-- tolerances above apply.
-- Usage: ZRUN_OFFLOAD_CHUNK=N zrun offload_pipeline_check.lua STAGE GAS [GRAD_DTYPE]
-- ZRUN_CHECK_DEVICE=cuda (tests/cuda/test_offload_pipeline.sh): on the GPU the two places differ
-- in where the gradients are added and squared (GPU kernels vs the host), so fp32 is compared
-- within 1e-6 there; GRAD_DTYPE none: device gradients against the engine without offload (the
-- GPU's AdamW kernel: other float contractions, 2e-5 as tests/mpi/zero_check.lua allows).
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local engine_mod = require "zrun.engine"
local stage, gas, gdt = tonumber(arg[1] or 2), tonumber(arg[2] or 1), arg[3] or "fp32"
local W, r = dist.world_size(), dist.rank()
local STEPS, MB, TLEN = 3, 2, 12
local name = ("offload pipeline stage %d np=%d gas=%d grads %s chunk=%s"):format(stage, W, gas, gdt,
  os.getenv("ZRUN_OFFLOAD_CHUNK") or "default")
local cfg = zr.models.llama.config("zrun/tiny-llama")
local dev = os.getenv("ZRUN_CHECK_DEVICE") == "cuda" and "cuda" or nil
cfg.device = dev

local function batch(step, micro)
  return T.rank_batch(step, micro, { rank = r, world_size = W, mb = MB, tlen = TLEN, device = dev })
end

-- trains with the gradient partition in `place` ("device" or "host") and grad_accum_dtype `dt`
local function train(place, dt)
  local saved = engine_mod.offload_grads_place
  engine_mod.offload_grads_place = function() return place end
  zr.manual_seed(1234)
  local engine = zr.initialize({ model = zr.models.llama.LlamaForCausalLM(cfg), config = {
    train_micro_batch_size_per_gpu = MB, gradient_accumulation_steps = gas, gradient_clipping = 0.05,
    steps_per_print = 1000000, data_types = (dt == "bf16" or dt == "fp16") and { grad_accum_dtype = dt } or nil,
    optimizer = { type = "AdamW", params = { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
    zero_optimization = { stage = stage, reduce_bucket_size = 3000, stage3_param_persistence_threshold = 0,
      offload_optimizer = dt ~= "none" and { device = "cpu" } or nil },
  } })
  engine_mod.offload_grads_place = saved
  if dt ~= "none" then T.eq(engine.offload_grads, place, "the engine's gradient place") end
  local losses = T.train_steps(engine, batch, 1, STEPS, gas)
  local ps = {}
  for i, p in ipairs(engine:gather_parameters()) do ps[i] = p:clone() end
  return losses, ps
end

local function check()
  local hl, hp = train(gdt == "none" and "device" or "host", "fp32")
  local dl, dp = train("device", gdt)
  -- one rank: host gradients are the engine's direct mode (autograd writes them into the
  -- partition, no buckets; stage 3 too, its parameters resident), whose float additions run in
  -- another order: 2e-6
  local tol = (gdt == "bf16" or gdt == "fp16") and 2 * 1e-3 * STEPS or gdt == "none" and 2e-5 or dev and 1e-6 or
    W == 1 and 2e-6 or 0
  T.near(dl, hl, tol > 1e-3 and 1e-3 or tol, 0, "losses")
  for i, p in ipairs(dp) do T.near(p, hp[i], tol, 0, "weights of parameter " .. i) end
  if gdt == "bf16" or gdt == "fp16" then -- 16-bit gradients must still differ somewhere (the rounding is real)
    local differs = false
    for i, p in ipairs(dp) do differs = differs or (p - hp[i]):abs():max():item() > 0 end
    assert(differs, "16-bit gradients gave the fp32 weights bit for bit: were they rounded at all?")
    local l16, p16 = train("host", gdt)
    T.near(l16, dl, dev and 1e-3 or 0, 0, "losses, 16-bit gradients on the host vs the device")
    for i, p in ipairs(p16) do T.near(p, dp[i], dev and tol or 0, 0, "16-bit host gradients: parameter " .. i) end
  end
end
if r == 0 then T.test(name, check) else check() end
T.done()
