-- Sliding-window attention (transformers' sliding_window: query t sees keys t - window + 1 .. t of its
-- sequence) through the segments zr.sdpa_window_segments builds: scaled_dot_product_attention, sdpa_packed
-- and qkv_rope_sdpa against an independent composition (q k^T, a mask made here from the definition,
-- softmax, times v; f64 autograd of plain ops) for the output and every input's gradient, plain rows and
-- packed sequences, windows of 1, shorter than, equal to and longer than the sequences, GQA; f64 finite
-- differences; the segments' values and errors. The CUDA twin: test_attention_window_cuda.lua.
local zr = require "zrun"
local T = zr.testing
local unpack = table.unpack or unpack
zr.manual_seed(53)

local segments_of = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "segments_of.lua")
local function make_seg(rows, Tn) return rows and (segments_of(rows, Tn)) or nil end

-- The visible (query, key) pairs by the definition: the same sequence, key <= query, query - key < window.
local function mask(rows, B, Tn, W)
  local m = {}
  for b = 1, B do
    local start = {}
    local at = 0
    for _, n in ipairs(rows and rows[b] or { Tn }) do
      for t = at, at + n - 1 do start[t] = at end
      at = at + n
    end
    m[b] = { {} }
    for i = 0, Tn - 1 do
      local r = {}
      for j = 0, Tn - 1 do r[j + 1] = (j >= start[i] and j <= i and i - j < W) and 0 or 1 end
      m[b][1][i + 1] = r
    end
  end
  return zr.tensor(m, { dtype = "u8" }) -- (B, 1, T, T): 1 where masked
end

-- The reference: scores, the mask filled with -inf, softmax, times v (k, v repeated per query head)
local function reference(q, k, v, masked)
  local Hq, Hkv, D = q:size(2), k:size(2), q:size(4)
  local B, Tn, G = q:size(1), q:size(3), math.floor(Hq / Hkv)
  local function rep(x) return x:view(B, Hkv, 1, Tn, D):expand(B, Hkv, G, Tn, D):reshape(B, Hq, Tn, D) end
  if Hq ~= Hkv then k, v = rep(k), rep(v) end
  local s = zr.matmul(q, k:transpose(3, 4)) * (1 / math.sqrt(D))
  return zr.matmul(zr.softmax(zr.masked_fill(s, masked:expand(s:shape()), -math.huge), -1), v)
end

-- f's output and the gradients of sum(out * w) wrt fresh leaves copied from xs
local function run(f, xs, w)
  local leaves = {}
  for i, x in ipairs(xs) do leaves[i] = x:detach():clone():requires_grad_(true) end
  local y = f(unpack(leaves))
  ;(y * w):sum():backward()
  local g = {}
  for i, l in ipairs(leaves) do g[i] = l.grad end
  return y, g
end

local CASES = { -- rows (nil: one sequence a row), T, windows
  { Tn = 9, windows = { 1, 2, 4, 9, 20 } },
  { Tn = 11, rows = { { 4, 7 }, { 1, 10 } }, windows = { 1, 3, 5, 11 } },
  { Tn = 40, rows = { { 33, 7 }, { 40 } }, windows = { 6, 32, 33 } },
}

T.test("sdpa with window segments = the masked composition (output, dq, dk, dv), f64, GQA and not", function()
  for _, c in ipairs(CASES) do
    local B = c.rows and #c.rows or 2
    local seg = make_seg(c.rows, c.Tn)
    for _, W in ipairs(c.windows) do
      local ws = zr.sdpa_window_segments(B, c.Tn, W, seg)
      local masked = mask(c.rows, B, c.Tn, W)
      for _, h in ipairs { { 2, 2 }, { 4, 2 } } do
        local Hq, Hkv = unpack(h)
        local xs = { zr.randn({ B, Hq, c.Tn, 5 }, { dtype = "f64" }), zr.randn({ B, Hkv, c.Tn, 5 }, { dtype = "f64" }),
          zr.randn({ B, Hkv, c.Tn, 5 }, { dtype = "f64" }) }
        local w = zr.randn({ B, Hq, c.Tn, 5 }, { dtype = "f64" })
        local y, g = run(function(q, k, v) return zr.scaled_dot_product_attention(q, k, v, { segments = ws }) end, xs, w)
        local yr, gr = run(function(q, k, v) return reference(q, k, v, masked) end, xs, w)
        local at = ("T=%d window %d Hq %d Hkv %d%s"):format(c.Tn, W, Hq, Hkv, c.rows and " packed" or "")
        T.near(y, yr, 1e-12, 1e-10, at .. ": output")
        for i = 1, 3 do T.near(g[i], gr[i], 1e-12, 1e-10, at .. ": gradient " .. i) end
      end
    end
  end
end)

