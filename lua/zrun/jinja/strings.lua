-- zrun.jinja's strings as Python sees them: code points, not bytes (UTF-8 text), and the str
-- methods' ways of stripping, splitting, replacing and changing case.
local concat, floor = table.concat, math.floor

local V = require "zrun.jinja.values"
local NONE, fail = V.NONE, V.fail

local function ascii(s) return not s:find("[\128-\255]") end
local function ulen(s)
  if ascii(s) then return #s end
  return select(2, s:gsub("[^\128-\191]", ""))
end
local function uchars(s)
  local t = {}
  if ascii(s) then for i = 1, #s do t[i] = s:sub(i, i) end return t end
  for c in s:gmatch("[%z\1-\127\192-\255][\128-\191]*") do t[#t + 1] = c end
  return t
end
local function utf8(cp)
  if cp < 0x80 then return string.char(cp) end
  if cp < 0x800 then return string.char(0xC0 + floor(cp / 64), 0x80 + cp % 64) end
  if cp < 0x10000 then return string.char(0xE0 + floor(cp / 4096), 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64) end
  return string.char(0xF0 + floor(cp / 262144), 0x80 + floor(cp / 4096) % 64, 0x80 + floor(cp / 64) % 64, 0x80 + cp % 64)
end

local function set_of(chars)
  local s = {}
  for c in chars:gmatch("[%z\1-\127\192-\255][\128-\191]*") do s[c] = true end
  return s
end
local WS_CLASS = "[^ \t\n\r\f\v\28-\31]" -- not what str.strip() removes (its ASCII part)
local function strip(s, chars, left, right)
  if not chars or not chars:find("[\128-\255]") then -- ASCII characters to strip: Lua patterns
    local class = chars and "[^" .. chars:gsub("[%^%]%-%%]", "%%%0") .. "]" or WS_CLASS
    if chars == "" then return s end
    local i, j = 1, #s
    if left then i = s:find(class); if not i then return "" end end
    if right then j = s:match(".*()" .. class); if not j then return "" end end
    return s:sub(i, j)
  end
  local set = set_of(chars)
  local cs = uchars(s)
  local i, j = 1, #cs
  if left then while i <= j and set[cs[i]] do i = i + 1 end end
  if right then while j >= i and set[cs[j]] do j = j - 1 end end
  return concat(cs, "", i, j)
end

local function split_ws(s, maxsplit)
  local out, pos = {}, 1
  while true do
    local a, b = s:find("[^ \t\n\r\f\v\28-\31]+", pos)
    if not a then break end
    if maxsplit and #out == maxsplit then out[#out + 1] = s:sub(a); break end -- Python keeps its trailing spaces
    out[#out + 1] = s:sub(a, b)
    pos = b + 1
  end
  return out
end
local function split(s, sep, maxsplit)
  if sep == nil or sep == NONE then return split_ws(s, maxsplit) end
  if sep == "" then fail("empty separator") end
  local out, pos = {}, 1
  while true do
    local a, b = s:find(sep, pos, true)
    if not a or (maxsplit and #out == maxsplit) then break end
    out[#out + 1] = s:sub(pos, a - 1)
    pos = b + 1
  end
  out[#out + 1] = s:sub(pos)
  return out
end

local function replace(s, old, new, count)
  if old == "" then
    local cs = uchars(s)
    local out = { new }
    for i, c in ipairs(cs) do out[#out + 1] = c; if not count or i < count then out[#out + 1] = new end end
    return concat(out)
  end
  local out, pos, n = {}, 1, 0
  while not count or n < count do
    local a, b = s:find(old, pos, true)
    if not a then break end
    out[#out + 1] = s:sub(pos, a - 1); out[#out + 1] = new
    pos, n = b + 1, n + 1
  end
  out[#out + 1] = s:sub(pos)
  return concat(out)
end

-- str.title(): a cased letter after an uncased character starts a word.
local function py_title(s)
  local prev = false
  return (s:gsub(".", function(c)
    local letter = c:find("%a") ~= nil
    local r = letter and (prev and c:lower() or c:upper()) or c
    prev = letter
    return r
  end))
end
local function capitalize(s) return s:sub(1, 1):upper() .. s:sub(2):lower() end

return {
  ascii = ascii, ulen = ulen, uchars = uchars, utf8 = utf8, strip = strip, split_ws = split_ws, split = split,
  replace = replace, py_title = py_title, capitalize = capitalize,
}
