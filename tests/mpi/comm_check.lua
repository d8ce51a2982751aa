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
test("async handles: several collectives in flight, then wait", function()
  local t = zr.full({ 1001 }, r + 1)
  local full = zr.arange(0, 5 * W, { dtype = "f32" }) + r
  local shard, g = zr.zeros(5), zr.zeros(2 * W)
  local h1 = dist.all_reduce(t, "sum", { async_op = true })
  local h2 = dist.reduce_scatter(shard, full, { async_op = true }) -- op defaults to sum
  local h3 = dist.all_gather(g, zr.full({ 2 }, r + 0.5), { async_op = true })
  h3:wait(); h1:wait(); h2:wait()
  h1:wait() -- a second wait is a no-op
  T.near(t:narrow(1, 1001, 1), { W * (W + 1) / 2 })
  local e = {}
  for i = 1, 5 do e[i] = W * (r * 5 + i - 1) + W * (W - 1) / 2 end
  T.near(shard, e)
  local ge = {}
  for k = 0, W - 1 do ge[#ge + 1] = k + 0.5; ge[#ge + 1] = k + 0.5 end
  T.near(g, ge)
  local a = zr.full({ 3 }, r + 1)
  dist.all_reduce(a, "avg", { async_op = true }):wait()
  T.near(a, { (W + 1) / 2, (W + 1) / 2, (W + 1) / 2 }, 1e-6)
end)
dist.barrier()
T.done()
