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
-- Structure: lexer (tokens) -> parser (AST) -> compiler (AST to Lua closures) -> render, in
-- lua/zrun/jinja/: lexer.lua, parser.lua and compiler.lua, with values.lua (value kinds, repr/str,
-- truthiness, equality), strings.lua (Python's str on UTF-8), runtime.lua (operators, attribute and
-- item access, iteration) and library.lua (methods, filters, tests, tojson, globals); this file,
-- init.lua, is the API.

local V = require "zrun.jinja.values"
local lexer = require "zrun.jinja.lexer"
local parser = require "zrun.jinja.parser"
local lib = require "zrun.jinja.library"
local compiler = require "zrun.jinja.compiler"
local ORDER = V.ORDER
local parse, cblock, run, tojson, GLOBALS = parser.parse, compiler.cblock, compiler.run, lib.tojson, lib.globals

local M = {}
M.none = V.NONE
M.kind, M.repr, M.tostr = V.kind, V.repr, V.tostr
M._lex, M._parse = lexer.lex, parse
M.filters, M.tests, M.globals = lib.filters, lib.tests, GLOBALS

-- json.dumps(v, ensure_ascii=False) as the template's tojson filter writes it (mappings in their key
-- order, see set_key_order); opts: the filter's keyword arguments ensure_ascii, indent (a number or a
-- string), separators ({item_sep, key_sep}) and sort_keys. Returns the JSON text.
M.tojson = function(v, opts) opts = opts or {}; return tojson(v, {}, opts) end

local Template = {}
Template.__index = Template

-- Compiles the template text source (a string) into a template: tpl:render(ctx) returns the text
-- and the {% generation %} spans. A syntax error, or a filter or test zrun.jinja does not know
-- outside an if, raises "chat template line N: ...".
function M.compile(source)
  if type(source) ~= "string" then error("chat template: jinja.compile needs the template text (a string), got " .. type(source), 2) end
  local body = cblock(parse(source))
  return setmetatable({ source = source, body = body }, Template)
end

-- Renders with the variables of ctx; returns the text and the {% generation %} spans.
function Template:render(ctx)
  ctx = ctx or {}
  local top = setmetatable({}, { __index = function(_, k)
    local v = ctx[k]
    if v == nil then return GLOBALS[k] end
    return v
  end })
  return run(self.body, top)
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

-- JSON text decoded as Python's json.loads hands it to a template: each object keeps its key order (as
-- set_key_order gives it: tojson, items() and iteration follow it) and an empty object stays a mapping,
-- not an empty list; null is none; with floats, a number written with a fraction or an exponent is a
-- float (1.0 prints "1.0"), else every number is a Lua number. cjson.decode loses all three: a tool
-- schema's keys come out sorted, "properties": {} as [], 1.0 as 1. Raises "json: ..." on invalid JSON.
function M.json_decode(text, floats)
  local cjson = require "cjson"
  local find, sub, byte = string.find, string.sub, string.byte
  local pos = 1
  local function bad(what) error(string.format("json: %s at byte %d", what, pos), 0) end
  local function skip() pos = find(text, "[^ \t\r\n]", pos) or #text + 1 end
  local value
  local function str()
    local q = pos + 1
    while true do
      local e = find(text, '["\\]', q)
      if not e then bad("unterminated string") end
      if byte(text, e) == 34 then -- (the closing quote)
        local raw = sub(text, pos, e)
        pos = e + 1
        if find(raw, "\\", 1, true) then return cjson.decode(raw) end -- (escapes: cjson's rules)
        return sub(raw, 2, -2)
      end
      q = e + 2 -- (a backslash and the character it escapes)
    end
  end
  function value()
    skip()
    local c = byte(text, pos)
    if c == 123 then -- {
      pos = pos + 1
      local t, keys = {}, {}
      skip()
      if byte(text, pos) == 125 then pos = pos + 1; ORDER[t] = keys; return t end
      while true do
        skip()
        if byte(text, pos) ~= 34 then bad("expected a string key") end
        local k = str()
        skip()
        if byte(text, pos) ~= 58 then bad("expected ':'") end
        pos = pos + 1
        if t[k] == nil then keys[#keys + 1] = k end -- (a repeated key: the last value, the first place, as Python)
        t[k] = value()
        skip()
        local d = byte(text, pos)
        pos = pos + 1
        if d == 125 then ORDER[t] = keys; return t end
        if d ~= 44 then pos = pos - 1; bad("expected ',' or '}'") end
      end
    elseif c == 91 then -- [
      pos = pos + 1
      local t = {}
      skip()
      if byte(text, pos) == 93 then pos = pos + 1; return t end
      while true do
        t[#t + 1] = value()
        skip()
        local d = byte(text, pos)
        pos = pos + 1
        if d == 93 then return t end
        if d ~= 44 then pos = pos - 1; bad("expected ',' or ']'") end
      end
    elseif c == 34 then return str()
    elseif c == 116 and sub(text, pos, pos + 3) == "true" then pos = pos + 4; return true
    elseif c == 102 and sub(text, pos, pos + 4) == "false" then pos = pos + 5; return false
    elseif c == 110 and sub(text, pos, pos + 3) == "null" then pos = pos + 4; return V.NONE
    end
    local s, e = find(text, "^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
    local n = s and tonumber(sub(text, s, e))
    if not n then bad("unexpected character") end
    pos = e + 1
    if floats and find(text, "[.eE]", s) and find(text, "[.eE]", s) <= e then return V.mkfloat(n) end
    return n
  end
  local v = value()
  skip()
  if pos <= #text then bad("extra data") end
  return v
end


-- Renders the template text source with the variables of ctx (a table; a missing key is undefined,
-- the globals fill in what ctx lacks): returns the text and the {% generation %} spans, {{s, e}, ...}
-- 0-based byte offsets [s, e) into the text. The compiled template is cached by source (the last
-- 64 sources). An error raises one line, "chat template line N: ..." ("chat template: msg" from
-- raise_exception).
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
