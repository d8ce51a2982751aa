-- linear_cross_entropy (the LM head + its loss, the logits made a slice of the vocabulary at a time): float64
-- finite differences (an independent check), and agreement with linear then cross_entropy (itself checked against
-- hand values, finite differences and PyTorch's goldens) over slice widths, dtypes, reductions, label smoothing,
-- ignored and all-ignored rows, 3-D inputs, a frozen weight or hidden state, gradients added into existing ones;
-- errors.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(11)

local function ids(t) return zr.tensor(t, { dtype = "i64" }) end
local function leaf(x) return x:detach():clone():requires_grad_(true) end
-- n targets over V classes, spread by a prime, some ignored (-100)
local function targets(n, V, ignored)
  local t = {}
  for i = 1, n do t[i] = (i * 7919 + 13) % V end
  for _, i in ipairs(ignored or {}) do t[i] = -100 end
  return t
end

T.test("gradcheck linear_cross_entropy (f64: slices, ignored rows, sum, label smoothing, 3-D)", function()
  local tg = ids(targets(6, 11, { 2, 5 }))
  local h, w = zr.randn({ 6, 4 }, { dtype = "f64", requires_grad = true }), zr.randn({ 11, 4 }, { dtype = "f64",
    requires_grad = true })
  for _, chunk in ipairs { 1, 3, 4, 11, 0 } do
    T.gradcheck(function(a, b) return zr.linear_cross_entropy(a, b, tg, { chunk = chunk }) end, { h, w })
  end
  T.gradcheck(function(a, b) return zr.linear_cross_entropy(a, b, tg, { chunk = 4, reduction = "sum" }) end, { h, w })
  T.gradcheck(function(a, b) return zr.linear_cross_entropy(a, b, tg, { chunk = 4, label_smoothing = 0.2 }) end,
    { h, w })
  local t3 = ids { { 0, 10, -100 }, { 4, 4, 7 } }
  T.gradcheck(function(a, b) return zr.linear_cross_entropy(a, b, t3, { chunk = 5 }) end,
    { zr.randn({ 2, 3, 4 }, { dtype = "f64", requires_grad = true }), w })
end)

-- The loss and both gradients of linear_cross_entropy(h, w, t, o) vs cross_entropy(linear(h, w), t, o).
local function against_composition(h0, w0, t, o, tol, what)
  local h1, w1, h2, w2 = leaf(h0), leaf(w0), leaf(h0), leaf(w0)
  local o1 = { reduction = o.reduction, label_smoothing = o.label_smoothing, ignore_index = o.ignore_index }
  local l1 = zr.cross_entropy(zr.linear(h1, w1), t, o1)
  l1:backward()
  local l2 = zr.linear_cross_entropy(h2, w2, t, o)
  l2:backward()
  T.near(l2:item(), l1:item(), tol[1], tol[1], what .. " loss")
  local sh, sw = h1.grad:abs():max():item(), w1.grad:abs():max():item()
  T.near(h2.grad:to("f64"), h1.grad:to("f64"), tol[2] * sh, 0, what .. " dh")
  T.near(w2.grad:to("f64"), w1.grad:to("f64"), tol[2] * sw, 0, what .. " dw")
end

-- The tolerances against the composition (f64: the same sums but for the slices' logsumexp merges and dh's order;
-- f32 alike; bf16: the logits and their gradient rounded where linear's output and cross_entropy's gradient round
-- them); N rows of D features over V classes (two of them ignored), and fn(dt, h, w, t, TOL[dt]) for each dtype.
local TOL = { f64 = { 1e-13, 1e-13 }, f32 = { 1e-6, 1e-5 }, bf16 = { 1e-6, 2e-3 } }
local N, D, V = 37, 24, 1000
local function each_dtype(fn)
  local t = ids(targets(N, V, { 3, 10 }))
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    fn(dt, (zr.randn({ N, D }) * 0.5):to(dt), (zr.randn({ V, D }) * 0.3):to(dt), t, TOL[dt])
  end
  return t
end

T.test("linear_cross_entropy = cross_entropy(linear(h, w)): dtypes, slices, reductions, smoothing", function()
  each_dtype(function(dt, h, w, t, tol)
    for _, chunk in ipairs { 1, 256, 333, 1000, 4096, 0 } do
      for _, red in ipairs { "mean", "sum" } do
        for _, eps in ipairs { 0, 0.1 } do
          against_composition(h, w, t, { chunk = chunk, reduction = red, label_smoothing = eps }, tol,
            ("%s chunk %d %s eps %g"):format(dt, chunk, red, eps))
        end
      end
    end
  end)
  -- 3-D h with 2-D targets, another ignore_index
  local t3 = ids { { 5, 999, 3 }, { 0, 3, 42 } }
  against_composition(zr.randn({ 2, 3, 8 }), zr.randn({ 1000, 8 }), t3, { chunk = 300, ignore_index = 3 }, TOL.f32,
    "3-D")
end)

T.test("keep: the counted rows' logits made once and kept for backward (no second product); keep = 0 makes them again", function()
  local t = each_dtype(function(dt, h, w, t, tol)
    for _, keep in ipairs { -1, 0, 10 ^ 9 } do
      local o = keep >= 0 and { keep = keep } or {}
      o.label_smoothing = 0.1
      against_composition(h, w, t, o, tol, ("%s keep %s"):format(dt, keep))
    end
  end)
  -- the same held bytes as keep = 0 plus the logits, where they are kept
  local h, w = leaf(zr.randn({ N, D })), leaf(zr.randn({ V, D }))
  -- the activations' bytes held from forward to backward (the node's saved tensors)
  local function held(o, no_grad)
    local a0 = zr.memory.stats().activations.current
    local l = no_grad and zr.no_grad(function() return zr.linear_cross_entropy(h, w, t, o) end) or
      zr.linear_cross_entropy(h, w, t, o)
    local d = zr.memory.stats().activations.current - a0
    if not no_grad then l:backward() end
    return d
  end
  local none = held { keep = 0 }
  T.eq(held {} - none, 35 * V * 4, "default: the 35 counted rows' logits (f32) held for backward")
  T.eq(held { keep = 35 * V * 4 } - none, 35 * V * 4, "keep = their bytes: kept")
  T.eq(held { keep = 35 * V * 4 - 1 }, none, "keep one byte less: made again in backward")
  T.eq(held { chunk = 1000 }, none, "chunk given: slices, made again")
  assert(held({}, true) < 35 * V * 4, "no grad: nothing kept")
  -- a backward that comes again (retain_graph) makes the logits again: the same gradients twice
  local hl, wl = leaf(h), leaf(w)
  local l = zr.linear_cross_entropy(hl, wl, t, { label_smoothing = 0.1 })
  l:backward(nil, true) -- (retain_graph)
  local g1, gw1 = hl.grad:clone(), wl.grad:clone()
  hl.grad, wl.grad = nil, nil
  l:backward()
  T.near(hl.grad, g1, 1e-6, 0, "dh, second backward")
  T.near(wl.grad, gw1, 1e-6, 0, "dw, second backward")
end)

