-- embedding: values with repeated ids, float64 finite-difference gradient check, a deterministic
-- and exact backward for many repeats, errors.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(7)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
local function ids(t) return zr.tensor(t, { dtype = "i64" }) end

-- ---------- embedding ----------

T.test("embedding values and repeated ids", function()
  local w = zr.tensor({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, { dtype = "f64", requires_grad = true })
  local e = zr.embedding(w, ids { { 2, 0 }, { 2, 2 } })
  T.eq(table.concat(e:shape(), ","), "2,2,2")
  T.near(e, { 5, 6, 1, 2, 5, 6, 5, 6 })
  e:sum():backward()
  T.near(w.grad, { 1, 1, 0, 0, 3, 3 }) -- row 2 used three times, row 1 never
  T.near(zr.embedding(ids { 1 }, w:detach()), { 3, 4 }) -- torch's (ids, weight) order works too
  T.near(w:embedding(zr.tensor({ 1 }, { dtype = "i32" })), { 3, 4 })
end)

T.test("gradcheck embedding with repeated ids", function()
  local id = ids { { 0, 4, 4 }, { 2, 4, 0 } }
  T.gradcheck(function(w) return zr.embedding(w, id) end, { r(5, 3) })
  T.gradcheck(function(w) return zr.embedding(w, id) * zr.embedding(w, id) end, { r(5, 3) })
end)

T.test("embedding backward is deterministic and exact for many repeats", function()
  local n, d = 5000, 67
  local w = zr.zeros({ 3, d }, { requires_grad = true })
  local t = {}
  for i = 1, n do t[i] = i % 3 end
  zr.embedding(w, ids(t)):sum():backward()
  local g = w.grad:flat_table()
  T.near({ g[1], g[d + 1], g[2 * d + 1] }, { 1666, 1667, 1667 }) -- ids 0, 1, 2 counts
end)

-- A table that has a gradient already (a second backward; the engine's .grad at stages 0-1, which
-- zero_grad leaves stale) gets the rows added straight into it: a second backward doubles it, and
-- the engine's steps take each step's gradient alone, as plain autograd with fresh gradients does.
T.test("embedding backward adds into an existing gradient", function()
  local w = zr.randn({ 4, 3 }, { requires_grad = true })
  local id = ids { 3, 1, 3, 3 }
  zr.embedding(w, id):sum():backward()
  local once = w.grad:flat_table()
  zr.embedding(w, id):sum():backward()
  local twice = w.grad:flat_table()
  T.near(once, { 0, 0, 0, 1, 1, 1, 0, 0, 0, 3, 3, 3 })
  for i = 1, #once do T.near(twice[i], 2 * once[i]) end
end)

for _, stage in ipairs { 0, 2, 3 } do
  T.test(("embedding in the engine at stage %d: each step's gradient alone (SGD against plain autograd)"):format(stage),
    function()
      local function model()
        zr.manual_seed(9)
        return zr.nn.Sequential(zr.nn.Embedding(7, 5), zr.nn.Linear(5, 2))
      end
      local m, ref = model(), model()
      local e = zr.initialize({ model = m, config = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
        gradient_clipping = 0, zero_allow_untested_optimizer = stage > 0, optimizer = { type = "SGD", params = { lr = 0.1 } },
        zero_optimization = { stage = stage } } })
      local rp = ref:parameters()
      for t = 1, 4 do
        local x = ids { { t % 7, 2, 2 }, { 5, t % 7, 0 } } -- repeated ids, rows that change from step to step
        local out = e(x)
        e:backward((out * out):sum())
        e:step()
        for _, p in ipairs(rp) do p.grad = nil end
        local r = ref(x)
        ;(r * r):sum():backward()
        for _, p in ipairs(rp) do p:copy_(p - p.grad * 0.1) end
      end
      for i, p in ipairs(m:parameters()) do T.near(p, rp[i]:flat_table(), 1e-6, 1e-6, "param " .. i) end
    end)
end

T.test("embedding errors", function()
  local w = zr.randn(5, 3)
  T.raises(function() zr.embedding(w, ids { 1, 7 }) end, "id 7 (at flat position 2) is out of range for a table of V = 5 rows")
  T.raises(function() zr.embedding(w, ids { -1 }) end, "id -1")
  T.raises(function() zr.embedding(w, zr.tensor({ 1 })) end, "ids must be i64 or i32")
end)

T.done()
