-- DeepSpeed's bf16.bf16_master_weights_and_grads and bf16_optimizer_states in the ZeRO engine: each
-- AdamW step against a naive Lua restatement of DeepSpeed's (FusedAdam / DeepSpeedCPUAdam: f32
-- arithmetic on the widened states, each state rounded to bf16 once when stored), at stages 1-3 and
-- with optimizer offload; the states' dtypes and bytes; resume bit for bit; zero-to-fp32; the refusals.
local zr = require "zrun"
local T = zr.testing
local ckpt_zero = require "zrun.zero_to_fp32"

local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "bf16_adamw_reference.lua")
local LR, WD, B1, B2, EPS = R.LR, R.WD, R.B1, R.B2, R.EPS

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


local function check_steps(engine, n, round_states) return R.check_steps(engine, n, round_states, batch) end

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
  -- the host pipeline in chunks of 1,000 elements (at odd offsets into the bf16 master and moments)
  zr.setenv("ZRUN_OFFLOAD_CHUNK", "1000")
  local ok, host = pcall(engine_for, config(2, { zero_optimization = { offload_optimizer = { device = "cpu" } } }))
  zr.setenv("ZRUN_OFFLOAD_CHUNK", nil)
  assert(ok, host)
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
    T.collect_all() -- the previous engine freed now, not inside zr.initialize's own collection
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
    T.collect_all()
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
  local function run(e, from, to) return R.train(e, from, to, batch) end
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
