-- Gemma 3 (zrun.models.gemma3) on a GPU, from the golden files of tests/lua/test_gemma3_golden.lua (transformers
-- 5.17, f32; rows three times the sliding window): CUDA f32 gives transformers' logits, loss and every gradient
-- (head_dim 32 and 16 run the attention's f32 composition, each row masked by its windowed segments in the sliding
-- layers), CUDA bf16 the logits and loss within bf16's tolerance. `./zrun tests/cuda/test_gemma3_cuda.lua`; prints
-- SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../ops/cuda_common.lua")
if C.skip_without_gpu("Gemma 3 on CUDA") then return end
local zr, T = C.zr, C.T
local cjson = require "cjson"
local gemma3 = zr.models.gemma3

for _, name in ipairs { "gemma3_a", "gemma3_b" } do
  local g, meta = zr.load_safetensors("tests/golden/" .. name .. ".safetensors")
  local cfg = cjson.decode(meta.config)
  local function build(dtype)
    local c = {}
    for k, v in pairs(cfg) do c[k] = v end
    c.dtype, c.device = dtype, "cuda"
    local model = gemma3.Gemma3ForCausalLM(c)
    local sd = {}
    for n in model:named_parameters() do sd[n] = g[n] end
    model:load_state_dict(sd, true)
    return model
  end

  T.test(name .. " on CUDA in f32: transformers' logits, loss and gradients", function()
    local model = build("f32")
    local out = model(g.input_ids:cuda(), g.labels:cuda())
    T.near(out.logits:cpu(), g.logits, 1e-4, 1e-4, "logits")
    T.near(out.loss:cpu(), g.loss, 1e-5, 1e-5, "loss")
    out.loss:backward()
    for n, p in model:named_parameters() do T.near(p.grad:cpu(), g["grad." .. n], 1e-4, 1e-3, "grad of " .. n) end
  end)

  T.test(name .. " on CUDA in bf16: logits and loss within bf16's tolerance, gradients on the GPU", function()
    local model = build("bf16")
    local out = model(g.input_ids:cuda(), g.labels:cuda())
    T.near(out.logits:float():cpu(), g.logits, 6e-2, 6e-2, "bf16 logits")
    local l, want = out.loss:float():item(), g.loss:item()
    assert(math.abs(l - want) <= 2e-2 * math.abs(want), ("bf16 loss %.6f vs golden %.6f"):format(l, want))
    out.loss:backward()
    for n, p in model:named_parameters() do assert(p.grad and p.grad:device() == "cuda:0", "bf16 grad of " .. n) end
  end)
end
T.done()
