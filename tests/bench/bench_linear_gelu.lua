-- GPT-2's MLP up-projection before and after zr.linear_gelu: x (rows, 768) · W (768, 3072, stored
-- as Conv1D's (in, out)) + b then the tanh GELU, forward and backward, on the GPU (the CPU when
-- there is none). Unfused = zr.linear + :gelu("tanh"); fused = zr.linear_gelu (the GEMM's GELU
-- epilogue on CUDA). Then the whole MLP (768 -> 3072 -> 768): linear, gelu, linear; linear_gelu
-- then linear; zr.mlp_gelu (also the dGELU epilogue in backward). Median of 20 after 5 warm-ups.
--   ./zrun tests/bench/bench_linear_gelu.lua [rows=65536] [C=768]   (B*T = 64*1024, bf16; 512 rows on the CPU)
local zr = require "zrun"
local timing = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/op_timing.lua")
local cli = require("zrun.argparse").new("tests/bench/bench_linear_gelu.lua",
  "GPT-2's MLP up-projection + tanh GELU, unfused vs zr.linear_gelu, forward and backward.")
-- on the CPU GPT-2's 65536 rows take ~8 s a call, ~20 minutes for the table on 2 cores: bench_conv1d's 512
cli:option("rows", timing.gpu and 65536 or 512, "rows of x (B*T; on the CPU 512)")
cli:option("C", 768, "the model width (the output is 4C)")
local opt = cli:parse(arg)
local dev, dt = timing.dev, timing.dt
local N, Cin = opt.rows, opt.C
zr.manual_seed(0)
local td = { dtype = dt, device = dev, requires_grad = true }
local x = zr.randn({ N, Cin }, td)
local w = (zr.randn({ Cin, 4 * Cin }, { dtype = dt, device = dev }) * 0.02):detach():requires_grad_(true)
local b = zr.zeros({ 4 * Cin }, td)
local w2 = (zr.randn({ 4 * Cin, Cin }, { dtype = dt, device = dev }) * 0.02):detach():requires_grad_(true)
local b2 = zr.zeros({ Cin }, td)
local go = zr.randn({ N, 4 * Cin }, { dtype = dt, device = dev })
local go2 = zr.randn({ N, Cin }, { dtype = dt, device = dev })

local function unfused() return zr.linear(x * 1, w:transpose(1, 2), b):gelu("tanh") end
local function fused() return zr.linear_gelu(x * 1, w:transpose(1, 2), b) end
local function mlp_unfused() return zr.linear(unfused(), w2:transpose(1, 2), b2) end
local function mlp_half() return zr.linear(fused(), w2:transpose(1, 2), b2) end
local function mlp_fused() return zr.mlp_gelu(x * 1, w:transpose(1, 2), b, w2:transpose(1, 2), b2) end

local function time(f, go)
  return timing.fwd_bwd(f, go, function() x.grad, w.grad, b.grad, w2.grad, b2.grad = nil, nil, nil, nil, nil end)
end

print(("linear + tanh GELU, %s %s, %d x %d -> %d (ms; x * 1 included, so dX is a producer's gradient)"):format(
  dev, dt, N, Cin, 4 * Cin))
print(("%-12s %10s %10s %10s"):format("", "forward", "backward", "total"))
for _, r in ipairs { { "unfused", unfused, go }, { "linear_gelu", fused, go }, { "MLP", nil },
                     { "unfused", mlp_unfused, go2 }, { "linear_gelu", mlp_half, go2 }, { "mlp_gelu", mlp_fused, go2 } } do
  if not r[2] then
    print(("the MLP, %d -> %d -> %d"):format(Cin, 4 * Cin, Cin))
  else
    local f, bk = time(r[2], r[3])
    print(("%-12s %10.3f %10.3f %10.3f"):format(r[1], f, bk, f + bk))
  end
end
