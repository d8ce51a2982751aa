-- The CPU attention kernels' tiles (kernels/cpu/attention.c: 32 x 32 queries x keys, online softmax in the
-- forward, the backward's products per tile) against a naive loop over each (query, key) on Lua numbers: the
-- output and dq, dk, dv in f64 and f32, at T = 1, 37, 130 (partial tiles), head dims below, at and past the
-- tile's 32 columns, GQA and MHA, packed sequences that start mid-tile; and the same bits on 1 and 3 threads.
local zr = require "zrun"
local T = zr.testing
local exp, floor, huge, fmt = math.exp, math.floor, math.huge, string.format

-- seg (2, B, T) i32 from each row's sequence lengths (see test_attention_segments.lua), and lo as a Lua
-- table: lo[b * Tn + t] (0-based) is the first key of token t's sequence
local function make_seg(rows, Tn)
  local B, flat, lo = #rows, {}, {}
  for b, lens in ipairs(rows) do
    local at = 0
    for _, n in ipairs(lens) do
      for t = at, at + n - 1 do
        flat[(b - 1) * Tn + t + 1], flat[B * Tn + (b - 1) * Tn + t + 1] = at, at + n
        lo[(b - 1) * Tn + t] = at
      end
      at = at + n
    end
    assert(at == Tn, "a row's lengths add up to T")
  end
  return zr.tensor(flat, { dtype = "i32" }):view(2, B, Tn), lo
end

-- The naive reference over flat tables (q, dout: (B, Hq, T, Dh); k, v: (B, Hkv, T, Dh)): out, dq, dk, dv as
-- flat tables. Query i of row b sees keys lo .. i; ds = p (dp - sum_j p dp), written without o.
local function naive(q, k, v, g, lo, B, Hq, Hkv, Tn, Dh, scale)
  local o, dq, dk, dv = {}, {}, {}, {}
  for x = 1, B * Hq * Tn * Dh do o[x], dq[x] = 0, 0 end
  for x = 1, B * Hkv * Tn * Dh do dk[x], dv[x] = 0, 0 end
  for b = 0, B - 1 do
    for h = 0, Hq - 1 do
      local qh, kh = (b * Hq + h) * Tn * Dh, (b * Hkv + floor(h / (Hq / Hkv))) * Tn * Dh
      for i = 0, Tn - 1 do
        local qi, j0 = qh + i * Dh, lo and lo[b * Tn + i] or 0
        local s, dp, m, z, D = {}, {}, -huge, 0, 0
        for j = j0, i do
          local kj, a, c = kh + j * Dh, 0, 0
          for e = 1, Dh do
            a = a + q[qi + e] * k[kj + e]
            c = c + g[qi + e] * v[kj + e]
          end
          s[j], dp[j] = a * scale, c
          if s[j] > m then m = s[j] end
        end
        for j = j0, i do s[j] = exp(s[j] - m); z = z + s[j] end
        for j = j0, i do s[j] = s[j] / z; D = D + s[j] * dp[j] end
        for j = j0, i do
          local kj, p, ds = kh + j * Dh, s[j], s[j] * (dp[j] - D) * scale
          for e = 1, Dh do
            o[qi + e] = o[qi + e] + p * v[kj + e]
            dv[kj + e] = dv[kj + e] + p * g[qi + e]
            dq[qi + e] = dq[qi + e] + ds * k[kj + e]
            dk[kj + e] = dk[kj + e] + ds * q[qi + e]
          end
        end
      end
    end
  end
  return o, dq, dk, dv
end

-- The op on CPU in dtype dt: out, dq, dk, dv for the gradient g of the output.
local function op(q, k, v, g, seg, scale, dt)
  local l = {}
  for i, x in ipairs { q, k, v } do l[i] = x:detach():to(dt):requires_grad_(true) end
  local y = zr.scaled_dot_product_attention(l[1], l[2], l[3], { segments = seg, scale = scale })
  y:backward(g:to(dt))
  return y, l[1].grad, l[2].grad, l[3].grad
end

-- B, Hq, Hkv, Tn, Dh; rows: each row's sequence lengths (nil: one causal sequence a row); scale (nil: 1/sqrt(Dh))
local CASES = {
  { 2, 8, 2, 1, 40 },
  { 2, 8, 2, 37, 40, rows = { { 5, 30, 2 }, { 37 } } },
  { 1, 8, 2, 130, 33, rows = { { 70, 1, 20, 39 } } },
  { 1, 2, 2, 130, 64, scale = 0.3 },
  { 2, 4, 1, 37, 8, rows = { { 1, 1, 35 }, { 36, 1 } } },
}
local NAMES = { "output", "dq", "dk", "dv" }

T.test("blocked kernels = a naive loop per (query, key): output, dq, dk, dv in f64 and f32", function()
  for _, c in ipairs(CASES) do
    local B, Hq, Hkv, Tn, Dh = c[1], c[2], c[3], c[4], c[5]
    local q, k, v = zr.randn({ B, Hq, Tn, Dh }, { dtype = "f64" }), zr.randn({ B, Hkv, Tn, Dh }, { dtype = "f64" }),
      zr.randn({ B, Hkv, Tn, Dh }, { dtype = "f64" })
    local g = zr.randn({ B, Hq, Tn, Dh }, { dtype = "f64" })
    local seg, lo
    if c.rows then seg, lo = make_seg(c.rows, Tn) end
    local want = { naive(q:flat_table(), k:flat_table(), v:flat_table(), g:flat_table(), lo, B, Hq, Hkv, Tn, Dh,
      c.scale or 1 / math.sqrt(Dh)) }
    for _, dt in ipairs { "f64", "f32" } do
      local tol = dt == "f64" and 1e-12 or 2e-5
      local got = { op(q, k, v, g, seg, c.scale, dt) }
      for i = 1, 4 do
        T.near(got[i], want[i], tol, tol, fmt("%s B=%d Hq=%d Hkv=%d T=%d Dh=%d%s: %s", dt, B, Hq, Hkv, Tn, Dh,
          seg and " packed" or "", NAMES[i]))
      end
    end
  end
end)

-- (a child run: the outputs of the packed GQA case at T = 130 in f32, every bit, on this process's threads)
if arg and arg[1] == "--bits" then
  zr.manual_seed(5)
  local q, k, v, g = zr.randn({ 2, 8, 130, 40 }), zr.randn({ 2, 2, 130, 40 }), zr.randn({ 2, 2, 130, 40 }),
    zr.randn({ 2, 8, 130, 40 })
  local seg = make_seg({ { 70, 1, 20, 39 }, { 130 } }, 130)
  local out = {}
  for _, x in ipairs { op(q, k, v, g, seg, nil, "f32") } do
    for _, e in ipairs(x:flat_table()) do out[#out + 1] = fmt("%a", e) end
  end
  io.write(table.concat(out, "\n"), "\n")
  os.exit(0)
end

T.test("the same bits on 1 and 3 threads (each (batch, head) task sums in one order)", function()
  local zrun, me = os.getenv("ZRUN_BIN") or arg[-1], arg[0]
  local function bits(threads)
    local p = assert(io.popen(fmt("OMP_NUM_THREADS=%d '%s' '%s' --bits", threads, zrun, me)))
    local s = p:read("*a")
    p:close()
    assert(#s > 100000, "the child printed its outputs: " .. s:sub(1, 200))
    return s
  end
  T.eq(bits(1) == bits(3), true, "outputs on 1 thread and on 3 threads")
end)

T.done()
