-- matmul, bmm and linear on CUDA vs the CPU: batches, broadcasting, transposed views, 1-D
-- operands; the bias epilogue, sizes 1 and primes, f32/bf16/f16; weight and bias gradients over
-- micro-batches into gradients that already hold values. 264x72->136 (multiples of 8, partial tiles)
-- is a size our Hopper GEMM takes: tests/run_cuda.sh runs this file again with ZRUN_GEMM_SM90=pingpong, =wide and =auto.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("matmul") then return end
local zr, T, randn, both, close = C.zr, C.T, C.randn, C.both, C.close

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
    for _, s in ipairs { { 1, 1, 1 }, { 7, 13, 5 }, { 127, 33, 65 }, { 3, 64, 257 }, { 1543, 37, 70 }, { 2100, 16, 264 }, { 264, 72, 136 } } do
      local rows, inn, out = s[1], s[2], s[3]
      both(("linear %dx%d->%d"):format(rows, inn, out), dt, { randn({ rows, inn }), randn({ out, inn }), randn({ out }) },
        zr.linear, 2)
      both(("linear no bias %dx%d->%d"):format(rows, inn, out), dt, { randn({ 2, rows, inn }), randn({ out, inn }) },
        zr.linear, 2)
    end
    both("linear with a transposed weight view", dt, { randn({ 9, 6 }), randn({ 6, 10 }) },
      function(x, w) return zr.linear(x, w:transpose(1, 2)) end, 2)
    -- the bias gradient alone, and views as GPT-2's c_attn takes them
    both("linear, bias grad without weight grad", dt, { randn({ 1543, 9 }), randn({ 24, 9 }), randn({ 24 }) },
      zr.linear, 2, { nil, true })
    both("linear, weight view and bias view (GPT-2's c_attn)", dt, { randn({ 2, 37, 16 }), randn({ 16, 72 }), randn({ 72 }) },
      function(x, w, b) return zr.linear(x, w:narrow(2, 25, 24):transpose(1, 2), b:narrow(1, 25, 24)) end, 2)
  end
end)

-- Two micro-batches of backward into leaf gradients that already hold values: f32 buffers for
-- 16-bit parameters (the ZeRO engine's partition: dW lands there through the product with beta 1)
-- and gradients of the parameter's own dtype. Returns dW, db and both dX.
local function two_micro_batches(dev, dt, gdt, xs, w0, b0, gw0, gb0, gys, wt)
  local w = w0:to(dt):to(dev):detach():requires_grad_(true)
  local b = b0:to(dt):to(dev):detach():requires_grad_(true)
  w.grad, b.grad = gw0:to(gdt):to(dev):clone(), gb0:to(gdt):to(dev):clone()
  local dx = {}
  for i = 1, 2 do
    local x = xs[i]:to(dt):to(dev):detach():requires_grad_(true)
    local y = zr.linear(x, wt and w:transpose(1, 2) or w, b)
    ;(y:float() * gys[i]:to(dev)):sum():backward()
    dx[i] = x.grad:cpu()
  end
  return w.grad:cpu(), b.grad:cpu(), dx
end

T.test("linear: weight and bias gradients, 2 micro-batches into existing gradients", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, gdt in ipairs { "f32", dt } do
      for _, s in ipairs { { 1, 1, 1 }, { 7, 13, 5 }, { 127, 33, 64 }, { 1543, 37, 70 }, { 2100, 16, 264 }, { 264, 72, 136 } } do
        local rows, inn, out = s[1], s[2], s[3]
        for _, wt in ipairs { false, true } do -- wt: weight stored (in, out), read transposed (Conv1D)
          local name = ("linear %s, %s grads, %dx%d->%d%s"):format(dt, gdt, rows, inn, out, wt and ", wᵀ" or "")
          local w0 = wt and randn({ inn, out }) or randn({ out, inn })
          local xs, gys = { randn({ rows, inn }), randn({ rows, inn }) }, { randn({ rows, out }), randn({ rows, out }) }
          local b0, gw0, gb0 = randn({ out }), randn(w0:shape()), randn({ out })
          local cw, cb, cdx = two_micro_batches("cpu", dt, gdt, xs, w0, b0, gw0, gb0, gys, wt)
          local gw, gb, gdx = two_micro_batches("cuda", dt, gdt, xs, w0, b0, gw0, gb0, gys, wt)
          close(gw, cw, dt, name .. " dW", 2, 1e-3)
          close(gb, cb, dt, name .. " db", 2, 1e-3)
          for i = 1, 2 do close(gdx[i], cdx[i], dt, name .. " dX " .. i, 2, 1e-3) end
        end
      end
    end
  end
end)

T.done()
