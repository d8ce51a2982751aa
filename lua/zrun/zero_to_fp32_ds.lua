-- DeepSpeed's own ZeRO checkpoints (torch pickles: <tag>/*_model_states.pt and
-- <tag>/*_optim_states.pt, stages 1-3, fp16/bf16/fp32) read for zrun.zero_to_fp32: the same
-- consolidation as DeepSpeed's zero_to_fp32.py (deepspeed/utils/zero_to_fp32.py), without Python.
-- A Reader here has zero_to_fp32's interface (params, get, close), so `zrun zero-to-fp32 DIR OUT`
-- and zr.zero.load_state_dict_from_zero_checkpoint take either kind of checkpoint.
--
-- The layouts, as DeepSpeed 0.19.8 saves them:
--   stage 1/2: each parameter group is one flat vector: the parameters in param_shapes' order,
--     each followed by its param_alignment_paddings entry, the whole padded to 2 * world elements
--     and cut into world equal partitions; rank r saves single_partition_of_fp32_groups[g], its
--     partition less the group padding at the end (so the concatenation is the flat vector).
--   stage 3: every parameter is cut into world pieces of ceil(n / world) elements (the last
--     padded); rank r's fp32_flat_groups[g] holds its piece of each parameter of group g in order.
--   frozen parameters (not in the optimizer): frozen_param_fragments in the model-states file(s),
--     whole (stage 1/2) or rank r's piece (stage 3); buffers: from "module"; shared_params: a
--     name -> the name that holds its data.
local tf = require "zrun.torch_file"
local P = require "zrun.torch_pickle"
local zr = require "zrun"
local C = zr._C

local M = {}
local fmt, ipairs, type, tostring, concat = string.format, ipairs, type, tostring, table.concat
local ceil, max, min = math.ceil, math.max, math.min

local join = require("zrun.checkpoint").join

-- natural sort (DeepSpeed's natural_keys): rank 10 after rank 9
local function natural_less(a, b)
  local pa, pb = {}, {}
  for s, d in a:gmatch("(%D*)(%d*)") do pa[#pa + 1] = s; if d ~= "" then pa[#pa + 1] = tonumber(d) end end
  for s, d in b:gmatch("(%D*)(%d*)") do pb[#pb + 1] = s; if d ~= "" then pb[#pb + 1] = tonumber(d) end end
  for i = 1, min(#pa, #pb) do
    if pa[i] ~= pb[i] then
      if type(pa[i]) == type(pb[i]) then return pa[i] < pb[i] end
      return type(pa[i]) == "number"
    end
  end
  return #pa < #pb
end

local function files_matching(tdir, suffix)
  local out = {}
  for _, n in ipairs(C.listdir(tdir) or {}) do
    if n:sub(-#suffix) == suffix then out[#out + 1] = n end
  end
  table.sort(out, natural_less)
  return out
end

-- Whether tag folder tdir holds DeepSpeed's pickled checkpoint files.
function M.is_deepspeed(tdir)
  return #files_matching(tdir, "_optim_states.pt") > 0 or #files_matching(tdir, "_model_states.pt") > 0
end

local numel_of = require("zrun.checkpoint").numel_of
local function shape_of(v, where, name)
  if not P.is_list(v) then error(fmt("%s: the shape of '%s' is %s, not a torch.Size", where, name, P.repr(v)), 0) end
  local s = {}
  for i, d in ipairs(v) do
    if type(d) ~= "number" or d < 0 then error(fmt("%s: the shape of '%s' is %s", where, name, P.repr(v)), 0) end
    s[i] = d
  end
  return s
end
local function field(d, key, where)
  local v = P.is_dict(d) and d[key] or nil
  if v == nil then error(fmt("%s: has no '%s' (not a DeepSpeed ZeRO checkpoint file?)", where, key), 0) end
  return v
end
local function is_none(v) return v == nil or v == P.None end

local Reader = {}
Reader.__index = Reader

-- A Reader over DeepSpeed tag folder tdir. Reads only the pickles; tensors are read on :get.
-- opts.model (a zrun module, optional): the model the checkpoint is loaded into, which tells a
-- checkpoint without ZeRO's parameter groups (zrun.zero_to_fp32_ds_nozero).
function M.open(tdir, opts)
  local self = setmetatable({ tdir = tdir, entries = {}, by_name = {}, files = {}, opts = opts or {} }, Reader)
  local ok, err = pcall(function() self:scan() end)
  if not ok then self:close(); error(err, 0) end
  return self
end

function Reader:load(name)
  local path = join(self.tdir, name)
  local obj, file = tf.load(path)
  self.files[#self.files + 1] = file
  return obj, path
end

function Reader:add(e)
  if self.by_name[e.name] then return end
  e.read = e.read or function() return self:full(e) end
  self.entries[#self.entries + 1] = e
  self.by_name[e.name] = e
end

function Reader:scan()
  local tdir = self.tdir
  local optim = files_matching(tdir, "_optim_states.pt")
  local models = files_matching(tdir, "_model_states.pt")
  if #models == 0 then error(fmt("%s: no *_model_states.pt file (an incomplete checkpoint)", tdir), 0) end
  if #optim == 0 then -- saved without ZeRO: everything in the model-states file
    if #models ~= 1 or models[1] ~= "mp_rank_00_model_states.pt" then
      error(fmt("%s: no *_optim_states.pt files and model-states files %s: a model- or pipeline-parallel checkpoint "
        .. "without ZeRO, which zrun does not read", tdir, concat(models, ", ")), 0)
    end
    local m0, mpath = self:load(models[1])
    self.model0 = m0
    self:add_buffers(m0)
    require("zrun.zero_to_fp32_ds_nozero").scan(self, m0, mpath, self.opts)
    return
  end
  for _, n in ipairs(optim) do
    if not n:find("mp_rank_00_optim_states.pt", 1, true) or n:find("expp_rank", 1, true) then
      error(fmt("%s: %s is a model-parallel or expert-parallel file: zrun reads data-parallel ZeRO checkpoints "
        .. "(mp_rank_00 only); convert the checkpoint with DeepSpeed's ds_to_universal.py first", tdir, n), 0)
    end
  end
  -- the optimizer files: stage, world size, the fp32 flat groups
  local osd, where = {}, {}
  for r, n in ipairs(optim) do
    local obj, path = self:load(n)
    osd[r], where[r] = field(obj, "optimizer_state_dict", path), path
  end
  -- (DeepSpeed's BF16_Optimizer: ZeRO-1 in bf16 with fp32 gradient accumulation, or pipeline parallelism: ZeRO-1's
  -- partitions, no zero_stage; the parameters from its param_slice_mappings)
  local bf16_optimizer = P.is_dict(osd[1]) and osd[1].zero_stage == nil and osd[1].param_slice_mappings ~= nil
    and osd[1].single_partition_of_fp32_groups ~= nil
  local stage = bf16_optimizer and 0 or P.value(field(osd[1], "zero_stage", where[1]))
  local world = P.value(field(osd[1], "partition_count", where[1]))
  if P.is_list(world) then
    local w = 0
    for _, x in ipairs(world) do w = max(w, P.value(x)) end
    world = w
  end
  if type(stage) ~= "number" or type(world) ~= "number" then
    error(fmt("%s: zero_stage %s / partition_count %s are not numbers", where[1], P.repr(stage), P.repr(world)), 0)
  end
  if world ~= #optim then
    error(fmt("%s: saved by %d ranks, but %d *_optim_states.pt files are there (an overwritten or incomplete "
      .. "checkpoint: one or more ranks did not save)", tdir, world, #optim), 0)
  end
  self.stage, self.world, self.osd, self.where = stage, world, osd, where
  self.kind = bf16_optimizer and fmt("DeepSpeed's BF16_Optimizer checkpoint of %d ranks", world)
    or fmt("DeepSpeed's ZeRO-%d checkpoint of %d ranks", stage, world)
  local key = stage <= 2 and "single_partition_of_fp32_groups" or stage == 3 and "fp32_flat_groups"
  if not key then error(fmt("%s: unknown ZeRO stage %s", where[1], tostring(stage)), 0) end
  local groups = {}
  for r = 1, world do
    local g = field(osd[r], key, where[r])
    if not P.is_list(g) then error(fmt("%s: %s is %s, not a list of tensors", where[r], key, P.repr(g)), 0) end
    for gi, t in ipairs(g) do
      if not P.is_tensor(t) then error(fmt("%s: %s[%d] is %s, not a tensor", where[r], key, gi - 1, P.repr(t)), 0) end
      self.master_dtype = self.master_dtype or (t.dtype or "F32"):lower()
    end
    groups[r] = g
  end
  self.groups = groups
  self.master_dtype = self.master_dtype or "f32"
  -- the model-states files: param_shapes, buffers, frozen parameters, shared names
  local ms, mwhere = {}, {}
  for k, n in ipairs(models) do ms[k], mwhere[k] = self:load(n) end
  local m0 = ms[1]
  self.model0 = m0
  local shapes = bf16_optimizer and self:bf16_shapes(m0, mwhere[1]) or field(m0, "param_shapes", mwhere[1])
  if is_none(shapes) then error(fmt("%s: param_shapes is None: not saved by a ZeRO engine", mwhere[1]), 0) end
  if P.is_dict(shapes) then shapes = { shapes } end
  for k, d in ipairs(type(shapes) == "table" and shapes or {}) do
    if not P.is_dict(d) then error(fmt("%s: param_shapes[%d] is %s, not a dict of shapes", mwhere[1], k - 1, P.repr(d)), 0) end
  end
  if not P.is_list(shapes) and type(shapes) ~= "table" then
    error(fmt("%s: param_shapes is %s, not a list of dicts", mwhere[1], P.repr(shapes)), 0)
  end
  self:add_buffers(m0)
  -- frozen parameters
  local fshapes = m0.frozen_param_shapes
  if P.is_dict(fshapes) then
    for _, name in ipairs(P.keys(fshapes)) do
      local shape = shape_of(fshapes[name], mwhere[1], name)
      local n = numel_of(shape)
      local frags = {}
      for k = 1, (stage == 3 and #ms or 1) do
        local fr = P.is_dict(ms[k].frozen_param_fragments) and ms[k].frozen_param_fragments[name]
        if not P.is_tensor(fr) then error(fmt("%s: frozen parameter '%s' has no fragment", mwhere[k], name), 0) end
        frags[k] = fr
      end
      self:add({ name = name, shape = shape, numel = n, frozen = true, read = function()
        local out = zr.zeros({ n })
        local at = 0
        for _, fr in ipairs(frags) do -- stage 3: the ranks' pieces in order, the padding cut
          local len = min(fr:numel(), n - at)
          if len > 0 then out:narrow(1, at + 1, len):copy_(fr:read(0, len, { dtype = "f32" })) end
          at = at + len
        end
        if at < n then error(fmt("%s: frozen parameter '%s': its fragments hold %d of %d values", self.tdir, name, at, n), 0) end
        return out
      end })
    end
  end
  if bf16_optimizer then self:bf16_frozen(m0, shapes) end
  if stage <= 2 then self:scan_zero2(shapes, groups, osd[1], mwhere[1], where[1])
  else self:scan_zero3(shapes, groups, mwhere[1]) end
  -- shared parameters: a name whose data another holds
  local shared = m0.shared_params
  if P.is_dict(shared) then
    for _, alias in ipairs(P.keys(shared)) do self:add_alias(alias, shared[alias]) end
  end
end

-- Name `alias` for the parameter `name` holds (tied weights), if the checkpoint has that parameter.
function Reader:add_alias(alias, name)
  local e = self.by_name[name]
  if not e then return end
  self:add({ name = alias, shape = e.shape, numel = e.numel, alias_of = e.name, frozen = e.frozen,
    read = function() return self:get(e.name) end })
end

-- The buffers (model-states file m0's buffer_names, read from its module): first, as zero_to_fp32.py
-- orders the state dict.
function Reader:add_buffers(m0)
  local module, bnames = m0.module, m0.buffer_names
  if not (P.is_dict(module) and P.is_list(bnames)) then return end
  for _, b in ipairs(bnames) do
    local t = module[b]
    if P.is_tensor(t) then
      local float = t.dtype == "F32" or t.dtype == "BF16" or t.dtype == "F16" or t.dtype == "F64"
      local native = ({ I64 = "i64", I32 = "i32", I16 = "i32", I8 = "i32", U8 = "u8", BOOL = "u8" })[t.dtype]
      self:add({ name = b, shape = t.shape, numel = t:numel(), buffer = true, dtype = not float and native or nil,
        read = function() return t:get({ dtype = float and "f32" or nil }) end })
    end
  end
end

-- BF16_Optimizer's parameter groups as param_shapes would list them: each group's parameters in
-- the order their first fragments appear through the ranks' param_slice_mappings (name ->
-- fragment_address(numel, start in that rank's partition)), shaped as the model-states file's
-- "module" holds them; each first fragment must start where the parameters before it end.
function Reader:bf16_shapes(m0, mpath)
  local module = m0.module
  if not P.is_dict(module) then error(fmt("%s: no module state dict to take the parameters' shapes from", mpath), 0) end
  local out = {}
  for gi in ipairs(self.groups[1]) do
    local d, at, base = P.new_dict(), 0, 0
    for r = 1, self.world do
      local maps = self.osd[r].param_slice_mappings
      local m = P.is_list(maps) and maps[gi]
      if not P.is_dict(m) then error(fmt("%s: no param_slice_mappings for group %d", self.where[r], gi - 1), 0) end
      for _, name in ipairs(P.keys(m)) do
        if d[name] == nil then
          local t, start = module[name], P.field(m[name], "start")
          if not P.is_tensor(t) then error(fmt("%s: no weight '%s' in module to take its shape from", mpath, name), 0) end
          if start ~= nil and base + start ~= at then
            error(fmt("%s: '%s' starts at %s in rank %d's partition, where the parameters before it end at %d "
              .. "(a layout zrun does not know)", self.where[r], name, tostring(start), r - 1, at - base), 0)
          end
          local dims = P.List and setmetatable({}, P.List)
          for k, n in ipairs(t.shape) do dims[k] = n end
          P.dict_set(d, name, dims)
          at = at + t:numel()
        end
      end
      base = base + self.groups[r][gi]:numel()
    end
    out[gi] = d
  end
  return out
end

-- BF16_Optimizer's frozen parameters: the module's weights that no group holds (nor buffers),
-- read from the module (in its training dtype).
function Reader:bf16_frozen(m0, shapes)
  local held = {}
  for _, d in ipairs(shapes) do for _, n in ipairs(P.keys(d)) do held[n] = true end end
  for _, b in ipairs(P.is_list(m0.buffer_names) and m0.buffer_names or {}) do held[b] = true end
  for _, name in ipairs(P.keys(m0.module)) do
    local t = m0.module[name]
    if not held[name] and P.is_tensor(t) then
      self:add({ name = name, shape = t.shape, numel = t:numel(), frozen = true,
        read = function() return t:get({ dtype = "f32" }):reshape({ t:numel() }) end })
    end
  end
end

-- Pieces [lo, hi) of a vector stored as consecutive parts of the given lengths (the ranks'
-- partitions, or a rank's groups): put(at, k, s, len) for each overlap with part k, at = position
-- in [lo, hi), s = position in part k.
local function read_span(lens, lo, hi, put)
  local base = 0
  for k, len in ipairs(lens) do
    local a, b = max(lo, base), min(hi, base + len)
    if b > a then put(a - lo, k, a - base, b - a) end
    base = base + len
    if base >= hi then break end
  end
end

-- Rank r's (1-based) tensor of state `which` for flat group gi (1-based): "master" is the fp32
-- partition; "exp_avg", "exp_avg_sq", ... the optimizer's, as the stage saved them (ZeRO-1/2: a
-- list of per-group states (elastic) or the torch optimizer's state dict (rigid); ZeRO-3: the
-- torch optimizer's state dict). Its first elements line up with the master's.
function Reader:state_part(r, which, gi)
  if which == "master" then return self.groups[r][gi] end
  local osd, t = self.osd[r], nil
  local b = self.stage <= 2 and osd.base_optimizer_state or osd.optimizer_state_dict
  if P.is_list(b) then t = P.is_dict(b[gi]) and b[gi][which] or nil
  elseif P.is_dict(b) and P.is_dict(b.state) then
    local st = b.state[gi - 1]
    t = P.is_dict(st) and st[which] or nil
  end
  if not P.is_tensor(t) then
    error(fmt("%s: rank %d has no optimizer state '%s' for group %d (an optimizer other than Adam/AdamW, or "
      .. "a layout zrun does not know)", self.where[r], r - 1, which, gi - 1), 0)
  end
  return t
end

-- Elements [lo, hi) of parameter e's state `which`, flattened: put(at, tensor) for each piece
-- (at: 0-based position in [lo, hi)), read from the files now.
function Reader:read_range(e, which, lo, hi, put)
  if e.range then return e.range(which, lo, hi, put) end -- (without ZeRO: zrun.zero_to_fp32_ds_nozero)
  if e.gi then -- ZeRO-1/2: the parameter's span of its group's flat vector, across the ranks
    read_span(self.lens[e.gi], e.at + lo, e.at + hi, function(o, r, s, len)
      put(o, self:state_part(r, which, e.gi):read(s, len, { dtype = "f32" }))
    end)
    return
  end
  local pn, n = e.pn, e.numel -- ZeRO-3: rank r holds elements [r*pn, (r+1)*pn)
  for r = 1, self.world do
    local a, b = max(lo, (r - 1) * pn), min(hi, r * pn, n)
    if b > a then
      read_span(self.lens3[r], e.at + a - (r - 1) * pn, e.at + b - (r - 1) * pn, function(o, g, s, len)
        put(a - lo + o, self:state_part(r, which, g):read(s, len, { dtype = "f32" }))
      end)
    end
  end
end

-- The whole master of parameter e (fp32, flat), read from the files now.
function Reader:full(e)
  local out = zr.zeros({ e.numel })
  self:read_range(e, "master", 0, e.numel, function(at, t) out:narrow(1, at + 1, t:numel()):copy_(t) end)
  return out
end

function Reader:scan_zero2(shapes, groups, osd0, mpath, opath)
  local world, pads = self.world, osd0.param_alignment_paddings
  self.lens = {}
  for gi, gshapes in ipairs(shapes) do
    local lens, avail = {}, 0
    for r = 1, world do
      local t = groups[r][gi]
      if not t then error(fmt("%s: rank %d has no fp32 group %d", self.tdir, r - 1, gi - 1), 0) end
      lens[r] = t:numel()
      avail = avail + lens[r]
    end
    self.lens[gi] = lens
    local gpads = P.is_list(pads) and pads[gi] or nil
    local names = P.keys(gshapes)
    if gpads and #gpads ~= #names then
      error(fmt("%s: %d parameter alignment paddings for group %d, which has %d parameters", opath, #gpads, gi - 1, #names), 0)
    end
    local offset = 0
    for k, name in ipairs(names) do
      local shape = shape_of(gshapes[name], mpath, name)
      local e = { name = name, shape = shape, numel = numel_of(shape), gi = gi, at = offset }
      self:add(e)
      local pad = gpads and gpads[k] or 0
      if type(pad) ~= "number" then error(fmt("%s: parameter alignment padding %s for '%s'", opath, P.repr(pad), name), 0) end
      offset = offset + e.numel + pad
    end
    -- DeepSpeed's own check: both counts agree once aligned to 2 * world
    local align = 2 * world
    local function up(x) return align * ceil(x / align) end
    if up(offset) ~= up(avail) then
      error(fmt("%s: group %d: the parameters need %d values but the ranks' partitions hold %d (files from "
        .. "different saves mixed, or a layout zrun does not know)", self.tdir, gi - 1, offset, avail), 0)
    end
  end
end

function Reader:scan_zero3(shapes, groups, mpath)
  local world = self.world
  self.lens3 = {}
  for r = 1, world do
    local lens = {}
    for g, t in ipairs(groups[r]) do lens[g] = t:numel() end
    self.lens3[r] = lens
  end
  local offset, avail = 0, 0
  for _, n in ipairs(self.lens3[1]) do avail = avail + n end
  for _, gshapes in ipairs(shapes) do
    for _, name in ipairs(P.keys(gshapes)) do
      local shape = shape_of(gshapes[name], mpath, name)
      local n = numel_of(shape)
      local e = { name = name, shape = shape, numel = n, pn = ceil(n / world), at = offset }
      self:add(e)
      offset = offset + e.pn
    end
  end
  if offset ~= avail then
    error(fmt("%s: the parameters need %d values per rank but the ranks' flat groups hold %d (files from "
      .. "different saves mixed?)", self.tdir, offset, avail), 0)
  end
end

-- The parameters (and buffers, and shared names) in DeepSpeed's order: {name=, shape=, numel=,
-- frozen=, buffer=, alias_of=, dtype= (non-float buffers)}.
function Reader:params() return self.entries end

-- The full tensor of `name` (fp32; a non-float buffer in its own dtype), in its saved shape.
function Reader:get(name)
  local e = self.by_name[name]
  if not e then error(fmt("%s: no parameter named '%s' in the checkpoint", self.tdir, name), 0) end
  local t = e.read()
  if e.alias_of or e.buffer then return t end
  if #e.shape == 0 then return t:reshape({}) end
  return t:view(e.shape)
end

function Reader:close()
  for _, f in ipairs(self.files) do f:close() end
  self.files = {}
end

return M
