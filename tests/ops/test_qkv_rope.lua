-- qkv_rope (the fused split + rope + transpose of a packed q/k/v product) against the unfused
-- composition it replaces (split, view, transpose, rope: golden-tested against transformers),
-- forward and backward, both layouts, GQA, odd T, f32/bf16, float64 finite differences, the
-- gradient paths (a producer's buffer, shared with another use, a leaf), checkpointing, errors.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(23)

-- The composition Attention:forward runs without the fused op.
local function unfused(qkv, H, KV, cs, sn)
  local B, Tn, D = qkv:size(1), qkv:size(2), qkv:size(3) / (H + 2 * KV)
  local q, k, v = unpack(zr.split(qkv, { H * D, KV * D, KV * D }, 3))
  q = q:view(B, Tn, H, D):transpose(2, 3):rope(cs, sn)
  k = k:view(B, Tn, KV, D):transpose(2, 3):rope(cs, sn)
  return q, k, v:view(B, Tn, KV, D):transpose(2, 3)
end
local function fused(layout)
  return function(qkv, H, KV, cs, sn) return zr.qkv_rope(qkv, H, KV, cs, sn, layout) end
end

-- q, k, v and every gradient of loss = Σ q·wq + Σ k·wk + Σ v·wv, with qkv = linear_multi(x, W)
-- (so the gradient goes into the product's buffer) or qkv a leaf. use: which parts enter the loss.
local function run(f, case, dt, leaf, use)
  local x, ws = case.x:to(dt):detach(), {}
  x.requires_grad = true
  for i, w in ipairs(case.w) do ws[i] = w:to(dt):detach(); ws[i].requires_grad = true end
  local qkv = zr.linear_multi(x, ws)
  if leaf then qkv = qkv:detach(); qkv.requires_grad = true end
  local cs, sn = case.cs:to(dt), case.sn:to(dt)
  local out = { f(qkv, case.H, case.KV, cs, sn) }
  local loss
  for i = 1, 3 do
    if not use or use[i] then
      local l = (out[i] * case.wo[i]:to(dt)):sum()
      loss = loss and loss + l or l
    end
  end
  if case.extra then loss = loss + (qkv * case.extra:to(dt)):sum() end -- another use of the product
  loss:backward()
  local r = { q = out[1], k = out[2], v = out[3] }
  if leaf then r.dqkv = qkv.grad else r.dx = x.grad; for i = 1, 3 do r["dw" .. i] = ws[i].grad end end
  return r
end

local function make(B, Tn, H, KV, D, E)
  local c = { H = H, KV = KV, x = zr.randn(B, Tn, E), w = {}, wo = {} }
  local sizes = { H * D, KV * D, KV * D }
  for i = 1, 3 do c.w[i] = zr.randn(sizes[i], E) * 0.3 end
  c.wo[1], c.wo[2], c.wo[3] = zr.randn(B, H, Tn, D), zr.randn(B, KV, Tn, D), zr.randn(B, KV, Tn, D)
  c.cs, c.sn = zr.rope_tables(Tn, D, { theta = 100 })
  return c
end

local CASES = {
  { "GQA, odd T", make(2, 5, 4, 2, 8, 6) },
  { "one head, T = 1, head_dim 2", make(1, 1, 1, 1, 2, 3) },
  { "MHA, prime sizes", make(3, 7, 3, 3, 6, 5) },
}

T.test("qkv_rope equals split + rope + transpose, forward and backward (f32, bf16; both layouts)", function()
  for _, cc in ipairs(CASES) do
    local name, case = cc[1], cc[2]
    for _, dt in ipairs({ "f32", "bf16" }) do
      local tol = dt == "f32" and 1e-6 or 0
      for _, leaf in ipairs({ false, true }) do
        local want = run(unfused, case, dt, leaf)
        for _, layout in ipairs({ "bhtd", "bthd", false }) do
          local got = run(fused(layout or nil), case, dt, leaf)
          for key, w in pairs(want) do
            local what = ("%s %s %s leaf=%s layout=%s"):format(name, dt, key, tostring(leaf), tostring(layout))
            T.eq(got[key]:dtype(), w:dtype(), what)
            T.near(got[key]:float(), w:float(), tol * 10, tol, what)
          end
        end
      end
    end
  end
end)

T.test("qkv_rope outputs: shapes, one buffer per layout (bhtd contiguous parts, bthd transposed slices)", function()
  local case = CASES[1][2]
  local qkv = zr.linear_multi(case.x, case.w)
  local q, k, v = zr.qkv_rope(qkv, 4, 2, case.cs, case.sn, "bhtd")
  local function dims(t) return table.concat(t, ",") end
  T.eq(dims(q:shape()), "2,4,5,8"); T.eq(dims(k:shape()), "2,2,5,8"); T.eq(dims(v:shape()), "2,2,5,8")
  T.eq(q:is_contiguous() and k:is_contiguous() and v:is_contiguous(), true)
  q, k, v = zr.qkv_rope(qkv, 4, 2, case.cs, case.sn, "bthd")
  T.eq(dims(q:stride()), "320,8,64,1", "q: heads 1..4 of a (B, T, 8 heads, D) buffer")
  T.eq(dims(v:stride()), "320,8,64,1")
  -- at position 0 the rotation is the identity: the first row is the product's, head by head
  local row = qkv:narrow(2, 1, 1)
  T.near(q:narrow(3, 1, 1):transpose(2, 3):reshape(2, 32), row:narrow(3, 1, 32):reshape(2, 32), 0)
  T.near(v:narrow(3, 1, 1):transpose(2, 3):reshape(2, 16), row:narrow(3, 49, 16):reshape(2, 16), 0)
  -- v is the product's last heads at every position
  T.near(v:transpose(2, 3):reshape(2, 5, 16), qkv:narrow(3, 49, 16), 0)
end)

T.test("qkv_rope: only some parts used, the product used elsewhere too (gradient buffer shared)", function()
  local case = make(2, 3, 2, 1, 4, 5)
  for _, use in ipairs({ { true }, { false, true }, { false, false, true }, { true, false, true } }) do
    for _, extra in ipairs({ false, true }) do
      case.extra = extra and zr.randn(2, 3, 16) or nil
      local want = run(unfused, case, "f32", false, use)
      for _, layout in ipairs({ "bhtd", "bthd" }) do
        local got = run(fused(layout), case, "f32", false, use)
        for _, key in ipairs({ "dx", "dw1", "dw2", "dw3" }) do
          local w, g = want[key], got[key]
          local what = ("%s use=%s extra=%s %s"):format(layout, table.concat({ tostring(use[1]), tostring(use[2]),
            tostring(use[3]) }, ","), tostring(extra), key)
          if w == nil then T.eq(g, nil, what) else T.near(g, w, 1e-6, 1e-6, what) end
        end
      end
    end
  end
end)

T.test("gradcheck qkv_rope (f64; leaf and through a product; rotation and arbitrary tables)", function()
  local function flat(q, k, v) return zr.cat({ q:reshape(-1), k:reshape(-1), v:reshape(-1) }, 1) end
  for _, layout in ipairs({ "bhtd", "bthd" }) do
    local cs, sn = zr.rope_tables(3, 4, { theta = 10, dtype = "f64" })
    local qkv = zr.randn({ 2, 3, 16 }, { dtype = "f64", requires_grad = true })
    T.gradcheck(function(a) return flat(zr.qkv_rope(a, 2, 1, cs, sn, layout)) end, { qkv })
    -- through a product (the buffer path), with tables that are no rotation (the transposed map)
    local cr, sr = zr.randn({ 5, 6 }, { dtype = "f64" }), zr.randn({ 5, 6 }, { dtype = "f64" })
    local x = zr.randn({ 1, 5, 3 }, { dtype = "f64", requires_grad = true })
    local w = zr.randn({ 30, 3 }, { dtype = "f64", requires_grad = true })
    T.gradcheck(function(a, b) return flat(zr.qkv_rope(zr.linear(a, b), 3, 1, cr, sr, layout)) end, { x, w })
  end
end)

T.test("qkv_rope under zr.checkpoint gives the same gradients", function()
  local case = CASES[1][2]
  local function grads(ckpt)
    local x = case.x:detach(); x.requires_grad = true
    local function f(a)
      local q, k, v = zr.qkv_rope(zr.linear_multi(a, case.w), 4, 2, case.cs, case.sn)
      return zr.scaled_dot_product_attention(q, k, v)
    end
    local o = ckpt and zr.checkpoint(f, x) or f(x)
    ;(o * case.wo[1]):sum():backward()
    return o, x.grad
  end
  local o1, g1 = grads(false)
  local o2, g2 = grads(true)
  T.near(o2, o1, 0); T.near(g2, g1, 1e-6, 1e-6)
end)

T.test("qkv_rope errors", function()
  local cs, sn = zr.rope_tables(3, 4)
  local qkv = zr.randn(2, 3, 16)
  T.raises(function() zr.qkv_rope(zr.randn(2, 3, 4, 4), 2, 1, cs, sn) end, "qkv must be (B, T, (H + 2 KV)·head_dim), got (2,3,4,4)")
  T.raises(function() zr.qkv_rope(qkv, 0, 1, cs, sn) end, "H and KV must be >= 1, got H=0 KV=1")
  T.raises(function() zr.qkv_rope(qkv, 3, 1, cs, sn) end, "must be (H + 2 KV)·head_dim = 5·head_dim")
  T.raises(function() zr.qkv_rope(zr.randn(2, 3, 9), 1, 1, cs, sn) end, "head_dim even")
  T.raises(function() zr.qkv_rope(qkv, 2, 1, zr.randn(4, 4), zr.randn(4, 4)) end, "must both be (T, head_dim) = (3,4)")
  T.raises(function() zr.qkv_rope(qkv, 2, 1, cs, sn, "bsd") end, "invalid option 'bsd'")
  T.raises(function() zr.qkv_rope(zr.ones({ 2, 3, 16 }, { dtype = "i32" }), 2, 1, cs, sn) end, "qkv_rope")
end)

T.done()
