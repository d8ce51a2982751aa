-- bf16.bf16_master_weights_and_grads + bf16_optimizer_states over W CPU ranks: at stages 1, 2 and 3
-- (and stage 2 with offload_optimizer) every AdamW step of every rank's partition equals the Lua
-- restatement of DeepSpeed's (tests/lua/bf16_adamw_reference.lua; the gradients reduced in bf16, the
-- engine's 1/W and clip factor applied to them and rounded to bf16, as DeepSpeed scales its bf16
-- partition in place). Stage 2 and stage 2 with offload end with stage 1's weights bit for bit (one
-- element's reduction, a sum over the ranks' bf16 gradients, and its update do not depend on them);
-- stage 3 within bf16 rounding of them (it reduces the gradients in the order backward releases
-- its gathered modules, so a gradient that arrives in parts is reduced and rounded per part).
-- Usage: zrun bf16_master_check.lua [CLIP]; ZRUN_CHECK_DEVICE=cuda: one GPU per rank (NCCL),
-- tests/cuda/test_zero_multi_gpu.sh
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/bf16_adamw_reference.lua")
local clip = tonumber(arg[1] or 0)
local W, r = dist.world_size(), dist.rank()
local dev = os.getenv("ZRUN_CHECK_DEVICE") == "cuda" and "cuda" or "cpu"

local function batch(t)
  zr.manual_seed(100 + t)
  return (zr.rand({ 2 * W, 16 }) * 250):to("i64"):narrow(1, 2 * r + 1, 2):contiguous():to(dev)
end

local function run(stage, offload)
  zr.manual_seed(11)
  local mc = zr.models.llama.config("zrun/tiny-llama")
  mc.device = dev
  local model = zr.models.llama.LlamaForCausalLM(mc)
  local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = 2,
    steps_per_print = 1000000, gradient_clipping = clip,
    optimizer = { type = "AdamW", params = { lr = R.LR, betas = { R.B1, R.B2 }, eps = R.EPS, weight_decay = R.WD } },
    bf16 = { enabled = true, bf16_master_weights_and_grads = true, bf16_optimizer_states = true },
    zero_optimization = { stage = stage, reduce_bucket_size = 20000,
      offload_optimizer = offload and { device = "cpu" } or nil } } })
  local losses = R.check_steps(engine, 4, true, batch)
  local w = {}
  for i, p in ipairs(engine:gather_parameters()) do w[i] = p:to("cpu"):to("f32"):flat_table() end
  return losses, w
end

-- Save after 2 steps, 2 more; a fresh engine loads the checkpoint and repeats them: the same losses
-- and bf16 states bit for bit (each rank reads its partition of the bf16 master and moments).
local function resume(stage)
  local dir = ("%s/zrun_bf16_ckpt_%d"):format(os.getenv("TMPDIR") or "/tmp", W)
  local function engine_at()
    zr.manual_seed(11)
    local mc = zr.models.llama.config("zrun/tiny-llama")
    mc.device = dev
    return (zr.initialize({ model = zr.models.llama.LlamaForCausalLM(mc), config = { train_micro_batch_size_per_gpu = 2,
      steps_per_print = 1000000, gradient_clipping = clip, bf16 = { enabled = true,
      bf16_master_weights_and_grads = true, bf16_optimizer_states = true }, zero_optimization = { stage = stage } } }))
  end
  local function steps(e, from, to) return R.train(e, from, to, batch) end
  local a = engine_at()
  steps(a, 1, 2)
  a:save_checkpoint(dir, "s2")
  local la = steps(a, 3, 4)
  local b = engine_at()
  b:load_checkpoint(dir, "s2")
  local lb = steps(b, 3, 4)
  for i = 1, #la do T.eq(lb[i], la[i], ("stage %d resume: loss %d"):format(stage, i)) end
  for k = 0, 2 do
    local x, y = a.zero:state(k):to("cpu"):to("f32"):flat_table(), b.zero:state(k):to("cpu"):to("f32"):flat_table()
    for i = 1, #x do if x[i] ~= y[i] then error(("stage %d resume: state %d element %d"):format(stage, k, i), 0) end end
  end
  dist.barrier()
  if r == 0 then os.execute("rm -rf '" .. dir .. "'") end
end

local name = ("bf16 master and moments np=%d clip %g"):format(W, clip)
local function check()
  local l1, w1 = run(1)
  for _, c in ipairs { { 2 }, { 2, true }, { 3 } } do -- stage 3 last: its module hooks stay installed
    local l, w = run(c[1], c[2])
    local what = ("stage %d%s vs stage 1"):format(c[1], c[2] and " offload" or "")
    local exact = c[1] ~= 3
    for i = 1, #l1 do
      if exact then T.eq(l[i], l1[i], what .. ": loss " .. i) else T.near(l[i], l1[i], 2e-3, 0, what .. ": loss " .. i) end
    end
    -- stage 3: Adam turns a one-ulp difference of a near-zero gradient into a step of lr either way,
    -- so some weights differ by up to 2 lr per step: about 11% beyond 4 bf16 ulps after 4 steps here,
    -- as many as with an fp32 master and moments (bf16 weights, the same run); the rest within 4 ulps
    local far, n = 0, 0
    for i = 1, #w1 do
      for k = 1, #w1[i] do
        local d = math.abs(w[i][k] - w1[i][k])
        n = n + 1
        if exact and d ~= 0 then
          error(("%s: parameter %d element %d: %.9g vs %.9g"):format(what, i, k, w[i][k], w1[i][k]), 0)
        elseif d > 8 * R.LR * 2 then
          error(("%s: parameter %d element %d: %.9g vs %.9g (more than 2 lr a step)"):format(what, i, k, w[i][k],
            w1[i][k]), 0)
        elseif d > 4 * 2 ^ -8 * math.abs(w1[i][k]) then far = far + 1 end
      end
    end
    assert(far <= 0.2 * n, ("%s: %d of %d weights beyond 4 bf16 ulps of stage 1's"):format(what, far, n))
  end
end
if r == 0 then T.test(name, check) else check() end
for _, stage in ipairs { 1, 3 } do
  if r == 0 then T.test(("%s: save and resume at stage %d"):format(name, stage), function() resume(stage) end)
  else resume(stage) end
end
T.done()
