-- zrun.jinja's parser: tokens -> AST (tables {k = kind, ...}). Expression precedence as jinja2's
-- parser: condexpr < or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary - + (which
-- takes filters/tests after it). Statements: if, for, break/continue, set (and set blocks), macro,
-- generation, filter, with.
local concat, fmt = table.concat, string.format

local V = require "zrun.jinja.values"
local lexer = require "zrun.jinja.lexer"
local NONE, mkfloat, repr_str = V.NONE, V.mkfloat, V.repr_str
local lex, syntax = lexer.lex, lexer.syntax

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
  if self:accept("op", "]") then return { k = "item", o = e, key = cur or { k = "tuple", items = {} } } end -- (a[]: a[()])
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
    elseif self:accept("op", "(") then e = self:call(e)
    else return e end
  end
end

-- e(...) after its "(": the call node
function Parser:call(e)
  local args, kw = self:args()
  return { k = "call", f = e, args = args, kw = kw }
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
    elseif self:accept("op", "(") then e = self:call(e)
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

return { parse = parse }
