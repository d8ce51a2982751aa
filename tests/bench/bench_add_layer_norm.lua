-- GPT-2's residual add and the LayerNorm after it, before and after zr.add_layer_norm: separate =
-- x + r then zr.layer_norm (two kernels forward), fused = zr.add_layer_norm (one). Forward alone,
-- then forward and backward of h + y (h continues the residual stream and y feeds the next layer,
-- so both get a gradient, as in a block; the + is in both rows). Median of 20 after 5 warm-ups.
--   ./zrun tests/bench/bench_add_layer_norm.lua [N=65536] [D=768]   (GPT-2 124M at 64 x 1024, bf16; N=4096 on the CPU)
local zr = require "zrun"
local cli = require("zrun.argparse").new("tests/bench/bench_add_layer_norm.lua",
  "The residual add + LayerNorm, separate vs zr.add_layer_norm, forward and backward.")
local timing = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/op_timing.lua")
cli:option("N", timing.gpu and 65536 or 4096, "rows (batch x sequence; on the CPU 4096)")
cli:option("D", 768, "row width (n_embd)")
local opt = cli:parse(arg)
local dev, dt = timing.dev, timing.dt
local N, D = opt.N, opt.D
zr.manual_seed(0)
local td = { dtype = dt, device = dev, requires_grad = true }
local x, r = zr.randn({ N, D }, td), zr.randn({ N, D }, td)
local w, b = zr.randn({ D }, td), zr.randn({ D }, td)
local go = zr.randn({ N, D }, { dtype = dt, device = dev })

local ways = {
  { "separate", function() local h = x + r; return h, zr.layer_norm(h, w, b, 1e-5) end },
  { "fused", function() return zr.add_layer_norm(x, r, w, b, 1e-5) end },
}
local function reset() x.grad, r.grad, w.grad, b.grad = nil, nil, nil, nil end

print(("residual add + LayerNorm, %s %s, N=%d D=%d (ms)"):format(dev, dt, N, D))
print(("%-10s %10s %12s %12s"):format("", "forward", "fwd (h+y)", "bwd (h+y)"))
for _, way in ipairs(ways) do
  local f = way[2]
  local fwd = timing.call(function() f(); reset() end)
  local fw, bw = timing.fwd_bwd(function() local h, y = f(); return h + y end, go, reset)
  print(("%-10s %10.3f %12.3f %12.3f"):format(way[1], fwd, fw, bw))
end
