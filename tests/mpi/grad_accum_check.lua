-- Gradient accumulation in bf16 (DeepSpeed's data_types.grad_accum_dtype) on GPUs: a bf16 tiny
-- Llama at stage S on W ranks, 2 micro-batches per step and clipping, trained with the default
-- (an fp32 gradient partition, the independent reference here) and with "bf16": the partition
-- must be bf16 and the losses and weights stay within bf16 rounding of the fp32 run.
-- Usage (GPU ranks, tests/cuda/test_zero_multi_gpu.sh): ZRUN_CHECK_DEVICE=cuda zrun grad_accum_check.lua STAGE
-- On the CPU the engine refuses 16-bit accumulation (the optimizer is on the host): checked too.
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local stage = tonumber(arg[1] or 2)
local W, r = dist.world_size(), dist.rank()
local dev = os.getenv("ZRUN_CHECK_DEVICE") == "cuda" and "cuda" or "cpu"
local cfg = zr.models.llama.config("zrun/tiny-llama")
cfg.dtype, cfg.device = "bf16", dev
local name = ("grad_accum_dtype bf16, stage %d np=%d "):format(stage, W)

local function run(gad)
  zr.manual_seed(4321)
  local engine = zr.initialize({ model = zr.models.llama.LlamaForCausalLM(cfg), config = {
    train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = 2, steps_per_print = 1000000,
    bf16 = { enabled = true }, gradient_clipping = 1.0, data_types = gad and { grad_accum_dtype = gad } or nil,
    optimizer = { type = "AdamW", params = { lr = 1e-3, weight_decay = 0.1 } },
    zero_optimization = { stage = stage, reduce_bucket_size = 4000 } } })
  local losses = {}
  for s = 1, 6 do
    zr.manual_seed(100 + s)
    local ids = (zr.rand({ 2 * W, 12 }) * 250):to("i64"):narrow(1, 2 * r + 1, 2):contiguous():to(dev)
    local out = engine(ids, ids)
    losses[s] = out.loss:float():item()
    engine:backward(out.loss)
    engine:step()
  end
  local w = {}
  for i, p in ipairs(engine:gather_parameters()) do w[i] = p:float():cpu() end
  return losses, w, engine.zero:state(3):dtype()
end

T.test(name, function()
  if dev == "cpu" then
    T.raises(function() run("bf16") end, "needs the optimizer states on a GPU")
    return
  end
  local l32, w32, d32 = run(nil)
  local l16, w16, d16 = run("bf16")
  T.eq(d32, "f32", "the default partition")
  T.eq(d16, "bf16", "the bf16 partition")
  T.near(l16, l32, 2e-2, 2e-2, "losses")
  for i = 1, #w32 do T.near(w16[i], w32[i], 2e-2, 2e-2, "weights of parameter " .. i) end
end)
