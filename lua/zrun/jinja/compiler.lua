-- zrun.jinja's compiler: AST -> Lua closures. An expression becomes function(scope) -> value; a
-- statement function(scope, out) -> nil | BREAK | CONTINUE. A scope is a table whose __index is its
-- parent; for-loop iterations, macros, {% generation %} and {% set %} blocks get their own scope, as
-- in jinja2 (a set inside a loop does not leak out of it; inside an if it does). run() renders a
-- compiled body, keeping the line being rendered (for errors) and the {% generation %} spans.
local concat, fmt = table.concat, string.format

local V = require "zrun.jinja.values"
local RT = require "zrun.jinja.runtime"
local lib = require "zrun.jinja.library"
local syntax = require("zrun.jinja.lexer").syntax
local NONE, FLOAT, TUPLE, LOOP, ERR, ORDER = V.NONE, V.FLOAT, V.TUPLE, V.LOOP, V.ERR, V.ORDER
local fail, undef, mkfloat, mkdict, callable = V.fail, V.undef, V.mkfloat, V.mkdict, V.callable
local kind, pytype, num, isfloat, tostr, truthy, eq = V.kind, V.pytype, V.num, V.isfloat, V.tostr, V.truthy, V.eq
local METHODS, check_defined, arith, lt, contains = RT.METHODS, RT.check_defined, RT.arith, RT.lt, RT.contains
local iterate, slice, getattr, getitem, call = RT.iterate, RT.slice, RT.getattr, RT.getitem, RT.call
local FILTERS, TESTS = lib.filters, lib.tests

-- Render state of the render in progress (renders do not nest, but we save/restore anyway).
local R = { line = 0 }

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

local function error_text(err)
  if getmetatable(err) == ERR then
    if err.raise then return "chat template: " .. err.msg end
    return fmt("chat template line %d: %s", R.line, err.msg)
  end
  return fmt("chat template line %d: %s", R.line, tostring(err))
end

-- Renders a compiled body (cblock's) with top as its outermost scope; returns the text and the
-- {% generation %} spans, or raises the error as one line naming the template line.
local function run(body, top)
  local out = buffer()
  local saved = R
  R = { root = out, spans = {}, line = 0 }
  local ok, err = pcall(body, top, out)
  local spans = R.spans
  if not ok then err = error_text(err) end
  R = saved
  if not ok then error(err, 0) end
  return concat(out, "", 1, out.n), spans
end
return { cblock = cblock, run = run }
