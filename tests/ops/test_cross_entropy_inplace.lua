-- cross_entropy with inplace = true against the plain op (the reference: its gradient is made in
-- backward from the saved logits and is checked by finite differences in test_cross_entropy.lua):
-- the loss, the gradient for the hinted seed (bit for bit), another seed (rescaled), retain_graph,
-- the logits left alone when nothing is recorded, the loss-gradient hint, and the errors.
local zr = require "zrun"
local T = zr.testing

local function ids(t) return zr.tensor(t, { dtype = "i64" }) end
local function maxdiff(a, b) return (a:double() - b:double()):abs():max():item() end

local CE = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cross_entropy_common.lua")
-- Through a producer (y = x * 2, what a head's matmul is to the logits): the gradient travels on.
local function run(x0, tgt, o, seeds, hint) return CE.run(x0, tgt, o, seeds, hint, nil, function(x) return x * 2 end) end

local function opts(red, inplace, extra)
  local o = { ignore_index = -100, reduction = red, inplace = inplace }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

T.test("inplace: loss and gradient equal the plain op's (mean/sum, ignore_index, seeds, dtypes)", function()
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    for _, s in ipairs { { 1, 5 }, { 7, 13 }, { 29, 1001 } } do
      local N, V = s[1], s[2]
      zr.manual_seed(N * 31 + V)
      local x = (zr.randn({ N, V }) * 3):to(dt)
      local tgt = (zr.rand({ N }) * V):to("i64")
      if N > 1 then tgt[2], tgt[N] = -100, -100 end -- ignored rows: zero gradient
      for _, red in ipairs { "mean", "sum" } do
        for _, ex in ipairs { {}, dt == "f64" and { label_smoothing = 0.1 } or nil } do
          local what = ("%s %dx%d %s%s"):format(dt, N, V, red, ex.label_smoothing and " smoothing" or "")
          -- the seed the hint promised (1, and the engine's 1/8): the same loss, the same bits
          for _, h in ipairs { 1, 0.125 } do
            local l0, g0 = run(x, tgt, opts(red, false, ex), { h })
            local l1, g1 = run(x, tgt, opts(red, true, ex), { h }, h)
            T.eq(l1, l0, what .. " loss")
            T.eq(maxdiff(g1, g0), 0, what .. " gradient, seed = hint " .. h)
          end
          -- another seed: the gradient rescaled in place (one more rounding)
          local tol = dt == "bf16" and 1e-2 or dt == "f32" and 1e-6 or 1e-13
          local _, want = run(x, tgt, opts(red, false, ex), { 3 })
          local _, got = run(x, tgt, opts(red, true, ex), { 3 }, 1)
          local scale = want:abs():max():item()
          assert(scale > 0, what .. ": the reference gradient is zero")
          local d = maxdiff(got, want)
          assert(d <= tol * scale, ("%s seed 3 under hint 1: off by %g (scale %g)"):format(what, d, scale))
          -- retain_graph: twice through the graph with other seeds, the sum of both gradients
          _, want = run(x, tgt, opts(red, false, ex), { 0.5, 2, 0.25 })
          _, got = run(x, tgt, opts(red, true, ex), { 0.5, 2, 0.25 }, 0.5)
          d = maxdiff(got, want)
          assert(d <= tol * scale, ("%s retain_graph seeds 0.5, 2, 0.25: off by %g"):format(what, d))
          if N > 1 then
            T.eq(got:narrow(1, 2, 1):abs():max():item() + got:narrow(1, N, 1):abs():max():item(), 0,
              what .. " ignored rows get no gradient")
          end
        end
      end
    end
  end
end)

T.test("inplace: the gradient is written over the logits during the forward", function()
  local x = zr.tensor({ { 1, 2, 3 }, { 1, 3, 0 } }, { dtype = "f64" })
  local y = x:clone():detach()
  y.requires_grad = true
  local l = zr.cross_entropy(y, ids { 2, -100 }, { inplace = true })
  -- by hand: the mean over one counted row, so softmax(row 1) - onehot(2); row 2 ignored
  local z = math.exp(1) + math.exp(2) + math.exp(3)
  T.near(y:detach(), { math.exp(1) / z, math.exp(2) / z, math.exp(3) / z - 1, 0, 0, 0 }, 1e-15)
  T.near(l, math.log(z) - 3, 1e-15)
  l:backward()
  T.near(y.grad, { math.exp(1) / z, math.exp(2) / z, math.exp(3) / z - 1, 0, 0, 0 }, 1e-15)
  -- (B, T, V) logits (a contiguous 3-D tensor) and a zero-row batch
  local x3 = zr.randn({ 2, 3, 7 })
  local t3 = ids { { 0, 6, -100 }, { 2, 3, 1 } }
  local l0, g0 = run(x3, t3, { inplace = false }, { 1 })
  local l1, g1 = run(x3, t3, { inplace = true }, { 1 })
  T.eq(l1, l0, "3-D loss")
  T.eq(maxdiff(g1, g0), 0, "3-D gradient")
  local e = zr.zeros({ 0, 5 }, { requires_grad = true })
  zr.cross_entropy(e, zr.zeros({ 0 }, { dtype = "i64" }), { reduction = "sum", inplace = true }):backward()
  T.eq(e.grad:numel(), 0, "no rows")
end)

T.test("inplace: nothing recorded (no_grad, logits needing no gradient) leaves the logits as they are", function()
  local x = zr.randn({ 5, 9 })
  local before = x:clone()
  local t = ids { 1, 2, 3, -100, 8 }
  local plain = zr.cross_entropy(x, t):item()
  T.eq(zr.cross_entropy(x, t, { inplace = true }):item(), plain, "logits that need no gradient")
  T.eq(maxdiff(x, before), 0, "logits untouched (no gradient wanted)")
  local xg = x:clone():detach()
  xg.requires_grad = true
  local l = zr.no_grad(function() return zr.cross_entropy(xg, t, { inplace = true }) end)
  T.eq(l:item(), plain, "under no_grad")
  T.eq(maxdiff(xg:detach(), before), 0, "logits untouched (no_grad)")
end)

T.test("inplace errors and the loss-gradient hint", function()
  local x = zr.randn({ 4, 6 }, { requires_grad = true })
  local t = ids { 0, 1, 2, 3 }
  T.raises(function() zr.cross_entropy(x, t, { reduction = "none", inplace = true }) end,
    "cross_entropy: inplace needs reduction 'mean' or 'sum'")
  T.raises(function() zr.cross_entropy((x * 1):transpose(1, 2), zr.zeros({ 6 }, { dtype = "i64" }), { inplace = true }) end,
    "inplace writes the gradient over the logits and needs them contiguous")
  T.raises(function() zr.set_loss_grad_hint(0) end, "set_loss_grad_hint: the hint must be a finite non-zero number")
  T.raises(function() zr.set_loss_grad_hint(0 / 0) end, "finite non-zero")
  T.raises(function() zr.set_loss_grad_hint(math.huge) end, "finite non-zero")
  T.eq(zr.set_loss_grad_hint(0.25), 1, "the default hint is 1")
  T.eq(zr.set_loss_grad_hint(nil), 0.25, "the previous hint comes back")
  T.eq(zr.set_loss_grad_hint(nil), 1, "nil restores 1")
end)

T.done()
