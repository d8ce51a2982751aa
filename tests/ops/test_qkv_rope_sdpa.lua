-- zr.qkv_rope_sdpa (Llama's rope + causal attention over the packed q/k/v product, one op) on the
-- CPU: a naive loop over the packed rows (rotation by hand, then attention_ref), with real rope
-- tables and with arbitrary ones (which tell the pairs' two cos/sin entries apart), f64 finite
-- differences, the unfused composition Llama runs without it (split, view, transpose, zr.rope,
-- sdpa) in f32 and bf16 through a linear_multi product, a given scale, and its errors.
local zr = require "zrun"
local T = zr.testing
local sqrt = math.sqrt
zr.manual_seed(31)

local attention_ref = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "attention_ref.lua")

-- The reference from the packed rows: head j of row (b, t) at columns j·D..; q (heads 0..Hq-1) and
-- k (the next Hkv) rotated as transformers' rotate_half, x·cos + rotate_half(x)·sin, pairs (e, e + D/2).
local function ref(qkv, cs, sn, B, Tn, Hq, Hkv, D, scale)
  local x, c, s, W, out = qkv:flat_table(), cs:flat_table(), sn:flat_table(), (Hq + 2 * Hkv) * D, {}
  local half = D / 2
  local function at(c0, rot)
    return function(b, h, t, e)
      local base = (b * Tn + t) * W + (c0 + h) * D
      local v = x[base + e + 1]
      if not rot then return v end
      local partner = e < half and -x[base + e + half + 1] or x[base + e - half + 1]
      return v * c[t * D + e + 1] + partner * s[t * D + e + 1]
    end
  end
  attention_ref(at(0, true), at(Hq, true), at(Hq + Hkv, false),
    function(b, h, t, e, v) out[(b * Tn + t) * Hq * D + h * D + e + 1] = v end, B, Hq, Hkv, Tn, D, scale)
  return out
end

-- Llama's attention without the fused op (the ZeRO-3 path of Attention:forward).
local function unfused(qkv, Hq, Hkv, cs, sn)
  local B, Tn = qkv:size(1), qkv:size(2)
  local D = qkv:size(3) / (Hq + 2 * Hkv)
  local q, k, v = unpack(zr.split(qkv, { Hq * D, Hkv * D, Hkv * D }, 3))
  q = zr.rope(q:view(B, Tn, Hq, D):transpose(2, 3), cs, sn)
  k = zr.rope(k:view(B, Tn, Hkv, D):transpose(2, 3), cs, sn)
  v = v:view(B, Tn, Hkv, D):transpose(2, 3)
  return zr.scaled_dot_product_attention(q, k, v):transpose(2, 3):reshape(B, Tn, Hq * D)
end

local SHAPES = { { 2, 5, 3, 3, 4 }, { 1, 7, 4, 2, 6 }, { 3, 1, 2, 1, 2 }, { 1, 9, 8, 2, 8 } } -- B, T, Hq, Hkv, D

T.test("qkv_rope_sdpa matches a naive loop over the packed rows (MHA, GQA, real and arbitrary tables, a scale)", function()
  for _, s in ipairs(SHAPES) do
    local B, Tn, Hq, Hkv, D = unpack(s)
    local what = table.concat(s, ",")
    local qkv = zr.randn({ B, Tn, (Hq + 2 * Hkv) * D }, { dtype = "f64" })
    local cs, sn = zr.rope_tables(Tn, D, { theta = 10, dtype = "f64" })
    local y = zr.qkv_rope_sdpa(qkv, Hq, Hkv, cs, sn)
    T.eq(table.concat(y:shape(), ","), table.concat({ B, Tn, Hq * D }, ","), what .. " shape")
    T.near(y, ref(qkv, cs, sn, B, Tn, Hq, Hkv, D, 1 / sqrt(D)), 1e-12, 0, what .. " rope tables")
    local cr, sr = zr.randn({ Tn, D }, { dtype = "f64" }), zr.randn({ Tn, D }, { dtype = "f64" })
    T.near(qkv:qkv_rope_sdpa(Hq, Hkv, cr, sr, 0.3), ref(qkv, cr, sr, B, Tn, Hq, Hkv, D, 0.3), 1e-12, 0,
      what .. " arbitrary tables, scale 0.3")
  end
end)

T.test("gradcheck qkv_rope_sdpa (f64; leaf and through a product; arbitrary tables)", function()
  local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
  local cs, sn = zr.rope_tables(5, 4, { theta = 10, dtype = "f64" })
  T.gradcheck(function(x) return zr.qkv_rope_sdpa(x, 2, 2, cs, sn) end, { r(2, 5, 6 * 4) })
  local cr, sr = zr.randn({ 6, 2 }, { dtype = "f64" }), zr.randn({ 6, 2 }, { dtype = "f64" })
  T.gradcheck(function(a, w) return zr.qkv_rope_sdpa(zr.linear(a, w), 4, 2, cr, sr) end, { r(1, 6, 3), r(16, 3) })
end)

T.test("qkv_rope_sdpa equals split + rope + sdpa through a product: output, dx and every weight's gradient", function()
  for _, s in ipairs { { 2, 67, 4, 4, 16 }, { 1, 67, 6, 2, 8 }, { 3, 9, 4, 1, 64 } } do
    local B, Tn, Hq, Hkv, D = unpack(s)
    local E = 12
    local x0, go = zr.randn({ B, Tn, E }), zr.randn({ B, Tn, Hq * D })
    local w0 = { zr.randn({ Hq * D, E }) * 0.3, zr.randn({ Hkv * D, E }) * 0.3, zr.randn({ Hkv * D, E }) * 0.3 }
    local cs, sn = zr.rope_tables(Tn, D, { theta = 100 })
    for _, dt in ipairs { "f32", "bf16" } do
      local function run(f)
        local x, ws = x0:to(dt):detach():requires_grad_(true), {}
        for i, w in ipairs(w0) do ws[i] = w:to(dt):detach():requires_grad_(true) end
        local y = f(zr.linear_multi(x, ws), Hq, Hkv, cs:to(dt), sn:to(dt))
        y:backward(go:to(dt))
        return { y = y, dx = x.grad, dwq = ws[1].grad, dwk = ws[2].grad, dwv = ws[3].grad }
      end
      local got, want = run(zr.qkv_rope_sdpa), run(unfused)
      local tol = dt == "f32" and 1e-5 or 0
      for key, w in pairs(want) do
        local what = ("%s %s %s"):format(table.concat(s, ","), dt, key)
        T.eq(got[key]:dtype(), dt, what .. " dtype")
        T.near(got[key]:float(), w:float(), tol, tol, what)
      end
    end
  end
end)

T.test("Llama runs qkv_rope_sdpa in every layer, with the logits and gradients of split + rope + sdpa", function()
  local cfg = { model_type = "llama", vocab_size = 40, hidden_size = 32, intermediate_size = 48,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 64,
    rms_norm_eps = 1e-5, rope_theta = 100, dtype = "f64" }
  zr.manual_seed(7)
  local m = zr.models.llama.LlamaForCausalLM(cfg)
  local ids = (zr.rand({ 2, 11 }) * 39):to("i64")
  local orig = zr.qkv_rope_sdpa
  local function run(f)
    local calls = 0
    zr.qkv_rope_sdpa = function(...) calls = calls + 1; return f(...) end
    local ok, out = pcall(function()
      m:zero_grad()
      local o = m(ids, ids)
      o.loss:backward()
      local g = {}
      for n, p in m:named_parameters() do g[n] = p.grad:clone() end
      return { logits = o.logits, grads = g }
    end)
    zr.qkv_rope_sdpa = orig
    assert(ok, out)
    return out, calls
  end
  local got, n1 = run(orig)
  local want, n2 = run(function(qkv, H, KV, cs, sn) return unfused(qkv, H, KV, cs, sn) end)
  T.eq(n1, 2, "one call per layer")
  T.eq(n2, 2)
  T.near(got.logits, want.logits, 1e-12, 0, "logits")
  for n, g in pairs(want.grads) do T.near(got.grads[n], g, 1e-12, 0, "grad of " .. n) end
end)

T.test("qkv_rope_sdpa errors name the shape and the fix", function()
  local cs, sn = zr.rope_tables(3, 4)
  T.raises(function() zr.qkv_rope_sdpa(zr.randn(1, 3, 24), 3, 1, cs, sn) end,
    "qkv_rope: the last dim of qkv (1,3,24) must be (H + 2 KV)·head_dim = 5·head_dim")
  T.raises(function() zr.qkv_rope_sdpa(zr.randn(1, 3, 28), 3, 2, cs, sn) end,
    "qkv_rope_sdpa: n_head 3 must be a multiple of n_kv_head 2")
  T.raises(function() zr.qkv_rope_sdpa(zr.randn(1, 3, 16), 2, 1, zr.randn(4, 4), zr.randn(4, 4)) end,
    "must both be (T, head_dim) = (3,4)")
  T.raises(function() zr.qkv_rope_sdpa(zr.randn(1, 3, 16), 0, 1, cs, sn) end, "H and KV must be >= 1")
  T.raises(function() zr.qkv_rope_sdpa(zr.ones({ 1, 3, 16 }, { dtype = "i64" }), 2, 1, cs, sn) end, "qkv_rope")
end)

T.done()
