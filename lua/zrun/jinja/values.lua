-- zrun.jinja's values: the kinds a template sees (str, int, float, bool, none, undefined, list,
-- tuple, dict, namespace, callable, loop) and Python's view of them: repr/str, truthiness, equality,
-- a mapping's key order. Lua values are the template's values; metatables tag the kinds Lua has no
-- type for. Errors raised while rendering are ERR tables (fail), shown with the line.
local concat, floor, huge, fmt = table.concat, math.floor, math.huge, string.format

local has_cjson, cjson = pcall(require, "cjson")
local NONE = has_cjson and cjson.null or setmetatable({}, { __tostring = function() return "None" end })

-- Metatables that tag the template's own value kinds.
local FLOAT = {}   -- {v = x}: a Python float whose value is integral (prints "2.0")
local UNDEF = {}   -- {msg = "'x' is undefined"} or {obj =, attr =}: jinja2's Undefined
local NS = {}      -- namespace(): attributes live in the table itself
local TUPLE = {}   -- a list that prints as (a, b)
local CALL = {}    -- {fn = function(args, kw), name = ...}: globals, macros, bound methods
local LOOP = {}    -- the `loop` variable of a for loop
local ERR = {}     -- {msg = ..., raise = bool}: an error raised while rendering
local ORDER = setmetatable({}, { __mode = "k" }) -- dicts made by the template -> their key order

local PYTYPE_OF -- pytype(v), defined with the value kinds below
local function fail(msg) error(setmetatable({ msg = msg }, ERR), 0) end

local function undef(msg) return setmetatable({ msg = msg }, UNDEF) end
local function undef_msg(u)
  if u.msg then return u.msg end
  return fmt("'%s object' has no attribute '%s'", PYTYPE_OF(u.obj), tostring(u.attr))
end
local function mkfloat(x)
  if x == floor(x) and x > -huge and x < huge then return setmetatable({ v = x }, FLOAT) end
  return x
end
local function mkdict(keys) local d = {}; ORDER[d] = keys or {}; return d end
local function callable(fn, name) return setmetatable({ fn = fn, name = name }, CALL) end

local function is_list(t)
  if ORDER[t] then return false end
  local n = #t
  if n == 0 then return next(t) == nil end
  local c = 0
  for _ in pairs(t) do c = c + 1; if c > n then return false end end
  return c == n
end

-- "str" "int" "float" "bool" "none" "undef" "list" "tuple" "dict" "ns" "call" "loop"
local function kind(v)
  local tv = type(v)
  if tv == "string" then return "str" end
  if tv == "number" then
    if v == floor(v) and v > -huge and v < huge then return "int" end
    return "float"
  end
  if tv == "boolean" then return "bool" end
  if v == nil or v == NONE then return "none" end
  if tv == "table" then
    local mt = getmetatable(v)
    if mt == FLOAT then return "float" elseif mt == UNDEF then return "undef"
    elseif mt == NS then return "ns" elseif mt == TUPLE then return "tuple"
    elseif mt == CALL then return "call" elseif mt == LOOP then return "loop" end
    return is_list(v) and "list" or "dict"
  end
  if tv == "function" then return "call" end
  return "none"
end

local PYTYPE = { str = "str", int = "int", float = "float", bool = "bool", none = "NoneType", undef = "Undefined",
  list = "list", tuple = "tuple", dict = "dict", ns = "Namespace", call = "function", loop = "LoopContext" }
local function pytype(v) return PYTYPE[kind(v)] end
PYTYPE_OF = pytype

-- The number inside v (booleans count as 0/1 as in Python); nil when v is not a number.
local function num(v)
  local tv = type(v)
  if tv == "number" then return v end
  if tv == "boolean" then return v and 1 or 0 end
  if tv == "table" and getmetatable(v) == FLOAT then return v.v end
  return nil
end

local function isfloat(v)
  if type(v) == "number" then return not (v == floor(v) and v > -huge and v < huge) end
  return type(v) == "table" and getmetatable(v) == FLOAT
end

local function fmt_int(x)
  if x > -2^53 and x < 2^53 then return fmt("%d", x) end
  return fmt("%.0f", x)