T.test("linear_cross_entropy: every target ignored, a frozen weight, gradients added into existing ones", function()
  local h, w = leaf(zr.randn({ 4, 6 })), leaf(zr.randn({ 9, 6 }))
  local all = ids { -100, -100, -100, -100 }
  local l = zr.linear_cross_entropy(h, w, all, { chunk = 4 })
  assert(l:item() ~= l:item(), "mean over no targets is NaN (0/0, like torch)")
  T.near(zr.linear_cross_entropy(h, w, all, { reduction = "sum" }), 0)
  zr.linear_cross_entropy(h, w, all, { chunk = 4, reduction = "sum" }):backward()
  T.near(h.grad, zr.zeros({ 4, 6 }))
  T.near(w.grad, zr.zeros({ 9, 6 }))
  -- a frozen weight: h's gradient only (LoRA); a frozen h: the weight's only
  local t = ids { 1, 8, 0, 4 }
  local wf = w:detach()
  h.grad = nil
  zr.linear_cross_entropy(h, wf, t, { chunk = 4 }):backward()
  local h2 = leaf(h)
  zr.cross_entropy(zr.linear(h2, wf), t):backward()
  T.near(h.grad, h2.grad, 1e-6)
  w.grad = nil
  zr.linear_cross_entropy(h:detach(), w, t, { chunk = 4 }):backward()
  local w2 = leaf(w)
  zr.cross_entropy(zr.linear(h:detach(), w2), t):backward()
  T.near(w.grad, w2.grad, 1e-6, 1e-5)
  -- a second backward adds to the weight's gradient (gradient accumulation), and a tied use of w adds too
  zr.linear_cross_entropy(h:detach(), w, t, { chunk = 4 }):backward()
  T.near(w.grad, w2.grad * 2, 1e-6, 1e-5)
  w.grad, w2.grad = nil, nil
  local e = zr.tensor({ 3, 1 }, { dtype = "i64" })
  ;(zr.linear_cross_entropy(zr.embedding(w, e), w, ids { 2, 7 }, { chunk = 4 })):backward()
  zr.cross_entropy(zr.linear(zr.embedding(w2, e), w2), ids { 2, 7 }):backward()
  T.near(w.grad, w2.grad, 1e-6, 1e-5)
end)

