-- engine:load_checkpoint from a DeepSpeed universal checkpoint (deepspeed/checkpoint/ds_to_universal.py's
-- output, what DeepSpeed's load_universal_checkpoint reads): <tag>/zero/<parameter name>/fp32.pt,
-- exp_avg.pt, exp_avg_sq.pt (each {"param": the whole tensor}) and step.pt, <tag>/zero/optimizer_state.pt
-- (param_groups, the loss scaler) and the model-states files (counters, schedule). M.files(tdir) gives
-- zrun.checkpoint's load the view of the files it reads its own through, as zrun.checkpoint_ds does.
-- Model- (tensor-) parallel slices are refused: zrun reads whole parameters.
local P = require "zrun.torch_pickle"
local tf = require "zrun.torch_file"
local hfck = require "zrun.checkpoint_hf"
local zr = require "zrun"
local C = zr._C

local M = {}
local fmt, ipairs, type = string.format, ipairs, type
local number = hfck.number

local join = require("zrun.checkpoint").join

-- Whether tag folder tdir is a universal checkpoint (a zero/ folder of per-parameter files).
function M.is_universal(tdir)
  return C.path_type(join(tdir, "zero/optimizer_state.pt")) == "file"
end

-- The tag a checkpoint folder's latest_universal names (ds_to_universal.py writes it), or nil.
function M.latest_tag(dir)
  if type(dir) ~= "string" or C.path_type(join(dir, "latest")) == "file" then return nil end
  local f = io.open(join(dir, "latest_universal"), "rb")
  if not f then return nil end
  local tag = (f:read("*a") or ""):match("^%s*(.-)%s*$")
  f:close()
  return tag ~= "" and tag or nil
end

-- The value a {"param": tensor, ...} file holds, or the file's value itself (step.pt), read now.
local function load_param(path)
  local obj, file = tf.load(path)
  file:close()
  if P.is_dict(obj) and obj.cat_dim ~= nil and obj.param_n_sub_params ~= nil then
    error(fmt("%s: a tensor-parallel parameter (cat_dim, sub-parameters): zrun reads whole parameters only", path), 0)
  end
  return P.is_dict(obj) and obj.param or obj
end

local Files = {}
Files.__index = Files

-- The files of universal tag folder tdir as zrun.checkpoint.load reads its own.
function M.files(tdir)
  local zdir = join(tdir, "zero")
  local self = setmetatable({ tdir = tdir, path0 = join(zdir, "optimizer_state.pt"), W = 1, by_name = {},
    kind = "DeepSpeed's universal checkpoint", reshard_note = false }, Files)
  local st = { optimizer = "adamw", states = { "master", "exp_avg", "exp_avg_sq" }, params = {}, world_size = 1,
    stage = 0, client_state = {} }
  for _, name in ipairs(C.listdir(zdir) or {}) do
    local fp = join(join(zdir, name), "fp32.pt")
    if C.path_type(fp) == "file" then
      local t = load_param(fp)
      if not P.is_tensor(t) then error(fmt("%s: holds %s, not {\"param\": tensor}", fp, P.repr(t)), 0) end
      -- (a ZeRO-3 checkpoint's conversion keeps each parameter flat, as its partitions were)
      local e = { name = name, shape = t.shape, numel = t:numel(), dir = join(zdir, name), flat = #t.shape == 1 }
      e.chunk = math.max(e.numel, 1)
      st.params[#st.params + 1] = e
      self.by_name[name] = e
      if not st.opt_steps and C.path_type(join(e.dir, "step.pt")) == "file" then
        st.opt_steps = number(load_param(join(e.dir, "step.pt")))
      end
    end
  end
  if #st.params == 0 then error(fmt("%s: no <parameter>/fp32.pt files (an incomplete universal checkpoint)", zdir), 0) end
  local first = st.params[1]
  for _, which in ipairs({ "exp_avg", "exp_avg_sq" }) do
    if C.path_type(join(first.dir, which .. ".pt")) ~= "file" then
      st.optimizer, st.states = "unknown (no " .. which .. ".pt)", { "master" }
    end
  end
  local osd, of = tf.load(self.path0)
  of:close()
  if P.is_dict(osd) and P.is_list(osd.param_groups) then
    st.param_groups = {}
    for i, g in ipairs(osd.param_groups) do st.param_groups[i] = { lr = number(g.lr), weight_decay = number(g.weight_decay) } end
  end
  -- the counters and schedule: the model-states file ds_to_universal copied
  for _, n in ipairs(C.listdir(tdir) or {}) do
    if n:find("model_states%.pt$") and (n == "mp_rank_00_model_states.pt" or n:find("^zero_pp_rank_0_")) then
      local ms, mf = tf.load(join(tdir, n))
      mf:close()
      st.global_steps = number(ms.global_steps)
      st.skipped_steps = number(ms.skipped_steps) or 0
      st.lr_scheduler = hfck.schedule_of(ms.lr_scheduler, join(tdir, n))
      break
    end
  end
  st.global_steps = st.global_steps or st.opt_steps or 0
  st.opt_steps = st.opt_steps or st.global_steps
  self.st = { [0] = st }
  return self
end

function Files:get() return nil, self.st[0] end
function Files:close() end

-- Elements [lo, hi) of parameter `name`'s state `which` into the views dst_fn(at, len) returns.
function Files:read_range(name, which, lo, hi, dst_fn)
  local e = self.by_name[name]
  local path = join(e.dir, (which == "master" and "fp32" or which) .. ".pt")
  local t = load_param(path)
  if not P.is_tensor(t) or t:numel() ~= e.numel then
    error(fmt("%s: holds %s, not a tensor of %d values like fp32.pt", path, P.repr(t), e.numel), 0)
  end
  dst_fn(0, hi - lo):copy_(t:read(lo, hi - lo, { dtype = "f32" }))
end

return M
