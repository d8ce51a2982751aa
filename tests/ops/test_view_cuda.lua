-- cat and split on CUDA vs the CPU. (split into one gradient buffer: test_linear_multi_cuda.lua.)
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("view") then return end
local zr, T, randn, both = C.zr, C.T, C.randn, C.both

T.test("cat and split on CUDA vs CPU", function()
  both("cat dim 2", "f32", { randn({ 3, 4 }), randn({ 3, 7 }), randn({ 3, 1 }) },
    function(a, b, c) return zr.cat({ a, b, c }, 2) end)
  both("split + recombine", "bf16", { randn({ 10, 3 }) },
    function(x) local p = zr.split(x, 3, 1); return zr.cat({ p[4] * 2, p[1], p[3] * 3, p[2] }, 1) end)
end)

T.done()
