-- Lamb on CUDA vs the CPU: the two-pass kernel (lamb_sums_cuda, lamb_apply_cuda) against its CPU
-- twin over segments at awkward sizes (70 of them: two launches of 64), f32/bf16/f16 gradients
-- scaled on the device, with clamping, bias_correction false and eps inside the square root;
-- zr.optim.Lamb on a GPU module; the engine on the GPU (stage 0-2, bf16 weights, offload).
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("optim_lamb") then return end
local zr, T, close, randn = C.zr, C.T, C.close, C.randn

T.test("lamb_step on CUDA (segments) matches the CPU twin", function()
  local CASES = {
    { beta1 = 0.9, beta2 = 0.999, eps = 1e-8, max_coeff = 10, min_coeff = 0.01 },
    { beta1 = 0.8, beta2 = 0.99, eps = 1e-3, max_coeff = 0.3, min_coeff = 0.1, bias_correction = false,
      eps_inside_sqrt = true },
  }
  for ci, h in ipairs(CASES) do
    for _, gdt in ipairs { "f32", "bf16", "f16" } do
      for _, n in ipairs { 1, 7, 4099, 1000003 } do
        -- a gap of 3 after the first segment, an empty one, then up to 70 in all
        local segs, at, k = {}, 1, 0
        while at <= n and #segs < 70 do
          k = k + 1
          local len = k == 2 and 0 or math.min(n - at + 1, k == 1 and math.max(1, math.floor(n / 2)) or
            math.max(1, math.floor(n / 200)))
          segs[#segs + 1] = { start = at, n = len, lr = k % 2 == 0 and 3e-3 or 1e-2, weight_decay = k % 3 == 0 and 0 or 0.1 }
          at = at + len + (k == 1 and 3 or 0)
        end
        local p0 = randn({ n })
        local function run(dev)
          local p = p0:to(dev):clone()
          local m, v = zr.zeros({ n }, { device = dev }), zr.zeros({ n }, { device = dev })
          zr.manual_seed(17)
          for step = 1, 3 do
            local g = zr.randn({ n }):to(gdt):to(dev)
            zr._C.lamb_step(p, m, v, g, segs, h, step, 0.5)
          end
          return p, m, v
        end
        local pc, mc, vc = run("cpu")
        local pg, mg, vg = run("cuda")
        local what = ("lamb case %d n=%d grads %s"):format(ci, n, gdt)
        close(mg:cpu(), mc, "f32", what .. " exp_avg", 10)
        close(vg:cpu(), vc, "f32", what .. " exp_avg_sq", 10)
        close(pg:cpu(), pc, "f32", what .. " param", 10)
      end
    end
  end
end)

T.test("zr.optim.Lamb on CUDA parameters matches the CPU", function()
  local function train(dev, hp)
    zr.manual_seed(3)
    local lin = zr.nn.Linear(13, 5, { device = dev })
    local opt = zr.optim.Lamb(lin:parameters(), hp)
    local x = randn({ 7, 13 }):to(dev)
    for _ = 1, 3 do
      opt:zero_grad()
      lin(x):square():sum():backward()
      opt:step()
    end
    return lin.weight, lin.bias
  end
  for _, hp in ipairs { { lr = 1e-2, weight_decay = 0.01 }, { lr = 1e-2, max_coeff = 0.05, bias_correction = false } } do
    local wg, bg = train("cuda", hp)
    local wc, bc = train("cpu", hp)
    close(wg:cpu(), wc, "f32", "Lamb weight on cuda", 10)
    close(bg:cpu(), bc, "f32", "Lamb bias on cuda", 10)
  end
end)

local function engine(dev, zo, extra)
  zr.manual_seed(11)
  local mc = zr.models.llama.config("zrun/tiny-llama")
  mc.device = dev
  local m = zr.models.llama.LlamaForCausalLM(mc)
  local cfg = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000, zero_allow_untested_optimizer = true,
    optimizer = { type = "Lamb", params = { lr = 0.05, weight_decay = 0.01 } }, zero_optimization = zo }
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return zr.initialize({ model = m, config = cfg }), m
end
local function losses(e, dev, steps)
  zr.manual_seed(5)
  local ids = (zr.rand({ 2, 24 }) * 250):to("i64"):to(dev)
  local out = {}
  for i = 1, steps do
    local o = e(ids, ids)
    e:backward(o.loss)
    e:step()
    out[i] = o.loss:item()
  end
  return out
end

T.test("ZeRO engine on CUDA with Lamb (stages 0-2, offload): losses match the CPU engine", function()
  local lc = losses(engine("cpu", { stage = 0 }), "cpu", 5)
  for _, zo in ipairs { { stage = 0 }, { stage = 1 }, { stage = 2 }, { stage = 2, offload_optimizer = { device = "cpu" } } } do
    local lg = losses(engine("cuda", zo), "cuda", 5)
    for i = 1, #lc do T.near(lg[i], lc[i], 2e-3, 2e-3, ("stage %d%s step %d"):format(zo.stage,
      zo.offload_optimizer and " offload" or "", i)) end
  end
  assert(lc[5] < lc[1], "the loss did not fall")
end)

T.test("ZeRO engine on CUDA, bf16 and offload_optimizer (pinned): Lamb learns", function()
  for _, off in ipairs { false, true } do
    local zo = { stage = 2 }
    if off then zo.offload_optimizer = { device = "cpu", pin_memory = true } end
    local e, m = engine("cuda", zo, { bf16 = { enabled = true } })
    local l = losses(e, "cuda", 12)
    for _, p in ipairs(m:parameters()) do T.eq(p:dtype(), "bf16") end
    assert(l[12] < l[1] - 0.5, ("Lamb%s: loss did not fall: %g -> %g"):format(off and " offload" or "", l[1], l[12]))
  end
end)

T.done()
