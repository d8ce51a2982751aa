-- matmul, bmm and linear on CUDA vs the CPU: batches, broadcasting, transposed views, 1-D
-- operands; the bias epilogue, sizes 1 and primes, f32/bf16/f16.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("matmul") then return end
local zr, T, randn, both = C.zr, C.T, C.randn, C.both

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
    for _, s in ipairs { { 1, 1, 1 }, { 7, 13, 5 }, { 127, 33, 65 }, { 3, 64, 257 }, { 1543, 37, 70 }, { 2100, 16, 264 } } do
      local rows, inn, out = s[1], s[2], s[3]
      both(("linear %dx%d->%d"):format(rows, inn, out), dt, { randn({ rows, inn }), randn({ out, inn }), randn({ out }) },
        zr.linear, 2)
      both(("linear no bias %dx%d->%d"):format(rows, inn, out), dt, { randn({ 2, rows, inn }), randn({ out, inn }) },
        zr.linear, 2)
    end
    both("linear with a transposed weight view", dt, { randn({ 9, 6 }), randn({ 6, 10 }) },
      function(x, w) return zr.linear(x, w:transpose(1, 2)) end, 2)
  end
end)

T.done()
