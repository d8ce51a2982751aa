-- rope and rope_tables: identity at position 0, rotate_half pairs by hand, float64
-- finite-difference gradient check, transposed views, bf16, errors, llama3 frequencies by hand.
local zr = require "zrun"
local T = zr.testing
local cos, sin, pi = math.cos, math.sin, math.pi
zr.manual_seed(11)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
local function c(...) return zr.randn({ ... }, { dtype = "f64" }) end

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
  T.raises(function() zr.randn(1, 1, 5, 7):rope(zr.randn(5, 7), zr.randn(5, 7)) end, "rotary dim (the tables' width) must be even")
  T.raises(function() zr.randn(1, 1, 5, 8):rope(zr.randn(4, 8), zr.randn(4, 8)) end,
    "must both be (T, rotary_dim) = (5, <= 8)")
  T.raises(function() zr.randn(1, 1, 5, 8):rope(zr.randn(5, 10), zr.randn(5, 10)) end,
    "must both be (T, rotary_dim) = (5, <= 8)")
end)

-- ---------------------------------------------------------------- partial rotary, longrope

T.test("partial rotary: the first R channels rotated (pairs i, i+R/2), the rest passed through", function()
  -- head_dim 6, rotary dim 4 (transformers' partial_rotary_factor 2/3): channels 5, 6 untouched
  local Tn = 3
  local cs, sn = zr.rope_tables(Tn, 4, { theta = 10000, dtype = "f64" })
  local x = c(2, 1, Tn, 6)
  local y = x:rope(cs, sn)
  local xs, ys = x:contiguous(), y:contiguous()
  for b = 1, 2 do
    for t = 0, Tn - 1 do
      local row = {}
      for i = 1, 6 do row[i] = xs[b][1][t + 1][i] end
      local f0, f1 = t * 1, t * 0.01
      local expect = { row[1] * cos(f0) - row[3] * sin(f0), row[2] * cos(f1) - row[4] * sin(f1),
        row[3] * cos(f0) + row[1] * sin(f0), row[4] * cos(f1) + row[2] * sin(f1), row[5], row[6] }
      T.near(ys[b][1][t + 1], expect, 1e-14)
    end
  end
  -- the full-width rope of the first R channels, and the rest as they were
  T.near(y:narrow(4, 1, 4), x:narrow(4, 1, 4):contiguous():rope(cs, sn), 0)
  T.near(y:narrow(4, 5, 2), x:narrow(4, 5, 2), 0)
  T.gradcheck(function(a) return a:rope(cs, sn) end, { r(2, 3, Tn, 6) })
  local cr, sr = c(5, 6), c(5, 6) -- arbitrary tables: the transposed map
  T.gradcheck(function(a) return a:rope(cr, sr) end, { r(1, 2, 5, 10) })
  -- bf16 and a transposed view
  local xb = zr.randn(2, Tn, 3, 6):transpose(2, 3)
  local cf, sf = zr.rope_tables(Tn, 4)
  T.near(xb:bfloat16():rope(cf, sf):float(), xb:rope(cf, sf), 0.05, 0.02)
end)

T.test("longrope tables by hand: 1 / (ext_i theta^(2i/D)), cos and sin times attention_factor", function()
  local ext = { 1.5, 3.25 }
  local att = 1.1902380714238083
  local cs, sn = zr.rope_tables(3, 4, { theta = 100, dtype = "f64",
    rope_scaling = { rope_type = "longrope", ext_factors = ext, attention_factor = att } })
  local inv = { 1 / (1.5 * 1), 1 / (3.25 * 100 ^ 0.5) }
  for t = 0, 2 do
    T.near(cs[t + 1], { att * cos(t * inv[1]), att * cos(t * inv[2]), att * cos(t * inv[1]), att * cos(t * inv[2]) }, 1e-14)
    T.near(sn[t + 1], { att * sin(t * inv[1]), att * sin(t * inv[2]), att * sin(t * inv[1]), att * sin(t * inv[2]) }, 1e-14)
  end
  T.raises(function() zr.rope_tables(3, 4, { rope_scaling = { rope_type = "longrope", ext_factors = { 1 } } }) end,
    "ext_factors must hold head_dim/2 = 2 numbers")
  T.raises(function() zr.rope_tables(3, 4, { rope_scaling = { rope_type = "longrope" } }) end,
    "ext_factors (a list) is required")
  T.raises(function() zr.rope_tables(3, 4, { rope_scaling = { rope_type = "longrope", ext_factors = { 1, 0 } } }) end,
    "longrope factor 2 must be > 0")
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

T.done()
