-- zrun.jinja's library: the methods of str/dict/list, the filters, the tests, json.dumps (tojson)
-- and the globals (raise_exception, strftime_now, namespace, range, dict), as jinja2's sandbox
-- and Python give them to chat templates.
local concat, floor, huge, fmt = table.concat, math.floor, math.huge, string.format

local V = require "zrun.jinja.values"
local S = require "zrun.jinja.strings"
local RT = require "zrun.jinja.runtime"
local NONE, NS, TUPLE, ERR, ORDER = V.NONE, V.NS, V.TUPLE, V.ERR, V.ORDER
local fail, undef, mkfloat, mkdict, callable = V.fail, V.undef, V.mkfloat, V.mkdict, V.callable
local kind, pytype, num, isfloat, fmt_num = V.kind, V.pytype, V.num, V.isfloat, V.fmt_num
local dict_keys, sorted_keys, repr, tostr, truthy, eq = V.dict_keys, V.sorted_keys, V.repr, V.tostr, V.truthy, V.eq
local ulen, uchars, strip, split_ws, split = S.ulen, S.uchars, S.strip, S.split_ws, S.split
local replace, py_title, capitalize = S.replace, S.py_title, S.capitalize
local METHODS, check_defined, arith, lt, contains = RT.METHODS, RT.check_defined, RT.arith, RT.lt, RT.contains
local iterate, to_list, bound, no_attr, getattr, getitem = RT.iterate, RT.to_list, RT.bound, RT.no_attr, RT.getattr, RT.getitem

-- Argument i (or keyword `name`) of a call, else `default`; none counts as given.
local function arg(args, kw, i, name, default)
  local v = args[i]
  if v == nil and name then v = kw[name] end
  if v == nil then return default end
  return v
end
local function opt(v) if v == NONE then return nil end return v end
local function int_arg(v, what)
  local n = num(v)
  if not n or n ~= floor(n) then fail(what .. " must be an integer, not " .. pytype(v)) end
  return n
end
local function str_arg(v, what)
  if type(v) ~= "string" then fail(what .. " must be a str, not " .. pytype(v)) end
  return v
end

local function affix_test(check)
  return function(s, args)
    local x = arg(args, {}, 1)
    if kind(x) == "tuple" or kind(x) == "list" then
      for _, p in ipairs(x) do if check(s, str_arg(p, "startswith/endswith argument")) then return true end end
      return false
    end
    return check(s, str_arg(x, "startswith/endswith argument"))
  end
end
local function find(s, sub)
  local a = s:find(sub, 1, true)
  if not a then return -1 end
  return ulen(s:sub(1, a - 1))
end

-- str.format with {} / {0} / {name} fields (no format specs beyond what str() gives).
local function str_format(s, args, kw)
  local auto = 0
  local out = s:gsub("{{", "\1"):gsub("}}", "\2"):gsub("{([^{}]*)}", function(field)
    local key, spec = field:match("^([^:!]*)(.*)$")
    if spec ~= "" then fail("str.format: format specs are not supported ({" .. field .. "})") end
    local v
    if key == "" then auto = auto + 1; v = args[auto]
    elseif key:match("^%d+$") then v = args[tonumber(key) + 1]
    else v = kw[key] end
    if v == nil then fail("str.format: no value for {" .. field .. "}") end
    return tostr(v)
  end)
  return (out:gsub("\1", "{"):gsub("\2", "}"))
end

