-- The q/k/v side of one Llama attention block, before and after zr.qkv_rope: from the packed
-- (B, T, (H + 2 KV)·D) product to q, k, v, causal attention and o as (B, T, H·D), forward and
-- backward, on the GPU (the CPU when there is none). Unfused = what llama.lua ran before: split,
-- q/k :contiguous(), view, transpose, rope; qkv_rope = zr.qkv_rope then sdpa; rope_sdpa = the one
-- op zr.qkv_rope_sdpa (its backward: no bf16 dq/dk/dv, one launch less). Median of 20 after 5 warm-ups.
-- rows= picks the rows and their order (a name may repeat: does a row's time depend on what ran before it?).
--   ./zrun tests/bench/bench_qkv_rope.lua [B=4] [T=512] [rows=unfused,qkv_rope,rope_sdpa]
--   (Llama-3.2-1B heads: 32/8, D 64, bf16)
local zr = require "zrun"
local cli = require("zrun.argparse").new("tests/bench/bench_qkv_rope.lua",
  "Llama's q/k/v split + rope + attention: unfused, zr.qkv_rope + sdpa, zr.qkv_rope_sdpa; forward and backward.")
cli:option("B", 4, "micro-batch")
cli:option("T", 512, "sequence length")
cli:option("rows", "unfused,qkv_rope,rope_sdpa", "rows to time, in this order (comma-separated, repeats allowed)")
local opt = cli:parse(arg)
local timing = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/op_timing.lua")
local gpu, dev, dt = timing.gpu, timing.dev, timing.dt
local B, T, H, KV, D = opt.B, opt.T, 32, 8, 64
zr.manual_seed(0)
local cos, sin = zr.rope_tables(T, D)
cos, sin = cos:to(dt):to(dev, "f32"), sin:to(dt):to(dev, "f32")
local x = zr.randn({ B, T, (H + 2 * KV) * D }, { dtype = dt, device = dev, requires_grad = true })
local go = zr.randn({ B, T, H * D }, { dtype = dt, device = dev })

local function unfused(qkv)
  local q, k, v = unpack(zr.split(qkv, { H * D, KV * D, KV * D }, 3))
  if gpu then q, k = q:contiguous(), k:contiguous() end
  q = q:view(B, T, H, D):transpose(2, 3):rope(cos, sin)
  k = k:view(B, T, KV, D):transpose(2, 3):rope(cos, sin)
  return q, k, v:view(B, T, KV, D):transpose(2, 3)
end
local function fused(qkv) return zr.qkv_rope(qkv, H, KV, cos, sin) end
local function sdpa_of(f)
  return function(qkv) return zr.scaled_dot_product_attention(f(qkv)):transpose(2, 3):reshape(B, T, H * D) end
end
local function rope_sdpa(qkv) return zr.qkv_rope_sdpa(qkv, H, KV, cos, sin) end

local function time(f)
  -- x * 1: a producer, so the gradient goes into its buffer as linear_multi's would
  return timing.fwd_bwd(function() return f(x * 1) end, go, function() x.grad = nil end)
end

local ROWS = { unfused = sdpa_of(unfused), qkv_rope = sdpa_of(fused), rope_sdpa = rope_sdpa }
local order = {}
for name in tostring(opt.rows):gmatch("[^,]+") do
  if not ROWS[name] then
    io.stderr:write(("bench_qkv_rope: rows: unknown row %q (unfused, qkv_rope, rope_sdpa)\n"):format(name))
    os.exit(2)
  end
  order[#order + 1] = name
end
if #order == 0 then io.stderr:write("bench_qkv_rope: rows is empty\n"); os.exit(2) end
print(("q/k/v + attention, %s %s, B=%d T=%d H=%d KV=%d D=%d (ms, includes x*1 and attention)"):format(
  dev, dt, B, T, H, KV, D))
print(("%-10s %10s %10s %10s"):format("", "forward", "backward", "total"))
for _, name in ipairs(order) do
  local f, b = time(ROWS[name])
  print(("%-10s %10.3f %10.3f %10.3f"):format(name, f, b, f + b))
end
