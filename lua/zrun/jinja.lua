-- A Jinja2-subset template renderer for Hugging Face chat templates, rendering as transformers does:
-- jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with loop controls,
-- the {% generation %} tracker, the tojson filter (json.dumps, ensure_ascii=False) and the globals
-- raise_exception, strftime_now, namespace, range, dict.
--
--   local tpl = jinja.compile(source)      -- syntax errors: "chat template line N: ..."
--   local text, spans = tpl:render(ctx)    -- spans: {{s, e}, ...} 0-based byte offsets [s, e) of
--                                          -- each {% generation %} block's output in text
--   jinja.render(source, ctx)              -- compile (cached by source) + render
--
-- Values: Lua strings/numbers/booleans/tables; a table with keys exactly 1..n (or empty) is a list,
-- any other a mapping; cjson.null (jinja.none) and nil are none; a key missing from ctx is undefined.
-- Mappings have no key order in Lua: they iterate and print with sorted keys (dicts written in the
-- template keep their order). Python floats that are integral (4/2, 3|float) are kept boxed so that
-- they print as "2.0"; a Lua number that is integral is a Python int.
-- jinja.set_key_order(t, keys) gives a mapping its key order (e.g. from an order-keeping JSON decoder).
--
-- Not supported (each raises a one-line error naming it): {% include/extends/import/block/call %},
-- recursive loops, loop.changed, macro varargs/kwargs/caller, printf-style 'str' % args, autoescape.
-- Case changes (upper/lower/title) change ASCII letters only; strip() without arguments strips ASCII
-- whitespace only.
-- Structure: lexer (tokens) -> parser (AST) -> compiler (AST to Lua closures) -> render.

local M = {}
local concat, floor, huge, fmt = table.concat, math.floor, math.huge, string.format

local has_cjson, cjson = pcall(require, "cjson")
local NONE = has_cjson and cjson.null or setmetatable({}, { __tostring = function() return "None" end })
M.none = NONE

-- Metatables that tag the template's own value kinds.
local FLOAT = {}   -- {v = x}: a Python float whose value is integral (prints "2.0")
local UNDEF = {}   -- {msg = "'x' is undefined"} or {obj =, attr =}: jinja2's Undefined
local NS = {}      -- namespace(): attributes live in the table itself
local TUPLE = {}   -- a list that prints as (a, b)
local CALL = {}    -- {fn = function(args, kw), name = ...}: globals, macros, bound methods
local LOOP = {}    -- the `loop` variable of a for loop
local ERR = {}     -- {msg = ..., raise = bool}: an error raised while rendering
local ORDER = setmetatable({}, { __mode = "k" }) -- dicts made by the template -> their key order

-- Render state of the render in progress (renders do not nest, but we save/restore anyway).
local R = { line = 0 }

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

---------------------------------------------------------------------------------------------------
-- Value kinds, conversions to Python's str/repr, truthiness, equality
---------------------------------------------------------------------------------------------------

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
M.kind = kind

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

-- Python's repr of a str: single quotes unless the text has ' and no ".
local function repr_str(s)
  local q = (s:find("'", 1, true) and not s:find('"', 1, true)) and '"' or "'"
  return q .. s:gsub("[%c\\'\"]", function(c)
    if c == "\\" then return "\\\\" elseif c == "\n" then return "\\n" elseif c == "\r" then return "\\r"
    elseif c == "\t" then return "\\t" elseif c == q then return "\\" .. q elseif c == "'" or c == '"' then return c end
    return fmt("\\x%02x", c:byte())
  end) .. q
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
M.repr = repr

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
M.tostr = tostr

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

---------------------------------------------------------------------------------------------------
-- Strings as Python sees them: code points, not bytes
---------------------------------------------------------------------------------------------------

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

---------------------------------------------------------------------------------------------------
-- Lexer: source -> tokens {type, value, line}
---------------------------------------------------------------------------------------------------

local function syntax(line, msg) error(fmt("chat template line %d: %s", line, msg), 0) end

