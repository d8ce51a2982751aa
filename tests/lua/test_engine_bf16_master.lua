-- DeepSpeed's bf16.bf16_master_weights_and_grads and bf16_optimizer_states in the ZeRO engine: each
-- AdamW step against a naive Lua restatement of DeepSpeed's (FusedAdam / DeepSpeedCPUAdam: f32
-- arithmetic on the widened states, each state rounded to bf16 once when stored), at stages 1-3 and
-- with optimizer offload; the states' dtypes and bytes; resume bit for bit; zero-to-fp32; the refusals.
local zr = require "zrun"
local T = zr.testing
local ckpt_zero = require "zrun.zero_to_fp32"

local LR, WD, B1, B2, EPS = 3e-3, 0.01, 0.9, 0.95, 1e-8

-- x rounded to the nearest number of `bits` significant bits, ties to even: bf16 (8) is what
-- DeepSpeed's kernels store, f32 (24) what each of their f32 operations yields.
local function round_bits(x, bits)
  if x == 0 or x ~= x or x == math.huge or x == -math.huge then return x end
  local _, e = math.frexp(x) -- |x| = f 2^e, 0.5 <= f < 1
  local scale = 2 ^ (bits - e)
  local r = x * scale
  local f = math.floor(r)
  local d = r - f
  if d > 0.5 or (d == 0.5 and f % 2 == 1) then f = f + 1 end
  return f / scale
end
local function bf16(x) return round_bits(x, 8) end
local function f32(x) return round_bits(x, 24) end

-- DeepSpeed's FusedAdam step on one element (csrc/adam/multi_tensor_adam.cu, ADAM_MODE_1: AdamW),
-- every operation an f32 one (a double op on f32 values, rounded: exact for + - * / sqrt here);
-- its host scalars: the hyper-parameters as f32, 1 - beta in f32, 1 - beta^t in double then f32.
-- g is the bf16 gradient (scaled by 1 in these runs). round_states: the moments are stored as bf16.
local function ds_step(p, m, v, g, t, round_states)
  local b1, b2, lr, wd, eps = f32(B1), f32(B2), f32(LR), f32(WD), f32(EPS)
  local bc1, bc2 = f32(1 - b1 ^ t), f32(1 - b2 ^ t)
  m = f32(f32(b1 * m) + f32(f32(1 - b1) * g))
  v = f32(f32(b2 * v) + f32(f32(f32(1 - b2) * g) * g))
  local denom = f32(f32(math.sqrt(f32(v / bc2))) + eps)
  local update = f32(f32(f32(m / bc1) / denom) + f32(wd * p))
  p = f32(p - f32(lr * update))
  if round_states then m, v = bf16(m), bf16(v) end
  return bf16(p), m, v
end

local function config(stage, extra)
  local cfg = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
    optimizer = { type = "AdamW", params = { lr = LR, betas = { B1, B2 }, eps = EPS, weight_decay = WD } },
    zero_optimization = { stage = stage }, bf16 = { enabled = true, bf16_master_weights_and_grads = true,
    bf16_optimizer_states = true } }
  for k, v in pairs(extra or {}) do
    if type(v) == "table" and type(cfg[k]) == "table" then for kk, vv in pairs(v) do cfg[k][kk] = vv end
    else cfg[k] = v end
  end
  return cfg
end

local function engine_for(cfg)
  zr.manual_seed(11)
  local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
  return (zr.initialize({ model = model, config = cfg })), model
end

-- One batch, every step (the tiny model memorises it, so its loss falls fast).
local function batch()
  zr.manual_seed(100)
  return (zr.rand({ 2, 24 }) * 250):to("i64")
end

