-- Optimizer steps on CUDA parameters vs the CPU: AdamW (f32/bf16 gradients) and SGD; the ZeRO
-- engine's Lion, Adagrad and SGD kernel and the engine itself with them.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("optim") then return end
local zr, T, close, randn = C.zr, C.T, C.close, C.randn

T.test("optimizers on CUDA parameters: AdamW (f32/bf16 grads) and SGD match the CPU", function()
  for _, gdt in ipairs { "f32", "bf16" } do
    for _, n in ipairs { 1, 7, 1000003 } do
      local p0, g0 = randn({ n }), randn({ n }):to(gdt)
      local function run(dev)
        local p = p0:to(dev):clone()
        local m, v = zr.zeros({ n }, { device = dev }), zr.zeros({ n }, { device = dev })
        for step = 1, 3 do
          zr._C.adamw_step({ p }, { g0:to(dev) }, { m }, { v },
            { lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, step = step })
        end
        return p, m, v
      end
      local pc, mc, vc = run("cpu")
      local pg, mg, vg = run("cuda")
      close(pg:cpu(), pc, "f32", ("adamw param n=%d grads %s"):format(n, gdt), 10)
      close(mg:cpu(), mc, "f32", "adamw exp_avg", 10)
      close(vg:cpu(), vc, "f32", "adamw exp_avg_sq", 10)
    end
  end
  -- through zr.optim on a GPU module
  local function train(dev, cls, hp)
    zr.manual_seed(3)
    local lin = zr.nn.Linear(13, 5, { device = dev })
    local opt = cls(lin:parameters(), hp)
    local x = randn({ 7, 13 }):to(dev)
    for _ = 1, 3 do
      opt:zero_grad()
      lin(x):square():sum():backward()
      opt:step()
    end
    return lin.weight
  end
  close(train("cuda", zr.optim.AdamW, { lr = 1e-2 }):cpu(), train("cpu", zr.optim.AdamW, { lr = 1e-2 }), "f32",
    "zr.optim.AdamW on cuda", 10)
  for _, hp in ipairs { { lr = 0.1 }, { lr = 0.1, momentum = 0.9, weight_decay = 0.01 },
    { lr = 0.1, momentum = 0.9, nesterov = true } } do
    close(train("cuda", zr.optim.SGD, hp):cpu(), train("cpu", zr.optim.SGD, hp), "f32", "zr.optim.SGD on cuda", 10)
  end
end)


-- The ZeRO engine's Lion / Adagrad / SGD kernel (optim_step_cuda) against its CPU twin
-- (optim_step_cpu): segments at awkward offsets and sizes with their own lr and weight decay,
-- f32/bf16/f16 gradients scaled on the device, three steps; elements between segments untouched.
T.test("optim_step on CUDA (Lion, Adagrad, SGD over segments) matches the CPU twin", function()
  local CASES = {
    { optimizer = "lion", beta1 = 0.9, beta2 = 0.99 },
    { optimizer = "adagrad", eps = 1e-10, lr_decay = 0.01 },
    { optimizer = "sgd", momentum = 0.9, dampening = 0.1 },
    { optimizer = "sgd", momentum = 0.9, nesterov = true },
    { optimizer = "sgd" },
  }
  for _, h in ipairs(CASES) do
    for _, gdt in ipairs { "f32", "bf16", "f16" } do
      for _, n in ipairs { 1, 7, 4099, 1000003 } do
        -- a gap of 3 after the first segment; 70 segments when n allows (two launches of 64)
        local segs, at = {}, 1
        local k = 0
        while at <= n and #segs < 70 do
          local len = math.min(n - at + 1, k == 0 and math.max(1, math.floor(n / 2)) or math.max(1, math.floor(n / 200)))
          k = k + 1
          segs[#segs + 1] = { start = at, n = len, lr = k % 2 == 0 and 3e-3 or 1e-2, weight_decay = k % 3 == 0 and 0 or 0.1 }
          at = at + len + (k == 1 and 3 or 0)
        end
        local p0, s0 = randn({ n }), zr.rand({ n })
        local has_state = not (h.optimizer == "sgd" and not h.momentum)
        local function run(dev)
          local p = p0:to(dev):clone()
          local s = has_state and s0:to(dev):clone() or nil
          zr.manual_seed(17)
          for step = 1, 3 do
            local g = zr.randn({ n }):to(gdt):to(dev)
            zr._C.optim_step(p, s, g, segs, h, step, 0.5)
          end
          return p, s
        end
        local pc, sc = run("cpu")
        local pg, sg = run("cuda")
        local what = ("%s n=%d grads %s"):format(h.optimizer, n, gdt)
        if has_state then close(sg:cpu(), sc, "f32", what .. " state", 10) end
        if h.optimizer ~= "lion" then
          close(pg:cpu(), pc, "f32", what .. " param", 10)
        else
          -- sign(c) of a c within rounding of 0 may differ between the twins (FMA contraction on
          -- the GPU): such an element moves by up to 2 lr per step; allow a few, bound the rest
          local a, b, bad = pg:cpu():flat_table(), pc:flat_table(), 0
          for i = 1, #b do
            local d = math.abs(a[i] - b[i])
            if d > 1e-5 * (1 + math.abs(b[i])) then
              bad = bad + 1
              assert(d <= 3 * 2 * 1e-2 + 1e-4, ("%s: element %d differs by %g"):format(what, i, d))
            end
          end
          assert(bad <= 3 + n / 100000, ("%s: %d elements differ"):format(what, bad))
        end
      end
    end
  end
end)

-- The engine on a GPU with each optimizer follows the CPU engine (f32, stage 0): same losses.
T.test("ZeRO engine on CUDA with Lion, Adagrad and SGD: losses match the CPU engine", function()
  local CASES = { { "Lion", { lr = 1e-3, weight_decay = 0.01 } }, { "Adagrad", { lr = 3e-2, weight_decay = 0.01 } },
    { "SGD", { lr = 0.3, momentum = 0.9, nesterov = true } } }
  for _, case in ipairs(CASES) do
    local function losses(dev)
      zr.manual_seed(11)
      local mc = zr.models.llama.config("zrun/tiny-llama")
      mc.device = dev
      local m = zr.models.llama.LlamaForCausalLM(mc)
      local e = zr.initialize({ model = m, config = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
        optimizer = { type = case[1], params = case[2] }, zero_optimization = { stage = 0 } } })
      zr.manual_seed(5)
      local ids = (zr.rand({ 2, 24 }) * 250):to("i64"):to(dev)
      local out = {}
      for i = 1, 5 do
        local o = e(ids, ids)
        e:backward(o.loss)
        e:step()
        out[i] = o.loss:item()
      end
      return out
    end
    local lc, lg = losses("cpu"), losses("cuda")
    for i = 1, #lc do T.near(lg[i], lc[i], 2e-3, 2e-3, ("%s step %d"):format(case[1], i)) end
    assert(lc[5] < lc[1], case[1] .. ": the loss did not fall")
  end
end)


