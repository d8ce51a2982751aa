-- Gemma 3 (zrun.models.gemma3) on a GPU, from the golden files of tests/lua/test_gemma3_golden.lua (transformers
-- 5.17, f32): on each row's first sliding_window tokens (causal: their logits are the golden ones' first columns),
-- CUDA f32 gives transformers' logits and the CPU's loss and gradients (tight), CUDA bf16 the logits and loss within
-- bf16's tolerance; a row longer than the window, which the f32 composition that runs head_dim 32 and 16 on CUDA
-- cannot mask, is refused in one line. `./zrun tests/cuda/test_gemma3_cuda.lua`; prints SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../ops/cuda_common.lua")
if C.skip_without_gpu("Gemma 3 on CUDA") then return end
local zr, T = C.zr, C.T
local cjson = require "cjson"
local gemma3 = zr.models.gemma3

for _, name in ipairs { "gemma3_a", "gemma3_b" } do
  local g, meta = zr.load_safetensors("tests/golden/" .. name .. ".safetensors")
  local cfg = cjson.decode(meta.config)
  local W = cfg.sliding_window
  local ids, labels = g.input_ids:narrow(2, 1, W):contiguous(), g.labels:narrow(2, 1, W):contiguous()
  local function build(dtype, device)
    local c = {}
    for k, v in pairs(cfg) do c[k] = v end
    c.dtype, c.device = dtype, device
    local model = gemma3.Gemma3ForCausalLM(c)
    local sd = {}
    for n in model:named_parameters() do sd[n] = g[n] end
    model:load_state_dict(sd, true)
    return model
  end
  local cpu = build("f32", "cpu")
  local ref = cpu(ids, labels)
  ref.loss:backward()

  T.test(name .. " on CUDA in f32: transformers' logits, the CPU's loss and gradients (the first " .. W .. " tokens)", function()
    local model = build("f32", "cuda")
    local out = model(ids:cuda(), labels:cuda())
    T.near(out.logits:cpu(), g.logits:narrow(2, 1, W), 1e-4, 1e-4, "logits")
    T.near(out.loss:cpu(), ref.loss, 1e-5, 1e-5, "loss")
    out.loss:backward()
    local named = {}
    for n, p in cpu:named_parameters() do named[n] = p end
    for n, p in model:named_parameters() do T.near(p.grad:cpu(), named[n].grad, 1e-4, 1e-3, "grad of " .. n) end
  end)

  T.test(name .. " on CUDA in bf16: logits and loss within bf16's tolerance, gradients on the GPU", function()
    local model = build("bf16", "cuda")
    local out = model(ids:cuda(), labels:cuda())
    T.near(out.logits:float():cpu(), g.logits:narrow(2, 1, W), 6e-2, 6e-2, "bf16 logits")
    local l, want = out.loss:float():item(), ref.loss:item()
    assert(math.abs(l - want) <= 2e-2 * math.abs(want), ("bf16 loss %.6f vs %.6f"):format(l, want))
    out.loss:backward()
    for n, p in model:named_parameters() do assert(p.grad and p.grad:device() == "cuda:0", "bf16 grad of " .. n) end
  end)

  T.test(name .. " on CUDA: rows longer than the window are refused in one line", function()
    local model = build("bf16", "cuda")
    T.raises(function() model(g.input_ids:cuda(), g.labels:cuda()) end,
      ("sliding_window %d masks keys of a sequence of %d tokens"):format(W, g.input_ids:size(2)))
  end)
end
T.done()
