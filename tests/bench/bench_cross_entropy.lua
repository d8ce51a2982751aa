-- Cross-entropy forward + backward at the training shapes (GPT-2 124M: 65536 tokens x 50304, the
-- padded vocabulary; Llama-3.2-1B: 4x512 and 4x2048 tokens x 128256), the plain op (the gradient
-- made in backward from the saved logits, into a new buffer) against {inplace = true} (loss and
-- gradient in one pass in the forward, written over the logits; backward hands it on), and inplace
-- with a seed other than the hint (backward rescales in place). Forward: the op, synchronised;
-- backward: the cross_entropy node alone (zr.autograd_profile); extra: the most memory the op
-- allocated beyond the logits (MiB). Medians of 20 after 5 warm-ups; on the CPU a small shape.
-- On Hopper the inplace rows run the shared-memory kernel; ZRUN_CE_SMEM=0 gives the block-per-row
-- kernel's (run both for an A/B).
--   ./zrun tests/bench/bench_cross_entropy.lua
--   ZRUN_CE_SMEM=0 ./zrun tests/bench/bench_cross_entropy.lua
local zr = require "zrun"
local C = zr._C
local ot = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/op_timing.lua")
local sync = ot.gpu and function() zr.cuda.synchronize() end or function() end
local mdev = ot.gpu and "cuda:0" or "cpu"

local shapes = ot.gpu and { { "GPT-2 B64 T1024", 65536, 50304 }, { "Llama 4x512", 2048, 128256 },
  { "Llama 4x2048", 8192, 128256 } } or { { "small (CPU)", 256, 4096 } }

local function median(t) table.sort(t); return t[math.ceil(#t / 2)] end
local function ce_backward_ms(report) -- the cross_entropy row of autograd_profile_report
  for line in report:gmatch("[^\n]+") do
    local calls, ms = line:match("^cross_entropy%s+(%d+)%s+([%d.]+)")
    if calls then return tonumber(ms) / tonumber(calls) end
  end
  error("bench_cross_entropy: no cross_entropy row in the backward profile:\n" .. report, 0)
end

-- logits = base + col (col (N, 1) a leaf: the logits are a non-leaf whose producer's backward is a
-- row sum, as cheap for both paths and keeping no logits-sized gradient of its own)
local function measure(base, col, tgt, inplace, seed)
  local fw, bw, extra = {}, {}, {}
  for i = 1, 25 do
    local logits = base + col
    sync()
    collectgarbage()
    local before = zr.memory.stats(mdev).total_current
    zr.memory.reset_peak(mdev)
    local t0 = C.now()
    local l = zr.cross_entropy(logits, tgt, { ignore_index = -100, inplace = inplace })
    sync()
    local t1 = C.now()
    logits = nil -- the caller of an inplace loss lets its logits go
    local root = seed == 1 and l or l * seed
    C.autograd_profile(1)
    root:backward()
    sync()
    C.autograd_profile(false)
    local ms = ce_backward_ms(C.autograd_profile_report())
    if i > 5 then
      fw[#fw + 1], bw[#bw + 1] = (t1 - t0) * 1e3, ms
      extra[#extra + 1] = (zr.memory.stats(mdev).total_peak - before) / 2 ^ 20
    end
    col.grad = nil
  end
  return median(fw), median(bw), median(extra)
end

if ot.gpu then print("ZRUN_CE_SMEM=" .. (os.getenv("ZRUN_CE_SMEM") or "(unset: 1)")) end
print(("%-17s %-16s %9s %9s %9s %10s"):format("cross_entropy", "path", "fwd ms", "bwd ms", "f+b ms", "extra MiB"))
for _, s in ipairs(shapes) do
  local name, N, V = s[1], s[2], s[3]
  zr.manual_seed(1)
  local base = (zr.randn({ N, V }, { dtype = ot.dt, device = ot.dev }) * 2):detach()
  local col = zr.zeros({ N, 1 }, { dtype = ot.dt, device = ot.dev, requires_grad = true })
  local tgt = (zr.rand({ N }, { device = ot.dev }) * V):to("i64")
  local plain
  for _, p in ipairs { { "plain", false, 1 }, { "inplace", true, 1 }, { "inplace, seed 2", true, 2 } } do
    local f, b, x = measure(base, col, tgt, p[2], p[3])
    plain = plain or f + b
    print(("%-17s %-16s %9.3f %9.3f %9.3f %10.1f%s"):format(name, p[1], f, b, f + b, x,
      p[2] and ("  x%.2f"):format(plain / (f + b)) or ""))
  end
  base, col, tgt = nil, nil, nil
  collectgarbage()
end
