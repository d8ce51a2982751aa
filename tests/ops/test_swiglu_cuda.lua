-- The fused swiglu (and geglu, its GELU twin) on CUDA vs the CPU op: f32/bf16/f16 forward and backward, Llama-sized rows.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("swiglu") then return end
local zr, T, randn, both, close_big = C.zr, C.T, C.randn, C.both, C.close_big

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
  -- GeGLU (Gemma's MLP): the same kernels with GELU, tanh and exact; two tensors and packed
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, ap in ipairs { "tanh", "none" } do
      for _, sh in ipairs { { 7 }, { 5, 1000 }, { 3, 4099 } } do
        both(("geglu %s %s"):format(ap, table.concat(sh, ",")), dt, { randn(sh) * 3, randn(sh) },
          function(g, u) return zr.geglu(g, u, ap) end)
      end
      both("geglu packed " .. ap, dt, { randn({ 6, 2 * 1000 }) * 3 }, function(gu) return zr.geglu(gu, nil, ap) end)
    end
  end
  T.raises(function() zr.swiglu(zr.ones({ 3 }), zr.ones({ 3 }, { device = "cuda" })) end,
    "swiglu: input 2 is on cuda:0 but input 1 is on cpu")
  T.raises(function() zr.swiglu(zr.ones({ 3 }, { device = "cuda" }), zr.ones({ 3 }, { device = "cuda", dtype = "bf16" })) end,
    "swiglu: gate is f32 but up is bf16")
  T.raises(function() zr.swiglu(zr.ones({ 3 }, { device = "cuda", dtype = "f64" }), zr.ones({ 3 }, { device = "cuda", dtype = "f64" })) end,
    "swiglu on cuda:0: f64 is not supported")

  -- (4, 512, 8192): the MLP's shape, the vector path with several grid-stride steps per thread
  -- (16.7M elements: close_big, with a floor on the gradients' scale as in `both`)
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

T.done()