-- bf16 on the GPU (direct mode: the kernel writes the 16-bit weights as it updates the master),
-- and optimizer offload (the host kernel writes them, uploaded after): each optimizer learns.
T.test("ZeRO engine on CUDA, bf16 and offload_optimizer: Lion, Adagrad and SGD learn", function()
  local CASES = { { "Lion", { lr = 1e-3, weight_decay = 0.01 } }, { "Adagrad", { lr = 3e-2 } },
    { "SGD", { lr = 0.5, momentum = 0.9 } } }
  for _, case in ipairs(CASES) do
    for _, off in ipairs { false, true } do
      zr.manual_seed(11)
      local mc = zr.models.llama.config("zrun/tiny-llama")
      mc.device = "cuda"
      local m = zr.models.llama.LlamaForCausalLM(mc)
      local zo = { stage = 2 }
      if off then zo.offload_optimizer = { device = "cpu", pin_memory = true } end
      local e = zr.initialize({ model = m, config = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
        bf16 = { enabled = true }, optimizer = { type = case[1], params = case[2] }, zero_optimization = zo } })
      zr.manual_seed(5)
      local ids = (zr.rand({ 2, 24 }) * 250):to("i64"):to("cuda")
      local l = {}
      for i = 1, 12 do
        local o = e(ids, ids)
        e:backward(o.loss)
        e:step()
        l[i] = o.loss:item()
      end
      for _, p in ipairs(m:parameters()) do T.eq(p:dtype(), "bf16") end
      assert(l[12] < l[1] - 0.5, ("%s%s: loss did not fall: %g -> %g"):format(case[1], off and " offload" or "", l[1], l[12]))
    end
  end
end)

-- DeepSpeed's bf16_master_weights_and_grads + bf16_optimizer_states on CUDA: the engine's adamw_lp_step_cuda
-- (and, with offload_optimizer, the host kernel with its weights uploaded) against the Lua
-- restatement of DeepSpeed's step (tests/lua/bf16_adamw_reference.lua) every step, bit for bit (the
-- kernel and its CPU twin do FusedAdam's f32 operations without FMA contraction); stages 1-3, the
-- mixed mode (f32 moments, offload), and clipping.
T.test("ZeRO engine on CUDA with bf16 master and moments: every step is DeepSpeed's, bit for bit", function()
  local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/bf16_adamw_reference.lua")
  local CASES = { { 1, false, true }, { 2, false, true }, { 3, false, true }, { 2, true, true }, { 3, true, false },
    { 2, false, true, 0.05 } }
  for _, c in ipairs(CASES) do
    zr.manual_seed(11)
    local mc = zr.models.llama.config("zrun/tiny-llama")
    mc.device = "cuda"
    local m = zr.models.llama.LlamaForCausalLM(mc)
    local zo = { stage = c[1] }
    if c[2] then zo.offload_optimizer = { device = "cpu", pin_memory = true } end
    local e = zr.initialize({ model = m, config = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
      gradient_clipping = c[4] or 0, bf16 = { enabled = true, bf16_master_weights_and_grads = true,
      bf16_optimizer_states = c[3] }, zero_optimization = zo,
      optimizer = { type = "AdamW", params = { lr = R.LR, betas = { R.B1, R.B2 }, eps = R.EPS, weight_decay = R.WD } } } })
    T.eq(e.zero:state(0):dtype(), "bf16")
    T.eq(e.zero:state(1):dtype(), c[3] and "bf16" or "f32")
    zr.manual_seed(5)
    local ids = (zr.rand({ 2, 24 }) * 250):to("i64"):to("cuda")
    local l = R.check_steps(e, 6, c[3], function() return ids end)
    assert(l[6] < l[1] - 0.3, ("stage %d%s: loss did not fall: %g -> %g"):format(c[1], c[2] and " offload" or "", l[1], l[6]))
  end
end)

T.done()