T.test("sdpa_packed and qkv_rope_sdpa with window segments = the same on q, k, v split (and rotated), f64", function()
  local Tn, B, Hq, Hkv, D = 13, 2, 4, 2, 6
  local rows = { { 5, 8 }, { 13 } }
  local ws = zr.sdpa_window_segments(B, Tn, 4, make_seg(rows, Tn))
  local masked = mask(rows, B, Tn, 4)
  local qkv = zr.randn({ B, Tn, (Hq + 2 * Hkv) * D }, { dtype = "f64" })
  local w = zr.randn({ B, Tn, Hq * D }, { dtype = "f64" })
  local function heads(x, n) return x:view(B, Tn, n, D):transpose(2, 3) end
  local function split(x)
    return heads(x:narrow(3, 1, Hq * D), Hq), heads(x:narrow(3, Hq * D + 1, Hkv * D), Hkv),
      heads(x:narrow(3, (Hq + Hkv) * D + 1, Hkv * D), Hkv)
  end
  local function back(o) return o:transpose(2, 3):reshape(B, Tn, Hq * D) end
  local y, g = run(function(x) return zr.sdpa_packed(x, Hq, Hkv, { segments = ws }) end, { qkv }, w)
  local yr, gr = run(function(x)
    local q, k, v = split(x)
    return back(reference(q, k, v, masked))
  end, { qkv }, w)
  T.near(y, yr, 1e-12, 1e-10, "sdpa_packed: output")
  T.near(g[1], gr[1], 1e-12, 1e-10, "sdpa_packed: dqkv")
  -- qkv_rope_sdpa: each token's cos/sin row at its position in its own sequence (as the models gather them)
  local cos, sin = zr.rope_tables(Tn, D, { dtype = "f64" })
  local pos = {}
  for b, lens in ipairs(rows) do
    local t = 0
    for _, n in ipairs(lens) do for p = 0, n - 1 do pos[(b - 1) * Tn + t + 1] = p; t = t + 1 end end
  end
  local pt = zr.tensor(pos, { dtype = "i64" })
  local c, s = zr.embedding(cos, pt), zr.embedding(sin, pt)
  local joined = ws:view(2, 1, B * Tn) -- (not a window over the join: each row's own lo, hi, offset below)
  local f = joined:flat_table()
  for b = 1, B - 1 do
    for t = 1, Tn do
      for half = 0, 1 do f[half * B * Tn + b * Tn + t] = f[half * B * Tn + b * Tn + t] + b * Tn end
    end
  end
  joined = zr.tensor(f, { dtype = "i32" }):view(2, 1, B * Tn)
  y, g = run(function(x) return zr.qkv_rope_sdpa(x:view(1, B * Tn, -1), Hq, Hkv, c, s, { segments = joined }):view(B, Tn, Hq * D) end,
    { qkv }, w)
  yr, gr = run(function(x)
    local q, k, v = split(x)
    local cq, sq = c:view(B, 1, Tn, D), s:view(B, 1, Tn, D)
    local function rot(u) -- rotate_half rope by the tables, by hand
      local h = math.floor(D / 2)
      local r = zr.cat({ -u:narrow(4, h + 1, h), u:narrow(4, 1, h) }, 4)
      return u * cq + r * sq
    end
    return back(reference(rot(q), rot(k), v, masked))
  end, { qkv }, w)
  T.near(y, yr, 1e-12, 1e-10, "qkv_rope_sdpa: output")
  T.near(g[1], gr[1], 1e-12, 1e-10, "qkv_rope_sdpa: dqkv")
end)

T.test("window segments: gradcheck in f64 (finite differences)", function()
  local ws = zr.sdpa_window_segments(1, 7, 3, make_seg({ { 2, 5 } }, 7))
  local q, k, v = zr.randn({ 1, 2, 7, 3 }, { dtype = "f64" }), zr.randn({ 1, 1, 7, 3 }, { dtype = "f64" }),
    zr.randn({ 1, 1, 7, 3 }, { dtype = "f64" })
  for _, x in ipairs { q, k, v } do x:requires_grad_(true) end
  T.gradcheck(function(a, b, c) return zr.scaled_dot_product_attention(a, b, c, { segments = ws }) end, { q, k, v })
end)

T.test("window segments: their values, a window of T or more is plain causal, bf16 as f32, errors", function()
  -- T 6, window 3, one sequence: lo = max(0, t - 2), hi = min(6, t + 3)
  local function list(t) return table.concat(t:flat_table(), " ") end
  T.eq(list(zr.sdpa_window_segments(1, 6, 3)), "0 0 0 1 2 3 3 4 5 6 6 6")
  -- two sequences (2, 4) in a row of 6, window 2: each inside its own
  T.eq(list(zr.sdpa_window_segments(1, 6, 2, make_seg({ { 2, 4 } }, 6))), "0 0 2 2 3 4 2 2 4 5 6 6")
  T.eq(list(zr.sdpa_window_segments(2, 5, 5)), list(make_seg({ { 5 }, { 5 } }, 5)), "window = T")
  local q = zr.randn({ 2, 2, 5, 4 })
  T.near(zr.scaled_dot_product_attention(q, q, q, { segments = zr.sdpa_window_segments(2, 5, 8) }),
    zr.scaled_dot_product_attention(q, q, q), 0, 0, "window past T: the causal op's bits")
  -- window 1: each query sees only itself, so the output is its own value row
  T.near(zr.scaled_dot_product_attention(q, q * 2, q * 3, { segments = zr.sdpa_window_segments(2, 5, 1) }), q * 3, 1e-6, 1e-6)
  local ws = zr.sdpa_window_segments(2, 5, 2)
  local yb = zr.scaled_dot_product_attention(q:to("bf16"), q:to("bf16"), q:to("bf16"), { segments = ws })
  T.near(yb:float(), zr.scaled_dot_product_attention(q:to("bf16"):float(), q:to("bf16"):float(), q:to("bf16"):float(),
    { segments = ws }), 0.02, 0.02, "bf16")
  T.raises(function() zr.sdpa_window_segments(1, 4, 0) end,
    "sdpa_window_segments: window must be at least 1 (the keys a query sees, itself included), got 0")
  T.raises(function() zr.sdpa_window_segments(0, 4, 2) end, "sdpa_window_segments: B and T must be at least 1")
  T.raises(function() zr.sdpa_window_segments(1, 4, 2, make_seg({ { 5 } }, 5)) end,
    "sdpa_window_segments: segments must be (2, B, T) = (2, 1, 4)")
  -- a window's segments are checked as any: its lo past a token is refused
  local f = zr.sdpa_window_segments(1, 4, 2):flat_table()
  f[2] = 0
  f[3] = 0 -- lo of token 2 back to 0, but hi of token 0 still 2
  T.raises(function() zr.scaled_dot_product_attention(q:narrow(1, 1, 1):narrow(3, 1, 4), q:narrow(1, 1, 1):narrow(3, 1, 4),
    q:narrow(1, 1, 1):narrow(3, 1, 4), { segments = zr.tensor(f, { dtype = "i32" }):view(2, 1, 4) }) end,
    "sdpa: segments of row 0, token 0 (0-based): hi 2, but the queries that see this key end at 3")
end)

T.done()
