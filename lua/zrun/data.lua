-- zr.data: TensorDataset and DataLoader (torch.utils.data semantics). A DataLoader yields
-- batches of stacked tensors; with shuffle=true each epoch uses the permutation seeded by
-- seed + epoch, so runs are reproducible and epochs differ. Text datasets, collators and the
-- rank-sharded sampler live in zrun.datasets; a sampler from there can drive a DataLoader.
local C = require "zrun._C"
local M = {}

local is_tensor, fmt, floor, ceil = C.is_tensor, string.format, math.floor, math.ceil

-- `#x` for zrun's datasets and loaders. LuaJIT (Lua 5.1) ignores __len on tables but honours it on
-- userdata, so an object whose length matters is a userdata proxy over its state table: fields
-- read and write through to the state, methods come from class, and #x is class.len(x) (torch's
-- len(dataset), len(loader)). type(x) is "userdata"; M.is_sized(x) tells them apart.
local sized_class = setmetatable({}, { __mode = "k" })
function M.sized(state, class)
  local u = newproxy(true)
  local mt = getmetatable(u)
  mt.__index, mt.__newindex = state, state
  mt.__len = function(self) return class.len(self) end
  mt.__tostring = function(self)
    if class.__tostring then return class.__tostring(self) end
    return fmt("%s of %d", class.__name or "object", class.len(self))
  end
  setmetatable(state, { __index = class })
  sized_class[u] = class
  return u
end
-- The class of a proxy made by sized (nil for anything else).
function M.is_sized(x) return sized_class[x] end

-- ---------- TensorDataset ----------

local TensorDataset = { __name = "TensorDataset" }
M.TensorDataset = TensorDataset

-- TensorDataset(x, y, ...): sample i is {x[i], y[i], ...} (rows along dim 1; numbers for 1-dim
-- tensors). All tensors must have the same size along dim 1.
function TensorDataset.new(...)
  local ts = { ... }
  if #ts == 0 then error("TensorDataset: needs at least one tensor", 2) end
  for i, t in ipairs(ts) do
    if not is_tensor(t) then error(fmt("TensorDataset: argument %d is a %s, not a tensor", i, type(t)), 2) end
    if t:dim() == 0 then error(fmt("TensorDataset: tensor %d is 0-dim; samples are taken along dim 1", i), 2) end
    if t:size(1) ~= ts[1]:size(1) then
      error(fmt("TensorDataset: size mismatch between tensors: tensor 1 has %d rows, tensor %d has %d",
        ts[1]:size(1), i, t:size(1)), 2)
    end
  end
  return M.sized({ tensors = ts }, TensorDataset)
end
setmetatable(TensorDataset, { __call = function(_, ...) return TensorDataset.new(...) end })

-- The number of samples (the first dimension, shared by every tensor).
function TensorDataset:len() return self.tensors[1]:size(1) end

-- Sample i (1-based): a list with row i of each tensor.
function TensorDataset:get(i)
  local out = {}
  for k, t in ipairs(self.tensors) do out[k] = t[i] end
  return out
end

