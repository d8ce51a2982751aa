-- Fused cross_entropy on CUDA vs the CPU: ignore_index, mean/sum/none, a large vocabulary,
-- bf16 logits.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("cross_entropy") then return end
local zr, T, randn, both = C.zr, C.T, C.randn, C.both

T.test("cross_entropy (fused): ignore_index, mean/sum/none, large vocab, bf16 logits", function()
  for _, dt in ipairs { "f32", "bf16" } do
    for _, s in ipairs { { 1, 5 }, { 7, 13 }, { 127, 1000 }, { 13, 32003 } } do
      local N, C = s[1], s[2]
      zr.manual_seed(N * 7 + C)
      local tgt = (zr.rand({ N }) * C):to("i64")
      if N > 1 then tgt[2] = -100 end -- an ignored row
      for _, red in ipairs { "mean", "sum", "none" } do
        both(("cross_entropy %dx%d %s"):format(N, C, red), dt, { randn({ N, C }) * 2, tgt },
          function(x, t) return zr.cross_entropy(x, t, { ignore_index = -100, reduction = red }) end, 2)
      end
    end
  end
  -- (B, T, V) logits with (B, T) i32 targets; another ignore_index
  local t3 = (zr.rand({ 2, 5 }) * 11):to("i32")
  t3[1][2] = 3
  both("cross_entropy 3-D i32 targets", "f32", { randn({ 2, 5, 11 }), t3 },
    function(x, t) return zr.cross_entropy(x, t, { ignore_index = 3 }) end)
  -- every target ignored: mean is NaN like torch (and the CPU)
  local all = zr.full({ 4 }, -100, { dtype = "i64" })
  local l = zr.cross_entropy(randn({ 4, 6 }):cuda(), all:cuda())
  assert(l:item() ~= l:item(), "mean over no targets is NaN")
  T.raises(function() return zr.cross_entropy(randn({ 3, 4 }):cuda(), zr.zeros({ 3 }, { dtype = "i64", device = "cuda" }),
    { label_smoothing = 0.1 }) end, "label_smoothing is not supported on CUDA")
end)

T.done()
