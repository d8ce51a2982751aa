-- Transformer layer ops (rms_norm, layer_norm, rope + rope_tables, causal GQA attention, dropout,
-- cat/split, where/masked_fill, comparisons): float64 finite-difference gradchecks at awkward
-- sizes, and values checked against numbers derived by hand in this file.
local zr = require "zrun"
local T = zr.testing
local sqrt, exp, cos, sin, pi, abs = math.sqrt, math.exp, math.cos, math.sin, math.pi, math.abs
zr.manual_seed(11)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
local function c(...) return zr.randn({ ... }, { dtype = "f64" }) end

-- ---------------------------------------------------------------- rms_norm

T.test("rms_norm by hand", function()
  local x = zr.tensor({ { 1, 2, 3, 4 }, { -2, 0, 0, 0 } }, { dtype = "f64" })
  local w = zr.tensor({ 1, 0.5, 2, -1 }, { dtype = "f64" })
  -- row 1: mean(x^2) = 30/4 = 7.5; row 2: mean = 4/4 = 1
  local r1, r2 = 1 / sqrt(7.5 + 1e-6), 1 / sqrt(1 + 1e-6)
  T.near(x:rms_norm(w, 1e-6), { r1, 2 * 0.5 * r1, 3 * 2 * r1, -4 * r1, -2 * r2, 0, 0, 0 }, 1e-14)
  T.near(zr.rms_norm(x, nil, 0), { 1 / sqrt(7.5), 2 / sqrt(7.5), 3 / sqrt(7.5), 4 / sqrt(7.5), -2, 0, 0, 0 }, 1e-14)
  -- f32 agrees to float precision and keeps the dtype
  local y = x:float():rms_norm(w:float(), 1e-6)
  T.eq(y:dtype(), "f32")
  T.near(y, x:rms_norm(w, 1e-6), 1e-6)
end)

T.test("gradcheck rms_norm", function()
  T.gradcheck(function(a, w) return a:rms_norm(w, 1e-5) end, { r(2, 7, 5), r(5) })
  T.gradcheck(function(a, w) return a:rms_norm(w, 0.1) end, { r(3, 6), r(6) })
  T.gradcheck(function(a) return a:rms_norm(nil, 1e-6) end, { r(1, 6) })
  T.gradcheck(function(a, w) return a:rms_norm(w) end, { c(4, 5), r(5) }) -- weight only
end)

T.test("rms_norm bf16 rounds like LlamaRMSNorm", function()
  local x = zr.randn(3, 7):bfloat16()
  local w = (zr.rand(7) + 0.5):bfloat16()
  local y = x:rms_norm(w, 1e-6)
  T.eq(y:dtype(), "bf16")
  -- reference: normalise in f32, round to bf16, multiply by the weight in f32, round to bf16
  local h = x:float():rms_norm(nil, 1e-6):bfloat16():float()
  T.near(y:float(), (h * w:float()):bfloat16():float(), 0)
end)

T.test("rms_norm errors", function()
  T.raises(function() zr.randn(2, 6):rms_norm(zr.ones(5)) end, "weight has shape (5) but x is (2,6); expected (6)")
  T.raises(function() zr.zeros(2, 3, { dtype = "i64" }):rms_norm() end, "floating-point")
end)

-- ---------------------------------------------------------------- layer_norm

T.test("layer_norm by hand", function()
  local x = zr.tensor({ { 1, 2, 3, 4 } }, { dtype = "f64" })
  local w = zr.tensor({ 2, 1, 1, 0.5 }, { dtype = "f64" })
  local b = zr.tensor({ 0, 1, -1, 0 }, { dtype = "f64" })
  -- mean 2.5, biased variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
  local s = 1 / sqrt(1.25 + 1e-5)
  T.near(x:layer_norm(w, b, 1e-5), { -1.5 * s * 2, -0.5 * s + 1, 0.5 * s - 1, 1.5 * s * 0.5 }, 1e-14)
  T.near(x:layer_norm(), { -1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s }, 1e-14)
end)

T.test("gradcheck layer_norm", function()
  T.gradcheck(function(a, w, b) return a:layer_norm(w, b, 1e-5) end, { r(2, 7, 5), r(5), r(5) })
  T.gradcheck(function(a, w, b) return a:layer_norm(w, b, 0.01) end, { r(1, 6), r(6), r(6) })
  T.gradcheck(function(a) return a:layer_norm() end, { r(3, 6) })
  T.gradcheck(function(a, b) return a:layer_norm(nil, b) end, { r(3, 5), r(5) })
end)

-- ---------------------------------------------------------------- rope

