-- Optimizer steps on CUDA parameters vs the CPU: AdamW (f32/bf16 gradients) and SGD.
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

T.done()