T.test("linear_cross_entropy token_stats: logits_stats' entropy and argmax at the counted rows, 0 at ignored", function()
  local N, D, V = 29, 16, 700
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    local h, w = (zr.randn({ N, D }) * 0.7):to(dt), (zr.randn({ V, D }) * 0.5):to(dt)
    -- a tie for the largest logit across two slices (classes 2 and 649, 0-based: w's rows 3 and 650 made h's first
    -- row, tripled): row 1's argmax is the first of them. h's first row in halves, so both logits are exact sums
    -- whatever the order the GEMM adds them in (its edge tiles add in another order than its full ones)
    local r = {}
    for j = 1, D do r[j] = ((j * 7) % 9 - 4) / 2 end
    h[1] = zr.tensor(r):to(dt)
    w[3] = h[1] * 3
    w[650] = h[1] * 3
    local t = ids(targets(N, V, { 4, 9, 17 }))
    local e0, a0 = zr.logits_stats(zr.linear(h, w))
    for _, chunk in ipairs { 64, 333, 0 } do
      local what = ("%s chunk %d"):format(dt, chunk)
      local l, e, a = zr.linear_cross_entropy(h, w, t, { chunk = chunk, token_stats = true })
      T.near(l, zr.cross_entropy(zr.linear(h, w), t), 0, 1e-6, what .. " loss")
      local ef, af, e0f, a0f, tf = e:flat_table(), a:flat_table(), e0:flat_table(), a0:flat_table(), t:flat_table()
      T.eq(af[1], 2, what .. " the first of two tied largest logits")
      for i = 1, N do
        if tf[i] == -100 then
          T.eq(ef[i], 0, what .. " ignored row's entropy")
          T.eq(af[i], 0, what .. " ignored row's argmax")
        else
          T.near(ef[i], e0f[i], dt == "f64" and 1e-12 or 2e-5, 1e-5, what .. " entropy row " .. i)
          T.eq(af[i], a0f[i], what .. " argmax row " .. i)
        end
      end
    end
  end
end)

T.test("linear_cross_entropy refuses what it cannot do, in one line", function()
  local h, w, t = zr.randn({ 3, 4 }), zr.randn({ 5, 4 }), ids { 0, 1, 2 }
  T.raises(function() zr.linear_cross_entropy(h, w:to("bf16"), t) end, "h is f32 and w is bf16; give them one dtype")
  T.raises(function() zr.linear_cross_entropy(h, zr.randn({ 5, 3 }), t) end, "expected h (..., D) and w (V, D)")
  T.raises(function() zr.linear_cross_entropy(h, w, ids { 0, 1 }) end, "do not match")
  T.raises(function() zr.linear_cross_entropy(h, w, t, { reduction = "none" }) end, "reduction must be 'mean' or 'sum'")
  T.raises(function() zr.linear_cross_entropy(h, w, ids { 0, 5, 1 }) end, "target 5 (at flat position 2) is out of range")
  T.raises(function() zr.linear_cross_entropy(h, w, t, { chunk = 2.5 }) end, "chunk must be a whole number")
  T.raises(function() zr.linear_cross_entropy(h, w, t, { chunks = 2 }) end, "chunks")
  T.raises(function() zr.linear_cross_entropy(h, w, zr.tensor({ 0, 1, 2 })) end, "targets must be i64 or i32")
  T.raises(function() zr.linear_cross_entropy(h, w, t, { label_smoothing = 2 }) end, "label_smoothing must be in [0, 1]")
end)

T.done()
