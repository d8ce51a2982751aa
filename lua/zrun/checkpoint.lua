-- Sharded ZeRO checkpoints in DeepSpeed's layout: engine:save_checkpoint(dir, tag, client_state)
-- and engine:load_checkpoint(dir, tag) (both on every rank), resharding when the world size or the
-- stage changed, and engine:save_16bit_model(dir). Consolidation to one fp32 file: zero_to_fp32.lua.
--
--   dir/latest                                           the newest complete tag (written last)
--   dir/<tag>/mp_rank_00_model_states.safetensors        rank 0: weights, HF names, training dtype
--   dir/<tag>/mp_rank_00_model_states.json               rank 0: engine metadata (JSON sidecar)
--   dir/<tag>/zero_pp_rank_<r>_mp_rank_00_optim_states.safetensors
--       rank r: tensors master and the optimizer's states (f32, or bf16 with bf16_master_weights_and_grads /
--       bf16_optimizer_states, as DeepSpeed saves them; the rank's partition of S elements:
--       AdamW and Lamb exp_avg, exp_avg_sq; Lion exp_avg; Adagrad sum; SGD momentum_buffer, when momentum > 0) and
--       __metadata__ {format, zrun_state = JSON}: counters, scheduler, loss scaler, client_state,
--       config, world size, stage, RNG, optimizer and its state names, and per parameter {name, shape,
--       numel, offset, chunk}. A file without an optimizer is AdamW's.
--
--   dir/<tag>/zenflow_states.safetensors                 with zero_optimization.zenflow (rank 0's): the
--       selected columns and their moments (zrun.zenflow_state); with overlap_step each rank's optimizer
--       file also holds the host update's own partitions, listed in zrun_state.zenflow_overlap
--   dir/<tag>/zrun_manifest.json                          every file's size and the save's id
--
-- Partition layout (runtime/zero.h): parameter i of n elements is cut into K chunks of c elements
-- (K = world size, or 1 at stage 0, recorded as num_chunks); element e lives in chunk floor(e/c),
-- at position offset + e mod c of that rank's partition. A tag switches from its old contents to
-- the new in one step, even when saved into again (zrun.checkpoint_store: a temporary tag folder,
-- the manifest, renames), and `latest` follows, so a crash mid-save leaves a complete checkpoint
-- the one that loads; a load refuses a tag folder the manifest does not vouch for.
local zr = require "zrun"
local C = zr._C
local dist = require "zrun.dist"
local store = require "zrun.checkpoint_store"
local hf = require "zrun.hf"
local cjson = require "cjson"
local zenflow_state = require "zrun.zenflow_state"

local M = {}
local fmt, concat, floor, min = string.format, table.concat, math.floor, math.min
local pairs, ipairs, type, tostring, pcall = pairs, ipairs, type, tostring, pcall

M.FORMAT = "zrun-zero-checkpoint/1"
M.MODEL_FILE = "mp_rank_00_model_states.safetensors"
M.MODEL_JSON = "mp_rank_00_model_states.json"
M.STATES = { "master", "exp_avg", "exp_avg_sq" } -- AdamW's: engine.zero:state(0), (1), (2)
-- Each optimizer's states after master, by the engine's optimizer name (engine.optimizer_type):
-- engine.zero:state(1), (2); torch's state names.
M.OPTIMIZER_STATES = { adamw = { "exp_avg", "exp_avg_sq" }, lamb = { "exp_avg", "exp_avg_sq" }, lion = { "exp_avg" },
  adagrad = { "sum" },
  sgd = { "momentum_buffer" } }
-- The optimizer of an engine ("adamw" when it predates the others) and the states it keeps,
-- master first: the tensor names of its optimizer files.
function M.engine_states(engine)
  local ty = engine.optimizer_type or "adamw"
  local names = { "master" }
  for k, n in ipairs(M.OPTIMIZER_STATES[ty]) do
    if k <= engine.zero:num_states() then names[#names + 1] = n end
  end
  return ty, names
end
-- The name of rank r's optimizer-state file in a tag folder (DeepSpeed's naming).
function M.optim_file(r) return fmt("zero_pp_rank_%d_mp_rank_00_optim_states.safetensors", r) end

local function join(a, b)
  if a:sub(-1) == "/" then return a .. b end
  return a .. "/" .. b
end
M.join = join

local read_file = store.read_all

local function shape_str(s) return "(" .. concat(s, ",") .. ")" end

-- A JSON-safe deep copy: drops functions, userdata and cycles; cjson.null becomes nil.
local function plain(v, seen)
  local tv = type(v)
  if tv == "number" or tv == "string" or tv == "boolean" then return v end
  if tv ~= "table" then return nil end
  seen = seen or {}
  if seen[v] then return nil end
  seen[v] = true
  local out = {}
  for k, x in pairs(v) do
    if type(k) == "string" or type(k) == "number" then out[k] = plain(x, seen) end
  end
  seen[v] = nil
  return out
end

local function encode(v) return hf.encode_json(plain(v) or {}) end

local function decode(s, path)
  local ok, v = pcall(cjson.decode, s)
  if not ok or type(v) ~= "table" then
    error(fmt("%s: the checkpoint metadata is not valid JSON (%s)", path, tostring(ok and type(v) or v)), 0)
  end
  return hf.strip_nulls(v)
end

-- Runs a local step everywhere and makes every rank fail when one did, so no rank is left
-- waiting in a collective; the others' messages name the first failing rank and its message.
-- Also a barrier. With `prefix`, the failing rank's own message starts with `what` too.
local MSG = 400
local function agree(ok, err, what, prefix)
  if not ok then err = tostring(err) end
  if not ok and prefix and not os.getenv("ZRUN_DEBUG") then err = err:gsub("^[%w_/%.%-]+%.lua:%d+: ", "") end
  if dist.world_size() == 1 then
    if not ok then error(prefix and what .. ": " .. err or err, 0) end
    return
  end
  local W, r = dist.world_size(), dist.rank()
  local t = zr.tensor({ ok and 0 or (W - r) }, { dtype = "f64" })
  dist.all_reduce(t, "max")
  local bad = t:item()
  if bad == 0 then return end
  local first = W - bad
  -- share the first failing rank's message (as character codes)
  local codes = {}
  local s = (r == first) and tostring(err):sub(1, MSG) or ""
  for i = 1, MSG do codes[i] = s:byte(i) or 0 end
  local all = zr.zeros({ W * MSG })
  dist.all_gather(all, zr.tensor(codes))
  local chars = all:narrow(1, first * MSG + 1, MSG):flat_table()
  local out = {}
  for i = 1, MSG do
    if chars[i] == 0 then break end
    out[i] = string.char(chars[i])
  end
  if not ok then error(prefix and what .. ": " .. err or err, 0) end
  error(fmt("%s failed on rank %d: %s", what, first, concat(out)), 0)
end

-- ---------------------------------------------------------------- what the engine holds

-- Engine parameter names (HF names from the module, matched by tensor identity).
local function param_names(engine)
  local by_tensor = {}
  for name, p in engine.module:named_parameters() do by_tensor[p] = by_tensor[p] or name end
  local names, used = {}, {}
  for i, p in ipairs(engine.params) do
    local n = by_tensor[p]
    if not n then error(fmt("checkpoint: engine parameter %d is not a parameter of the model", i), 0) end
    if used[n] then n = fmt("%s#%d", n, i) end
    used[n] = true
    names[i] = n
  end
  return names
end
M.param_names = param_names

-- Full shapes of the parameters (a released stage-3 parameter has shape (0), so each is gathered
-- once, one at a time, and the shapes are remembered on the engine).
local function full_shapes(engine)
  if rawget(engine, "_ckpt_shapes") then return engine._ckpt_shapes end
  local z, shapes = engine.zero, {}
  for i, p in ipairs(engine.params) do
    if engine.stage == 3 and not z:is_gathered(i) then
      z:gather({ i })
      shapes[i] = p:shape()
      z:release({ i })
    else
      shapes[i] = p:shape()
    end
  end
  rawset(engine, "_ckpt_shapes", shapes)
  return shapes
end

local function numel_of(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end
M.numel_of = numel_of -- (the product of a shape's sizes)

-- Everything a rank's optimizer file needs besides the tensors.
local function engine_state(engine, names, client_state)
  local z = engine.zero
  local shapes = full_shapes(engine)
  local params = {}
  for i = 1, #engine.params do
    local off, chunk = z:layout(i)
    params[i] = { name = names[i], shape = shapes[i], numel = numel_of(shapes[i]), offset = off, chunk = chunk }
  end
  local groups = {}
  for gi, g in ipairs(engine.optimizer.param_groups) do groups[gi] = { lr = g.lr, weight_decay = g.weight_decay } end
  local seed, offset = C.random_state()
  local mcfg = engine.module.config and plain(engine.module.config) or nil
  local oty, onames = M.engine_states(engine)
  return {
    format = M.FORMAT, world_size = engine.world_size, rank = engine.global_rank, stage = engine.stage,
    num_chunks = engine.stage == 0 and 1 or engine.world_size, precision = engine.precision,
    partition_numel = z:partition_numel(),
    global_steps = engine.global_steps, micro_steps = engine.micro_steps, skipped_steps = engine.skipped_steps,
    opt_steps = engine.opt_steps or 0, param_groups = groups,
    lr_scheduler = engine.lr_scheduler and engine.lr_scheduler:state_dict() or nil,
    loss_scaler = engine.scaler and plain(engine.scaler) or nil,
    client_state = client_state, config = engine.config, model_config = mcfg,
    model_class = engine.module.__name, rng = { seed = seed, offset = offset }, params = params,
    optimizer = oty, states = onames,
    -- bf16.bf16_master_weights_and_grads / bf16_optimizer_states: the dtypes the states were saved in
    master_dtype = engine.master_dtype or "f32", state_dtype = engine.state_dtype or "f32",
  }
end
M.engine_state = engine_state

-- ---------------------------------------------------------------- save

local function check_tag(tag)
  tag = tostring(tag)
  if tag == "" or tag:find("/", 1, true) or tag == "." or tag == ".." or tag == "latest" or store.is_leftover(tag) then
    error(fmt("save_checkpoint: tag '%s' cannot name a directory inside the checkpoint directory "
      .. "(no '/', not empty, not 'latest', not a name zrun gives its temporary folders: <tag>.tmp.<id>)", tag), 0)
  end
  return tag
end

-- Rank 0's string on every rank (short strings: ids).
local function share0(s)
  if dist.world_size() == 1 then return s end
  local codes = {}
  for i = 1, 128 do codes[i] = s and s:byte(i) or 0 end
  local t = zr.tensor(codes, { dtype = "f64" })
  dist.broadcast(t, 0)
  local out = {}
  for i, c in ipairs(t:flat_table()) do
    if c == 0 then break end
    out[i] = string.char(c)
  end
  return concat(out)
end

-- name -> tensor of every model parameter (frozen ones too), for the model-states file.
local function model_tensors(engine)
  local sd = {}
  for name, p in engine.module:named_parameters() do sd[name] = p:detach() end
  return sd
end

-- Stage 3: makes every parameter whole; returns the list to release afterwards (collective).
local function gather_all(engine)
  if engine.stage ~= 3 then return nil end
  local z, was, all = engine.zero, {}, {}
  for i = 1, #engine.params do
    if not z:is_gathered(i) then was[#was + 1] = i end
    all[i] = i
  end
  z:gather(all)
  return was
end
local function release(engine, list)
  if list and #list > 0 then engine.zero:release(list) end
end

-- Every rank writes its files into dir/<tag>.tmp.<id>/; then rank 0 writes the manifest, switches
-- the folder in for dir/<tag> and rewrites `latest` (checkpoint_store.lua). Errors are one line
-- naming the checkpoint and the problem, on every rank; a failed save leaves dir as it was.
function M.save(engine, dir, tag, client_state)
  if type(dir) ~= "string" or dir == "" then
    error(fmt("save_checkpoint: expected a directory path, got %s", type(dir) == "string" and "''" or type(dir)), 0)
  end
  tag = check_tag(tag or ("global_step" .. engine.global_steps))
  local r = engine.global_rank
  local what = "save_checkpoint " .. join(dir, tag)
  local names = param_names(engine)
  local state = engine_state(engine, names, client_state)

  -- rank 0: the directory, what earlier saves left, a fresh temporary tag folder
  local ok, err, id = true, nil, nil
  if r == 0 then
    ok, err = pcall(function()
      C.makedirs(dir)
      local line = store.clean(dir, true)
      if line then print("[zrun] save_checkpoint: " .. line) end
      id = store.new_id()
      C.makedirs(store.temp_dir(dir, tag, id))
    end)
  end
  agree(ok, err, what, true)
  id = share0(id)
  local tmp = store.temp_dir(dir, tag, id)
  state.save_id = id
  local function step(ok_, err_) -- a failure anywhere: rank 0 removes the temporary folder
    local fine, msg = pcall(agree, ok_, err_, what, true)
    if fine then return end
    if r == 0 then store.discard(tmp) end
    error(msg, 0)
  end

  -- model states (rank 0), parameters gathered at stage 3; ZenFlow's (every rank syncs its master
  -- partition, rank 0 writes the selection, the same on every rank)
  local was = gather_all(engine)
  ok, err = true, nil
  local zt, zmd
  if engine.zenflow then ok, err = pcall(function() zt, zmd, state.zenflow_overlap = zenflow_state.collect(engine) end) end
  if ok and r == 0 then
    ok, err = pcall(function()
      local sidecar = {}
      for k, v in pairs(state) do sidecar[k] = v end
      sidecar.rank, sidecar.rng = nil, nil
      C.save_safetensors(join(tmp, M.MODEL_FILE), model_tensors(engine),
        { format = "pt", zrun = M.FORMAT, zrun_save_id = id })
      C.write_file_atomic(join(tmp, M.MODEL_JSON), encode(sidecar))
      if zt then
        zmd.zrun_save_id = id
        C.save_safetensors(join(tmp, zenflow_state.FILE), zt, zmd)
      end
    end)
  end
  release(engine, was)
  if not ok then zenflow_state.release_master(engine) end
  step(ok, err)

  -- optimizer states (every rank), then every file's size to rank 0
  local bytes
  ok, err = pcall(function()
    -- one state at a time: with partial offload z:state joins the device and host parts in a host copy
    local z, specs = engine.zero, {}
    local ns = #state.states
    local ov = state.zenflow_overlap and state.zenflow_overlap.states or {}
    for k, n in ipairs(state.states) do
      specs[k] = { name = n, dtype = k == 1 and state.master_dtype or state.state_dtype, shape = { z:partition_numel() } }
    end
    for k, n in ipairs(ov) do specs[ns + k] = { name = n, dtype = "f32", shape = { z:partition_numel() } } end
    local p = join(tmp, M.optim_file(r))
    C.save_safetensors_stream(p, specs, function(i)
      collectgarbage() -- the previous state's copy is no longer referenced
      if i > ns then return zenflow_state.overlap_tensor(engine, ov[i - ns]) end
      return z:state(i - 1) -- specs[i] is state i - 1
    end, { format = M.FORMAT, zrun_state = encode(state) })
    collectgarbage()
    bytes = store.size(p) or error(p .. ": missing right after it was written", 0)
  end)
  zenflow_state.release_master(engine)
  step(ok, err)
  local sizes = { bytes }
  if dist.world_size() > 1 then
    local all = zr.zeros({ dist.world_size() }, { dtype = "f64" })
    dist.all_gather(all, zr.tensor({ bytes }, { dtype = "f64" }))
    sizes = all:flat_table()
  end

  -- rank 0: the manifest (last into the folder), then the switch and `latest`
  ok, err = true, nil
  if r == 0 then
    ok, err = pcall(function()
      local files = {}
      for k, n in ipairs(sizes) do files[M.optim_file(k - 1)] = n end
      local extra = engine.zenflow and zenflow_state.FILE or nil
      for _, n in ipairs({ M.MODEL_FILE, M.MODEL_JSON, extra }) do
        files[n] = store.size(join(tmp, n)) or error(join(tmp, n) .. ": missing right after it was written", 0)
      end
      store.write_manifest(tmp, { tag = tag, save_id = id, world_size = engine.world_size, stage = engine.stage,
        global_steps = engine.global_steps, files = files })
      store.commit(dir, tag, tmp, id)
    end)
  end
  step(ok, err)
  return true
end

-- ---------------------------------------------------------------- reading a checkpoint

local function list_tags(dir, except)
  local out = {}
  for _, n in ipairs(C.listdir(dir) or {}) do
    if n ~= except and C.path_type(join(dir, n)) == "dir" and not store.is_leftover(n) then out[#out + 1] = n end
  end
  return #out > 0 and concat(out, ", ") or "none"
end

-- dir's folders that are checkpoint directories themselves (the Trainer's checkpoint-<step>, each with its
-- own `latest`), by step: the Trainer's output_dir passed where one of them was meant.
local function nested_checkpoints(dir)
  local out = {}
  for _, n in ipairs(C.listdir(dir) or {}) do
    if C.path_type(join(join(dir, n), "latest")) == "file" then out[#out + 1] = n end
  end
  table.sort(out, function(a, b)
    local x, y = tonumber(a:match("%d+$")), tonumber(b:match("%d+$"))
    if x and y and x ~= y then return x < y end
    return a < b
  end)
  return out
end

-- Resolves (dir, tag or nil) to the tag directory, with errors that say what is missing.
function M.resolve(dir, tag, who)
  who = who or "load_checkpoint"
  if type(dir) ~= "string" or dir == "" then error(who .. ": expected a checkpoint directory path", 0) end
  if C.path_type(dir) ~= "dir" then error(fmt("%s: checkpoint directory %s does not exist", who, dir), 0) end
  if tag == nil then
    local p = join(dir, "latest")
    local s = read_file(p)
    if not s then
      local nested = nested_checkpoints(dir)
      if #nested > 0 then
        error(fmt("%s: %s holds checkpoint folders (%s), each a checkpoint directory of its own: pass one of them, e.g. %s",
          who, dir, concat(nested, ", "), join(dir, nested[#nested])), 0)
      end
      error(fmt("%s: %s is missing, so there is no tag to load; pass a tag explicitly (tags in %s: %s)",
        who, p, dir, list_tags(dir)), 0)
    end
    tag = s:match("^%s*(.-)%s*$")
    if tag == "" then error(fmt("%s: %s is empty; pass a tag explicitly (tags in %s: %s)", who, p, dir, list_tags(dir)), 0) end
  end
  tag = tostring(tag)
  local tdir = join(dir, tag)
  if C.path_type(join(tdir, "latest")) == "file" then
    error(fmt("%s: %s is a checkpoint directory of its own (it has a latest file), not a tag: pass it as the directory, " ..
      "without the tag", who, tdir), 0)
  end
  if C.path_type(tdir) ~= "dir" then
    error(fmt("%s: no checkpoint '%s' in %s (%s does not exist; tags there: %s)", who, tag, dir, tdir, list_tags(dir)), 0)
  end
  return tdir, tag
end

-- Opens rank k's optimizer file: handle and decoded state, with errors naming the file; with the
-- tag's manifest, the file must come from the save the manifest describes.
function M.open_optim(tdir, k, expect_w, manifest)
  local p = join(tdir, M.optim_file(k))
  if C.path_type(p) ~= "file" then
    error(fmt("%s: missing%s (an incomplete or corrupted checkpoint)", p,
      expect_w and fmt("; the checkpoint was saved by %d ranks and needs all %d optimizer-state files", expect_w, expect_w) or ""), 0)
  end
  local ok, f = pcall(C.safetensors_open, p)
  if not ok then error(fmt("cannot read checkpoint file %s: %s", p, tostring(f)), 0) end
  local md = f:metadata()
  if md.format ~= M.FORMAT or not md.zrun_state then
    f:close()
    error(fmt("%s: not a zrun ZeRO optimizer-state file (metadata format '%s', expected '%s')", p,
      tostring(md.format), M.FORMAT), 0)
  end
  local st = decode(md.zrun_state, p)
  if manifest then
    local ok, err = pcall(store.check_id, p, st.save_id, manifest)
    if not ok then f:close(); error(err, 0) end
  end
  local S = st.partition_numel
  for _, n in ipairs(st.states or M.STATES) do
    local info = f:info(n)
    if not info then f:close(); error(fmt("%s: has no tensor '%s'", p, n), 0) end
    if info.numel ~= S then
      f:close()
      error(fmt("%s: tensor '%s' has %d elements, the metadata says the partition has %d", p, n, info.numel, S), 0)
    end
  end
  if expect_w and st.world_size ~= expect_w then
    f:close()
    error(fmt("%s: saved by a world of %d ranks, but rank 0's file says %d (files from different saves mixed?)",
      p, st.world_size, expect_w), 0)
  end
  return f, st, p
end

-- A lazy set of the optimizer files of one checkpoint: rank 0's state, then others on demand.
local Files = {}
Files.__index = Files
local function index_params(st)
  local m = {}
  for _, e in ipairs(st.params or {}) do m[e.name] = e end
  return m
end
-- The model-states files must come from the manifest's save too.
local function check_model_files(tdir, man)
  local mp = join(tdir, M.MODEL_FILE)
  if man.files[M.MODEL_FILE] then
    local ok, _, md = pcall(C.safetensors_info, mp)
    if not ok then error(fmt("cannot read checkpoint file %s: %s", mp, tostring(_)), 0) end
    store.check_id(mp, md.zrun_save_id, man)
  end
  local jp = join(tdir, M.MODEL_JSON)
  if man.files[M.MODEL_JSON] then store.check_id(jp, decode(read_file(jp) or "", jp).save_id, man) end
end

-- Opens a tag folder the manifest vouches for: rank 0's optimizer file now, the others on
-- files:get(k); read_range reads part of one parameter's state across them. Close with files:close().
function M.files(tdir)
  local parent, name = tdir:match("^(.*)/([^/]+)/*$")
  local man = store.verify(tdir, parent and "tags in " .. parent .. ": " .. list_tags(parent, name))
  check_model_files(tdir, man)
  local f0, st0, p0 = M.open_optim(tdir, 0, nil, man)
  if st0.world_size ~= man.world_size then
    f0:close()
    error(fmt("%s: saved by %s ranks, but %s says %s (files of different saves mixed?)", p0, tostring(st0.world_size),
      store.MANIFEST, tostring(man.world_size)), 0)
  end
  local self = setmetatable({ tdir = tdir, f = { [0] = f0 }, st = { [0] = st0 }, idx = { [0] = index_params(st0) },
    path0 = p0, W = st0.world_size, manifest = man }, Files)
  self.by_name = self.idx[0]
  return self
end
function Files:get(k)
  if not self.f[k] then
    self.f[k], self.st[k] = M.open_optim(self.tdir, k, self.W, self.manifest)
    self.idx[k] = index_params(self.st[k])
  end
  return self.f[k], self.st[k]
end
function Files:close()
  for _, f in pairs(self.f) do f:close() end
  self.f = {}
end
-- Copies elements [lo, hi) (0-based, of the flattened parameter) of saved parameter `name`'s
-- state `which` into the views dst_fn(at, len) returns, chunk by chunk, so memory is one slice
-- at a time.
function Files:read_range(name, which, lo, hi, dst_fn)
  local c = self.by_name[name].chunk
  local pos = lo
  while pos < hi do
    local k = floor(pos / c)
    local stop = min(hi, (k + 1) * c)
    local f = self:get(k)
    local e = self.idx[k][name]
    if not e or e.chunk ~= c then
      error(fmt("%s: parameter '%s' is laid out differently than in rank 0's file (files from different saves mixed?)",
        join(self.tdir, M.optim_file(k)), name), 0)
    end
    dst_fn(pos - lo, stop - pos):copy_(f:get_slice(which, e.offset + (pos - k * c) + 1, stop - pos))
    pos = stop
  end
end

-- Refuses a checkpoint of another optimizer (or of SGD with/without a momentum buffer) in one line.
local function check_optimizer(engine, files)
  local st = files.st[0]
  local saved, saved_states = st.optimizer or "adamw", st.states or M.STATES
  local ty, names = M.engine_states(engine)
  if saved ~= ty or concat(saved_states, ",") ~= concat(names, ",") then
    error(fmt("%s: checkpoint of optimizer %s (states %s) but the engine runs %s (states %s): load it with the " ..
      "optimizer.type it was saved with", files.path0, saved, concat(saved_states, ", "), ty, concat(names, ", ")), 0)
  end
end

-- Checks the checkpoint's parameters against the engine's (names, shapes; a parameter a format keeps
-- flattened (e.flat) by its number of elements); errors list the differences and name the file.
local function check_compat(files, names, shapes)
  local missing, unexpected, shape, seen = {}, {}, {}, {}
  for i, n in ipairs(names) do
    local e = files.by_name[n]
    seen[n] = true
    if not e then missing[#missing + 1] = fmt("'%s' %s", n, shape_str(shapes[i]))
    elseif shape_str(e.shape) ~= shape_str(shapes[i]) and not (e.flat and e.numel == M.numel_of(shapes[i])) then
      shape[#shape + 1] = fmt("'%s' has shape %s in the checkpoint but %s in the model", n, shape_str(e.shape),
        shape_str(shapes[i]))
    end
  end
  local saved = files.st[0].params
  for _, e in ipairs(saved) do
    if not seen[e.name] then unexpected[#unexpected + 1] = fmt("'%s' %s", e.name, shape_str(e.shape)) end
  end
  if #missing + #unexpected + #shape == 0 then return end
  local parts = {}
  local function add(label, list)
    if #list == 0 then return end
    local more = #list > 4 and fmt(" (and %d more)", #list - 4) or ""
    parts[#parts + 1] = label .. concat(list, ", ", 1, min(4, #list)) .. more
  end
  add("not in the checkpoint: ", missing)
  add("in the checkpoint but not in the model: ", unexpected)
  add("", shape)
  error(fmt("%s: checkpoint of a different model (the checkpoint has %d parameters, the model %d): %s",
    files.path0, #saved, #names, concat(parts, "; ")), 0)
end

-- ---------------------------------------------------------------- load

-- Opens (and so validates) every saved file this rank will read, before anything is overwritten:
-- a damaged or missing file leaves the engine as it was.
local function open_needed(engine, files, names)
  local z = engine.zero
  local jr = engine.stage == 0 and 0 or engine.global_rank
  for i, name in ipairs(names) do
    local e = files.by_name[name]
    local _, c = z:layout(i)
    local lo, hi = jr * c, min(jr * c + c, e.numel)
    if hi > lo then
      for k = floor(lo / e.chunk), floor((hi - 1) / e.chunk) do files:get(k) end
    end
  end
end

-- dst (the partition's S elements) takes this rank's partition of saved state `which`.
local function read_partition(engine, files, names, which, dst)
  local z = engine.zero
  local jr = engine.stage == 0 and 0 or engine.global_rank -- which chunk of each parameter this rank holds
  dst:zero_() -- chunk padding stays zero
  for i, name in ipairs(names) do
    local e = files.by_name[name]
    local off, c = z:layout(i)
    local lo = jr * c
    local hi = min(lo + c, e.numel)
    if hi > lo then
      files:read_range(name, which, lo, hi, function(at, len) return dst:narrow(1, off + at + 1, len) end)
    end
  end
end

-- One state at a time: z:state(k) is the state itself, or with partial offload a host copy of
-- both parts that set_state writes back (a no-op for the state itself).
local function restore_partitions(engine, files, names, optimizer_states)
  local z = engine.zero
  local _, snames = M.engine_states(engine)
  for k, which in ipairs(snames) do
    if which ~= "master" and not optimizer_states then break end -- (the weights only: the moments stay as they are)
    local dst = z:state(k - 1)
    read_partition(engine, files, names, which, dst)
    z:set_state(k - 1, dst)
    dst = nil
    collectgarbage()
  end
end

local function restore_engine(engine, st, o)
  if o.module_only then return end -- (DeepSpeed's load_module_only: the weights, nothing of the run)
  engine.global_steps = st.global_steps or 0
  engine.micro_steps = st.micro_steps or 0
  engine.skipped_steps = st.skipped_steps or 0
  if o.optimizer_states then engine.opt_steps = st.opt_steps or 0 end -- (the moments' step count goes with them)
  if st.param_groups and o.optimizer_states then -- (the optimizer's own state in DeepSpeed, the lr with it)
    for gi, g in ipairs(engine.optimizer.param_groups) do
      local sg = st.param_groups[gi]
      if sg then g.lr, g.weight_decay = sg.lr or g.lr, sg.weight_decay or g.weight_decay end
    end
  end
  if not o.scheduler then -- (load_lr_scheduler_states = false: the engine's schedule as it is)
  elseif engine.lr_scheduler and st.lr_scheduler then engine.lr_scheduler:load_state_dict(st.lr_scheduler)
  elseif st.lr_scheduler and not engine.lr_scheduler then
    dist.print0("[zrun] load_checkpoint: the checkpoint has LR scheduler state but the engine has no scheduler; ignored")
  end
  if engine.scaler and st.loss_scaler and o.optimizer_states then -- (DeepSpeed keeps the loss scaler in the optimizer's state)
    local s = engine.scaler
    local no_zero, h = s.no_zero, s.hysteresis
    for k, v in pairs(st.loss_scaler) do s[k] = v end
    -- the scaler's kind is the engine's stage's: a checkpoint resharded across stage 0 (FP16_Optimizer's scaler, no
    -- hysteresis) and ZeRO (DynamicLossScaler's) keeps the scale and takes the engine's hysteresis
    if (st.loss_scaler.no_zero or false) ~= (no_zero or false) then
      s.no_zero, s.hysteresis, s.cur_hysteresis = no_zero, h, h
    end
  end
  if st.rng and st.rng.seed then C.random_state(st.rng.seed, st.rng.offset or 0) end
end

-- The checkpoint to load, found by its files: the tag folder and a view of its files with zrun's own
-- interface (M.files; files.kind names a checkpoint zrun did not write): zrun's, DeepSpeed's own ZeRO
-- files (zrun.checkpoint_ds), DeepSpeed's universal checkpoint (zrun.checkpoint_uc, its tag from
-- latest_universal), or a transformers Trainer folder without DeepSpeed (zrun.checkpoint_hf).
local function open_files(engine, dir, tag)
  local hfck, uc, ds = require "zrun.checkpoint_hf", require "zrun.checkpoint_uc", require "zrun.checkpoint_ds"
  local tdir, files
  if tag == nil and hfck.is_hf(dir) then
    tdir, files = dir, hfck.files(dir, engine)
  else
    tdir = M.resolve(dir, tag == nil and uc.latest_tag(dir) or tag)
    files = uc.is_universal(tdir) and uc.files(tdir) or ds.is_deepspeed(tdir) and ds.files(tdir, engine) or M.files(tdir)
  end
  if files.kind and engine.zenflow then
    files:close()
    error(fmt("%s: %s: zrun reads its weights and Adam moments, not ZenFlow's state; load it without "
      .. "zero_optimization.zenflow", tdir, files.kind), 0)
  end
  return tdir, files
end

-- Returns client_state and the tag directory loaded from. opts, DeepSpeed's load_checkpoint arguments:
-- load_optimizer_states (default true; false: the weights without the optimizer's moments, their step
-- count and the loss scaler, which stay as the engine has them, so another optimizer may load them),
-- load_lr_scheduler_states (default true), load_module_only (default false; true: the weights alone, none
-- of the run's counters or schedule), load_module_strict (true only: every parameter must match).
function M.load(engine, dir, tag, opts)
  opts = require("zrun.kwargs").check("load_checkpoint", opts, { "load_optimizer_states", "load_lr_scheduler_states",
    "load_module_only", "load_module_strict" })
  if opts.load_module_strict == false then
    error("load_checkpoint: load_module_strict = false: zrun loads every parameter and refuses a checkpoint whose " ..
      "parameters differ (names or shapes); load a subset into a model with zr.hf / zr.zero functions instead", 0)
  end
  local o = { module_only = opts.load_module_only == true }
  o.optimizer_states = not o.module_only and opts.load_optimizer_states ~= false
  o.scheduler = not o.module_only and opts.load_lr_scheduler_states ~= false
  if engine.zenflow and not o.optimizer_states then
    error("load_checkpoint: ZenFlow's state is its optimizer's (the selected columns' moments and the host update in " ..
      "flight): load it with load_optimizer_states and without load_module_only", 0)
  end
  local tdir
  local files, names
  if engine.global_rank == 0 and type(dir) == "string" and C.path_type(dir) == "dir" then
    local line = store.clean(dir, false)
    if line then print("[zrun] load_checkpoint: " .. line) end
  end
  if dist.world_size() > 1 then dist.barrier() end -- no rank reads dir while rank 0 cleans it
  local ok, err = pcall(function() tdir, files = open_files(engine, dir, tag) end)
  agree(ok, err, "load_checkpoint")
  if files.kind then
    local st = files.st[0]
    dist.print0(fmt("[zrun] load_checkpoint: %s from %s: its fp32 weights%s, step %d", files.kind, tdir,
      o.optimizer_states and st.optimizer == "adamw" and fmt(", Adam moments (optimizer step %d)", st.opt_steps) or "",
      st.global_steps))
  end
  names = param_names(engine)
  local shapes = full_shapes(engine)
  ok, err = true, nil
  if o.optimizer_states then ok, err = pcall(check_optimizer, engine, files) end
  if ok then ok, err = pcall(check_compat, files, names, shapes) end
  if not ok then files:close() end
  agree(ok, err, "load_checkpoint")

  local r = engine.global_rank
  local own
  ok, err = pcall(function()
    open_needed(engine, files, names)
    if r < files.W then
      local _, st = files:get(r)
      own = st
    else own = files.st[0] end
  end)
  if not ok then files:close() end
  agree(ok, err, "load_checkpoint")
  -- overlap_step: a host update still in flight would write the master and moments being restored
  ok, err = pcall(function()
    if engine.zenflow and engine.zenflow.overlap then engine.zero:async_wait() end
    restore_partitions(engine, files, names, o.optimizer_states)
  end)
  if not ok then files:close() end
  agree(ok, err, "load_checkpoint")
  collectgarbage()
  restore_engine(engine, own, o)
  engine.zero:zero_grad()
  engine.zero:refresh_params()
  -- overlap_step's host update (zrun.zenflow_state), after the parameters took the model
  local ov = files.st[0].zenflow_overlap
  ok, err = true, nil
  if ov then
    ok, err = pcall(zenflow_state.restore_overlap, engine, ov, function(which, dst)
      read_partition(engine, files, names, which, dst)
    end, dist.print0)
  elseif engine.zenflow and engine.zenflow.overlap then -- nothing pending, as after warm-up's last window
    ok, err = pcall(function()
      engine.zero:set_async_pending(false)
      engine.zenflow.first_after_warm = true
    end)
  end
  files:close()
  agree(ok, err, "load_checkpoint")
  -- ZenFlow's own state (zrun.zenflow_state; the master it synced at the save gave the parameters above)
  local zf_file = join(tdir, zenflow_state.FILE)
  if engine.zenflow then
    zenflow_state.restore(engine, zf_file, dist.print0, function(md) store.check_id(zf_file, md.zrun_save_id, files.manifest) end)
  elseif C.path_type(zf_file) == "file" then
    dist.print0("[zrun] load_checkpoint: the checkpoint has ZenFlow state (selected columns' moments) but the " ..
      "engine runs without zero_optimization.zenflow; not used")
  end
  if files.reshard_note ~= false and (files.W ~= engine.world_size or (files.st[0].stage or 0) ~= engine.stage) then
    dist.print0(fmt("[zrun] load_checkpoint: resharded %s from %d ranks (stage %d) to %d ranks (stage %d)",
      tdir, files.W, files.st[0].stage or 0, engine.world_size, engine.stage))
  end
  return own.client_state, tdir
end

-- ---------------------------------------------------------------- 16-bit model

local HF_DTYPE = { f32 = "float32", bf16 = "bfloat16", f16 = "float16" }

-- Writes a Hugging Face model directory (config.json + model.safetensors) from rank 0 with the
-- weights in the training dtype. At stage 3 it needs stage3_gather_16bit_weights_on_model_save,
-- as DeepSpeed does; returns false (with a message) when that is off. With ZenFlow's overlap_step the
-- weights include the host update still in flight (DeepSpeed's are one host window behind). opts:
-- max_shard_size, metadata (as save_pretrained's), exclude_frozen_parameters (DeepSpeed's: the
-- parameters the optimizer does not train left out).
function M.save_16bit_model(engine, dir, opts)
  if type(dir) ~= "string" or dir == "" then error("save_16bit_model: expected a directory path", 2) end
  opts = require("zrun.kwargs").check("save_16bit_model", opts, { "max_shard_size", "metadata", "exclude_frozen_parameters" })
  local hf_opts = { max_shard_size = opts.max_shard_size, metadata = opts.metadata } -- (checked on every rank, before the gather)
  local zc = engine.config and engine.config.zero_optimization or {}
  if engine.stage == 3 and not zc.stage3_gather_16bit_weights_on_model_save then
    dist.print0("[zrun] save_16bit_model: did not save the model because "
      .. "zero_optimization.stage3_gather_16bit_weights_on_model_save is false at stage 3; set it to true")
    return false
  end
  local was = gather_all(engine)
  local ok, err = true, nil
  local function write()
    if engine.global_rank ~= 0 then return end
    ok, err = pcall(function()
      local cfg = plain(engine.module.config or {})
      cfg.dtype, cfg.device = nil, nil
      cfg.torch_dtype = HF_DTYPE[engine.precision] or cfg.torch_dtype
      if cfg.architectures == nil and engine.module.__name then cfg.architectures = { engine.module.__name } end
      local sd = model_tensors(engine)
      if opts.exclude_frozen_parameters then -- (DeepSpeed's: the parameters the optimizer does not train left out)
        local trained = {}
        for _, p in ipairs(engine.params) do trained[p] = true end
        for name, p in engine.module:named_parameters() do
          if not trained[p] or not p.requires_grad then sd[name] = nil end
        end
      end
      hf.save_pretrained(dir, sd, cfg, hf_opts)
    end)
  end
  -- ZenFlow overlap_step: with the host update in flight applied (zrun.zenflow: with_host_update)
  if engine.zenflow then engine.zenflow:with_host_update(write) else write() end
  release(engine, was)
  agree(ok, err, "save_16bit_model")
  return true
end

return M
