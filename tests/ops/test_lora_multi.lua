-- zr.lora_multi: frozen projections that read one input with LoRA adapters, as one op. References are
-- independent: PEFT's LoraLayer written out with zr.linear, zr.dropout, a scale and an add per projection
-- (the composition zrun ran before), float64 central differences, and the generator's stream.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(43)

local IN, OUTS, R = 11, { 6, 3, 3 }, { 4, 0, 2 } -- q, k (plain: no adapter), v
local function f64(shape) return zr.randn(shape, { dtype = "f64" }) end
local function leaf(t) return t:detach():requires_grad_(true) end

-- frozen bases (separate, or back to back in one buffer), biases or not, adapters where R[i] > 0
local function make(dt, adjacent, with_bias)
  local ws, bs, As, Bs, ss = {}, with_bias and {} or nil, {}, {}, {}
  local flat = adjacent and zr.randn({ (OUTS[1] + OUTS[2] + OUTS[3]) * IN }):to(dt)
  local off = 0
  for i, o in ipairs(OUTS) do
    ws[i] = adjacent and flat:narrow(1, off + 1, o * IN):view(o, IN) or zr.randn({ o, IN }):to(dt)
    off = off + o * IN
    if bs then bs[i] = zr.randn({ o }):to(dt) end
    As[i] = R[i] > 0 and leaf(zr.randn({ R[i], IN }):to(dt)) or false
    Bs[i] = R[i] > 0 and leaf(zr.randn({ o, R[i] }):to(dt)) or false
    ss[i] = R[i] > 0 and 2 / R[i] or 0
  end
  return ws, bs, As, Bs, ss
end

-- PEFT's LoraLayer per projection: base(x) + lora_B(lora_A(dropout(x))) * scaling, concatenated
local function reference(x, ws, bs, As, Bs, ss, p, training)
  local ys = {}
  for i, w in ipairs(ws) do
    local y = zr.linear(x, w, bs and bs[i])
    if As[i] then
      local a = (p > 0 and training) and zr.dropout(x, p, true) or x
      y = y + zr.linear(zr.linear(a, As[i]), Bs[i]) * ss[i]
    end
    ys[i] = y
  end
  return zr.cat(ys, -1)
end

-- y and the gradients of sum(y * gy) for x and every adapter, from the same seed
local function run(fn, x0, ws, bs, As0, Bs0, ss, p, gy, training)
  local x = leaf(x0)
  local As, Bs = {}, {}
  for i = 1, #ws do As[i] = As0[i] and leaf(As0[i]); Bs[i] = Bs0[i] and leaf(Bs0[i]) end
  zr.manual_seed(99)
  local y = fn(x, ws, bs, As, Bs, ss, p, training ~= false)
  ;(y * gy):sum():backward()
  local after = zr.rand({ 1 }):item() -- the generator's position after the forward
  local out = { y = y, x = x.grad, after = after }
  for i = 1, #ws do if As[i] then out["A" .. i], out["B" .. i] = As[i].grad, Bs[i].grad end end
  return out
end

T.test("lora_multi equals PEFT's LoraLayer per projection (f64, f32, bf16; dropout 0 / 0.3; bias; adjacent bases)",
  function()
    for _, dt in ipairs { "f64", "f32", "bf16" } do
      local tol = ({ f64 = 1e-12, f32 = 2e-5, bf16 = 4e-2 })[dt]
      for _, p in ipairs { 0, 0.3 } do
        for _, adjacent in ipairs { false, true } do
          local ws, bs, As, Bs, ss = make(dt, adjacent, adjacent)
          local x0, gy = zr.randn({ 2, 5, IN }):to(dt), zr.randn({ 2, 5, 12 }):to(dt)
          local got = run(zr.lora_multi, x0, ws, bs, As, Bs, ss, p, gy)
          local want = run(reference, x0, ws, bs, As, Bs, ss, p, gy)
          local what = ("%s p=%g %s"):format(dt, p, adjacent and "adjacent+bias" or "separate")
          T.eq(got.y:dtype(), dt, what .. " dtype")
          T.eq(table.concat(got.y:shape(), ","), "2,5,12", what .. " shape")
          for _, k in ipairs { "y", "x", "A1", "B1", "A3", "B3" } do T.near(got[k], want[k], tol, tol, what .. " " .. k) end
          T.eq(got.A2, nil, what .. ": no adapter on the plain projection")
          T.eq(got.after, want.after, what .. ": the generator moved as one dropout per adapter moves it")
        end
      end
    end
  end)

T.test("lora_multi: no dropout outside training, and the generator untouched", function()
  local ws, bs, As, Bs, ss = make("f64", false, false)
  local x0, gy = f64({ 3, IN }), f64({ 3, 12 })
  local got = run(zr.lora_multi, x0, ws, bs, As, Bs, ss, 0.5, gy, false)
  local want = run(reference, x0, ws, bs, As, Bs, ss, 0, gy)
  for _, k in ipairs { "y", "x", "A1", "B3", "after" } do T.near(got[k], want[k], 1e-12, 1e-12, k) end
end)

