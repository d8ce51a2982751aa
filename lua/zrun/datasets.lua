-- Text datasets with Hugging Face `datasets` row semantics: one row per line (empty rows kept),
-- split slicing ("train[:2000]", "train[10%:20%]"), map/filter/select, group_texts, a causal-LM
-- collator and a rank-sharded sampler. Rows are Lua tables ({text = ...}, {input_ids = {...}}).
local C = require "zrun._C"
local kw = require "zrun.kwargs"
local M = {}
local floor, ceil = math.floor, math.ceil

local Dataset = {}
M.Dataset = Dataset
local column_set

-- A Dataset's rows are its own array part, so #ds is the number of rows and ds[i] row i (HF's
-- len(ds), ds[i]) natively: LuaJIT ignores __len on tables. ds.rows is the dataset itself (older code).
local function adopt(rows)
  rows.rows = rows
  return setmetatable(rows, Dataset)
end
-- Whether ds is several datasets by name ({name = dataset}, transformers' dict of eval datasets) rather
-- than one dataset or a list of rows.
function M.is_named(ds) return type(ds) == "table" and not ds.rows and ds[1] == nil and next(ds) ~= nil end

-- A dataset of a list of rows (copied: the list stays the caller's).
function Dataset.from_rows(rows)
  if type(rows) ~= "table" then error("Dataset.from_rows(rows): rows must be a list of rows (tables), got " .. type(rows), 2) end
  local t = {}
  for i = 1, #rows do t[i] = rows[i] end
  return adopt(t)
end
function Dataset:__len() return #self end
-- The number of rows (also #ds).
function Dataset:len() return #self end
-- Row i (also ds[i] and ds(i)).
function Dataset:get(i) return self[i] end
Dataset.__call = Dataset.get

-- The names of the fields any row holds (HF's columns: a JSON row without a field has it as None).
column_set = function(ds)
  local set = {}
  for _, r in ipairs(ds) do for k in pairs(r) do set[k] = true end end
  return set
end
-- HF's ds.column_names and ds.num_rows (sorted: a row is a Lua table, its fields have no order).
local PROPERTIES = {
  column_names = function(ds)
    local names = {}
    for k in pairs(column_set(ds)) do names[#names + 1] = tostring(k) end
    table.sort(names)
    return names
  end,
  num_rows = function(ds) return #ds end,
}
function Dataset.__index(ds, k)
  local m = Dataset[k]
  if m == nil and PROPERTIES[k] then return PROPERTIES[k](ds) end
  return m
end

-- HF's repr: Dataset({ features: ['text'], num_rows: 3 }) (column_names).
function Dataset:__tostring()
  local cols = {}
  for i, k in ipairs(self.column_names) do cols[i] = "'" .. k .. "'" end
  return ("Dataset({\n    features: [%s],\n    num_rows: %d\n})"):format(table.concat(cols, ", "), #self)
end

-- The order of n rows: with a seed, HF's (numpy.random.default_rng(seed).permutation(n), the rows
-- Hugging Face datasets' shuffle(seed=) and train_test_split(seed=) pick); without one, drawn from
-- zrun's global generator (zr.manual_seed makes it repeatable; HF draws from numpy's global state).
local function permutation(n, seed)
  if seed ~= nil then return C.randperm_numpy(n, seed):flat_table() end
  return C.randperm(n):flat_table()
end

-- A new dataset with the rows in a random order: with a seed, the order HF's ds.shuffle(seed=...)
-- gives (numpy's default_rng(seed).permutation). No seed: drawn from the global generator, so
-- zr.manual_seed (the Trainer's args.seed) makes it repeatable. ds:shuffle(42) or ds:shuffle{ seed = 42 }.
function Dataset:shuffle(seed)
  if type(seed) == "table" then seed = seed.seed end
  if seed ~= nil and (type(seed) ~= "number" or seed ~= math.floor(seed) or seed < 0) then
    error("Dataset:shuffle(seed): seed must be a non-negative integer, got " .. tostring(seed), 2)
  end
  local out = {}
  if #self > 0 then
    for i, k in ipairs(permutation(#self, seed)) do out[i] = self[k] end
  end
  return adopt(out)
end

-- HF's train_test_split: { train = Dataset, test = Dataset }. test_size / train_size: a fraction in
-- (0, 1) (test rounds up, train down) or a number of rows; neither: test_size = 0.25; one: the other
-- is the rest. shuffle (default true): the test rows are the first n_test of the permutation shuffle(seed)
-- takes (HF's: with a seed, the same rows in the same order), the train rows the next n_train; without it,
-- train comes first.
-- ds:train_test_split{ test_size = 0.1, seed = 42 } or ds:train_test_split(0.1).
function Dataset:train_test_split(o)
  if type(o) == "number" then o = { test_size = o } end
  o = o or {}
  for k in pairs(o) do
    if not ({ test_size = true, train_size = true, shuffle = true, seed = true })[k] then
      error(("train_test_split: unknown option '%s' (test_size, train_size, shuffle, seed)"):format(tostring(k)), 2)
    end
  end
  local n = #self
  local function count(v, name, up)
    if v == nil then return nil end
    if type(v) ~= "number" or v <= 0 or (v >= 1 and v ~= math.floor(v)) then
      error(("train_test_split: %s must be a fraction in (0, 1) or a positive whole number of rows, got %s")
        :format(name, tostring(v)), 3)
    end
    if v < 1 then return up and math.ceil(v * n) or math.floor(v * n) end
    if v >= n then
      error(("train_test_split: %s=%d must be smaller than the number of rows (%d)"):format(name, v, n), 3)
    end
    return v
  end
  local n_test, n_train = count(o.test_size, "test_size", true), count(o.train_size, "train_size", false)
  if not n_test and not n_train then n_test = math.ceil(0.25 * n) end
  n_test = n_test or n - n_train
  n_train = n_train or n - n_test
  if n_train + n_test > n then
    error(("train_test_split: train_size (%d rows) + test_size (%d rows) is more than the %d rows"):format(
      n_train, n_test, n), 2)
  end
  if n_train == 0 or n_test == 0 then
    error(("train_test_split: with %d rows, test_size=%s and train_size=%s leave one split empty; adjust them")
      :format(n, tostring(o.test_size), tostring(o.train_size)), 2)
  end
  local order = {}
  if o.shuffle ~= false then order = permutation(n, o.seed)
  else for i = 1, n do order[i] = i end end
  local train, test = {}, {}
  local test_first = o.shuffle ~= false
  local t0 = test_first and 0 or n_train
  local r0 = test_first and n_test or 0
  for i = 1, n_test do test[i] = self[order[t0 + i]] end
  for i = 1, n_train do train[i] = self[order[r0 + i]] end
  return { train = adopt(train), test = adopt(test) }
end

-- The input row's columns that map keeps: all of them (the default, HF's; keep = true or remove_columns =
-- false say it too), or all but a list (remove_columns = {names} or ds.column_names for none, HF's: removed
-- before fn's columns are added, so fn may set them again). Returns the set of removed names.
local function removed_columns(opts, ds)
  local rc = opts.remove_columns
  if rc == nil or rc == false then return {} end
  if opts.keep then error("Dataset:map: keep = true and remove_columns contradict each other; pass one", 0) end
  if type(rc) == "string" then rc = { rc } end
  if type(rc) ~= "table" then error("Dataset:map: remove_columns must be a column name, a list of them, or false", 0) end
  local set, have = {}, nil
  for _, c in ipairs(rc) do
    have = have or column_set(ds)
    if #ds > 0 and not have[c] then
      error(("Dataset:map: column to remove '%s' is not in the dataset (its columns: %s)"):format(tostring(c),
        table.concat(ds.column_names, ", ")), 0)
    end
    set[c] = true
  end
  return set
end
local function merge(r, nr, removed)
  local m = {}
  for k, v in pairs(r) do if not removed[k] then m[k] = v end end
  for k, v in pairs(nr) do m[k] = v end
  return m
end

-- The rows a batch of map / filter holds: batch_size (default 1000); false, 0 or less: every row in one
-- batch (HF's batch_size=None or <= 0).
local function batch_rows(who, bs, n)
  if bs == nil then return 1000 end
  if bs ~= false and (type(bs) ~= "number" or bs % 1 ~= 0) then
    error(("%s: batch_size must be an integer (false or <= 0: every row in one batch), got %s"):format(who, tostring(bs)), 0)
  end
  if bs == false or bs <= 0 then return math.max(n, 1) end
  return bs
end

-- rows[s .. s + bs - 1] (fewer at the end): the batch a batched map or filter passes.
local function slice(rows, s, bs)
  local batch = {}
  for i = s, math.min(s + bs - 1, #rows) do batch[#batch + 1] = rows[i] end
  return batch
end

-- Applies fn(row, index) -> new row, as HF's map: fn's columns are added to the row's (the default);
-- remove_columns = {names} (ds.column_names: all) drops those first. batched=true passes lists of rows
-- (batch_size, default 1000; false or <= 0: all rows in one batch) and fn returns a list of rows of any
-- length (so it can split or join rows, like group_texts) when every input column is removed, else one
-- row back for each. fn returning nothing (nil) leaves the row (the batch) as it is, less remove_columns.
function Dataset:map(fn, opts)
  opts = kw.check("Dataset:map", opts, { "batched", "batch_size", "remove_columns", "keep", "desc" })
  local removed = removed_columns(opts, self)
  local out = {}
  if opts.batched then
    local bs = batch_rows("Dataset:map", opts.batch_size, #self.rows)
    for s = 1, #self.rows, bs do
      local batch = slice(self.rows, s, bs)
      local res = fn(batch, s)
      if res == nil then -- (HF: a function that returns nothing leaves the rows as they are)
        res = {}
        for j = 1, #batch do res[j] = {} end
      end
      local keeps = false
      for _, r in ipairs(batch) do for k in pairs(r) do keeps = keeps or not removed[k] end end
      if keeps and #res ~= #batch then
        error(("Dataset:map: the batched function returned %d rows for %d and the input's columns are kept (HF's " ..
          "default); to change the number of rows remove them all: remove_columns = ds.column_names"):format(#res, #batch), 0)
      end
      for j, r in ipairs(res) do out[#out + 1] = keeps and merge(batch[j], r, removed) or r end
    end
  else
    for i, r in ipairs(self.rows) do
      local nr = fn(r, i)
      out[i] = merge(r, nr or {}, removed) -- (HF: returning nothing leaves the row as it is)
    end
  end
  return adopt(out)
end

-- A new dataset of the rows for which fn(row, i) is true, in order (HF's Dataset.filter). batched=true
-- passes lists of rows (batch_size, default 1000; false or <= 0: all rows in one batch) and the index of the
-- first; fn returns one boolean a row.
function Dataset:filter(fn, opts)
  if type(fn) ~= "function" then error("Dataset:filter(fn [, opts]): fn must be a function(row) returning true to keep it, got " .. type(fn), 2) end
  opts = kw.check("Dataset:filter", opts, { "batched", "batch_size" })
  local out = {}
  if opts.batched then
    local bs = batch_rows("Dataset:filter", opts.batch_size, #self.rows)
    for s = 1, #self.rows, bs do
      local batch = slice(self.rows, s, bs)
      local keep = fn(batch, s)
      if type(keep) ~= "table" or #keep ~= #batch then
        error(("Dataset:filter: the batched function must return a list of %d booleans (one a row), got %s"):format(
          #batch, type(keep) == "table" and (#keep .. " values") or type(keep)), 2)
      end
      for j, r in ipairs(batch) do if keep[j] then out[#out + 1] = r end end
    end
  else
    for i, r in ipairs(self.rows) do if fn(r, i) then out[#out + 1] = r end end
  end
  return adopt(out)
end

-- Rows first..last (1-based, inclusive), or the rows at a list of indices in its order, repeats kept (HF's
-- ds.select(indices), 1-based: ds:select{ 4, 2, 2 }).
function Dataset:select(first, last)
  local out = {}
  if type(first) == "table" and last == nil then
    for k, i in ipairs(first) do
      if type(i) ~= "number" or i % 1 ~= 0 or i < 1 or i > #self.rows then
        error(("Dataset:select: index %s out of range for dataset of size %d (indices are 1-based)"):format(tostring(i), #self.rows), 2)
      end
      out[k] = self.rows[i]
    end
    return adopt(out)
  end
  if type(first) ~= "number" or type(last) ~= "number" then
    error("Dataset:select(first, last) takes two row numbers, or select{indices} a list of them", 2)
  end
  for i = first, math.min(last, #self.rows) do out[#out + 1] = self.rows[i] end
  return adopt(out)
end

-- The names as a list (one name or a list of them), each checked against the dataset's columns (HF's error).
local function existing_columns(ds, names, who)
  if type(names) == "string" then names = { names } end
  if type(names) ~= "table" then error(("Dataset:%s: expected a column name or a list of them"):format(who), 3) end
  local have = column_set(ds)
  for _, c in ipairs(names) do
    if not have[c] then
      error(("Dataset:%s: column '%s' is not in the dataset; its columns: %s"):format(who, tostring(c),
        table.concat(ds.column_names, ", ")), 3)
    end
  end
  return names
end
-- A new dataset of each row's copy less the fields in `drop` (a set), renamed by `rename` ({old = new}).
local function reshape(ds, drop, rename)
  local out = {}
  for i, r in ipairs(ds) do
    local m = {}
    for k, v in pairs(r) do if not drop[k] then m[rename[k] or k] = v end end
    out[i] = m
  end
  return adopt(out)
end

-- HF's remove_columns: the rows without these columns (a name or a list).
function Dataset:remove_columns(names)
  local drop = {}
  for _, c in ipairs(existing_columns(self, names, "remove_columns")) do drop[c] = true end
  return reshape(self, drop, {})
end
-- HF's select_columns: the rows with only these columns (a name or a list).
function Dataset:select_columns(names)
  local keep, drop = {}, {}
  for _, c in ipairs(existing_columns(self, names, "select_columns")) do keep[c] = true end
  for c in pairs(column_set(self)) do if not keep[c] then drop[c] = true end end
  return reshape(self, drop, {})
end
-- HF's rename_columns({old = new}): the new names must not be columns already (except a renamed one).
function Dataset:rename_columns(map)
  if type(map) ~= "table" then error("Dataset:rename_columns: expected {old_name = new_name}", 2) end
  local old, after = {}, column_set(self)
  for k, v in pairs(map) do
    old[#old + 1] = k
    if type(v) ~= "string" then error(("Dataset:rename_columns: the new name of '%s' must be a string"):format(tostring(k)), 2) end
  end
  existing_columns(self, old, "rename_columns")
  for k in pairs(map) do after[k] = nil end
  for k, v in pairs(map) do
    if after[v] then
      error(("Dataset:rename_columns: new column name '%s' is already in the dataset; its columns: %s"):format(v,
        table.concat(self.column_names, ", ")), 2)
    end
    after[v] = true
  end
  return reshape(self, {}, map)
end
-- HF's rename_column(old, new).
function Dataset:rename_column(old, new) return self:rename_columns { [old] = new } end
-- HF's add_column(name, values): values[i] becomes row i's field (one value a row).
function Dataset:add_column(name, values)
  if type(values) ~= "table" or #values ~= #self then
    error(("Dataset:add_column: '%s' needs one value for each of the %d rows, got %s"):format(tostring(name), #self,
      type(values) == "table" and #values or type(values)), 2)
  end
  if column_set(self)[name] then error(("Dataset:add_column: column '%s' is already in the dataset"):format(tostring(name)), 2) end
  local out = reshape(self, {}, {})
  for i, r in ipairs(out) do r[name] = values[i] end
  return out
end
-- HF's to_list: the rows as a plain list (the rows themselves, not copies).
function Dataset:to_list()
  local out = {}
  for i, r in ipairs(self) do out[i] = r end
  return out
end

-- HF's concatenate_datasets: the rows of each dataset (or list of rows) in turn.
function M.concatenate_datasets(list)
  if type(list) ~= "table" then error("concatenate_datasets: expected a list of datasets", 2) end
  local out = {}
  for _, d in ipairs(list) do for _, r in ipairs(d) do out[#out + 1] = r end end
  return adopt(out)
end

-- Hugging Face run_clm's group_texts as its `map(group_texts, batched=True)` runs it: each batch of
-- batch_size rows (default 1000, datasets' map; false: all rows as one batch) has its token lists
-- concatenated and cut into blocks of block_size, the batch's tail shorter than a block dropped.
-- labels = input_ids.
function Dataset:group_texts(block_size, column, batch_size)
  if type(block_size) ~= "number" or block_size < 1 or block_size % 1 ~= 0 then
    error("group_texts(block_size [, column [, batch_size]]): block_size must be a positive integer (tokens a block), got " ..
      tostring(block_size), 2)
  end
  column = column or "input_ids"
  if batch_size == nil then batch_size = 1000 end
  if batch_size ~= false and (type(batch_size) ~= "number" or batch_size < 1 or batch_size % 1 ~= 0) then
    error("group_texts: batch_size must be a positive integer or false (all rows as one batch), got " ..
      tostring(batch_size), 2)
  end
  local rows = self.rows
  local step = batch_size or math.max(#rows, 1)
  local out = {}
  for first = 1, #rows, step do
    local buf, n = {}, 0
    for k = first, math.min(first + step - 1, #rows) do
      for _, id in ipairs(rows[k][column]) do
        n = n + 1
        buf[n] = id
        if n == block_size then
          local labels = {}
          for i = 1, n do labels[i] = buf[i] end
          out[#out + 1] = { input_ids = buf, labels = labels }
          buf, n = {}, 0
        end
      end
    end
  end
  return adopt(out)
end

-- A map that takes a while shows its progress (zrun.progress, after half a second; opts.desc names
-- it, default "Map"): tokenizing a corpus is the long loop before training starts.
do
  local plain_map = Dataset.map
  function Dataset:map(fn, opts)
    if type(fn) ~= "function" then error("Dataset:map(fn [, opts]): fn must be a function(row), got " .. type(fn), 2) end
    local bar = require("zrun.progress").new { total = #self.rows, desc = opts and opts.desc or "Map", unit = "rows",
      delay = 0.5 }
    local batched = opts and opts.batched
    return bar:run(plain_map, self, function(r, i)
      local v = fn(r, i)
      bar:update(batched and #r or 1)
      return v
    end, opts)
  end
end

-- "train[:2000]" -> "train", first, last over n rows (HF semantics: python-style half-open
-- ranges, negatives from the end, whole percentages within -100%..100% rounded to the closest row, a
-- half to the even one as Python's round()). One part of a split: load_dataset joins "a+b".
function M.parse_split(spec, n)
  local name, range = spec:match("^([%w_%-%.]+)%[(.*)%]$")
  if not name then
    if not spec:match("^[%w_%-%.]+$") then
      error(("split '%s': expected a name or name[start:end], e.g. train, train[:2000], train[10%%:20%%] or " ..
        "train+validation"):format(spec), 0)
    end
    return spec, 1, n
  end
  local a, b = range:match("^%s*([^:]*)%s*:%s*([^:]*)%s*$")
  if not a then error(("split '%s': expected name[start:end], e.g. train[:2000] or train[10%%:20%%]"):format(spec), 0) end
  local function bound(s, default)
    if s == "" then return default end
    local pct = s:match("^(%-?%d+)%%$")
    local v
    if pct then
      v = tonumber(pct) -- (HF: "Percent slice boundaries must be > -100 and < 100", 100 itself allowed)
      if math.abs(v) > 100 then error(("split '%s': a percentage must be within -100%% and 100%%, got %s"):format(spec, s), 0) end
      v = v * n / 100 -- (rounded as Python's round(): a half to the even row, 4.5 -> 4, 1.5 -> 2)
      local r = math.floor(v + 0.5)
      if r - v == 0.5 and r % 2 ~= 0 then r = r - 1 end
      v = r
    else
      v = s:match("^%-?%d+$") and tonumber(s)
      if not v then error(("split '%s': '%s' is not an integer or a whole percentage"):format(spec, s), 0) end
    end
    if v < 0 then v = n + v end
    return math.max(0, math.min(n, v))
  end
  local s, e = bound(a, 0), bound(b, n)
  return name, s + 1, e
end

local split_files = {
  train = { "wiki.train.raw", "train.txt", "train.jsonl" },
  validation = { "wiki.valid.raw", "valid.txt", "validation.txt", "validation.jsonl", "valid.jsonl" },
  test = { "wiki.test.raw", "test.txt", "test.jsonl" },
}

local function exists(p) local f = io.open(p, "rb"); if f then f:close(); return true end return false end
local function is_dir(p) return exists(p .. "/.") end

-- A dataset file's bytes, or one line saying why not.
local function read_all(path)
  local f, err = io.open(path, "rb")
  if not f then error(("cannot read dataset file %s: %s"):format(path, err), 0) end
  local data = f:read("*a")
  f:close()
  return data
end

-- Reads lines like HF's text/wikitext builders: each line keeps its "\n"; blank lines become "". The file
-- is read as Python's open() in text mode reads it: universal newlines, "\r\n" and a lone "\r" end a line as "\n".
local function read_lines(path, blank_as_empty)
  local data = read_all(path)
  if data:find("\r", 1, true) then data = data:gsub("\r\n?", "\n") end
  local rows, pos = {}, 1
  while pos <= #data do
    local nl = data:find("\n", pos, true)
    local line = nl and data:sub(pos, nl) or data:sub(pos)
    pos = (nl or #data) + 1
    if blank_as_empty and not line:find("%S") then line = "" end
    rows[#rows + 1] = { text = line }
  end
  return rows
end

-- The fields of the chat / instruction formats (zrun.sft, TRL's dataset types): a row holding one of
-- them needs no text field.
local SFT_FIELDS = { "messages", "prompt", "completion", "conversations", "input_ids" }

-- A row read from JSON: an object holding the text field (or a chat / instruction format's fields
-- unless the text field was named); where: "path:line" or "path: row i" for the errors.
local function check_row(where, obj, field, explicit)
  if type(obj) ~= "table" or (next(obj) ~= nil and obj[1] ~= nil) then error(("%s: a row must be a JSON object"):format(where), 0) end
  local sft = false
  if not explicit then for _, k in ipairs(SFT_FIELDS) do sft = sft or obj[k] ~= nil end end
  if field and not sft and obj[field] == nil then
    error(("%s: no field '%s' in this row (rows hold text_field or a chat / instruction format's fields: %s)")
      :format(where, field, table.concat(SFT_FIELDS, ", ")), 0)
  end
  return obj
end

-- JSON text as Python's json.loads reads it for a chat template: objects keep their key order and an
-- empty object stays a mapping (zrun.jinja.json_decode; cjson.decode sorts a tool schema's keys and
-- turns "properties": {} into []). cjson reads ~4x faster, and for rows of plain messages (role and
-- content: read by key, never printed whole) it gives the template the same text, so it reads every
-- row first; the rows with tools, an empty table, or an object below a message's fields (tool calls,
-- content parts, tool arguments) are read again in order. rows(v): the rows in the decoded value.
local function order_matters(v, depth)
  for _, x in pairs(v) do
    if type(x) == "table" and (next(x) == nil or (depth >= 3 and x[1] == nil) or order_matters(x, depth + 1)) then
      return true
    end
  end
  return false
end

local function json_rows(text, rows)
  local ok, v = pcall(require("cjson").decode, text)
  if not ok then return ok, v end
  local list = rows(v)
  if type(list) == "table" then
    for _, row in ipairs(list) do
      if type(row) == "table" and (row.tools ~= nil or order_matters(row, 1)) then
        local ok2, v2 = pcall(require("zrun.jinja").json_decode, text)
        if ok2 then return ok2, v2 end
        return ok, v -- (what only cjson reads: NaN, Infinity)
      end
    end
  end
  return ok, v
end
local function one_row(v) return { v } end

local function read_jsonl(path, field, explicit)
  local rows, ln = {}, 0
  for line in io.lines(path) do
    ln = ln + 1
    if line:find("%S") then
      local ok, obj = json_rows(line, one_row)
      if not ok then error(("%s:%d: invalid JSON: %s"):format(path, ln, obj), 0) end
      rows[#rows + 1] = check_row(("%s:%d"):format(path, ln), obj, field, explicit)
    end
  end
  return rows
end

-- A .json file as HF's json builder reads it: a list of row objects, the list under `key` of one object
-- (load_dataset's field), or JSON Lines.
local function read_json(path, field, explicit, key)
  local data = read_all(path)
  local first = data:match("^%s*(.)")
  local whole_ok, whole = json_rows(data, function(v)
    if first ~= "[" and not key then return nil end
    if key then return type(v) == "table" and v[key] or nil end
    return v
  end)
  if first ~= "[" and not key then
    if whole_ok and type(whole) == "table" and first == "{" and data:find("}%s*{") == nil then
      error(("%s holds one JSON object, not rows: pass field = the key of its list of rows (HF's load_dataset(\"json\", " ..
        "field=...)), or write the rows as a list or as JSON Lines"):format(path), 0)
    end
    return read_jsonl(path, field, explicit)
  end
  if not whole_ok then error(("%s: invalid JSON: %s"):format(path, whole), 0) end
  local list = key and type(whole) == "table" and whole[key] or whole
  if key and type(whole) == "table" and whole[key] == nil then error(("%s: no field '%s' at the top level"):format(path, key), 0) end
  if type(list) ~= "table" or (next(list) ~= nil and list[1] == nil) then
    error(("%s%s is not a list of rows"):format(path, key and (": field '" .. key .. "'") or ""), 0)
  end
  for i, obj in ipairs(list) do check_row(("%s: row %d"):format(path, i), obj, field, explicit) end
  return list
end

-- pandas.read_csv's missing values (its default na_values, quoted or not): the field is absent (None in HF).
local CSV_NA = {}
for _, v in ipairs { "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
  "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null" } do CSV_NA[v] = true end
-- Its booleans: a column whose every present field is one of these holds true / false.
local CSV_BOOL = { True = true, TRUE = true, ["true"] = true, False = false, FALSE = false, ["false"] = false }

-- A .csv file as HF's csv builder (pandas.read_csv) reads it: the first record names the columns; fields
-- separated by commas, "quoted" where they hold commas, quotes ("" for one) or line breaks; a missing value
-- (empty, NA, null, NaN, None, ... quoted or not, pandas' NaN) is absent; a column whose every present field
-- is a number holds numbers, one of True / False (true, TRUE, ...) booleans, quoted or not.
local function read_csv(path)
  local data = read_all(path):gsub("^\239\187\191", "") -- (a UTF-8 byte-order mark is not part of the first name)
  local records, rec, field, pos, n, quoted_field = {}, {}, {}, 1, #data, false
  local function end_field() rec[#rec + 1] = { table.concat(field), quoted_field }; field, quoted_field = {}, false end
  local function end_record()
    end_field()
    if not (#rec == 1 and rec[1][1] == "" and not rec[1][2]) then records[#records + 1] = rec end -- (blank lines skipped)
    rec = {}
  end
  while pos <= n do
    local c = data:sub(pos, pos)
    if c == '"' and #field == 0 and not quoted_field then
      quoted_field = true
      local close
      local q = pos + 1
      while true do
        close = data:find('"', q, true)
        if not close then error(("%s: a quoted field opened at byte %d is never closed"):format(path, pos), 0) end
        if data:sub(close + 1, close + 1) == '"' then q = close + 2 else break end
      end
      field[1] = data:sub(pos + 1, close - 1):gsub('""', '"')
      pos = close + 1
    elseif c == "," then end_field(); pos = pos + 1
    elseif c == "\n" or c == "\r" then
      end_record()
      pos = pos + ((c == "\r" and data:sub(pos + 1, pos + 1) == "\n") and 2 or 1)
    else
      local stop = data:find('[,\r\n]', pos) or n + 1
      field[#field + 1] = data:sub(pos, stop - 1)
      pos = stop
    end
  end
  if #field > 0 or #rec > 0 or quoted_field then end_record() end
  if #records == 0 then error(("%s: no header row (a .csv file names its columns in the first line)"):format(path), 0) end
  local header = records[1]
  local function number(v) -- (a decimal number as pandas reads one: not Lua's 0x10 or inf)
    return (v:match("^%s*[-+]?%d+%.?%d*[eE]?[-+]?%d*%s*$") or v:match("^%s*[-+]?%.%d+[eE]?[-+]?%d*%s*$")) and tonumber(v)
  end
  local numeric, bool = {}, {}
  for j = 1, #header do numeric[j], bool[j] = true, true end
  for i = 2, #records do
    if #records[i] ~= #header then
      error(("%s: record %d has %d fields but the header names %d columns"):format(path, i, #records[i], #header), 0)
    end
    for j, fv in ipairs(records[i]) do
      local v = fv[1]
      if not CSV_NA[v] then
        if not number(v) then numeric[j] = false end
        if CSV_BOOL[v] == nil then bool[j] = false end
      end
    end
  end
  local rows = {}
  for i = 2, #records do
    local row = {}
    for j, fv in ipairs(records[i]) do
      local v = fv[1]
      if not CSV_NA[v] then
        if numeric[j] then v = number(v) elseif bool[j] then v = CSV_BOOL[v] end
        row[header[j][1]] = v
      end
    end
    rows[#rows + 1] = row
  end
  return rows
end

-- HF's packaged builders, load_dataset(name, {data_files = ...}), and the format each reads.
local BUILDERS = { json = "json", text = "text", csv = "csv" }
local BINARY = { parquet = true, arrow = true, feather = true, gz = true, zst = true, bz2 = true, xz = true, zip = true }

-- One dataset file's rows; format: nil for the file's extension's.
local function read_file(file, opts, format)
  if not exists(file) then
    error(("dataset not found: %s (pass a wikitext folder, a .txt/.raw file or a .jsonl file)"):format(file), 0)
  end
  local ext = file:match("%.([%w]+)$")
  if not format and ext and BINARY[ext:lower()] then
    error(("%s: zrun reads .txt/.raw text, .jsonl, .json and .csv datasets, not .%s; convert it first, e.g. " ..
      "datasets.load_dataset(...).to_json(\"train.jsonl\") (or decompress it)"):format(file, ext), 0)
  end
  format = format or (file:match("%.jsonl$") and "jsonl") or (file:match("%.json$") and "json")
    or (file:match("%.csv$") and "csv") or (file:match("%.raw$") and "wikitext") or "text"
  if opts.field ~= nil and format ~= "json" then error("load_dataset: field is read from .json files (format = \"json\") only", 0) end
  local rows
  if format == "jsonl" then rows = read_jsonl(file, opts.text_field or "text", opts.text_field ~= nil)
  elseif format == "json" then rows = read_json(file, opts.text_field or "text", opts.text_field ~= nil, opts.field)
  elseif format == "csv" then
    rows = read_csv(file)
    for i, r in ipairs(rows) do check_row(("%s: row %d"):format(file, i), r, opts.text_field or "text", opts.text_field ~= nil) end
  elseif format == "wikitext" then rows = read_lines(file, true)
  elseif format == "text" then rows = read_lines(file, false)
    for _, r in ipairs(rows) do r.text = r.text:gsub("\n$", "") end
  else error(("unknown dataset format '%s' (wikitext, text, jsonl, json or csv)"):format(format), 0) end
  return rows
end

-- data_files as HF takes it: a file, a list of files (both the train split) or {split = file or list}.
local function data_files_by_split(df)
  if type(df) == "string" then return { train = { df } } end
  if type(df) ~= "table" or next(df) == nil then
    error("load_dataset: data_files must be a file, a list of files or {split = files}, e.g. { train = \"train.jsonl\" }", 0)
  end
  if df[1] ~= nil then return { train = df } end
  local out = {}
  for k, v in pairs(df) do out[k] = type(v) == "string" and { v } or v end
  return out
end

-- One part of load_dataset's split ("train[:10%]"): its rows and the file they come from.
local function load_split(path, opts, split)
  local base = M.parse_split(split, 0)
  local files, format = nil, opts.format
  if opts.data_files ~= nil then
    local by_split = data_files_by_split(opts.data_files)
    files = by_split[base]
    if not files then
      local names = {}
      for k in pairs(by_split) do names[#names + 1] = "'" .. tostring(k) .. "'" end
      table.sort(names)
      error(('Unknown split "%s". Should be one of [%s] (data_files\'s)'):format(base, table.concat(names, ", ")), 0)
    end
    format = format or BUILDERS[path]
  elseif is_dir(path) then
    local tried = {}
    for _, cand in ipairs(split_files[base] or { base }) do
      tried[#tried + 1] = path .. "/" .. cand
      if exists(path .. "/" .. cand) then files = { path .. "/" .. cand }; break end
    end
    if not files then
      error(("no '%s' split in %s: looked for %s; add one of them, or pass the file itself"):format(base, path,
        table.concat(tried, ", ")), 0)
    end
  elseif not exists(path) and (BUILDERS[path] or BINARY[path]) then
    error(("load_dataset(\"%s\") names HF's %s builder: pass its files, load_dataset(\"%s\", { data_files = " ..
      "\"train.%s\" }), or the file itself"):format(path, path, path, path == "text" and "txt" or path), 0)
  else
    files = { path }
  end
  local rows = {}
  for _, f in ipairs(files) do
    for _, r in ipairs(read_file(f, opts, format)) do rows[#rows + 1] = r end
  end
  local _, first, last = M.parse_split(split, #rows)
  if first == 1 and last == #rows then return rows, files[1], #rows end
  local out = {}
  for i = first, last do out[#out + 1] = rows[i] end
  return out, files[1], #rows
end

-- load_dataset(path, {split = "train[:2000]", format = "wikitext"|"text"|"jsonl"|"json"|"csv", text_field = "text",
-- field = nil, data_files = nil}) path: a file (.jsonl, .json: a list of rows, JSON Lines, or with field the list
-- under that key of one object, as HF's json builder reads it; .csv: a header row and records; .raw: wikitext; else
-- text lines), or a folder holding
-- wiki.{train,valid,test}.raw (or train.txt/…/jsonl), or HF's builder "json", "text" or "csv" with data_files: a
-- file or a list of them (the train split) or {split = file or list}, each split's files read in turn. split: a name, a slice of it (parse_split) or several
-- joined with "+" ("train[:10%]+validation", HF's: the rows of each in turn); a split that selects no rows
-- is an error, as in HF.
function M.load_dataset(path, opts)
  opts = kw.check("load_dataset", opts, { "split", "format", "text_field", "field", "data_files" })
  if opts.data_files ~= nil and not BUILDERS[path] then
    error(("load_dataset: with data_files, the path names HF's builder: \"json\", \"text\" or \"csv\", got \"%s\"%s")
      :format(tostring(path), BINARY[path] and " (zrun reads no " .. path .. " files; convert them to .jsonl)" or ""), 0)
  end
  local split = opts.split or "train"
  if type(split) ~= "string" then error("load_dataset: split must be a string such as \"train[:10%]\"", 0) end
  local parts, rows, file, total = {}, nil, nil, 0
  for part in (split .. "+"):gmatch("([^+]*)%+") do parts[#parts + 1] = part end
  for _, part in ipairs(parts) do M.parse_split(part, 0) end -- (every part's form checked before reading)
  for _, part in ipairs(parts) do
    local p, f, n = load_split(path, opts, part)
    file, total = file or f, total + n
    if not rows then rows = p else for _, r in ipairs(p) do rows[#rows + 1] = r end end
  end
  if #rows == 0 then -- (HF: Instruction "train[10:5]" corresponds to no data!) An empty file and a slice that
    -- keeps none of a small file's rows have different fixes: say which it is.
    if total == 0 then error(("%s has no rows (an empty file?): pass a dataset file that holds some"):format(file), 0) end
    error(("split '%s' of %s has no rows: it selects none of the file's %d rows; widen the slice or pass more rows")
      :format(split, file, total), 0)
  end
  local ds = adopt(rows)
  ds.source = file
  return ds
end

-- causal_lm_collator{padding_free = true, ...}'s collate function (its options checked there).
local function padding_free_collator(pad, multiple)
  return function(rows)
    local ids, labels, pos = {}, {}, {}
    for i, r in ipairs(rows) do
      local n, src = #r.input_ids, r.labels
      local lens = r.seq_lengths or { n }
      local t0, sum = #ids, 0
      for _, l in ipairs(lens) do
        for p = 0, l - 1 do pos[t0 + sum + p + 1] = p end
        sum = sum + l
      end
      if sum ~= n then error(("collator: row %d's seq_lengths add up to %d for %d input_ids"):format(i, sum, n), 0) end
      for k = 1, n do
        local v, l = r.input_ids[k], nil
        if src then l = src[k] or -100 else l = v end -- (no padding inside: a token equal to the pad is learned)
        ids[t0 + k], labels[t0 + k] = v, pos[t0 + k] == 0 and -100 or l
      end
    end
    if #ids == 0 then error("collator: every row in the batch is empty; filter empty rows first", 0) end
    local N = #ids
    if multiple and N % multiple ~= 0 then
      for t = N + 1, N + multiple - N % multiple do ids[t], labels[t], pos[t] = pad, -100, 0 end
    end
    return {
      input_ids = C.tensor({ ids }, { dtype = "i64" }),
      labels = C.tensor({ labels }, { dtype = "i64" }),
      position_ids = C.tensor({ pos }, { dtype = "i64" }),
    }
  end
end

-- Causal-LM collator, Hugging Face's DataCollatorForLanguageModeling(mlm=False): pads input_ids
-- to the longest row (right padding, pad_to_multiple_of), builds attention_mask, and labels =
-- input_ids with every position holding pad_token_id set to -100 (as HF does: when pad == eos, as
-- GPT-2/Llama scripts set it, real eos tokens are ignored too; packed rows avoid the question).
-- Rows that carry their own labels (group_texts blocks, as HF's default_data_collator takes them)
-- keep them, with -100 on the padding; a row's own attention_mask (rows tokenized with padding) is kept,
-- padded with 0, as transformers' tokenizer.pad keeps it. Returns i64 tensors (B, T). opts: pad_token_id (or
-- tokenizer, whose pad token it takes, as transformers' does), pad_to_multiple_of, mlm (false only),
-- mask_pad_token (default true; false: TRL's collator: only the padding is -100, tokens equal to the pad id
-- are learned, and the attention_mask is 1 on every token of a row, its own not read),
-- padding_free (TRL's DataCollatorForLanguageModeling(padding_free=True): the rows joined into one (1, N)
-- row with position_ids restarting at each row, or at each packed sequence of a row's seq_lengths; the
-- label at each position 0 is -100; no attention_mask; padded, when pad_to_multiple_of says, with
-- position 0; a token equal to the pad is learned whatever mask_pad_token says, as transformers'
-- DataCollatorWithFlattening and TRL's collator learn it).
function M.causal_lm_collator(opts)
  opts = kw.check("causal_lm_collator", opts, { "pad_token_id", "pad_to_multiple_of", "tokenizer", "mlm", "mask_pad_token",
    "padding_free" })
  local mask_pad = opts.mask_pad_token ~= false
  if opts.mlm ~= nil and opts.mlm ~= false then -- (transformers' DataCollatorForLanguageModeling(tokenizer, mlm=False))
    error("collator: mlm = true (masked language modeling) is not implemented; mlm = false is the causal LM collator", 2)
  end
  local multiple = opts.pad_to_multiple_of
  if multiple ~= nil and (type(multiple) ~= "number" or multiple < 1 or multiple ~= math.floor(multiple)) then
    error(("collator: pad_to_multiple_of must be a positive integer (e.g. 64), got %s"):format(tostring(multiple)), 2)
  end
  local pad = opts.pad_token_id
  -- (transformers: the tokenizer's pad token, which must exist; padding-free rows are padded only to a multiple)
  if pad == nil and opts.tokenizer ~= nil and (multiple or not opts.padding_free) then
    pad = opts.tokenizer:pad_id()
    if pad == nil then
      error("collator: the tokenizer has no pad token; set one (HF scripts use the eos: pad_token_id = tok:eos_id()) " ..
        "or pass pad_token_id", 2)
    end
  end
  if opts.padding_free then
    if multiple and pad == nil then error("collator: padding_free with pad_to_multiple_of needs a pad_token_id", 2) end
    return padding_free_collator(pad, multiple)
  end
  return function(rows)
    local B, T, Tmin = #rows, 0, math.huge
    for _, r in ipairs(rows) do
      if r.seq_lengths and #r.seq_lengths > 1 then
        error("collator: these rows hold packed sequences (seq_lengths, bfd packing) that must not attend to each " ..
          "other; collate them with causal_lm_collator{padding_free = true} (position_ids tell them apart)", 0)
      end
      local n = #r.input_ids
      if n > T then T = n end
      if n < Tmin then Tmin = n end
    end
    if multiple and T % multiple ~= 0 then T = T + multiple - T % multiple end
    if T == 0 then error("collator: every row in the batch is empty; filter empty rows first", 0) end
    if pad == nil and Tmin < T then
      error(("collator: rows of %d and %d tokens need padding but there is no pad_token_id; pass " ..
        "causal_lm_collator{pad_token_id=} (HF scripts use the eos id when the tokenizer has none) or pack " ..
        "the rows into equal blocks with group_texts"):format(Tmin, T), 0)
    end
    local ids, mask, labels = {}, {}, {}
    for b, r in ipairs(rows) do
      local ri, rm, rl = {}, {}, {}
      local src_labels, src_mask = r.labels, mask_pad and r.attention_mask
      for t = 1, T do
        local v = r.input_ids[t]
        if v then
          ri[t], rm[t] = v, src_mask and src_mask[t] or 1
          if src_labels then rl[t] = src_labels[t] or -100
          elseif v == pad and mask_pad then rl[t] = -100
          else rl[t] = v end
        else
          ri[t], rm[t], rl[t] = pad, 0, -100
        end
      end
      ids[b], mask[b], labels[b] = ri, rm, rl
    end
    return {
      input_ids = C.tensor(ids, { dtype = "i64" }),
      attention_mask = C.tensor(mask, { dtype = "i64" }),
      labels = C.tensor(labels, { dtype = "i64" }),
    }
  end
end

-- Distributed sampler (torch semantics): shuffles 1..n with seed + epoch, pads by wrapping so
-- every rank gets the same count (or drops the tail with drop_last), rank r takes r, r+W, ...
local Sampler = { __name = "DistributedSampler" }
M.DistributedSampler = Sampler

-- zr.datasets.DistributedSampler.new(n, { rank, world_size, shuffle = true, seed = 0, drop_last = false }).
function Sampler.new(n, opts)
  opts = kw.check("DistributedSampler.new", opts, { "rank", "world_size", "shuffle", "seed", "drop_last" })
  local self = require("zrun.data").sized({ n = n, rank = opts.rank or 0, world_size = opts.world_size or 1,
    shuffle = opts.shuffle ~= false, seed = opts.seed or 0, drop_last = opts.drop_last or false, epoch = 0 }, Sampler)
  if self.rank < 0 or self.rank >= self.world_size then
    error(("sampler: rank %d is outside world size %d"):format(self.rank, self.world_size), 0)
  end
  if self.drop_last then self.num_samples = math.floor(n / self.world_size)
  else self.num_samples = math.ceil(n / self.world_size) end
  return self
end
-- The epoch mixed into the shuffle's seed (call it before each epoch, as with torch's sampler).
function Sampler:set_epoch(e) self.epoch = e end
-- The number of indices this rank gets.
function Sampler:len() return self.num_samples end
-- This rank's row indices (1-based) for the current epoch.
function Sampler:indices()
  local order
  -- (torch's own permutation: torch.randperm with a generator seeded seed + epoch, so the order is torch's)
  if self.shuffle then order = C.randperm_torch(self.n, self.seed + self.epoch):flat_table()
  else order = {}; for i = 1, self.n do order[i] = i end end
  local total = self.num_samples * self.world_size
  if not self.drop_last then
    local i = 1
    while #order < total do order[#order + 1] = order[i]; i = i + 1 end
  end
  local out = {}
  for i = self.rank + 1, total, self.world_size do out[#out + 1] = order[i] end
  return out
end

-- accelerate's BatchSamplerShard (split_batches false, even_batches true): order (row indices) cut into
-- micro-batches of bs rows (the last one shorter, or dropped with drop_last), dealt to the ranks in
-- turn; rank takes its own (0-based rank). With one rank that is all of them. With several, every rank
-- gets as many, all full: the last round's shorter micro-batch is filled, and its missing ones made,
-- from the rows of the first world_size micro-batches taken in order (cycling where there are fewer);
-- drop_last drops an incomplete last round instead. Returns this rank's rows, micro-batch after
-- micro-batch.
function M.deal_batches(order, bs, world_size, rank, drop_last)
  local n, out = #order, {}
  local nb = drop_last and floor(n / bs) or ceil(n / bs)
  if world_size == 1 then
    for k = 1, math.min(n, nb * bs) do out[k] = order[k] end
    return out
  end
  local rounds = drop_last and floor(nb / world_size) or ceil(nb / world_size)
  local head = math.min(n, world_size * bs) -- the first world_size micro-batches' rows
  local tail = n - (nb - 1) * bs -- rows of the last micro-batch
  for b = rank, rounds * world_size - 1, world_size do
    local first = b * bs + 1
    for k = first, math.min(first + bs - 1, n) do out[#out + 1] = order[k] end
    if b >= nb - 1 and not drop_last then -- fill from the head: after the last micro-batch's gap, bs a micro-batch
      local have = b == nb - 1 and tail or 0
      local off = b == nb - 1 and 0 or (bs - tail) + (b - nb) * bs
      for j = 0, bs - have - 1 do out[#out + 1] = order[(off + j) % head + 1] end
    end
  end
  return out
end

-- transformers' get_length_grouped_indices: perm (a permutation of 1..n) cut into mega-batches of
-- batch_size x min(n / (4 batch_size), 50) rows (at least one batch), each sorted by descending length
-- (ties keep perm's order), and the longest row of all swapped to the front (an out-of-memory error
-- comes at the first step, not late). lengths[i]: row i's length. Returns the new order.
function M.length_grouped_indices(lengths, batch_size, perm)
  local n = #perm
  local mult = math.min(math.floor(n / (batch_size * 4)), 50)
  if mult == 0 then mult = 1 end
  local size, megas = mult * batch_size, {}
  for i = 1, n, size do
    local m, pos = {}, {}
    for k = i, math.min(i + size - 1, n) do m[#m + 1] = perm[k]; pos[perm[k]] = k end
    table.sort(m, function(x, y)
      local lx, ly = lengths[x], lengths[y]
      if lx ~= ly then return lx > ly end
      return pos[x] < pos[y]
    end)
    megas[#megas + 1] = m
  end
  local best = 1 -- the first mega-batch whose longest row is the longest (torch.argmax's first maximum)
  for k = 2, #megas do if lengths[megas[k][1]] > lengths[megas[best][1]] then best = k end end
  if #megas > 0 then megas[1][1], megas[best][1] = megas[best][1], megas[1][1] end
  local out = {}
  for _, m in ipairs(megas) do for _, i in ipairs(m) do out[#out + 1] = i end end
  return out
end

-- Iterates batches of collated rows: for batch in M.batches(ds, sampler, batch_size, collate)
function M.batches(ds, sampler, batch_size, collate, drop_last)
  local idx = sampler:indices()
  local i = 1
  return function()
    if i > #idx then return nil end
    local last = math.min(i + batch_size - 1, #idx)
    if drop_last and last - i + 1 < batch_size then return nil end
    local rows = {}
    for k = i, last do rows[#rows + 1] = ds.rows[idx[k]] end
    i = last + 1
    return collate(rows)
  end
end

return M