-- Two lists of numbers equal element by element.
local function same(a, b, what)
  T.eq(#a, #b, what .. ": length")
  for i = 1, #a do
    if a[i] ~= b[i] then error(("%s: element %d: %.9g vs %.9g"):format(what, i, a[i], b[i]), 2) end
  end
end

local function flat(t) return t:to("f64"):flat_table() end

-- Steps 1..n, each checked against ds_step from the engine's own state and gradient before it:
-- every value equal (bit for bit: the engine does FusedAdam's f32 operations in its order, without
-- FMA contraction). round_states: the moments are bf16 (else f32).
local function check_steps(engine, n, round_states)
  local z = engine.zero
  local losses = {}
  for t = 1, n do
    local ids = batch(t)
    local out = engine(ids, ids)
    engine:backward(out.loss)
    losses[t] = out.loss:item()
    local g, p0, m0, v0 = flat(z:state(3)), flat(z:state(0)), flat(z:state(1)), flat(z:state(2))
    T.eq(z:state(3):dtype(), "bf16", "the gradient partition")
    engine:step()
    local p1, m1, v1 = flat(z:state(0)), flat(z:state(1)), flat(z:state(2))
    -- gradient_clipping: DeepSpeed multiplies the bf16 gradient partition in place by the clip
    -- coefficient (unscale_and_clip_grads), so each element is rounded back to bf16 before AdamW
    local coef = 1
    if engine.clip and engine.clip > 0 then coef = math.min(1, engine.clip / (engine.last_grad_norm + 1e-6)) end
    local moved = 0
    for i = 1, #p1 do
      local gi = coef == 1 and g[i] or bf16(f32(g[i] * f32(coef)))
      local rp, rm, rv = ds_step(p0[i], m0[i], v0[i], gi, t, round_states)
      for _, c in ipairs { { p1[i], rp, "master" }, { m1[i], rm, "exp_avg" }, { v1[i], rv, "exp_avg_sq" } } do
        if c[1] ~= c[2] then
          error(("step %d element %d %s: engine %.9g, DeepSpeed's step %.9g (from p %.9g m %.9g v %.9g g %.9g)"):format(
            t, i, c[3], c[1], c[2], p0[i], m0[i], v0[i], g[i]), 0)
        end
      end
      if p1[i] ~= p0[i] then moved = moved + 1 end
    end
    assert(moved > 0.5 * #p1, ("step %d: only %d of %d weights moved"):format(t, moved, #p1))
  end
  return losses
end

for _, stage in ipairs { 1, 2, 3 } do
  T.test(("stage %d, bf16 master and moments: each AdamW step is DeepSpeed's, and the loss falls"):format(stage),
    function()
      local engine = engine_for(config(stage))
      local z = engine.zero
      for k = 0, 2 do T.eq(z:state(k):dtype(), "bf16", "state " .. k) end
      local losses = check_steps(engine, 6, true)
      assert(losses[6] < losses[1] - 0.5, ("loss did not fall: %g -> %g"):format(losses[1], losses[6]))
    end)
end

T.test("offload_optimizer with bf16 moments: DeepSpeed's step on the host, the same bits as on the device", function()
  local dev = engine_for(config(2))
  local host = engine_for(config(2, { zero_optimization = { offload_optimizer = { device = "cpu" } } }))
  check_steps(host, 4, true)
  check_steps(dev, 4, true)
  for k = 0, 2 do same(host.zero:state(k):flat_table(), dev.zero:state(k):flat_table(), "state " .. k) end
end)

T.test("gradient_clipping: the clipped bf16 gradient is rounded to bf16 before the step, as in DeepSpeed", function()
  local engine = engine_for(config(2, { gradient_clipping = 0.05 }))
  check_steps(engine, 3, true)
  assert(engine.last_grad_norm > 0.05, "the gradient was not clipped: norm " .. engine.last_grad_norm)
end)

T.test("offload_optimizer, bf16 master with f32 moments (DeepSpeed's mixed mode)", function()
  local engine = engine_for(config(3, { bf16 = { bf16_optimizer_states = false },
    zero_optimization = { offload_optimizer = { device = "cpu" } } }))
  T.eq(engine.zero:state(0):dtype(), "bf16")
  T.eq(engine.zero:state(1):dtype(), "f32")
  check_steps(engine, 4, false)
end)

-- DeepSpeed's docs: ~6 bytes per parameter on the host (bf16 master + two bf16 moments) instead of ~10
-- (bf16 master + fp32 moments) or 12 (fp32 master and moments).
T.test("optimizer memory: 6, 10 and 12 bytes per partition element", function()
  for _, c in ipairs { { true, true, 6 }, { true, false, 10 }, { false, false, 12 } } do
    collectgarbage("collect")
    local before = zr.memory.stats().optimizer.current
    local engine = engine_for(config(2, { bf16 = { bf16_master_weights_and_grads = c[1], bf16_optimizer_states = c[2] },
      zero_optimization = { offload_optimizer = { device = "cpu" } } }))
    local used = zr.memory.stats().optimizer.current - before
    T.eq(used, c[3] * engine.zero:partition_numel(), ("master bf16 %s, moments bf16 %s"):format(c[1], c[2]))
    engine = nil
  end
end)

-- zr.memory.plan (zrun plan, zrun estimate's states) counts the same bytes as a live engine holds:
-- the optimizer's and the gradient partition's (on a CPU run the device and host columns are one memory).
T.test("the memory plan's optimizer and gradient bytes are the live engine's", function()
  local P = require "zrun.memory_plan"
  for _, c in ipairs { { false, true, true }, { "host", true, true }, { "host", true, false }, { "device", true, true } } do
    local extra = { bf16 = { bf16_master_weights_and_grads = c[2], bf16_optimizer_states = c[3] } }
    if c[1] then extra.zero_optimization = { offload_optimizer = { device = "cpu" } } end
    local cfg = config(2, extra)
    collectgarbage("collect")
    local before = zr.memory.stats()
    zr.setenv("ZRUN_OFFLOAD_GRADS", c[1] or nil)
    local engine = engine_for(cfg)
    zr.setenv("ZRUN_OFFLOAD_GRADS", nil)
    local now = zr.memory.stats()
    local p = P.plan { model = zr.models.llama.config("zrun/tiny-llama"), config = cfg, world_size = 1, device = "cpu",
      micro_batch = 2, seq_len = 24, offload_grads = c[1] or nil }
    local what = ("offload %s, master bf16 %s, moments bf16 %s"):format(tostring(c[1]), tostring(c[2]), tostring(c[3]))
    for _, cat in ipairs { "optimizer", "grads" } do
      T.eq(p.device[cat] + p.host[cat], now[cat].current - before[cat].current, what .. ": " .. cat .. " bytes")
    end
    T.eq(p.device.optimizer + p.host.optimizer, (c[3] and 6 or 10) * engine.zero:partition_numel(), what)
    engine = nil
  end
end)

T.test("save and resume: bit for bit, the checkpoint holds bf16 states; zero-to-fp32 widens the bf16 master", function()
  local dir = os.tmpname()
  os.remove(dir)
  local cfg = config(2)
  local a = engine_for(cfg)
  local function run(e, from, to)
    local l = {}
    for t = from, to do
      local ids = batch(t)
      local out = e(ids, ids)
      e:backward(out.loss)
      e:step()
      l[#l + 1] = out.loss:item()
    end
    return l
  end
  run(a, 1, 3)
  a:save_checkpoint(dir, "t3")
  local la = run(a, 4, 6)
  local b = engine_for(cfg)
  b:load_checkpoint(dir, "t3")
  local lb = run(b, 4, 6)
  same(lb, la, "losses after the resume")
  for k = 0, 2 do same(b.zero:state(k):flat_table(), a.zero:state(k):flat_table(), "state " .. k) end
  local f = zr._C.safetensors_open(dir .. "/t3/zero_pp_rank_0_mp_rank_00_optim_states.safetensors")
  for _, name in ipairs { "master", "exp_avg", "exp_avg_sq" } do T.eq(f:info(name).dtype, "bf16", name) end
  f:close()
  local out = dir .. "/fp32.safetensors"
  local _, _, mdt = ckpt_zero.convert(dir, "t3", out)
  T.eq(mdt, "bf16")
  -- the consolidated fp32 weights are the bf16 master widened: the model's (bf16) parameters exactly
  local sd = ckpt_zero.get_fp32_state_dict_from_zero_checkpoint(dir, "t3")
  local r, model = engine_for(cfg)
  r:load_checkpoint(dir, "t3")
  local n = 0
  for name, p in model:named_parameters() do
    T.eq(sd[name]:dtype(), "f32", name)
    same(sd[name]:flat_table(), p:to("f32"):flat_table(), name)
    n = n + 1
  end
  assert(n > 0)
  os.execute("rm -rf '" .. dir .. "'")
end)

T.test("combinations DeepSpeed refuses, and those zrun does not run, are one line naming the fix", function()
  local cases = {
    { config(1, { bf16 = { bf16_master_weights_and_grads = false } }), "bf16_optimizer_states needs bf16.bf16_master_weights_and_grads: true" },
    { config(0), "need zero_optimization.stage 1, 2 or 3" },
    { config(2, { bf16 = { bf16_optimizer_states = false } }), "add it, or set bf16.bf16_optimizer_states to true" },
    { config(2, { bf16 = { enabled = false } }), "set bf16.enabled to true" },
    { config(2, { optimizer = { type = "Lion", params = { lr = 1e-4 } } }), "set optimizer.type to AdamW" },
    { config(2, { optimizer = { type = "AdamW", params = { lr = 1e-4, torch_adam = true } } }), "remove torch_adam" },
    { config(2, { zero_optimization = { offload_optimizer = { device = "cpu", ratio = 0.5 } } }), "set ratio to 1" },
    { config(2, { data_types = { grad_accum_dtype = "fp32" } }), "remove grad_accum_dtype" },
  }
  for _, c in ipairs(cases) do
    local ok, err = pcall(engine_for, c[1])
    assert(not ok, "accepted: " .. c[2])
    err = tostring(err)
    assert(err:find(c[2], 1, true), ("expected %q in: %s"):format(c[2], err))
  end
end)

T.done()
