-- GPT-2's attention block before and after zr.sdpa_packed: c_attn's product and causal attention
-- to o as (B, T, C), forward and backward, on the GPU (the CPU, smaller, when there is none).
-- Old = what gpt2.lua ran before: three products with column slices of c_attn's weight, each
-- viewed as heads, then scaled_dot_product_attention; new = one c_attn product + sdpa_packed.
--   ./zrun tests/bench/bench_gpt2_attention.lua [B=64] [T=1024] [C=768] [H=12]   (GPT-2 124M, bf16)
local zr = require "zrun"
local timing = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/op_timing.lua")
local gpu, dev, dt = timing.gpu, timing.dev, timing.dt
local cli = require("zrun.argparse").new("tests/bench/bench_gpt2_attention.lua",
  "GPT-2's c_attn + attention: three slice products + sdpa vs one product + zr.sdpa_packed, forward and backward.")
cli:option("B", gpu and 64 or 2, "micro-batch")
cli:option("T", gpu and 1024 or 128, "sequence length")
cli:option("C", 768, "n_embd")
cli:option("H", 12, "n_head")
local opt = cli:parse(arg)
local B, T, C, H = opt.B, opt.T, opt.C, opt.H
zr.manual_seed(0)
local td = { dtype = dt, device = dev, requires_grad = true }
local x = zr.randn({ B, T, C }, td)
local w = (zr.randn({ C, 3 * C }, { dtype = "f32" }) * 0.02):to(dev, dt):detach():requires_grad_(true)
local b = zr.zeros({ 3 * C }, td)
local go = zr.randn({ B, T, C }, { dtype = dt, device = dev })

local function old()
  local function heads(i)
    local y = zr.linear(x, w:narrow(2, i * C + 1, C):transpose(1, 2), b:narrow(1, i * C + 1, C))
    return y:view(B, T, H, C / H):transpose(2, 3)
  end
  return zr.scaled_dot_product_attention(heads(0), heads(1), heads(2)):transpose(2, 3):reshape(B, T, C)
end
local function new() return zr.sdpa_packed(zr.linear(x, w:transpose(1, 2), b), H) end

-- the two agree (bf16 rounding apart) before anything is timed
local d = zr.no_grad(function() return (old():float() - new():float()):abs():max():item() end)
print(("c_attn + attention, %s %s, B=%d T=%d C=%d H=%d (ms; max |old - new| = %.3g)"):format(
  dev, dt, B, T, C, H, d))
print(("%-22s %10s %10s %10s"):format("", "forward", "backward", "total"))
for _, r in ipairs { { "three slice products", old }, { "one product + packed", new } } do
  local f, bw = timing.fwd_bwd(r[2], go, function() x.grad, w.grad, b.grad = nil, nil, nil end)
  print(("%-22s %10.3f %10.3f %10.3f"):format(r[1], f, bw, f + bw))
end
