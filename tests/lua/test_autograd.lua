-- Core autograd and the view ops: float64 finite-difference checks at awkward sizes, gradient
-- accumulation and leaf hooks, no_grad, dtypes and casts, random numbers, indexing, error
-- messages. (Elementwise and reduction ops: tests/ops/.)
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(1)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end

T.test("gradcheck views", function()
  local x = r(2, 3, 5)
  T.gradcheck(function(a) return a:view(6, 5) end, { x })
  T.gradcheck(function(a) return a:transpose(1, 3) * 1 end, { x })
  T.gradcheck(function(a) return a:permute(3, 1, 2):reshape(-1) end, { x })
  T.gradcheck(function(a) return a:narrow(3, 2, 3) end, { x })
  T.gradcheck(function(a) return a:select(2, 3) end, { x })
  T.gradcheck(function(a) return a[2] end, { x })
  T.gradcheck(function(a) return a:unsqueeze(2):expand(2, 4, 3, 5) end, { x })
  T.gradcheck(function(a) return a:transpose(1, 2):contiguous():view(3, 10) end, { x })
end)

T.test("view errors and reshape", function()
  local x = zr.randn(4, 6)
  T.raises(function() x:transpose(1, 2):view(24) end, "reshape")
  T.eq(x:transpose(1, 2):reshape(24):numel(), 24)
  T.raises(function() x:view(5, 5) end, "invalid for input of size 24")
  T.raises(function() x:sum(3) end, "out of range")
  T.raises(function() x:add(zr.randn(5)) end, "cannot be broadcast")
end)

T.test("grad accumulates and hook order", function()
  local w = r(3)
  local y = (w * w):sum() + (w * 2):sum()
  y:backward()
  local expect = {}
  for i = 1, 3 do expect[i] = 2 * w:get_flat(i) + 2 end
  T.near(w.grad, expect, 1e-12)
  local y2 = w:sum()
  y2:backward()
  for i = 1, 3 do expect[i] = expect[i] + 1 end
  T.near(w.grad, expect, 1e-12)
end)

-- A fresh leaf gradient is the incoming one itself when nothing else holds it (no copy: one
-- allocation fewer, counted in grads), and a copy when something does: the same gradient handed to
-- two leaves, or a gradient the caller passed in.
T.test("fresh leaf gradient taken without a copy, never when shared", function()
  local w = zr.randn(1000, { requires_grad = true })
  local y = (w * 3):sum()
  -- earlier tests' gradients, freed by a collection during backward, would shrink the difference
  local before, after = T.without_gc(function()
    local b = zr.memory.stats("cpu")
    y:backward()
    return b, zr.memory.stats("cpu")
  end)
  T.near(w.grad, zr.full({ 1000 }, 3), 0)
  T.eq(after.grads.current - before.grads.current, 4000) -- the gradient moved into grads
  local y2 = (w * 3):sum()
  local b2 = zr.memory.stats("cpu").n_allocs
  w.grad = nil
  y2:backward() -- the seed, sum's expanded gradient, mul's product; a copy into a new .grad: a fourth
  T.eq(zr.memory.stats("cpu").n_allocs - b2, 3)
  local a, b = zr.randn(4, { requires_grad = true }), zr.randn(4, { requires_grad = true })
  for _ = 1, 2 do ((a + b) * 1):sum():backward() end -- add hands both leaves one tensor
  T.near(a.grad, { 2, 2, 2, 2 }, 0)
  T.near(b.grad, { 2, 2, 2, 2 }, 0)
  local x, g = zr.randn(3, { requires_grad = true }), zr.ones(3)
  x:backward(g)
  g:fill_(5)
  T.near(x.grad, { 1, 1, 1 }, 0)
end)

-- The per-op profile charges a forward op the time since the previous one; a mark between them
-- takes the host work done there (the engine's garbage collection) under its own name.
T.test("profile mark takes the time before it", function()
  local C = zr._C
  local x = zr.randn(8, { requires_grad = true })
  local function spin(s) local t = C.now(); while C.now() - t < s do end end
  C.autograd_profile(true)
  local y = x * 2
  spin(0.03)
  C.autograd_profile_mark("host work", "cpu")
  y = y * 3
  C.autograd_profile(false)
  local rep = C.autograd_profile_report()
  local mark = tonumber(rep:match("host work%s+1%s+([%d.]+)"))
  local op = tonumber(rep:match("fwd affine%s+%d+%s+([%d.]+)"))
  assert(mark and mark >= 25, "the mark should hold the 30 ms spin:\n" .. rep)
  assert(op and op < 25, "the next op should not:\n" .. rep)
end)

T.test("no_grad and graph freed", function()
  local x = r(3)
  local y = zr.no_grad(function() return x * 2 end)
  T.eq(y.requires_grad, false)
  local z = (x * x):sum()
  z:backward()
  T.raises(function() z:backward() end, "already freed")
end)

T.test("dtypes and casts", function()
  local x = zr.tensor({ 1.5, -2.25, 3 })
  T.near(x:to("bf16"):to("f32"), { 1.5, -2.25, 3 })
  T.near(x:to("f16"), { 1.5, -2.25, 3 })
  T.near(x:to("i64"), { 1, -2, 3 })
  T.eq(x:bfloat16():dtype(), "bf16")
  local b = zr.randn(4, 5, { dtype = "bf16" })
  local s = (b * b):sum()
  T.eq(s:dtype(), "bf16")
  T.near(s:item(), (b:float() * b:float()):sum():item(), 0.1, 0.02)
end)

T.test("random is seeded and well distributed", function()
  zr.manual_seed(42)
  local a = zr.randn(10000)
  zr.manual_seed(42)
  local b = zr.randn(10000)
  T.near(a, b, 0)
  local m = a:mean():item()
  local v = (a * a):mean():item() - m * m
  assert(math.abs(m) < 0.05 and math.abs(v - 1) < 0.05, ("mean %g var %g"):format(m, v))
  local u = zr.rand(10000)
  assert(u:max():item() < 1 and (u * -1):max():item() <= 0)
  T.near(u:mean(), 0.5, 0.02)
end)

T.test("indexing and tables", function()
  local x = zr.tensor({ { 1, 2 }, { 3, 4 } })
  T.eq(x[2][1], 3)
  x[1] = 7
  T.near(x, { 7, 7, 3, 4 })
  T.eq(#x:tolist(), 2)
  T.raises(function() return x[3] end, "out of range")
  T.raises(function() return x:sum(0) end, "1-based")
end)

T.test("t.requires_grad = v sets the flag both ways (as requires_grad_(v))", function()
  local t = zr.zeros({ 2 })
  t.requires_grad = true
  T.eq(t.requires_grad, true, "after = true")
  t.requires_grad = false
  T.eq(t.requires_grad, false, "after = false")
  t.requires_grad = 1 -- Lua truthiness, as requires_grad_
  T.eq(t.requires_grad, true, "after = 1")
  T.raises(function() zr.zeros({ 2 }, { dtype = "i64" }).requires_grad = true end, "floating-point tensors can require grad")
end)

T.done()
