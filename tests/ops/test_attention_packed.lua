-- zr.sdpa_packed (causal attention over a packed (B, T, (Hq + 2 Hkv)·D) projection, GPT-2's c_attn
-- split): a naive loop over the packed rows, f64 finite differences, the unfused composition it
-- replaces (narrow + view + transpose + scaled_dot_product_attention + transpose + reshape) in
-- f32 and bf16, MHA and GQA, T not a multiple of the 64-row tile, and its errors.
local zr = require "zrun"
local T = zr.testing
local sqrt = math.sqrt
zr.manual_seed(23)

local attention_ref = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "attention_ref.lua")

-- The naive reference read straight from the packed rows: q of head h in columns h·D.., k of kv
-- head g in Hq·D + g·D.., v in (Hq + Hkv)·D + g·D..; out (B, T, Hq·D) flat.
local function ref_packed(qkv, B, Tn, Hq, Hkv, D, scale)
  local x, W, out = qkv:flat_table(), (Hq + 2 * Hkv) * D, {}
  local function at(c0) return function(b, h, t, e) return x[(b * Tn + t) * W + (c0 + h) * D + e + 1] end end
  attention_ref(at(0), at(Hq), at(Hq + Hkv), function(b, h, t, e, v) out[(b * Tn + t) * Hq * D + h * D + e + 1] = v end,
    B, Hq, Hkv, Tn, D, scale)
  return out
end

-- The composition GPT-2 ran before: narrow views of the product, heads, sdpa, heads merged back.
local function composed(qkv, Hq, Hkv)
  local B, Tn = qkv:size(1), qkv:size(2)
  local D = qkv:size(3) / (Hq + 2 * Hkv)
  local function heads(c0, H) return qkv:narrow(3, c0 * D + 1, H * D):view(B, Tn, H, D):transpose(2, 3) end
  local o = zr.scaled_dot_product_attention(heads(0, Hq), heads(Hq, Hkv), heads(Hq + Hkv, Hkv))
  return o:transpose(2, 3):reshape(B, Tn, Hq * D)
end

T.test("sdpa_packed matches a naive loop over the packed rows (MHA, GQA, a given scale)", function()
  for _, s in ipairs { { 2, 5, 3, 3, 4 }, { 1, 7, 4, 2, 3 }, { 2, 1, 2, 1, 5 } } do
    local B, Tn, Hq, Hkv, D = unpack(s)
    local qkv = zr.randn({ B, Tn, (Hq + 2 * Hkv) * D }, { dtype = "f64" })
    local y = Hq == Hkv and zr.sdpa_packed(qkv, Hq) or zr.sdpa_packed(qkv, Hq, Hkv)
    T.eq(table.concat(y:shape(), ","), table.concat({ B, Tn, Hq * D }, ","))
    T.near(y, ref_packed(qkv, B, Tn, Hq, Hkv, D, 1 / sqrt(D)), 1e-12)
    T.near(qkv:sdpa_packed(Hq, Hkv, 0.3), ref_packed(qkv, B, Tn, Hq, Hkv, D, 0.3), 1e-12)
    -- qkv whose last dim is strided (a transposed view)
    local qt = qkv:transpose(2, 3):contiguous():transpose(2, 3)
    T.near(zr.sdpa_packed(qt, Hq, Hkv), ref_packed(qkv, B, Tn, Hq, Hkv, D, 1 / sqrt(D)), 1e-12, 0, "strided qkv")
  end
end)

T.test("gradcheck sdpa_packed (MHA and GQA, awkward sizes)", function()
  local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
  T.gradcheck(function(x) return zr.sdpa_packed(x, 3) end, { r(2, 5, 3 * 3 * 2) })
  T.gradcheck(function(x) return zr.sdpa_packed(x, 4, 2) end, { r(1, 7, 8 * 3) })
end)

T.test("sdpa_packed equals the narrow + sdpa composition: outputs and dqkv, f32 and bf16", function()
  -- T = 67: one full 64-row tile and a partial one
  for _, s in ipairs { { 2, 67, 4, 4, 16 }, { 1, 67, 6, 2, 8 }, { 3, 9, 2, 1, 64 } } do
    local B, Tn, Hq, Hkv, D = unpack(s)
    local x0 = zr.randn({ B, Tn, (Hq + 2 * Hkv) * D })
    local go = zr.randn({ B, Tn, Hq * D })
    for _, dt in ipairs { "f32", "bf16" } do
      local function run(f)
        local x = x0:to(dt):detach():requires_grad_(true)
        local y = f(x * 1) -- a product's output, as c_attn's: the gradient goes through a node
        y:backward(go:to(dt))
        return y, x.grad
      end
      local y1, g1 = run(function(x) return zr.sdpa_packed(x, Hq, Hkv) end)
      local y2, g2 = run(function(x) return composed(x, Hq, Hkv) end)
      T.eq(y1:dtype(), dt)
      T.eq(g1:dtype(), dt)
      local tol = dt == "f32" and 1e-5 or 0
      T.near(y1:float(), y2:float(), tol, 0, table.concat(s, ",") .. " " .. dt .. " out")
      T.near(g1:float(), g2:float(), tol, 0, table.concat(s, ",") .. " " .. dt .. " dqkv")
    end
  end
end)

T.test("gpt2: the attention dropout path (eager, split views of c_attn) equals sdpa_packed at p ~ 0", function()
  local gpt2 = require "zrun.models.gpt2"
  local m = gpt2.GPT2LMHeadModel { n_embd = 16, n_layer = 2, n_head = 2, vocab_size = 40, n_positions = 32,
    attn_pdrop = 1e-300, resid_pdrop = 0, embd_pdrop = 0, dtype = "f64" }
  local ids = (zr.rand({ 2, 9 }) * 39):to("i64")
  local function run(train)
    if train then m:train() else m:eval() end
    m:zero_grad()
    local out = m(ids, ids)
    out.loss:backward()
    return out.logits, m.transformer.h[1].attn.c_attn.weight.grad:clone()
  end
  local l1, g1 = run(true) -- dropout p > 0: eager attention (drops nothing at p = 1e-300)
  local l2, g2 = run(false) -- zr.sdpa_packed
  T.near(l1, l2, 1e-12, 0, "logits")
  T.near(g1, g2, 1e-12, 0, "c_attn.weight.grad")
end)

T.test("sdpa_packed errors name the shape and the fix", function()
  T.raises(function() zr.sdpa_packed(zr.randn(2, 3, 10), 2) end,
    "sdpa_packed: qkv must be (B, T, (n_head + 2 n_kv_head)·head_dim) = (B, T, 6·head_dim), got (2,3,10)")
  T.raises(function() zr.sdpa_packed(zr.randn(2, 12), 2) end, "got (2,12)")
  T.raises(function() zr.sdpa_packed(zr.randn(1, 3, 24), 3, 2) end,
    "sdpa_packed: n_head 3 must be a multiple of n_kv_head 2")
  T.raises(function() zr.sdpa_packed(zr.randn(1, 3, 24), 0) end, "n_head 0 must be a multiple")
  T.raises(function() zr.sdpa_packed(zr.ones({ 1, 3, 6 }, { dtype = "i64" }), 2) end, "sdpa_packed")
end)

T.done()
