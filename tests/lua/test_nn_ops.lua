-- matmul, bmm, linear, softmax, log_softmax, cross_entropy and embedding: float64
-- finite-difference gradient checks at awkward sizes, values against hand-computed numbers and
-- naive Lua loops, error messages, and bf16 inputs.
local zr = require "zrun"
local T = zr.testing
local exp, log = math.exp, math.log
zr.manual_seed(7)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
local function ids(t) return zr.tensor(t, { dtype = "i64" }) end

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

-- ---------- softmax ----------

T.test("gradcheck softmax / log_softmax on dims 1 and -1", function()
  for _, d in ipairs { 1, -1, 2 } do
    T.gradcheck(function(x) return x:softmax(d) end, { r(3, 4, 5) })
    T.gradcheck(function(x) return x:log_softmax(d) end, { r(3, 4, 5) })
  end
  T.gradcheck(function(x) return zr.softmax(x) end, { r(7) })
end)

T.test("softmax values and stability", function()
  local x = zr.tensor({ { 1, 2, 3 }, { 1000, 1000, 1000 } }, { dtype = "f64" })
  local z = exp(1) + exp(2) + exp(3)
  T.near(x:softmax(), { exp(1) / z, exp(2) / z, exp(3) / z, 1 / 3, 1 / 3, 1 / 3 }, 1e-15)
  T.near(x:log_softmax(-1), { 1 - log(z), 2 - log(z), 3 - log(z), -log(3), -log(3), -log(3) }, 1e-12)
  local c = x:softmax(1) -- along columns: [1, 1000] per column
  T.near(c, { exp(-999), exp(-998), exp(-997), 1, 1, 1 }, 1e-15)
  local big = zr.tensor({ 1e4, 0, -1e4 }):softmax()
  T.near(big, { 1, 0, 0 })
  T.raises(function() x:softmax(3) end, "out of range")
end)

-- ---------- cross-entropy ----------

-- Hand-computed: logits {{1,2,3},{1,3,0}}, targets {2, 0}.
local L2x3 = { { 1, 2, 3 }, { 1, 3, 0 } }
local lse1 = log(exp(1) + exp(2) + exp(3))
local lse2 = log(exp(1) + exp(3) + exp(0))
local ce1, ce2 = lse1 - 3, lse2 - 1

T.test("cross_entropy values (2x3 by hand)", function()
  local x = zr.tensor(L2x3, { dtype = "f64" })
  T.near(zr.cross_entropy(x, ids { 2, 0 }), (ce1 + ce2) / 2, 1e-14)
  T.near(zr.cross_entropy(x, ids { 2, 0 }, { reduction = "sum" }), ce1 + ce2, 1e-14)
  T.near(zr.cross_entropy(x, ids { 2, 0 }, { reduction = "none" }), { ce1, ce2 }, 1e-14)
  T.near(zr.cross_entropy(x, zr.tensor({ 2, 0 }, { dtype = "i32" })), (ce1 + ce2) / 2, 1e-14)
  -- ignore_index: the mean is over the remaining targets only
  T.near(zr.cross_entropy(x, ids { 2, -100 }), ce1, 1e-14)
  T.near(zr.cross_entropy(x, ids { 5, 0 }, 5), ce2, 1e-14)
  T.near(zr.cross_entropy(x, ids { 2, -100 }, { reduction = "none" }), { ce1, 0 }, 1e-14)
  -- label smoothing eps: (1-eps)*nll + eps * mean_j(lse - x_j)
  local eps = 0.1
  local s1 = (1 - eps) * ce1 + eps * (3 * lse1 - 6) / 3
  local s2 = (1 - eps) * ce2 + eps * (3 * lse2 - 4) / 3
  T.near(zr.cross_entropy(x, ids { 2, 0 }, { label_smoothing = eps }), (s1 + s2) / 2, 1e-14)
  -- f32 logits agree
  T.near(zr.cross_entropy(x:float(), ids { 2, 0 }), (ce1 + ce2) / 2, 1e-6)
  -- gradient of the mean: (softmax - onehot) / 2 on both rows
  local xg = zr.tensor(L2x3, { dtype = "f64", requires_grad = true })
  zr.cross_entropy(xg, ids { 2, -100 }):backward()
  local z = exp(1) + exp(2) + exp(3)
  T.near(xg.grad, { exp(1) / z, exp(2) / z, exp(3) / z - 1, 0, 0, 0 }, 1e-14)
end)

T.test("cross_entropy with every target ignored is nan (0/0, like torch)", function()
  local x = zr.tensor(L2x3, { dtype = "f64", requires_grad = true })
  local l = zr.cross_entropy(x, ids { -100, -100 })
  local v = l:item()
  assert(v ~= v, "expected nan, got " .. tostring(v))
  T.near(zr.cross_entropy(x, ids { -100, -100 }, { reduction = "sum" }), 0)
  l:backward()
  T.near(x.grad, { 0, 0, 0, 0, 0, 0 })
end)

