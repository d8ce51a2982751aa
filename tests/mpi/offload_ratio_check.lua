-- Partial optimizer offload (offload_optimizer.ratio, runtime/zero/engine.c's split): a tiny Llama
-- trained through zr.initialize with ratio R must end with the same losses, weights and optimizer
-- states as with ratio 1 (everything on the host) and as without offload, and a checkpoint saved at
-- one ratio must load at another and continue the same.
-- On the CPU the device part runs the optimizer kernels' CPU twin (zr_offload_update, the same
-- arithmetic as the host pipeline) on the same gradients: ratio R and ratio 1 agree bit for bit.
-- Against no offload the gradients take another path at one rank, stages 1-2 (direct mode: autograd
-- adds into the partition, other float order): 2e-6 there, bit for bit elsewhere, as in
-- offload_pipeline_check.lua. Optimizer: AdamW, or OPT (lion, adagrad, sgd); DTYPE bf16: bf16
-- weights (the device part's cast to 16 bits against the pipeline's, bit for bit on the CPU).
-- Usage: zrun offload_ratio_check.lua STAGE GAS RATIO WORKDIR [OPT] [DTYPE]
-- ZRUN_CHECK_DEVICE=cuda (tests/cuda/test_offload_pipeline.sh): the device part runs the GPU's
-- kernels (other float contractions than the host's AdamW): ratios compared within 2e-5 (as
-- tests/mpi/zero_check.lua allows), except ratio 0 against no offload at stage 3 or over 2 ranks,
-- where both run the same kernels on the same gradients: bit for bit. bf16 where the gradients or
-- kernels differ: a master weight one float apart may round to another bf16 weight and Adam's
-- update may flip its sign: 2 lr per step (as offload_pipeline_check.lua allows).
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local stage, gas, ratio, work, optname = tonumber(arg[1]), tonumber(arg[2]), tonumber(arg[3]), arg[4], arg[5] or "adamw"
local dtype = arg[6] or "fp32"
assert(stage and gas and ratio and work, "usage: offload_ratio_check.lua STAGE GAS RATIO WORKDIR [OPT] [DTYPE]")
local W, r = dist.world_size(), dist.rank()
local STEPS, MB, TLEN = 3, 2, 12
local dev = os.getenv("ZRUN_CHECK_DEVICE") == "cuda" and "cuda" or nil
local name = ("offload ratio %g %s %s stage %d np=%d gas=%d%s"):format(ratio, optname, dtype, stage, W, gas,
  dev and " cuda" or "")
