-- ZenFlow update_interval "auto"'s per-micro-step pass (zenflow_absdiff_sums, lua/zrun/zenflow.lua's
-- judge) at Llama-3.2-1B's shapes: every 2-D weight's sum |.grad - last| (last kept: 12 bytes an element)
-- and its selected columns' sum |gs| (topk of the columns), all in one call, against the same entries one
-- call each (the launches and workspaces the per-weight op took before). Median of 20 after 5 warm-ups,
-- synchronised around each; GB/s counts the bytes the pass must move. Without a GPU: one layer on the CPU.
--   ./zrun tests/bench/bench_zenflow_sums.lua [layers=16] [topk=0.05]
local zr = require "zrun"
local C = zr._C
local timing = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/op_timing.lua")
local cli = require("zrun.argparse").new("tests/bench/bench_zenflow_sums.lua",
  "ZenFlow update_interval auto's sums of one micro-step: one batched call vs one call per sum.")
cli:option("layers", 16, "decoder layers (Llama-3.2-1B: 16)"):option("topk", 0.05, "zenflow topk_ratio")
local opt = cli:parse(arg)
local gpu = timing.gpu
local dev, layers, vocab = timing.dev, gpu and opt.layers or 1, gpu and 128256 or 8192

-- (rows, cols) of the measured weights: the embedding, then per layer q, k, v, o, gate, up, down
local shapes = { { vocab, 2048 } }
for _ = 1, layers do
  for _, s in ipairs { { 2048, 2048 }, { 512, 2048 }, { 512, 2048 }, { 2048, 2048 }, { 8192, 2048 },
    { 8192, 2048 }, { 2048, 8192 } } do shapes[#shapes + 1] = s end
end
zr.manual_seed(0)
local list, bytes, elems = {}, 0, 0
for i, s in ipairs(shapes) do
  local n, k = s[1] * s[2], s[1] * math.floor(opt.topk * s[2])
  list[#list + 1] = { 2 * i - 1, zr.randn(n, { device = dev }), zr.randn(n, { device = dev }), true, true }
  list[#list + 1] = { 2 * i, zr.randn(k, { device = dev }) }
  bytes, elems = bytes + 12 * n + 4 * k, elems + n + k
end
local sums = zr.zeros(2 * #shapes, { device = dev })

print(("zenflow_absdiff_sums on %s: %d sums over %.3g elements (%d layers, topk %g), %.2f GB to move"):format(
  dev, #list, elems, layers, opt.topk, bytes / 1e9))
print(("%-22s %10s %10s"):format("", "ms", "GB/s"))
for _, r in ipairs {
  { "one call", function() C.zenflow_absdiff_sums(sums, list) end },
  { "one call per sum", function() for _, e in ipairs(list) do C.zenflow_absdiff_sums(sums, { e }) end end },
} do
  local ms = timing.call(r[2])
  print(("%-22s %10.3f %10.1f"):format(r[1], ms, bytes / ms / 1e6))
end
