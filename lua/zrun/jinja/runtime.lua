-- zrun.jinja's runtime: Python's operators (arithmetic, comparison, `in`), attribute and item
-- access (jinja2's getattr/getitem, sandboxed: no mutating methods), slicing, iteration and calls.
-- METHODS (kind -> name -> function(self, args, kw)) is filled by zrun.jinja.library.
local concat, floor, fmt = table.concat, math.floor, string.format

local V = require "zrun.jinja.values"
local S = require "zrun.jinja.strings"
local NONE, FLOAT, UNDEF, TUPLE, CALL = V.NONE, V.FLOAT, V.UNDEF, V.TUPLE, V.CALL
local fail, undef, undef_msg, mkfloat, callable = V.fail, V.undef, V.undef_msg, V.mkfloat, V.callable
local kind, pytype, num, isfloat, dict_keys, repr, eq = V.kind, V.pytype, V.num, V.isfloat, V.dict_keys, V.repr, V.eq
local ascii, ulen, uchars = S.ascii, S.ulen, S.uchars

local function type_error(op, a, b)
  fail(fmt("unsupported operand type(s) for %s: '%s' and '%s'", op, pytype(a), pytype(b)))
end
local function check_defined(v)
  if type(v) == "table" and getmetatable(v) == UNDEF then fail(undef_msg(v)) end
  return v
end

local ARITH = {
  ["+"] = function(x, y) return x + y end,
  ["-"] = function(x, y) return x - y end,
  ["*"] = function(x, y) return x * y end,
  ["%"] = function(x, y) if y == 0 then fail("integer division or modulo by zero") end return x % y end,
  ["//"] = function(x, y) if y == 0 then fail("integer division or modulo by zero") end return floor(x / y) end,
  ["**"] = function(x, y) return x ^ y end,
}
local function arith(op, a, b)
  check_defined(a); check_defined(b)
  local x, y = num(a), num(b)
  if x and y then
    if op == "/" then
      if y == 0 then fail("division by zero") end
      return mkfloat(x / y)
    end
    local r = ARITH[op](x, y)
    if isfloat(a) or isfloat(b) or (op == "**" and y < 0) then return mkfloat(r) end
    return r
  end
  local ta, tb = type(a), type(b)
  if op == "+" then
    if ta == "string" and tb == "string" then return a .. b end
    local ka, kb = kind(a), kind(b)
    if (ka == "list" or ka == "tuple") and ka == kb then
      local r = {}
      for i = 1, #a do r[i] = a[i] end
      for i = 1, #b do r[#a + i] = b[i] end
      return ka == "tuple" and setmetatable(r, TUPLE) or r
    end
  elseif op == "*" then
    local s, n = a, y
    if not n then s, n = b, x end
    if n and n == floor(n) and not isfloat(n) then
      if type(s) == "string" then return n > 0 and s:rep(n) or "" end
      if kind(s) == "list" then
        local r = {}
        for _ = 1, n do for i = 1, #s do r[#r + 1] = s[i] end end
        return r
      end
    end
  end
  local ka = kind(a)
  if op == "+" and (ka == "str" or ka == "list" or ka == "tuple") then
    fail(fmt('can only concatenate %s (not "%s") to %s', pytype(a), pytype(b), pytype(a)))
  end
  type_error(op, a, b)
end

local function lt(a, b)
  local x, y = num(a), num(b)
  if x and y then return x < y end
  if type(a) == "string" and type(b) == "string" then return a < b end -- UTF-8 byte order = code point order
  local ka, kb = kind(a), kind(b)
  if (ka == "list" or ka == "tuple") and (kb == "list" or kb == "tuple") then
    for i = 1, math.min(#a, #b) do
      if not eq(a[i], b[i]) then return lt(a[i], b[i]) end
    end
    return #a < #b
  end
  check_defined(a); check_defined(b)
  fail(fmt("'<' not supported between instances of '%s' and '%s'", pytype(a), pytype(b)))
end

local function contains(hay, x)
  local k = kind(hay)
  if k == "str" then
    if type(x) ~= "string" then fail("'in <string>' requires string as left operand, not " .. pytype(x)) end
    return hay:find(x, 1, true) ~= nil
  elseif k == "list" or k == "tuple" then
    for i = 1, #hay do if eq(hay[i], x) then return true end end
    return false
  elseif k == "dict" then
    if type(x) == "table" and getmetatable(x) == FLOAT then x = x.v end
    return x ~= nil and hay[x] ~= nil
  elseif k == "undef" then return false end
  fail("argument of type '" .. pytype(hay) .. "' is not iterable")
end

-- The items a for loop (or list()) sees: list items, a mapping's keys, a string's characters.
local EMPTY = {}
local function iterate(v)
  local k = kind(v)
  if k == "list" or k == "tuple" then return v end
  if k == "dict" then return dict_keys(v) end
  if k == "str" then return uchars(v) end
  if k == "undef" then return EMPTY end
  fail("'" .. pytype(v) .. "' object is not iterable")
end

local function to_list(v)
  local items = iterate(v)
  local r = {}
  for i = 1, #items do r[i] = items[i] end
  return r
end

-- Python's slice.indices: the positions a[start:stop:step] visits, 1-based, in order.
local function slice_positions(n, a, b, c)
  local step = c or 1
  if step == 0 then fail("slice step cannot be zero") end
  local function clamp(x, lo, hi)
    if x < 0 then x = x + n end
    if x < lo then return lo elseif x > hi then return hi end
    return x
  end
  local start, stop
  if step > 0 then
    start = a and clamp(a, 0, n) or 0
    stop = b and clamp(b, 0, n) or n
  else
    start = a and clamp(a, -1, n - 1) or n - 1
    stop = b and clamp(b, -1, n - 1) or -1
  end
  local pos = {}
  local i = start
  while (step > 0 and i < stop) or (step < 0 and i > stop) do pos[#pos + 1] = i + 1; i = i + step end
  return pos
end

local function slice(v, a, b, c)
  local function int(x)
    if x == nil or x == NONE then return nil end
    local n = num(x)
    if not n or n ~= floor(n) then fail("slice indices must be integers or None") end
    return n
  end
  a, b, c = int(a), int(b), int(c)
  local k = kind(v)
  local items
  if k == "str" then items = uchars(v)
  elseif k == "list" or k == "tuple" then items = v
  else check_defined(v); fail("'" .. pytype(v) .. "' object is not subscriptable") end
  local r = {}
  for i, p in ipairs(slice_positions(#items, a, b, c)) do r[i] = items[p] end
  if k == "str" then return concat(r) end
  return k == "tuple" and setmetatable(r, TUPLE) or r
end

local METHODS = {} -- kind -> name -> function(self, args, kw)
local UNSAFE = {
  list = { append = true, extend = true, insert = true, pop = true, remove = true, reverse = true, sort = true, clear = true },
  dict = { update = true, pop = true, popitem = true, clear = true, setdefault = true },
}

local function bound(k, obj, name)
  local m = METHODS[k] and METHODS[k][name]
  if m then return callable(function(args, kw) return m(obj, args, kw) end, name) end
  if UNSAFE[k] and UNSAFE[k][name] then
    return callable(function()
      fail(fmt("access to attribute '%s' of '%s' object is unsafe (the chat template sandbox is immutable)", name, k))
    end, name)
  end
end

-- A missing attribute: its message is made only if it is ever needed (misses are common: `x is defined`).
local function no_attr(obj, name) return setmetatable({ obj = obj, attr = name }, UNDEF) end

-- obj.name: Python attributes (methods) first, then items (jinja2's getattr).
local function getattr(obj, name)
  if type(obj) == "table" and getmetatable(obj) == nil then -- fast path: a mapping's item
    local v = obj[name]
    if v ~= nil and type(name) == "string" and not METHODS.dict[name] and not UNSAFE.dict[name] then return v end
  end
  local k = kind(obj)
  if k == "dict" then
    local m = bound(k, obj, name)
    if m then return m end
    local v = obj[name]
    if v == nil then return no_attr(obj, name) end
    return v
  elseif k == "ns" or k == "loop" then
    local v = rawget(obj, name)
    if v == nil then return no_attr(obj, name) end
    return v
  elseif k == "undef" then fail(undef_msg(obj)) end
  return bound(k == "tuple" and "list" or k, obj, name) or no_attr(obj, name)
end

-- obj[key]: items first, then attributes for string keys (jinja2's getitem).
local function getitem(obj, key)
  local k = kind(obj)
  if type(key) == "table" and getmetatable(key) == FLOAT then key = key.v end
  if k == "list" or k == "tuple" or k == "str" then
    local i = num(key)
    if i and i == floor(i) then
      local items = obj
      if k == "str" then items = ascii(obj) and obj or uchars(obj) end
      local n = k == "str" and ulen(obj) or #obj
      if i < 0 then i = i + n end
      if i < 0 or i >= n then return undef(fmt("%s object has no element %d", pytype(obj), i)) end
      if type(items) == "string" then return items:sub(i + 1, i + 1) end
      local v = items[i + 1]
      if v == nil then return NONE end
      return v
    end
  elseif k == "dict" then
    if key ~= nil and key ~= NONE then
      local v = obj[key]
      if v ~= nil then return v end
    end
  elseif k == "undef" then fail(undef_msg(obj)) end
  if type(key) == "string" then return getattr(obj, key) end
  return undef(fmt("%s object has no element %s", pytype(obj), repr(key)))
end

local function call(f, args, kw)
  local tf = type(f)
  if tf == "table" and getmetatable(f) == CALL then return f.fn(args, kw) end
  if tf == "function" then -- a Lua function from ctx: positional arguments, then the keywords table
    local n = #args
    if next(kw) then args[n + 1] = kw; n = n + 1 end
    local r = f(unpack(args, 1, n))
    if r == nil then return NONE end
    return r
  end
  check_defined(f)
  fail("'" .. pytype(f) .. "' object is not callable")
end

return {
  METHODS = METHODS, check_defined = check_defined, arith = arith, lt = lt, contains = contains,
  iterate = iterate, to_list = to_list, slice = slice, bound = bound, no_attr = no_attr, getattr = getattr,
  getitem = getitem, call = call,
}