local cfg = zr.models.llama.config("zrun/tiny-llama")
cfg.device = dev
local OPTS = {
  adamw = { type = "AdamW", params = { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
  lion = { type = "Lion", params = { lr = 1e-4, betas = { 0.9, 0.99 }, weight_decay = 0.1 } },
  adagrad = { type = "Adagrad", params = { lr = 1e-2, eps = 1e-10, weight_decay = 0.01, initial_accumulator_value = 0.1 } },
  sgd = { type = "SGD", params = { lr = 1e-2, momentum = 0.9, weight_decay = 0.01 } },
}

local function batch(step, micro)
  return T.rank_batch(step, micro, { rank = r, world_size = W, mb = MB, tlen = TLEN, device = dev })
end

-- A fresh engine with offload ratio `ra` (nil: no offload); two parameter groups (their own lr and
-- weight decay) so per-parameter settings cross the split. Ratio 1 keeps its gradients on the
-- "device" too (as ratio < 1 must), so that both add them in the same order.
local engine_mod = require "zrun.engine"
local function engine_at(ra)
  local saved = engine_mod.offload_grads_place
  engine_mod.offload_grads_place = function(...) return ra == 1 and "device" or saved(...) end
  zr.manual_seed(1234)
  local model = zr.models.llama.LlamaForCausalLM(cfg)
  local decay, rest = {}, {}
  for n, p in model:named_parameters() do
    if n:find("norm") then rest[#rest + 1] = p else decay[#decay + 1] = p end
  end
  local e = zr.initialize({ model = model, model_parameters = { { params = decay }, { params = rest, weight_decay = 0,
    lr = OPTS[optname].params.lr * 0.5 } },
    config = { train_micro_batch_size_per_gpu = MB, gradient_accumulation_steps = gas, gradient_clipping = 0.05,
      steps_per_print = 1000000, optimizer = OPTS[optname], bf16 = { enabled = dtype == "bf16" },
      zero_optimization = { stage = stage, reduce_bucket_size = 3000, stage3_param_persistence_threshold = 0,
        offload_optimizer = ra and { device = "cpu", ratio = ra } or nil } } })
  engine_mod.offload_grads_place = saved
  if ra then T.eq(e.offload_grads, "device", "the gradients' place") end
  return e
end

local function params_of(e)
  local ps = {}
  for i, p in ipairs(e:gather_parameters()) do ps[i] = p:clone() end
  if e.stage == 3 then e.zero:release_all() end
  return ps
end
local function states_of(e)
  local st = {}
  for k = 0, e.zero:num_states() do st[#st + 1] = e.zero:state(k):clone() end
  return st
end

local function compare(what, a, b, tol)
  T.near(a.losses, b.losses, tol, 0, what .. ": losses")
  for i, p in ipairs(a.params) do T.near(p, b.params[i], tol, 0, what .. ": weights of parameter " .. i) end
  for k, s in ipairs(b.states and a.states or {}) do T.near(s, b.states[k], tol, 0, what .. ": optimizer state " .. (k - 1)) end
end

local function run(ra)
  local e = engine_at(ra)
  local out = { losses = T.train_steps(e, batch, 1, STEPS, gas), engine = e }
  out.params, out.states = params_of(e), ra and states_of(e) or nil
  return out
end

local function check()
  local S = nil
  local part = run(ratio)
  local z = part.engine.zero
  S = z:partition_numel()
  -- the split: ratio 1 none, ratio 0 the whole partition, else a real cut near (1 - ratio) x S
  local split = z:split()
  if ratio == 1 then T.eq(split, 0, "ratio 1: no device part")
  elseif ratio == 0 then T.eq(split, S, "ratio 0: the whole partition on the device")
  else
    assert(split > 0 and split < S, ("ratio %g: split %d of %d, expected a real cut"):format(ratio, split, S))
    assert(math.abs(split - (1 - ratio) * S) <= 0.02 * S + 1, ("split %d too far from (1 - %g) x %d"):format(split, ratio, S))
  end
  local bf = 2 * 1e-3 * STEPS -- bf16: a flipped rounding flips Adam's update sign: 2 lr per step
  local tol_ratio = dev and (dtype == "bf16" and bf or 2e-5) or 0
  if ratio < 1 then compare("ratio " .. ratio .. " vs ratio 1", part, run(1), tol_ratio) end
  local none = run(nil)
  local tol_none = (W == 1 and stage < 3) and 2e-6 or 0
  -- on a GPU at one rank, no offload runs in direct mode at every stage (stage 3 keeps its
  -- parameters resident) while ratio 0 at stage 3 keeps its shard path: another float order
  if dev then tol_none = (ratio == 0 and W > 1) and 0 or tol_ratio end
  if dtype == "bf16" and not dev and tol_none > 0 then tol_none = bf end
  compare("ratio " .. ratio .. " vs no offload", part, none, tol_none)

  -- checkpoint across ratios: saved after step 2 at this ratio, loaded at others (one without a
  -- split, one with), step 3 on both; then what each saves equals, tensor for tensor
  local ct = tol_ratio
  for _, other in ipairs(ratio == 1 and { 0.3, 0 } or { 1, ratio == 0 and 0.3 or 0 }) do
    local a = engine_at(ratio)
    T.train_steps(a, batch, 1, 2, gas)
    local dir = work .. "/ck_" .. tostring(ratio):gsub("%.", "_")
    a:save_checkpoint(dir, "two")
    local saved = states_of(a)
    local b = engine_at(other)
    b:load_checkpoint(dir, "two")
    local loaded = states_of(b)
    local what = ("saved at ratio %g, loaded at %g"):format(ratio, other)
    for k, s in ipairs(saved) do T.near(loaded[k], s, 0, 0, what .. ": state " .. (k - 1)) end
    local la = T.train_steps(a, batch, 3, 3, gas)
    local lb = T.train_steps(b, batch, 3, 3, gas)
    compare(what .. ", step 3", { losses = lb, params = params_of(b), states = states_of(b) },
      { losses = la, params = params_of(a), states = states_of(a) }, ct)
    a:save_checkpoint(dir, "three")
    b:save_checkpoint(dir .. "_b", "three")
    for k = 0, W - 1 do
      local f = ("/three/zero_pp_rank_%d_mp_rank_00_optim_states.safetensors"):format(k)
      local ta, tb = zr.load_safetensors(dir .. f), zr.load_safetensors(dir .. "_b" .. f)
      for n, t in pairs(ta) do T.near(tb[n], t, ct, 0, ("%s: rank %d's file after step 3, tensor %s"):format(what, k, n)) end
    end
  end
end

if r == 0 then T.test(name, check) else check() end
T.done()