-- The samples at indices, stacked: one (#indices, ...) tensor per dataset tensor.
function TensorDataset:get_batch(indices)
  local out = {}
  for k, t in ipairs(self.tensors) do
    local shape = t:shape()
    shape[1] = #indices
    local b = C.empty(shape, { dtype = t:dtype(), device = t:device() })
    for j, i in ipairs(indices) do b[j] = t[i] end
    out[k] = b
  end
  return out
end

-- ---------- collation ----------

-- Stacks equally shaped tensors along a new first dim.
function M.stack(ts)
  local shape = ts[1]:shape()
  table.insert(shape, 1, #ts)
  local out = C.empty(shape, { dtype = ts[1]:dtype(), device = ts[1]:device() })
  local s1 = table.concat(ts[1]:shape(), ",")
  for i, t in ipairs(ts) do
    if table.concat(t:shape(), ",") ~= s1 then
      error(fmt("stack: sample %d has shape (%s), sample 1 (%s)", i, table.concat(t:shape(), ","), s1), 2)
    end
    out[i] = t
  end
  return out
end

-- torch's default_collate: tensors are stacked, numbers become a tensor (i64 when all are
-- integers, else f32), lists and dicts are collated field by field; anything else is returned
-- as a list.
function M.default_collate(samples)
  local first = samples[1]
  if is_tensor(first) then return M.stack(samples) end
  if type(first) == "number" then
    local int = true
    for _, v in ipairs(samples) do if v ~= floor(v) then int = false; break end end
    return C.tensor(samples, { dtype = int and "i64" or "f32" })
  end
  if type(first) == "table" then
    local out = {}
    if #first > 0 then
      for j = 1, #first do
        local col = {}
        for i, s in ipairs(samples) do col[i] = s[j] end
        out[j] = M.default_collate(col)
      end
    else
      for k in pairs(first) do
        local col = {}
        for i, s in ipairs(samples) do col[i] = s[k] end
        out[k] = M.default_collate(col)
      end
    end
    return out
  end
  return samples
end

-- ---------- DataLoader ----------

local DataLoader = { __name = "DataLoader" }
M.DataLoader = DataLoader

local function dataset_len(ds)
  if type(ds) ~= "table" and not M.is_sized(ds) then
    error("DataLoader: dataset must be a dataset (len() and get(i)) or a list of samples, got a " .. type(ds), 3)
  end
  if ds.len then return ds:len() end
  return #ds
end

-- DataLoader{dataset, batch_size = 1, shuffle = false, seed = 0, drop_last = false,
--            collate_fn = default_collate, sampler = nil}
-- dataset: a TensorDataset, anything with len()/get(i), or a plain list of samples. sampler:
-- an object with indices() (and optionally set_epoch(e)), e.g. zrun.datasets.DistributedSampler.
function DataLoader.new(opts)
  if type(opts) ~= "table" then error("DataLoader{dataset, batch_size=, shuffle=, seed=, drop_last=}: expected an options table", 2) end
  local known = { dataset = true, batch_size = true, shuffle = true, seed = true, drop_last = true,
    collate_fn = true, sampler = true, [1] = true }
  for k in pairs(opts) do
    if not known[k] then error(fmt("DataLoader: unknown option '%s'", tostring(k)), 2) end
  end
  local self = M.sized({
    dataset = opts.dataset or opts[1], batch_size = opts.batch_size or 1, shuffle = opts.shuffle or false,
    seed = opts.seed or 0, drop_last = opts.drop_last or false, collate_fn = opts.collate_fn,
    sampler = opts.sampler, epoch = 0,
  }, DataLoader)
  if self.dataset == nil then error("DataLoader: 'dataset' is required", 2) end
  if type(self.batch_size) ~= "number" or self.batch_size < 1 or self.batch_size ~= floor(self.batch_size) then
    error(fmt("DataLoader: batch_size must be a positive integer, got %s", tostring(self.batch_size)), 2)
  end
  if self.sampler and self.shuffle then error("DataLoader: sampler and shuffle=true are mutually exclusive (the sampler shuffles)", 2) end
  self.n = dataset_len(self.dataset)
  return self
end
setmetatable(DataLoader, { __call = function(_, opts) return DataLoader.new(opts) end })

local function n_indices(self)
  if self.sampler then
    if self.sampler.len then return self.sampler:len() end
    return self.sampler.num_samples or #self.sampler:indices()
  end
  return self.n
end

-- Number of batches per epoch.
function DataLoader:len()
  local n = n_indices(self)
  return self.drop_last and floor(n / self.batch_size) or ceil(n / self.batch_size)
end

-- Sets the epoch the next iter() uses (later calls continue from it).
function DataLoader:set_epoch(e) self.epoch = e end

-- The sample order (1-based indices) for an epoch.
function DataLoader:indices(epoch)
  epoch = epoch or self.epoch
  if self.sampler then
    if self.sampler.set_epoch then self.sampler:set_epoch(epoch) end
    return self.sampler:indices()
  end
  if self.shuffle then return C.randperm(self.n, self.seed + epoch):flat_table() end
  local idx = {}
  for i = 1, self.n do idx[i] = i end
  return idx
end

local function fetch(self, idx)
  local ds = self.dataset
  if not self.collate_fn and ds.get_batch then return ds:get_batch(idx) end
  local samples = {}
  for j, i in ipairs(idx) do
    if ds.get then samples[j] = ds:get(i) else samples[j] = ds[i] end
  end
  return (self.collate_fn or M.default_collate)(samples)
end

-- One epoch: for x, y in loader:iter() do ... end. A batch that is a list (TensorDataset, list
-- samples) is returned unpacked; any other batch (a dict from a collator) as one value. Each
-- call moves on to the next epoch.
function DataLoader:iter()
  local idx = self:indices(self.epoch)
  self.epoch = self.epoch + 1
  local bs, n = self.batch_size, #idx
  local last = self.drop_last and floor(n / bs) * bs or n
  local pos = 0
  return function()
    if pos >= last then return nil end
    local chunk = {}
    for j = 1, math.min(bs, last - pos) do chunk[j] = idx[pos + j] end
    pos = pos + #chunk
    local b = fetch(self, chunk)
    if type(b) == "table" and not is_tensor(b) and #b > 0 then return unpack(b) end
    return b
  end
end

return M
