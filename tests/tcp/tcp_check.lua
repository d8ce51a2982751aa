-- Run by test_tcp_comm.sh on ranks joined over TCP: collectives at awkward sizes (not divisible by
-- the world size, larger than the sockets' buffers, empty) in f32, f64, bf16, i64 and u8, against
-- values each rank computes alone with a plain loop.
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local r, W = dist.rank(), dist.world_size()
local function test(name, fn) if r == 0 then T.test(name, fn) else fn() end end

-- element i (1-based) of rank q's tensor: small integers, exact in bf16 and f32 sums
local function v(q, i) return (q * 7 + i * 3) % 11 - 5 end
local function filled(n, q, dt)
  local t = zr.zeros(n, { dtype = dt })
  for i = 1, n do t[i] = v(q, i) end
  return t
end
local function expect(n, op)
  local e = {}
  for i = 1, n do
    local acc = v(0, i)
    for q = 1, W - 1 do
      local x = v(q, i)
      if op == "max" then acc = math.max(acc, x) elseif op == "min" then acc = math.min(acc, x) else acc = acc + x end
    end
    e[i] = op == "avg" and acc / W or acc
  end
  return e
end
local function check(t, e, what)
  local tol = t:dtype() == "bf16" and 1e-2 or 1e-5 -- bf16 rounds an average to 8 bits
  for i = 1, #e do
    if math.abs(t[i] - e[i]) > tol * math.max(1, math.abs(e[i])) then error(("%s: element %d is %s, expected %s"):format(what, i, tostring(t[i]), e[i])) end
  end
end

test("launcher and world", function()
  T.eq(dist.launcher(), "torchrun")
  T.eq(dist.local_rank(), r)
  T.eq(dist.local_size(), W)
end)
test("all_reduce sum/avg/max/min at sizes 1, 7, 13, 4099 in f32, f64, bf16, i64", function()
  for _, dt in ipairs { "f32", "f64", "bf16", "i64" } do
    for _, n in ipairs { 1, 7, 13, 4099 } do
      for _, op in ipairs { "sum", "avg", "max", "min" } do
        if not (dt == "i64" and op == "avg") then
          local t = filled(n, r, dt)
          dist.all_reduce(t, op)
          check(t, expect(n, op), ("%s %s n=%d"):format(dt, op, n))
        end
      end
    end
  end
end)
test("all_reduce of 3 M floats (larger than the sockets' buffers: both directions at once)", function()
  local n = 3000001
  local t = zr.full({ n }, r + 1)
  dist.all_reduce(t, "sum")
  T.near(t:narrow(1, 1, 1), { W * (W + 1) / 2 })
  T.near(t:narrow(1, n, 1), { W * (W + 1) / 2 })
  T.near(t:sum(), n * W * (W + 1) / 2, 1e-6)
end)
test("reduce_scatter: blocks of 1, 5 and 300001 elements, f32 and i64", function()
  for _, dt in ipairs { "f32", "i64" } do
    for _, n in ipairs { 1, 5, 300001 } do
      local full = filled(n * W, r, dt)
      local shard = zr.zeros(n, { dtype = dt })
      dist.reduce_scatter(shard, full, "sum")
      local e = expect(n * W, "sum")
      local mine = {}
      for i = 1, math.min(n, 50) do mine[i] = e[r * n + i] end
      check(shard, mine, ("%s reduce_scatter n=%d"):format(dt, n))
      check(full, (function() local o = {} for i = 1, math.min(n * W, 50) do o[i] = v(r, i) end return o end)(),
        "reduce_scatter leaves its input alone")
    end
  end
end)
test("all_gather of u8 and i64 blocks, and of empty blocks", function()
  for _, dt in ipairs { "u8", "i64" } do
    local g = zr.zeros(3 * W, { dtype = dt })
    dist.all_gather(g, zr.full({ 3 }, r + 1, { dtype = dt }))
    local e = {}
    for q = 0, W - 1 do for _ = 1, 3 do e[#e + 1] = q + 1 end end
    check(g, e, dt .. " all_gather")
  end
  dist.all_gather(zr.zeros(0), zr.zeros(0))
end)
test("broadcast of 2.5 MB (three pipelined chunks) from every root", function()
  for root = 0, W - 1 do
    local n = 655361
    local t = zr.full({ n }, r == root and root + 0.5 or -1)
    dist.broadcast(t, root)
    T.near(t:narrow(1, 1, 1), { root + 0.5 })
    T.near(t:narrow(1, n, 1), { root + 0.5 })
    T.near(t:sum(), n * (root + 0.5), 1e-6)
  end
end)
dist.barrier()
T.done()
