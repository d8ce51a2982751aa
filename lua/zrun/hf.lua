-- Hugging Face model directories: resolve a model reference (a local directory, a config.json path,
-- or a hub id found in the local cache -- never the network), read config.json, list and load the
-- safetensors weights (single file or sharded with an index) and save a state dict + config in the
-- layout `transformers` loads. Model classes (llama.lua, gpt2.lua) map names; this file does not.
--
--   local hf = require "zrun.hf"
--   local cfg, dir = hf.read_config("meta-llama/Llama-3.2-1B")
--   local sd = hf.load_state_dict(dir, { dtype = "f32" })         -- name -> tensor
--   hf.save_pretrained("out/model", sd, cfg, { max_shard_size = "2GB" })
local C = require "zrun._C"
local cjson = require "cjson"

local hf = {}
local fmt, concat, sort, insert = string.format, table.concat, table.sort, table.insert
local getenv, pairs, ipairs, type, tostring = os.getenv, pairs, ipairs, type, tostring
local floor, huge = math.floor, math.huge

local DTYPE_BYTES = { f32 = 4, bf16 = 2, f16 = 2, f64 = 8, i32 = 4, i64 = 8, u8 = 1 }
local INDEX_NAME, SINGLE_NAME = "model.safetensors.index.json", "model.safetensors"
local PT_INDEX_NAME, PT_SINGLE_NAME = "pytorch_model.bin.index.json", "pytorch_model.bin" -- (torch.save's)
local kw = require "zrun.kwargs"
-- the options each entry point takes (kw.check refuses others, naming the nearest)
local HUB = { "revision", "cache_dir" }
local PRETRAINED = { "dtype", "device", "config", "revision", "cache_dir", "threads" }
local STATE_DICT = { "dtype", "device", "names", "revision", "cache_dir" }

local function join(a, b)
  if a:sub(-1) == "/" then return a .. b end
  return a .. "/" .. b
end
local function basename(p) return (p:gsub("/+$", ""):match("[^/]+$")) or p end
local function dirname(p)
  local d = p:gsub("/+$", ""):match("^(.*)/[^/]*$")
  if d == nil then return "." end
  if d == "" then return "/" end
  return d
end
local function expand(p)
  if p:sub(1, 2) == "~/" or p == "~" then return (getenv("HOME") or "") .. p:sub(2) end
  return p
end
local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  sort(ks, function(a, b) return tostring(a) < tostring(b) end)
  return ks
end
local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

-- JSON null -> nil, recursively (configs say "rope_scaling": null; a lightuserdata would be truthy).
local function strip_nulls(v)
  if type(v) ~= "table" then return v end
  for k, x in pairs(v) do
    if x == cjson.null then v[k] = nil else strip_nulls(x) end
  end
  return v
end
hf.strip_nulls = strip_nulls

-- keep_nulls(v), optional: sees the decoded table before its nulls go (to keep those that mean something)
local function decode_json_file(path, what, keep_nulls)
  local s, err = read_file(path)
  if not s then error(fmt("%s: cannot read %s: %s", path, what, tostring(err)), 0) end
  local ok, v = pcall(cjson.decode, s)
  if not ok then
    error(fmt("%s: invalid JSON%s: %s (a broken download? fetch the file again)", path,
      require("zrun.config_util").json_where(s, v), tostring(v)), 0)
  end
  if type(v) ~= "table" then error(fmt("%s: expected a JSON object, got %s", path, type(v)), 0) end
  if keep_nulls then keep_nulls(v) end
  return strip_nulls(v)
end

-- ---------------------------------------------------------------- JSON writing (config, index)

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    local e = ({ ['"'] = '\\"', ['\\'] = '\\\\', ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t',
                 ['\b'] = '\\b', ['\f'] = '\\f' })[c]
    return e or fmt("\\u%04x", c:byte())
  end) .. '"'
end

