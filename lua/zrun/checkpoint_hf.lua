-- engine:load_checkpoint (and the Trainer's resume_from_checkpoint) from a transformers Trainer
-- checkpoint written without DeepSpeed: checkpoint-<step>/ with the model (model.safetensors or
-- pytorch_model.bin), optimizer.pt (torch AdamW's state_dict), scheduler.pt and
-- trainer_state.json. M.files(dir, engine) gives zrun.checkpoint's load the view of the files it
-- reads its own through (by_name, st[0], read_range), as zrun.checkpoint_ds does for DeepSpeed's.
--
-- optimizer.pt numbers the parameters through the Trainer's groups (get_decay_parameter_names):
-- those that decay, then biases and norm weights, each in named_parameters' order; zrun's Trainer
-- groups a model the same way (Trainer.param_groups), and each saved moment must have its
-- parameter's size, or the checkpoint is refused as another model's.
local P = require "zrun.torch_pickle"
local tf = require "zrun.torch_file"
local zr = require "zrun"
local C = zr._C

local M = {}
local fmt, ipairs, type, concat = string.format, ipairs, type, table.concat

local join = require("zrun.checkpoint").join
-- (a constant, not a literal in the parameter loop below: LuaJIT issue #994, see memory_sim.lua's LAYER_MODULES)
local ADAM_STATES = { "exp_avg", "exp_avg_sq" }

-- Whether dir is a transformers Trainer checkpoint without DeepSpeed's files (optimizer.pt, no latest).
function M.is_hf(dir)
  return type(dir) == "string" and C.path_type(join(dir, "optimizer.pt")) == "file"
    and C.path_type(join(dir, "latest")) ~= "file"
end

local function number(v)
  v = P.value(v)
  if P.is_tensor(v) then
    local ok, t = pcall(v.get, v, { dtype = "f64" })
    return ok and t:numel() == 1 and t:item() or nil
  end
  return type(v) == "number" and v or nil
end
M.number = number

-- A saved schedule's state as zrun's (a table with last_batch_iteration), or nil (none saved):
-- DeepSpeed's own schedules (last_batch_iteration, ...: taken whole), or a torch LR scheduler's state
-- (last_epoch: the transformers Trainer's LambdaLR, in scheduler.pt or handed to DeepSpeed, which then
-- saves it in the model-states file). `where` names the file in the error.
function M.schedule_of(sd, where)
  if sd == nil or sd == P.None then return nil end
  if P.is_dict(sd) and number(sd.last_batch_iteration) then return tf.to_lua(sd) end
  local last = P.is_dict(sd) and number(sd.last_epoch)
  if not last then
    error(fmt("%s: the LR scheduler's state is %s (neither last_batch_iteration nor last_epoch)", where, P.repr(sd)), 0)
  end
  return { last_batch_iteration = last }
end

-- The position of a transformers LambdaLR (checkpoint-<step>/scheduler.pt) as zrun's schedule state, or nil.
function M.scheduler_state(path)
  if C.path_type(path) ~= "file" then return nil end
  local sd, f = tf.load(path)
  f:close()
  return M.schedule_of(sd, path)
end

local Files = {}
Files.__index = Files

-- The files of checkpoint folder dir as zrun.checkpoint.load reads its own, for engine's model.
function M.files(dir, engine)
  local opath = join(dir, "optimizer.pt")
  local sd, ofile = tf.load(opath)
  local self = setmetatable({ tdir = dir, path0 = opath, W = 1, by_name = {}, handles = { ofile } }, Files)
  local ok, err = pcall(function()
    if not (P.is_dict(sd) and P.is_dict(sd.state) and P.is_list(sd.param_groups)) then
      error(fmt("%s: holds %s, not a torch optimizer's state_dict (state, param_groups)", opath, P.repr(sd)), 0)
    end
    -- the model's weights: the master
    local hf = require "zrun.hf"
    local files, map = hf.weight_files(dir)
    local wfile = {}
    for _, p in ipairs(files) do
      local h = hf.open_weight_file(p)
      self.handles[#self.handles + 1] = h
      for _, n in ipairs(h:keys()) do if not map or map[n] == p then wfile[n] = h end end
    end
    -- HF's groups of this model, and the saved numbering through them
    local names = {}
    for n, p in engine.module:named_parameters() do names[p] = names[p] or n end
    local groups = require("zrun.trainer").param_groups(engine.module, 0)
    if #groups ~= #sd.param_groups then
      error(fmt("%s: %d parameter groups, but the Trainer groups this model in %d (weights that decay; biases and "
        .. "norms): a checkpoint of another model or optimizer setup", opath, #sd.param_groups, #groups), 0)
    end
    local st = { optimizer = "adamw", states = { "master", "exp_avg", "exp_avg_sq" }, params = {}, world_size = 1,
      stage = 0, client_state = {}, param_groups = {} }
    for g, grp in ipairs(groups) do
      local saved = sd.param_groups[g]
      local idx = P.is_dict(saved) and saved.params
      if not P.is_list(idx) or #idx ~= #grp.params then
        error(fmt("%s: group %d lists %s parameters, but the Trainer's group %d of this model has %d (a checkpoint "
          .. "of another model)", opath, g - 1, P.is_list(idx) and tostring(#idx) or "no", g - 1, #grp.params), 0)
      end
      st.param_groups[g] = { lr = number(saved.lr), weight_decay = number(saved.weight_decay) }
      for j, p in ipairs(grp.params) do
        local name, k = names[p], idx[j]
        local shape = p:shape()
        local numel = p:numel()
        local s = sd.state[k]
        if P.is_dict(s) then
          for _, which in ipairs(ADAM_STATES) do
            local t = s[which]
            if not P.is_tensor(t) then
              error(fmt("%s: parameter %s (%s) has no %s: not Adam's state", opath, tostring(k), name, which), 0)
            end
            if t:numel() ~= numel then
              error(fmt("%s: parameter %s's %s has %d values, but %s (%s) has %d: a checkpoint of another model",
                opath, tostring(k), which, t:numel(), name, concat(shape, "x"), numel), 0)
            end
          end
          st.opt_steps = st.opt_steps or number(s.step)
        end
        if not wfile[name] then error(fmt("%s: the model's weights have no '%s'", dir, name), 0) end
        st.params[#st.params + 1] = { name = name, shape = shape, numel = numel }
        self.by_name[name] = { name = name, shape = shape, numel = numel, chunk = math.max(numel, 1),
          state = P.is_dict(s) and s or nil, weights = wfile[name] }
      end
    end
    st.opt_steps = st.opt_steps or 0
    local ts = join(dir, "trainer_state.json")
    if C.path_type(ts) == "file" then
      local tstate = require("zrun.trainer_checkpoint").read_state(dir)
      st.global_steps = tstate.global_step
    end
    st.global_steps = st.global_steps or st.opt_steps
    st.lr_scheduler = M.scheduler_state(join(dir, "scheduler.pt"))
    self.st = { [0] = st }
  end)
  if not ok then self:close(); error(err, 0) end
  self.kind = "a transformers Trainer checkpoint (optimizer.pt)"
  self.reshard_note = false -- (one process's whole state: nothing was partitioned)
  return self
end

function Files:get() return nil, self.st[0] end
function Files:close()
  for _, h in ipairs(self.handles) do h:close() end
  self.handles = {}
end

-- Elements [lo, hi) of parameter `name`'s state `which` into the views dst_fn(at, len) returns.
function Files:read_range(name, which, lo, hi, dst_fn)
  local e = self.by_name[name]
  local dst = dst_fn(0, hi - lo)
  if which == "master" then
    local w = e.weights:get(name, { dtype = "f32" })
    dst:copy_(w:reshape({ e.numel }):narrow(1, lo + 1, hi - lo))
  elseif e.state then
    dst:copy_(e.state[which]:read(lo, hi - lo, { dtype = "f32" }))
  else
    dst:zero_() -- (a parameter the optimizer never stepped: no state yet)
  end
end

return M
