-- CUDA backend vs the CPU reference, on a GPU machine: `./zrun tests/cuda/test_cuda.lua`.
-- Every op, forward and backward, at awkward sizes (1, primes, 1000003, T not a tile multiple),
-- f32 within ~1e-5 relative and bf16/f16 within ~1e-2; same-seed random numbers on both devices;
-- optimizers, the tiny Llama golden file (f32 and bf16), ZeRO stages 0-3 vs the CPU run;
-- errors for mixed devices and out-of-memory. Prints SKIP without a GPU.
local zr = require "zrun"
local T = require "zrun.testing"

if not zr.cuda.is_available() then
  T.skip("cuda", "no CUDA device (" .. zr.cuda.unavailable_reason() .. ")")
  return
end

local floor, abs, max = math.floor, math.abs, math.max
local unpack = table.unpack or unpack -- LuaJIT: the global
local SIZES = { 1, 7, 127, 1000003 }
local TOL = { f32 = { 1e-5, 1e-5 }, f64 = { 1e-12, 1e-12 }, bf16 = { 1e-2, 1e-2 }, f16 = { 4e-3, 4e-3 } }

-- |a - b| <= atol * scale + rtol * |b|, scale = max |b| (so values near zero are judged against
-- the tensor's magnitude, not their own), with the first offending element in the message.
-- floor: the least scale (for gradients that are 0 up to rounding, e.g. rms_norm with D = 1 or
-- attention's dq at T = 1, whose values are cancellation noise of O(1) terms).
local function close(got, want, dtype, what, slack, floor)
  local tol = TOL[dtype] or TOL.f32
  slack = slack or 1
  local g, w = T.flat(got), T.flat(want)
  if #g ~= #w then error(("%s: %d vs %d elements"):format(what, #g, #w), 2) end
  local scale = 0
  for i = 1, #w do local a = abs(w[i]); if a == a and a ~= math.huge and a > scale then scale = a end end
  scale = max(scale, floor or 1e-30)
  for i = 1, #g do
    local a, b = g[i], w[i]
    local ok = (a == b) or (a ~= a and b ~= b) or abs(a - b) <= slack * (tol[1] * scale + tol[2] * abs(b))
    if not ok then
      error(("%s (%s): element %d: cuda %.9g vs cpu %.9g (diff %.3g, scale %.3g)"):format(
        what, dtype, i, a, b, abs(a - b), scale), 2)
    end
  end
end

local function randn(shape, dtype) return zr.randn(shape, { dtype = dtype or "f32" }) end
-- The same values on both devices (the GPU copy is made from the CPU tensor, exactly).
local function pair(cpu) return cpu, cpu:cuda() end

T.test("device basics and round trips for every dtype", function()
  for _, dt in ipairs { "f32", "bf16", "f16", "f64", "i32", "i64", "u8" } do
    for _, n in ipairs(SIZES) do
      local c = (zr.rand({ n }) * 200 - 100):to(dt)
      local g = c:cuda()
      T.eq(g:device(), "cuda:0", "device")
      T.eq(g:dtype(), dt, "dtype")
      local back = g:cpu()
      T.eq(back:device(), "cpu")
      close(back, c, "f64", "round trip " .. dt .. " n=" .. n)
    end
  end
end)

T.test("casts on the device match the CPU casts (all pairs, strided, broadcast)", function()
  local dts = { "f32", "bf16", "f16", "f64", "i32", "i64", "u8" }
  local src = zr.rand({ 127, 9 }) * 250 -- in range for every dtype (u8 included): no UB casts
  for _, s in ipairs(dts) do
    local cs = src:to(s)
    local gs = cs:cuda()
    for _, d in ipairs(dts) do
      close(gs:to(d):cpu(), cs:to(d), "f64", ("cast %s->%s"):format(s, d))
      -- strided source (transpose) into a contiguous destination, with a cast
      close(gs:transpose(1, 2):contiguous():to(d):cpu(), cs:transpose(1, 2):contiguous():to(d), "f64",
        ("transposed cast %s->%s"):format(s, d))
    end
  end
  -- broadcast copy (expand) and copy into a strided view
  local row = randn({ 1, 13 })
  local g = zr.zeros({ 7, 13 }, { device = "cuda" })
  g:copy_(row:cuda():expand(7, 13))
  close(g:cpu(), row:expand(7, 13):contiguous(), "f32", "expand copy")
  local big = zr.zeros({ 11, 17 }, { device = "cuda", dtype = "bf16" })
  local part = big:narrow(2, 3, 5)
  local src2 = randn({ 11, 5 })
  part:copy_(src2:cuda())
  close(big:cpu():narrow(2, 3, 5), src2:to("bf16"), "f64", "copy into narrowed view")
  close(big:cpu():narrow(2, 1, 2), zr.zeros({ 11, 2 }), "f64", "untouched columns")
  -- numbers too large for f16 become inf on both sides; i64 beyond 2^31 survive
  local huge = zr.tensor({ 1e6, -7e4, 3, 65504 })
  close(huge:cuda():to("f16"):cpu(), huge:to("f16"), "f64", "f16 overflow")
  local l = zr.tensor({ 3e9, -5e9, 1 }, { dtype = "i64" })
  close(l:cuda():to("f64"):cpu(), l:to("f64"), "f64", "i64 > 2^31")
end)

T.test("transposing copies (tiled path), with and without a cast", function()
  for _, dt in ipairs { "f32", "bf16", "i64", "u8" } do
    local x = (zr.rand({ 3, 70, 45 }) * 100):to(dt)
    local g = x:cuda()
    close(g:permute(1, 3, 2):contiguous():cpu(), x:permute(1, 3, 2):contiguous(), "f64", "3-D transpose " .. dt)
    close(g:permute(3, 2, 1):contiguous():cpu(), x:permute(3, 2, 1):contiguous(), "f64", "permute 3,2,1 " .. dt)
    close(g:select(1, 2):transpose(1, 2):to("f32"):cpu(), x:select(1, 2):transpose(1, 2):to("f32"), "f64",
      "2-D transpose with cast " .. dt)
  end
end)

T.test("permuting copies with a contiguous last dim (row path), with and without a cast", function()
  for _, dt in ipairs { "f32", "bf16", "f16", "i64" } do
    for _, sh in ipairs { { 2, 3, 5, 64 }, { 3, 7, 11, 16 }, { 1, 4, 9, 24 }, { 2, 2, 3, 10 } } do
      local x = (zr.rand(sh) * 100):to(dt)
      local g = x:cuda()
      local what = ("%s %dx%dx%dx%d"):format(dt, sh[1], sh[2], sh[3], sh[4])
      close(g:transpose(2, 3):contiguous():cpu(), x:transpose(2, 3):contiguous(), "f64", "(B,H,T,D) -> (B,T,H,D) " .. what)
      close(g:permute(3, 1, 2, 4):contiguous():cpu(), x:permute(3, 1, 2, 4):contiguous(), "f64", "permute 3,1,2,4 " .. what)
      close(g:transpose(2, 3):to("f32"):cpu(), x:transpose(2, 3):to("f32"), "f64", "permute + cast to f32 " .. what)
      close(g:narrow(4, 2, sh[4] - 1):contiguous():cpu(), x:narrow(4, 2, sh[4] - 1):contiguous(), "f64", "unaligned rows " .. what)
      local d = zr.zeros({ sh[1], sh[3], sh[2], sh[4] }, { dtype = dt, device = "cuda" })
      d:transpose(2, 3):copy_(g) -- strided destination
      close(d:cpu(), x:transpose(2, 3):contiguous(), "f64", "into a permuted destination " .. what)
    end
  end
end)

T.test("fills: zeros, ones, full, fill_ on strided views", function()
  for _, dt in ipairs { "f32", "bf16", "f16", "f64", "i32", "i64", "u8" } do
    local o = zr.ones({ 1000003 }, { device = "cuda", dtype = dt })
    T.eq(o:to("f64"):sum():item(), 1000003, "ones sum " .. dt)
    local f = zr.full({ 5, 7 }, 3.3, { device = "cuda", dtype = dt })
    close(f:cpu(), zr.full({ 5, 7 }, 3.3, { dtype = dt }), "f64", "full " .. dt)
  end
  local g = zr.zeros({ 9, 8 }, { device = "cuda" })
  g:transpose(1, 2):narrow(1, 2, 3):fill_(-1.5)
  local c = zr.zeros({ 9, 8 })
  c:transpose(1, 2):narrow(1, 2, 3):fill_(-1.5)
  close(g:cpu(), c, "f32", "fill_ through a transposed narrow")
  local u = zr.zeros({ 1001 }, { device = "cuda", dtype = "bf16" })
  u:narrow(1, 2, 999):fill_(2) -- contiguous but not 16-byte aligned
  T.eq(u:to("f64"):sum():item(), 1998, "unaligned fill")
  T.eq(u[1], 0, "element before the view")
end)

T.test("same seed gives the same random numbers on CPU and GPU", function()
  for _, dt in ipairs { "f32", "bf16", "f64", "f16" } do
    for _, n in ipairs { 1, 7, 127, 1000003 } do
      zr.manual_seed(1234)
      local c1, c2, c3 = zr.randn({ n }, { dtype = dt }), zr.rand({ n }, { dtype = dt }), zr.randn({ 3 }, { dtype = dt })
      zr.manual_seed(1234)
      local g1 = zr.randn({ n }, { dtype = dt, device = "cuda" })
      local g2 = zr.rand({ n }, { dtype = dt, device = "cuda" })
      local g3 = zr.randn({ 3 }, { dtype = dt, device = "cuda" })
      close(g2:cpu(), c2, "f64", "rand " .. dt .. " n=" .. n) -- uniform: exact
      -- normal: libm vs CUDA log/sin/cos may differ in the last bit of the double
      local tol = dt == "f64" and "f64" or "f32"
      close(g1:cpu(), c1, tol, "randn " .. dt .. " n=" .. n, 10)
      close(g3:cpu(), c3, tol, "randn after offsets advance " .. dt, 10)
    end
  end
  -- uniform_/normal_ on a non-contiguous GPU view
  zr.manual_seed(7)
  local c = zr.zeros({ 6, 5 }); c:transpose(1, 2):normal_(2, 3)
  zr.manual_seed(7)
  local g = zr.zeros({ 6, 5 }, { device = "cuda" }); g:transpose(1, 2):normal_(2, 3)
  close(g:cpu(), c, "f32", "normal_ on a transposed view", 10)
end)

-- name, Lua function, input domain ("pos" for ops that need x > 0)
local UNARY = {
  { "neg", function(x) return x:neg() end }, { "exp", function(x) return x:exp() end },
  { "log", function(x) return x:log() end, "pos" }, { "sqrt", function(x) return x:sqrt() end, "pos" },
  { "rsqrt", function(x) return x:rsqrt() end, "pos" }, { "relu", function(x) return x:relu() end },
  { "gelu_tanh", function(x) return x:gelu("tanh") end }, { "gelu", function(x) return x:gelu() end },
  { "silu", function(x) return x:silu() end }, { "sigmoid", function(x) return x:sigmoid() end },
  { "tanh", function(x) return x:tanh() end }, { "pow", function(x) return x:pow(2.5) end, "pos" },
  { "abs", function(x) return x:abs() end }, { "square", function(x) return x:square() end },
  { "reciprocal", function(x) return x:reciprocal() end, "pos" },
}

-- Forward value and input gradient of f on one device; w weights the outputs.
local function fwd_bwd(f, x, w)
  x = x:detach(); x.requires_grad = true
  local y = f(x)
  local l = (y * w):sum()
  l:backward()
  return y, x.grad
end

T.test("unary ops forward and backward (f32, bf16, f16; sizes 1..1000003)", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, n in ipairs(SIZES) do
      for _, u in ipairs(UNARY) do
        if n < 1000003 or dt ~= "f16" then
          local base = u[3] == "pos" and (zr.rand({ n }) * 3 + 0.2) or randn({ n }) * 2
          local xc, xg = pair(base:to(dt))
          local wc, wg = pair(randn({ n }):to(dt))
          local yc, gc = fwd_bwd(u[2], xc, wc)
          local yg, gg = fwd_bwd(u[2], xg, wg)
          T.eq(yg:device(), "cuda:0")
          close(yg:cpu(), yc, dt, ("%s forward n=%d"):format(u[1], n))
          close(gg:cpu(), gc, dt, ("%s backward n=%d"):format(u[1], n))
        end
      end
    end
  end
end)

T.test("unary on unaligned and strided inputs", function()
  local base = randn({ 1001 })
  for _, dt in ipairs { "f32", "bf16" } do
    local c, g = pair(base:to(dt))
    close(g:narrow(1, 2, 999):silu():cpu(), c:narrow(1, 2, 999):silu(), dt, "unaligned silu")
    local m = randn({ 37, 29 }):to(dt)
    close(m:cuda():transpose(1, 2):exp():cpu(), m:transpose(1, 2):exp(), dt, "transposed exp")
  end
end)

T.test("binary ops with broadcasting, forward and backward", function()
  local cases = {
    { { 1000003 }, { 1000003 } }, { { 1 }, { 1 } }, { { 7 }, { 1 } }, { { 127, 33 }, { 33 } },
    { { 127, 1 }, { 1, 33 } }, { { 5, 1, 7 }, { 3, 1 } }, { { 2, 3, 4, 5 }, { 2, 1, 4, 1 } },
    { { 129, 64 }, { 64 } }, { { 64 }, { 33, 64 } }, -- the vectorised row-broadcast path, both sides
  }
  local ops = {
    { "add", function(a, b) return a + b end }, { "sub", function(a, b) return a - b end },
    { "mul", function(a, b) return a * b end }, { "div", function(a, b) return a / b end },
  }
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, cs in ipairs(cases) do
      for _, op in ipairs(ops) do
        local a0 = randn(cs[1])
        local b0 = op[1] == "div" and (zr.rand(cs[2]) + 0.5) or randn(cs[2])
        local ac, ag = pair(a0:to(dt))
        local bc, bg = pair(b0:to(dt))
        local function run(a, b)
          a = a:detach(); b = b:detach(); a.requires_grad = true; b.requires_grad = true
          local y = op[2](a, b)
          local w = zr.ones(y:shape(), { dtype = dt, device = y:device() })
          ;(y * w):sum():backward()
          return y, a.grad, b.grad
        end
        local yc, gac, gbc = run(ac, bc)
        local yg, gag, gbg = run(ag, bg)
        local what = ("%s %s x %s"):format(op[1], table.concat(cs[1], ","), table.concat(cs[2], ","))
        -- the grads of broadcast inputs are sums of up to 1000003 terms: allow for the summation
        -- order (the GPU sums in f64, the CPU in blocked f32)
        close(yg:cpu(), yc, dt, what .. " forward")
        close(gag:cpu(), gac, dt, what .. " grad a", 4)
        close(gbg:cpu(), gbc, dt, what .. " grad b", 4)
      end
    end
  end
end)

T.test("mixed dtypes, scalars, strided operands, in-place ops", function()
  local a, b = randn({ 33, 17 }), randn({ 17 })
  local ga, gb = a:cuda(), b:to("bf16"):cuda()
  local y = ga + gb -- f32 + bf16 -> f32
  T.eq(y:dtype(), "f32")
  close(y:cpu(), a + b:to("bf16"), "f32", "f32 + bf16")
  close((ga:transpose(1, 2) * 3 - 1):cpu(), a:transpose(1, 2) * 3 - 1, "f32", "affine on a transposed view")
  close((2 / ga):cpu(), 2 / a, "f32", "scalar / tensor")
  close((ga:transpose(1, 2) + gb:to("f32"):view(17, 1)):cpu(), a:transpose(1, 2) + b:to("bf16"):to("f32"):view(17, 1),
    "f32", "strided + broadcast")
  local ints = zr.tensor({ 1, 2, 3 }, { dtype = "i32" })
  close((ints:cuda() + ints:cuda()):cpu(), ints + ints, "f64", "i32 + i32")
  for _, dt in ipairs { "f32", "bf16" } do
    local c, g = randn({ 1000003 }):to(dt), nil
    g = c:cuda()
    local d = randn({ 1000003 }):to(dt)
    c:add_(d, 0.5); g:add_(d:cuda(), 0.5)
    close(g:cpu(), c, dt, "add_ " .. dt)
    c:mul_(-3); g:mul_(-3)
    close(g:cpu(), c, dt, "mul_ " .. dt)
    local e = randn({ 7 }):to(dt)
    local c2, g2 = zr.zeros({ 5, 7 }, { dtype = dt }), zr.zeros({ 5, 7 }, { dtype = dt, device = "cuda" })
    c2:add_(e, 2); g2:add_(e:cuda(), 2) -- broadcast: the generic path
    close(g2:cpu(), c2, dt, "add_ broadcast " .. dt)
    local t1, t2 = zr.ones({ 6, 4 }, { dtype = dt }), zr.ones({ 6, 4 }, { dtype = dt, device = "cuda" })
    t1:transpose(1, 2):mul_(5); t2:transpose(1, 2):mul_(5)
    close(t2:cpu(), t1, dt, "mul_ on a transposed view " .. dt)
  end
  -- a 16-bit gradient added into an fp32 one (widened in registers; unaligned views take the copy path)
  for _, dt in ipairs { "bf16", "f16" } do
    for _, n in ipairs { 1, 9, 1000003 } do
      local acc, x = randn({ n }), randn({ n }):to(dt)
      local g = acc:cuda()
      g:add_(x:cuda(), -0.25); acc:add_(x:to("f32"), -0.25)
      close(g:cpu(), acc, "f32", ("f32 += %s (n=%d)"):format(dt, n))
    end
    local acc, x = randn({ 1001 }), randn({ 1002 }):to(dt)
    local g = acc:cuda()
    local xs = x:cuda():narrow(1, 2, 1001)
    g:add_(xs, 2); acc:add_(x:narrow(1, 2, 1001):to("f32"), 2)
    close(g:cpu(), acc, "f32", "f32 += unaligned " .. dt)
  end
end)

T.test("reductions: sum, mean, max (values, indices, backward) over dims", function()
  local cases = {
    { { 1 }, nil }, { { 7 }, nil }, { { 127 }, nil }, { { 1000003 }, nil }, { { 1000003 }, { 1 } },
    { { 37, 129 }, { 2 } }, { { 37, 129 }, { 1 } }, { { 37, 129 }, { 1, 2 } }, { { 5, 7, 11 }, { 1, 3 } },
    { { 3, 5000 }, { 2 } }, { { 2000, 3 }, { 2 } }, { { 600, 1500 }, { 2 } }, { { 4, 300000 }, { 2 } },
  }
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, cs in ipairs(cases) do
      local x0 = randn(cs[1]):to(dt)
      local what = ("%s dims %s"):format(table.concat(cs[1], ","), cs[2] and table.concat(cs[2], ",") or "all")
      for _, kind in ipairs { "sum", "mean", "max" } do
        local function run(x)
          x = x:detach(); x.requires_grad = true
          local y, idx
          if kind == "max" and cs[2] and #cs[2] == 1 then y, idx = x:max(cs[2][1], true)
          elseif kind == "max" then y = cs[2] and x:max(cs[2]) or x:max()
          else y = x[kind](x, cs[2], true) end
          local w = zr.ones(y:shape(), { dtype = dt, device = y:device() }) * 0.5
          ;(y * w):sum():backward()
          return y, x.grad, idx
        end
        local yc, gc, ic = run(x0)
        local yg, gg, ig = run(x0:cuda())
        -- sums of many f32 terms: the CPU sums blocks in f32, the GPU in f64
        local slack = kind == "max" and 1 or 1 + math.sqrt(x0:numel()) / 50
        -- a sum that cancels is judged against the size of its terms, not of its result
        local per_out = x0:to("f64"):abs():sum():item() / yc:numel()
        local fl = kind == "sum" and per_out or kind == "mean" and per_out * yc:numel() / x0:numel() or nil
        close(yg:cpu(), yc, dt, kind .. " " .. what, slack, fl)
        close(gg:cpu(), gc, dt, kind .. " grad " .. what)
        if ic then close(ig:cpu(), ic, "f64", "argmax " .. what) end
      end
    end
  end
  -- max lets NaN win and takes the first of equal maxima, like the CPU
  local t = zr.tensor({ { 1, 5, 5, 2 }, { 0 / 0, 1, 9, 0 / 0 }, { 3, 3, 3, 3 } })
  local vc, ic = t:max(2)
  local vg, ig = t:cuda():max(2)
  close(vg:cpu(), vc, "f32", "max with NaN")
  close(ig:cpu(), ic, "f64", "argmax with ties and NaN")
end)

-- Runs f on CPU and on CUDA with the same inputs (CPU tensors; float ones get requires_grad
-- unless nograd[i]), weights the output(s) by fixed random tensors, backpropagates, and compares
-- the outputs and every input gradient. dt: the dtype the inputs are cast to on both devices.
local function both(what, dt, inputs, f, slack, nograd)
  nograd = nograd or {}
  local function run(dev)
    local xs = {}
    for i, x in ipairs(inputs) do
      local t = x:dtype() == "f32" and x:to(dt) or x
      if dev == "cuda" then t = t:cuda() end
      t = t:detach()
      if t:dtype() == dt and not nograd[i] then t.requires_grad = true end
      xs[i] = t
    end
    local y = f(unpack(xs))
    return y, xs
  end
  local yc, xc = run("cpu")
  local yg, xg = run("cuda")
  T.eq(yg:device(), "cuda:0", what .. " output device")
  close(yg:cpu(), yc, dt, what .. " forward", slack)
  if not yc.requires_grad then return end
  zr.manual_seed(99)
  local w = zr.randn(yc:shape())
  ;(yc:float() * w):sum():backward()
  ;(yg:float() * w:cuda()):sum():backward()
  for i = 1, #xc do
    if xc[i].requires_grad then
      assert(xg[i].grad, what .. ": no CUDA gradient for input " .. i)
      close(xg[i].grad:cpu(), xc[i].grad, dt, ("%s grad %d"):format(what, i), slack, 1e-3)
    end
  end
end

T.test("matmul and bmm: batches, broadcasting, transposed views, 1-D operands", function()
  local cases = {
    { { 1, 1 }, { 1, 1 } }, { { 7, 5 }, { 5, 13 } }, { { 127, 65 }, { 65, 33 } }, { { 64, 1000 }, { 1000, 48 } },
    { { 3, 7, 5 }, { 5, 11 } }, { { 3, 7, 5 }, { 3, 5, 11 } }, { { 2, 1, 7, 5 }, { 3, 5, 4 } },
    { { 5 }, { 5, 7 } }, { { 7, 5 }, { 5 } }, { { 5 }, { 5 } }, { { 2, 3, 1, 17 }, { 17, 1 } },
  }
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, cs in ipairs(cases) do
      both(("matmul %s x %s"):format(table.concat(cs[1], ","), table.concat(cs[2], ",")), dt,
        { randn(cs[1]), randn(cs[2]) }, zr.matmul, 2)
    end
    -- transposed views become GEMM flags (no copy), also in a batch
    both("matmul aᵀ bᵀ", dt, { randn({ 13, 7 }), randn({ 11, 13 }) },
      function(a, b) return zr.matmul(a:transpose(1, 2), b:transpose(1, 2)) end, 2)
    both("matmul batched aᵀ", dt, { randn({ 3, 13, 7 }), randn({ 3, 13, 5 }) },
      function(a, b) return zr.matmul(a:transpose(2, 3), b) end, 2)
    both("bmm", dt, { randn({ 4, 7, 9 }), randn({ 4, 9, 3 }) }, zr.bmm, 2)
    both("matmul permuted batch (per-matrix calls)", dt, { randn({ 5, 3, 7, 4 }), randn({ 3, 5, 4, 6 }) },
      function(a, b) return zr.matmul(a:transpose(1, 2), b) end, 2)
  end
end)

T.test("linear: bias epilogue, no bias, 3-D input, sizes 1 and primes, f32/bf16/f16", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    -- 1543 and 2100 rows: the chunked bias-gradient sum (70 columns one at a time, 264 in 16-byte loads)
    for _, s in ipairs { { 1, 1, 1 }, { 7, 13, 5 }, { 127, 33, 65 }, { 3, 64, 257 }, { 1543, 37, 70 }, { 2100, 16, 264 } } do
      local rows, inn, out = s[1], s[2], s[3]
      both(("linear %dx%d->%d"):format(rows, inn, out), dt, { randn({ rows, inn }), randn({ out, inn }), randn({ out }) },
        zr.linear, 2)
      both(("linear no bias %dx%d->%d"):format(rows, inn, out), dt, { randn({ 2, rows, inn }), randn({ out, inn }) },
        zr.linear, 2)
    end
    both("linear with a transposed weight view", dt, { randn({ 9, 6 }), randn({ 6, 10 }) },
      function(x, w) return zr.linear(x, w:transpose(1, 2)) end, 2)
  end
end)

T.test("softmax and log_softmax over the last and other dims", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, sh in ipairs { { 1, 1 }, { 7, 13 }, { 127, 1000 }, { 3, 5, 33 }, { 2, 50001 } } do
      for _, d in ipairs { -1, 1 } do
        local x = randn(sh) * 3
        -- the fused softmax kernel uses the fast __expf: ~4e-5 relative in f32 over 50001 terms
        both(("softmax %s dim %d"):format(table.concat(sh, ","), d), dt, { x }, function(t) return zr.softmax(t, d) end, 5)
        -- its gradient g - softmax * sum(g) sums 50001 terms in another order: ~5e-5 relative
        both(("log_softmax %s dim %d"):format(table.concat(sh, ","), d), dt, { x },
          function(t) return zr.log_softmax(t, d) end, sh[#sh] > 10000 and 50 or 2)
      end
    end
  end
  -- large logit gaps: log_softmax stays finite (no log of an underflowed softmax)
  local x = zr.tensor({ { 0, 200, -300 } })
  close(zr.log_softmax(x:cuda(), -1):cpu(), zr.log_softmax(x, -1), "f32", "log_softmax with large gaps")
end)

T.test("cross_entropy (fused): ignore_index, mean/sum/none, large vocab, bf16 logits", function()
  for _, dt in ipairs { "f32", "bf16" } do
    for _, s in ipairs { { 1, 5 }, { 7, 13 }, { 127, 1000 }, { 13, 32003 } } do
      local N, C = s[1], s[2]
      zr.manual_seed(N * 7 + C)
      local tgt = (zr.rand({ N }) * C):to("i64")
      if N > 1 then tgt[2] = -100 end -- an ignored row
      for _, red in ipairs { "mean", "sum", "none" } do
        both(("cross_entropy %dx%d %s"):format(N, C, red), dt, { randn({ N, C }) * 2, tgt },
          function(x, t) return zr.cross_entropy(x, t, { ignore_index = -100, reduction = red }) end, 2)
      end
    end
  end
  -- (B, T, V) logits with (B, T) i32 targets; another ignore_index
  local t3 = (zr.rand({ 2, 5 }) * 11):to("i32")
  t3[1][2] = 3
  both("cross_entropy 3-D i32 targets", "f32", { randn({ 2, 5, 11 }), t3 },
    function(x, t) return zr.cross_entropy(x, t, { ignore_index = 3 }) end)
  -- every target ignored: mean is NaN like torch (and the CPU)
  local all = zr.full({ 4 }, -100, { dtype = "i64" })
  local l = zr.cross_entropy(randn({ 4, 6 }):cuda(), all:cuda())
  assert(l:item() ~= l:item(), "mean over no targets is NaN")
  T.raises(function() return zr.cross_entropy(randn({ 3, 4 }):cuda(), zr.zeros({ 3 }, { dtype = "i64", device = "cuda" }),
    { label_smoothing = 0.1 }) end, "label_smoothing is not supported on CUDA")
end)

T.test("embedding: gather and deterministic scatter-add (repeated ids)", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, s in ipairs { { 1, 1, { 1 } }, { 7, 13, { 3, 5 } }, { 1000, 64, { 4, 127 } }, { 50, 3, { 1000 } } } do
      local V, D = s[1], s[2]
      local ids = (zr.rand(s[3]) * V):to("i64")
      both(("embedding V=%d D=%d"):format(V, D), dt, { randn({ V, D }), ids }, zr.embedding)
    end
  end
end)

T.test("embedding: a 16-bit table's gradient added straight into an fp32 .grad (the engine's)", function()
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs { { 1000, 64, { 4, 127 } }, { 50, 24, { 1000 } }, { 7, 16, { 3, 5 } } } do
      local V, D = s[1], s[2]
      local ids = (zr.rand(s[3]) * V):to("i64")
      local w0, g0 = randn({ V, D }):to(dt), randn({ V, D })
      local dshape = { unpack(s[3]) }
      dshape[#dshape + 1] = D
      local dy = randn(dshape):to(dt)
      -- reference: an f32 table and f32 dout holding the same values, on the CPU
      local wr = w0:float():detach():requires_grad_(true)
      wr.grad = g0:clone()
      ;(zr.embedding(wr, ids) * dy:float()):sum():backward()
      local w = w0:cuda():detach():requires_grad_(true)
      w.grad = g0:cuda()
      local gbuf = w.grad
      ;(zr.embedding(w, ids:cuda()):float() * dy:float():cuda()):sum():backward()
      T.eq(w.grad:dtype(), "f32")
      T.near(gbuf:cpu(), wr.grad, 1e-5, 1e-5, ("embedding %s V=%d D=%d into the f32 grad in place"):format(dt, V, D))
    end
  end
end)

T.test("rms_norm and layer_norm, with and without affine parameters", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, sh in ipairs { { 1, 1 }, { 7, 13 }, { 3, 5, 127 }, { 2, 2048 }, { 4, 4099 } } do
      local D = sh[#sh]
      local what = table.concat(sh, ",")
      -- D = 1: LayerNorm's x - mean is 0 and rstd = 1/sqrt(eps) ~ 316, so the exact zero input
      -- gradient comes out as rounding noise of size ~316 * 2^-24; RMSNorm's input gradient is
      -- w*dy*rstd*(1 - xhat^2) with xhat^2 = 1 - O(eps): the same cancellation. Compare at that scale
      local sl = D == 1 and 2000 or 2
      both("rms_norm " .. what, dt, { randn(sh), randn({ D }) }, function(x, w) return zr.rms_norm(x, w, 1e-6) end, sl)
      both("rms_norm no weight " .. what, dt, { randn(sh) }, function(x) return zr.rms_norm(x, nil, 1e-5) end, sl)
      both("layer_norm " .. what, dt, { randn(sh), randn({ D }), randn({ D }) },
        function(x, w, b) return zr.layer_norm(x, w, b, 1e-5) end, sl)
      both("layer_norm no affine " .. what, dt, { randn(sh) }, function(x) return zr.layer_norm(x) end, sl)
    end
  end
end)

T.test("rope: contiguous and (B,T,H,D)-transposed inputs, T=1 and primes", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, s in ipairs { { 1, 1, 1, 2 }, { 2, 3, 7, 8 }, { 1, 4, 33, 64 }, { 2, 2, 5, 128 } } do
      local B, H, Tn, Dh = s[1], s[2], s[3], s[4]
      local cos, sin = zr.rope_tables(Tn, Dh, { theta = 10000, dtype = "f32" })
      local what = table.concat(s, ",")
      both("rope " .. what, dt, { randn({ B, H, Tn, Dh }), cos:to(dt), sin:to(dt) },
        function(x, c, sn) return zr.rope(x, c, sn) end, 1, { false, true, true })
      both("rope transposed " .. what, dt, { randn({ B, Tn, H, Dh }), cos:to(dt), sin:to(dt) },
        function(x, c, sn) return zr.rope(x:transpose(2, 3), c, sn) end, 1, { false, true, true })
    end
  end
end)

T.test("swiglu (fused): f32/bf16/f16 forward and backward vs the CPU op; Llama-sized rows", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    -- 1, 7, 17, 4099: rows the 16-byte vector path cannot take (F % V ~= 0); 1000: it can
    for _, sh in ipairs { { 1 }, { 7 }, { 3, 5, 17 }, { 5, 1000 }, { 3, 4099 } } do
      both("swiglu " .. table.concat(sh, ","), dt, { randn(sh) * 3, randn(sh) }, zr.swiglu)
    end
    -- one gradient wanted (the kernel writes both; the other goes to a dropped buffer)
    both("swiglu, only up needs grad", dt, { randn({ 7, 16 }) * 3, randn({ 7, 16 }) }, zr.swiglu, 1, { true })
    both("swiglu, only gate needs grad", dt, { randn({ 7, 16 }) * 3, randn({ 7, 16 }) }, zr.swiglu, 1, { false, true })
    -- strided inputs are copied to contiguous ones; their gradients come back in the inputs' shapes
    both("swiglu strided", dt, { randn({ 13, 6 }) * 3, randn({ 6, 17 }) },
      function(g, u) return zr.swiglu(g:transpose(1, 2), u:narrow(2, 3, 13)) end)
  end
  T.raises(function() zr.swiglu(zr.ones({ 3 }), zr.ones({ 3 }, { device = "cuda" })) end,
    "swiglu: input 2 is on cuda:0 but input 1 is on cpu")
  T.raises(function() zr.swiglu(zr.ones({ 3 }, { device = "cuda" }), zr.ones({ 3 }, { device = "cuda", dtype = "bf16" })) end,
    "swiglu: gate is f32 but up is bf16")
  T.raises(function() zr.swiglu(zr.ones({ 3 }, { device = "cuda", dtype = "f64" }), zr.ones({ 3 }, { device = "cuda", dtype = "f64" })) end,
    "swiglu on cuda:0: f64 is not supported")

  -- (4, 512, 8192): the MLP's shape, the vector path with several grid-stride steps per thread.
  -- 16.7M elements: judged with tensor reductions, not Lua tables (close's rule: |a - b| <=
  -- atol * max|b| + rtol * |b|, with a floor on the scale for the gradients as in `both`).
  local function close_big(got, want, dt, what, floor)
    local tol = TOL[dt]
    local a, b = got:cpu():float(), want:float()
    local scale = max(b:abs():max():item(), floor or 1e-30)
    local excess = ((a - b):abs() - b:abs() * tol[2]):max():item() - tol[1] * scale
    if not (excess <= 0) then -- NaN fails too
      error(("%s (%s): cuda vs cpu exceed the tolerance by %.3g (scale %.3g)"):format(what, dt, excess, scale), 2)
    end
  end
  local sh = { 4, 512, 8192 }
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    local g0, u0, w0 = (randn(sh) * 3):to(dt), randn(sh):to(dt), randn(sh):to(dt)
    local function run(dev)
      local g, u = g0:to(dev):detach():requires_grad_(true), u0:to(dev):detach():requires_grad_(true)
      local h = zr.swiglu(g, u)
      h:backward(w0:to(dev))
      return h, g.grad, u.grad
    end
    local hc, dgc, duc = run("cpu")
    local hg, dgg, dug = run("cuda")
    T.eq(hg:device(), "cuda:0", "output device")
    T.eq(dgg:dtype(), dt, "gate grad dtype")
    close_big(hg, hc, dt, "swiglu (4,512,8192) forward")
    close_big(dgg, dgc, dt, "swiglu (4,512,8192) dgate", 1e-3)
    close_big(dug, duc, dt, "swiglu (4,512,8192) dup", 1e-3)
    hc, dgc, duc, hg, dgg, dug = nil, nil, nil, nil, nil, nil
    collectgarbage(); collectgarbage()
  end
end)

T.test("scaled_dot_product_attention: flash (bf16/f16, Dh 64/128) and the f32 path, GQA", function()
  local function sdpa(q, k, v) return zr.scaled_dot_product_attention(q, k, v, { is_causal = true }) end
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs { { 1, 2, 1, 1, 64 }, { 2, 4, 2, 7, 64 }, { 1, 4, 1, 65, 128 }, { 1, 2, 2, 200, 64 } } do
      local B, Hq, Hkv, Tn, Dh = unpack(s)
      both("sdpa flash " .. table.concat(s, ","), dt,
        { randn({ B, Hq, Tn, Dh }), randn({ B, Hkv, Tn, Dh }), randn({ B, Hkv, Tn, Dh }) }, sdpa, 2)
    end
  end
  for _, s in ipairs { { 1, 1, 1, 1, 16 }, { 2, 4, 2, 7, 16 }, { 1, 2, 1, 33, 64 } } do
    local B, Hq, Hkv, Tn, Dh = unpack(s)
    both("sdpa f32 " .. table.concat(s, ","), "f32",
      { randn({ B, Hq, Tn, Dh }), randn({ B, Hkv, Tn, Dh }), randn({ B, Hkv, Tn, Dh }) }, sdpa, 2)
  end
  both("sdpa bf16 head_dim 32 (f32 path)", "bf16", { randn({ 1, 2, 9, 32 }), randn({ 1, 1, 9, 32 }), randn({ 1, 1, 9, 32 }) },
    sdpa, 2)
  -- strided operands (read in place by the Hopper kernels): transposed (B, T, H, Dh) projections,
  -- and head slices of one fused (B, T, (Hq + 2 Hkv) Dh) projection; the output read back through
  -- transpose + reshape, the gradients handed on in the inputs' layouts
  local function heads(t, B, Tn, H, Dh) return t:view(B, Tn, H, Dh):transpose(2, 3) end
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs { { 1, 2, 1, 5, 64 }, { 2, 4, 2, 130, 64 }, { 1, 2, 2, 200, 64 } } do
      local B, Hq, Hkv, Tn, Dh = unpack(s)
      local name = table.concat(s, ",")
      both("sdpa on transposed (B, T, H, Dh) projections " .. name, dt,
        { randn({ B, Tn, Hq * Dh }), randn({ B, Tn, Hkv * Dh }), randn({ B, Tn, Hkv * Dh }) }, function(q, k, v)
          local o = sdpa(heads(q, B, Tn, Hq, Dh), heads(k, B, Tn, Hkv, Dh), heads(v, B, Tn, Hkv, Dh))
          return o:transpose(2, 3):reshape(B, Tn, Hq * Dh)
        end, 2)
      both("sdpa on head slices of a fused projection " .. name, dt, { randn({ B, Tn, (Hq + 2 * Hkv) * Dh }) },
        function(x)
          local q, k, v = unpack(zr.split(x * 2, { Hq * Dh, Hkv * Dh, Hkv * Dh }, 3))
          local o = sdpa(heads(q, B, Tn, Hq, Dh), heads(k, B, Tn, Hkv, Dh), heads(v, B, Tn, Hkv, Dh))
          return o:transpose(2, 3):reshape(B, Tn, Hq * Dh)
        end, 2)
    end
  end
end)

T.test("dropout: same seed, same mask on both devices; cat, split, where, masked_fill, compare", function()
  for _, dt in ipairs { "f32", "bf16" } do
    local x = randn({ 127, 33 })
    local function run(dev)
      zr.manual_seed(5)
      local t = x:to(dt):to(dev):detach(); t.requires_grad = true
      local y = zr.dropout(t, 0.3, true)
      ;(y:float() * 2):sum():backward()
      return y, t.grad
    end
    local yc, gc = run("cpu")
    local yg, gg = run("cuda")
    close(yg:cpu(), yc, dt, "dropout forward")
    close(gg:cpu(), gc, dt, "dropout backward")
  end
  both("cat dim 2", "f32", { randn({ 3, 4 }), randn({ 3, 7 }), randn({ 3, 1 }) },
    function(a, b, c) return zr.cat({ a, b, c }, 2) end)
  both("split + recombine", "bf16", { randn({ 10, 3 }) },
    function(x) local p = zr.split(x, 3, 1); return zr.cat({ p[4] * 2, p[1], p[3] * 3, p[2] }, 1) end)
  local a0, b0 = randn({ 7, 13 }), randn({ 13 })
  local m = zr.gt(a0, 0)
  both("where", "f32", { m, a0, b0 }, function(c, a, b) return zr.where(c, a, b) end)
  both("masked_fill", "bf16", { randn({ 5, 7 }), zr.gt(randn({ 7 }), 0) },
    function(x, mk) return zr.masked_fill(x, mk, -1e4) end)
  local ints = (zr.rand({ 9 }) * 5):to("i64")
  both("where on i64", "f32", { zr.gt(randn({ 9 }), 0), ints, zr.full({ 9 }, 7, { dtype = "i64" }) },
    function(c, a, b) return zr.where(c, a, b) end)
  for _, op in ipairs { "eq", "ne", "lt", "le", "gt", "ge" } do
    local a = (zr.rand({ 31, 7 }) * 4):to("i32"):to("f32")
    local b = (zr.rand({ 7 }) * 4):to("i32"):to("f32")
    close(zr[op](a:cuda(), b:cuda()):cpu(), zr[op](a, b), "f64", op .. " broadcast")
    close(zr[op](a:to("bf16"):cuda(), 2):cpu(), zr[op](a:to("bf16"), 2), "f64", op .. " scalar bf16")
    close(zr[op](ints:cuda(), 2):cpu(), zr[op](ints, 2), "f64", op .. " i64 vs scalar")
  end
  close(zr.logical_not(m:cuda()):cpu(), zr.logical_not(m), "f64", "logical_not")
end)

T.test("optimizers on CUDA parameters: AdamW (f32/bf16 grads) and SGD match the CPU", function()
  for _, gdt in ipairs { "f32", "bf16" } do
    for _, n in ipairs { 1, 7, 1000003 } do
      local p0, g0 = randn({ n }), randn({ n }):to(gdt)
      local function run(dev)
        local p = p0:to(dev):clone()
        local m, v = zr.zeros({ n }, { device = dev }), zr.zeros({ n }, { device = dev })
        for step = 1, 3 do
          zr._C.adamw_step({ p }, { g0:to(dev) }, { m }, { v },
            { lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, step = step })
        end
        return p, m, v
      end
      local pc, mc, vc = run("cpu")
      local pg, mg, vg = run("cuda")
      close(pg:cpu(), pc, "f32", ("adamw param n=%d grads %s"):format(n, gdt), 10)
      close(mg:cpu(), mc, "f32", "adamw exp_avg", 10)
      close(vg:cpu(), vc, "f32", "adamw exp_avg_sq", 10)
    end
  end
  -- through zr.optim on a GPU module
  local function train(dev, cls, hp)
    zr.manual_seed(3)
    local lin = zr.nn.Linear(13, 5, { device = dev })
    local opt = cls(lin:parameters(), hp)
    local x = randn({ 7, 13 }):to(dev)
    for _ = 1, 3 do
      opt:zero_grad()
      lin(x):square():sum():backward()
      opt:step()
    end
    return lin.weight
  end
  close(train("cuda", zr.optim.AdamW, { lr = 1e-2 }):cpu(), train("cpu", zr.optim.AdamW, { lr = 1e-2 }), "f32",
    "zr.optim.AdamW on cuda", 10)
  for _, hp in ipairs { { lr = 0.1 }, { lr = 0.1, momentum = 0.9, weight_decay = 0.01 },
    { lr = 0.1, momentum = 0.9, nesterov = true } } do
    close(train("cuda", zr.optim.SGD, hp):cpu(), train("cpu", zr.optim.SGD, hp), "f32", "zr.optim.SGD on cuda", 10)
  end
end)

-- Golden tiny Llama (transformers, f32) on the GPU: f32 to near-fp32 tolerance (every gradient),
-- and bf16 against the same f32 golden values with a bf16 tolerance.
-- GPT-2 (vocabulary 257) runs its head on a padded, -1e30-biased copy on the GPU.
T.test("tiny Llama and GPT-2 golden files on CUDA: f32 (logits, loss, grads) and bf16 (logits, loss)", function()
  local cjson = require "cjson"
  for _, m in ipairs { { "tests/golden/llama_tiny.safetensors", zr.models.llama.LlamaForCausalLM },
                       { "tests/golden/gpt2_tiny.safetensors", zr.models.gpt2.GPT2LMHeadModel } } do
  local g, meta = zr.load_safetensors(m[1])
  local cfg = cjson.decode(meta.config)
  for _, dt in ipairs { "f32", "bf16" } do
    local c = {}
    for k, v in pairs(cfg) do c[k] = v end
    c.dtype, c.device = dt, "cuda"
    local model = m[2](c)
    local sd = {}
    for n in model:named_parameters() do sd[n] = g[n] end
    model:load_state_dict(sd, true)
    local out = model(g.input_ids:cuda(), g.labels:cuda())
    T.eq(out.logits:device(), "cuda:0")
    local logits = out.logits:float():cpu()
    if dt == "f32" then
      T.near(logits, g.logits, 1e-4, 1e-4, "f32 logits on cuda")
      T.near(out.loss:cpu(), g.loss, 1e-5, 1e-5, "f32 loss on cuda")
      out.loss:backward()
      for n, p in model:named_parameters() do
        T.near(p.grad:cpu(), g["grad." .. n], 1e-4, 1e-3, "f32 grad on cuda of " .. n)
      end
    else
      close(logits, g.logits, "bf16", "bf16 logits on cuda vs f32 golden", 2)
      local l, want = out.loss:float():item(), g.loss:item()
      assert(math.abs(l - want) <= 2e-2 * math.abs(want), ("bf16 loss %.6f vs golden %.6f"):format(l, want))
      out.loss:backward()
      for n, p in model:named_parameters() do assert(p.grad and p.grad:device() == "cuda:0", "bf16 grad of " .. n) end
    end
  end
  end
end)

T.test("NCCL async collectives (world size 1): the compute stream waits for the result", function()
  local dist = zr.dist
  for _, dt in ipairs { "f32", "bf16" } do
    local src = randn({ 3000017 }):to(dt)
    local t, out = src:cuda(), zr.zeros({ 3000017 }, { dtype = dt, device = "cuda" })
    local h1 = dist.all_reduce(t, "avg", { async_op = true })
    local h2 = dist.all_gather(out, src:cuda() * 2, { async_op = true }) -- its input is only held by the handle
    collectgarbage(); collectgarbage()
    local filler = randn({ 4096, 4096 }):cuda()
    for _ = 1, 3 do filler = filler * 1.0001 end -- compute queued while the collectives run
    h1:wait(); h2:wait()
    local y = out * 0.5 -- ordered after the all-gather by the wait
    close(t:cpu(), src, dt, "async all_reduce avg " .. dt)
    close(y:cpu(), src, dt, "async all_gather " .. dt)
    local shard = zr.zeros({ 3000017 }, { dtype = dt, device = "cuda" })
    dist.reduce_scatter(shard, src:cuda(), "sum", { async_op = true }):wait()
    close(shard:cpu(), src, dt, "async reduce_scatter " .. dt)
  end
end)

-- ZeRO engine on the GPU (world size 1: NCCL for the collectives) vs the same run on the CPU.
T.test("ZeRO stages 0-3 on CUDA match the CPU run (tiny Llama, 3 steps, clipping; offload, prefetch)", function()
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  local function run(dev, stage, offload, gas, prefetch)
    gas = gas or 1
    zr.manual_seed(1234)
    local c = {}
    for k, v in pairs(cfg) do c[k] = v end
    c.device = dev
    local model = zr.models.llama.LlamaForCausalLM(c)
    local engine = zr.initialize({ model = model, config = {
      train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = gas, gradient_clipping = 1.0,
      steps_per_print = 1000000,
      optimizer = { type = "AdamW", params = { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
      zero_optimization = { stage = stage, reduce_bucket_size = 3000, stage3_prefetch_bucket_size = prefetch,
        offload_optimizer = offload and { device = "cpu", pin_memory = true } or nil },
    } })
    local losses = {}
    for s = 1, 3 * gas do
      zr.manual_seed(100 + s)
      local ids = (zr.rand({ 2, 12 }) * 250):to("i64"):to(dev)
      local loss = engine(ids, ids).loss
      losses[s] = loss:item()
      engine:backward(loss)
      engine:step()
    end
    local ps = engine:gather_parameters()
    local w = {}
    for i, p in ipairs(ps) do w[i] = p:cpu():clone() end
    return losses, w
  end
  for _, c in ipairs { { 0 }, { 1 }, { 2 }, { 3 }, { 3, false, 1, 3000 }, { 1, true }, { 2, true, 2 }, { 3, true, 2 } } do
    local stage, offload, gas, prefetch = c[1], c[2], c[3], c[4]
    local what = ("stage %d%s%s%s"):format(stage, offload and " offload (pinned)" or "", gas and (" gas " .. gas) or "",
      prefetch and (" prefetch " .. prefetch) or "")
    local lc, wc = run("cpu", stage, offload, gas, prefetch)
    local lg, wg = run("cuda", stage, offload, gas, prefetch)
    T.near(lg, lc, 1e-4, 1e-4, "losses, " .. what)
    for i = 1, #wc do T.near(wg[i], wc[i], 1e-4, 1e-4, ("%s weights of parameter %d"):format(what, i)) end
  end
end)

T.test("data_types.grad_accum_dtype bf16: a bf16 gradient partition, training close to fp32 (stages 0, 2, 3)", function()
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  local function run(gad, stage)
    zr.manual_seed(1234)
    local c = {}
    for k, v in pairs(cfg) do c[k] = v end
    c.device, c.dtype = "cuda", "bf16"
    local engine = zr.initialize({ model = zr.models.llama.LlamaForCausalLM(c), config = {
      train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = 2, gradient_clipping = 1.0,
      steps_per_print = 1000000, bf16 = { enabled = true }, data_types = gad and { grad_accum_dtype = gad } or nil,
      optimizer = { type = "AdamW", params = { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
      zero_optimization = { stage = stage, reduce_bucket_size = 3000 } } })
    local losses = {}
    for s = 1, 6 do
      zr.manual_seed(100 + s)
      local ids = (zr.rand({ 2, 12 }) * 250):to("i64"):cuda()
      local loss = engine(ids, ids).loss
      losses[s] = loss:float():item()
      engine:backward(loss)
      engine:step()
    end
    local w = {}
    for i, p in ipairs(engine:gather_parameters()) do w[i] = p:float():cpu() end
    return losses, w, engine.zero:state(3):dtype()
  end
  for _, stage in ipairs { 0, 2, 3 } do
    local l32, w32, g32 = run(nil, stage)
    local l16, w16, g16 = run("bf16", stage)
    T.eq(g32, "f32", "stage " .. stage .. ": fp32 partition by default")
    T.eq(g16, "bf16", "stage " .. stage .. ": bf16 partition")
    T.near(l16, l32, 2e-2, 2e-2, "stage " .. stage .. " losses")
    for i = 1, #w32 do T.near(w16[i], w32[i], 2e-2, 2e-2, ("stage %d weights of parameter %d"):format(stage, i)) end
  end
end)

T.test("mixing devices names which tensor is where", function()
  local c, g = zr.ones({ 3 }), zr.ones({ 3 }, { device = "cuda" })
  T.raises(function() return c + g end, "input 2 is on cuda:0 but input 1 is on cpu")
  T.raises(function() return g * c end, "input 2 is on cpu but input 1 is on cuda:0")
  T.raises(function() g:add_(c) end, "is on")
  T.raises(function() zr.cuda.set_device(99) end, "cuda:99 is not available")
end)

T.test("out of memory names the device, its free memory and the categories", function()
  local err = T.raises(function() return zr.empty({ 2.5e12 }, { device = "cuda" }) end, "out of memory on cuda:0")
  for _, want in ipairs { "free of", "params", "activations", "reserved" } do
    assert(tostring(err):find(want, 1, true), ("OOM message lacks '%s': %s"):format(want, tostring(err)))
  end
  -- the device still works afterwards
  T.eq(zr.ones({ 5 }, { device = "cuda" }):sum():item(), 5, "after OOM")
end)

T.test("caching allocator: steady state needs no cudaMalloc; empty_cache; summary", function()
  local function step()
    local x = zr.randn({ 3000, 257 }, { device = "cuda" })
    local y = (x:silu() * 2 + x):sum(2)
    local z = zr.randn({ 1000003 }, { device = "cuda", dtype = "bf16" }):exp():mean()
    return y:sum():item() + z:item()
  end
  step(); step()
  collectgarbage(); collectgarbage()
  local s1 = zr.cuda.memory_summary(0)
  for _ = 1, 5 do step(); collectgarbage() end
  local s2 = zr.cuda.memory_summary(0)
  T.eq(s2.n_cuda_malloc, s1.n_cuda_malloc, "cudaMalloc calls in the steady state")
  assert(s2.n_cache_hits > s1.n_cache_hits, "the cache served the repeated allocations")
  assert(s2.reserved >= s2.allocated, "reserved covers allocated")
  local p = zr.zeros({ 1000, 1000 }, { device = "cuda" })
  p:category("params")
  local s3 = zr.cuda.memory_summary(0)
  assert(s3.categories.params.allocated >= 4e6, "params category counts the GPU tensor")
  assert(s3.device_total > 1e9 and s3.device_free > 0, "device memory info")
  p = nil
  collectgarbage(); collectgarbage()
  zr.cuda.empty_cache()
  local s4 = zr.cuda.memory_summary(0)
  T.eq(s4.cached, 0, "cache after empty_cache")
  assert(s4.reserved <= s3.reserved, "empty_cache returned memory")
  zr.cuda.synchronize()
end)

-- ---------- fused projections: linear_multi, split into one gradient buffer, packed swiglu ----------
-- (the CPU side and the by-hand references are in tests/lua/test_linear_multi.lua)

-- Weights (out_i, in) of dtype dt back to back in one flat buffer on dev (ZeRO direct mode's
-- layout): leaf views; with grads, their .grad views of one f32 buffer holding g0 (the partition).
local function lm_adjacent(flat, outs, inn, dev, dt, g0)
  local buf = flat:to(dt):to(dev)
  local gbuf = g0 and g0:to(dev):clone() -- (on the CPU, to() would hand back g0 itself: dW lands in place)
  local ws, off = {}, 0
  for i, o in ipairs(outs) do
    ws[i] = buf:narrow(1, off + 1, o * inn):view(o, inn):requires_grad_(true)
    if gbuf then ws[i].grad = gbuf:narrow(1, off + 1, o * inn):view(o, inn) end
    off = off + o * inn
  end
  return ws, gbuf
end

T.test("linear_multi on CUDA vs CPU: adjacent and separate weights, biases, gradients into leaf .grad", function()
  local cases = { { 1, 1, { 1, 2 } }, { 7, 13, { 3, 5, 7 } }, { 127, 64, { 64, 16, 16 } }, { 2, 33, { 65, 1, 8 } } }
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, cs in ipairs(cases) do
      local rows, inn, outs = cs[1], cs[2], cs[3]
      local name = ("linear_multi %dx%d->%s"):format(rows, inn, table.concat(outs, "+"))
      local ins = { randn({ 2, rows, inn }) }
      for i, o in ipairs(outs) do ins[1 + i] = randn({ o, inn }) end
      local nb = #ins
      for i, o in ipairs(outs) do ins[nb + i] = randn({ o }) end
      local n = #outs
      both(name .. " separate, biases", dt, ins, function(x, ...)
        local a = { ... }
        return zr.linear_multi(x, { unpack(a, 1, n) }, { unpack(a, n + 1, 2 * n) })
      end, 2)
      both(name .. " separate, no bias", dt, { unpack(ins, 1, 1 + n) }, function(x, ...) return zr.linear_multi(x, { ... }) end, 2)
      -- adjacent weights (one GEMM each way), their gradients as views of one f32 buffer holding
      -- earlier values: dW is added into it in place, on both devices
      local total = 0
      for _, o in ipairs(outs) do total = total + o * inn end
      local flat, g0, x0, gy = randn({ total }), randn({ total }), randn({ 2, rows, inn }):to(dt), randn({ 2, rows, total / inn })
      local res = {}
      for _, dev in ipairs { "cpu", "cuda" } do
        local ws, gbuf = lm_adjacent(flat, outs, inn, dev, dt, g0)
        T.eq(zr.linear_multi_runs(ws), 1, name .. " adjacent on " .. dev)
        local x = x0:to(dev):detach():requires_grad_(true)
        local y = zr.linear_multi(x, ws)
        ;(y:float() * gy:to(dev)):sum():backward()
        res[dev] = { y = y:cpu(), dx = x.grad:cpu(), g = gbuf:cpu() }
      end
      close(res.cuda.y, res.cpu.y, dt, name .. " adjacent forward", 2)
      close(res.cuda.dx, res.cpu.dx, dt, name .. " adjacent dx", 2, 1e-3)
      close(res.cuda.g, res.cpu.g, dt, name .. " adjacent dW into the f32 buffer", 2, 1e-3)
    end
  end
end)

T.test("split on CUDA vs CPU: one gradient buffer; parts unused, t used elsewhere; packed swiglu", function()
  for _, dt in ipairs { "f32", "bf16" } do
    both("split, parts 2 and 4 unused", dt, { randn({ 5, 17, 3 }) }, function(x)
      local p = zr.split(x * 2, { 4, 0, 6, 7 }, 2)
      return zr.cat({ p[3] * 3, p[1] }, 2)
    end)
    both("split, t used directly too", dt, { randn({ 5, 17 }), randn({ 5, 17 }) }, function(x, w)
      local t = x * w
      local p = zr.split(t, { 9, 8 }, -1)
      return zr.cat({ p[2], (t * w):sum(2, true), p[1] * p[1] }, 2)
    end)
    both("split of linear_multi (q, k, v)", dt, { randn({ 3, 11, 32 }), randn({ 32, 32 }), randn({ 16, 32 }), randn({ 16, 32 }) },
      function(x, a, b, c)
        local q, k, v = unpack(zr.split(zr.linear_multi(x, { a, b, c }), { 32, 16, 16 }, 3))
        return zr.cat({ q * 2, k:contiguous(), v }, 3)
      end, 2)
  end
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, sh in ipairs { { 1, 2 }, { 13, 34 }, { 2, 7, 64 }, { 256, 2048 } } do -- F = 1, 17 (scalar path), 32, 1024
      both("packed swiglu " .. table.concat(sh, ","), dt, { randn(sh) * 3 }, zr.swiglu)
    end
    both("packed swiglu of a strided input", dt, { randn({ 16, 9 }) * 3 }, function(x) return zr.swiglu(x:transpose(1, 2)) end)
    both("packed swiglu of linear_multi (gate, up)", dt, { randn({ 2, 9, 32 }), randn({ 48, 32 }), randn({ 48, 32 }) },
      function(x, g, u) return zr.swiglu(zr.linear_multi(x, { g, u })) end, 2)
  end
end)

T.done()
