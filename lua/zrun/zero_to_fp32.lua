-- Consolidates a ZeRO checkpoint (zrun.checkpoint's layout) into full fp32 weights with Hugging
-- Face names, as DeepSpeed's zero_to_fp32.py does: `zrun zero-to-fp32 DIR [--tag T] OUT`, and
-- zr.zero.load_state_dict_from_zero_checkpoint(model, dir [, tag]). Each parameter is reassembled
-- from the chunks in every rank's optimizer-state file, one at a time, so memory is bounded by the
-- largest tensor; frozen parameters (not in the optimizer) come from the model-states file.
local zr = require "zrun"
local C = zr._C
local ckpt = require "zrun.checkpoint"

local M = {}
local fmt, ipairs, type = string.format, ipairs, type
local BYTES = { f32 = 4, i64 = 8, i32 = 4, u8 = 1 }

-- Reader over one checkpoint: the parameter list and full fp32 tensors on request.
local Reader = {}
Reader.__index = Reader

-- A Reader over checkpoint dir (tag: default dir/latest): r:params() lists {name=, shape=, numel=},
-- r:get(name) returns one full fp32 tensor, r:close() closes the files.
function M.open(dir, tag)
  local ds = require "zrun.zero_to_fp32_ds"
  -- (a DeepSpeed tag folder given itself, global_step100/, as users often do: its files are right there)
  if tag == nil and type(dir) == "string" and C.path_type(dir) == "dir" and ds.is_deepspeed(dir) then return ds.open(dir) end
  local tdir = ckpt.resolve(dir, tag, "zero_to_fp32")
  if ds.is_deepspeed(tdir) then return ds.open(tdir) end -- DeepSpeed's own (torch pickles)
  local files = ckpt.files(tdir)
  -- the master's saved dtype (bf16 with bf16_master_weights_and_grads), widened exactly to fp32 here
  local self = setmetatable({ tdir = tdir, files = files, entries = {}, frozen = {},
    master_dtype = files.st[0].master_dtype or "f32" }, Reader)
  for _, e in ipairs(files.st[0].params) do self.entries[#self.entries + 1] = e end
  -- parameters without optimizer state (frozen): from the model-states file when present
  local mp = ckpt.join(tdir, ckpt.MODEL_FILE)
  if C.path_type(mp) == "file" then
    local ok, mf = pcall(C.safetensors_open, mp)
    if not ok then files:close(); error(fmt("cannot read checkpoint file %s: %s", mp, tostring(mf)), 0) end
    self.model_file = mf
    for _, name in ipairs(mf:keys()) do
      if not files.by_name[name] then
        local info = mf:info(name)
        self.frozen[name] = true
        self.entries[#self.entries + 1] = { name = name, shape = info.shape, numel = info.numel, frozen = true }
      end
    end
  end
  return self
end

-- The parameters in checkpoint order: {name=, shape=, numel=, frozen=}.
function Reader:params() return self.entries end

-- Full fp32 tensor of parameter `name` (its saved shape).
function Reader:get(name)
  if self.frozen[name] then return self.model_file:get(name, { dtype = "f32" }) end
  local e = self.files.by_name[name]
  if not e then error(fmt("%s: no parameter named '%s' in the checkpoint", self.tdir, name), 0) end
  local flat = zr.zeros({ e.numel })
  if e.numel > 0 then
    self.files:read_range(name, "master", 0, e.numel, function(at, len) return flat:narrow(1, at + 1, len) end)
  end
  if #e.shape == 0 then return flat:reshape({}) end
  return flat:view(e.shape)
end

function Reader:close()
  self.files:close()
  if self.model_file then self.model_file:close(); self.model_file = nil end
end

-- All fp32 weights at once (name -> tensor); memory is the whole model.
function M.get_fp32_state_dict_from_zero_checkpoint(dir, tag)
  local r = M.open(dir, tag)
  local sd = {}
  local ok, err = pcall(function() for _, e in ipairs(r:params()) do sd[e.name] = r:get(e.name) end end)
  r:close()
  if not ok then error(err, 0) end
  return sd
end

-- Writes the consolidated fp32 weights, streaming parameter by parameter, to out: a .safetensors file, or
-- (any other path) a directory, as DeepSpeed's zero_to_fp32.py writes one: model.safetensors, or
-- model-0000k-of-0000n.safetensors and model.safetensors.index.json once the weights pass
-- opts.max_shard_size (default "5GB"; shards filled in checkpoint order). opts.exclude_frozen_parameters
-- leaves out the parameters without optimizer state. Returns the number of tensors and of elements
-- written, the master's saved dtype, the number of files and (a DeepSpeed checkpoint) what it was.
function M.convert(dir, tag, out, opts)
  opts = require("zrun.kwargs").check("zero_to_fp32", opts, { "max_shard_size", "exclude_frozen_parameters" })
  local hf = require "zrun.hf"
  local r = M.open(dir, tag)
  local specs, total, nbytes = {}, 0, 0
  for _, e in ipairs(r:params()) do
    if not (opts.exclude_frozen_parameters and e.frozen) then
      local dt = e.dtype or "f32" -- (a DeepSpeed checkpoint's integer buffers keep their dtype)
      specs[#specs + 1] = { name = e.name, dtype = dt, shape = e.shape, bytes = (BYTES[dt] or 4) * e.numel }
      total, nbytes = total + e.numel, nbytes + specs[#specs].bytes
    end
  end
  local file = out:match("%.safetensors$")
  if not file then C.makedirs(out) end
  local shards, names = hf.plan_shards(specs, file and math.huge or hf.parse_size(opts.max_shard_size or "5GB"))
  local wm = {}
  local ok, err = pcall(function()
    for k, shard in ipairs(shards) do
      local path = file and out or ckpt.join(out, names[k])
      C.save_safetensors_stream(path, shard, function(i)
        collectgarbage() -- the previous tensor is no longer referenced: free it before building the next
        return r:get(shard[i].name)
      end, { format = "pt" })
      for _, sp in ipairs(shard) do wm[sp.name] = names[k] end
    end
  end)
  r:close()
  collectgarbage()
  if not ok then error(err, 0) end
  if not file then
    local keep = {}
    for _, n in ipairs(names) do keep[n] = true end
    if #shards > 1 then keep[hf.write_index(out, wm, nbytes)] = true end
    hf.remove_stale_weights(out, keep)
  end
  return #specs, total, r.master_dtype, #shards, r.kind
end

-- Loads the checkpoint's fp32 weights into model (cast to the model's dtype), one parameter at a
-- time; every model parameter must be in the checkpoint with the same shape. Returns model.
function M.load_state_dict_from_zero_checkpoint(model, dir, tag)
  if type(model) ~= "table" or not model.named_parameters then
    error("load_state_dict_from_zero_checkpoint: expected an nn.Module as the first argument", 2)
  end
  local r = M.open(dir, tag)
  local have = {}
  for _, e in ipairs(r:params()) do have[e.name] = e end
  local probs, used = {}, {}
  local todo = {}
  for name, p in model:named_parameters() do
    local e = have[name]
    used[name] = true
    local shape = table.concat(p:shape(), ",")
    if not e then probs[#probs + 1] = fmt("'%s' (%s) is not in the checkpoint", name, shape)
    elseif table.concat(e.shape, ",") ~= shape then
      probs[#probs + 1] = fmt("'%s' has shape (%s) in the checkpoint but (%s) in the model", name,
        table.concat(e.shape, ","), shape)
    else todo[#todo + 1] = { name, p } end
  end
  for _, e in ipairs(r:params()) do
    -- (a DeepSpeed checkpoint's buffers and tied names need no parameter)
    if not used[e.name] and not e.buffer and not e.alias_of then
      probs[#probs + 1] = fmt("the checkpoint's '%s' is not in the model", e.name)
    end
  end
  if #probs > 0 then
    r:close()
    error(fmt("load_state_dict_from_zero_checkpoint: %s does not match the model: %s", r.tdir,
      table.concat(probs, "; ")), 2)
  end
  local ok, err = pcall(zr.no_grad, function()
    for _, t in ipairs(todo) do
      t[2]:copy_(r:get(t[1]))
      collectgarbage("step")
    end
  end)
  r:close()
  if not ok then error(err, 0) end
  return model
end

local USAGE = "usage: zrun zero-to-fp32 CHECKPOINT_DIR [--tag TAG] [--max_shard_size 5GB] [--exclude_frozen_parameters] " ..
  "[--safe_serialization] OUTPUT_DIR | OUTPUT.safetensors"

-- zrun zero-to-fp32 DIR [--tag T] OUT (args: a list of strings, or the strings themselves).
function M.main(args, ...)
  if type(args) ~= "table" then args = { args, ... } end
  local pos, tag, opts = {}, nil, {}
  local i = 1
  local function value(a, name)
    local v = a:match("^%-%-" .. name .. "=(.*)$") or args[i + 1]
    if not v then error(fmt("zero-to-fp32: --%s needs a value\n%s", name, USAGE), 0) end
    if not a:find("=", 1, true) then i = i + 1 end
    return v
  end
  while i <= #args do
    local a = args[i]
    if a == "-h" or a == "--help" then print(USAGE); return 0
    elseif a == "--tag" or a == "-t" or a:sub(1, 6) == "--tag=" then tag = value(a, "tag")
    elseif a == "--max_shard_size" or a:sub(1, 17) == "--max_shard_size=" then opts.max_shard_size = value(a, "max_shard_size")
    elseif a == "--exclude_frozen_parameters" then opts.exclude_frozen_parameters = true
    elseif a == "--safe_serialization" then -- (DeepSpeed's: safetensors instead of pickles; zrun writes nothing else)
    elseif a:sub(1, 1) == "-" and a ~= "-" then error(fmt("zero-to-fp32: unknown option '%s'\n%s", a, USAGE), 0)
    else pos[#pos + 1] = a end
    i = i + 1
  end
  if #pos ~= 2 then error("zero-to-fp32: expected a checkpoint directory and an output directory or file\n" .. USAGE, 0) end
  local dir, out = pos[1], pos[2]
  local n, total, mdt, nshards, kind = M.convert(dir, tag, out, opts)
  print(fmt("zero-to-fp32: wrote %d tensors (%d fp32 values%s) to %s%s%s", n, total,
    mdt ~= "f32" and ", widened from the checkpoint's " .. mdt .. " master" or "", out,
    out:match("%.safetensors$") and "" or (nshards > 1 and fmt(" (%d shards and model.safetensors.index.json)", nshards)
      or "/model.safetensors"), kind and " from " .. kind or ""))
  return 0
end

return M
