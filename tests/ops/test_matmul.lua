-- matmul, bmm and linear: float64 finite-difference gradient checks at awkward sizes (batched,
-- broadcast, transposed views, 1-D operands), values against naive Lua loops, error messages.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(7)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end

-- Naive product of two 2-D tensors as a flat Lua table (independent reference).
local function naive_mm(a, b)
  local m, k, n = a:size(1), a:size(2), b:size(2)
  local A, B, out = a:contiguous():flat_table(), b:contiguous():flat_table(), {}
  for i = 0, m - 1 do
    for j = 0, n - 1 do
      local s = 0
      for p = 0, k - 1 do s = s + A[i * k + p + 1] * B[p * n + j + 1] end
      out[i * n + j + 1] = s
    end
  end
  return out
end

-- ---------- matmul ----------

T.test("gradcheck matmul 2-D", function()
  T.gradcheck(function(a, b) return a:matmul(b) end, { r(3, 5), r(5, 7) })
  T.gradcheck(function(a, b) return a:matmul(b) end, { r(1, 1), r(1, 4) })
end)

T.test("gradcheck matmul batched with broadcast batch", function()
  T.gradcheck(function(a, b) return zr.matmul(a, b) end, { r(2, 1, 3, 4), r(5, 4, 2) })
  T.gradcheck(function(a, b) return zr.matmul(a, b) end, { r(3, 2, 5), r(5, 3) }) -- folded GEMM
  T.gradcheck(function(a, b) return zr.matmul(a, b) end, { r(2, 3), r(4, 3, 2) }) -- 2-D left
  T.gradcheck(function(a, b) return zr.bmm(a, b) end, { r(3, 2, 4), r(3, 4, 5) })
end)

T.test("gradcheck matmul transposed-view inputs", function()
  T.gradcheck(function(a, b) return a:transpose(1, 2):matmul(b) end, { r(5, 3), r(5, 4) })
  T.gradcheck(function(a, b) return a:matmul(b:transpose(1, 2)) end, { r(3, 5), r(4, 5) })
  T.gradcheck(function(a, b) return a:transpose(1, 2):matmul(b:transpose(1, 2)) end, { r(5, 3), r(4, 5) })
  T.gradcheck(function(a, b) return a:transpose(2, 3):matmul(b:transpose(2, 3)) end, { r(2, 5, 3), r(2, 4, 5) })
  T.gradcheck(function(a, b) return a:transpose(2, 3):matmul(b) end, { r(2, 5, 3), r(5, 4) })
end)

T.test("gradcheck matmul 1-D operands", function()
  T.gradcheck(function(a, b) return a:matmul(b) end, { r(5), r(5) })
  T.gradcheck(function(a, b) return a:matmul(b) end, { r(5), r(2, 5, 3) })
  T.gradcheck(function(a, b) return a:matmul(b) end, { r(2, 3, 5), r(5) })
end)

T.test("matmul values vs naive loops, f32 vs f64 at 67x129x31", function()
  local a64, b64 = zr.randn({ 67, 129 }, { dtype = "f64" }), zr.randn({ 129, 31 }, { dtype = "f64" })
  local c64 = a64:matmul(b64)
  T.eq(table.concat(c64:shape(), "x"), "67x31")
  T.near(c64, naive_mm(a64, b64), 1e-11, 1e-12, "f64 vs naive")
  local c32 = a64:float():matmul(b64:float())
  T.eq(c32:dtype(), "f32")
  T.near(c32, c64, 2e-4, 1e-4, "f32 vs f64")
  -- transposed views and sliced (non-unit stride) operands give the same numbers
  T.near(a64:transpose(1, 2):contiguous():transpose(1, 2):matmul(b64), c64, 1e-11)
  local wide = zr.randn({ 129, 62 }, { dtype = "f64" })
  local sl = wide:narrow(2, 5, 31) -- (129,31) with row stride 62
  T.near(a64:matmul(sl), naive_mm(a64, sl:contiguous()), 1e-11, 1e-12, "sliced")
  local ex = zr.randn({ 1, 129 }, { dtype = "f64" }):expand(4, 129) -- stride 0 rows: copied
  T.near(ex:matmul(b64), naive_mm(ex:contiguous(), b64), 1e-11, 1e-12, "expanded")
end)

