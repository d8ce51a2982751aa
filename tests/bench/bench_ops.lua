-- Micro-benchmarks of the Lua → C path: the cost of one small op called from Lua, a small
-- matmul, and autograd overhead. Prints one table row per measurement.
local zr = require "zrun"
local C = zr._C

-- Median time per call in microseconds over `reps` runs of `iters` calls.
local function bench(fn, iters, reps)
  local times = {}
  for r = 1, reps do
    collectgarbage("collect")
    local t0 = C.now()
    for i = 1, iters do fn() end
    times[r] = (C.now() - t0) / iters * 1e6
  end
  table.sort(times)
  return times[math.ceil(reps / 2)]
end

local x = zr.randn(1)
local y = zr.randn(1)
local a = zr.randn(8, 8)
local rows = {}
rows[#rows + 1] = { "add of two 1-element tensors (new output)", bench(function() return x + y end, 20000, 5) }
rows[#rows + 1] = { "relu of a 1-element tensor", bench(function() return x:relu() end, 20000, 5) }
rows[#rows + 1] = { "shape() query", bench(function() return x:shape() end, 20000, 5) }
rows[#rows + 1] = { "view of an 8x8 tensor", bench(function() return a:view(64) end, 20000, 5) }
local w = zr.randn(1, { requires_grad = true })
rows[#rows + 1] = { "mul recording autograd (1 element)", bench(function() return w * x end, 20000, 5) }

print(("%-46s %12s"):format("op called from Lua", "µs per call"))
for _, r in ipairs(rows) do print(("%-46s %12.3f"):format(r[1], r[2])) end
