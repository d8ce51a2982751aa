-- Fused projections on CUDA vs the CPU: linear_multi (adjacent and separate weights, biases,
-- gradients into leaf .grad), split into one gradient buffer, packed swiglu. (The CPU side and the
-- by-hand references are test_linear_multi.lua.)
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("linear_multi") then return end
local zr, T, close, randn, both, unpack = C.zr, C.T, C.close, C.randn, C.both, C.unpack

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