METHODS.str = {
  strip = function(s, a) return strip(s, opt(a[1]), true, true) end,
  lstrip = function(s, a) return strip(s, opt(a[1]), true, false) end,
  rstrip = function(s, a) return strip(s, opt(a[1]), false, true) end,
  split = function(s, a, kw) return split(s, opt(arg(a, kw, 1, "sep")), opt(arg(a, kw, 2, "maxsplit")) ~= -1 and opt(arg(a, kw, 2, "maxsplit")) or nil) end,
  splitlines = function(s) local r = split(s, "\n"); if r[#r] == "" then r[#r] = nil end return r end,
  startswith = affix_test(function(s, p) return s:sub(1, #p) == p end),
  endswith = affix_test(function(s, p) return p == "" or s:sub(-#p) == p end),
  upper = function(s) return s:upper() end,
  lower = function(s) return s:lower() end,
  title = function(s) return py_title(s) end,
  capitalize = function(s) return capitalize(s) end,
  replace = function(s, a) return replace(s, str_arg(a[1], "replace()"), str_arg(a[2], "replace()"), a[3] and a[3] >= 0 and a[3] or nil) end,
  find = function(s, a) return find(s, str_arg(a[1], "find()")) end,
  index = function(s, a) local i = find(s, str_arg(a[1], "index()")); if i < 0 then fail("substring not found") end return i end,
  count = function(s, a) local sub = str_arg(a[1], "count()"); if sub == "" then return ulen(s) + 1 end return select(2, replace(s, sub, "\0"):gsub("%z", "")) end,
  join = function(s, a) local parts = to_list(a[1]); for i, p in ipairs(parts) do parts[i] = str_arg(p, "join() item") end return concat(parts, s) end,
  format = function(s, a, kw) return str_format(s, a, kw) end,
  isdigit = function(s) return s ~= "" and not s:find("%D") end,
  isalpha = function(s) return s ~= "" and not s:find("%A") end,
  isspace = function(s) return s ~= "" and not s:find("[^ \t\n\r\f\v]") end,
  islower = function(s) return s:find("%l") ~= nil and not s:find("%u") end,
  isupper = function(s) return s:find("%u") ~= nil and not s:find("%l") end,
}
METHODS.dict = {
  items = function(d)
    local r = {}
    for i, k in ipairs(dict_keys(d)) do r[i] = setmetatable({ k, d[k] }, TUPLE) end
    return r
  end,
  keys = function(d) return to_list(dict_keys(d)) end,
  values = function(d) local r = {}; for i, k in ipairs(dict_keys(d)) do r[i] = d[k] end return r end,
  get = function(d, a)
    local v
    if a[1] ~= nil and a[1] ~= NONE then v = d[a[1]] end
    if v == nil then return a[2] or NONE end
    return v
  end,
  copy = function(d) local r = mkdict(to_list(dict_keys(d))); for k, v in pairs(d) do r[k] = v end return r end,
}
METHODS.list = {
  index = function(l, a) for i = 1, #l do if eq(l[i], a[1]) then return i - 1 end end fail(repr(a[1]) .. " is not in list") end,
  count = function(l, a) local c = 0; for i = 1, #l do if eq(l[i], a[1]) then c = c + 1 end end return c end,
}
METHODS.ns = {}

-- json.dumps(x, ensure_ascii=..., indent=..., separators=..., sort_keys=...)
local JSON_ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t", ["\b"] = "\\b", ["\f"] = "\\f" }
-- A UTF-8 sequence as \uXXXX (a surrogate pair above U+FFFF), as ensure_ascii=True writes it.
local function json_uescape(c)
  local cp = V.codepoint(c)
  if cp < 0x10000 then return fmt("\\u%04x", cp) end
  cp = cp - 0x10000
  return fmt("\\u%04x\\u%04x", 0xd800 + floor(cp / 0x400), 0xdc00 + cp % 0x400)
end
local function json_str(s, ascii)
  s = s:gsub('[%c"\\]', function(c)
    if c == "\127" then return ascii and "\\u007f" or c end
    return JSON_ESC[c] or fmt("\\u%04x", c:byte())
  end)
  if ascii and s:find("[\128-\255]") then s = s:gsub("[\192-\247][\128-\191]*", json_uescape) end
  return '"' .. s .. '"'
end
local function json_key(k)
  local t = kind(k)
  if t == "str" then return k elseif t == "bool" then return k and "true" or "false"
  elseif t == "none" then return "null" elseif t == "int" or t == "float" then return fmt_num(k) end
  fail("keys must be str, int, float, bool or None, not " .. pytype(k))
end
local function dumps(v, o, level)
  local k = kind(v)
  if k == "str" then return json_str(v, o.ascii) elseif k == "none" then return "null"
  elseif k == "bool" then return v and "true" or "false"
  elseif k == "int" or k == "float" then
    local x = num(v)
    if x ~= x then return "NaN" elseif x == huge then return "Infinity" elseif x == -huge then return "-Infinity" end
    return fmt_num(v)
  end
  local nl, nl_in = "", ""
  if o.indent then nl, nl_in = "\n" .. o.indent:rep(level), "\n" .. o.indent:rep(level + 1) end
  local parts = {}
  if k == "list" or k == "tuple" then
    if #v == 0 then return "[]" end
    for i = 1, #v do parts[i] = dumps(v[i], o, level + 1) end
    return "[" .. nl_in .. concat(parts, o.item_sep .. nl_in) .. nl .. "]"
  elseif k == "dict" then
    local keys = dict_keys(v)
    if #keys == 0 then return "{}" end
    if o.sort_keys and ORDER[v] then keys = sorted_keys(v) end
    for i, key in ipairs(keys) do parts[i] = json_str(json_key(key), o.ascii) .. o.key_sep .. dumps(v[key], o, level + 1) end
    return "{" .. nl_in .. concat(parts, o.item_sep .. nl_in) .. nl .. "}"
  end
  fail("Object of type " .. pytype(v) .. " is not JSON serializable")
end
-- transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
local function tojson(v, args, kw)
  local indent = opt(arg(args, kw, 2, "indent"))
  local seps = opt(arg(args, kw, 3, "separators"))
  local o = { sort_keys = truthy(arg(args, kw, 4, "sort_keys", false)), ascii = truthy(arg(args, kw, 1, "ensure_ascii", false)) }
  if indent ~= nil then
    o.indent = type(indent) == "string" and indent or (" "):rep(int_arg(indent, "tojson indent"))
  end
  if seps then o.item_sep, o.key_sep = str_arg(seps[1], "separators"), str_arg(seps[2], "separators")
  else o.item_sep, o.key_sep = indent ~= nil and "," or ", ", ": " end
  return dumps(v, o, 0)
end

local function py_int(v, default)
  local k = kind(v)
  if k == "int" or k == "bool" then return num(v) end
  if k == "float" then local x = num(v); return x >= 0 and floor(x) or -floor(-x) end
  if k == "str" then
    local s = strip(v, nil, true, true):gsub("_", "")
    local n = s:match("^[-+]?%d+$") and tonumber(s)
    if n then return n end
    n = tonumber(s)
    if n and s:match("^[-+]?[%d.]+[eE]?[-+]?%d*$") then return n >= 0 and floor(n) or -floor(-n) end
  end
  return default
end
local function py_float(v, default)
  local k = kind(v)
  if k == "int" or k == "float" or k == "bool" then return mkfloat(num(v)) end
  if k == "str" then
    local s = strip(v, nil, true, true):lower()
    local n = tonumber(s)
    if s == "inf" or s == "+inf" or s == "infinity" then n = huge elseif s == "-inf" or s == "-infinity" then n = -huge
    elseif s == "nan" then n = 0 / 0 end
    if n and not s:find("^0x") then return mkfloat(n) end
  end
  return default
end

-- Python's round(x, p), ties to even (exact enough for the decimal values templates see).
local function py_round(x, p)
  local m = 10 ^ p
  local y = x * m
  local r = floor(y + 0.5)
  if r - y == 0.5 and r % 2 ~= 0 then r = r - 1 end
  if r == 0 and x < 0 then return -0.0 end -- Python keeps the sign: round(-0.4) is -0.0
  return r / m
end

local TESTS
local FILTERS

-- The test a select/selectattr-style filter applies: a named test with its arguments, or truthiness.
local function test_fn(name, extra)
  if name == nil then return truthy end
  local t = TESTS[name]
  if not t then fail("unknown test '" .. tostring(name) .. "'") end
  return function(v) return t(v, extra) end
end
local function attr_path(v, path)
  if type(path) == "number" then return getitem(v, path) end
  for part in tostring(path):gmatch("[^.]+") do v = getitem(v, tonumber(part) or part) end
  return v
end
-- (select, reject, selectattr, rejectattr and map give nothing for a false value -- none, "", [] --
-- without looking at their arguments, as jinja2's do: `tools | selectattr(...)` with tools = none.)
local function select_filter(keep, by_attr)
  return function(v, args)
    if not truthy(v) then return {} end
    local a = by_attr and args[1]
    local i0 = by_attr and 2 or 1
    local extra = {}
    for i = i0 + 1, #args do extra[#extra + 1] = args[i] end
    local test = test_fn(args[i0], extra)
    local r = {}
    for _, x in ipairs(iterate(v)) do
      local y = by_attr and attr_path(x, a) or x
      if (test(y) and true or false) == keep then r[#r + 1] = x end
    end
    return r
  end
end

local function escape(s)
  return (tostr(s):gsub("[&<>\"']", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&#34;", ["'"] = "&#39;" }))
end

-- jinja2's title filter: capitalize the pieces between spaces, '-', '(', '{', '[', '<'.
local function jinja_title(s)
  return (s:gsub("([^%s%-%(%{%[<]+)", function(w) return w:sub(1, 1):upper() .. w:sub(2):lower() end))
end

local function indent(s, args, kw)
  local width = arg(args, kw, 1, "width", 4)
  local first, blank = truthy(arg(args, kw, 2, "first", false)), truthy(arg(args, kw, 3, "blank", false))
  local ind = type(width) == "string" and width or (" "):rep(int_arg(width, "indent width"))
  local lines = split(tostr(s) .. "\n", "\n")
  lines[#lines] = nil -- splitlines() of text ending in "\n"
  local rv
  if blank then rv = concat(lines, "\n" .. ind)
  else
    rv = table.remove(lines, 1) or ""
    for i, l in ipairs(lines) do lines[i] = l ~= "" and ind .. l or l end
    if #lines > 0 then rv = rv .. "\n" .. concat(lines, "\n") end
  end
  if first then rv = ind .. rv end
  return rv
end

local function sort_key(case_sensitive)
  return function(x)
    if type(x) == "string" and not case_sensitive then return x:lower() end
    return x
  end
end

FILTERS = {
  trim = function(v, a, kw) return strip(tostr(v), opt(arg(a, kw, 1, "chars")), true, true) end,
  length = function(v)
    local k = kind(v)
    if k == "str" then return ulen(v) elseif k == "list" or k == "tuple" then return #v
    elseif k == "dict" then return #dict_keys(v) elseif k == "undef" then return 0 end
    fail("object of type '" .. pytype(v) .. "' has no len()")
  end,
  tojson = tojson,
  string = function(v) return tostr(v) end,
  int = function(v, a, kw) return py_int(v, arg(a, kw, 1, "default", 0)) end,
  float = function(v, a, kw) return py_float(v, arg(a, kw, 1, "default", mkfloat(0))) end,
  upper = function(v) return tostr(v):upper() end,
  lower = function(v) return tostr(v):lower() end,
  title = function(v) return jinja_title(tostr(v)) end,
  capitalize = function(v) return capitalize(tostr(v)) end,
  default = function(v, a, kw)
    local boolean = truthy(arg(a, kw, 2, "boolean", false))
    if kind(v) == "undef" or (boolean and not truthy(v)) then return arg(a, kw, 1, "default_value", "") end
    return v
  end,
  join = function(v, a, kw)
    local sep, attr = tostr(arg(a, kw, 1, "d", "")), arg(a, kw, 2, "attribute")
    local parts = {}
    for i, x in ipairs(iterate(v)) do parts[i] = tostr(attr and attr_path(x, attr) or x) end
    return concat(parts, sep)
  end,
  first = function(v) local items = iterate(v); if #items == 0 then return undef("No first item, sequence was empty.") end return items[1] end,
  last = function(v) local items = iterate(v); if #items == 0 then return undef("No last item, sequence was empty.") end return items[#items] end,
  list = function(v) return to_list(v) end,
  items = function(v)
    if kind(v) == "undef" then return {} end
    if kind(v) ~= "dict" then fail("can only get item pairs from a mapping, not " .. pytype(v)) end
    return METHODS.dict.items(v)
  end,
  dictsort = function(v, a, kw)
    local cs, by, rev = truthy(arg(a, kw, 1, "case_sensitive", false)), arg(a, kw, 2, "by", "key"), truthy(arg(a, kw, 3, "reverse", false))
    local pairs_ = METHODS.dict.items(v)
    local pos = by == "value" and 2 or 1
    local key = sort_key(cs)
    table.sort(pairs_, function(x, y) if rev then return lt(key(y[pos]), key(x[pos])) end return lt(key(x[pos]), key(y[pos])) end)
    return pairs_
  end,
  sort = function(v, a, kw)
    local rev, cs, attr = truthy(arg(a, kw, 1, "reverse", false)), truthy(arg(a, kw, 2, "case_sensitive", false)), arg(a, kw, 3, "attribute")
    local r, key = to_list(v), sort_key(cs)
    local function k(x) return key(attr and attr_path(x, attr) or x) end
    -- a stable sort, as Python's: ties keep their order
    for i = 1, #r do r[i] = { r[i], i } end
    table.sort(r, function(x, y)
      local kx, ky = k(x[1]), k(y[1])
      if eq(kx, ky) then return x[2] < y[2] end
      if rev then return lt(ky, kx) end
      return lt(kx, ky)
    end)
    for i = 1, #r do r[i] = r[i][1] end
    return r
  end,
  replace = function(v, a, kw)
    local count = opt(arg(a, kw, 3, "count"))
    return replace(tostr(v), tostr(a[1]), tostr(a[2]), count and int_arg(count, "replace count"))
  end,
  reverse = function(v)
    if type(v) == "string" then local cs = uchars(v); local r = {}; for i = #cs, 1, -1 do r[#r + 1] = cs[i] end return concat(r) end
    local items, r = iterate(v), {}
    for i = #items, 1, -1 do r[#r + 1] = items[i] end
    return r
  end,
  map = function(v, a, kw)
    if not truthy(v) then return {} end
    local r, attr = {}, kw.attribute
    local f, extra
    if not attr then
      f = FILTERS[a[1]]
      if not f then fail("unknown filter '" .. tostring(a[1]) .. "'") end
      extra = {}
      for i = 2, #a do extra[i - 1] = a[i] end
    end
    for i, x in ipairs(iterate(v)) do
      if attr then
        local y = attr_path(x, attr)
        if kind(y) == "undef" and kw.default ~= nil then y = kw.default end
        r[i] = y
      else r[i] = f(x, extra, {}) end
    end
    return r
  end,
  select = select_filter(true, false),
  reject = select_filter(false, false),
  selectattr = select_filter(true, true),
  rejectattr = select_filter(false, true),
  unique = function(v, a, kw)
    local cs, attr = truthy(arg(a, kw, 1, "case_sensitive", false)), arg(a, kw, 2, "attribute")
    local seen, r, key = {}, {}, sort_key(cs)
    for _, x in ipairs(iterate(v)) do
      local k = key(attr and attr_path(x, attr) or x)
      local id = type(k) .. ":" .. tostr(k)
      if not seen[id] then seen[id] = true; r[#r + 1] = x end
    end
    return r
  end,
  safe = function(v) return v end,
  escape = function(v) return escape(v) end,
  indent = indent,
  abs = function(v)
    local x = num(check_defined(v))
    if not x then fail("bad operand type for abs(): '" .. pytype(v) .. "'") end
    if isfloat(v) then return mkfloat(math.abs(x)) end
    return math.abs(x)
  end,
  round = function(v, a, kw)
    local p, method = arg(a, kw, 1, "precision", 0), arg(a, kw, 2, "method", "common")
    local x = num(v)
    if not x then fail("round: a number is needed, not " .. pytype(v)) end
    if not isfloat(v) and method == "common" then return x end
    local m = 10 ^ p
    if method == "ceil" then return mkfloat(math.ceil(x * m) / m)
    elseif method == "floor" then return mkfloat(floor(x * m) / m) end
    return mkfloat(py_round(x, p))
  end,
  sum = function(v, a, kw)
    local attr, total = arg(a, kw, 1, "attribute"), arg(a, kw, 2, "start", 0)
    for _, x in ipairs(iterate(v)) do total = arith("+", total, attr and attr_path(x, attr) or x) end
    return total
  end,
  min = function(v) local items = iterate(v); local m = items[1]; for i = 2, #items do if lt(items[i], m) then m = items[i] end end return m or undef("No aggregated item, sequence was empty.") end,
  max = function(v) local items = iterate(v); local m = items[1]; for i = 2, #items do if lt(m, items[i]) then m = items[i] end end return m or undef("No aggregated item, sequence was empty.") end,
  attr = function(v, a) -- an attribute only: a mapping's items are not attributes
    if kind(v) == "dict" then return bound("dict", v, a[1]) or no_attr(v, a[1]) end
    return getattr(v, a[1])
  end,
  batch = function(v, a)
    local n, r = int_arg(a[1], "batch size"), {}
    for i, x in ipairs(iterate(v)) do
      if (i - 1) % n == 0 then r[#r + 1] = {} end
      table.insert(r[#r], x)
    end
    return r
  end,
  wordcount = function(v) return #split_ws(tostr(v)) end,
}
FILTERS.count, FILTERS.d, FILTERS.e = FILTERS.length, FILTERS.default, FILTERS.escape

local function cmp_test(op) return function(v, a) return op(v, a[1]) end end
TESTS = {
  defined = function(v) return kind(v) ~= "undef" end,
  undefined = function(v) return kind(v) == "undef" end,
  none = function(v) return v == NONE or v == nil end,
  string = function(v) return type(v) == "string" end,
  number = function(v) local k = kind(v); return k == "int" or k == "float" or k == "bool" end,
  integer = function(v) return kind(v) == "int" end,
  float = function(v) return kind(v) == "float" end,
  boolean = function(v) return type(v) == "boolean" end,
  ["true"] = function(v) return v == true end,
  ["false"] = function(v) return v == false end,
  mapping = function(v) return kind(v) == "dict" end,
  iterable = function(v) local k = kind(v); return k == "str" or k == "list" or k == "tuple" or k == "dict" or k == "undef" end,
  sequence = function(v) local k = kind(v); return k == "str" or k == "list" or k == "tuple" or k == "dict" end,
  callable = function(v) return kind(v) == "call" end,
  even = function(v) return int_arg(v, "even test value") % 2 == 0 end,
  odd = function(v) return int_arg(v, "odd test value") % 2 == 1 end,
  divisibleby = function(v, a) return num(v) % num(a[1]) == 0 end,
  eq = cmp_test(eq),
  ne = cmp_test(function(x, y) return not eq(x, y) end),
  lt = cmp_test(lt),
  gt = cmp_test(function(x, y) return lt(y, x) end),
  le = cmp_test(function(x, y) return not lt(y, x) end),
  ge = cmp_test(function(x, y) return not lt(x, y) end),
  ["in"] = function(v, a) return contains(a[1], v) end,
  lower = function(v) return type(v) == "string" and v:lower() == v end,
  upper = function(v) return type(v) == "string" and v:upper() == v end,
  sameas = function(v, a) return v == a[1] end,
  escaped = function() return false end,
  filter = function(v) return FILTERS[v] ~= nil end,
  test = function(v) return TESTS[v] ~= nil end,
}
TESTS.equalto, TESTS["=="], TESTS["!="], TESTS["<"], TESTS[">"], TESTS["<="], TESTS[">="], TESTS.greaterthan, TESTS.lessthan =
  TESTS.eq, TESTS.eq, TESTS.ne, TESTS.lt, TESTS.gt, TESTS.le, TESTS.ge, TESTS.gt, TESTS.lt

local MAX_RANGE = 100000 -- jinja2's sandbox refuses bigger ranges too
local GLOBALS = {
  raise_exception = callable(function(args) error(setmetatable({ msg = tostr(args[1]), raise = true }, ERR), 0) end, "raise_exception"),
  strftime_now = callable(function(args) return os.date(str_arg(args[1], "strftime_now format")) end, "strftime_now"),
  namespace = callable(function(args, kw)
    local ns = setmetatable({}, NS)
    if args[1] then for k, v in pairs(args[1]) do ns[k] = v end end
    for k, v in pairs(kw) do ns[k] = v end
    return ns
  end, "namespace"),
  range = callable(function(args)
    local a, b, step = 0, int_arg(args[1], "range()"), 1
    if args[2] then a, b = b, int_arg(args[2], "range()") end
    if args[3] then step = int_arg(args[3], "range() step") end
    if step == 0 then fail("range() arg 3 must not be zero") end
    local n = step > 0 and math.ceil((b - a) / step) or math.ceil((a - b) / -step)
    if n > MAX_RANGE then fail("range too big: at most " .. MAX_RANGE .. " items") end
    local r = {}
    for i = 0, n - 1 do r[i + 1] = a + i * step end
    return r
  end, "range"),
  dict = callable(function(args, kw, kwnames)
    local d = mkdict()
    if args[1] then for _, k in ipairs(dict_keys(args[1])) do d[k] = args[1][k]; table.insert(ORDER[d], k) end end
    for _, k in ipairs(kwnames or sorted_keys(kw)) do if d[k] == nil then table.insert(ORDER[d], k) end; d[k] = kw[k] end
    return d
  end, "dict"),
}

return { filters = FILTERS, tests = TESTS, globals = GLOBALS, tojson = tojson }
