-- Gradient buckets in the communication dtype (DeepSpeed's communication_data_type; unset: the
-- parameters' dtype). A bf16 tiny Llama at stage S on W ranks: with the default the buckets are
-- bf16 (half the comm bytes of "fp32", checked against the allocator's comm peak and the memory
-- plan's formula), and the losses and weights stay within bf16 rounding of the "fp32" run, which
-- is the independent reference here (fp32 reduction of the same bf16 gradients).
-- Usage: zrun comm_dtype_check.lua STAGE [OVERLAP]
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local stage, overlap = tonumber(arg[1] or 2), arg[2] == "1"
local W, r = dist.world_size(), dist.rank()
local dev = os.getenv("ZRUN_CHECK_DEVICE") == "cuda" and "cuda" or "cpu"
local cfg = zr.models.llama.config("zrun/tiny-llama")
cfg.dtype, cfg.device = "bf16", dev

local function run(comm)
  zr.manual_seed(4321)
  local model = zr.models.llama.LlamaForCausalLM(cfg)
  -- the buckets, made with the engine (the previous run's engine, freed meanwhile, would shrink it)
  local engine, comm = T.without_gc(function()
    local c0 = zr.memory.stats(dev).comm.current
    local e = zr.initialize({ model = model, config = {
      train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000, bf16 = { enabled = true },
      communication_data_type = comm, gradient_clipping = 1.0,
      optimizer = { type = "AdamW", params = { lr = 1e-3, weight_decay = 0.1 } },
      zero_optimization = { stage = stage, reduce_bucket_size = 4000, overlap_comm = overlap } } })
    return e, zr.memory.stats(dev).comm.current - c0
  end)
  local losses = {}
  for s = 1, 3 do
    zr.manual_seed(100 + s)
    local ids = (zr.rand({ 2 * W, 12 }) * 250):to("i64"):narrow(1, 2 * r + 1, 2):contiguous():to(dev)
    local out = engine(ids, ids)
    engine:backward(out.loss)
    engine:step()
    local t = zr.tensor({ out.loss:item() }, { dtype = "f64" })
    dist.all_reduce(t, "avg")
    losses[s] = t:item()
  end
  local ps = engine:gather_parameters()
  local w = {}
  for i, p in ipairs(ps) do w[i] = p:float():cpu() end
  return losses, w, comm
end

local l16, w16, c16 = run(nil)
local l32, w32, c32 = run("fp32")
local function check()
  T.near(l16, l32, 2e-2, 0, "losses, bf16 vs fp32 reduction")
  for i = 1, #w16 do T.near(w16[i], w32[i], 2e-2, 1e-2, "weights of parameter " .. i) end
  -- the buckets (zero.c: send W*cap, compaction W*cap and receive cap when W > 1; twice with
  -- overlap_comm) halve; cap = bucket size / W, at least the largest chunk, at most the partition.
  -- The all-gather buffers of the 16-bit weights are the same in both runs.
  local maxc, S = 0, 0
  for _, p in ipairs(w32) do
    local c = math.ceil(p:numel() / W)
    maxc, S = math.max(maxc, c), S + c
  end
  local cap = math.min(math.max(math.floor(4000 / W), maxc), S)
  local buckets32 = (cap * W * 4 + (W > 1 and (cap * W * 4 + cap * 4) or 0)) * ((overlap and W > 1) and 2 or 1)
  T.eq(c32 - c16, buckets32 / 2, "comm bytes saved = half of the fp32 buckets")
end
local name = ("communication_data_type: bf16 buckets at stage %d np=%d%s"):format(stage, W, overlap and " overlap_comm" or "")
if r == 0 then T.test(name, check) else check() end
T.done()
