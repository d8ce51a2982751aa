-- zrun.pyformat: Python's "%.Nf", checked against what CPython 3 prints for the same doubles
-- (the expected strings were printed by CPython 3.x, by hand, once; ties round to even on the exact
-- binary value, and a decimal that looks like a tie is usually not one: 1234567.865 is below it).
local zr = require "zrun"
local T = zr.testing
local P = require "zrun.pyformat"

T.test("fixed: Python's rounding of exact ties and near-ties", function()
  local cases = { -- x, digits, what Python prints for f"{x:.{digits}f}"
    { 1.125, 2, "1.12" }, { 0.125, 2, "0.12" }, { 0.375, 2, "0.38" }, { -1.125, 2, "-1.12" },
    { 2.675, 2, "2.67" }, { 1.005, 2, "1.00" }, { 0.005, 2, "0.01" }, { 0.015, 2, "0.01" }, { 0.025, 2, "0.03" },
    { 2.5, 0, "2" }, { 3.5, 0, "4" }, { 0.5, 0, "0" }, { 1.5, 0, "2" }, { 0, 2, "0.00" }, { -0.0, 2, "-0.00" },
    { -0.001, 2, "-0.00" }, { 1e-300, 2, "0.00" }, { 1 / 3, 3, "0.333" }, { 2 / 3, 2, "0.67" },
    { 15.5390625, 2, "15.54" }, { 13.5, 2, "13.50" }, { 1234567.875, 2, "1234567.88" }, { 1234567.865, 2, "1234567.86" }, { 123456.785, 2, "123456.79" },
    { 2 ^ 53, 2, "9007199254740992.00" }, { 7.9999999999, 2, "8.00" }, { 0.9999, 3, "1.000" },
  }
  for _, c in ipairs(cases) do T.eq(P.fixed(c[1], c[2]), c[3], ("%.17g with %d digits"):format(c[1], c[2])) end
  T.eq(P.fixedw(1.125, 6, 2), "  1.12"); T.eq(P.fixedw(1234.5, 7, 2), "1234.50"); T.eq(P.fixedw(12345.5, 7, 2), "12345.50")
  T.eq(P.fixed(0 / 0, 2), "nan"); T.eq(P.fixed(math.huge, 2), "inf")
  -- LuaJIT's own formatter is what this replaces: it rounds the tie up
  if string.format("%.2f", 1.125) == "1.12" then print("(this LuaJIT already rounds ties to even)") end
end)

T.done()
