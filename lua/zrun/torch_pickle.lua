-- A restricted reader of Python pickles (protocols 0-5) as torch.save writes them: it builds plain
-- data and never runs anything a file names. Containers become Lua tables (dicts keep their key
-- order, M.keys), None the sentinel M.None, bytes and str Lua strings, ints and floats numbers
-- (an int beyond 2^53 loses its low bits), and a global the file calls is looked up in M.GLOBALS:
-- torch's tensor and storage rebuilds, OrderedDict, torch.Size, set, ... Any other class becomes an
-- inert M.Object record {class = "module.Name", args = {...}, state = ...}, which is how DeepSpeed's
-- loss scaler, its ZeroStageEnum or an argparse.Namespace in a checkpoint read back.
--
--   local v = M.loads(bytes, { persistent_load = function(pid) ... end, where = "file.pt" })
--
-- persistent_load receives the persistent id (torch.save's ('storage', storage_type, key,
-- location, numel) tuple, as read) and returns what stands for it; torch_file.lua supplies it.
local M = {}
local fmt, byte, sub, find = string.format, string.byte, string.sub, string.find
local concat, floor = table.concat, math.floor
local setmetatable, getmetatable, type, tostring, tonumber = setmetatable, getmetatable, type, tostring, tonumber
local ffi = require "ffi"
local utf8_codes -- (below)

M.None = setmetatable({}, { __tostring = function() return "None" end })

