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

-- Under a loss-gradient hint (zr.set_loss_grad_hint; default 1) the CUDA forward makes the logits'
-- gradient in the same pass; backward hands it on when the seed is the hint (nothing to redo) and
-- rescales it when another seed comes. The reference is the same op with no hint (the gradient
-- made in backward from the saved logits): equal bit for bit when the seed is the hint.
local function grad_of(x, tgt, red, hint, seeds, retain)
  local prev = zr.set_loss_grad_hint(hint)
  local xg = x:cuda():detach()
  xg.requires_grad = true
  local ok, err = pcall(function()
    local l = zr.cross_entropy(xg, tgt:cuda(), { ignore_index = -100, reduction = red })
    for i, s in ipairs(seeds) do
      local keep = retain and i < #seeds
      if s == 1 then l:backward(nil, keep) else (l * s):backward(nil, keep) end
    end
  end)
  zr.set_loss_grad_hint(prev)
  if not ok then error(err, 0) end
  return xg.grad:cpu():float()
end
local function maxdiff(a, b) return (a - b):abs():max():item() end

T.test("cross_entropy (fused with its gradient): the seed as hinted, another seed, retain_graph", function()
  for _, dt in ipairs { "bf16", "f32" } do
    for _, s in ipairs { { 64, 50304 }, { 33, 1001 }, { 7, 128256 } } do
      local N, V = s[1], s[2]
      zr.manual_seed(N + V)
      local x = (randn({ N, V }) * 3):to(dt)
      local tgt = (zr.rand({ N }) * V):to("i64")
      tgt[2], tgt[N] = -100, -100 -- ignored rows: zero gradient
      for _, red in ipairs { "mean", "sum" } do
        local what = ("%s %dx%d %s"):format(dt, N, V, red)
        -- the seed the hint promised: the same bits as the gradient made in backward
        T.eq(maxdiff(grad_of(x, tgt, red, 1, { 1 }), grad_of(x, tgt, red, nil, { 1 })), 0, what .. " seed 1 = hint 1")
        T.eq(maxdiff(grad_of(x, tgt, red, 0.125, { 0.125 }), grad_of(x, tgt, red, nil, { 0.125 })), 0,
          what .. " seed 1/8 = hint 1/8")
        -- another seed: rescaled (one more rounding of the 16-bit gradient)
        local tol = dt == "bf16" and 1e-2 or 1e-6
        local want = grad_of(x, tgt, red, nil, { 3 })
        local got = grad_of(x, tgt, red, 1, { 3 })
        local scale = want:abs():max():item()
        assert(scale > 0, what .. ": the reference gradient is zero")
        assert(maxdiff(got, want) <= tol * scale, ("%s seed 3 under hint 1: off by %g (scale %g)"):format(what,
          maxdiff(got, want), scale))
        -- twice through the graph (retain_graph) with different seeds: the sum of both gradients
        want = grad_of(x, tgt, red, nil, { 0.5, 2 }, true)
        got = grad_of(x, tgt, red, 0.5, { 0.5, 2 }, true)
        assert(maxdiff(got, want) <= tol * scale, what .. ": retain_graph with seeds 0.5 then 2 differs")
        local rows = got:narrow(1, 2, 1):abs():max():item() + got:narrow(1, N, 1):abs():max():item()
        T.eq(rows, 0, what .. " ignored rows get no gradient")
      end
    end
  end
  -- no gradient wanted (no_grad, or logits that do not require grad): nothing made, the loss the same
  local x, t = randn({ 5, 9 }):cuda(), zr.tensor({ 1, 2, 3, 4, 5 }):to("i64"):cuda()
  local a = zr.cross_entropy(x, t):item()
  local b = zr.no_grad(function() return zr.cross_entropy(x, t):item() end)
  T.eq(a, b, "loss without a gradient")
end)

T.done()
