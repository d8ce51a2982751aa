-- Sliding-window attention (the segments zr.sdpa_window_segments builds) against full causal attention:
-- forward and backward of scaled_dot_product_attention, causal GQA, on the GPU in bf16 (the CPU in f32,
-- smaller, when there is none). The flash kernels skip the key tiles before a query tile's window, so the
-- time should fall with the window (the segments' per-element mask is the rest).
--   ./zrun tests/bench/bench_attention_window.lua [B=1] [T=8192] [H=32] [KV=8] [D=64] [windows=4096,1024,256]
local zr = require "zrun"
local timing = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/op_timing.lua")
local gpu, dev, dt = timing.gpu, timing.dev, timing.dt
local cli = require("zrun.argparse").new("tests/bench/bench_attention_window.lua",
  "Causal attention with sliding windows (segments) vs full causal attention, forward and backward.")
cli:option("B", 1, "batch")
cli:option("T", gpu and 8192 or 512, "sequence length")
cli:option("H", gpu and 32 or 8, "query heads")
cli:option("KV", gpu and 8 or 2, "key/value heads")
cli:option("D", 64, "head_dim")
cli:option("windows", gpu and "4096,1024,256" or "256,64", "sliding windows, comma-separated")
local opt = cli:parse(arg)
local B, T, H, KV, D = opt.B, opt.T, opt.H, opt.KV, opt.D
zr.manual_seed(0)
local td = { dtype = dt, device = dev, requires_grad = true }
local q, k, v = zr.randn({ B, H, T, D }, td), zr.randn({ B, KV, T, D }, td), zr.randn({ B, KV, T, D }, td)
local go = zr.randn({ B, H, T, D }, { dtype = dt, device = dev })
local function reset() q.grad, k.grad, v.grad = nil, nil, nil end
print(("attention %s %s B=%d T=%d H=%d/%d D=%d (ms)"):format(dev, dt, B, T, H, KV, D))
print(("%-16s %10s %10s %10s %8s"):format("", "forward", "backward", "total", "x full"))
local full
local rows = { { "full causal" } }
for w in tostring(opt.windows):gmatch("%d+") do rows[#rows + 1] = { "window " .. w, tonumber(w) } end
for _, r in ipairs(rows) do
  local seg = r[2] and zr.sdpa_window_segments(B, T, r[2]):to(dev) or nil
  local o = seg and { segments = seg } or nil
  local f, b = timing.fwd_bwd(function() return zr.scaled_dot_product_attention(q, k, v, o) end, go, reset)
  full = full or f + b
  print(("%-16s %10.3f %10.3f %10.3f %8.2f"):format(r[1], f, b, f + b, full / (f + b)))
end