T.test("matmul batched values and shapes", function()
  local a, b = zr.randn({ 3, 4, 5 }, { dtype = "f64" }), zr.randn({ 5, 6 }, { dtype = "f64" })
  local c = a:matmul(b)
  for i = 1, 3 do T.near(c[i], naive_mm(a[i], b), 1e-12) end
  local b3 = zr.randn({ 2, 1, 5, 2 }, { dtype = "f64" })
  local c3 = a:matmul(b3)
  T.eq(table.concat(c3:shape(), ","), "2,3,4,2")
  for i = 1, 2 do for j = 1, 3 do T.near(c3[i][j], naive_mm(a[j], b3[i][1]), 1e-12) end end
  local v = zr.tensor({ 1, 2, 3 }, { dtype = "f64" })
  T.near(v:matmul(v), 14)
  T.eq(#v:matmul(v):shape(), 0)
  T.near(zr.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }):matmul(v:float()), { 14, 32 })
  local z = zr.zeros(3, 0):matmul(zr.zeros(0, 4))
  T.eq(table.concat(z:shape(), ","), "3,4")
  T.near(z, { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 })
end)

T.test("matmul errors name both shapes", function()
  T.raises(function() zr.matmul(zr.randn(4, 512), zr.randn(256, 10)) end,
    "matmul: shapes (4,512) and (256,10) do not match: 512 ≠ 256")
  T.raises(function() zr.matmul(zr.randn(2, 3, 4), zr.randn(5, 4, 2)) end, "batch dims of (2,3,4) and (5,4,2) cannot be broadcast")
  T.raises(function() zr.bmm(zr.randn(2, 3, 4), zr.randn(3, 4, 2)) end, "bmm: expected (B,m,k) and (B,k,n) with the same B")
  T.raises(function() zr.matmul(zr.randn(2, 3), zr.tensor({ 1, 2, 3 }, { dtype = "i64" })) end, "floating-point")
  T.raises(function() zr.linear(zr.randn(2, 3, 5), zr.randn(4, 6)) end,
    "linear: input (2,3,5) and weight (4,6) do not match: 5 ≠ 6")
  T.raises(function() zr.linear(zr.randn(2, 5), zr.randn(4, 5), zr.randn(3)) end, "bias must have shape (4)")
end)

-- ---------- linear ----------

T.test("gradcheck linear with and without bias, 3-D input", function()
  T.gradcheck(function(x, w, b) return zr.linear(x, w, b) end, { r(2, 3, 5), r(4, 5), r(4) })
  T.gradcheck(function(x, w) return x:linear(w) end, { r(2, 3, 5), r(4, 5) })
  T.gradcheck(function(x, w, b) return zr.linear(x, w, b) end, { r(7), r(1, 7), r(1) })
  T.gradcheck(function(x, w) return zr.linear(x, w:transpose(1, 2)) end, { r(3, 5), r(5, 4) })
end)

T.test("linear values", function()
  local x = zr.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  local w = zr.tensor({ { 1, 0, -1 }, { 2, 1, 0 } })
  T.near(zr.linear(x, w, zr.tensor({ 10, 20 })), { 8, 24, 8, 33 })
  T.near(zr.linear(x, w), { -2, 4, -2, 13 })
  -- dW = gyᵀ·x summed over every leading dim; db = column sums of gy
  local xw = zr.tensor({ { { 1, 2 } }, { { 3, 4 } } }, { dtype = "f64" }) -- (2,1,2)
  local ww = zr.tensor({ { 1, 1 } }, { dtype = "f64", requires_grad = true })
  local bb = zr.tensor({ 0 }, { dtype = "f64", requires_grad = true })
  zr.linear(xw, ww, bb):sum():backward()
  T.near(ww.grad, { 4, 6 }, 1e-12)
  T.near(bb.grad, { 2 }, 1e-12)
end)

T.done()