T.test("gradcheck lora_multi (f64; x and adapters; without and with dropout, one mask per evaluation)", function()
  local ws, bs, As, Bs, ss = make("f64", false, true)
  local x = leaf(f64({ 2, 3, IN }))
  for _, p in ipairs { 0, 0.4 } do
    T.gradcheck(function(xx, a1, b1, a3, b3)
      zr.manual_seed(7) -- the same masks at every evaluation
      return zr.lora_multi(xx, ws, bs, { a1, false, a3 }, { b1, false, b3 }, ss, p, true)
    end, { x, leaf(As[1]), leaf(Bs[1]), leaf(As[3]), leaf(Bs[3]) })
  end
  -- x needs no gradient (the first layer's input under a frozen embedding)
  T.gradcheck(function(a1, b1)
    return zr.lora_multi(x:detach(), { ws[1] }, nil, { a1 }, { b1 }, { 0.5 }, 0, true)
  end, { leaf(As[1]), leaf(Bs[1]) })
end)

T.test("lora_multi adds into existing adapter gradients in place", function()
  local ws, bs, As, Bs, ss = make("f64", true, false)
  local x, gy = f64({ 4, IN }), f64({ 4, 12 })
  local want = run(reference, x, ws, bs, As, Bs, ss, 0.2, gy)
  local a, b = leaf(As[1]), leaf(Bs[1])
  local a3, b3 = leaf(As[3]), leaf(Bs[3])
  local ga, gb = f64(a:shape()), f64(b:shape())
  local ga0, gb0 = ga:clone(), gb:clone()
  a.grad, b.grad = ga, gb
  zr.manual_seed(99)
  ;(zr.lora_multi(x, ws, nil, { a, false, a3 }, { b, false, b3 }, ss, 0.2, true) * gy):sum():backward()
  T.eq(a.grad == ga and b.grad == gb, true, "the same gradient tensors, written in place")
  T.near(a.grad, ga0 + want.A1, 1e-12, 1e-12, "A1 added to")
  T.near(b.grad, gb0 + want.B1, 1e-12, 1e-12, "B1 added to")
  T.near(a3.grad, want.A3, 1e-12, 1e-12, "A3 fresh")
end)

T.test("lora_multi with frozen adapters (PEFT's inference_mode): x's gradient only, or no node at all", function()
  local ws, bs, As, Bs, ss = make("f64", false, false)
  local fa, fb = { As[1]:detach(), false, As[3]:detach() }, { Bs[1]:detach(), false, Bs[3]:detach() }
  local x0, gy = f64({ 3, IN }), f64({ 3, 12 })
  local function grads(fn)
    local x = leaf(x0)
    zr.manual_seed(5)
    local y = fn(x, ws, nil, fa, fb, ss, 0.25, true)
    ;(y * gy):sum():backward()
    return y, x.grad
  end
  local yw, gw = grads(reference)
  local yg, gg = grads(zr.lora_multi)
  T.near(yg, yw, 1e-12, 1e-12, "y")
  T.near(gg, gw, 1e-12, 1e-12, "x's gradient through frozen adapters")
  T.eq(fa[1].grad == nil and fb[3].grad == nil, true, "no gradient for a frozen adapter")
  local y = zr.lora_multi(x0, ws, nil, fa, fb, ss, 0, true)
  T.eq(y.requires_grad, false, "nothing needs a gradient: no node")
end)

T.test("lora_multi refuses what it does not take, saying why", function()
  local ws, bs, As, Bs, ss = make("f32", false, false)
  local x = zr.randn({ 2, IN })
  local trained = { leaf(ws[1]), ws[2], ws[3] }
  T.raises(function() zr.lora_multi(x, trained, nil, As, Bs, ss, 0, true) end, "base projection 1 requires a gradient")
  T.raises(function() zr.lora_multi(x, ws, nil, { As[1], false, false }, { false, false, Bs[3] }, ss, 0, true) end,
    "projection 1 has lora_A without lora_B")
  T.raises(function() zr.lora_multi(x, ws, nil, { zr.randn({ 4, 5 }), false, false }, { Bs[1], false, false }, ss, 0,
    true) end, "lora_A 1 must be (r, 11), got (4,5)")
  T.raises(function() zr.lora_multi(x, ws, nil, { As[1], false, false }, { Bs[3], false, false }, ss, 0, true) end,
    "lora_B 1 must be (6, 4) for weight (6,11) and lora_A (4,11), got (3,2)")
  T.raises(function() zr.lora_multi(x, ws, nil, As, Bs, ss, 1, true) end, "dropout p must be in [0, 1)")
  T.raises(function() zr.lora_multi(zr.randn({ 2, 5 }), ws, nil, As, Bs, ss, 0, true) end,
    "weight 1 must be (out_features, 5)")
  T.raises(function() zr.lora_multi(x, { ws[1], ws[2], ws[3], ws[1] }, nil, As, Bs, ss, 0, true) end,
    "expected 1 to 3 weights")
end)

T.done()
