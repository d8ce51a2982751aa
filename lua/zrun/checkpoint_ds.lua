-- engine:load_checkpoint from DeepSpeed's own ZeRO checkpoints (torch pickles): a run trained
-- with DeepSpeed continues in zrun with its weights (the fp32 master), its Adam moments, step
-- counts, learning-rate schedule, loss scale and client state, on any number of ranks and any ZeRO
-- stage (zrun reshards as it does its own checkpoints). M.files(tdir) gives zrun.checkpoint's load
-- the view of the files it reads its own through (by_name, st[0], read_range); the layouts are
-- zrun.zero_to_fp32_ds's.
local P = require "zrun.torch_pickle"
local ds = require "zrun.zero_to_fp32_ds"
local hfck = require "zrun.checkpoint_hf"
local tf = require "zrun.torch_file"

local M = {}
local fmt, ipairs, type, pairs = string.format, ipairs, type, pairs

M.is_deepspeed = ds.is_deepspeed

-- A pickled value as plain Lua (tensors read; one that cannot be read is left out).
local function plain(v)
  local ok, out = pcall(tf.to_lua, v)
  return ok and out or nil
end

local number = hfck.number

-- The optimizer's step count (Adam's bias correction) as DeepSpeed's optimizers keep it.
local function opt_step(r)
  local o = r.osd[1]
  local b = r.stage <= 2 and o.base_optimizer_state or o.optimizer_state_dict
  -- an elastic checkpoint: per-group states, and param_groups[0]["step"] beside them (0 with
  -- FusedAdam, which counts in each state)
  if P.is_list(b) then
    local s = P.is_dict(b[1]) and number(b[1].step)
    if s then return s end
    return number(o.base_optimizer_state_step)
  end
  if P.is_dict(b) then
    -- DeepSpeed's FusedAdam counts in the state of the last parameter of each group it stepped (its
    -- other states keep the count they started with): the largest count is the step
    local best
    if P.is_dict(b.state) then
      for _, k in ipairs(P.keys(b.state)) do
        local st = b.state[k]
        local s = P.is_dict(st) and number(st.step)
        if s and (not best or s > best) then best = s end
      end
    end
    if best then return best end
    if P.is_list(b.param_groups) and P.is_dict(b.param_groups[1]) then return number(b.param_groups[1].step) end
  end
  return nil
end

local function param_groups(r)
  local o = r.osd[1]
  local b = r.stage <= 2 and o.base_optimizer_state or o.optimizer_state_dict
  if not (P.is_dict(b) and P.is_list(b.param_groups)) then return nil end
  local out = {}
  for i, g in ipairs(b.param_groups) do
    out[i] = { lr = number(g.lr), weight_decay = number(g.weight_decay) }
  end
  return out
end

-- The keys DeepSpeed writes into the model-states file itself; the rest is the caller's
-- client_state (engine.py's load_checkpoint returns the others too; zrun only the caller's).
local OWN = {}
for _, k in ipairs({ "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
  "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
  "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
  "universal_checkpoint_info", "checkpoint_parallel_dims", "ds_autotp_universal_checkpoint_meta" }) do OWN[k] = true end

local Files = {}
Files.__index = Files

-- The files of DeepSpeed tag folder tdir as zrun.checkpoint.load reads its own (see M.files there),
-- for engine's model.
function M.files(tdir, engine)
  local r = ds.open(tdir, { model = engine and engine.module })
  local ok, self = pcall(function()
    local m0 = r.model0
    local st = { optimizer = "adamw", states = { "master", "exp_avg", "exp_avg_sq" }, params = {},
      world_size = r.world, stage = r.stage, client_state = {} }
    local by_name = {}
    for _, e in ipairs(r:params()) do
      if not (e.buffer or e.alias_of or e.frozen) then
        st.params[#st.params + 1] = { name = e.name, shape = e.shape, numel = e.numel }
        by_name[e.name] = { name = e.name, shape = e.shape, numel = e.numel, chunk = math.max(e.numel, 1), entry = e }
      end
    end
    -- the optimizer's moments must be Adam's: the first trainable parameter's first rank tells
    local first = st.params[1] and by_name[st.params[1].name].entry
    if first then
      for _, which in ipairs({ "exp_avg", "exp_avg_sq" }) do
        local okk = pcall(r.read_range, r, first, which, 0, math.min(1, first.numel), function() end)
        if not okk then st.optimizer, st.states = "unknown (no " .. which .. ")", { "master" } end
      end
    end
    st.global_steps = number(m0.global_steps) or 0
    st.skipped_steps = number(m0.skipped_steps) or 0
    st.opt_steps = opt_step(r) or (st.global_steps - st.skipped_steps)
    local cfg = m0.ds_config
    local gas = P.is_dict(cfg) and number(cfg.gradient_accumulation_steps) or 1
    st.micro_steps = st.global_steps * gas
    st.param_groups = param_groups(r)
    st.lr_scheduler = hfck.schedule_of(m0.lr_scheduler, tdir)
    -- transformers' Trainer keeps its own schedule (a torch LambdaLR) beside the engine's checkpoint,
    -- in checkpoint-<step>/scheduler.pt, when the DeepSpeed config has none
    if not st.lr_scheduler then
      st.lr_scheduler = hfck.scheduler_state((tdir:gsub("/+$", ""):match("^(.*)/[^/]+$") or ".") .. "/scheduler.pt")
    end
    -- fp16's dynamic scaler, its fields in ZeRO's DynamicLossScaler object or (FP16_Optimizer, without
    -- ZeRO) in the optimizer's own state; a bf16 or fp32 run keeps a static scale of 1, nothing to carry over
    local o1 = r.osd[1]
    local sc = o1.loss_scaler
    local s = P.is_object(sc) and sc.class:find("DynamicLossScaler", 1, true) and sc.state
      or o1.dynamic_loss_scale == true and o1 or nil
    if P.is_dict(s) and number(s.cur_scale) then
      st.loss_scaler = { scale = number(s.cur_scale), cur_hysteresis = number(s.cur_hysteresis) }
      local it, last, win = number(s.cur_iter), number(s.last_overflow_iter), number(s.scale_window)
      if it and last and win and win > 0 then st.loss_scaler.good = (it - last - 1) % win end
    end
    if P.is_dict(m0) then
      for _, k in ipairs(P.keys(m0)) do
        if not OWN[k] then st.client_state[k] = plain(m0[k]) end
      end
    end
    return setmetatable({ tdir = tdir, reader = r, by_name = by_name, st = { [0] = st }, W = r.world,
      path0 = r.where[1], kind = r.kind }, Files)
  end)
  if not ok then r:close(); error(self, 0) end
  return self
end

function Files:get() return nil, self.st[0] end
function Files:close() self.reader:close() end

-- Elements [lo, hi) of parameter `name`'s state `which` into the views dst_fn(at, len) returns.
function Files:read_range(name, which, lo, hi, dst_fn)
  self.reader:read_range(self.by_name[name].entry, which, lo, hi, function(at, t)
    dst_fn(at, t:numel()):copy_(t)
  end)
end

return M