T.test("rope at position 0 is the identity", function()
  local cs, sn = zr.rope_tables(1, 6, { dtype = "f64" })
  T.near(cs, { 1, 1, 1, 1, 1, 1 }, 0)
  T.near(sn, { 0, 0, 0, 0, 0, 0 }, 0)
  local x = c(2, 3, 1, 6)
  T.near(x:rope(cs, sn), x, 0)
end)

T.test("rope by hand (rotate_half pairs i, i+Dh/2)", function()
  -- head_dim 4, theta 10000: inv_freq = {1, 10000^(-1/2) = 0.01}
  local Tn = 3
  local cs, sn = zr.rope_tables(Tn, 4, { theta = 10000, dtype = "f64" })
  T.eq(#cs:shape(), 2); T.eq(cs:shape()[1], 3); T.eq(cs:shape()[2], 4)
  local x = zr.tensor({ { { { 1, 2, 3, 4 }, { 1, 2, 3, 4 }, { -1, 0.5, 2, 3 } } } }, { dtype = "f64" })
  local y = x:rope(cs, sn)
  local expect = {}
  local rows = { { 1, 2, 3, 4 }, { 1, 2, 3, 4 }, { -1, 0.5, 2, 3 } }
  for t = 0, Tn - 1 do
    local a, b, cc, d = unpack(rows[t + 1])
    local f0, f1 = t * 1, t * 0.01
    local base = t * 4
    expect[base + 1] = a * cos(f0) - cc * sin(f0)
    expect[base + 2] = b * cos(f1) - d * sin(f1)
    expect[base + 3] = cc * cos(f0) + a * sin(f0)
    expect[base + 4] = d * cos(f1) + b * sin(f1)
  end
  T.near(y, expect, 1e-14)
  -- an offset shifts positions: tables for positions 2.. equal rows 2.. of the full tables
  local c2, s2 = zr.rope_tables(1, 4, { theta = 10000, offset = 2, dtype = "f64" })
  T.near(c2, cs[3], 1e-15); T.near(s2, sn[3], 1e-15)
end)

T.test("gradcheck rope", function()
  local cs, sn = zr.rope_tables(7, 6, { theta = 100, dtype = "f64" })
  T.gradcheck(function(a) return a:rope(cs, sn) end, { r(2, 3, 7, 6) })
  local c1, s1 = zr.rope_tables(1, 4, { dtype = "f64", offset = 5 })
  T.gradcheck(function(a) return a:rope(c1, s1) end, { r(1, 2, 1, 4) })
  -- arbitrary (non-rotation) tables check the transposed map, not just the inverse rotation
  local cr, sr = c(5, 8), c(5, 8)
  T.gradcheck(function(a) return a:rope(cr, sr) end, { r(2, 1, 5, 8) })
end)

T.test("rope on a transposed view, bf16, and errors", function()
  local cs, sn = zr.rope_tables(5, 8)
  local x = zr.randn(2, 5, 3, 8) -- (B, T, H, Dh) as a linear layer gives it
  local xt = x:transpose(2, 3)
  T.near(xt:rope(cs, sn), xt:contiguous():rope(cs, sn), 0)
  local yb = xt:bfloat16():rope(cs, sn)
  T.eq(yb:dtype(), "bf16")
  T.near(yb:float(), xt:rope(cs, sn), 0.05, 0.02)
  T.raises(function() zr.randn(1, 1, 5, 7):rope(zr.randn(5, 7), zr.randn(5, 7)) end, "head_dim must be even")
  T.raises(function() zr.randn(1, 1, 5, 8):rope(zr.randn(4, 8), zr.randn(4, 8)) end, "must both be (T, head_dim) = (5,8)")
end)

T.test("llama3 rope frequencies by hand", function()
  local scaling = { rope_type = "llama3", factor = 8, low_freq_factor = 1, high_freq_factor = 4,
                    original_max_position_embeddings = 8192 }
  local Dh, theta = 128, 500000
  -- position 1 (offset 1): sin/cos of the frequency itself
  local cs, sn = zr.rope_tables(1, Dh, { theta = theta, rope_scaling = scaling, offset = 1, dtype = "f64" })
  -- low_freq_wavelen = 8192/1 = 8192, high_freq_wavelen = 8192/4 = 2048
  -- i = 0: inv = 1, wavelen 2*pi < 2048 -> high frequency, unchanged
  -- i = 63: inv = 500000^(-126/128) ~ 2.45e-6, wavelen ~ 2.6e6 > 8192 -> divided by 8
  -- i = 30: inv = 500000^(-60/128), wavelen = 2*pi/inv ~ 3.07e3 in [2048, 8192] -> smoothed:
  --         s = (8192/wavelen - 1) / (4 - 1); inv' = (1 - s) * inv / 8 + s * inv
  local inv30 = theta ^ (-60 / 128)
  local wl30 = 2 * pi / inv30
  assert(wl30 > 2048 and wl30 < 8192, "index 30 should be in the smoothed band")
  local s30 = (8192 / wl30 - 1) / 3
  local expect = { [0] = 1, [63] = theta ^ (-126 / 128) / 8, [30] = (1 - s30) * inv30 / 8 + s30 * inv30 }
  for i, f in pairs(expect) do
    T.near(sn:get_flat(i + 1), sin(f), 1e-15, 1e-12, "sin index " .. i)
    T.near(sn:get_flat(i + 1 + Dh / 2), sin(f), 1e-15, 1e-12, "sin second half index " .. i)
    T.near(cs:get_flat(i + 1), cos(f), 1e-15, 1e-12, "cos index " .. i)
  end
  -- default (unscaled) tables differ exactly where the rule says
  local _, s0 = zr.rope_tables(1, Dh, { theta = theta, offset = 1, dtype = "f64" })
  T.near(s0:get_flat(1), sn:get_flat(1), 0)
  T.near(s0:get_flat(64), sin(theta ^ (-126 / 128)), 1e-18, 1e-12)
  -- f32 tables (computed in float like transformers) agree to float precision
  local _, s32 = zr.rope_tables(1, Dh, { theta = theta, rope_scaling = scaling, offset = 1 })
  T.near(s32, sn, 1e-7, 1e-5)
  T.raises(function() zr.rope_tables(4, 8, { rope_scaling = { rope_type = "llama3", factor = 8 } }) end,
    "low_freq_factor is required")
end)

-- ---------------------------------------------------------------- attention

-- Naive causal GQA attention on flat Lua tables (the independent reference).
local function ref_attention(q, k, v, B, Hq, Hkv, Tn, Dh, scale)
  local fq, fk, fv = q:flat_table(), k:flat_table(), v:flat_table()
  local out, g = {}, Hq / Hkv
  for b = 0, B - 1 do
    for h = 0, Hq - 1 do
      local kh = math.floor(h / g)
      for i = 0, Tn - 1 do
        local s, m = {}, -math.huge
        for j = 0, i do
          local d = 0
          for e = 0, Dh - 1 do
            d = d + fq[((b * Hq + h) * Tn + i) * Dh + e + 1] * fk[((b * Hkv + kh) * Tn + j) * Dh + e + 1]
          end
          s[j] = d * scale
          if s[j] > m then m = s[j] end
        end
        local z = 0
        for j = 0, i do s[j] = exp(s[j] - m); z = z + s[j] end
        for e = 0, Dh - 1 do
          local acc = 0
          for j = 0, i do acc = acc + s[j] / z * fv[((b * Hkv + kh) * Tn + j) * Dh + e + 1] end
          out[((b * Hq + h) * Tn + i) * Dh + e + 1] = acc
        end
      end
    end
  end
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

-- ---------------------------------------------------------------- dropout

T.test("dropout statistics and determinism", function()
  local n, p = 100000, 0.3
  local x = zr.ones(n)
  zr.manual_seed(5)
  local y = x:dropout(p)
  local kept = y:ne(0):to("f64"):sum():item() / n
  assert(abs(kept - (1 - p)) < 0.01, "kept fraction " .. kept)
  T.near(y:mean(), 1, 0.01)
  T.near(y:max(), 1 / (1 - p), 1e-6) -- kept values are scaled by 1/(1-p)
  zr.manual_seed(5)
  T.near(x:dropout(p), y, 0, 0, "same seed, same mask")
  T.near(x:dropout(p, false), x, 0)
  T.near(x:dropout(0), x, 0)
  T.near(x:dropout(1), zr.zeros(n), 0)
  T.raises(function() x:dropout(1.5) end, "p must be in [0, 1]")
end)

T.test("dropout backward uses the forward mask", function()
  local x = zr.ones(1000, { dtype = "f64", requires_grad = true })
  local y = x:dropout(0.4)
  y:sum():backward()
  T.near(x.grad, y, 0) -- d(sum)/dx = mask/(1-p) = y when x = 1
  T.gradcheck(function(a) zr.manual_seed(3); return a:dropout(0.4) end, { r(5, 7) })
end)

-- ---------------------------------------------------------------- cat / split

T.test("cat values and gradcheck", function()
  local a = zr.tensor({ { 1, 2 }, { 3, 4 } })
  local b = zr.tensor({ { 5 }, { 6 } })
  T.near(zr.cat({ a, b }, 2), { 1, 2, 5, 3, 4, 6 }, 0)
  T.near(zr.cat({ a, a:narrow(1, 1, 1) }), { 1, 2, 3, 4, 1, 2 }, 0)
  T.gradcheck(function(x, y, z) return zr.cat({ x, y, z }, 2) end, { r(2, 3, 4), r(2, 1, 4), r(2, 5, 4) })
  T.gradcheck(function(x, y) return zr.cat({ x, y, x }, -1) end, { r(3, 2), r(3, 5) })
  T.raises(function() zr.cat({ a, b }, 1) end, "tensor 2 has shape (2,1) but tensor 1 has shape (2,2)")
end)

T.test("split + cat round trip with gradients", function()
  local x = r(5, 7)
  local parts = x:split(3, 2)
  T.eq(#parts, 3)
  T.eq(parts[3]:shape()[2], 1)
  T.near(zr.cat(parts, 2), x, 0)
  local sized = x:split({ 2, 4, 1 }, 2)
  T.eq(sized[2]:shape()[2], 4)
  T.near(sized[2], x:narrow(2, 3, 4), 0)
  -- gradients flow through the views, also when pieces are reordered and reused
  T.gradcheck(function(a)
    local p = a:split({ 2, 4, 1 }, 2)
    return zr.cat({ p[3], p[1] * p[1], p[2], p[3] }, 2)
  end, { x })
  T.gradcheck(function(a) return zr.cat(a:split(2, 1), 1) * 3 end, { r(5, 3) })
  T.raises(function() x:split({ 2, 2 }, 2) end, "sizes sum to 4 but dim 2")
end)

-- ---------------------------------------------------------------- where / masked_fill / compare

T.test("comparisons", function()
  local x = zr.tensor({ 1, -2, 3, 0 })
  T.eq(x:gt(0):dtype(), "u8")
  T.near(x:gt(0), { 1, 0, 1, 0 }, 0)
  T.near(x:lt(0), { 0, 1, 0, 0 }, 0)
  T.near(zr.eq(x, 3), { 0, 0, 1, 0 }, 0)
  T.near(x:ge(zr.tensor({ 1, 1, 4, -1 })), { 1, 0, 0, 1 }, 0)
  T.near(x:ne(0):logical_not(), { 0, 0, 0, 1 }, 0)
  local ids = zr.tensor({ 128000, -100, 7 }, { dtype = "i64" })
  T.near(ids:eq(-100), { 0, 1, 0 }, 0)
end)

T.test("where values and gradcheck", function()
  local cond = zr.tensor({ 1, 0, 1 }, { dtype = "u8" })
  T.near(zr.where(cond, zr.tensor({ 1, 2, 3 }), zr.tensor({ -1, -2, -3 })), { 1, -2, 3 }, 0)
  T.near(zr.where(cond, zr.tensor({ 1, 2, 3 }), 0), { 1, 0, 3 }, 0)
  local m = zr.rand(4, 5):gt(0.5)
  T.gradcheck(function(a, b) return zr.where(m, a, b) end, { r(3, 1, 5), r(4, 5) })
  T.gradcheck(function(a) return zr.where(m, a, -1) end, { r(5) })
  T.raises(function() zr.where(zr.ones(3), zr.ones(3), zr.ones(3)) end, "u8 mask")
end)

T.test("masked_fill: values and zero gradient under the mask", function()
  local mask = zr.tensor({ 0, 1, 1, 0 }, { dtype = "u8" })
  local x = zr.tensor({ { 1, 2, 3, 4 }, { 5, 6, 7, 8 } }, { dtype = "f64", requires_grad = true })
  local y = x:masked_fill(mask, -1e9)
  T.near(y, { 1, -1e9, -1e9, 4, 5, -1e9, -1e9, 8 }, 0)
  local w = c(2, 4);
  (y * w):sum():backward()
  local expect, fw = {}, w:flat_table()
  for i = 1, 8 do expect[i] = ((i - 1) % 4 == 1 or (i - 1) % 4 == 2) and 0 or fw[i] end
  T.near(x.grad, expect, 0)
  T.gradcheck(function(a) return a:masked_fill(mask, 2.5) end, { r(3, 4) })
  -- causal mask built from comparisons: future positions filled with -inf
  local pos = zr.arange(0, 3, 1)
  local future = pos:view(3, 1):lt(pos:view(1, 3))
  local s = zr.zeros(3, 3):masked_fill(future, -math.huge):flat_table()
  local want = { 0, -math.huge, -math.huge, 0, 0, -math.huge, 0, 0, 0 }
  for i = 1, 9 do T.eq(s[i], want[i], "causal mask element " .. i) end
  T.raises(function() x:masked_fill(zr.ones(3, { dtype = "u8" }), 0) end, "does not broadcast to x's shape (2,4)")
end)

T.done()
