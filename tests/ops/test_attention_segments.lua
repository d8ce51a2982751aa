-- The attention ops over packed sequences ({segments = seg}: rows that hold several sequences, each
-- query attending to its own sequence's keys only): scaled_dot_product_attention, sdpa_packed and
-- qkv_rope_sdpa against each sequence run alone through the plain causal op (the output and the
-- gradients of a random weighted sum), in f64 and f32, two rows, sequences of length 1, one spanning a
-- whole row, GQA; f64 finite differences; every error line. The CUDA twin: test_attention_segments_cuda.lua.
local zr = require "zrun"
local T = zr.testing
local unpack = table.unpack or unpack
zr.manual_seed(31)

local make_seg = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "segments_of.lua")

-- f's output and the gradients of sum(out * w) wrt fresh leaves copied from xs (w: nil, made here)
local function run(f, xs, w)
  local leaves = {}
  for i, x in ipairs(xs) do leaves[i] = x:detach():clone():requires_grad_(true) end
  local y = f(unpack(leaves))
  w = w or zr.randn(y:shape(), { dtype = y:dtype() })
  ;(y * w):sum():backward()
  local g = {}
  for i, l in ipairs(leaves) do g[i] = l.grad end
  return y, g, w
end

-- x's part for a sequence: row b, tokens s .. s + n - 1 along tdim
local function part(x, q, tdim) return x:narrow(1, q.b, 1):narrow(tdim, q.s + 1, q.n) end

-- f(xs..., {segments = seg}) against alone(q, parts of xs...) for each sequence q: the output and every
-- input's gradient, each along its T dim (tdim)
local function check(what, f, alone, xs, tdim, seg, seqs, tol)
  local y, g, w = run(function(...) return f(...) end, xs)
  for _, q in ipairs(seqs) do
    local parts = {}
    for i, x in ipairs(xs) do parts[i] = part(x, q, tdim) end
    local yr, gr = run(function(...) return alone(q, ...) end, parts, part(w, q, tdim):contiguous())
    local at = ("%s: row %d, sequence at %d of length %d"):format(what, q.b, q.s, q.n)
    T.near(part(y, q, tdim), yr, tol, tol, at .. ": output")
    for i = 1, #xs do T.near(part(g[i], q, tdim), gr[i], tol, tol, at .. ": gradient " .. i) end
  end
  -- (seg is read as given: not a leaf, no gradient; the node kept it through backward)
  T.eq(seg.requires_grad, false)
end

-- B = 2 rows: several sequences, length-1 sequences, a sequence spanning a whole row
local LAYOUTS = {
  { Tn = 7, rows = { { 3, 1, 3 }, { 7 } } },
  { Tn = 5, rows = { { 1, 1, 1, 1, 1 }, { 2, 3 } } },
  { Tn = 9, rows = { { 4, 5 }, { 1, 6, 2 } } },
}
-- fn(c) for every case: c = {dt =, tol =, B =, Tn =, seg =, seqs =, Hq =, Hkv =, D =, name =} over f64 and
-- f32, the layouts and the heads (Hq, Hkv, D: MHA; GQA; D even for the rope)
local HEADS = { { 2, 2, 4 }, { 4, 2, 6 } }
local function each_case(fn)
  for _, dt in ipairs { "f64", "f32" } do
    for _, L in ipairs(LAYOUTS) do
      local seg, seqs = make_seg(L.rows, L.Tn)
      for _, h in ipairs(HEADS) do
        local Hq, Hkv, D = unpack(h)
        fn { dt = dt, tol = dt == "f64" and 1e-12 or 2e-5, B = #L.rows, Tn = L.Tn, seg = seg, seqs = seqs, Hq = Hq,
          Hkv = Hkv, D = D, name = ("%s T=%d Hq=%d Hkv=%d"):format(dt, L.Tn, Hq, Hkv) }
      end
    end
  end
end

