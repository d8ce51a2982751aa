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

T.test("embedding errors", function()
  local w = zr.randn(5, 3)
  T.raises(function() zr.embedding(w, ids { 1, 7 }) end, "id 7 (at flat position 2) is out of range for a table of V = 5 rows")
  T.raises(function() zr.embedding(w, ids { -1 }) end, "id -1")
  T.raises(function() zr.embedding(w, zr.tensor({ 1 })) end, "ids must be i64 or i32")
end)

T.done()
