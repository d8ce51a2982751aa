-- zr.qkv_norm_rope_sdpa (Qwen3's attention over its packed q/k/v product: each head of q and k through
-- an RMSNorm over head_dim, the rope, causal attention; one op) on the CPU: against the normed rows
-- computed by hand (transformers' Qwen3RMSNorm: x · (mean x² + eps)^-1/2 · w) fed to zr.qkv_rope_sdpa,
-- f64 finite differences for qkv and both weights, bit for bit the unfused ops Qwen3's layer runs
-- without it (split, view, rms_norm, transpose, rope, sdpa, transpose, reshape) in f32 and bf16
-- through a product (with packed-sequence segments too), and its errors.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(41)

-- qkv (B, T, (Hq + 2 Hkv)·D) with each of the first Hq + Hkv heads of every row normed by hand
-- (q heads by wq, k heads by wk), as a new f64 tensor.
local function normed_by_hand(qkv, wq, wk, Hq, Hkv, D, eps)
  local x, a, b = qkv:flat_table(), wq:flat_table(), wk:flat_table()
  local W = qkv:size(3)
  local rows = #x / W
  for r = 0, rows - 1 do
    for j = 0, Hq + Hkv - 1 do
      local base, ss = r * W + j * D, 0
      for e = 1, D do ss = ss + x[base + e] ^ 2 end
      local rs = 1 / math.sqrt(ss / D + eps)
      local w = j < Hq and a or b
      for e = 1, D do x[base + e] = x[base + e] * rs * w[e] end
    end
  end
  return zr.tensor(x, { dtype = "f64" }):view(unpack(qkv:shape()))
end

-- Qwen3's layer without the op (llama.lua's unfused path).
local function unfused(qkv, Hq, Hkv, wq, wk, eps, cs, sn, opts)
  local B, Tn = qkv:size(1), qkv:size(2)
  local D = qkv:size(3) / (Hq + 2 * Hkv)
  local q, k, v = unpack(zr.split(qkv, { Hq * D, Hkv * D, Hkv * D }, 3))
  q = zr.rope(zr.rms_norm(q:view(B, Tn, Hq, D), wq, eps):transpose(2, 3), cs, sn)
  k = zr.rope(zr.rms_norm(k:view(B, Tn, Hkv, D), wk, eps):transpose(2, 3), cs, sn)
  v = v:view(B, Tn, Hkv, D):transpose(2, 3)
  return zr.scaled_dot_product_attention(q, k, v, opts):transpose(2, 3):reshape(B, Tn, Hq * D)
end

T.test("qkv_norm_rope_sdpa: the heads normed by hand, then qkv_rope_sdpa (f64; MHA, GQA, a scale)", function()
  for _, s in ipairs { { 2, 5, 3, 3, 4 }, { 1, 7, 4, 2, 6 }, { 3, 1, 2, 1, 2 }, { 1, 9, 8, 2, 8 } } do
    local B, Tn, Hq, Hkv, D = unpack(s)
    local qkv = zr.randn({ B, Tn, (Hq + 2 * Hkv) * D }, { dtype = "f64" }) * 2
    local wq, wk = zr.randn({ D }, { dtype = "f64" }), zr.randn({ D }, { dtype = "f64" })
    local cs, sn = zr.rope_tables(Tn, D, { theta = 10, dtype = "f64" })
    local want = zr.qkv_rope_sdpa(normed_by_hand(qkv, wq, wk, Hq, Hkv, D, 1e-3), Hq, Hkv, cs, sn, 0.4)
    local got = zr.qkv_norm_rope_sdpa(qkv, Hq, Hkv, wq, wk, 1e-3, cs, sn, 0.4)
    T.eq(table.concat(got:shape(), ","), table.concat({ B, Tn, Hq * D }, ","), "shape")
    T.near(got, want, 1e-12, 0, table.concat(s, ","))
  end
end)

