-- Causal GQA scaled_dot_product_attention: a naive reference on Lua tables, T = 1, causality,
-- float64 finite-difference gradient checks at awkward sizes, O(T) saved per head, bf16, errors.
local zr = require "zrun"
local T = zr.testing
local sqrt = math.sqrt
zr.manual_seed(11)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
local function c(...) return zr.randn({ ... }, { dtype = "f64" }) end

-- ---------------------------------------------------------------- attention

local attention_ref = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "attention_ref.lua")

-- The naive reference over (B, H, T, Dh) tensors: a flat table of the output.
local function ref_attention(q, k, v, B, Hq, Hkv, Tn, Dh, scale)
  local fq, fk, fv, out = q:flat_table(), k:flat_table(), v:flat_table(), {}
  local function at(t, H) return function(b, h, i, e) return t[((b * H + h) * Tn + i) * Dh + e + 1] end end
  attention_ref(at(fq, Hq), at(fk, Hkv), at(fv, Hkv), function(b, h, i, e, x) out[((b * Hq + h) * Tn + i) * Dh + e + 1] = x end,
    B, Hq, Hkv, Tn, Dh, scale)
  return out
end

T.test("attention matches a naive reference", function()
  local B, Hq, Hkv, Tn, Dh = 2, 6, 2, 7, 5
  local q, k, v = c(B, Hq, Tn, Dh), c(B, Hkv, Tn, Dh), c(B, Hkv, Tn, Dh)
  T.near(zr.scaled_dot_product_attention(q, k, v), ref_attention(q, k, v, B, Hq, Hkv, Tn, Dh, 1 / sqrt(Dh)), 1e-13)
  T.near(q:scaled_dot_product_attention(k, v, { scale = 0.3 }), ref_attention(q, k, v, B, Hq, Hkv, Tn, Dh, 0.3), 1e-13)
  local y32 = zr.scaled_dot_product_attention(q:float(), k:float(), v:float(), 0.3)
  T.eq(y32:dtype(), "f32")
  T.near(y32, ref_attention(q, k, v, B, Hq, Hkv, Tn, Dh, 0.3), 1e-5)
end)

T.test("attention with T=1 returns v", function()
  local q, k, v = c(2, 6, 1, 5), c(2, 2, 1, 5), c(2, 2, 1, 5)
  local y = zr.scaled_dot_product_attention(q, k, v)
  -- query head h reads kv head floor(h/3)
  for b = 1, 2 do
    for h = 1, 6 do T.near(y[b][h], v[b][math.floor((h - 1) / 3) + 1], 0) end
  end
end)

T.test("attention is causal", function()
  local q, k, v = c(1, 2, 6, 4), c(1, 1, 6, 4), c(1, 1, 6, 4)
  local y1 = zr.scaled_dot_product_attention(q, k, v)
  local k2, v2 = k:clone(), v:clone()
  for e = 1, 4 do
    k2:set_flat(4 * 4 + e, 5 * e) -- position 5 (1-based) of the only kv head
    v2:set_flat(4 * 4 + e, -7 * e)
  end
  local y2 = zr.scaled_dot_product_attention(q, k2, v2)
  for h = 1, 2 do
    T.near(y2[1][h]:narrow(1, 1, 4), y1[1][h]:narrow(1, 1, 4), 0, 0, "earlier positions")
    local d = T.diff(y2[1][h]:narrow(1, 5, 2), y1[1][h]:narrow(1, 5, 2))
    assert(d > 1e-3, "later positions must change")
  end
end)

T.test("gradcheck attention (GQA and MHA, awkward sizes)", function()
  local f = function(q, k, v) return zr.scaled_dot_product_attention(q, k, v) end
  T.gradcheck(f, { r(2, 6, 7, 5), r(2, 2, 7, 5), r(2, 2, 7, 5) })
  T.gradcheck(f, { r(1, 6, 7, 6), r(1, 6, 7, 6), r(1, 6, 7, 6) })
  T.gradcheck(f, { r(2, 6, 1, 5), r(2, 2, 1, 5), r(2, 2, 1, 5) })
  T.gradcheck(function(q, k, v) return q:scaled_dot_product_attention(k, v, 0.7) end,
    { r(1, 3, 4, 3), r(1, 1, 4, 3), r(1, 1, 4, 3) })
  -- only some inputs requiring grad
  T.gradcheck(f, { r(1, 2, 5, 3), c(1, 1, 5, 3), r(1, 1, 5, 3) })
end)

T.test("attention saves O(T) per head, not T x T", function()
  local Tn, Dh = 256, 4
  local q = zr.randn(1, 1, Tn, Dh, { requires_grad = true })
  local k, v = zr.randn(1, 1, Tn, Dh), zr.randn(1, 1, Tn, Dh)
  collectgarbage(); collectgarbage()
  local before = zr.memory_stats().activations.current
  local y = zr.scaled_dot_product_attention(q, k, v)
  local grown = zr.memory_stats().activations.current - before
  -- output (T*Dh floats) + logsumexp (T floats); a saved T x T matrix would be 256 KiB
  assert(grown <= (Tn * Dh + Tn) * 4 + 1024, "activations grew by " .. grown .. " bytes")
  y:sum():backward()
  T.eq(#q.grad:shape(), 4)
end)

T.test("attention bf16 and errors", function()
  local q, k, v = zr.randn(1, 4, 5, 8), zr.randn(1, 2, 5, 8), zr.randn(1, 2, 5, 8)
  local yb = zr.scaled_dot_product_attention(q:bfloat16(), k:bfloat16(), v:bfloat16())
  T.eq(yb:dtype(), "bf16")
  T.near(yb:float(), zr.scaled_dot_product_attention(q, k, v), 0.05, 0.02)
  T.raises(function()
    zr.scaled_dot_product_attention(zr.randn(1, 32, 2, 4), zr.randn(1, 6, 2, 4), zr.randn(1, 6, 2, 4))
  end, "sdpa: q has 32 heads, not a multiple of k's 6")
  T.raises(function() zr.scaled_dot_product_attention(q, k, zr.randn(1, 2, 4, 8)) end, "must have the same shape")
  T.raises(function() zr.scaled_dot_product_attention(q, k, v, { is_causal = false }) end, "only causal")
end)

T.done()
