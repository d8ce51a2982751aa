-- The Hugging Face Trainer's own learning-rate schedules (TrainingArguments.lr_scheduler_type and
-- lr_scheduler_kwargs; used when the DeepSpeed config has no "scheduler" section): each group's lr
-- times a factor of the optimizer step, as transformers' get_scheduler builds them with LambdaLR
-- (transformers/optimization.py): the first optimizer step runs at factor(0), full lr without warmup.
-- Checked against transformers' own values (tests/golden/hf_schedules.json).
--
--   local s = require("zrun.schedulers_hf").new("cosine_with_min_lr", optimizer,
--     { num_warmup_steps = 10, num_training_steps = 100, kwargs = { min_lr = 1e-6 } })
--   s:step(); s:get_last_lr()
local S = require "zrun.schedulers"
local M = {}
local max, cos, pi, sqrt = math.max, math.cos, math.pi, math.sqrt
local fmt = string.format

local function warm(s, w) return s / max(1, w) end -- the linear warm-up all but two share
local function cosine(num_cycles, progress) return 0.5 * (1.0 + cos(pi * num_cycles * 2.0 * progress)) end
local function min_rate(k) -- cosine_with_min_lr's floor as a fraction of the initial lr (HF's rules)
  if k.min_lr ~= nil and k.min_lr_rate ~= nil then error("only one of min_lr or min_lr_rate should be set", 0) end
  if k.min_lr ~= nil then return k.min_lr / k.lr_init end
  if k.min_lr_rate == nil then error("one of min_lr or min_lr_rate should be set through lr_scheduler_kwargs", 0) end
  return k.min_lr_rate
end
local SHAPES = { linear = true, cosine = true, ["1-sqrt"] = true }

-- name -> { kw = the lr_scheduler_kwargs it takes (their defaults; false: none), prepare(k, w, t)
-- (checks, derived values), factor(s, w, t, k) }; `ignores`: transformers drops any kwargs
local SCHEDULES = {
  linear = { kw = {}, factor = function(s, w, t)
    if s < w then return warm(s, w) end
    return max(0.0, (t - s) / max(1, t - w))
  end },
  cosine = { kw = { num_cycles = 0.5 }, factor = function(s, w, t, k)
    if s < w then return warm(s, w) end
    return max(0.0, cosine(k.num_cycles, (s - w) / max(1, t - w)))
  end },
  cosine_with_restarts = { kw = { num_cycles = 1 }, factor = function(s, w, t, k)
    if s < w then return warm(s, w) end
    local progress = (s - w) / max(1, t - w)
    if progress >= 1.0 then return 0.0 end
    return max(0.0, 0.5 * (1.0 + cos(pi * ((k.num_cycles * progress) % 1.0))))
  end },
  polynomial = { kw = { lr_end = 1e-7, power = 1.0 },
    prepare = function(k)
      if not (k.lr_init > k.lr_end) then
        error(fmt("lr_end (%s) must be smaller than the initial lr (%s)", tostring(k.lr_end), tostring(k.lr_init)), 0)
      end
    end,
    factor = function(s, w, t, k)
      if s < w then return warm(s, w) end
      if s > t then return k.lr_end / k.lr_init end
      local pct_remaining = 1 - (s - w) / (t - w)
      return ((k.lr_init - k.lr_end) * pct_remaining ^ k.power + k.lr_end) / k.lr_init
    end },
  constant = { kw = {}, ignores = true, factor = function() return 1.0 end },
  constant_with_warmup = { kw = {}, ignores = true, factor = function(s, w)
    if s < w then return warm(s, w) end
    return 1.0
  end },
  inverse_sqrt = { kw = { timescale = false },
    prepare = function(k, w) if k.timescale == nil then k.timescale = w > 0 and w or 10000 end end,
    factor = function(s, w, _, k)
      if s < w then return warm(s, w) end
      return 1.0 / sqrt((s + k.timescale - w) / k.timescale)
    end },
  cosine_with_min_lr = { kw = { num_cycles = 0.5, min_lr = false, min_lr_rate = false },
    prepare = function(k) k.rate = min_rate(k) end,
    factor = function(s, w, t, k)
      if s < w then return warm(s, w) end
      return max(0, cosine(k.num_cycles, (s - w) / max(1, t - w)) * (1 - k.rate) + k.rate)
    end },
  cosine_warmup_with_min_lr = { kw = { num_cycles = 0.5, min_lr = false, min_lr_rate = false, warmup_lr_rate = false },
    prepare = function(k) k.rate = min_rate(k) end,
    factor = function(s, w, t, k)
      if s < w then
        if k.warmup_lr_rate == nil then return (s + 1.0) / max(1.0, w) end
        return k.warmup_lr_rate + (1.0 - k.warmup_lr_rate) * s / max(1, w - 1)
      end
      return max(0, cosine(k.num_cycles, (s - w + 1.0) / max(1.0, t - w)) * (1 - k.rate) + k.rate)
    end },
  warmup_stable_decay = { kw = { num_decay_steps = false, num_stable_steps = false, warmup_type = "linear",
      decay_type = "cosine", min_lr_ratio = 0, num_cycles = 0.5 },
    prepare = function(k, w, t)
      if k.num_decay_steps == nil then error("warmup_stable_decay needs num_decay_steps in lr_scheduler_kwargs", 0) end
      for _, n in ipairs { "warmup_type", "decay_type" } do
        if not SHAPES[k[n]] then
          error(fmt("%s must be \"linear\", \"cosine\" or \"1-sqrt\", got %s", n, tostring(k[n])), 0)
        end
      end
      if k.num_stable_steps == nil then k.num_stable_steps = t - w - k.num_decay_steps end
    end,
    factor = function(s, w, _, k)
      local r = k.min_lr_ratio
      if s < w then
        local p, f = s / max(1, w), nil
        if k.warmup_type == "linear" then f = p
        elseif k.warmup_type == "cosine" then f = 0.5 * (1.0 - cos(pi * p))
        else f = 1.0 - sqrt(1.0 - p) end
        return max(0.0, f * (1.0 - r) + r)
      end
      local stable_end = w + k.num_stable_steps
      if s < stable_end then return 1.0 end
      if s < stable_end + k.num_decay_steps then
        local p, f = (s - stable_end) / max(1, k.num_decay_steps), nil
        if k.decay_type == "linear" then f = 1.0 - p
        elseif k.decay_type == "cosine" then f = cosine(k.num_cycles, p)
        else f = 1.0 - sqrt(p) end
        return max(0.0, f * (1.0 - r) + r)
      end
      return r
    end },
}
-- transformers' types zrun's Trainer does not run, and why
local NOT_RUN = {
  reduce_lr_on_plateau = "it steps on evaluation metrics, not on optimizer steps",
  greedy = "it steps on the training loss's own history",
}

