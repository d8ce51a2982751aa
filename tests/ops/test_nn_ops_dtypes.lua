-- Across matmul, linear, softmax, cross_entropy and embedding: empty inputs, and bf16/f16 inputs
-- whose outputs and gradients keep their dtype (values against the f32 ops).
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(7)

local function ids(t) return zr.tensor(t, { dtype = "i64" }) end

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
