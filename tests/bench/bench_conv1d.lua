-- GPT-2's Conv1D products (weights stored (in, out)) before and after zr.conv1d, forward and
-- backward on the GPU in bf16 (the CPU in f32 when there is none): c_attn as one product, 768 ->
-- 2304, and the MLP through zr.mlp_gelu, 768 -> 3072 -> 768. Per product three ways: "copy" runs
-- zr.linear on :contiguous() of the transposed weight (what every forward and backward did before:
-- a weight copy, dW made (out, in) and transposed back), "view" zr.linear on the transposed view,
-- "conv1d" the weight as stored (zr.conv1d, mlp_gelu's layout "conv1d"). Each with fresh gradients
-- and with f32 gradients held from the start (the ZeRO engine's partition: dW added into them).
-- Medians of 20 after 5 warm-ups (op_timing.lua).
--   ./zrun tests/bench/bench_conv1d.lua [rows=65536] [C=768]   (B*T = 64*1024; 512 rows on the CPU)
local zr = require "zrun"
local cli = require("zrun.argparse").new("tests/bench/bench_conv1d.lua",
  "GPT-2's Conv1D products (c_attn, the MLP): weight copy, transposed view, zr.conv1d; forward and backward.")
local timing = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/op_timing.lua")
cli:option("rows", timing.gpu and 65536 or 512, "rows of x (B*T; on the CPU 512)")
cli:option("C", 768, "the model width (c_attn's output is 3C, the MLP's hidden 4C)")
local opt = cli:parse(arg)
local dev, dt = timing.dev, timing.dt
local N, C = opt.rows, opt.C
zr.manual_seed(0)
local function param(shape, s) return (zr.randn(shape, { dtype = dt, device = dev }) * s):detach():requires_grad_(true) end
local x = param({ N, C }, 1)
local wa, ba = param({ C, 3 * C }, 0.02), param({ 3 * C }, 0)
local wf, bf, wp, bp = param({ C, 4 * C }, 0.02), param({ 4 * C }, 0), param({ 4 * C, C }, 0.02), param({ C }, 0)
local go_a = zr.randn({ N, 3 * C }, { dtype = dt, device = dev })
local go_m = zr.randn({ N, C }, { dtype = dt, device = dev })
local params = { wa, ba, wf, bf, wp, bp }

-- (x * 1: dX is a producer's gradient, as in the model)
local function copy(w) return w:transpose(1, 2):contiguous() end
local cases = {
  { "c_attn", go_a, {
    { "copy", function() return zr.linear(x * 1, copy(wa), ba) end },
    { "view", function() return zr.linear(x * 1, wa:transpose(1, 2), ba) end },
    { "conv1d", function() return zr.conv1d(x * 1, wa, ba) end } } },
  { "mlp_gelu", go_m, {
    { "copy", function() return zr.mlp_gelu(x * 1, copy(wf), bf, copy(wp), bp) end },
    { "view", function() return zr.mlp_gelu(x * 1, wf:transpose(1, 2), bf, wp:transpose(1, 2), bp) end },
    { "conv1d", function() return zr.mlp_gelu(x * 1, wf, bf, wp, bp, "conv1d") end } } },
}

print(("GPT-2's Conv1D products, %s %s, rows %d, C %d (ms, median of 20)"):format(dev, dt, N, C))
print(("%-28s %10s %10s %10s"):format("", "forward", "backward", "total"))
for _, grads in ipairs { "fresh", "f32" } do
  for _, c in ipairs(cases) do
    local shape = c[1] == "c_attn" and ("%d -> %d"):format(C, 3 * C) or ("%d -> %d -> %d"):format(C, 4 * C, C)
    print(("%s %s, %s gradients"):format(c[1], shape, grads == "fresh" and "fresh" or "f32 (held)"))
    for _, r in ipairs(c[3]) do
      for _, p in ipairs(params) do
        p.grad = grads == "f32" and zr.zeros(p:shape(), { dtype = "f32", device = dev }) or nil
      end
      local reset = function()
        x.grad = nil
        if grads == "fresh" then for _, p in ipairs(params) do p.grad = nil end end
      end
      local f, b = timing.fwd_bwd(r[2], c[2], reset)
      print(("  %-26s %10.3f %10.3f %10.3f"):format(r[1], f, b, f + b))
    end
  end
end