-- Non-finite numbers as Python's json writes them (NaN, Infinity, -Infinity: what transformers'
-- trainer_state.json holds for a step whose gradient norm overflowed; cjson reads them back).
local function json_number(x)
  if x ~= x then return "NaN" end
  if x == huge then return "Infinity" end
  if x == -huge then return "-Infinity" end
  if x == floor(x) and math.abs(x) < 2 ^ 53 then return fmt("%d", x) end
  for p = 15, 17 do -- shortest form that reads back exactly
    local s = fmt("%." .. p .. "g", x)
    if tonumber(s) == x then return s end
  end
end

local function is_array(t)
  local n = #t
  if n == 0 then return false end
  local count = 0
  for _ in pairs(t) do count = count + 1 end
  return count == n
end

-- A table with this metatable is a JSON array even when empty ([], where an empty table encodes as {}).
hf.array_mt = {}

-- JSON with sorted keys: pretty with two-space indent (ind, the current indent), like transformers'
-- to_json_string, or on one line (ind nil). Empty tables encode as {} (as [] with hf.array_mt). floats: key names whose
-- whole-number values are written as floats ("1.0"), as Python writes a float field (Lua numbers
-- do not say which they are); a function value decides for each value.
local function encode(v, ind, floats, key, step)
  local tv = type(v)
  if v == nil or v == cjson.null then return "null" end
  if tv == "boolean" then return tostring(v) end
  if tv == "number" then
    local s, f = json_number(v), floats and floats[key]
    if f and (f == true or f(v)) and s:find("^%-?%d+$") then s = s .. ".0" end
    return s
  end
  if tv == "string" then return json_string(v) end
  if tv ~= "table" then error("encode_json: cannot encode a " .. tv, 0) end
  local inner = ind and ind .. (step or "  ")
  local open, sep, close = "", ",", ""
  if ind then open, sep, close = "\n" .. inner, ",\n" .. inner, "\n" .. ind end
  local parts = {}
  if getmetatable(v) == hf.array_mt and #v == 0 then return "[]" end
  if is_array(v) then
    for i = 1, #v do parts[i] = encode(v[i], inner, floats, key, step) end
    return "[" .. open .. concat(parts, sep) .. close .. "]"
  end
  for _, k in ipairs(sorted_keys(v)) do
    parts[#parts + 1] = json_string(tostring(k)) .. (ind and ": " or ":") .. encode(v[k], inner, floats, k, step)
  end
  if #parts == 0 then return "{}" end
  return "{" .. open .. concat(parts, sep) .. close .. "}"
end
-- encode (above) with a trailing newline: how transformers writes its config files. indent: spaces a
-- level (default 2; the Trainer's *_results.json files have 4).
function hf.encode_json(v, floats, indent) return encode(v, "", floats, nil, indent and (" "):rep(indent)) .. "\n" end
-- One line of JSON (a metrics.jsonl record): sorted keys, numbers as encode_json writes them
-- (non-finite ones too, where cjson.encode refuses them).
function hf.encode_json_line(v) return encode(v) end

-- ---------------------------------------------------------------- resolving a model reference

-- The hub cache directory, as huggingface_hub computes it (no network involved).
function hf.cache_dir()
  local v = getenv("HF_HUB_CACHE")
  if v and v ~= "" then return expand(v) end
  v = getenv("HUGGINGFACE_HUB_CACHE") -- older name
  if v and v ~= "" then return expand(v) end
  v = getenv("HF_HOME")
  if v and v ~= "" then return join(expand(v), "hub") end
  v = getenv("XDG_CACHE_HOME")
  if v and v ~= "" then return join(join(expand(v), "huggingface"), "hub") end
  return join(getenv("HOME") or "", ".cache/huggingface/hub")
end

local function looks_like_path(ref)
  return ref:find("^[/.~]") or ref:find("/$") or ref:find("%.json$") or ref:find("%.safetensors$")
    or select(2, ref:gsub("/", "")) > 1
end

-- Resolves ref to a model directory. ref: a directory, a file inside one (config.json,
-- model.safetensors, ...), or a hub id "org/name" looked up in the local cache
-- (models--org--name/refs/<revision> -> snapshots/<hash>). opts: revision (default "main";
-- a 40-hex commit hash is used directly), cache_dir (default hf.cache_dir()).
function hf.resolve(ref, opts)
  opts = kw.check("hf.resolve", opts, HUB)
  if type(ref) ~= "string" or ref == "" then
    error(fmt("hf: expected a model directory, a config.json path or a hub id like 'org/name', got %s",
      type(ref) == "string" and "an empty string" or type(ref)), 0)
  end
  local path = expand(ref)
  local kind = C.path_type(path)
  if kind == "dir" then return (path:gsub("(.)/+$", "%1")) end
  if kind == "file" then return dirname(path) end
  if looks_like_path(ref) then
    error(fmt("no model found at '%s': no such file or directory", ref), 0)
  end
  if not ref:find("^[%w][%w%-%._]*/?[%w%-%._]*$") then
    error(fmt("'%s' is neither a local path nor a hub id like 'org/name'", ref), 0)
  end
  local cache = opts.cache_dir or hf.cache_dir()
  local repo = join(cache, "models--" .. ref:gsub("/", "--"))
  if C.path_type(repo) ~= "dir" then
    error(fmt("no model found for '%s': looked in %s (missing); pass a local directory", ref, repo), 0)
  end
  local rev, snap = opts.revision or "main", nil
  if #rev == 40 and rev:find("^%x+$") then snap = rev
  else
    local s = read_file(join(repo, "refs/" .. rev))
    if s then snap = s:match("^%s*(%x+)%s*$") end
    if not snap then
      local snaps = C.listdir(join(repo, "snapshots")) or {}
      if #snaps == 1 and not s then snap = snaps[1]
      else
        error(fmt("no model found for '%s': %s has %s and %s; pass a local directory or revision=<commit hash>",
          ref, repo, s and ("a malformed refs/" .. rev) or ("no refs/" .. rev),
          #snaps == 0 and "no snapshot" or ("snapshots " .. concat(snaps, ", "))), 0)
      end
    end
  end
  local dir = join(join(repo, "snapshots"), snap)
  if C.path_type(dir) ~= "dir" then
    error(fmt("no model found for '%s': revision %s points at snapshot %s, but %s is missing "
      .. "(incomplete download?); pass a local directory", ref, rev, snap, dir), 0)
  end
  return dir
end

-- Path of `name` inside the model directory, or nil when the file is not there.
function hf.file(dir, name)
  local p = join(dir, name)
  if C.path_type(p) == "file" then return p end
  return nil
end

-- config.json as a Lua table (JSON nulls dropped, but those hf_config.keep_nulls keeps as false), and
-- the resolved directory. transformers 5 names the stored precision "dtype" (4.x: "torch_dtype"); in zrun's config tables `dtype` is the
-- precision to build a model in, so the file's value is returned as torch_dtype (transformers
-- keeps "dtype" when a file has both): metadata, as when transformers builds a model from a config.
function hf.read_config(ref, opts)
  local dir = hf.resolve(ref, kw.check("hf.read_config", opts, HUB))
  local p = join(dir, "config.json")
  if C.path_type(p) ~= "file" then
    error(fmt("%s: missing; a Hugging Face model directory needs a config.json", p), 0)
  end
  -- (a null that is not the field's default, e.g. Mistral's sliding_window: kept as false)
  local cfg = decode_json_file(p, "the model config", require("zrun.models.hf_config").keep_nulls)
  if cfg.dtype ~= nil then cfg.torch_dtype, cfg.dtype = cfg.dtype, nil end
  return cfg, dir
end

-- from_pretrained's config: config.json with opts.config's fields over it (transformers'
-- keyword arguments), to be built in opts.dtype (default "f32") on opts.device (default "cpu").
function hf.pretrained_config(ref, opts)
  opts = kw.check("from_pretrained", opts, PRETRAINED)
  local cfg, dir = hf.read_config(ref, kw.pick(opts, HUB))
  for k, v in pairs(opts.config or {}) do cfg[k] = v end
  local dtype = opts.dtype or "f32"
  if dtype == "auto" then -- transformers' dtype="auto": config.json's dtype, else the first weight's in the files
    dtype = type(cfg.torch_dtype) == "string" and cfg.torch_dtype:gsub("^torch%.", "") or nil
    if not dtype then
      local f = hf.open_weight_file(hf.weight_files(dir)[1])
      local info = f:info()
      f:close()
      local first = next(info) and sorted_keys(info)[1]
      dtype = first and info[first].dtype or "f32"
    end
  end
  if not pcall(C.empty, { 0 }, { dtype = dtype }) then -- (said here, not from inside the first layer built)
    error(fmt("from_pretrained: unknown dtype %s (f32, bf16, f16, f64 or transformers' names: float32, bfloat16, " ..
      "float16, \"auto\")", tostring(dtype)), 0)
  end
  cfg.dtype, cfg.device = dtype, opts.device or "cpu"
  return cfg, dir
end

-- ---------------------------------------------------------------- weights

-- The weight files of a model directory (full paths, in shard order) and, when sharded, the
-- index's weight_map (tensor name -> full path) and the index's path. As transformers looks:
-- model.safetensors's index or file, else pytorch_model.bin's index or file (zrun.torch_file).
function hf.weight_files(dir)
  local idx = join(dir, INDEX_NAME)
  if C.path_type(idx) ~= "file" and C.path_type(join(dir, SINGLE_NAME)) ~= "file"
    and C.path_type(join(dir, PT_INDEX_NAME)) == "file" then
    idx = join(dir, PT_INDEX_NAME)
  end
  if C.path_type(idx) == "file" then
    local index = decode_json_file(idx, "the weight index")
    local wm = index.weight_map
    if type(wm) ~= "table" then error(fmt("%s: has no \"weight_map\" object", idx), 0) end
    local map, counts, files = {}, {}, {}
    for name, file in pairs(wm) do
      if type(file) ~= "string" then
        error(fmt("%s: weight_map entry '%s' must be a file name, got %s", idx, tostring(name), type(file)), 0)
      end
      local p = join(dir, file)
      if not counts[p] then counts[p] = 0; files[#files + 1] = p end
      counts[p] = counts[p] + 1
      map[name] = p
    end
    sort(files)
    for _, p in ipairs(files) do
      if C.path_type(p) ~= "file" then
        error(fmt("%s: lists %s for %d tensors, but that file is missing (incomplete download?)",
          idx, basename(p), counts[p]), 0)
      end
    end
    return files, map, idx
  end
  local single = join(dir, SINGLE_NAME)
  if C.path_type(single) == "file" then return { single }, nil end
  if C.path_type(join(dir, PT_SINGLE_NAME)) == "file" then return { join(dir, PT_SINGLE_NAME) }, nil end
  local found = {}
  for _, n in ipairs(C.listdir(dir) or {}) do
    if n:find("%.safetensors$") or n:find("%.bin$") or n:find("%.pth?$") or n:find("%.gguf$")
      or n:find("%.index%.json$") then
      found[#found + 1] = n
    end
  end
  error(fmt("no weights in %s: looked for %s, %s, %s and %s%s", dir, SINGLE_NAME, INDEX_NAME, PT_SINGLE_NAME,
    PT_INDEX_NAME, #found > 0 and (" (found " .. concat(found, ", ") .. "; zrun reads model.safetensors, "
    .. "pytorch_model.bin or their sharded indexes)")
    or ""), 0)
end

-- An open weight file (the safetensors handle: keys, info, get, load_into): a .safetensors file, or
-- a PyTorch pickle (pytorch_model.bin and its shards) through zrun.torch_file.
function hf.open_weight_file(p)
  if p:find("%.safetensors$") then return C.safetensors_open(p) end
  return (require("zrun.torch_file").open_state_dict(p))
end

-- Loads the model's weights as name -> tensor. ref: anything hf.resolve accepts. opts: dtype
-- (default: as stored), device (default "cpu"), names (a list: load only these), revision,
-- cache_dir. Returns the state dict and the directory.
function hf.load_state_dict(ref, opts)
  opts = kw.check("hf.load_state_dict", opts, STATE_DICT)
  local dir = hf.resolve(ref, kw.pick(opts, HUB))
  local files, map, idx = hf.weight_files(dir)
  local lopt = { dtype = opts.dtype, device = opts.device }
  local want
  if opts.names then
    want = {}
    for _, n in ipairs(opts.names) do want[n] = true end
  end
  local sd = {}
  local by_file = {}
  if map then
    for name, p in pairs(map) do
      if not want or want[name] then
        by_file[p] = by_file[p] or {}
        insert(by_file[p], name)
      end
    end
  end
  for _, p in ipairs(files) do
    local f = hf.open_weight_file(p)
    local names = map and (by_file[p] or {}) or f:keys()
    sort(names)
    for _, name in ipairs(names) do
      if not want or want[name] then
        if map and not f:info(name) then
          f:close()
          error(fmt("%s: says '%s' is in %s, but that file has no such tensor", idx,
            name, basename(p)), 0)
        end
        sd[name] = f:get(name, lopt)
      end
    end
    f:close()
  end
  if want then
    for _, n in ipairs(opts.names) do
      if not sd[n] then error(fmt("%s: no tensor named '%s' in the model's weights", dir, n), 0) end
    end
  end
  return sd, dir
end

-- Reads a model directory's weights into model's parameters in place: each file byte once, on
-- several threads, straight into the parameter's storage (C.safetensors_load_into: on CUDA through
-- pinned staging and stream copies, a dtype different from the file's converted on the device).
-- Keys and shapes are checked first, with load_state_dict's errors, so nothing is read when they
-- do not match. opts: rename(name) -> the model's key for a file tensor, or nil to skip it
-- (default: the name itself); threads (default min(8, CPUs)). Returns the directory.
function hf.load_weights(model, ref, opts)
  opts = kw.check("hf.load_weights", opts, { "rename", "threads", "revision", "cache_dir" })
  local dir = hf.resolve(ref, kw.pick(opts, HUB))
  local files, map, idx = hf.weight_files(dir)
  local rename = opts.rename or function(name) return name end
  local by_file = {}
  if map then
    for name, p in pairs(map) do
      by_file[p] = by_file[p] or {}
      insert(by_file[p], name)
    end
  end
  local handles, desc = {}, {}
  local ok, err = pcall(function()
    for _, p in ipairs(files) do
      local f = hf.open_weight_file(p)
      handles[#handles + 1] = f
      local info = f:info()
      local names = by_file[p] or (not map and sorted_keys(info)) or {}
      for _, name in ipairs(names) do
        if not info[name] then
          error(fmt("%s: says '%s' is in %s, but that file has no such tensor", idx,
            name, basename(p)), 0)
        end
        local key = rename(name)
        if key then desc[key] = { shape = info[name].shape, file = f, name = name } end
      end
    end
    local todo = model:match_state_dict(desc, true, true, 0)
    local items = {}
    for i, m in ipairs(todo) do items[i] = { m[2].file, m[2].name, m[1] } end
    C.safetensors_load_into(items, opts.threads)
  end)
  for _, f in ipairs(handles) do f:close() end
  if not ok then error(err, 0) end
  return dir
end

-- Model directory in one call: config, state dict, directory.
function hf.load_pretrained(ref, opts)
  kw.check("hf.load_pretrained", opts, STATE_DICT)
  local cfg, dir = hf.read_config(ref, kw.pick(opts, HUB))
  local sd = hf.load_state_dict(dir, opts)
  return cfg, sd, dir
end

-- "5GB" -> 5e9, "2GiB" -> 2^31, "500MB", "10KB", "123" or a number -> bytes (huggingface_hub's rule).
function hf.parse_size(s)
  if type(s) == "number" then return s end
  local num, unit = tostring(s):upper():match("^%s*([%d%.]+)%s*(%a*)%s*$")
  local mult = ({ [""] = 1, B = 1, KB = 1e3, MB = 1e6, GB = 1e9, TB = 1e12,
                  KIB = 2 ^ 10, MIB = 2 ^ 20, GIB = 2 ^ 30, TIB = 2 ^ 40 })[unit or "?"]
  if not num or not tonumber(num) or not mult then
    error(fmt("max_shard_size: cannot read '%s' (use bytes or a size like \"5GB\", \"500MB\", \"2GiB\")", tostring(s)), 0)
  end
  return floor(tonumber(num) * mult)
end

local function tensor_bytes(t) return t:numel() * (DTYPE_BYTES[t:dtype()] or 4) end

-- Removes earlier weight files that the new save does not overwrite, so a stale index or shard
-- can never shadow the new weights (transformers prefers model.safetensors when both exist).
-- Removes dir's weight files (model.safetensors, its shards and index) not named in keep (a set): a
-- directory written again must not mix an old layout with the new one.
function hf.remove_stale_weights(dir, keep)
  for _, n in ipairs(C.listdir(dir) or {}) do
    if (n == SINGLE_NAME or n == INDEX_NAME or n:find("^model%-%d+%-of%-%d+%.safetensors$")) and not keep[n] then
      os.remove(join(dir, n))
    end
  end
end

-- Saves name -> tensor into dir as model.safetensors, or as model-0000k-of-0000n.safetensors plus
-- model.safetensors.index.json when the tensors add up to more than max_shard_size (default
-- "50GB", transformers 5's). Tensors are assigned to shards greedily in name order; one bigger than the limit gets a
-- shard of its own. opts.metadata defaults to {format="pt"}, which transformers requires.
-- Returns the list of files written (names relative to dir).
-- Shards of items ({name=, bytes=}, in their order) as huggingface_hub cuts them: a new shard when the next
-- item would pass max bytes (one bigger than max gets a shard of its own). Returns the shards (lists of
-- items) and their file names: model.safetensors alone, else model-0000k-of-0000n.safetensors.
function hf.plan_shards(items, max)
  local shards, size = { {} }, 0
  for _, it in ipairs(items) do
    if #shards[#shards] > 0 and size + it.bytes > max then shards[#shards + 1], size = {}, 0 end
    table.insert(shards[#shards], it)
    size = size + it.bytes
  end
  local names = {}
  for k = 1, #shards do names[k] = #shards == 1 and SINGLE_NAME or fmt("model-%05d-of-%05d.safetensors", k, #shards) end
  return shards, names
end

-- Writes dir/model.safetensors.index.json (weight_map: tensor name -> shard file; metadata.total_size in bytes,
-- and metadata.total_parameters where given, as transformers 5's save_pretrained writes; DeepSpeed's zero_to_fp32
-- writes total_size alone), last after its shards: a crash before it leaves no index pointing at missing shards.
function hf.write_index(dir, weight_map, total, nparams)
  local meta = { total_size = total, total_parameters = nparams }
  C.write_file_atomic(join(dir, INDEX_NAME), hf.encode_json({ metadata = meta, weight_map = weight_map }))
  return INDEX_NAME
end

function hf.save_state_dict(dir, sd, opts)
  opts = kw.check("save_pretrained", opts, { "max_shard_size", "metadata", "safe_serialization" })
  if opts.safe_serialization == false then
    error("save_pretrained: safe_serialization = false (pickle files): zrun writes safetensors only", 0)
  end
  local max = hf.parse_size(opts.max_shard_size or "50GB")
  local meta = opts.metadata or { format = "pt" }
  if type(dir) ~= "string" or dir == "" then error("save_pretrained(dir): dir must be a folder path, got " .. tostring(dir), 0) end
  C.makedirs(dir)
  local items, total, nparams = {}, 0, 0
  for _, name in ipairs(sorted_keys(sd)) do
    local t = sd[name]
    if not C.is_tensor(t) then
      error(fmt("save_state_dict: '%s' is a %s, expected a tensor", tostring(name), type(t)), 0)
    end
    items[#items + 1] = { name = name, bytes = tensor_bytes(t) }
    total, nparams = total + items[#items].bytes, nparams + t:numel()
  end
  local shards, written = hf.plan_shards(items, max)
  local wm = {}
  for k, shard in ipairs(shards) do
    local tensors = {}
    for _, it in ipairs(shard) do tensors[it.name], wm[it.name] = sd[it.name], written[k] end
    C.save_safetensors(join(dir, written[k]), tensors, meta)
  end
  if #shards > 1 then written[#written + 1] = hf.write_index(dir, wm, total, nparams) end
  local keep = {}
  for _, n in ipairs(written) do keep[n] = true end
  hf.remove_stale_weights(dir, keep)
  return written
end

-- Writes config.json (sorted keys, two-space indent) atomically, in the layout transformers 5
-- writes (zrun.models.hf_config.to_hf: rope_parameters and "dtype", plus the legacy rope_theta,
-- rope_scaling and torch_dtype that older readers need; zrun's own dtype/device left out).
function hf.save_config(dir, config)
  C.makedirs(dir)
  local hc = require "zrun.models.hf_config"
  C.write_file_atomic(join(dir, "config.json"), hf.encode_json(hc.to_hf(config), hc.FLOAT_FIELDS))
end

-- A model directory's generation_config.json as a table (JSON nulls dropped), or nil when it has none: what
-- transformers' from_pretrained reads into model.generation_config (do_sample, temperature, max_length, eos ids...).
function hf.read_generation_config(dir)
  local p = join(dir, "generation_config.json")
  if C.path_type(p) ~= "file" then return nil end
  return decode_json_file(p, "the generation config")
end

-- A from_pretrained's load_weights error err, raised again: torch's two-line "Error(s) in loading state_dict"
-- (the weights do not fit the config's model) on one line saying what to use instead; any other as it is.
-- family: the model type that names the message ("llama", "gpt2", ...).
function hf.raise_load_error(family, dir, err)
  err = tostring(err)
  if err:find("Error(s) in loading state_dict", 1, true) then
    error(fmt("%s: %s: the weights do not fit config.json's model: %s (a checkpoint of another model, or an " ..
      "incomplete one: use the folder's own files)", family, dir, (err:gsub("\n\t", " "))), 0)
  end
  error(err, 0)
end

-- What a model loaded by from_pretrained(ref) from dir keeps of its source, as transformers' does:
-- model.name_or_path (ref, what PEFT writes as adapter_config.json's base_model_name_or_path) and
-- model.generation_config (dir's generation_config.json, which save_pretrained writes back).
function hf.keep_source(model, ref, dir)
  if type(ref) == "string" then rawset(model, "name_or_path", ref) end
  rawset(model, "generation_config", hf.read_generation_config(dir))
end

-- GenerationConfig's float fields (written "1.0", as Python writes them).
local GEN_FLOATS = { temperature = true, top_p = true, min_p = true, typical_p = true, top_h = true, repetition_penalty = true,
  encoder_repetition_penalty = true, length_penalty = true, diversity_penalty = true, epsilon_cutoff = true,
  eta_cutoff = true, guidance_scale = true }
-- Writes dir/generation_config.json, as transformers' save_pretrained does beside a causal LM: gen (the table
-- from_pretrained read, kept as the model's generation_config), else GenerationConfig.from_model_config's
-- (the config's bos / eos / pad token ids). Returns the file's name.
function hf.save_generation_config(dir, gen, config)
  if type(gen) ~= "table" then
    config = config or {}
    gen = { _from_model_config = true, bos_token_id = config.bos_token_id, eos_token_id = config.eos_token_id,
      pad_token_id = config.pad_token_id }
  end
  C.makedirs(dir)
  C.write_file_atomic(join(dir, "generation_config.json"), hf.encode_json(gen, GEN_FLOATS))
  return "generation_config.json"
end

-- A directory transformers' from_pretrained loads: weights plus config.json.
function hf.save_pretrained(dir, sd, config, opts)
  local files = hf.save_state_dict(dir, sd, opts)
  if config then
    hf.save_config(dir, config)
    files[#files + 1] = "config.json"
  end
  return files
end

return hf