local UNESC = { n = "\n", t = "\t", r = "\r", ["\\"] = "\\", ["'"] = "'", ['"'] = '"', a = "\a", b = "\b", f = "\f", v = "\v", ["\n"] = "" }
-- Python's unicode-escape decoding of a string literal's body (unknown escapes stay as written).
local function unescape(body)
  local out, i, n = {}, 1, #body
  while i <= n do
    local c = body:sub(i, i)
    if c ~= "\\" or i == n then out[#out + 1] = c; i = i + 1
    else
      local e = body:sub(i + 1, i + 1)
      local width = (e == "x" and 2) or (e == "u" and 4) or (e == "U" and 8)
      local hex = width and body:sub(i + 2, i + 1 + width)
      if hex and #hex == width and hex:match("^%x+$") then
        out[#out + 1] = utf8(tonumber(hex, 16)); i = i + 2 + width
      elseif e:match("[0-7]") then
        local oct = body:match("^[0-7][0-7]?[0-7]?", i + 1)
        out[#out + 1] = utf8(tonumber(oct, 8)); i = i + 1 + #oct
      elseif UNESC[e] then out[#out + 1] = UNESC[e]; i = i + 2
      else out[#out + 1] = "\\" .. e; i = i + 2 end
    end
  end
  return concat(out)
end

local OPS2 = { ["//"] = true, ["**"] = true, ["=="] = true, ["!="] = true, [">="] = true, ["<="] = true }
local OPS1 = "+-/*%~[](){}<>=.:|,;"
local CLOSE = { [")"] = true, ["]"] = true, ["}"] = true }

local function lex(src)
  src = src:gsub("\r\n", "\n"):gsub("\r", "\n")
  if src:sub(-1) == "\n" then src = src:sub(1, -2) end -- jinja2 drops one trailing newline
  local toks, pos, n = {}, 1, #src
  local line, lpos = 1, 1
  local function line_at(p) -- the line of byte p (p only grows)
    for _ in src:sub(lpos, p - 1):gmatch("\n") do line = line + 1 end
    lpos = math.max(lpos, p)
    return line
  end
  local function emit(ty, v, p) toks[#toks + 1] = { ty, v, line_at(p) } end
  local line_starting = true -- did the last thing consumed end with a newline (lstrip_blocks)

  -- jinja2's whitespace control for the text before a tag: "-" strips all trailing whitespace;
  -- lstrip_blocks strips spaces between a line start and a block/comment tag unless "+".
  local function strip_before(text, sign, is_var)
    if sign == "-" then return (text:gsub("%s+$", "")) end
    if sign == "+" or is_var then return text end
    local l = text:match(".*\n()") or 1
    if (l > 1 or line_starting) and text:find("^[ \t\f\v]+$", l) then return text:sub(1, l - 1) end
    return text
  end

  while pos <= n do
    local s = src:find("{[{%%#]", pos)
    if not s then emit("data", src:sub(pos), pos); break end
    local c = src:sub(s + 1, s + 1)
    local sign = src:match("^[-+]", s + 2) or ""
    local text = strip_before(src:sub(pos, s - 1), sign, c == "{")
    if text ~= "" then emit("data", text, pos) end
    local after_raw = c == "%" and (src:match("^{%%[-+]?%s*raw%s*%-%%}%s*()", s) or src:match("^{%%[-+]?%s*raw%s*%%}()", s))
    if after_raw then
      -- {% raw %}: everything up to {% endraw %} is text
      line_starting = src:sub(after_raw - 1, after_raw - 1) == "\n"
      local a, b, esign = src:find("{%%([-+]?)%s*endraw%s*", after_raw)
      if not a then syntax(line_at(s), "missing {% endraw %} for the {% raw %} here") end
      local stop = src:match("^%-%%}%s*()", b + 1) or src:match("^%+%%}()", b + 1) or src:match("^%%}\n?()", b + 1)
      if not stop then syntax(line_at(a), "{% endraw %} is not closed with %}") end
      local body = strip_before(src:sub(after_raw, a - 1), esign, false)
      if body ~= "" then emit("data", body, after_raw) end
      pos = stop
      line_starting = src:sub(stop - 1, stop - 1) == "\n"
    elseif c == "#" then
      local from, q = s + 2 + #sign, nil
      q = src:find("#}", from, true)
      if not q then syntax(line_at(s), "missing end of comment tag #}") end
      local m = src:sub(q - 1, q - 1)
      if q - 1 >= from and m == "-" then pos = src:match("^%s*()", q + 2)
      elseif q - 1 >= from and m == "+" then pos = q + 2
      else pos = q + 2; if src:sub(pos, pos) == "\n" then pos = pos + 1 end end
      line_starting = src:sub(pos - 1, pos - 1) == "\n"
    else
      local block = c == "%"
      emit(block and "bbegin" or "vbegin", nil, s)
      pos = s + 2 + #sign
      local depth = 0
      while true do
        pos = src:match("^%s*()", pos)
        if pos > n then syntax(line_at(n), "unexpected end of template: a tag is not closed with " .. (block and "%}" or "}}")) end
        local endp
        if depth == 0 then
          if block then
            endp = src:match("^%-%%}%s*()", pos) or src:match("^%+%%}()", pos) or src:match("^%%}\n?()", pos)
          else
            endp = src:match("^%-}}%s*()", pos) or src:match("^}}()", pos)
          end
        end
        if endp then
          emit(block and "bend" or "vend", nil, pos)
          pos = endp
          line_starting = src:sub(pos - 1, pos - 1) == "\n"
          break
        end
        local ch = src:sub(pos, pos)
        local m = src:match("^%d+%.%d+[eE][-+]?%d+()", pos) or src:match("^%d+%.%d+()", pos) or src:match("^%d+[eE][-+]?%d+()", pos)
        if m then emit("float", tonumber(src:sub(pos, m - 1)), pos); pos = m
        elseif ch:find("%d") then m = src:match("^%d+()", pos); emit("int", tonumber(src:sub(pos, m - 1)), pos); pos = m
        elseif ch:find("[%a_]") then m = src:match("^[%w_]+()", pos); emit("name", src:sub(pos, m - 1), pos); pos = m
        elseif ch == "'" or ch == '"' then
          local i = pos + 1
          while true do
            local q = src:find("[\\" .. ch .. "]", i)
            if not q then syntax(line_at(pos), "unterminated string literal") end
            if src:sub(q, q) == "\\" then i = q + 2 else i = q; break end
          end
          emit("str", unescape(src:sub(pos + 1, i - 1)), pos); pos = i + 1
        elseif OPS2[src:sub(pos, pos + 1)] then emit("op", src:sub(pos, pos + 1), pos); pos = pos + 2
        elseif OPS1:find(ch, 1, true) then
          if ch == "(" or ch == "[" or ch == "{" then depth = depth + 1
          elseif CLOSE[ch] then
            if depth == 0 then syntax(line_at(pos), "unexpected '" .. ch .. "'") end
            depth = depth - 1
          end
          emit("op", ch, pos); pos = pos + 1
        else syntax(line_at(pos), "unexpected character '" .. ch .. "'") end
      end
    end
  end
  toks[#toks + 1] = { "eof", nil, line_at(n + 1) }
  return toks
end
M._lex = lex

---------------------------------------------------------------------------------------------------
-- Parser: tokens -> AST. Expression precedence as jinja2's parser: condexpr < or < and < not <
-- comparisons/in < + - < ~ < * / // % < ** < unary - + (which takes filters/tests after it).
---------------------------------------------------------------------------------------------------

local Parser = {}
Parser.__index = Parser

function Parser:peek(k) return self.toks[self.i + (k or 0)] end
function Parser:next() local t = self.toks[self.i]; self.i = self.i + 1; return t end
function Parser:line() return self.toks[self.i][3] end
function Parser:fail(msg) syntax(self:line(), msg) end
function Parser:is(ty, v) local t = self.toks[self.i]; return t[1] == ty and (v == nil or t[2] == v) end
function Parser:accept(ty, v) if self:is(ty, v) then return self:next() end end
local function describe(t)
  if t[1] == "eof" then return "end of template" elseif t[1] == "bend" then return "end of tag '%}'"
  elseif t[1] == "vend" then return "end of tag '}}'" elseif t[1] == "str" then return "string " .. repr_str(t[2]) end
  return "'" .. tostring(t[2]) .. "'"
end
function Parser:expect(ty, v, what)
  if self:is(ty, v) then return self:next() end
  self:fail("expected " .. (what or ("'" .. tostring(v or ty) .. "'")) .. ", got " .. describe(self:peek()))
end
function Parser:name() return self:expect("name", nil, "a name")[2] end

function Parser:condexpr()
  local e = self:or_()
  while self:accept("name", "if") do
    self.soft = self.soft + 1
    local test = self:or_()
    local other = self:accept("name", "else") and self:condexpr() or nil
    self.soft = self.soft - 1
    e = { k = "cond", test = test, yes = e, no = other }
  end
  return e
end
function Parser:expr(no_cond) if no_cond then return self:or_() end return self:condexpr() end

function Parser:or_()
  local e = self:and_()
  while self:accept("name", "or") do e = { k = "or", a = e, b = self:and_() } end
  return e
end
function Parser:and_()
  local e = self:not_()
  while self:accept("name", "and") do e = { k = "and", a = e, b = self:not_() } end
  return e
end
function Parser:not_()
  if self:accept("name", "not") then return { k = "not", a = self:not_() } end
  return self:compare()
end

local CMP = { ["=="] = true, ["!="] = true, ["<"] = true, [">"] = true, ["<="] = true, [">="] = true }
function Parser:compare()
  local e = self:math1()
  local ops = {}
  while true do
    local t = self:peek()
    if t[1] == "op" and CMP[t[2]] then self:next(); ops[#ops + 1] = { t[2], self:math1() }
    elseif self:accept("name", "in") then ops[#ops + 1] = { "in", self:math1() }
    elseif self:is("name", "not") and self:peek(1)[1] == "name" and self:peek(1)[2] == "in" then
      self.i = self.i + 2; ops[#ops + 1] = { "notin", self:math1() }
    else break end
  end
  if #ops == 0 then return e end
  return { k = "cmp", a = e, ops = ops }
end

function Parser:binary(ops, sub)
  local e = self[sub](self)
  while true do
    local t = self:peek()
    if t[1] == "op" and ops[t[2]] then self:next(); e = { k = "bin", op = t[2], a = e, b = self[sub](self) }
    else return e end
  end
end
function Parser:math1() return self:binary({ ["+"] = true, ["-"] = true }, "concat") end
function Parser:concat()
  local e = self:math2()
  if not self:is("op", "~") then return e end
  local parts = { e }
  while self:accept("op", "~") do parts[#parts + 1] = self:math2() end
  return { k = "concat", parts = parts }
end
function Parser:math2() return self:binary({ ["*"] = true, ["/"] = true, ["//"] = true, ["%"] = true }, "pow") end
function Parser:pow() return self:binary({ ["**"] = true }, "unary") end

function Parser:unary(no_filter)
  local e
  if self:accept("op", "-") then e = { k = "neg", a = self:unary(true) }
  elseif self:accept("op", "+") then e = { k = "pos", a = self:unary(true) }
  else e = self:primary() end
  e = self:postfix(e)
  if not no_filter then e = self:filters(e) end
  return e
end

local CONSTS = { ["true"] = true, ["false"] = false, ["True"] = true, ["False"] = false, ["none"] = NONE, ["None"] = NONE }
function Parser:primary()
  local t = self:next()
  local ty, v = t[1], t[2]
  if ty == "name" then
    if CONSTS[v] ~= nil then return { k = "const", v = CONSTS[v] } end
    return { k = "name", n = v, line = t[3] }
  elseif ty == "str" then
    local parts = { v }
    while self:is("str") do parts[#parts + 1] = self:next()[2] end -- "a" "b" is "ab"
    return { k = "const", v = concat(parts) }
  elseif ty == "int" then return { k = "const", v = v }
  elseif ty == "float" then return { k = "const", v = mkfloat(v) }
  elseif ty == "op" and v == "(" then return self:tuple(true)
  elseif ty == "op" and v == "[" then
    local items = {}
    while not self:accept("op", "]") do
      if #items > 0 then self:expect("op", ","); if self:accept("op", "]") then break end end
      items[#items + 1] = self:expr()
    end
    return { k = "list", items = items }
  elseif ty == "op" and v == "{" then
    local keys, vals = {}, {}
    while not self:accept("op", "}") do
      if #keys > 0 then self:expect("op", ","); if self:accept("op", "}") then break end end
      keys[#keys + 1] = self:expr(); self:expect("op", ":"); vals[#vals + 1] = self:expr()
    end
    return { k = "dict", keys = keys, vals = vals }
  end
  self.i = self.i - 1
  self:fail("unexpected " .. describe(t) .. " in an expression")
end

-- a, b, c  (the parentheses already consumed when `paren`); one item without a comma is itself.
function Parser:tuple(paren, no_cond)
  local items, comma = {}, false
  while true do
    if paren and self:is("op", ")") then break end
    if #items > 0 then
      if not self:accept("op", ",") then break end
      comma = true
      if paren and self:is("op", ")") then break end
      if not paren and (self:is("bend") or self:is("vend") or self:is("name", "if") or self:is("op", "=")) then break end
    end
    items[#items + 1] = self:expr(no_cond)
  end
  if paren then self:expect("op", ")") end
  if #items == 1 and not comma then return items[1] end
  if #items == 0 and not paren then self:fail("expected an expression, got " .. describe(self:peek())) end
  return { k = "tuple", items = items }
end

function Parser:args()
  local args, kw = {}, {}
  while not self:accept("op", ")") do
    if #args > 0 or next(kw) then self:expect("op", ","); if self:accept("op", ")") then break end end
    if self:is("name") and self:peek(1)[1] == "op" and self:peek(1)[2] == "=" then
      local n = self:next()[2]; self:next()
      kw[#kw + 1] = { n, self:expr() }
    else
      if #kw > 0 then self:fail("a positional argument follows a keyword argument") end
      args[#args + 1] = self:expr()
    end
  end
  return args, kw
end

function Parser:subscript(e)
  -- a[i], a[i:j:k]
  local parts, cur = {}, nil
  local function item() if self:is("op", ":") or self:is("op", "]") then return nil end return self:expr() end
  cur = item()
  if self:accept("op", "]") then return { k = "item", o = e, key = cur } end
  parts[1] = cur
  self:expect("op", ":")
  parts[2] = item()
  if self:accept("op", ":") then parts[3] = item() end
  self:expect("op", "]")
  return { k = "slice", o = e, a = parts[1], b = parts[2], c = parts[3] }
end

function Parser:postfix(e)
  while true do
    if self:accept("op", ".") then
      local t = self:next()
      if t[1] == "name" then e = { k = "attr", o = e, n = t[2] }
      elseif t[1] == "int" then e = { k = "item", o = e, key = { k = "const", v = t[2] } }
      else self.i = self.i - 1; self:fail("expected an attribute name after '.', got " .. describe(t)) end
    elseif self:accept("op", "[") then e = self:subscript(e)
    elseif self:accept("op", "(") then
      local args, kw = self:args()
      e = { k = "call", f = e, args = args, kw = kw }
    else return e end
  end
end

function Parser:filters(e)
  while true do
    if self:accept("op", "|") then
      local line, name = self:line(), self:name()
      while self:accept("op", ".") do name = name .. "." .. self:name() end
      local args, kw = {}, {}
      if self:accept("op", "(") then args, kw = self:args() end
      e = { k = "filter", name = name, o = e, args = args, kw = kw, soft = self.soft > 0, line = line }
    elseif self:accept("name", "is") then
      local neg = self:accept("name", "not") ~= nil
      local line, name = self:line(), self:name()
      local args, kw = {}, {}
      local t = self:peek()
      if self:accept("op", "(") then args, kw = self:args()
      elseif (t[1] == "name" or t[1] == "str" or t[1] == "int" or t[1] == "float" or (t[1] == "op" and (t[2] == "[" or t[2] == "{")))
        and not (t[1] == "name" and (t[2] == "else" or t[2] == "or" or t[2] == "and" or t[2] == "is")) then
        args[1] = self:postfix(self:primary()) -- `x is divisibleby 3`
      end
      e = { k = "test", name = name, o = e, args = args, kw = kw, neg = neg, soft = self.soft > 0, line = line }
    elseif self:accept("op", "(") then
      local args, kw = self:args()
      e = { k = "call", f = e, args = args, kw = kw }
    else return e end
  end
end

-- The target of for/set: a name, `ns.attr` (set only) or names separated by commas.
function Parser:target(allow_attr)
  local function one()
    local n = self:name()
    if allow_attr and self:accept("op", ".") then return { k = "nsattr", n = n, attr = self:name() } end
    return { k = "store", n = n }
  end
  local paren = self:accept("op", "(")
  local items = { one() }
  while self:accept("op", ",") do
    if self:is("name", "in") or self:is("op", "=") or self:is("op", ")") then break end
    items[#items + 1] = one()
  end
  if paren then self:expect("op", ")") end
  if #items == 1 and not paren then return items[1] end
  return { k = "unpack", items = items }
end

-- Statements ---------------------------------------------------------------------------------------

-- Parses nodes until a block tag named in `stop`; returns the nodes and that tag's name (the tag's
-- name consumed, its arguments and %} not).
function Parser:body(stop, opener)
  local nodes = {}
  while true do
    local t = self:next()
    if t[1] == "data" then nodes[#nodes + 1] = { k = "text", s = t[2] }
    elseif t[1] == "vbegin" then
      local line = self:line()
      nodes[#nodes + 1] = { k = "out", e = self:tuple(false), line = line }
      self:expect("vend", nil, "end of print statement '}}'")
    elseif t[1] == "bbegin" then
      local name = self:peek()
      if name[1] ~= "name" then self:fail("expected a tag name after '{%', got " .. describe(name)) end
      if stop and stop[name[2]] then self:next(); return nodes, name[2] end
      nodes[#nodes + 1] = self:statement()
    else -- eof
      if opener then
        syntax(t[3], fmt("unexpected end of template: {%% %s %%} (line %d) is not closed; add {%% %s %%}",
          opener[1], opener[3], opener[2]))
      end
      return nodes
    end
  end
end

function Parser:stmt_end() self:expect("bend", nil, "end of tag '%}'") end

local STOP = {
  ["if"] = { elif = true, ["else"] = true, endif = true },
  ifelse = { endif = true },
  ["for"] = { ["else"] = true, endfor = true },
  forelse = { endfor = true },
}

function Parser:statement()
  local t = self:next()
  local name, line = t[2], t[3]
  local S = self.stmts[name]
  if not S then
    if name:match("^end") or name == "else" or name == "elif" then
      self.i = self.i - 1; self:fail("unexpected {% " .. name .. " %}: no open block takes it")
    end
    self.i = self.i - 1; self:fail("unknown tag '" .. name .. "'")
  end
  local node = S(self, line)
  node.line = node.line or line
  return node
end

Parser.stmts = {}
Parser.stmts["if"] = function(self, line)
  local conds, bodies = {}, {}
  local els
  self.soft = self.soft + 1
  local tag = "elif"
  while tag == "elif" do
    conds[#conds + 1] = self:tuple(false)
    self:stmt_end()
    local b
    b, tag = self:body(STOP["if"], { "if", "endif", line })
    bodies[#bodies + 1] = b
  end
  if tag == "else" then self:stmt_end(); els = self:body(STOP.ifelse, { "if", "endif", line }) end
  self:stmt_end()
  self.soft = self.soft - 1
  return { k = "if", conds = conds, bodies = bodies, els = els }
end

Parser.stmts["for"] = function(self, line)
  local target = self:target(false)
  self:expect("name", "in")
  local iter = self:tuple(false, true)
  local cond
  if self:accept("name", "if") then cond = self:expr() end
  if self:is("name", "recursive") then self:fail("recursive for loops are not supported") end
  self:stmt_end()
  self.loops = self.loops + 1
  local body, tag = self:body(STOP["for"], { "for", "endfor", line })
  self.loops = self.loops - 1
  local els
  if tag == "else" then self:stmt_end(); els = self:body(STOP.forelse, { "for", "endfor", line }) end
  self:stmt_end()
  return { k = "for", target = target, iter = iter, cond = cond, body = body, els = els }
end

local function loop_control(kind)
  return function(self)
    if self.loops == 0 then self.i = self.i - 1; self:fail("'" .. kind .. "' outside of a for loop") end
    self:stmt_end()
    return { k = kind }
  end
end
Parser.stmts["break"] = loop_control("break")
Parser.stmts["continue"] = loop_control("continue")

-- Parses the body of a block with its own scope (macro, generation, set block); loop controls
-- inside it cannot reach an enclosing loop.
function Parser:scoped_body(stop, opener)
  local loops = self.loops
  self.loops = 0
  local body = self:body(stop, opener)
  self.loops = loops
  self:stmt_end()
  return body
end

Parser.stmts["set"] = function(self, line)
  local target = self:target(true)
  if self:accept("op", "=") then
    local e = self:tuple(false)
    self:stmt_end()
    return { k = "set", target = target, e = e }
  end
  local filt = self:filters({ k = "const", v = "" })
  self:stmt_end()
  local body = self:scoped_body({ endset = true }, { "set", "endset", line })
  return { k = "setblock", target = target, body = body, filt = filt }
end

Parser.stmts["macro"] = function(self, line)
  local name = self:name()
  self:expect("op", "(")
  local params, defaults = {}, {}
  while not self:accept("op", ")") do
    if #params > 0 then self:expect("op", ",") end
    params[#params + 1] = self:name()
    if self:accept("op", "=") then defaults[#params] = self:expr()
    elseif next(defaults) then self:fail("a macro parameter without a default follows one with a default") end
  end
  self:stmt_end()
  local body = self:scoped_body({ endmacro = true }, { "macro", "endmacro", line })
  return { k = "macro", name = name, params = params, defaults = defaults, body = body }
end

Parser.stmts["generation"] = function(self, line)
  self:stmt_end()
  return { k = "generation", body = self:scoped_body({ endgeneration = true }, { "generation", "endgeneration", line }) }
end

Parser.stmts["filter"] = function(self, line)
  -- {% filter f(args) | g %}: the first filter comes without its '|'
  local fline, name = self:line(), self:name()
  local args, kw = {}, {}
  if self:accept("op", "(") then args, kw = self:args() end
  local first = { k = "filter", name = name, o = { k = "const", v = "" }, args = args, kw = kw, soft = self.soft > 0, line = fline }
  local filt = self:filters(first)
  self:stmt_end()
  return { k = "filterblock", filt = filt, body = self:scoped_body({ endfilter = true }, { "filter", "endfilter", line }) }
end

Parser.stmts["with"] = function(self, line)
  local sets = {}
  while not self:is("bend") do
    if #sets > 0 then self:expect("op", ",") end
    local target = self:target(false)
    self:expect("op", "=")
    sets[#sets + 1] = { k = "set", target = target, e = self:expr(), line = line }
  end
  self:stmt_end()
  local body = self:body({ endwith = true }, { "with", "endwith", line })
  self:stmt_end()
  return { k = "with", sets = sets, body = body }
end

local function parse(src)
  local p = setmetatable({ toks = lex(src), i = 1, soft = 0, loops = 0 }, Parser)
  return p:body(nil, nil)
end
M._parse = parse

---------------------------------------------------------------------------------------------------
-- Runtime: Python's operators, attribute and item access, iteration
---------------------------------------------------------------------------------------------------

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

---------------------------------------------------------------------------------------------------
-- Library: methods of str/dict/list, filters, tests, tojson, globals
---------------------------------------------------------------------------------------------------

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

-- json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)
local JSON_ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t", ["\b"] = "\\b", ["\f"] = "\\f" }
local function json_str(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    if c == "\127" then return c end
    return JSON_ESC[c] or fmt("\\u%04x", c:byte())
  end) .. '"'
end
local function json_key(k)
  local t = kind(k)
  if t == "str" then return k elseif t == "bool" then return k and "true" or "false"
  elseif t == "none" then return "null" elseif t == "int" or t == "float" then return fmt_num(k) end
  fail("keys must be str, int, float, bool or None, not " .. pytype(k))
end
local function dumps(v, o, level)
  local k = kind(v)
  if k == "str" then return json_str(v) elseif k == "none" then return "null"
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
    for i, key in ipairs(keys) do parts[i] = json_str(json_key(key)) .. o.key_sep .. dumps(v[key], o, level + 1) end
    return "{" .. nl_in .. concat(parts, o.item_sep .. nl_in) .. nl .. "}"
  end
  fail("Object of type " .. pytype(v) .. " is not JSON serializable")
end
local function tojson(v, args, kw)
  local indent = opt(arg(args, kw, 1, "indent"))
  local seps = opt(arg(args, kw, 3, "separators"))
  local o = { sort_keys = truthy(arg(args, kw, 4, "sort_keys", false)) }
  if indent ~= nil then
    o.indent = type(indent) == "string" and indent or (" "):rep(int_arg(indent, "tojson indent"))
  end
  if seps then o.item_sep, o.key_sep = str_arg(seps[1], "separators"), str_arg(seps[2], "separators")
  else o.item_sep, o.key_sep = indent ~= nil and "," or ", ", ": " end
  return dumps(v, o, 0)
end
M.tojson = function(v, opts) opts = opts or {}; return tojson(v, {}, opts) end

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
local function select_filter(keep, by_attr)
  return function(v, args)
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
M.filters, M.tests = FILTERS, TESTS

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
M.globals = GLOBALS

---------------------------------------------------------------------------------------------------
-- Compiler: AST -> Lua closures. An expression becomes function(scope) -> value; a statement
-- function(scope, out) -> nil | BREAK | CONTINUE. A scope is a table whose __index is its parent;
-- for-loop iterations, macros, {% generation %} and {% set %} blocks get their own scope, as in
-- jinja2 (a set inside a loop does not leak out of it; inside an if it does).
---------------------------------------------------------------------------------------------------

local BREAK, CONTINUE = {}, {}
local function buffer() return { n = 0, len = 0 } end
local function write(out, s)
  if s == "" then return end
  local n = out.n + 1
  out.n, out[n], out.len = n, s, out.len + #s
end
local function child(sc) return setmetatable({}, { __index = sc }) end

local cexpr, cblock
local EX, ST = {}, {}

function cexpr(n) return EX[n.k](n) end

EX.const = function(n) local v = n.v; return function() return v end end
EX.slot = function() return function(sc) return sc["\0slot"] end end
EX.name = function(n)
  local name, msg = n.n, "'" .. n.n .. "' is undefined"
  return function(sc)
    local v = sc[name]
    if v == nil then return undef(msg) end
    return v
  end
end
EX.attr = function(n)
  local o, name = cexpr(n.o), n.n
  return function(sc) return getattr(o(sc), name) end
end
EX.item = function(n)
  local o, key = cexpr(n.o), cexpr(n.key)
  return function(sc) return getitem(o(sc), key(sc)) end
end
local NIL = function() return nil end
EX.slice = function(n)
  local o, a, b, c = cexpr(n.o), n.a and cexpr(n.a) or NIL, n.b and cexpr(n.b) or NIL, n.c and cexpr(n.c) or NIL
  return function(sc) return slice(o(sc), a(sc), b(sc), c(sc)) end
end

-- Positional and keyword argument evaluators -> function(scope) returning args, kw, kw names.
local function cargs(args, kw)
  local af, kf, names = {}, {}, {}
  for i, a in ipairs(args) do af[i] = cexpr(a) end
  for i, p in ipairs(kw) do names[i], kf[i] = p[1], cexpr(p[2]) end
  local na, nk = #af, #kf
  return function(sc)
    local a, k = {}, {}
    for i = 1, na do a[i] = af[i](sc) end
    for i = 1, nk do k[names[i]] = kf[i](sc) end
    return a, k, names
  end
end

EX.call = function(n)
  local argsf = cargs(n.args, n.kw)
  if n.f.k == "attr" then -- obj.method(...): call the method without making a bound method
    local o, name = cexpr(n.f.o), n.f.n
    return function(sc)
      local obj = o(sc)
      local k = kind(obj)
      if k == "tuple" then k = "list" end
      local m = METHODS[k] and METHODS[k][name]
      local a, kw, names = argsf(sc)
      if m then
        local r = m(obj, a, kw)
        if r == nil then return NONE end
        return r
      end
      return call(getattr(obj, name), a, kw, names)
    end
  end
  local f = cexpr(n.f)
  return function(sc)
    local fv = f(sc)
    local a, kw, names = argsf(sc)
    return call(fv, a, kw, names)
  end
end

local function unknown(what, name, line, soft)
  local msg = fmt("unknown %s '%s'", what, name)
  if not soft then syntax(line, msg .. " (jinja2 has no such " .. what .. ", or zrun.jinja does not implement it)") end
  return function() fail(msg) end
end

EX.filter = function(n)
  local f = FILTERS[n.name] or unknown("filter", n.name, n.line, n.soft)
  local o, argsf = cexpr(n.o), cargs(n.args, n.kw)
  return function(sc)
    local v = o(sc)
    local a, kw = argsf(sc)
    local r = f(v, a, kw)
    if r == nil then return NONE end
    return r
  end
end
EX.test = function(n)
  local t = TESTS[n.name] or unknown("test", n.name, n.line, n.soft)
  local o, argsf, neg = cexpr(n.o), cargs(n.args, n.kw), n.neg
  return function(sc)
    local r = t(o(sc), (argsf(sc))) and true or false
    if neg then return not r end
    return r
  end
end

EX.bin = function(n)
  local a, b, op = cexpr(n.a), cexpr(n.b), n.op
  if op == "+" then -- the common case first: numbers and strings
    return function(sc)
      local x, y = a(sc), b(sc)
      local tx, ty = type(x), type(y)
      if tx == "string" and ty == "string" then return x .. y end
      if tx == "number" and ty == "number" then return x + y end
      return arith("+", x, y)
    end
  end
  return function(sc) return arith(op, a(sc), b(sc)) end
end
EX.concat = function(n)
  local parts = {}
  for i, p in ipairs(n.parts) do parts[i] = cexpr(p) end
  return function(sc)
    local s = {}
    for i = 1, #parts do s[i] = tostr(parts[i](sc)) end
    return concat(s)
  end
end
EX["and"] = function(n)
  local a, b = cexpr(n.a), cexpr(n.b)
  return function(sc) local x = a(sc); if not truthy(x) then return x end return b(sc) end
end
EX["or"] = function(n)
  local a, b = cexpr(n.a), cexpr(n.b)
  return function(sc) local x = a(sc); if truthy(x) then return x end return b(sc) end
end
EX["not"] = function(n) local a = cexpr(n.a); return function(sc) return not truthy(a(sc)) end end
EX.neg = function(n)
  local a = cexpr(n.a)
  return function(sc)
    local v = check_defined(a(sc))
    local x = num(v)
    if not x then fail("bad operand type for unary -: '" .. pytype(v) .. "'") end
    if isfloat(v) then return mkfloat(-x) end
    return -x
  end
end
EX.pos = function(n) local a = cexpr(n.a); return function(sc) return a(sc) end end

local COMPARE = {
  ["=="] = eq,
  ["!="] = function(x, y) return not eq(x, y) end,
  ["<"] = lt,
  [">"] = function(x, y) return lt(y, x) end,
  ["<="] = function(x, y) return not lt(y, x) end,
  [">="] = function(x, y) return not lt(x, y) end,
  ["in"] = function(x, y) return contains(y, x) end,
  notin = function(x, y) return not contains(y, x) end,
}
EX.cmp = function(n)
  local first, ops, rights = cexpr(n.a), {}, {}
  for i, o in ipairs(n.ops) do ops[i], rights[i] = COMPARE[o[1]], cexpr(o[2]) end
  local nops = #ops
  if nops == 1 then
    local op, right = ops[1], rights[1]
    return function(sc) return op(first(sc), right(sc)) end
  end
  return function(sc) -- a < b < c is a < b and b < c
    local left = first(sc)
    for i = 1, nops do
      local right = rights[i](sc)
      if not ops[i](left, right) then return false end
      left = right
    end
    return true
  end
end
EX.cond = function(n)
  local test, yes = cexpr(n.test), cexpr(n.yes)
  local no = n.no and cexpr(n.no) or function() return undef("the inline if's condition was false and it has no else") end
  return function(sc) if truthy(test(sc)) then return yes(sc) end return no(sc) end
end
local function citems(items)
  local f = {}
  for i, e in ipairs(items) do f[i] = cexpr(e) end
  return function(sc) local r = {}; for i = 1, #f do r[i] = f[i](sc) end return r end
end
EX.list = function(n) return citems(n.items) end
EX.tuple = function(n) local f = citems(n.items); return function(sc) return setmetatable(f(sc), TUPLE) end end
EX.dict = function(n)
  local keys, vals = citems(n.keys), citems(n.vals)
  return function(sc)
    local ks, vs = keys(sc), vals(sc)
    local d, order = mkdict(), {}
    for i = 1, #ks do
      local k = ks[i]
      if type(k) == "table" and getmetatable(k) == FLOAT then k = k.v end
      if type(k) == "table" or k == nil then fail("unhashable dict key of type '" .. pytype(k) .. "'") end
      if d[k] == nil then order[#order + 1] = k end
      d[k] = vs[i]
    end
    ORDER[d] = order
    return d
  end
end

-- Assignment to a for/set target.
local function assign(sc, target, v)
  local k = target.k
  if k == "store" then sc[target.n] = v
  elseif k == "nsattr" then
    local ns = sc[target.n]
    if kind(ns) ~= "ns" then fail("cannot assign attribute on non-namespace object '" .. target.n .. "' (make it with namespace())") end
    ns[target.attr] = v
  else
    local kv = kind(v)
    if kv ~= "list" and kv ~= "tuple" then v = iterate(v) end
    local want = #target.items
    if #v > want then fail(fmt("too many values to unpack (expected %d)", want)) end
    if #v < want then fail(fmt("not enough values to unpack (expected %d, got %d)", want, #v)) end
    for i, t in ipairs(target.items) do assign(sc, t, v[i]) end
  end
end

function cblock(nodes)
  local f = {}
  for _, n in ipairs(nodes) do f[#f + 1] = ST[n.k](n) end
  local nf = #f
  if nf == 1 then return f[1] end
  return function(sc, out)
    for i = 1, nf do
      local sig = f[i](sc, out)
      if sig then return sig end
    end
  end
end

-- Renders `body` into a string in a scope of its own.
local function capture(body, sc)
  local buf = buffer()
  body(sc, buf)
  return concat(buf, "", 1, buf.n)
end

ST.text = function(n) local s = n.s; return function(_, out) write(out, s) end end
ST.out = function(n)
  local e, line = cexpr(n.e), n.line
  return function(sc, out) R.line = line; write(out, tostr(e(sc))) end
end
ST["if"] = function(n)
  local conds, bodies, line = {}, {}, n.line
  for i, c in ipairs(n.conds) do conds[i], bodies[i] = cexpr(c), cblock(n.bodies[i]) end
  local els = n.els and cblock(n.els)
  return function(sc, out)
    R.line = line
    for i = 1, #conds do if truthy(conds[i](sc)) then return bodies[i](sc, out) end end
    if els then return els(sc, out) end
  end
end
ST["for"] = function(n)
  local target, iter, line = n.target, cexpr(n.iter), n.line
  local cond, body = n.cond and cexpr(n.cond), cblock(n.body)
  local els = n.els and cblock(n.els)
  return function(sc, out)
    R.line = line
    local items = iterate(iter(sc))
    local mt = { __index = sc }
    if cond then -- `for x in xs if c`: loop.* counts only the items kept
      local kept = {}
      for i = 1, #items do
        local s2 = setmetatable({}, mt)
        assign(s2, target, items[i])
        if truthy(cond(s2)) then kept[#kept + 1] = items[i] end
      end
      items = kept
    end
    local n_items = #items
    if n_items == 0 then if els then return els(sc, out) end return end
    local loop = setmetatable({ length = n_items, depth = 1, depth0 = 0 }, LOOP)
    loop.cycle = callable(function(args) return args[loop.index0 % #args + 1] end, "cycle")
    local no_prev, no_next = undef("there is no previous item"), undef("there is no next item")
    for i = 1, n_items do
      local s2 = setmetatable({}, mt)
      assign(s2, target, items[i])
      loop.index, loop.index0, loop.revindex, loop.revindex0 = i, i - 1, n_items - i + 1, n_items - i
      loop.first, loop.last = i == 1, i == n_items
      loop.previtem = i > 1 and items[i - 1] or no_prev
      loop.nextitem = i < n_items and items[i + 1] or no_next
      s2.loop = loop
      if body(s2, out) == BREAK then break end
    end
  end
end
ST["break"] = function() return function() return BREAK end end
ST["continue"] = function() return function() return CONTINUE end end
ST.set = function(n)
  local target, e, line = n.target, cexpr(n.e), n.line
  return function(sc) R.line = line; assign(sc, target, e(sc)) end
end
-- Applies a {% set x | f %} / {% filter f %} chain to the captured text.
local function cfilter_chain(filt)
  local base = filt
  while base.o do base = base.o end
  base.k = "slot"
  return cexpr(filt)
end
ST.setblock = function(n)
  local target, body, line = n.target, cblock(n.body), n.line
  local filt = n.filt.k ~= "const" and cfilter_chain(n.filt)
  return function(sc)
    R.line = line
    local s = capture(body, child(sc))
    if filt then local s2 = child(sc); s2["\0slot"] = s; s = filt(s2) end
    assign(sc, target, s)
  end
end
ST.filterblock = function(n)
  local body, filt = cblock(n.body), cfilter_chain(n.filt)
  return function(sc, out)
    local s2 = child(sc)
    s2["\0slot"] = capture(body, child(sc))
    write(out, tostr(filt(s2)))
  end
end
ST.with = function(n)
  local body, sets = cblock(n.body), {}
  for i, s in ipairs(n.sets) do sets[i] = ST.set(s) end
  return function(sc, out)
    local s2 = child(sc)
    for i = 1, #sets do sets[i](s2) end
    return body(s2, out)
  end
end
ST.macro = function(n)
  local name, params, body = n.name, n.params, cblock(n.body)
  local defaults, is_param = {}, {}
  for i, p in ipairs(params) do is_param[p] = true; defaults[i] = n.defaults[i] and cexpr(n.defaults[i]) end
  return function(sc)
    local mt = { __index = sc }
    sc[name] = callable(function(args, kw)
      if #args > #params then fail(fmt("macro '%s' takes not more than %d argument(s)", name, #params)) end
      for k in pairs(kw) do
        if not is_param[k] then fail(fmt("macro '%s' takes no keyword argument '%s'", name, k)) end
      end
      local s2 = setmetatable({}, mt)
      for i, p in ipairs(params) do
        local v = args[i]
        if v == nil then v = kw[p] end
        if v == nil then v = defaults[i] and defaults[i](s2) or undef("parameter '" .. p .. "' was not provided") end
        s2[p] = v
      end
      return capture(body, s2)
    end, name)
  end
end
-- {% generation %}: its output's offsets in the whole rendered text, as transformers' tracker
-- reports them (the length of the top-level output so far, even from inside a macro).
ST.generation = function(n)
  local body = cblock(n.body)
  return function(sc, out)
    local s = capture(body, child(sc))
    local start = R.root.len
    R.spans[#R.spans + 1] = { start, start + #s }
    write(out, s)
  end
end

---------------------------------------------------------------------------------------------------
-- API
---------------------------------------------------------------------------------------------------

local Template = {}
Template.__index = Template

function M.compile(source)
  if type(source) ~= "string" then error("chat template: jinja.compile needs the template text (a string), got " .. type(source), 2) end
  local body = cblock(parse(source))
  return setmetatable({ source = source, body = body }, Template)
end

local function error_text(err)
  if getmetatable(err) == ERR then
    if err.raise then return "chat template: " .. err.msg end
    return fmt("chat template line %d: %s", R.line, err.msg)
  end
  return fmt("chat template line %d: %s", R.line, tostring(err))
end

-- Renders with the variables of ctx; returns the text and the {% generation %} spans.
function Template:render(ctx)
  ctx = ctx or {}
  local top = setmetatable({}, { __index = function(_, k)
    local v = ctx[k]
    if v == nil then return GLOBALS[k] end
    return v
  end })
  local out = buffer()
  local saved = R
  R = { root = out, spans = {}, line = 0 }
  local ok, err = pcall(self.body, top, out)
  local spans = R.spans
  if not ok then err = error_text(err) end
  R = saved
  if not ok then error(err, 0) end
  return concat(out, "", 1, out.n), spans
end

-- Gives the mapping t its key order (keys: a list of its keys), e.g. the order of the JSON it was
-- decoded from: printing, tojson, items(), keys() and iteration follow it, as Python dicts do. This
-- also marks an empty table as an empty mapping rather than an empty list. Returns t.
function M.set_key_order(t, keys)
  for _, k in ipairs(keys) do
    if t[k] == nil then error("jinja.set_key_order: key " .. tostring(k) .. " is not in the table", 2) end
  end
  ORDER[t] = keys
  return t
end

local cache, cached = {}, 0
function M.render(source, ctx)
  local t = cache[source]
  if not t then
    if cached >= 64 then cache, cached = {}, 0 end
    t = M.compile(source)
    cache[source], cached = t, cached + 1
  end
  return t:render(ctx)
end

return M
