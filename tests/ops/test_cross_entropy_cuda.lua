-- Fused cross_entropy on CUDA vs the CPU: ignore_index, mean/sum/none, a large vocabulary,
-- bf16 logits, label smoothing, inplace.
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
end)

-- Label smoothing (torch's label_smoothing, Hugging Face's LabelSmoother) in the kernels: loss and
-- gradient against the CPU's, every reduction, an ignored row; V = 1001 and 50257 take the scalar
-- path (neither is a multiple of 4 or 8 elements), 1000 and 50304 the 16-byte one.
T.test("cross_entropy label smoothing: mean/sum/none, ignored rows, scalar and vector paths, bf16", function()
  for _, dt in ipairs { "f32", "bf16" } do
    for _, s in ipairs { { 1, 5 }, { 33, 1001 }, { 16, 1000 }, { 5, 50257 }, { 4, 50304 } } do
      local N, C = s[1], s[2]
      zr.manual_seed(N * 7 + C)
      local tgt = (zr.rand({ N }) * C):to("i64")
      if N > 1 then tgt[2] = -100 end -- an ignored row
      for _, eps in ipairs { 0.1, 0.3 } do
        for _, red in ipairs { "mean", "sum", "none" } do
          both(("cross_entropy %dx%d %s eps %g"):format(N, C, red, eps), dt, { randn({ N, C }) * 2, tgt },
            function(x, t)
              return zr.cross_entropy(x, t, { ignore_index = -100, reduction = red, label_smoothing = eps })
            end, 2)
        end
      end
    end
  end
  T.raises(function() return zr.cross_entropy(randn({ 3, 4 }):cuda(), zr.zeros({ 3 }, { dtype = "i64", device = "cuda" }),
    { label_smoothing = 1.5 }) end, "label_smoothing must be in [0, 1]")
end)

-- With inplace = true the CUDA forward makes the logits' gradient (for the seed the hint promises:
-- zr.set_loss_grad_hint, default 1) in the same pass and writes it over the logits; backward hands
-- it on when the seed is the hint and rescales it when another seed comes. References: the plain
-- CUDA op (the gradient made in backward from the saved logits: the same bits when the seed is
-- the hint) and the CPU's inplace op (tests/ops/test_cross_entropy_inplace.lua checks it against
-- the plain CPU op).
local CE = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cross_entropy_common.lua")
local function run(x, tgt, red, inplace, hint, seeds, dev, eps)
  local l, g, xa = CE.run(x, tgt, { ignore_index = -100, reduction = red, inplace = inplace, label_smoothing = eps },
    seeds, hint, dev)
  return l, g:cpu():float(), xa:cpu():float()
end
local function maxdiff(a, b) return (a - b):abs():max():item() end

T.test("cross_entropy inplace: the seed as hinted, another seed, retain_graph, the CPU's inplace, smoothing", function()
  for _, dt in ipairs { "bf16", "f32" } do
    -- { N, V, label smoothing tried besides 0 }
    for _, s in ipairs { { 64, 50304, 0.1 }, { 33, 1001, 0.3 }, { 7, 128256, 0.1 }, { 5, 77, 0.3 }, { 5, 50257, 0.1 } } do
      local N, V = s[1], s[2]
      zr.manual_seed(N + V)
      local x = (randn({ N, V }) * 3):to(dt)
      local tgt = (zr.rand({ N }) * V):to("i64")
      tgt[2], tgt[N] = -100, -100 -- ignored rows: zero gradient
      for _, eps in ipairs { 0, s[3] } do
        for _, red in ipairs { "mean", "sum" } do
          local what = ("%s %dx%d %s eps %g"):format(dt, N, V, red, eps)
          -- the seed the hint promised: the same loss and the same bits as the plain op; the
          -- logits now hold that gradient
          for _, h in ipairs { 1, 0.125 } do
            local l0, g0 = run(x, tgt, red, false, h, { h }, "cuda", eps)
            local l1, g1, x1 = run(x, tgt, red, true, h, { h }, "cuda", eps)
            T.eq(l1, l0, what .. " loss, hint " .. h)
            T.eq(maxdiff(g1, g0), 0, what .. " gradient, seed = hint " .. h)
            T.eq(maxdiff(x1, g1), 0, what .. " the logits hold the gradient")
          end
          -- another seed: rescaled (one more rounding of the 16-bit gradient)
          local tol = dt == "bf16" and 1e-2 or 1e-6
          local _, want = run(x, tgt, red, false, nil, { 3 }, "cuda", eps)
          local _, got = run(x, tgt, red, true, 1, { 3 }, "cuda", eps)
          local scale = want:abs():max():item()
          assert(scale > 0, what .. ": the reference gradient is zero")
          assert(maxdiff(got, want) <= tol * scale, ("%s seed 3 under hint 1: off by %g (scale %g)"):format(what,
            maxdiff(got, want), scale))
          -- three times through the graph (retain_graph) with other seeds: the sum of the gradients
          _, want = run(x, tgt, red, false, nil, { 0.5, 2, 0.25 }, "cuda", eps)
          _, got = run(x, tgt, red, true, 0.5, { 0.5, 2, 0.25 }, "cuda", eps)
          assert(maxdiff(got, want) <= tol * scale, what .. ": retain_graph with seeds 0.5, 2, 0.25 differs")
          T.eq(got:narrow(1, 2, 1):abs():max():item() + got:narrow(1, N, 1):abs():max():item(), 0,
            what .. " ignored rows get no gradient")
          -- the CPU's inplace op agrees
          local lc, gc = run(x, tgt, red, true, 1, { 3 }, "cpu", eps)
          local lg, gg = run(x, tgt, red, true, 1, { 3 }, "cuda", eps)
          T.near(lg, lc, 0, 1e-4, what .. " loss vs the CPU") -- fp32 sums of 128256 exps in other orders: ~1e-5
          if dt == "f32" then -- the kernels' __expf against the CPU's expf: ~1e-5 of the scale (H200: 6e-6 over)
            local sc = gc:abs():max():item()
            assert(maxdiff(gg, gc) <= 1e-4 * sc, ("%s gradient vs the CPU: off by %g (scale %g)"):format(what,
              maxdiff(gg, gc), sc))
          else
            C.close_big(gg, gc, dt, what .. " gradient vs the CPU")
          end
        end
      end
    end
  end
  -- not recorded (no_grad, or logits that need no gradient): the plain op, the logits untouched
  local x, t = randn({ 5, 9 }):cuda(), zr.tensor({ 1, 2, 3, 4, 5 }):to("i64"):cuda()
  local before = x:cpu()
  local a = zr.cross_entropy(x, t):item()
  T.eq(zr.cross_entropy(x, t, { inplace = true }):item(), a, "logits that need no gradient")
  local xg = x:clone():detach()
  xg.requires_grad = true
  T.eq(zr.no_grad(function() return zr.cross_entropy(xg, t, { inplace = true }):item() end), a, "no_grad")
  T.eq(maxdiff(x:cpu(), before) + maxdiff(xg:detach():cpu(), before), 0, "the logits untouched")
  T.raises(function() zr.cross_entropy(xg:transpose(1, 2), zr.zeros({ 9 }, { dtype = "i64", device = "cuda" }),
    { inplace = true }) end, "needs them contiguous")
end)

