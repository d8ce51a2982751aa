-- zr.linear_gelu on CUDA (cuBLASLt's GELU_AUX(_BIAS) epilogue when out is a multiple of 8, the
-- unfused pair otherwise) vs the CPU op (linear then the tanh GELU): forward and every gradient
-- (the backward reads the epilogue's aux output), f32/bf16/f16, awkward sizes, GPT-2's weight;
-- zr.mlp_gelu (the dGELU epilogue in the second linear's dX product) likewise, and over two
-- micro-batches into gradients that already hold values.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("linear_gelu") then return end
local zr, T, randn, both, close = C.zr, C.T, C.randn, C.both, C.close

T.test("linear_gelu: f32/bf16/f16 forward and backward vs the CPU op (epilogue and fallback shapes)", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    -- out 8, 24, 64: the epilogue; out 3, 13: the fallback. Inputs * 2 reach the GELU's bend,
    -- where the tanh form and erf's differ by up to 5e-4: f32's tolerance (1e-5) tells them apart
    for _, s in ipairs { { 1, 1, 8 }, { 7, 5, 24 }, { 127, 13, 64 }, { 7, 5, 3 }, { 33, 17, 13 }, { 136, 40, 264 } } do
      local rows, in_, out = s[1], s[2], s[3]
      local what = ("linear_gelu %s %dx%d -> %d"):format(dt, rows, in_, out)
      both(what, dt, { randn({ rows, in_ }) * 2, randn({ out, in_ }), randn({ out }) }, zr.linear_gelu)
      both(what .. " no bias", dt, { randn({ rows, in_ }) * 2, randn({ out, in_ }) }, zr.linear_gelu)
    end
    -- GPT-2's Conv1D: weight stored (in, out), read through its transposed view (no copy); 3-D x
    both("linear_gelu Conv1D weight " .. dt, dt, { randn({ 2, 9, 16 }) * 2, randn({ 16, 40 }), randn({ 40 }) },
      function(x, w, b) return zr.linear_gelu(x, w:transpose(1, 2), b) end)
    -- only the weight and bias want gradients (the input is data)
    both("linear_gelu, x without grad " .. dt, dt, { randn({ 5, 7 }) * 2, randn({ 16, 7 }), randn({ 16 }) },
      zr.linear_gelu, 1, { true })
  end
  -- f64 has no epilogue: the unfused pair, same values as the CPU
  both("linear_gelu f64", "f64", { (randn({ 5, 7 }) * 2):to("f64"), randn({ 16, 7 }):to("f64"), randn({ 16 }):to("f64") },
    zr.linear_gelu)
  T.raises(function() zr.linear_gelu(zr.ones({ 2, 3 }, { device = "cuda" }), zr.ones({ 8, 3 })) end, "linear_gelu")
end)

T.test("linear_gelu at GPT-2's MLP width (256 x 768 -> 3072, bf16) vs the CPU", function()
  both("linear_gelu 256x768 -> 3072", "bf16", { randn({ 256, 768 }) * 0.5, randn({ 3072, 768 }) * 0.05, randn({ 3072 }) * 0.1 },
    zr.linear_gelu)
end)

local function conv1d(x, wf, bf, wp, bp) return zr.mlp_gelu(x, wf:transpose(1, 2), bf, wp:transpose(1, 2), bp) end

T.test("mlp_gelu: f32/bf16/f16 forward and every gradient vs the CPU op (dGELU epilogue and fallback shapes)", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    -- hidden 8, 24, 64: the epilogues; 3, 13: the unfused fallback
    for _, s in ipairs { { 1, 1, 8, 1 }, { 7, 5, 24, 3 }, { 127, 13, 64, 17 }, { 7, 5, 3, 4 }, { 33, 17, 13, 8 } } do
      local rows, in_, hid, out = s[1], s[2], s[3], s[4]
      local what = ("mlp_gelu %s %dx%d -> %d -> %d"):format(dt, rows, in_, hid, out)
      both(what, dt, { randn({ rows, in_ }) * 2, randn({ hid, in_ }), randn({ hid }), randn({ out, hid }), randn({ out }) },
        zr.mlp_gelu, 2)
      both(what .. " no biases", dt, { randn({ rows, in_ }) * 2, randn({ hid, in_ }), randn({ out, hid }) },
        function(x, wf, wp) return zr.mlp_gelu(x, wf, nil, wp) end, 2)
    end
    both("mlp_gelu Conv1D weights " .. dt, dt, { randn({ 2, 9, 16 }) * 2, randn({ 16, 40 }), randn({ 40 }), randn({ 40, 16 }), randn({ 16 }) },
      conv1d, 2)
    both("mlp_gelu, x without grad " .. dt, dt, { randn({ 5, 7 }) * 2, randn({ 16, 7 }), randn({ 16 }), randn({ 3, 16 }), randn({ 3 }) },
      zr.mlp_gelu, 2, { true })
  end
  both("mlp_gelu f64 (no epilogue)", "f64", { (randn({ 5, 7 }) * 2):to("f64"), randn({ 16, 7 }):to("f64"), randn({ 16 }):to("f64"),
    randn({ 3, 16 }):to("f64"), randn({ 3 }):to("f64") }, zr.mlp_gelu)
  T.raises(function() zr.mlp_gelu(zr.ones({ 2, 3 }, { device = "cuda" }), zr.ones({ 8, 3 }), nil, zr.ones({ 2, 8 })) end, "mlp_gelu")
end)

-- Two micro-batches of backward into leaf gradients that already hold values (f32 buffers for
-- 16-bit parameters, as the ZeRO engine's partition, or the parameters' own dtype), Conv1D
-- weights. Returns the five parameter gradients and both dX.
local function two_micro_batches(dev, dt, gdt, xs, ps, g0s, gys)
  local p = {}
  for i = 1, 4 do
    p[i] = ps[i]:to(dt):to(dev):detach():requires_grad_(true)
    p[i].grad = g0s[i]:to(gdt):to(dev):clone()
  end
  local dx = {}
  for i = 1, 2 do
    local x = xs[i]:to(dt):to(dev):detach():requires_grad_(true)
    ;(conv1d(x, p[1], p[2], p[3], p[4]):float() * gys[i]:to(dev)):sum():backward()
    dx[i] = x.grad:cpu()
  end
  return { p[1].grad:cpu(), p[2].grad:cpu(), p[3].grad:cpu(), p[4].grad:cpu(), dx[1], dx[2] }
end

T.test("mlp_gelu: 2 micro-batches into existing gradients (f32 and own dtype), GPT-2's width", function()
  for _, dt in ipairs { "f32", "bf16" } do
    for _, gdt in ipairs { "f32", dt } do
      for _, s in ipairs { { 37, 16, 64, 16 }, { 256, 768, 3072, 768 } } do
        local rows, C, H, O = s[1], s[2], s[3], s[4]
        if dt == "bf16" or rows < 100 then
          local xs = { randn({ rows, C }) * 0.5, randn({ rows, C }) * 0.5 }
          local ps = { randn({ C, H }) * 0.05, randn({ H }) * 0.1, randn({ H, O }) * 0.05, randn({ O }) * 0.1 }
          local g0s = { randn({ C, H }), randn({ H }), randn({ H, O }), randn({ O }) }
          local gys = { randn({ rows, O }), randn({ rows, O }) }
          local cpu = two_micro_batches("cpu", dt, gdt, xs, ps, g0s, gys)
          local gpu = two_micro_batches("cuda", dt, gdt, xs, ps, g0s, gys)
          local what = ("mlp_gelu %s, %s grads, %dx%d->%d->%d"):format(dt, gdt, rows, C, H, O)
          for i, name in ipairs { "dw_fc", "db_fc", "dw_proj", "db_proj", "dx 1", "dx 2" } do
            close(gpu[i], cpu[i], dt, what .. " " .. name, 2, 1e-3)
          end
        end
      end
    end
  end
end)

T.done()