end

-- Python's repr of a float: the shortest digits that read back, positional for 1e-4 <= |x| < 1e16.
local function fmt_float(x)
  if x ~= x then return "nan" elseif x == huge then return "inf" elseif x == -huge then return "-inf" end
  local s
  for p = 0, 16 do s = fmt("%." .. p .. "e", x); if tonumber(s) == x then break end end
  local sign, d1, drest, e = s:match("^(-?)(%d)%.?(%d*)e([-+]%d+)$")
  local digits, ex = (d1 .. drest):gsub("0+$", ""), tonumber(e)
  if digits == "" then digits = "0" end
  if ex >= -4 and ex < 16 then
    if ex < 0 then return sign .. "0." .. ("0"):rep(-ex - 1) .. digits end
    local int = digits:sub(1, ex + 1)
    int = int .. ("0"):rep(ex + 1 - #int)
    local frac = digits:sub(ex + 2)
    return sign .. int .. "." .. (frac == "" and "0" or frac)
  end
  local m = digits:sub(1, 1) .. (#digits > 1 and "." .. digits:sub(2) or "")
  return fmt("%s%se%s%02d", sign, m, ex < 0 and "-" or "+", math.abs(ex))
end

local function fmt_num(v)
  if type(v) == "table" then return fmt_float(v.v) end
  if v == floor(v) and v > -huge and v < huge then return fmt_int(v) end
  return fmt_float(v)
end

-- The code points >= 0x80 that Python's str.isprintable() rejects and repr() therefore escapes: the
-- assigned ones of categories Cc, Cf, Cs, Co, Zl, Zp and Zs (Unicode 14, Python 3.11), as {first, last}
-- ranges. (Unassigned code points, which Python escapes too, are left as they are.)
local NONPRINT = { { 0x80, 0xa0 }, { 0xad, 0xad }, { 0x600, 0x605 }, { 0x61c, 0x61c }, { 0x6dd, 0x6dd }, { 0x70f, 0x70f },
  { 0x890, 0x891 }, { 0x8e2, 0x8e2 }, { 0x1680, 0x1680 }, { 0x180e, 0x180e }, { 0x2000, 0x200f }, { 0x2028, 0x202f },
  { 0x205f, 0x2064 }, { 0x2066, 0x206f }, { 0x3000, 0x3000 }, { 0xd800, 0xf8ff }, { 0xfeff, 0xfeff }, { 0xfff9, 0xfffb },
  { 0x110bd, 0x110bd }, { 0x110cd, 0x110cd }, { 0x13430, 0x13438 }, { 0x1bca0, 0x1bca3 }, { 0x1d173, 0x1d17a },
  { 0xe0001, 0xe0001 }, { 0xe0020, 0xe007f }, { 0xf0000, 0xffffd }, { 0x100000, 0x10fffd } }

-- The code point of one UTF-8 sequence c (a lead byte and its continuation bytes).
local function codepoint(c)
  local b1, n = c:byte(), #c
  local cp = n == 1 and b1 or n == 2 and b1 % 32 or n == 3 and b1 % 16 or b1 % 8
  for i = 2, n do cp = cp * 64 + c:byte(i) % 64 end
  return cp
end

-- A UTF-8 sequence as repr writes it: itself, or \xhh, \uhhhh, \Uhhhhhhhh when it is not printable.
local function repr_uchar(c)
  local cp = codepoint(c)
  for _, r in ipairs(NONPRINT) do
    if cp < r[1] then return c end
    if cp <= r[2] then
      return cp < 0x100 and fmt("\\x%02x", cp) or cp < 0x10000 and fmt("\\u%04x", cp) or fmt("\\U%08x", cp)
    end
  end
  return c
end

-- Python's repr of a str: single quotes unless the text has ' and no ".
local function repr_str(s)
  local q = (s:find("'", 1, true) and not s:find('"', 1, true)) and '"' or "'"
  s = s:gsub("[%c\\'\"]", function(c)
    if c == "\\" then return "\\\\" elseif c == "\n" then return "\\n" elseif c == "\r" then return "\\r"
    elseif c == "\t" then return "\\t" elseif c == q then return "\\" .. q elseif c == "'" or c == '"' then return c end
    return fmt("\\x%02x", c:byte())
  end)
  if s:find("[\128-\255]") then s = s:gsub("[\194-\244][\128-\191]+", repr_uchar) end
  return q .. s .. q
end

local sorted_keys
-- The keys of a mapping: the template's order for dicts it made, else sorted (Lua has no order).
local function dict_keys(t)
  local o = ORDER[t]
  if o then return o end
  return sorted_keys(t)
end
function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks, function(a, b)
    local ta, tb = type(a), type(b)
    if ta == tb and (ta == "string" or ta == "number") then return a < b end
    return ta < tb
  end)
  return ks
end

local tostr
local function repr(v)
  local k = kind(v)
  if k == "str" then return repr_str(v) end
  if k == "list" or k == "tuple" then
    local parts = {}
    for i = 1, #v do parts[i] = repr(v[i]) end
    if k == "list" then return "[" .. concat(parts, ", ") .. "]" end
    return "(" .. concat(parts, ", ") .. (#v == 1 and ",)" or ")")
  end
  if k == "dict" or k == "ns" then
    local parts = {}
    for _, key in ipairs(k == "ns" and sorted_keys(v) or dict_keys(v)) do parts[#parts + 1] = repr(key) .. ": " .. repr(v[key]) end
    local s = "{" .. concat(parts, ", ") .. "}"
    return k == "ns" and "<Namespace " .. s .. ">" or s
  end
  if k == "undef" then return "Undefined" end
  return tostr(v)
end

-- Python's str(v) as jinja2 prints it ({{ v }}).
function tostr(v)
  local tv = type(v)
  if tv == "string" then return v end
  if tv == "number" then return fmt_num(v) end
  if tv == "boolean" then return v and "True" or "False" end
  local k = kind(v)
  if k == "none" then return "None" elseif k == "undef" then return "" elseif k == "float" then return fmt_num(v)
  elseif k == "call" then return "<function " .. tostring(type(v) == "table" and v.name or "?") .. ">"
  elseif k == "loop" then return "<LoopContext " .. v.index .. "/" .. v.length .. ">" end
  return repr(v)
end

local function truthy(v)
  if v == true then return true end
  if v == false or v == nil or v == NONE then return false end
  local tv = type(v)
  if tv == "string" then return v ~= "" end
  if tv == "number" then return v ~= 0 end
  if tv == "table" then
    local mt = getmetatable(v)
    if mt == FLOAT then return v.v ~= 0 elseif mt == UNDEF then return false
    elseif mt == NS or mt == CALL or mt == LOOP then return true end
    return next(v) ~= nil
  end
  return true
end

local function eq(a, b)
  if a == b then return true end
  if a == nil then a = NONE end
  if b == nil then b = NONE end
  local na, nb = num(a), num(b)
  if na and nb then return na == nb end
  local ka, kb = kind(a), kind(b)
  if ka ~= kb then return false end -- a list never equals a tuple
  if ka == "undef" or ka == "none" then return true end
  if ka == "list" or ka == "tuple" then
    if #a ~= #b then return false end
    for i = 1, #a do if not eq(a[i], b[i]) then return false end end
    return true
  end
  if ka == "dict" then
    for key, v in pairs(a) do if b[key] == nil or not eq(v, b[key]) then return false end end
    for key in pairs(b) do if a[key] == nil then return false end end
    return true
  end
  return false
end

return {
  NONE = NONE, FLOAT = FLOAT, UNDEF = UNDEF, NS = NS, TUPLE = TUPLE, CALL = CALL, LOOP = LOOP, ERR = ERR, ORDER = ORDER,
  fail = fail, undef = undef, undef_msg = undef_msg, mkfloat = mkfloat, mkdict = mkdict, callable = callable,
  kind = kind, pytype = pytype, num = num, isfloat = isfloat, fmt_num = fmt_num, repr_str = repr_str, codepoint = codepoint,
  dict_keys = dict_keys, sorted_keys = sorted_keys, repr = repr, tostr = tostr, truthy = truthy, eq = eq,
}
