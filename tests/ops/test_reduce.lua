-- Reductions: float64 finite-difference gradient checks of sum, mean and max over dims, and
-- values by hand (max with its 1-based indices).
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(1)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end

T.test("gradcheck sum/mean/max", function()
  local x = r(3, 5, 2)
  T.gradcheck(function(a) return a:sum() end, { x })
  T.gradcheck(function(a) return a:sum(2) end, { x })
  T.gradcheck(function(a) return a:mean({ 1, 3 }, true) end, { x })
  T.gradcheck(function(a) return a:max(-1) end, { x })
  T.gradcheck(function(a) return a:max() end, { x })
end)

T.test("sum values", function()
  local x = zr.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
  T.near(x:sum(), 21)
  T.near(x:sum(1), { 5, 7, 9 })
  T.near(x:sum(2), { 6, 15 })
  T.near(x:mean(-1), { 2, 5 })
  local v, i = x:max(2)
  T.near(v, { 3, 6 }); T.near(i, { 3, 3 })
  T.eq(#x:sum(2, true):shape(), 2)
end)

-- max over long rows (the CPU kernel works in chunks of 64): the first of equal maxima across chunks, the first
-- NaN, a row of -inf, the max in the last partial chunk or at 0; f32 and f64
T.test("max over long rows: first index of the max, NaN wins, -inf rows", function()
  local n, nan, inf = 200, 0 / 0, math.huge
  local rows = {}
  local function row(set)
    local t = {}
    for j = 1, n do t[j] = math.sin(j) end
    for j, v in pairs(set) do t[j] = v end
    rows[#rows + 1] = t
  end
  row { [71] = 5, [151] = 5 }        -- a tie across chunks: index 70
  row { [131] = nan, [181] = nan, [3] = 9 } -- NaN wins, the first one: 130
  local ninf = {}
  for j = 1, n do ninf[j] = -inf end
  row(ninf)                           -- all -inf: 0
  row { [200] = 7 }                   -- the last partial chunk: 199
  row { [1] = 7, [65] = 7 }           -- at 0
  local want_i = { 70, 130, 0, 199, 0 }
  for _, dt in ipairs { "f32", "f64" } do
    local v, i = zr.tensor(rows, { dtype = dt }):max(2)
    local vi, ii = v:flat_table(), i:flat_table()
    for r = 1, #rows do
      T.eq(ii[r], want_i[r] + 1, dt .. " row " .. r .. " index (1-based)")
      local w = rows[r][want_i[r] + 1]
      assert(w ~= w and vi[r] ~= vi[r] or vi[r] == w, dt .. " row " .. r .. " value " .. tostring(vi[r]))
    end
  end
end)

T.done()