T.test("sdpa with segments = each sequence alone through the causal sdpa (output, dq, dk, dv), f64 and f32", function()
  each_case(function(c)
    local o = { dtype = c.dt }
    local q, k, v = zr.randn({ c.B, c.Hq, c.Tn, c.D }, o), zr.randn({ c.B, c.Hkv, c.Tn, c.D }, o),
      zr.randn({ c.B, c.Hkv, c.Tn, c.D }, o)
    local seg = c.seg
    check("sdpa " .. c.name, function(a, b, d) return zr.scaled_dot_product_attention(a, b, d, { segments = seg }) end,
      function(_, a, b, d) return zr.scaled_dot_product_attention(a, b, d) end, { q, k, v }, 3, seg, c.seqs, c.tol)
    -- a given scale, and q, k, v as transposed views of (B, T, heads, D) projections
    local function bthd(x) return x:transpose(2, 3):contiguous():transpose(2, 3) end
    check("sdpa " .. c.name .. ", scale 0.3, strided",
      function(a, b, d) return zr.scaled_dot_product_attention(bthd(a), bthd(b), bthd(d), { segments = seg, scale = 0.3 }) end,
      function(_, a, b, d) return zr.scaled_dot_product_attention(a, b, d, 0.3) end, { q, k, v }, 3, seg, c.seqs, c.tol)
  end)
end)

T.test("sdpa_packed and qkv_rope_sdpa with segments = each sequence alone (its tokens' cos/sin rows): output, dqkv", function()
  each_case(function(c)
    local x = zr.randn({ c.B, c.Tn, (c.Hq + 2 * c.Hkv) * c.D }, { dtype = c.dt })
    local Hq, Hkv, seg = c.Hq, c.Hkv, c.seg
    check("sdpa_packed " .. c.name, function(a) return zr.sdpa_packed(a * 1, Hq, Hkv, { segments = seg }) end,
      function(_, a) return zr.sdpa_packed(a * 1, Hq, Hkv) end, { x }, 2, seg, c.seqs, c.tol)
    local cos, sin = zr.rope_tables(c.Tn, c.D, { dtype = c.dt })
    check("qkv_rope_sdpa " .. c.name, function(a) return zr.qkv_rope_sdpa(a * 1, Hq, Hkv, cos, sin, { segments = seg }) end,
      function(q, a) return zr.qkv_rope_sdpa(a * 1, Hq, Hkv, cos:narrow(1, q.s + 1, q.n), sin:narrow(1, q.s + 1, q.n)) end,
      { x }, 2, seg, c.seqs, c.tol)
  end)
end)

T.test("segments: one sequence a row is the plain causal op; gradcheck in f64", function()
  local q, k, v = zr.randn({ 2, 4, 6, 3 }, { dtype = "f64" }), zr.randn({ 2, 2, 6, 3 }, { dtype = "f64" }),
    zr.randn({ 2, 2, 6, 3 }, { dtype = "f64" })
  local whole = make_seg({ { 6 }, { 6 } }, 6)
  T.near(zr.scaled_dot_product_attention(q, k, v, { segments = whole }), zr.scaled_dot_product_attention(q, k, v), 0, 0,
    "one sequence a row")
  local seg = make_seg({ { 2, 1, 3 }, { 1, 5 } }, 6)
  for _, x in ipairs { q, k, v } do x.requires_grad = true end
  T.gradcheck(function(a, b, c) return zr.scaled_dot_product_attention(a, b, c, { segments = seg }) end, { q, k, v })
  local x = zr.randn({ 2, 6, 4 * 3 }, { dtype = "f64", requires_grad = true })
  T.gradcheck(function(a) return zr.sdpa_packed(a, 2, 1, { segments = seg }) end, { x })
  local cos, sin = zr.rope_tables(6, 2, { dtype = "f64" })
  local y = zr.randn({ 2, 6, 4 * 2 }, { dtype = "f64", requires_grad = true })
  T.gradcheck(function(a) return zr.qkv_rope_sdpa(a, 2, 1, cos, sin, { segments = seg }) end, { y })
end)

T.test("segments: bf16 inputs (widened to f32 on the CPU) as f32", function()
  local seg = make_seg({ { 3, 4 }, { 7 } }, 7)
  local x = zr.randn({ 2, 7, 4 * 8 }):to("bf16"):float()
  local yb = zr.sdpa_packed(x:to("bf16"), 2, 1, { segments = seg })
  T.eq(yb:dtype(), "bf16")
  T.near(yb:float(), zr.sdpa_packed(x, 2, 1, { segments = seg }), 0.02, 0.02)
end)

