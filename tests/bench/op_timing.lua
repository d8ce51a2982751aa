-- Shared by the op benchmarks (bench_linear_gelu.lua, bench_qkv_rope.lua, bench_conv1d.lua): the device and dtype
-- they run in (the GPU in bf16, else the CPU in f32) and the median forward and backward time of an
-- op, in ms, over 20 runs after 5 warm-ups, synchronised around each phase (or of any call: M.call).
local zr = require "zrun"
local C = zr._C
local M = {}

M.gpu = zr.cuda.is_available()
M.dev, M.dt = M.gpu and "cuda" or "cpu", M.gpu and "bf16" or "f32"
local sync = M.gpu and function() zr.cuda.synchronize() end or function() end

local function median_ms(t) table.sort(t); return t[math.ceil(#t / 2)] * 1e3 end

-- forward() -> y; y:backward(go); then reset() (drops the leaves' .grad): medians of both phases.
function M.fwd_bwd(forward, go, reset)
  local fw, bw = {}, {}
  for i = 1, 25 do
    sync()
    local t0 = C.now()
    local y = forward()
    sync()
    local t1 = C.now()
    y:backward(go)
    sync()
    local t2 = C.now()
    reset()
    if i > 5 then fw[#fw + 1], bw[#bw + 1] = t1 - t0, t2 - t1 end
  end
  return median_ms(fw), median_ms(bw)
end

-- f(): the median of one call, synchronised around each.
function M.call(f)
  local t = {}
  for i = 1, 25 do
    sync()
    local t0 = C.now()
    f()
    sync()
    if i > 5 then t[#t + 1] = C.now() - t0 end
  end
  return median_ms(t)
end

return M