-- GPT-2's padded head on the GPU (50257 -> a multiple of 64, the padding's logits -1e30): the
-- training forward's in-place loss against the unfused composition (the logits of a forward
-- without labels, scored by causal_lm_loss), loss and gradients; out.logits made again lazily.
T.test("gpt2 padded head on CUDA: in-place loss = unfused loss and gradients; lazy logits; smoothing over V", function()
  for _, dt in ipairs { "f32", "bf16" } do
    zr.manual_seed(5)
    local m = zr.models.gpt2.GPT2LMHeadModel { n_embd = 32, n_layer = 1, n_head = 2, vocab_size = 1001,
      n_positions = 32, dtype = dt, device = "cuda" }
    local ids = (zr.rand({ 2, 17 }) * 1000):to("i64"):cuda()
    local logits = m(ids).logits
    local want = zr.models.llama.causal_lm_loss(logits, ids)
    want:backward()
    local wg = {}
    for n, p in m:named_parameters() do wg[n] = p.grad:cpu():float(); p.grad = nil end
    local out = m(ids, ids)
    T.near(out.loss, want:item(), 0, dt == "bf16" and 1e-3 or 1e-6, dt .. " loss")
    out.loss:backward()
    for n, p in m:named_parameters() do C.close_big(p.grad, wg[n], dt, dt .. " grad " .. n) end
    T.eq(rawget(out, "logits"), nil, dt .. ": out.logits made on read")
    T.eq(maxdiff(out.logits:cpu():float(), logits:cpu():float()), 0, dt .. ": lazy logits = the forward's")
    T.eq(out.logits:size(3), 1001, dt .. ": the first V logits")
    -- label smoothing spreads eps over the V real classes, not the padded head's extra columns
    local sw = zr.models.llama.causal_lm_loss(logits:detach():float(), ids, false, 0.1)
    local so = m(ids, ids, { label_smoothing = 0.1 })
    T.near(so.loss, sw:item(), 0, dt == "bf16" and 1e-3 or 1e-6, dt .. " smoothed loss over the V classes")
    so.loss:backward()
    for _, p in m:named_parameters() do
      assert(p.grad:float():abs():sum():item() > 0, dt .. ": smoothed loss has gradients"); p.grad = nil
    end
  end
end)

T.test("logits_stats on CUDA as on the CPU: entropy and argmax per row, vectorised and not, f32 / bf16 / f16", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, s in ipairs { { 3, 7 }, { 17, 1000 }, { 9, 32003 }, { 4, 128256 } } do
      zr.manual_seed(s[1] + s[2])
      local x = (zr.randn({ s[1], s[2] }) * 3):to(dt)
      local ec, ac = zr.logits_stats(x)
      local eg, ag = zr.logits_stats(x:cuda())
      C.close(eg:cpu(), ec, "f32", ("logits_stats %s %dx%d entropy"):format(dt, s[1], s[2]), 4)
      T.eq_list(ag:cpu():flat_table(), ac:flat_table(), ("logits_stats %s %dx%d argmax"):format(dt, s[1], s[2]))
    end
  end
end)

T.done()