T.test("segments: errors name what was wrong and what is expected", function()
  local q, k, v = zr.randn({ 2, 2, 4, 3 }), zr.randn({ 2, 2, 4, 3 }), zr.randn({ 2, 2, 4, 3 })
  local seg = make_seg({ { 1, 3 }, { 4 } }, 4)
  local function sdpa(s) return zr.scaled_dot_product_attention(q, k, v, { segments = s }) end
  T.raises(function() sdpa(seg:to("i64")) end, "sdpa: segments must be i32 (2, B, T), lo then hi of each token's sequence; got i64")
  T.raises(function() sdpa(seg:narrow(2, 1, 1):contiguous()) end, "sdpa: segments must be (2, B, T) = (2, 2, 4), lo then hi")
  T.raises(function() sdpa(zr.zeros({ 8 }, { dtype = "i32" })) end, "got (8)")
  T.raises(function() sdpa(seg:transpose(2, 3):contiguous():transpose(2, 3)) end, "sdpa: segments must be a contiguous")
  T.raises(function() sdpa("0 1") end, "scaled_dot_product_attention: segments must be an i32 (2, B, T) tensor")
  T.raises(function() zr.scaled_dot_product_attention(q, k, v, { segment = seg }) end, "segment")
  local function bad(i, x) -- seg with flat element i (1-based) set to x
    local f = seg:flat_table()
    f[i] = x
    return zr.tensor(f, { dtype = "i32" }):view(2, 2, 4)
  end
  -- token 2 of row 0 (flat 3): lo 1 -> 0, below the token before's (lo never decreases along a row)
  T.raises(function() sdpa(bad(3, 0)) end,
    "sdpa: segments of row 0, token 2 (0-based): lo 0 (expected 0 <= lo <= t and never below the token before's")
  -- token 0 of row 1 (flat 5): lo -1
  T.raises(function() sdpa(bad(5, -1)) end, "segments of row 1, token 0 (0-based): lo -1 (expected 0 <= lo <= t")
  -- token 1 of row 0 (flat 2): lo 1 -> 2, past itself (it would see no key)
  T.raises(function() sdpa(bad(2, 2)) end, "segments of row 0, token 1 (0-based): lo 2 (expected")
  -- token 3 of row 1 (flat 8 + 8): hi 5 > T
  T.raises(function() sdpa(bad(16, 5)) end,
    "segments of row 1, token 3 (0-based): hi 5, but the queries that see this key end at 4 (hi: one past the last query")
  -- lo and hi disagree: token 1 of row 0 sees token 0 by its lo (0), but hi of token 0 is still 1
  T.raises(function() sdpa(bad(2, 0)) end, "segments of row 0, token 0 (0-based): hi 1, but the queries that see this key end at 2")
  local x = zr.randn({ 2, 4, 3 * 3 })
  T.raises(function() zr.sdpa_packed(x, 1, 1, { segments = seg:to("f32") }) end, "sdpa_packed: segments must be i32")
  T.raises(function() zr.sdpa_packed(x, 1, 1, { segments = bad(3, 0) }) end, "sdpa_packed: segments of row 0, token 2")
  local cos, sin = zr.rope_tables(4, 3 - 1)
  local x2 = zr.randn({ 2, 4, 3 * 2 })
  T.raises(function() zr.qkv_rope_sdpa(x2, 1, 1, cos, sin, { segments = make_seg({ { 4 } }, 4) }) end,
    "qkv_rope_sdpa: segments must be (2, B, T) = (2, 2, 4)")
  T.raises(function() zr.qkv_rope_sdpa(x2, 1, 1, cos, sin, { segments = seg, scales = 1 }) end, "scales")
end)

T.test("sdpa_segments_ok: the CPU for float dtypes", function()
  T.eq(zr.sdpa_segments_ok("cpu", "f32", 16), true)
  T.eq(zr.sdpa_segments_ok("cpu", "f64", 128), true)
  T.eq(zr.sdpa_segments_ok("cpu", "bf16", 64), true)
  T.eq(zr.sdpa_segments_ok("cpu", "i32", 64), false)
  if not zr.cuda.is_available() then T.eq(zr.sdpa_segments_ok("cuda", "bf16", 64), false, "no CUDA device") end
end)

T.done()