T.test("gradcheck qkv_norm_rope_sdpa (f64): qkv, the q norm's and the k norm's weights", function()
  local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
  local cs, sn = zr.rope_tables(5, 4, { theta = 10, dtype = "f64" })
  T.gradcheck(function(x, a, b) return zr.qkv_norm_rope_sdpa(x, 2, 1, a, b, 1e-6, cs, sn) end, { r(2, 5, 4 * 4), r(4), r(4) })
  T.gradcheck(function(x, a, b) return zr.qkv_norm_rope_sdpa(x * 1, 3, 3, a, b, 0.1, cs, sn) end, { r(1, 5, 9 * 4), r(4), r(4) })
end)

T.test("qkv_norm_rope_sdpa equals Qwen3's unfused ops through a product, bit for bit (f32, bf16; segments)", function()
  for _, s in ipairs { { 2, 37, 4, 2, 16 }, { 1, 19, 6, 6, 8 }, { 3, 9, 4, 1, 64 } } do
    local B, Tn, Hq, Hkv, D = unpack(s)
    local E = 12
    local x0, go = zr.randn({ B, Tn, E }), zr.randn({ B, Tn, Hq * D })
    local w0 = zr.randn({ (Hq + 2 * Hkv) * D, E }) * 0.3
    local nq, nk = zr.randn({ D }) * 0.2 + 1, zr.randn({ D }) * 0.2 + 1
    local cs, sn = zr.rope_tables(Tn, D, { theta = 100 })
    -- two packed sequences a row (segments (2, B, T): lo then hi of each token's sequence)
    local seg = zr.sdpa_window_segments(B, Tn, Tn) -- one sequence a row, as segments
    for _, dt in ipairs { "f32", "bf16" } do
      for _, opts in ipairs { false, { segments = seg } } do
        local function run(f)
          local x, w = x0:to(dt):detach():requires_grad_(true), w0:to(dt):detach():requires_grad_(true)
          local a, b = nq:to(dt):detach():requires_grad_(true), nk:to(dt):detach():requires_grad_(true)
          local y = f(zr.linear(x, w), Hq, Hkv, a, b, 1e-6, cs:to(dt), sn:to(dt), opts or nil)
          y:backward(go:to(dt))
          return { y, x.grad, w.grad, a.grad, b.grad }
        end
        local got, want = run(zr.qkv_norm_rope_sdpa), run(unfused)
        local what = ("%s %s%s"):format(table.concat(s, ","), dt, opts and " segments" or "")
        for i, name in ipairs { "output", "dx", "dW", "d q_norm", "d k_norm" } do
          T.eq((got[i]:float() - want[i]:float()):abs():max():item(), 0, what .. " " .. name)
        end
      end
    end
  end
end)

T.test("qkv_norm_rope_sdpa: the norms' weights must be (head_dim,); fused only on CUDA", function()
  local cs, sn = zr.rope_tables(3, 4)
  local x = zr.randn({ 1, 3, 4 * 4 })
  T.raises(function() zr.qkv_norm_rope_sdpa(x, 2, 1, zr.ones({ 5 }), zr.ones({ 4 }), 1e-6, cs, sn) end,
    "q and k norms' weights must both be (head_dim,) = (4,), got (5) and (4)")
  T.raises(function() zr.qkv_norm_rope_sdpa(x, 2, 1, zr.ones({ 4 }), zr.ones({ 2, 2 }), 1e-6, cs, sn) end,
    "must both be (head_dim,)")
  T.raises(function() zr.qkv_norm_rope_sdpa(zr.randn({ 1, 3, 7 * 4 }), 3, 2, zr.ones({ 4 }), zr.ones({ 4 }), 1e-6, cs, sn) end,
    "n_head 3 must be a multiple of n_kv_head 2")
  T.eq(zr.qkv_norm_rope_fused("cpu", "bf16", 128), false, "the CPU runs the composition")
end)

T.done()