T.test("gradcheck cross_entropy (ignore_index, reductions, smoothing, 3-D logits)", function()
  local tg = ids { 3, -100, 0, 4, 1, -100, 2 }
  T.gradcheck(function(x) return zr.cross_entropy(x, tg) end, { r(7, 5) })
  T.gradcheck(function(x) return zr.cross_entropy(x, tg, { reduction = "sum" }) end, { r(7, 5) })
  T.gradcheck(function(x) return zr.cross_entropy(x, tg, { reduction = "none" }) end, { r(7, 5) })
  T.gradcheck(function(x) return zr.cross_entropy(x, tg, { label_smoothing = 0.2 }) end, { r(7, 5) })
  local t3 = ids { { 0, 2, -100 }, { 1, 1, 3 } }
  T.gradcheck(function(x) return zr.cross_entropy(x, t3) end, { r(2, 3, 4) })
  T.gradcheck(function(x) return x:cross_entropy(t3, -100, "none", 0.05) end, { r(2, 3, 4) })
end)

T.test("cross_entropy 3-D logits equal the flattened 2-D call", function()
  local x = zr.randn({ 2, 3, 11 }, { dtype = "f64" })
  local t = ids { { 0, 10, 5 }, { -100, 3, 7 } }
  T.near(zr.cross_entropy(x, t), zr.cross_entropy(x:view(6, 11), t:view(6)), 1e-14)
  T.eq(table.concat(zr.cross_entropy(x, t, { reduction = "none" }):shape(), ","), "2,3")
end)

T.test("cross_entropy errors", function()
  local x = zr.randn(2, 3)
  T.raises(function() zr.cross_entropy(x, ids { 3, 0 }) end, "target 3 (at flat position 1) is out of range for 3 classes")
  T.raises(function() zr.cross_entropy(x, ids { 0, -1 }) end, "target -1")
  T.raises(function() zr.cross_entropy(x, ids { 0, 1, 2 }) end, "logits (2,3) and targets (3) do not match")
  T.raises(function() zr.cross_entropy(x, zr.tensor({ 0, 1 })) end, "targets must be i64 or i32")
  T.raises(function() zr.cross_entropy(x, ids { 0, 1 }, { reduction = "avg" }) end, "reduction must be")
end)

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

T.test("empty inputs", function()
  local x, w = zr.randn({ 0, 3 }, { requires_grad = true }), zr.randn({ 4, 3 }, { requires_grad = true })
  local b = zr.randn({ 4 }, { requires_grad = true })
  local y = zr.linear(x, w, b)
  T.eq(table.concat(y:shape(), ","), "0,4")
  y:sum():backward()
  T.near(w.grad, zr.zeros(4, 3)); T.near(b.grad, { 0, 0, 0, 0 })
  T.near(zr.linear(zr.randn(2, 0), zr.randn(3, 0), zr.ones(3)), { 1, 1, 1, 1, 1, 1 }) -- bias only
  T.eq(zr.randn(2, 0):softmax():numel(), 0)
  local l = zr.cross_entropy(zr.randn(0, 5), zr.zeros({ 0 }, { dtype = "i64" })):item()
  assert(l ~= l, "mean over no targets should be nan")
  T.eq(table.concat(zr.embedding(zr.randn(5, 3), zr.zeros({ 2, 0 }, { dtype = "i64" })):shape(), ","), "2,0,3")
end)

-- ---------- bf16 / f16 ----------

T.test("bf16 and f16 inputs run, outputs and grads keep their dtypes", function()
  local a32, b32 = zr.randn(17, 33), zr.randn(33, 9)
  for _, dt in ipairs { "bf16", "f16" } do
    local a, b = a32:to(dt), b32:to(dt)
    local c = a:matmul(b)
    T.eq(c:dtype(), dt)
    T.near(c:float(), a:float():matmul(b:float()), 0.1, 0.02, dt .. " matmul")
    local x = zr.randn({ 2, 3, 33 }, { dtype = dt }):requires_grad_()
    local w = b32:transpose(1, 2):contiguous():to(dt):requires_grad_()
    local bias = zr.randn({ 9 }, { dtype = dt }):requires_grad_()
    local y = zr.linear(x, w, bias)
    T.eq(y:dtype(), dt)
    T.near(y:float(), zr.linear(x:float(), w:float(), bias:float()), 0.1, 0.02, dt .. " linear")
    y:sum():backward()
    T.eq(x.grad:dtype(), dt); T.eq(w.grad:dtype(), dt); T.eq(bias.grad:dtype(), dt)
    T.near(bias.grad, { 6, 6, 6, 6, 6, 6, 6, 6, 6 })
    local s = c:softmax()
    T.eq(s:dtype(), dt)
    T.near(s:float(), c:float():softmax(), 0.01)
    -- the loss is f32, as Hugging Face's (cross-entropy on logits.float()): not rounded to 16 bits
    local cl = c:detach():requires_grad_()
    local l = zr.cross_entropy(cl, ids { 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7 })
    T.eq(l:dtype(), "f32")
    T.near(l:item(), zr.cross_entropy(c:float(), ids { 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7 }):item(), 1e-6, 1e-6)
    l:backward()
    T.eq(cl.grad:dtype(), dt)
    local e = zr.embedding(a, ids { 3, 3, 16 })
    T.eq(e:dtype(), dt)
    T.near(e:float(), zr.embedding(a:float(), ids { 3, 3, 16 }), 0)
  end
end)

T.done()
