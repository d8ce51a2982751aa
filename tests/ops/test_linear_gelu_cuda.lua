-- zr.linear_gelu on CUDA (cuBLASLt's GELU_AUX(_BIAS) epilogue when out is a multiple of 8, the
-- unfused pair otherwise) vs the CPU op (linear then the tanh GELU): forward and every gradient
-- (the backward reads the epilogue's aux output), f32/bf16/f16, awkward sizes, GPT-2's weight.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("linear_gelu") then return end
local zr, T, randn, both = C.zr, C.T, C.randn, C.both

T.test("linear_gelu: f32/bf16/f16 forward and backward vs the CPU op (epilogue and fallback shapes)", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    -- out 8, 24, 64: the epilogue; out 3, 13: the fallback. Inputs * 2 reach the GELU's bend,
    -- where the tanh form and erf's differ by up to 5e-4: f32's tolerance (1e-5) tells them apart
    for _, s in ipairs { { 1, 1, 8 }, { 7, 5, 24 }, { 127, 13, 64 }, { 7, 5, 3 }, { 33, 17, 13 } } do
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

T.done()
