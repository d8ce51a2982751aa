-- Lion, Adagrad and SGD across ranks: a tiny Llama trained 4 steps at stage 1, 2 or 3 (each rank
-- updating only its partition, with per-group lr and weight decay) must match the same run at
-- stage 0 (every rank updates everything after an all-reduce), which tests/lua/test_engine_optimizers.lua
-- checks against the formulas. Usage: zrun optim_check.lua STAGE [OFFLOAD(0/1)]
-- Tolerance: fp32 with a different summation order: losses and weights 2e-5; Lion's sign of a
-- momentum within rounding of 0 may flip, so its weights allow a few elements off by 2 lr.
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local stage, offload = tonumber(arg[1] or 2), arg[2] == "1"
local W, r = dist.world_size(), dist.rank()
local STEPS, MB, TLEN = 4, 2, 12
local cfg = zr.models.llama.config("zrun/tiny-llama")

local function run(ty, params, st, off)
  zr.manual_seed(1234)
  local model = zr.models.llama.LlamaForCausalLM(cfg)
  local decay, no_decay = {}, {}
  for name, p in model:named_parameters() do
    if name:match("norm") then no_decay[#no_decay + 1] = p else decay[#decay + 1] = p end
  end
  local zo = { stage = st, reduce_bucket_size = 3000, allgather_bucket_size = 3000 }
  if off then zo.offload_optimizer = { device = "cpu" } end
  local engine = zr.initialize({ model = model,
    model_parameters = { { params = decay, weight_decay = params.weight_decay or 0 },
      { params = no_decay, weight_decay = 0, lr = params.lr * 3 } },
    config = { train_micro_batch_size_per_gpu = MB, steps_per_print = 1e6,
      optimizer = { type = ty, params = params }, zero_optimization = zo } })
  local losses = {}
  for s = 1, STEPS do
    zr.manual_seed(1000 * s)
    local ids = (zr.rand({ W * MB, TLEN }) * 250):to("i64"):narrow(1, r * MB + 1, MB):contiguous()
    local out = engine(ids, ids)
    engine:backward(out.loss)
    engine:step()
    losses[s] = out.loss:item()
  end
  local ws = {}
  for i, p in ipairs(engine:gather_parameters()) do ws[i] = p:clone() end
  return losses, ws
end

local CASES = {
  { "Lion", { lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 } },
  { "Adagrad", { lr = 1e-2, weight_decay = 0.01, initial_accumulator_value = 0.1 } },
  { "SGD", { lr = 0.1, momentum = 0.9, nesterov = true, weight_decay = 0.01 } },
  { "SGD", { lr = 0.1, weight_decay = 0.01 } },
}
for _, case in ipairs(CASES) do
  local name = ("%s%s stage %d%s np=%d matches stage 0"):format(case[1], case[2].momentum and " momentum" or "",
    stage, offload and " offload" or "", W)
  local function check()
    local l0, w0 = run(case[1], case[2], 0, false)
    local l1, w1 = run(case[1], case[2], stage, offload)
    T.near(zr.tensor(l1), zr.tensor(l0), 2e-5, 0, "losses")
    for i = 1, #w0 do
      if case[1] ~= "Lion" then T.near(w1[i], w0[i], 2e-5, 0, "weights of parameter " .. i)
      else
        local d = (w1[i] - w0[i]):abs()
        local bad = (d:gt(2e-5)):to("f32"):sum():item()
        assert(bad <= 2, ("parameter %d: %d elements differ"):format(i, bad))
        assert(d:max():item() <= STEPS * 2 * 3e-3 + 1e-5, ("parameter %d differs by %g"):format(i, d:max():item()))
      end
    end
  end
  if r == 0 then T.test(name, check) else check() end
end
T.done()
