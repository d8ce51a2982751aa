-- Strided copies on the CPU (runtime/core/tensor_copy.c: row by row over the last dim, a memcpy a row where both
-- are contiguous along it): transposed and sliced views made contiguous, casts on the way, broadcast sources, a
-- strided destination. The reference is arithmetic: x = 0, 1, 2, ... laid out (A, B, C), so element (i, j, k) of any
-- view of it is known without copying anything.
local zr = require "zrun"
local T = zr.testing

local A, B, C = 3, 5, 7
local x = zr.arange(0, A * B * C):to("f32"):view(A, B, C)
local function val(i, j, k) return (i - 1) * B * C + (j - 1) * C + (k - 1) end -- x[i][j][k], 1-based

-- every element of t (contiguous: T.flat reads it in order) equals f(index...)
local function check(t, f, what)
  local sh, v, n = t:shape(), T.flat(t), 0
  local idx = {}
  local function walk(d)
    if d > #sh then
      n = n + 1
      local want = f(unpack(idx))
      if v[n] ~= want then error(("%s: element %d (%s) is %s, expected %s"):format(what, n, table.concat(idx, ","), tostring(v[n]), tostring(want)), 2) end
      return
    end
    for i = 1, sh[d] do idx[d] = i; walk(d + 1) end
  end
  walk(1)
  T.eq(n, t:numel(), what .. ": element count")
end

T.test("transposed and sliced views made contiguous, with and without a cast", function()
  check(x:transpose(1, 3):contiguous(), function(k, j, i) return val(i, j, k) end, "transpose(1, 3)")
  check(x:transpose(2, 3):contiguous(), function(i, k, j) return val(i, j, k) end, "transpose(2, 3): last dim strided")
  check(x:transpose(1, 2):contiguous(), function(j, i, k) return val(i, j, k) end, "transpose(1, 2): rows contiguous")
  check(x:narrow(3, 2, 4):contiguous(), function(i, j, k) return val(i, j, k + 1) end, "narrow of the last dim")
  check(x:transpose(1, 3):to("bf16"):float(), function(k, j, i) return val(i, j, k) end, "transpose to bf16")
  check(x:transpose(2, 3):to("f64"), function(i, k, j) return val(i, j, k) end, "transpose(2, 3) to f64")
end)

T.test("broadcast sources and a strided destination", function()
  local row = zr.arange(0, C):to("f32"):view(1, C)
  local d = zr.zeros({ B, C })
  d:copy_(row)
  check(d, function(_, k) return k - 1 end, "a row broadcast down")
  local col = zr.arange(0, B):to("f32"):view(B, 1)
  d:copy_(col)
  check(d, function(j, _) return j - 1 end, "a column broadcast across (source stride 0 along the last dim)")
  local dt = zr.zeros({ C, B })
  dt:transpose(1, 2):copy_(x[2]) -- (B, C) into a transposed view of (C, B)
  check(dt, function(k, j) return val(2, j, k) end, "into a transposed destination")
  local s = zr.tensor(5)
  local z = zr.zeros({ 2, 3 })
  z:copy_(s)
  check(z, function() return 5 end, "a 0-dim source")
end)

T.done()
