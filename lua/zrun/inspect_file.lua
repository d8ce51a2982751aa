-- `zrun inspect PATH`: what a weight or checkpoint file holds, without Python: a torch.save file
-- (pytorch_model.bin, DeepSpeed's *_states.pt, optimizer.pt, ...) as a tree of its keys with each
-- tensor's dtype and shape, a safetensors file as its tensors and metadata, and a folder (a model,
-- a checkpoint, a checkpoint tag) as each such file in it, one line each.
local P = require "zrun.torch_pickle"
local tf = require "zrun.torch_file"
local zr = require "zrun"
local C = zr._C

local M = {}
local fmt, concat, ipairs, type, tostring = string.format, table.concat, ipairs, type, tostring


local size_str = require("zrun.format").human

local function tensor_str(t)
  local dims = {}
  for i, d in ipairs(t.shape) do dims[i] = tostring(d) end
  local dt = t.dtype and t.dtype:lower() or tostring(t.storage.torch_dtype)
  return fmt("tensor %s [%s]%s", dt, concat(dims, ", "), t:is_contiguous() and "" or " (not contiguous)")
end

-- One line for a value: its kind and, for small ones, the value itself.
local function short(v)
  if v == P.None then return "None" end
  local ty = type(v)
  if ty == "string" then return #v > 60 and fmt("str of %d bytes", #v) or fmt("%q", v) end
  if ty ~= "table" then return tostring(v) end
  if P.is_tensor(v) then return tensor_str(v) end
  if P.is_dict(v) then return fmt("dict of %d", #P.keys(v)) end
  if P.is_object(v) then
    local parts = {}
    if v.args and #v.args > 0 then parts[#parts + 1] = P.repr(v.args) end
    if P.is_dict(v.state) then
      for _, k in ipairs(P.keys(v.state)) do
        local x = v.state[k]
        if type(x) ~= "table" or x == P.None then parts[#parts + 1] = fmt("%s=%s", tostring(k), short(x)) end
        if #parts >= 6 then parts[#parts + 1] = "..."; break end
      end
    end
    return fmt("<%s>%s", v.class, #parts > 0 and " " .. concat(parts, ", ") or "")
  end
  if P.is_list(v) then
    local simple = true
    for _, x in ipairs(v) do if type(x) == "table" and x ~= P.None then simple = false; break end end
    if simple and #v <= 8 then return P.repr(v) end
    return fmt("list of %d", #v)
  end
  return P.repr(v)
end

-- The tree under v, depth levels deep, as lines (indent: the current one).
local function tree(v, depth, indent, out, seen)
  if depth <= 0 or type(v) ~= "table" or seen[v] then return end
  seen[v] = true
  local function item(k, x)
    out[#out + 1] = fmt("%s%s: %s", indent, tostring(k), short(x))
    if type(x) == "table" and not P.is_tensor(x) and x ~= P.None then tree(x, depth - 1, indent .. "  ", out, seen) end
  end
  if P.is_dict(v) then
    local keys = P.keys(v)
    for i, k in ipairs(keys) do
      if i > 40 then out[#out + 1] = fmt("%s... (%d more)", indent, #keys - 40); break end
      item(k, v[k])
    end
  elseif P.is_list(v) then
    local simple = true
    for _, x in ipairs(v) do if type(x) == "table" and x ~= P.None then simple = false; break end end
    if simple and #v <= 8 then return end
    for i, x in ipairs(v) do
      if i > 16 then out[#out + 1] = fmt("%s... (%d more)", indent, #v - 16); break end
      item(i - 1, x)
    end
  elseif P.is_object(v) and P.is_dict(v.state) then -- (its plain fields are on its own line already)
    for _, k in ipairs(P.keys(v.state)) do
      local x = v.state[k]
      if type(x) == "table" and x ~= P.None then item(k, x) end
    end
  end
end

-- How many tensors v holds and their bytes.
local function tensors_of(v)
  local n, bytes = 0, 0
  for _, t in ipairs(tf.tensors(v)) do n, bytes = n + 1, bytes + t:numel() * (tf.ELEMENT[t.dtype or ""] or 0) end
  return n, bytes
end

local function is_safetensors(path)
  local f = io.open(path, "rb")
  if not f then return false end
  local head = f:read(9) or ""
  f:close()
  return #head == 9 and head:sub(9, 9) == "{"
end

-- Lines describing file path; depth: how deep a pickle's tree is shown (0: the summary only).
function M.file_lines(path, depth)
  local out = {}
  if is_safetensors(path) then
    local info, meta = C.safetensors_info(path)
    local names, bytes, dts = {}, 0, {}
    for n, e in pairs(info) do names[#names + 1] = n; bytes = bytes + e.nbytes; dts[e.stored] = (dts[e.stored] or 0) + 1 end
    table.sort(names)
    local dl = {}
    for d, c in pairs(dts) do dl[#dl + 1] = fmt("%d %s", c, d) end
    table.sort(dl)
    out[1] = fmt("%s: safetensors, %d tensors (%s; %s)", path, #names, concat(dl, ", "), size_str(bytes))
    if depth > 0 then
      for i, n in ipairs(names) do
        if i > 40 then out[#out + 1] = fmt("  ... (%d more)", #names - 40); break end
        local e = info[n]
        local dims = {}
        for k, d in ipairs(e.shape) do dims[k] = tostring(d) end
        out[#out + 1] = fmt("  %s: %s [%s]", n, e.stored:lower(), concat(dims, ", "))
      end
      local mk = {}
      for k in pairs(meta or {}) do mk[#mk + 1] = k end
      table.sort(mk)
      for _, k in ipairs(mk) do
        local v = meta[k]
        out[#out + 1] = fmt("  __metadata__ %s: %s", k, #v > 80 and v:sub(1, 77) .. "..." or v)
      end
    end
    return out
  end
  local obj, file = tf.load(path)
  file:close()
  local n, bytes = tensors_of(obj)
  out[1] = fmt("%s: torch.save, %s, %d tensors (%s)", path, short(obj), n, size_str(bytes))
  tree(obj, depth, "  ", out, {})
  return out
end

local WEIGHTS = { "%.safetensors$", "%.bin$", "%.pt$", "%.pth$" }
local function is_weight_file(n)
  for _, p in ipairs(WEIGHTS) do if n:find(p) then return true end end
  return false
end

local USAGE = "usage: zrun inspect PATH [--depth N]   (a .pt/.bin/.pth/.safetensors file, or a folder of them)"

-- zrun inspect PATH [--depth N] (args: a list of strings).
function M.main(args)
  local path, depth = nil, nil
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "-h" or a == "--help" then print(USAGE); return 0 end
    local d = a:match("^%-%-depth=(.*)$")
    if a == "--depth" then d = args[i + 1]; i = i + 1 end
    if d then
      depth = tonumber(d)
      if not depth or depth < 0 then error("inspect: --depth takes a number >= 0, got " .. tostring(d) .. "\n" .. USAGE, 0) end
    elseif a:sub(1, 1) == "-" then error("inspect: unknown option '" .. a .. "'\n" .. USAGE, 0)
    elseif path then error("inspect: one path at a time\n" .. USAGE, 0)
    else path = a end
    i = i + 1
  end
  if not path then error("inspect: expected a file or folder\n" .. USAGE, 0) end
  local kind = C.path_type(path)
  if kind == "file" then
    for _, l in ipairs(M.file_lines(path, depth or 3)) do print(l) end
    return 0
  end
  if kind ~= "dir" then error(fmt("inspect: %s: no such file or folder", path), 0) end
  -- a folder: its weight files (and a tag folder's, one level down), one line each
  local shown = 0
  local function walk(dir, level)
    local names = C.listdir(dir) or {}
    for _, n in ipairs(names) do
      local p = (dir:gsub("/+$", "")) .. "/" .. n
      local t = C.path_type(p)
      if t == "file" and is_weight_file(n) then
        local ok, lines = pcall(M.file_lines, p, depth or 0)
        print(ok and concat(lines, "\n") or ("  " .. tostring(lines)))
        shown = shown + 1
      elseif t == "file" and (n == "latest" or n == "config.json" or n == "trainer_state.json") then
        local f = io.open(p, "rb")
        local s = f and f:read(200) or ""
        if f then f:close() end
        if n == "latest" then print(fmt("%s: %s", p, s:match("^%s*(.-)%s*$"))) else print(p) end
      elseif t == "dir" and level < 1 then
        walk(p, level + 1)
      end
    end
  end
  walk(path, 0)
  if shown == 0 then print(fmt("%s: no .pt, .bin, .pth or .safetensors file here or one folder down", path)) end
  return 0
end

return M
