-- Run under mpirun: checks every collective against values each rank can compute alone.
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local r, W = dist.rank(), dist.world_size()
local function test(name, fn) if r == 0 then T.test(name, fn) else fn() end end

test("world", function() assert(W > 1, "expected several ranks, got " .. W) end)
test("all_reduce sum/avg/max", function()
  for _, dt in ipairs { "f32", "f64", "bf16" } do
    local t = zr.full({ 5 }, r + 1, { dtype = dt })
    dist.all_reduce(t, "sum")
    T.near(t, { W * (W + 1) / 2, W * (W + 1) / 2, W * (W + 1) / 2, W * (W + 1) / 2, W * (W + 1) / 2 })
    local a = zr.full({ 3 }, r + 1, { dtype = dt })
    dist.all_reduce(a, "avg")
    T.near(a, { (W + 1) / 2, (W + 1) / 2, (W + 1) / 2 }, 1e-6)
    local m = zr.full({ 2 }, r, { dtype = dt })
    dist.all_reduce(m, "max")
    T.near(m, { W - 1, W - 1 })
  end
end)
test("reduce_scatter and all_gather", function()
  local full = zr.arange(0, 4 * W, { dtype = "f32" }) + r  -- element i on rank r = i + r
  local shard = zr.zeros(4)
  dist.reduce_scatter(shard, full, "sum")
  local expect = {}
  local sr = W * (W - 1) / 2
  for i = 1, 4 do expect[i] = W * (r * 4 + i - 1) + sr end
  T.near(shard, expect)
  local g = zr.zeros(3 * W)
  dist.all_gather(g, zr.full({ 3 }, r))
  local e = {}
  for k = 0, W - 1 do for _ = 1, 3 do e[#e + 1] = k end end
  T.near(g, e)
  T.raises(function() dist.all_gather(zr.zeros(5), zr.zeros(3)) end, "expected world_size")
end)
test("broadcast", function()
  local t = zr.full({ 4 }, r * 10)
  dist.broadcast(t, W - 1)
  T.near(t, { (W - 1) * 10, (W - 1) * 10, (W - 1) * 10, (W - 1) * 10 })
end)
dist.barrier()
T.done()
