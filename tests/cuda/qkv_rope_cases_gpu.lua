-- Diagnostic for the H200 (session 7: tests/ops/test_qkv_rope_cuda.lua failed with "qkv_rope_forward_cuda:
-- CUDA launch failed: invalid argument" on one of its small cases): every dtype x shape x layout of
-- that test, forward only, synchronised, one line each. Run: CUDA_LAUNCH_BLOCKING=1 ./zrun tests/cuda/qkv_rope_cases_gpu.lua
local zr = require "zrun"
local SHAPES = { { 1, 1, 1, 1, 2 }, { 2, 7, 4, 2, 8 }, { 1, 5, 3, 3, 6 }, { 1, 33, 4, 1, 64 }, { 2, 5, 2, 2, 128 } }
for _, dt in ipairs { "f32", "bf16", "f16" } do
  for _, s in ipairs(SHAPES) do
    local B, Tn, H, KV, D = unpack(s)
    local cos, sin = zr.rope_tables(Tn, D, { theta = 10000, dtype = "f32" })
    for _, layout in ipairs { "bhtd", "bthd", false } do
      local x = zr.randn({ B, Tn, (H + 2 * KV) * D }):to("cuda", dt)
      local ok, e = pcall(function()
        local q, k, v = zr.qkv_rope(x, H, KV, cos:to("cuda", dt), sin:to("cuda", dt), layout or nil)
        zr.cuda.synchronize()
      end)
      print(ok and "ok  " or "ERR ", dt, table.concat(s, ","), tostring(layout), ok and "" or tostring(e):sub(1, 200))
    end
  end
end