-- Dicts: a Lua table of the items plus their insertion order (Python's), kept aside.
local ORDER = setmetatable({}, { __mode = "k" })
local Dict = { __name = "dict" }
local List = { __name = "list" }
M.Dict, M.List = Dict, List
local function new_dict() local d = setmetatable({}, Dict); ORDER[d] = {}; return d end
local function dict_set(d, k, v)
  if type(k) == "table" and k ~= M.None then k = M.repr(k) end -- tuple keys: by their text
  if k == M.None then k = "None" end
  if d[k] == nil then local o = ORDER[d]; o[#o + 1] = k end
  d[k] = v
end
-- The keys of a dict in the file's order.
function M.keys(d)
  local o = ORDER[d]
  if not o then error("torch_pickle.keys: not a dict read from a pickle", 2) end
  return o
end
-- Whether v is a dict read from a pickle (M.keys gives its order).
function M.is_dict(v) return type(v) == "table" and getmetatable(v) == Dict end
-- Whether v is a list, tuple or set read from a pickle.
function M.is_list(v) return type(v) == "table" and getmetatable(v) == List end
M.new_dict, M.dict_set = new_dict, dict_set
local function list(t) return setmetatable(t or {}, List) end

-- An instance of a class zrun does not know: its name, constructor arguments and state.
local Object = { __name = "object" }
Object.__index = Object
M.Object = Object
-- Whether v is an inert record of a class zrun does not know (of that class, when given).
function M.is_object(v, class) return type(v) == "table" and getmetatable(v) == Object and (not class or v.class == class) end
-- The value of an IntEnum-like object (its single constructor argument), or v itself.
function M.value(v)
  if M.is_object(v) and v.args and #v.args == 1 then return v.args[1] end
  return v
end
-- A field of an object's state (BUILD's dict), e.g. a loss scaler's cur_scale.
function M.field(v, name)
  if M.is_object(v) and M.is_dict(v.state) then return v.state[name] end
  return nil
end

-- A short text of a value, for error messages and tuple keys.
function M.repr(v, depth)
  depth = depth or 0
  if v == M.None then return "None" end
  local t = type(v)
  if t == "string" then return fmt("%q", v) end
  if t ~= "table" then return tostring(v) end
  if depth > 2 then return "..." end
  local mt = getmetatable(v)
  if mt == List then
    local parts = {}
    for i = 1, math.min(#v, 8) do parts[i] = M.repr(v[i], depth + 1) end
    return "(" .. concat(parts, ", ") .. (#v > 8 and ", ..." or "") .. ")"
  end
  if mt == Dict then return fmt("{dict of %d}", #ORDER[v]) end
  if mt == Object then return fmt("<%s>", v.class) end
  if v.__repr then return v:__repr() end
  return "{...}"
end

-- ---------------------------------------------------------------- the known globals

local function cls_name(mod, name) return mod .. "." .. name end
-- A global the file names: a callable record. call(args, ctx) builds the value (REDUCE/NEWOBJ).
local Global = { __name = "global" }
Global.__index = Global
local function global(name, call) return setmetatable({ name = name, call = call }, Global) end
M.Global = Global

-- torch dtypes by their torch names, as zrun's stored-dtype names (nil: no safetensors dtype).
M.DTYPES = {
  float32 = "F32", float = "F32", float64 = "F64", double = "F64", float16 = "F16", half = "F16",
  bfloat16 = "BF16", int64 = "I64", long = "I64", int32 = "I32", int = "I32", int16 = "I16", short = "I16",
  int8 = "I8", uint8 = "U8", bool = "BOOL",
}
-- torch's storage classes (torch.FloatStorage, ...) -> torch dtype name
M.STORAGES = {
  FloatStorage = "float32", DoubleStorage = "float64", HalfStorage = "float16", BFloat16Storage = "bfloat16",
  LongStorage = "int64", IntStorage = "int32", ShortStorage = "int16", CharStorage = "int8",
  ByteStorage = "uint8", BoolStorage = "bool", UntypedStorage = "uint8",
  ComplexFloatStorage = "complex64", ComplexDoubleStorage = "complex128",
}

-- A tensor as the file describes it: its storage (what persistent_load returned), the element
-- offset into it (in elements of its dtype), shape and strides, and its dtype (the storage's, or
-- _rebuild_tensor_v3's), as a stored-dtype name ("BF16"). torch_file.lua gives it methods.
local Tensor = { __name = "tensor" }
Tensor.__index = Tensor
M.Tensor = Tensor
-- Whether v describes a tensor of the file (torch_file.lua gives it :get and :read).
function M.is_tensor(v) return type(v) == "table" and getmetatable(v) == Tensor end
function Tensor:__repr()
  local s = {}
  for i, n in ipairs(self.shape) do s[i] = tostring(n) end
  return fmt("tensor(%s, [%s])", self.dtype or "?", concat(s, ", "))
end

local function as_ints(v, what, ctx)
  if type(v) ~= "table" then ctx.fail(fmt("%s: expected a tuple of ints, got %s", what, M.repr(v))) end
  local out = {}
  for i = 1, #v do
    if type(v[i]) ~= "number" or v[i] < 0 or v[i] ~= floor(v[i]) then
      ctx.fail(fmt("%s: entry %d is %s, not a size", what, i, M.repr(v[i])))
    end
    out[i] = v[i]
  end
  return out
end
local function rebuild_tensor(ctx, storage, offset, size, stride, dtype)
  if type(storage) ~= "table" or not storage.dtype then
    ctx.fail("a tensor's storage is " .. M.repr(storage) .. ", not a storage the file holds")
  end
  if type(offset) ~= "number" then ctx.fail("a tensor's storage offset is " .. M.repr(offset)) end
  local shape, strides = as_ints(size, "a tensor's size", ctx), as_ints(stride, "a tensor's stride", ctx)
  if #shape ~= #strides then ctx.fail(fmt("a tensor has %d sizes but %d strides", #shape, #strides)) end
  return setmetatable({ storage = storage, offset = offset, shape = shape, stride = strides,
    dtype = dtype or storage.dtype }, Tensor)
end
local function tensor_of(ctx, v)
  if not M.is_tensor(v) then ctx.fail("a parameter's data is " .. M.repr(v) .. ", not a tensor") end
  return v
end

local G = {}
M.GLOBALS = G
G["torch._utils._rebuild_tensor"] = function(a, ctx) return rebuild_tensor(ctx, a[1], a[2], a[3], a[4]) end
G["torch._utils._rebuild_tensor_v2"] = function(a, ctx)
  local t = rebuild_tensor(ctx, a[1], a[2], a[3], a[4])
  t.requires_grad = a[5] == true
  return t
end
G["torch._utils._rebuild_tensor_v3"] = function(a, ctx) -- (storage, offset, size, stride, requires_grad, hooks, dtype)
  local dt = a[7]
  local t = rebuild_tensor(ctx, a[1], a[2], a[3], a[4], type(dt) == "table" and dt.torch_dtype
    and (M.DTYPES[dt.torch_dtype] or dt.torch_dtype) or nil)
  t.requires_grad = a[5] == true
  return t
end
G["torch._utils._rebuild_parameter"] = function(a, ctx)
  local t = tensor_of(ctx, a[1]); t.requires_grad = a[2] == true; t.parameter = true; return t
end
G["torch._utils._rebuild_parameter_with_state"] = function(a, ctx)
  local t = tensor_of(ctx, a[1]); t.requires_grad = a[2] == true; t.parameter = true; t.attrs = a[4]; return t
end
-- A tensor with Python attributes (DeepSpeed's ds_id on its flat groups): (func, type, args, state)
G["torch._tensor._rebuild_from_type_v2"] = function(a, ctx)
  local fn = a[1]
  if getmetatable(fn) ~= Global then ctx.fail("_rebuild_from_type_v2: " .. M.repr(fn) .. " is not a function") end
  local v = fn.call(a[3] or list(), ctx)
  if M.is_tensor(v) then v.attrs = a[4] end
  return v
end
G["collections.OrderedDict"] = function(a, ctx)
  local d = new_dict()
  if a[1] ~= nil and a[1] ~= M.None then -- OrderedDict([(k, v), ...])
    for _, kv in ipairs(a[1]) do dict_set(d, kv[1], kv[2]) end
  end
  return d
end
G["collections.defaultdict"] = function() return new_dict() end
G["builtins.dict"] = G["collections.OrderedDict"]
G["torch.Size"] = function(a, ctx) return list(as_ints(a[1] or {}, "torch.Size", ctx)) end
local function to_list(a) local l = list(); for i, v in ipairs(a[1] or {}) do l[i] = v end; return l end
G["builtins.set"], G["builtins.frozenset"], G["builtins.list"], G["builtins.tuple"] = to_list, to_list, to_list, to_list
G["torch.device"] = function(a) return a[2] ~= nil and a[2] ~= M.None and fmt("%s:%s", a[1], a[2]) or a[1] end
G["_codecs.encode"] = function(a, ctx) -- protocol 2's bytes: _codecs.encode(str, "latin1")
  if a[2] ~= "latin1" and a[2] ~= "latin-1" then ctx.fail("_codecs.encode with encoding " .. M.repr(a[2])) end
  local s, out = a[1], {}
  -- the text was decoded from UTF-8: code points < 256 back to one byte each
  for _, c in utf8_codes(s, ctx) do
    if c > 255 then ctx.fail("_codecs.encode: code point above 255 in latin-1 bytes") end
    out[#out + 1] = string.char(c)
  end
  return concat(out)
end
G["copyreg._reconstructor"] = function(a, ctx) -- (cls, base, state): object.__reduce_ex__'s form
  local cls = a[1]
  return setmetatable({ class = getmetatable(cls) == Global and cls.name or M.repr(cls), args = list() }, Object)
end
-- Python 2's module names, as old files have them.
local PY2 = { __builtin__ = "builtins", copy_reg = "copyreg" }

-- ---------------------------------------------------------------- the machine

-- UTF-8 code points of s (strings decoded from a pickle are UTF-8 in Lua).
function utf8_codes(s, ctx) -- (the local declared at the top)
  local i, n = 1, #s
  return function()
    if i > n then return nil end
    local c = byte(s, i)
    local len = c < 0x80 and 1 or c < 0xE0 and 2 or c < 0xF0 and 3 or 4
    local cp = len == 1 and c or c % (2 ^ (7 - len))
    for k = 1, len - 1 do cp = cp * 64 + (byte(s, i + k) or ctx.fail("truncated UTF-8")) % 64 end
    i = i + len
    return i, cp
  end
end

local utf8_char = require("zrun.jinja.strings").utf8 -- code point -> UTF-8 bytes

local dbuf = ffi.new("union { double d; uint8_t b[8]; }")
local function le_uint(s, i, n)
  local v = 0
  for k = n - 1, 0, -1 do v = v * 256 + byte(s, i + k) end
  return v
end
local function le_int(s, i, n) -- two's complement, n bytes
  if n == 0 then return 0 end
  local v = le_uint(s, i, n)
  if byte(s, i + n - 1) >= 128 then v = v - 2 ^ (8 * n) end
  return v
end

-- Reads one pickle from data (a string) at byte pos (default 1). Returns the value and the byte
-- after its STOP. opts: persistent_load(pid) (required when the pickle has persistent ids), where
-- (the file, for messages), globals (a table of name -> function(args, ctx) over M.GLOBALS).
function M.loads(data, opts, pos)
  opts = opts or {}
  local where = opts.where or "pickle"
  local i = pos or 1
  local n = #data
  local stack, top = {}, 0
  local marks, nmarks = {}, 0
  local memo = {}
  local ctx = {}
  function ctx.fail(msg) error(fmt("%s: cannot read the pickle at byte %d: %s", where, i - 1, msg), 0) end
  local function need(k) if i + k - 1 > n then ctx.fail("it ends early (the file is truncated)") end end
  local function push(v) top = top + 1; stack[top] = v end
  local function pop()
    if top == 0 or (nmarks > 0 and top <= marks[nmarks]) then ctx.fail("stack underflow (corrupt pickle)") end
    local v = stack[top]; stack[top] = nil; top = top - 1; return v
  end
  local function peek()
    if top == 0 then ctx.fail("stack underflow (corrupt pickle)") end
    return stack[top]
  end
  local function pop_mark() -- the items above the last MARK, as a list
    if nmarks == 0 then ctx.fail("no MARK on the stack (corrupt pickle)") end
    local m = marks[nmarks]; marks[nmarks] = nil; nmarks = nmarks - 1
    local items = list()
    for k = m + 1, top do items[k - m] = stack[k]; stack[k] = nil end
    top = m
    return items
  end
  local function take(k) need(k); local s = sub(data, i, i + k - 1); i = i + k; return s end
  local function line()
    local e = find(data, "\n", i, true)
    if not e then ctx.fail("a text line has no end") end
    local s = sub(data, i, e - 1); i = e + 1; return s
  end
  local function uint(k) need(k); local v = le_uint(data, i, k); i = i + k; return v end
  local function find_global(mod, name)
    mod = PY2[mod] or mod
    local full = cls_name(mod, name)
    local fn = (opts.globals and opts.globals[full]) or G[full]
    if fn then return global(full, fn) end
    if mod == "torch" or mod == "torch.storage" then
      if name:find("Storage$") then -- (a dtype zrun has no name for keeps torch's: it is refused when read)
        return { storage_type = name, torch_dtype = M.STORAGES[name] or name:gsub("Storage$", "") }
      end
      if M.DTYPES[name] then return { torch_dtype = name, __repr = function() return "torch." .. name end } end
    end
    -- anything else: calling it makes an inert record
    return global(full, function(a) return setmetatable({ class = full, args = a }, Object) end)
  end
  local function call(f, args)
    if type(f) ~= "table" or getmetatable(f) ~= Global then
      ctx.fail("calls " .. M.repr(f) .. ", which is not a function or class")
    end
    if type(args) ~= "table" or getmetatable(args) ~= List then ctx.fail(fmt("calls %s with %s", f.name, M.repr(args))) end
    local ok, v = pcall(f.call, args, ctx)
    if ok then return v end
    if type(v) == "string" and v:sub(1, #where + 1) == where .. ":" then error(v, 0) end -- (ctx.fail's own)
    ctx.fail(fmt("%s%s cannot take these arguments (a damaged file?)", f.name, M.repr(args)))
  end
  local nmemo = 0
  local function memo_put(k)
    if memo[k] == nil then nmemo = nmemo + 1 end
    memo[k] = peek()
  end
  local function memo_get(k)
    local v = memo[k]
    if v == nil then ctx.fail(fmt("memo entry %s is not set (corrupt pickle)", tostring(k))) end
    return v
  end
  local function setitems(d, items)
    if M.is_object(d) then -- a dict subclass (defaultdict-like records): keep the items as its state
      d.state = d.state or new_dict(); d = d.state
    end
    if not M.is_dict(d) then ctx.fail("SETITEM on " .. M.repr(d) .. ", not a dict") end
    for k = 1, #items, 2 do dict_set(d, items[k], items[k + 1]) end
  end
  local function appends(l, items)
    if M.is_object(l) then l.items = l.items or list(); l = l.items end
    if type(l) ~= "table" or getmetatable(l) ~= List then ctx.fail("APPEND to " .. M.repr(l) .. ", not a list") end
    for _, v in ipairs(items) do l[#l + 1] = v end
  end

  while true do
    need(1)
    local op = byte(data, i); i = i + 1
    if op == 0x80 then -- PROTO
      local p = uint(1)
      if p > 5 then ctx.fail(fmt("pickle protocol %d is newer than 5", p)) end
    elseif op == 0x95 then i = i + 8 -- FRAME: a length only
    elseif op == 0x2e then -- STOP
      if top ~= 1 then ctx.fail(fmt("STOP with %d values on the stack (corrupt pickle)", top)) end
      return stack[1], i
    elseif op == 0x28 then nmarks = nmarks + 1; marks[nmarks] = top -- MARK
    elseif op == 0x7d then push(new_dict()) -- EMPTY_DICT
    elseif op == 0x5d then push(list()) -- EMPTY_LIST
    elseif op == 0x29 then push(list()) -- EMPTY_TUPLE
    elseif op == 0x8f then push(list()) -- EMPTY_SET
    elseif op == 0x74 then push(pop_mark()) -- TUPLE
    elseif op == 0x6c then push(pop_mark()) -- LIST
    elseif op == 0x91 then push(pop_mark()) -- FROZENSET
    elseif op == 0x85 then local a = pop(); push(list { a }) -- TUPLE1
    elseif op == 0x86 then local b = pop(); local a = pop(); push(list { a, b }) -- TUPLE2
    elseif op == 0x87 then local c = pop(); local b = pop(); local a = pop(); push(list { a, b, c }) -- TUPLE3
    elseif op == 0x64 then -- DICT
      local items, d = pop_mark(), new_dict()
      setitems(d, items); push(d)
    elseif op == 0x4e then push(M.None) -- NONE
    elseif op == 0x88 then push(true) -- NEWTRUE
    elseif op == 0x89 then push(false) -- NEWFALSE
    elseif op == 0x4a then push(le_int(take(4), 1, 4)) -- BININT
    elseif op == 0x4b then push(uint(1)) -- BININT1
    elseif op == 0x4d then push(uint(2)) -- BININT2
    elseif op == 0x8a then local k = uint(1); push(le_int(take(k), 1, k)) -- LONG1
    elseif op == 0x8b then -- LONG4
      local k = uint(4)
      if k > 64 then ctx.fail(fmt("a %d-byte integer", k)) end
      push(le_int(take(k), 1, k))
    elseif op == 0x49 or op == 0x4c then -- INT / LONG (text)
      local s = line():gsub("L$", "")
      if s == "00" then push(false) elseif s == "01" then push(true)
      else push(tonumber(s) or ctx.fail("INT " .. fmt("%q", s))) end
    elseif op == 0x47 then -- BINFLOAT: big-endian double
      local s = take(8)
      for k = 0, 7 do dbuf.b[7 - k] = byte(s, k + 1) end
      push(dbuf.d)
    elseif op == 0x46 then push(tonumber(line()) or ctx.fail("bad FLOAT")) -- FLOAT (text)
    elseif op == 0x58 then push(take(uint(4))) -- BINUNICODE (UTF-8)
    elseif op == 0x8c then push(take(uint(1))) -- SHORT_BINUNICODE
    elseif op == 0x8d then push(take(uint(8))) -- BINUNICODE8
    elseif op == 0x42 then push(take(uint(4))) -- BINBYTES
    elseif op == 0x43 then push(take(uint(1))) -- SHORT_BINBYTES
    elseif op == 0x8e then push(take(uint(8))) -- BINBYTES8
    elseif op == 0x96 then push(take(uint(8))) -- BYTEARRAY8
    elseif op == 0x54 then push(take(uint(4))) -- BINSTRING (Python 2 str: bytes)
    elseif op == 0x55 then push(take(uint(1))) -- SHORT_BINSTRING
    elseif op == 0x53 then -- STRING: a quoted Python 2 literal
      local s = line()
      local q = s:sub(1, 1)
      if (q ~= "'" and q ~= '"') or s:sub(-1) ~= q then ctx.fail("STRING is not quoted") end
      s = s:sub(2, -2):gsub("\\x(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
        :gsub("\\([nrt\\'\"])", { n = "\n", r = "\r", t = "\t", ["\\"] = "\\", ["'"] = "'", ['"'] = '"' })
      push(s)
    elseif op == 0x56 then -- UNICODE: raw-unicode-escape text
      local s = line():gsub("\\u(%x%x%x%x)", function(h) return utf8_char(tonumber(h, 16)) end)
        :gsub("\\U(%x%x%x%x%x%x%x%x)", function(h) return utf8_char(tonumber(h, 16)) end)
      push(s)
    elseif op == 0x63 then -- GLOBAL module\nname\n
      local mod = line(); local name = line()
      push(find_global(mod, name))
    elseif op == 0x93 then -- STACK_GLOBAL
      local name = pop(); local mod = pop()
      if type(mod) ~= "string" or type(name) ~= "string" then ctx.fail("STACK_GLOBAL of non-strings") end
      push(find_global(mod, name))
    elseif op == 0x52 then -- REDUCE
      local args = pop(); local f = pop()
      if type(args) ~= "table" then ctx.fail("REDUCE with arguments " .. M.repr(args)) end
      push(call(f, args))
    elseif op == 0x81 then -- NEWOBJ: cls.__new__(cls, *args)
      local args = pop(); local cls = pop()
      push(call(cls, args))
    elseif op == 0x92 then -- NEWOBJ_EX
      local _ = pop(); local args = pop(); local cls = pop()
      push(call(cls, args))
    elseif op == 0x62 then -- BUILD: obj.__setstate__(state) or update its __dict__
      local state = pop(); local obj = peek()
      if M.is_object(obj) then obj.state = state
      elseif M.is_tensor(obj) then obj.attrs = state
      elseif M.is_dict(obj) and M.is_dict(state) then
        for _, k in ipairs(M.keys(state)) do dict_set(obj, k, state[k]) end
      end -- other values (a set rebuilt as a list, ...): the state adds nothing zrun reads
    elseif op == 0x6f then -- OBJ: MARK cls args... OBJ
      local items = pop_mark()
      local cls = table.remove(items, 1)
      push(call(cls, items))
    elseif op == 0x69 then -- INST module\nname\n: MARK args... INST
      local mod = line(); local name = line()
      push(call(find_global(mod, name), pop_mark()))
    elseif op == 0x51 then -- BINPERSID
      local pid = pop()
      if not opts.persistent_load then ctx.fail("a persistent id, but no storage to resolve it") end
      push(opts.persistent_load(pid, ctx))
    elseif op == 0x50 then -- PERSID (text)
      local pid = line()
      if not opts.persistent_load then ctx.fail("a persistent id, but no storage to resolve it") end
      push(opts.persistent_load(pid, ctx))
    elseif op == 0x71 then memo_put(uint(1)) -- BINPUT
    elseif op == 0x72 then memo_put(uint(4)) -- LONG_BINPUT
    elseif op == 0x70 then memo_put(tonumber(line()) or ctx.fail("bad PUT")) -- PUT
    elseif op == 0x94 then memo_put(nmemo) -- MEMOIZE: the next index (Python's len(memo))
    elseif op == 0x68 then push(memo_get(uint(1))) -- BINGET
    elseif op == 0x6a then push(memo_get(uint(4))) -- LONG_BINGET
    elseif op == 0x67 then push(memo_get(tonumber(line()) or -1)) -- GET
    elseif op == 0x73 then local v = pop(); local k = pop(); setitems(peek(), list { k, v }) -- SETITEM
    elseif op == 0x75 then local items = pop_mark(); setitems(peek(), items) -- SETITEMS
    elseif op == 0x61 then local v = pop(); appends(peek(), list { v }) -- APPEND
    elseif op == 0x65 then local items = pop_mark(); appends(peek(), items) -- APPENDS
    elseif op == 0x90 then local items = pop_mark(); appends(peek(), items) -- ADDITEMS
    elseif op == 0x30 then pop() -- POP
    elseif op == 0x31 then pop_mark() -- POP_MARK
    elseif op == 0x32 then push(peek()) -- DUP
    elseif op == 0x82 or op == 0x83 or op == 0x84 then ctx.fail("extension registry codes (EXT1/2/4)")
    elseif op == 0x97 or op == 0x98 then ctx.fail("out-of-band buffers (protocol 5)")
    else ctx.fail(fmt("unknown opcode 0x%02x", op)) end
  end
end

return M
