-- softmax and log_softmax on CUDA vs the CPU, over the last and other dims.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("softmax") then return end
local zr, T, close, randn, both = C.zr, C.T, C.close, C.randn, C.both

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

T.done()
