-- rms_norm and layer_norm on CUDA vs the CPU, with and without affine parameters.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("norm") then return end
local zr, T, randn, both = C.zr, C.T, C.randn, C.both

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

T.done()
