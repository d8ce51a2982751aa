-- Python's fixed-point formatting ("%.2f" % x, f"{x:7.2f}"), digit for digit, for output that must
-- match what a Python tool prints (DeepSpeed's memory estimator). Python rounds the exact binary
-- value of the double, ties to even (1.125 -> "1.12", 0.125 -> "0.12", 2.675 -> "2.67" because the
-- double is just below 2.675); LuaJIT's own formatter rounds ties up. Not a general printf.
local ffi = require "ffi"

local M = {}
local floor, frexp, fmt = math.floor, math.frexp, string.format

local U64 = ffi.typeof("uint64_t")

-- x rounded to `digits` decimals as Python does, as text: "-1.12", "0.00", "123456.79".
function M.fixed(x, digits)
  digits = digits or 6
  -- (m * 10^digits below stays under 2^63 for m < 2^53 when digits <= 3)
  assert(digits >= 0 and digits <= 3 and digits == floor(digits), "pyformat.fixed: digits must be 0..3")
  if x ~= x then return "nan" end
  if x == math.huge then return "inf" elseif x == -math.huge then return "-inf" end
  local neg = x < 0 or 1 / x < 0 -- Python keeps the sign of -0.0 and of values that round to zero
  local a = neg and -x or x
  local scale = 10 ^ digits
  local q -- round(a * 10^digits), exactly
  if a >= 2 ^ 52 then -- an integer already: nothing to round
    if a * scale >= 2 ^ 64 then error("pyformat.fixed: value out of range: " .. tostring(x), 2) end
    q = U64(a) * U64(scale)
  else
    -- a = m * 2^e with m < 2^53 an integer; a * scale = m * scale / 2^-e, done in 64-bit integers
    local f, e = frexp(a)
    local m, k = f * 2 ^ 53, 53 - e -- a = m / 2^k
    local num = U64(m) * U64(scale) -- < 2^63
    if k <= 0 then
      q = num * U64(2 ^ -k)
    elseif k >= 64 then
      q = U64(0) -- num < 2^63 <= 2^(k-1): below one half, rounds to 0
    else
      q = num / U64(2 ^ k) -- uint64 division truncates
      local r = num - q * U64(2 ^ k)
      local half = U64(2 ^ (k - 1))
      if r > half or (r == half and q % 2 == 1) then q = q + 1 end
    end
  end
  local s = tostring(q):gsub("ULL$", "")
  if digits > 0 then
    if #s <= digits then s = string.rep("0", digits - #s + 1) .. s end
    s = s:sub(1, #s - digits) .. "." .. s:sub(#s - digits + 1)
  end
  return (neg and "-" or "") .. s
end

-- f"{x:W.Df}": right-aligned in W characters.
function M.fixedw(x, width, digits) return fmt("%" .. width .. "s", M.fixed(x, digits)) end

return M
