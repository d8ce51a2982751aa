-- embedding on CUDA vs the CPU: the gather, the deterministic scatter-add (repeated ids), a
-- 16-bit table's gradient added straight into an fp32 .grad.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("embedding") then return end
local zr, T, randn, both, unpack = C.zr, C.T, C.randn, C.both, C.unpack

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

T.done()