local function names()
  local out = {}
  for k in pairs(SCHEDULES) do out[#out + 1] = k end
  table.sort(out)
  return out
end
M.NAMES = names()

-- The kwargs table a schedule runs with: its defaults, then the user's (none where transformers drops
-- them), the initial lr, then its prepare() (checks, derived values) at warm-up w of t steps.
local function resolve(name, kwargs, lr_init, w, t)
  local sp, k = SCHEDULES[name], { lr_init = lr_init }
  for key, d in pairs(sp.kw) do k[key] = d ~= false and d or nil end
  if not sp.ignores then
    for key, v in pairs(kwargs or {}) do k[key] = v end
  end
  if sp.prepare then
    local ok, err = pcall(sp.prepare, k, w, t)
    if not ok then error(fmt("lr_scheduler_type %s: %s", name, tostring(err)), 0) end
  end
  return k
end

-- The schedule's spec after checking its name and the kwargs' names and types (errors in one line).
local function validate(name, kwargs)
  local sp = SCHEDULES[name]
  if not sp then
    if NOT_RUN[name] then error(fmt('lr_scheduler_type "%s" is not supported by zrun\'s Trainer: %s', name, NOT_RUN[name]), 0) end
    local s = require("zrun.config").suggest(tostring(name), M.NAMES)
    error(fmt('lr_scheduler_type must be one of %s, got "%s"%s', table.concat(M.NAMES, ", "), tostring(name),
      s and fmt('; did you mean "%s"?', s) or ""), 0)
  end
  if sp.ignores then return sp end
  if kwargs ~= nil and type(kwargs) ~= "table" then error(fmt("lr_scheduler_kwargs must be a table (a JSON object), got %s", type(kwargs)), 0) end
  local takes = {}
  for k in pairs(sp.kw) do takes[#takes + 1] = k end
  table.sort(takes)
  for k, v in pairs(kwargs or {}) do
    if sp.kw[k] == nil then
      error(fmt('lr_scheduler_kwargs: %s takes %s, not "%s"', name, #takes > 0 and table.concat(takes, ", ") or "none",
        tostring(k)), 0)
    end
    local want = type(sp.kw[k]) == "string" and "string" or "number"
    if type(v) ~= want then error(fmt("lr_scheduler_kwargs: %s must be a %s, got %s", k, want, tostring(v)), 0) end
  end
  return sp
end

-- Checks a lr_scheduler_type and its kwargs (a table or nil) the way transformers builds them, with
-- the initial lr when known (polynomial's lr_end must be below it); errors say what is wrong in one
-- line. Returns true.
function M.check(name, kwargs, lr_init)
  validate(name, kwargs)
  if name ~= "polynomial" or lr_init then resolve(name, kwargs, lr_init or 1, 0, 1) end
  return true
end

-- Whether transformers drops lr_scheduler_kwargs for this type (constant, constant_with_warmup).
function M.ignores_kwargs(name) return SCHEDULES[name] ~= nil and SCHEDULES[name].ignores == true end

local HFSchedule = setmetatable({}, { __index = S.Base })
HFSchedule.__index = HFSchedule
HFSchedule.kind = "HFSchedule"

-- new(name, optimizer, {num_warmup_steps=, num_training_steps=, kwargs=, lr=}): kwargs are
-- lr_scheduler_kwargs; the initial lr that polynomial and min_lr read is the first group's (HF:
-- the optimizer's default lr, the Trainer's learning_rate), or o.lr without an optimizer.
function M.new(name, optimizer, o)
  o = require("zrun.kwargs").check("schedulers.hf", o, { "num_warmup_steps", "num_training_steps", "kwargs", "lr" })
  local sp = validate(name, o.kwargs)
  local groups, n = S.groups_of(optimizer)
  local self = setmetatable({ name = name, optimizer = optimizer, param_groups = groups, base_lrs = {},
    warmup = o.num_warmup_steps or 0, total = o.num_training_steps, last_batch_iteration = 0 }, HFSchedule)
  for i = 1, n do self.base_lrs[i] = groups and groups[i].lr or o.lr end
  local k = resolve(name, o.kwargs, self.base_lrs[1], self.warmup, self.total)
  self.kw, self.factor = k, sp.factor
  self._last_lr = S.update_lr(self, self:get_lr())
  return self
end

function HFSchedule:get_lr()
  local f, out = self.factor(self.last_batch_iteration, self.warmup, self.total, self.kw), {}
  for i, lr in ipairs(self.base_lrs) do out[i] = lr * f end
  return out
end

return M
