-- Files written by torch.save (pytorch_model.bin, DeepSpeed's *_model_states.pt and
-- *_optim_states.pt), read without Python and without running anything the file names: the zip
-- container of torch >= 1.6 (records <archive>/data.pkl, <archive>/data/<key>, stored
-- uncompressed, zip64 past 4 GB) and the older format (pickles followed by the raw storages). The
-- pickle is read by zrun.torch_pickle; each tensor in it stays on disk until asked for.
--
--   local tf = require "zrun.torch_file"
--   local obj = tf.load("mp_rank_00_model_states.pt")    -- Lua tables, torch_pickle's values
--   local w = obj.module["lm_head.weight"]:get{ dtype = "f32" }  -- a zrun tensor, read now
--   local f, names = tf.open_state_dict("pytorch_model.bin")   -- a safetensors-like handle
local P = require "zrun.torch_pickle"
local zr = require "zrun"
local C = zr._C

local M = {}
local fmt, byte, concat = string.format, string.byte, table.concat
local ipairs, type, tostring, tonumber, setmetatable = ipairs, type, tostring, tonumber, setmetatable

M.LEGACY_PREFIX = 1048576 -- bytes read first for an old-format file's pickles (more when they are longer)
-- the zrun dtype each stored dtype loads as by default (safetensors.c's rule)
local NATIVE = { F32 = "f32", F64 = "f64", F16 = "f16", BF16 = "bf16", I64 = "i64", I32 = "i32", I16 = "i32", I8 = "i32",
  U8 = "u8", BOOL = "u8" }
local ELEMENT = { F32 = 4, F64 = 8, F16 = 2, BF16 = 2, I64 = 8, I32 = 4, I16 = 2, I8 = 1, U8 = 1, BOOL = 1 }
M.ELEMENT = ELEMENT -- bytes per element, by stored dtype

local function u(s, i, n)
  local v = 0
  for k = n - 1, 0, -1 do v = v * 256 + byte(s, i + k) end
  return v
end

local function read_at(fh, path, off, len)
  fh:seek("set", off)
  local s = fh:read(len)
  if not s or #s < len then
    error(fmt("%s: cannot read %d bytes at offset %d (the file is truncated)", path, len, off), 0)
  end
  return s
end

-- The zip's records: name -> {offset = first data byte, size = bytes}. Only stored (uncompressed)
-- records, as torch writes them.
local function zip_records(fh, path, size)
  local tail_len = math.min(size, 65557)
  local tail = read_at(fh, path, size - tail_len, tail_len)
  local e
  for k = tail_len - 21, 1, -1 do
    if byte(tail, k) == 0x50 and tail:sub(k, k + 3) == "PK\5\6" then e = k; break end
  end
  if not e then error(fmt("%s: no zip directory at the end of the file (the file is truncated or damaged)", path), 0) end
  local count, cd_size, cd_off = u(tail, e + 10, 2), u(tail, e + 12, 4), u(tail, e + 16, 4)
  if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_off == 0xFFFFFFFF then -- zip64
    local loc = e - 20
    if loc < 1 or tail:sub(loc, loc + 3) ~= "PK\6\7" then
      error(fmt("%s: a zip64 file without its zip64 locator (the file is damaged)", path), 0)
    end
    local z = read_at(fh, path, u(tail, loc + 8, 8), 56)
    if z:sub(1, 4) ~= "PK\6\6" then error(fmt("%s: the zip64 directory record is missing (damaged file)", path), 0) end
    count, cd_size, cd_off = u(z, 33, 8), u(z, 41, 8), u(z, 49, 8)
  end
  if cd_off + cd_size > size then error(fmt("%s: the zip directory points past the end of the file (truncated)", path), 0) end
  local cd = read_at(fh, path, cd_off, cd_size)
  local recs, order, p = {}, {}, 1
  for _ = 1, count do
    if cd:sub(p, p + 3) ~= "PK\1\2" or p + 45 > #cd
      or p + 45 + u(cd, p + 28, 2) + u(cd, p + 30, 2) + u(cd, p + 32, 2) > #cd then
      error(fmt("%s: damaged zip directory", path), 0)
    end
    local method, csize, usize = u(cd, p + 10, 2), u(cd, p + 20, 4), u(cd, p + 24, 4)
    local nlen, xlen, clen, loff = u(cd, p + 28, 2), u(cd, p + 30, 2), u(cd, p + 32, 2), u(cd, p + 42, 4)
    local name = cd:sub(p + 46, p + 45 + nlen)
    local x, xend = p + 46 + nlen, p + 46 + nlen + xlen
    while x + 4 <= xend do -- the zip64 extra field holds the sizes and offset that overflowed
      local id, len = u(cd, x, 2), u(cd, x + 2, 2)
      if x + 4 + len > xend then error(fmt("%s: record %s: damaged zip64 field", path, name), 0) end
      if id == 1 then
        local q = x + 4
        if usize == 0xFFFFFFFF then usize = u(cd, q, 8); q = q + 8 end
        if csize == 0xFFFFFFFF then csize = u(cd, q, 8); q = q + 8 end
        if loff == 0xFFFFFFFF then loff = u(cd, q, 8) end
      end
      x = x + 4 + len
    end
    if method ~= 0 then
      error(fmt("%s: record %s is compressed (zip method %d); torch.save writes records stored, so the file "
        .. "was re-zipped: unzip it and zip it again with `zip -0`, or save it again with torch.save", path, name, method), 0)
    end
    local lh = read_at(fh, path, loff, 30)
    if lh:sub(1, 4) ~= "PK\3\4" then error(fmt("%s: record %s: damaged local header", path, name), 0) end
    local off = loff + 30 + u(lh, 27, 2) + u(lh, 29, 2)
    if off + usize > size then
      error(fmt("%s: record %s ends past the end of the file (the file is truncated)", path, name), 0)
    end
    recs[name] = { offset = off, size = usize }
    order[#order + 1] = name
    p = p + 46 + nlen + xlen + clen
  end
  return recs, order
end

local Tensor = P.Tensor
-- Tensor methods (the descriptors torch_pickle builds; file and name set by M.load).
function Tensor:numel()
  local n = 1
  for _, d in ipairs(self.shape) do n = n * d end
  return n
end
function Tensor:is_contiguous()
  local s = 1
  for d = #self.shape, 1, -1 do
    if self.shape[d] ~= 1 and self.stride[d] ~= s then return false end
    s = s * self.shape[d]
  end
  return true
end
-- The order of the dimensions in memory when the tensor is a permutation of a dense block (a
-- transposed weight): a list of dimension numbers, outermost first; nil for any other layout.
function Tensor:dense_order()
  local order = {}
  for d = 1, #self.shape do order[d] = d end
  table.sort(order, function(a, b)
    if self.stride[a] ~= self.stride[b] then return self.stride[a] > self.stride[b] end
    return a < b
  end)
  local s = 1
  for j = #order, 1, -1 do
    local d = order[j]
    if self.shape[d] ~= 1 and self.stride[d] ~= s then return nil end
    s = s * self.shape[d]
  end
  return order
end

-- The tensor read from the file: a zrun tensor of its shape; opts {dtype=, device=} as
-- SafetensorsFile:get (default: the stored dtype, on the CPU). A permuted (transposed) tensor is
-- read as stored and made contiguous.
M.STRIDED_MAX = 1048576 -- the most elements of a strided (non-dense) view that :get gathers

-- A strided view (a column of a matrix, every other row, ...): the span of its storage it reaches,
-- read as f64, and its elements picked in order (f64 holds every value of the dtypes zrun reads).
local function gather_strided(self, opts)
  local n = self:numel()
  if n > M.STRIDED_MAX then
    error(fmt("%s: %s is a strided view of %d elements (zrun gathers up to %d): save it with .contiguous()",
      self.where, P.repr(self), n, M.STRIDED_MAX), 0)
  end
  local span = 1
  for d = 1, #self.shape do span = span + (self.shape[d] - 1) * self.stride[d] end
  local e = self.span
  local v = C.safetensors_open_view(self.file.path, { { name = "span", stored = e.stored, shape = { n > 0 and span or 0 },
    offset = e.offset } })
  local ok, flat = pcall(v.get, v, "span", { dtype = "f64" })
  v:close()
  if not ok then error(flat, 0) end
  local src, out, idx = flat:flat_table(), {}, {}
  for d = 1, #self.shape do idx[d] = 0 end
  for k = 1, n do
    local at = 1
    for d = 1, #self.shape do at = at + idx[d] * self.stride[d] end
    out[k] = src[at]
    for d = #self.shape, 1, -1 do -- the next index, last dimension fastest
      idx[d] = idx[d] + 1
      if idx[d] < self.shape[d] then break end
      idx[d] = 0
    end
  end
  local t = zr.tensor(out, { dtype = "f64" })
  t = #self.shape == 0 and t:reshape({}) or t:reshape(self.shape)
  return t:to({ dtype = opts and opts.dtype or NATIVE[e.stored], device = opts and opts.device or "cpu" })
end

function Tensor:get(opts)
  if self.span then return gather_strided(self, opts) end
  if not self.file or not self.name then
    local why = not ELEMENT[self.dtype or ""]
      and fmt("zrun has no dtype for torch.%s", tostring(self.dtype or self.storage.torch_dtype))
      or "it is a strided view, not a dense block (save it with .contiguous())"
    error(fmt("%s: %s cannot be read: %s", self.where or "torch file", P.repr(self), why), 0)
  end
  local t = self.file:view():get(self.name, opts)
  if self.perm then t = t:permute(self.perm):contiguous() end
  return t
end

-- Elements [start, start + len) (0-based) of the tensor, flattened, as a 1-D zrun tensor read from
-- the file now (opts as get): a part of a large flat tensor without reading the rest.
function Tensor:read(start, len, opts)
  local n = self:numel()
  if start < 0 or len < 0 or start + len > n then
    error(fmt("%s: elements %d..%d of %s, which has %d", self.where or "torch file", start, start + len, P.repr(self), n), 0)
  end
  if self.perm or self.span then return self:get(opts):reshape({ n }):narrow(1, start + 1, len):contiguous() end
  if not self.file or not self.name then return self:get(opts) end -- (says why it cannot be read)
  local e = self.file.by_name[self.name]
  local v = C.safetensors_open_view(self.file.path, { { name = "part", stored = e.stored, shape = { len },
    offset = e.offset + start * ELEMENT[e.stored] } })
  local ok, t = pcall(v.get, v, "part", opts)
  v:close()
  if not ok then error(t, 0) end
  return t
end

-- One opened file: its path and, once asked for, a view over its tensors (C.safetensors_open_view).
local File = {}
File.__index = File
function File:view()
  if not self.handle then self.handle = C.safetensors_open_view(self.path, self.entries) end
  return self.handle
end
function File:close()
  if self.handle then self.handle:close(); self.handle = nil end
end

-- The format before torch 1.6 (torch.save(..., _use_new_zipfile_serialization=False)): pickles of
-- the magic number, protocol version, sys_info, the object and its storage keys, then each
-- storage as an 8-byte element count and its bytes. all: a prefix of the file holding the pickles.
-- Returns the object and data_of(key) -> offset, bytes.
local function legacy(fh, path, size, all, storages, pick_opts)
  local obj, data_of
  local magic, p2 = P.loads(all, { where = path })
  -- torch's magic number 0x1950a86a20f9469cfc6c, read as a float (it is past 2^53)
  if type(magic) ~= "number" or math.abs(magic - 119547037146038801333356) > 2 ^ 30 then
    error(fmt("%s: not a torch.save file (a pickle without torch's magic number)", path), 0)
  end
  local _, p3 = P.loads(all, { where = path }, p2)        -- protocol version
  local sys, p4 = P.loads(all, { where = path }, p3)      -- sys_info
  if P.is_dict(sys) and sys.little_endian == false then
    error(fmt("%s: saved on a big-endian machine; zrun reads little-endian files", path), 0)
  end
  local p5
  obj, p5 = P.loads(all, pick_opts, p4)
  local keys, p6 = P.loads(all, { where = path }, p5)
  local at, offsets = p6 - 1, {}
  for _, key in ipairs(keys) do -- each storage: an 8-byte element count, then its bytes
    key = tostring(key)
    local s = storages[key]
    local n = u(read_at(fh, path, at, 8), 1, 8)
    local el = s and ELEMENT[s.dtype or ""] or 1
    offsets[key] = { at + 8, n * el }
    at = at + 8 + n * el
  end
  if at > size then error(fmt("%s: the storages end past the end of the file (truncated)", path), 0) end
  data_of = function(key)
    local o = offsets[key]
    if not o then error(fmt("%s: storage %s is not in the file (damaged)", path, key), 0) end
    return o[1], o[2]
  end
  return obj, data_of
end

-- Reads path (a torch.save file). Returns the object it holds (torch_pickle's values; each
-- tensor's :get() reads it) and the File (file:close() releases its mapping; the tensors'
-- :get() reopens it).
function M.load(path)
  local fh, err = io.open(path, "rb")
  if not fh then error(fmt("%s: cannot open: %s", path, tostring(err)), 0) end
  local ok, obj, file = pcall(function()
    local size = fh:seek("end")
    local head = read_at(fh, path, 0, math.min(size, 8))
    local file = setmetatable({ path = path, entries = {}, by_name = {} }, File)
    local storages = {}
    local data_of -- key -> offset of the storage's first byte
    local function persistent_load(pid, ctx)
      if type(pid) ~= "table" or pid[1] ~= "storage" then ctx.fail("persistent id " .. P.repr(pid) .. " is not a storage") end
      local st, key, numel = pid[2], tostring(pid[3]), pid[5]
      if type(st) ~= "table" or not st.torch_dtype then ctx.fail("storage type " .. P.repr(st)) end
      local view = pid[6] -- (the old format's storage views: (view_key, offset, size) into storage key)
      local vkey = P.is_list(view) and key .. "/" .. tostring(view[1]) or key
      if storages[vkey] then return storages[vkey] end
      local s = { key = key, torch_dtype = st.torch_dtype, dtype = P.DTYPES[st.torch_dtype], numel = numel,
        location = pid[4], view_offset = P.is_list(view) and tonumber(view[2]) or 0 }
      storages[vkey] = s
      storages[key] = storages[key] or s
      return s
    end
    local pick_opts = { persistent_load = persistent_load, where = path }
    local obj
    if head:sub(1, 4) == "PK\3\4" then
      local recs, order = zip_records(fh, path, size)
      local prefix
      for _, n in ipairs(order) do
        prefix = n:match("^(.*)/data%.pkl$")
        if prefix then break end
      end
      if not prefix then
        if recs["constants.pkl"] or (order[1] or ""):match("/constants%.pkl$") then
          error(fmt("%s: a TorchScript archive (torch.jit.save), not a torch.save file", path), 0)
        end
        error(fmt("%s: a zip file without data.pkl: not written by torch.save", path), 0)
      end
      local bo = recs[prefix .. "/byteorder"]
      if bo and read_at(fh, path, bo.offset, bo.size) ~= "little" then
        error(fmt("%s: saved on a big-endian machine; zrun reads little-endian files", path), 0)
      end
      local pk = recs[prefix .. "/data.pkl"]
      obj = P.loads(read_at(fh, path, pk.offset, pk.size), pick_opts)
      data_of = function(key, s)
        local r = recs[prefix .. "/data/" .. key]
        if not r then error(fmt("%s: storage %s has no record data/%s (the file is damaged)", path, key, key), 0) end
        return r.offset, r.size
      end
    elseif byte(head, 1) == 0x80 then -- the format before torch 1.6: pickles, then each storage
      -- the pickles come first: read a prefix of the file, longer until they fit in it
      local len = math.min(size, M.LEGACY_PREFIX)
      while true do
        local all = read_at(fh, path, 0, len)
        local okp, e = pcall(function() obj, data_of = legacy(fh, path, size, all, storages, pick_opts) end)
        if okp then break end
        if len >= size or not tostring(e):find("ends early", 1, true) then error(e, 0) end
        len = math.min(size, len * 8)
      end
    else
      error(fmt("%s: not a torch.save file (neither a zip archive nor a pickle)", path), 0)
    end
    -- every tensor in the object: a view entry named by its position (bounds checked against its storage)
    for k, t in ipairs(M.tensors(obj)) do
      t.where = path
      local el = ELEMENT[t.dtype or ""]
      if el then -- (a dtype zrun has no name for stays unreadable: :get says so)
        local s = t.storage
        local off, len = data_of(s.key)
        local first, reach = t.offset * el + s.view_offset * (ELEMENT[s.dtype or ""] or el), 1
        for d = 1, #t.shape do
          if t.stride[d] < 0 then error(fmt("%s: tensor %s has a negative stride (the file is damaged)", path, P.repr(t)), 0) end
          reach = reach + (t.shape[d] - 1) * t.stride[d]
        end
        if t:numel() > 0 and first + reach * el > len then
          error(fmt("%s: tensor %s reaches past its storage %s (the file is damaged)", path, P.repr(t), s.key), 0)
        end
        local order = not t:is_contiguous() and t:dense_order()
        if t:is_contiguous() or order then
          t.file, t.name = file, tostring(k)
          local shape = t.shape
          if order then -- stored as the dense block; :get permutes it back
            shape, t.perm = {}, {}
            for j, d in ipairs(order) do shape[j] = t.shape[d]; t.perm[d] = j end
          end
          file.entries[#file.entries + 1] = { name = t.name, stored = t.dtype, shape = shape, offset = off + first }
          file.by_name[t.name] = file.entries[#file.entries]
        else -- a strided view: :get gathers its elements
          t.file, t.span = file, { stored = t.dtype, offset = off + first }
        end
      end
    end
    return obj, file
  end)
  fh:close()
  if not ok then
    obj = tostring(obj)
    if obj:sub(1, #path) ~= path then obj = fmt("%s: damaged file (%s)", path, obj) end
    error(obj, 0)
  end
  return obj, file
end

-- Every tensor in v (torch_pickle's values; each once, however often it is referred to), in the
-- order a walk of the tables meets them.
function M.tensors(v)
  local out, seen = {}, {}
  local function walk(x)
    if type(x) ~= "table" or seen[x] then return end
    seen[x] = true
    if P.is_tensor(x) then out[#out + 1] = x; return end
    for k, y in pairs(x) do walk(k); walk(y) end
  end
  walk(v)
  return out
end

-- v (torch_pickle's values) as plain Lua: dicts and lists as tables (None dropped), tensors read
-- into zrun tensors (opts: dtype, device, as Tensor:get; a tensor that cannot be read raises),
-- other objects as {class =, args =, state =}.
function M.to_lua(v, opts, seen)
  if v == P.None then return nil end
  if type(v) ~= "table" then return v end
  seen = seen or {}
  if seen[v] ~= nil then return seen[v] end
  if P.is_tensor(v) then
    local t = v:get(opts)
    seen[v] = t
    return t
  end
  local out = {}
  seen[v] = out
  if P.is_dict(v) then
    for _, k in ipairs(P.keys(v)) do out[k] = M.to_lua(v[k], opts, seen) end
  elseif P.is_object(v) then
    out.class, out.args, out.state = v.class, M.to_lua(v.args, opts, seen), M.to_lua(v.state, opts, seen)
  else
    for i, x in ipairs(v) do out[i] = M.to_lua(x, opts, seen) end
  end
  return out
end

-- torch.load's analogue (zr.torch_load): what a torch.save file holds, as plain Lua with every
-- tensor read now (opts: dtype, device). Nothing the file names is run.
function M.torch_load(path, opts)
  opts = require("zrun.kwargs").check("torch_load", opts, { "dtype", "device" })
  local obj, file = M.load(path)
  local ok, v = pcall(M.to_lua, obj, opts)
  file:close()
  if not ok then error(v, 0) end
  return v
end

-- A torch.save file holding a state dict (name -> tensor), as transformers' pytorch_model.bin:
-- an open handle with the safetensors file's methods (keys, info, get, load_into), named by the
-- state dict's keys. Returns the handle and the names in the file's order.
function M.open_state_dict(path)
  local obj, file = M.load(path)
  if not P.is_dict(obj) then
    error(fmt("%s: holds %s, not a state dict (a dict of tensors)", path, P.repr(obj)), 0)
  end
  local entries, names, other = {}, {}, {}
  local by_name = {}
  for _, e in ipairs(file.entries) do by_name[e.name] = e end
  for _, k in ipairs(P.keys(obj)) do
    local t = obj[k]
    if P.is_tensor(t) then
      local e = t.name and not t.perm and by_name[t.name]
      if not e then
        error(fmt("%s: tensor '%s' (%s) cannot be read: %s", path, k, P.repr(t),
          t:is_contiguous() and ("zrun has no dtype for torch." .. tostring(t.dtype or t.storage.torch_dtype))
          or "it is not contiguous (load the state dict with zr.torch_load, or save it with .contiguous())"), 0)
      end
      entries[#entries + 1] = { name = tostring(k), stored = e.stored, shape = e.shape, offset = e.offset }
      names[#names + 1] = tostring(k)
    else
      other[#other + 1] = tostring(k)
    end
  end
  if #names == 0 and #other > 0 then
    error(fmt("%s: a dict without tensors at its top (keys: %s): not a state dict; a training checkpoint "
      .. "keeps its weights under one of them", path, concat(other, ", ", 1, math.min(#other, 8))), 0)
  end
  return C.safetensors_open_view(path, entries), names
end

return M
