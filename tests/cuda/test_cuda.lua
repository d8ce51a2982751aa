-- CUDA backend vs the CPU reference, on a GPU machine: `./zrun tests/cuda/test_cuda.lua`.
-- Every op wired to CUDA so far, forward and backward, at awkward sizes (1, 7, 127, 1000003),
-- f32 within ~1e-5 relative and bf16/f16 within ~1e-2; same-seed random numbers on both devices;
-- errors for mixed devices and out-of-memory. Prints SKIP without a GPU.
local zr = require "zrun"
local T = require "zrun.testing"

if not zr.cuda.is_available() then
  T.skip("cuda", "no CUDA device (" .. zr.cuda.unavailable_reason() .. ")")
  return
end

local floor, abs, max = math.floor, math.abs, math.max
local SIZES = { 1, 7, 127, 1000003 }
local TOL = { f32 = { 1e-5, 1e-5 }, f64 = { 1e-12, 1e-12 }, bf16 = { 1e-2, 1e-2 }, f16 = { 4e-3, 4e-3 } }

-- |a - b| <= atol * scale + rtol * |b|, scale = max |b| (so values near zero are judged against
-- the tensor's magnitude, not their own), with the first offending element in the message.
local function close(got, want, dtype, what, slack)
  local tol = TOL[dtype] or TOL.f32
  slack = slack or 1
  local g, w = T.flat(got), T.flat(want)
  if #g ~= #w then error(("%s: %d vs %d elements"):format(what, #g, #w), 2) end
  local scale = 0
  for i = 1, #w do local a = abs(w[i]); if a == a and a ~= math.huge and a > scale then scale = a end end
  scale = max(scale, 1e-30)
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
        close(yg:cpu(), yc, dt, kind .. " " .. what, slack)
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

T.test("matmul and linear on CUDA (when the matmul family is wired)", function()
  if not zr.matmul then return T.skip("matmul", "zr.matmul is not bound") end
  local ok, err = pcall(zr.matmul, zr.ones({ 2, 2 }, { device = "cuda" }), zr.ones({ 2, 2 }, { device = "cuda" }))
  if not ok then return print("SKIP matmul on CUDA: " .. tostring(err)) end
  for _, dt in ipairs { "f32", "bf16" } do
    for _, s in ipairs { { 1, 1, 1 }, { 7, 13, 5 }, { 127, 33, 65 }, { 64, 1000, 48 } } do
      local a, b = randn({ s[1], s[3] }):to(dt), randn({ s[3], s[2] }):to(dt)
      local function run(x, y)
        x = x:detach(); y = y:detach(); x.requires_grad = true; y.requires_grad = true
        local z = zr.matmul(x, y)
        z:sum():backward()
        return z, x.grad, y.grad
      end
      local zc, gac, gbc = run(a, b)
      local zg, gag, gbg = run(a:cuda(), b:cuda())
      local what = ("matmul %d x %d x %d"):format(s[1], s[3], s[2])
      close(zg:cpu(), zc, dt, what, 2)
      close(gag:cpu(), gac, dt, what .. " grad a", 2)
      close(gbg:cpu(), gbc, dt, what .. " grad b", 2)
    end
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

T.done()
