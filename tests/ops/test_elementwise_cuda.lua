-- elementwise on CUDA vs the CPU: unary ops forward and backward at sizes 1..1000003 (f32,
-- bf16, f16), unaligned and strided inputs, binary ops with broadcasting, mixed dtypes, scalars,
-- in-place ops.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("elementwise") then return end
local abs = math.abs
local zr, T = C.zr, C.T
local close, randn, pair, fwd_bwd, both, SIZES = C.close, C.randn, C.pair, C.fwd_bwd, C.both, C.SIZES

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

T.done()
