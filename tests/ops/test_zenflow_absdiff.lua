-- ZenFlow update_interval "auto"'s batched sums (runtime/zero/zenflow.h zr_zenflow_absdiff_sums):
-- sums[slot] = sum |a - prev| of every entry of one call, against values by hand and a naive Lua loop in
-- double (the CPU sums in index order, so its f32 result is the loop's exactly), prev kept or not, and
-- every error message. The CUDA twin is tests/ops/test_zenflow_cuda.lua.
local zr = require "zrun"
local T = zr.testing
local K = zr._C
zr.manual_seed(7)

local function f32(x) return zr.tensor({ x }):flat_table()[1] end -- x rounded to f32, as the op stores it

-- sum over i of |a[i] - p[i]| in double, in index order (p nil: zeros)
local function naive(a, p)
  local s = 0
  for i = 1, #a do s = s + math.abs(a[i] - (p and p[i] or 0)) end
  return s
end

T.test("zenflow_absdiff_sums by hand: against prev, prev read as zeros, kept, no prev; other slots untouched",
  function()
  local a = zr.tensor({ 1.5, -2, 3, 4.25, -0.5 })
  local p1, p2 = zr.tensor({ 0.5, 0.5, -1, 4.25, 2 }), zr.tensor({ 9, 9, 9, 9, 9 })
  local sums = zr.full({ 5 }, -1)
  K.zenflow_absdiff_sums(sums, { { 2, a, p1, true, false }, { 3, a, p2, false, true }, { 5, a } })
  -- |1.5-0.5| + |-2-0.5| + |3+1| + 0 + |-0.5-2| = 1 + 2.5 + 4 + 0 + 2.5
  T.eq(T.diff(sums, zr.tensor({ -1, 10, 11.25, -1, 11.25 })), 0, "sums")
  T.eq(T.diff(p1, zr.tensor({ 0.5, 0.5, -1, 4.25, 2 })), 0, "prev unchanged without keep")
  T.eq(T.diff(p2, a), 0, "keep: prev takes a (read as zeros first)")
  K.zenflow_absdiff_sums(sums, {})
  T.eq(sums:flat_table()[1], -1, "no entries: nothing written")
end)

T.test("zenflow_absdiff_sums: many entries of odd sizes equal a naive double sum (slots out of order, keep, views)",
  function()
  -- sizes around the CUDA chunk (16384) too; views one element into their storage
  local sizes = { 1, 7, 0, 16383, 16385, 3, 40001, 2, 16384, 5 }
  local list, want, kept = {}, {}, {}
  local sums = zr.full({ 2 * #sizes + 1 }, -1)
  for i, n in ipairs(sizes) do
    local a = zr.randn(n + 1):narrow(1, 2, n)
    local p = (i % 3 ~= 0) and zr.randn(n + 1):narrow(1, 2, n) or nil
    local have, keep = p ~= nil and i % 2 == 0, p ~= nil and i % 4 ~= 1
    local slot = 2 * #sizes + 1 - 2 * i + (i % 2) -- every second slot, from the end: out of entry order
    local at, pt = a:flat_table(), p and p:flat_table()
    list[i] = { slot, a, p, have, keep }
    want[slot] = f32(naive(at, have and pt or nil))
    kept[i] = { p, p and (keep and at or pt) }
  end
  K.zenflow_absdiff_sums(sums, list)
  local got = sums:flat_table()
  for s = 1, #got do
    T.eq(got[s], want[s] or -1, "slot " .. s .. (want[s] and "" or " (no entry: untouched)"))
  end
  for i, k in ipairs(kept) do
    if k[1] then T.eq(T.diff(k[1], zr.tensor(k[2])), 0, "entry " .. i .. "'s prev afterwards") end
  end
end)

T.test("zenflow_absdiff_sums: every error names the entry and the fix", function()
  local a, sums = zr.randn(5), zr.zeros(4)
  T.raises(function() K.zenflow_absdiff_sums(sums, { { 5, a } }) end, "entry 0 (0-based): slot 4 outside the 4 sums")
  T.raises(function() K.zenflow_absdiff_sums(sums, { { 1, a }, { 2, a }, { 1, a } }) end,
    "entry 2 (0-based): slot 0 (0-based) is an earlier entry's")
  T.raises(function() K.zenflow_absdiff_sums(sums, { { 1, a, nil, false, true } }) end,
    "entry 0 (0-based) has no previous sum to read or keep")
  T.raises(function() K.zenflow_absdiff_sums(sums, { { 1, a }, { 2, a, zr.zeros(3), true, true } }) end,
    "entry 1 (0-based): the previous sum holds 3 elements, the gradient 5")
  T.raises(function() K.zenflow_absdiff_sums(sums, { { 1, a:to("f64") } }) end, "f32 tensors only")
  T.raises(function() K.zenflow_absdiff_sums(sums, { { 1, a }, 3 }) end, "entry 1 (0-based) is not a {slot, a")
  T.raises(function() K.zenflow_absdiff_sums(sums, { { 1, zr.randn(4, 6):transpose(1, 2) } }) end, "must be contiguous")
  T.raises(function() K.zenflow_absdiff_sums(sums:to("f64"), { { 1, a } }) end, "contiguous f32 tensor")
  -- a kept prev shares no memory with another entry's tensors (on CUDA they run in any order)
  local p, big = zr.randn(5), zr.randn(12)
  T.raises(function() K.zenflow_absdiff_sums(sums, { { 1, a, p, true, true }, { 2, p } }) end,
    "entries 0 and 1 (0-based) share memory where one keeps its prev")
  T.raises(function()
    K.zenflow_absdiff_sums(sums, { { 1, big:narrow(1, 1, 5) }, { 2, a }, { 3, a, big:narrow(1, 5, 5), false, true } })
  end, "entries 0 and 2 (0-based) share memory") -- one element in common
  T.raises(function() K.zenflow_absdiff_sums(sums, { { 1, big:narrow(1, 2, 5), big:narrow(1, 1, 5), true, true } }) end,
    "entry 0 (0-based) keeps its prev in memory its a shares")
  K.zenflow_absdiff_sums(sums, { { 1, a, p, true, false }, { 2, a, p, true, false }, { 3, big:narrow(1, 1, 5), nil },
    { 4, a, big:narrow(1, 6, 5), true, true } }) -- read twice, kept next to what another reads: allowed
end)

T.done()
