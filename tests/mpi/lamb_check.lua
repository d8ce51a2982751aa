-- Lamb across ranks and stages: a tiny Llama trained 4 steps on one global batch of 6 rows (each of
-- W ranks takes 6/W of them) at stage STAGE, with or without optimizer offload, must give the losses
-- and weights of the same run on 1 rank at stage 0 (weights made uneven within each tensor): each trust ratio is that of a whole parameter
-- tensor however the ranks cut it (tests/lua/test_engine_optimizers.lua checks stage 0 against the
-- formula). Usage: zrun lamb_check.lua STAGE OFFLOAD(0/1) FILE; 1 rank at stage 0 writes FILE (the
-- reference), every other run compares with it. Tolerance: fp32 summed in another order moves the
-- losses by about 4e-5 here (1.9e-4 in a build without fused multiply-adds: -O1, ASan), and as in Adam, u = m / sqrt(v) turns the rounding noise of near-zero
-- gradients into whole steps, so about 0.15% of the weights differ by more than 1e-4; 1% may. A
-- trust ratio taken per piece moves the losses by 0.6 and nearly every weight: the losses' 1e-3 keeps
-- a 600x margin over it.
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local stage, offload, file = tonumber(arg[1]), arg[2] == "1", arg[3]
local W, r = dist.world_size(), dist.rank()
local STEPS, ROWS, TLEN = 4, 6, 12
local MB = ROWS / W
-- ZRUN_CHECK_DEVICE=cuda: each rank trains on its GPU (tests/cuda/test_zero_multi_gpu.sh; NCCL)
local dev = os.getenv("ZRUN_CHECK_DEVICE") == "cuda" and "cuda" or nil
local mcfg = zr.models.llama.config("zrun/tiny-llama")
mcfg.device = dev

local function run()
  zr.manual_seed(1234)
  local model = zr.models.llama.LlamaForCausalLM(mcfg)
  -- the first half of every tensor 8 times larger: the ranks' pieces have trust ratios far from the
  -- whole tensor's, so a ratio taken per piece (a missing all-reduce) shows
  for _, p in ipairs(model:parameters()) do
    local n, s = p:numel(), {}
    for i = 1, n do s[i] = i <= n / 2 and 8 or 1 end
    p:copy_(p * zr.tensor(s):reshape(p:shape()):to(p:device()))
  end
  local decay, no_decay = {}, {}
  for name, p in model:named_parameters() do
    if name:match("norm") then no_decay[#no_decay + 1] = p else decay[#decay + 1] = p end
  end
  local zo = { stage = stage, reduce_bucket_size = 3000, allgather_bucket_size = 3000 }
  if offload then zo.offload_optimizer = { device = "cpu" } end
  local engine = zr.initialize({ model = model,
    model_parameters = { { params = decay, weight_decay = 0.01 }, { params = no_decay, weight_decay = 0, lr = 0.06 } },
    config = { train_micro_batch_size_per_gpu = MB, steps_per_print = 1e6, zero_allow_untested_optimizer = true,
      -- unclipped: clipping these norms (~300-1300) to 1 leaves gradients where the rounding noise of
      -- the ranks' layouts grows past the tolerance (clipping across ranks: zero_check.lua)
      gradient_clipping = 0,
      optimizer = { type = "Lamb", params = { lr = 0.02, betas = { 0.9, 0.99 }, min_coeff = 0.05 } },
      zero_optimization = zo } })
  local losses = {}
  for s = 1, STEPS do
    zr.manual_seed(1000 * s)
    local ids = (zr.rand({ ROWS, TLEN }) * 250):to("i64"):narrow(1, r * MB + 1, MB):contiguous()
    if dev then ids = ids:to(dev) end
    local out = engine(ids, ids)
    engine:backward(out.loss)
    engine:step()
    local l = zr.tensor({ out.loss:item() }, { dtype = "f64", device = dev })
    dist.all_reduce(l)
    losses[s] = l:item() / W -- the mean over the global batch (equal rows and tokens per rank)
  end
  local ws = {}
  for i, p in ipairs(engine:gather_parameters()) do ws[i] = p:cpu():flat_table() end
  return losses, ws
end

local losses, ws = run()
if W == 1 and stage == 0 and not offload then
  local f = assert(io.open(file, "w"))
  for _, l in ipairs(losses) do f:write(("%.17g\n"):format(l)) end
  for _, w in ipairs(ws) do for _, x in ipairs(w) do f:write(("%.9g\n"):format(x)) end end
  f:close()
  return
end

local function check()
  local vals = {}
  for line in io.lines(file) do vals[#vals + 1] = tonumber(line) end
  local k, off, n = 0, 0, 0
  for s = 1, STEPS do
    k = k + 1
    T.near(losses[s], vals[k], 1e-3, 0, "loss at step " .. s)
  end
  for _, w in ipairs(ws) do
    for _, x in ipairs(w) do
      k, n = k + 1, n + 1
      if math.abs(x - vals[k]) > 1e-4 then off = off + 1 end
    end
  end
  T.eq(k, #vals, "values in the reference")
  assert(off <= n / 100, ("%d of %d weights differ from 1 rank at stage 0 by more than 1e-4"):format(off, n))
end
local name = ("Lamb stage %d%s np=%d matches 1 rank at stage 0"):format(stage, offload and " offload" or "", W)
if r == 0 then T.test(name, check) else check() end
T.done()
