-- Learning-rate schedulers with DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py): WarmupLR,
-- WarmupDecayLR, WarmupCosineLR, OneCycle and LRRangeTest. Each is stepped once per optimizer step and
-- writes group.lr into the optimizer's param_groups; without an optimizer it only computes values.
-- Also the Hugging Face Trainer's own schedules (schedulers.hf, in zrun.schedulers_hf).
--
--   local sched = schedulers.WarmupDecayLR.new(optimizer, { total_num_steps = 100, warmup_num_steps = 10 })
--   sched:step(); sched:get_last_lr()   --> { lr of group 1, ... }
local M = {}
local floor, log, cos, pi, max, min = math.floor, math.log, math.cos, math.pi, math.max, math.min
local fmt = string.format

-- The constructor arguments of each schedule, with DeepSpeed's defaults. A value `false` marks an
-- argument that is required (or, for nullable ones, absent means "derived from another").
local PARAMS = {
  WarmupLR = { warmup_min_lr = 0.0, warmup_max_lr = false, warmup_num_steps = 1000, warmup_type = "log",
    last_batch_iteration = -1 },
  WarmupDecayLR = { total_num_steps = false, warmup_min_lr = 0.0, warmup_max_lr = 0.001, warmup_num_steps = 1000,
    warmup_type = "log", last_batch_iteration = -1 },
  WarmupCosineLR = { total_num_steps = false, warmup_min_ratio = 0.0, warmup_num_steps = 1000,
    cos_min_ratio = 0.0001, warmup_type = "log", last_batch_iteration = -1, lr = false },
  OneCycle = { cycle_min_lr = false, cycle_max_lr = false, decay_lr_rate = 0.0, cycle_first_step_size = 2000,
    cycle_second_step_size = false, cycle_first_stair_count = 0, cycle_second_stair_count = false,
    decay_step_size = 0, cycle_momentum = true, cycle_min_mom = 0.8, cycle_max_mom = 0.9, decay_mom_rate = 0.0,
    last_batch_iteration = -1 },
  LRRangeTest = { lr_range_test_min_lr = 1e-3, lr_range_test_step_size = 2000, lr_range_test_step_rate = 1.0,
    lr_range_test_staircase = false, last_batch_iteration = -1 },
}
M.PARAMS = PARAMS

-- Merges params over the defaults; unknown names and leftover "auto" are errors.
local function read_params(kind, params)
  local spec, out = PARAMS[kind], {}
  local names = {}
  for k in pairs(spec) do names[#names + 1] = k end
  table.sort(names)
  for k, v in pairs(params or {}) do
    if spec[k] == nil then
      local s = require("zrun.config").suggest(tostring(k), names)
      error(fmt('%s: unknown parameter "%s"%s', kind, tostring(k), s and fmt('; did you mean "%s"?', s) or ""), 0)
    end
    if v == "auto" then
      error(fmt('%s: %s is still "auto"; resolve it with config.load(..., {args=...}) or config.finalize', kind, k), 0)
    end
    out[k] = v
  end
  for k, d in pairs(spec) do
    if out[k] == nil and d ~= false then out[k] = d end
  end
  return out
end

local function require_param(kind, p, name)
  if p[name] == nil then error(fmt("%s: %s is required", kind, name), 0) end
end

-- Optimizer groups (tables with .lr), or one virtual group when there is no optimizer.
local function groups_of(optimizer)
  if optimizer == nil then return nil, 1 end
  local g = optimizer.param_groups
  if type(g) ~= "table" or #g == 0 then error("scheduler: the optimizer has no param_groups", 0) end
  return g, #g
end

-- A number, or a list with one value per group.
local function per_group(kind, v, n, name)
  if type(v) == "table" then
    if #v ~= n then error(fmt("%s: expected %d values for %s (one per param group), got %d", kind, n, name, #v), 0) end
    local out = {}
    for i = 1, n do out[i] = v[i] end
    return out
  end
  local out = {}
  for i = 1, n do out[i] = v end
  return out
end

-- Writes lrs into the groups; returns the list now in effect.
local function update_lr(self, lrs)
  if self.param_groups then
    for i, g in ipairs(self.param_groups) do g.lr = lrs[i] end
  end
  local out = {}
  for i = 1, #lrs do out[i] = lrs[i] end
  return out
end

local Base = {}
Base.__index = Base

-- Advances to batch_iteration (default: the next) and updates the optimizer.
function Base:step(batch_iteration)
  if batch_iteration == nil then batch_iteration = self.last_batch_iteration + 1 end
  self.last_batch_iteration = batch_iteration
  self._last_lr = update_lr(self, self:get_lr())
end

function Base:get_last_lr()
  if self._last_lr == nil then error(self.kind .. ": need to call step() first", 2) end
  return self._last_lr
end

function Base:state_dict() return { last_batch_iteration = self.last_batch_iteration } end

function Base:load_state_dict(sd) self.last_batch_iteration = sd.last_batch_iteration end

local function class(kind)
  local c = setmetatable({}, { __index = Base })
  c.__index = c
  c.kind = kind
  M[kind] = c
  return c
end

-- Warmup gamma shared by WarmupLR/WarmupDecayLR/WarmupCosineLR: log(it+1)/log(n) or it/n.
local function warmup_gamma(self)
  if self.warmup_type == "log" then return self.inverse_log_warm_up * log(self.last_batch_iteration + 1) end
  return self.last_batch_iteration / self.warmup_num_steps
end

local function init_warmup(self, kind, p)
  local n = p.warmup_num_steps
  if type(n) ~= "number" or floor(n) ~= n or n < 0 then
    error(fmt("%s: warmup_num_steps must be a non-negative integer, got %s", kind, tostring(n)), 0)
  end
  if p.warmup_type ~= "log" and p.warmup_type ~= "linear" then
    error(fmt('%s: warmup_type must be "log" or "linear", got "%s"', kind, tostring(p.warmup_type)), 0)
  end
  self.warmup_num_steps = max(2, n) -- as DeepSpeed: log warmup needs log(n) > 0
  self.warmup_type = p.warmup_type
  self.inverse_log_warm_up = 1.0 / log(self.warmup_num_steps)
end

-- WarmupLR: min_lr + (max_lr - min_lr) × gamma, gamma rising to 1 over warmup_num_steps, then 1.
local WarmupLR = class("WarmupLR")

local function warmup_new(c, optimizer, params, kind)
  local self = setmetatable({}, c)
  local p = read_params(kind, params)
  if kind == "WarmupDecayLR" then require_param(kind, p, "total_num_steps") end
  local groups, n = groups_of(optimizer)
  self.optimizer, self.param_groups = optimizer, groups
  if p.warmup_max_lr == nil then -- (WarmupLR's default: each group's own lr, as DeepSpeed's None)
    if groups then
      p.warmup_max_lr = {}
      for i, g in ipairs(groups) do p.warmup_max_lr[i] = g.lr end
    else
      p.warmup_max_lr = 0.001
    end
  end
  self.min_lrs = per_group(kind, p.warmup_min_lr, n, "warmup_min_lr")
  self.max_lrs = per_group(kind, p.warmup_max_lr, n, "warmup_max_lr")
  self.delta_lrs = {}
  for i = 1, n do self.delta_lrs[i] = self.max_lrs[i] - self.min_lrs[i] end
  init_warmup(self, kind, p)
  self.total_num_steps = p.total_num_steps
  self.last_batch_iteration = p.last_batch_iteration
  if self.last_batch_iteration == -1 then self._last_lr = update_lr(self, self:get_lr()) end
  return self
end

function WarmupLR.new(optimizer, params) return warmup_new(WarmupLR, optimizer, params, "WarmupLR") end

function WarmupLR:_get_gamma()
  if self.last_batch_iteration < self.warmup_num_steps then return warmup_gamma(self) end
  return 1.0
end

function WarmupLR:get_lr()
  if self.last_batch_iteration < 0 then return self.min_lrs end
  local gamma, out = self:_get_gamma(), {}
  for i = 1, #self.min_lrs do out[i] = self.min_lrs[i] + self.delta_lrs[i] * gamma end
  return out
end

-- WarmupDecayLR: WarmupLR, then linear decay to 0 at total_num_steps.
local WarmupDecayLR = class("WarmupDecayLR")
WarmupDecayLR.get_lr = WarmupLR.get_lr

function WarmupDecayLR.new(optimizer, params)
  return warmup_new(WarmupDecayLR, optimizer, params, "WarmupDecayLR")
end

function WarmupDecayLR:_get_gamma()
  if self.last_batch_iteration < self.warmup_num_steps then return warmup_gamma(self) end
  return max(0.0, (self.total_num_steps - self.last_batch_iteration) /
    max(1.0, self.total_num_steps - self.warmup_num_steps))
end

-- WarmupCosineLR: a ratio of each group's own lr: warmup from warmup_min_ratio to 1, then a half
-- cosine down to cos_min_ratio at total_num_steps (held there after).
local WarmupCosineLR = class("WarmupCosineLR")

function WarmupCosineLR.new(optimizer, params)
  local kind = "WarmupCosineLR"
  local self = setmetatable({}, WarmupCosineLR)
  local p = read_params(kind, params)
  require_param(kind, p, "total_num_steps")
  local groups, n = groups_of(optimizer)
  self.optimizer, self.param_groups = optimizer, groups
  self.total_num_steps = p.total_num_steps
  self.last_batch_iteration = p.last_batch_iteration
  self.cos_min_ratio = p.cos_min_ratio
  self.warmup_min_ratio = p.warmup_min_ratio
  init_warmup(self, kind, p)
  self.org_lrs = {}
  if groups then
    for i, g in ipairs(groups) do self.org_lrs[i] = g.lr end
  elseif p.lr then -- zrun: the peak lr when there is no optimizer to read it from
    self.org_lrs = per_group(kind, p.lr, n, "lr")
  else
    error("WarmupCosineLR: needs an optimizer (its groups' lr is the peak) or params.lr", 2)
  end
  if self.last_batch_iteration == -1 then self._last_lr = update_lr(self, self:get_lr()) end
  return self
end

function WarmupCosineLR:get_lr_ratio()
  local it = self.last_batch_iteration
  if it < 0 then return 0.0 end
  if it < self.warmup_num_steps then
    local ratio = warmup_gamma(self)
    return self.warmup_min_ratio + ratio * (1.0 - self.warmup_min_ratio)
  end
  local real_last_step = it - self.warmup_num_steps + 1
  local real_total_steps = max(1, self.total_num_steps - self.warmup_num_steps)
  local progress = min(1.0, real_last_step / real_total_steps)
  local ratio = (1 + cos(pi * progress)) / 2
  return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * ratio)
end

function WarmupCosineLR:get_lr()
  local out = {}
  if self.last_batch_iteration < 0 then
    for i = 1, #self.org_lrs do out[i] = 0.0 end
    return out
  end
  local r = self:get_lr_ratio()
  for i, lr in ipairs(self.org_lrs) do out[i] = lr * r end
  return out
end

-- OneCycle: lr rises from cycle_min_lr to cycle_max_lr over cycle_first_step_size steps, falls back
-- over cycle_second_step_size, then decays as min_lr / (1 + decay_lr_rate × k / decay_step_size).
-- Momentum (beta1) moves the opposite way when the optimizer has betas.
local OneCycle = class("OneCycle")

function OneCycle.new(optimizer, params)
  local kind = "OneCycle"
  local self = setmetatable({}, OneCycle)
  local p = read_params(kind, params)
  require_param(kind, p, "cycle_min_lr")
  require_param(kind, p, "cycle_max_lr")
  local groups, n = groups_of(optimizer)
  self.optimizer, self.param_groups = optimizer, groups
  -- cycle shape
  local first = p.cycle_first_step_size
  local second = p.cycle_second_step_size or first
  self.total_size = first + second
  self.step_ratio = first / self.total_size
  self.first_step_size, self.second_step_size = first, second
  self.first_stair_count = p.cycle_first_stair_count
  self.second_stair_count = p.cycle_second_stair_count or p.cycle_first_stair_count
  self.decay_step_size = p.decay_step_size
  self.skip_lr_decay = self.decay_step_size == 0
  self.skip_mom_decay = self.decay_step_size == 0
  -- lr
  self.min_lrs = per_group(kind, p.cycle_min_lr, n, "cycle_min_lr") -- (a number, or one a group: DeepSpeed's _format_param)
  self.max_lrs = per_group(kind, p.cycle_max_lr, n, "cycle_max_lr")
  if p.last_batch_iteration == -1 and groups then
    for i, g in ipairs(groups) do g.lr = self.min_lrs[i] end
  end
  self.decay_lr_rate = p.decay_lr_rate
  if self.decay_lr_rate == 0 then self.skip_lr_decay = true end
  -- momentum: DeepSpeed cycles beta1 and pins beta2 to 0.99, only for optimizers with betas
  self.cycle_momentum = p.cycle_momentum
  local has_betas = groups and (groups[1].betas ~= nil or (optimizer.defaults and optimizer.defaults.betas ~= nil))
  if self.cycle_momentum and not has_betas then self.cycle_momentum = false end
  if self.cycle_momentum then
    self.decay_mom_rate = p.decay_mom_rate
    local lo, hi = per_group(kind, p.cycle_min_mom, n, "cycle_min_mom"), per_group(kind, p.cycle_max_mom, n, "cycle_max_mom")
    self.min_moms, self.max_moms = {}, {}
    for i = 1, n do self.min_moms[i], self.max_moms[i] = { lo[i], 0.99 }, { hi[i], 0.99 } end
    if p.last_batch_iteration == -1 then
      for i, g in ipairs(groups) do g.betas = { self.min_moms[i][1], 0.99 } end
    end
    if self.decay_mom_rate == 0 then self.skip_mom_decay = true end
  end
  self.last_batch_iteration = p.last_batch_iteration
  return self
end

function OneCycle:_get_scale_factor()
  local batch_iteration = self.last_batch_iteration + 1
  local cycle = floor(1 + batch_iteration / self.total_size)
  local x = 1.0 + batch_iteration / self.total_size - cycle
  local scale_factor, stair_count
  if x <= self.step_ratio then
    scale_factor, stair_count = x / self.step_ratio, self.first_stair_count
  else
    scale_factor, stair_count = (x - 1) / (self.step_ratio - 1), self.second_stair_count
  end
  -- Stairs hold lr flat for spans of each half cycle; quantised from the integer offset so that an
  -- exact stair is not lost to rounding of the float scale.
  if stair_count > 0 then
    local ci = batch_iteration % self.total_size
    local pos
    if ci <= self.first_step_size then pos = ci * stair_count / self.first_step_size
    else pos = (self.total_size - ci) * stair_count / self.second_step_size end
    scale_factor = floor(pos) / stair_count
  end
  return scale_factor
end

function OneCycle:get_lr()
  local out = {}
  if self.last_batch_iteration < self.total_size then
    local s = self:_get_scale_factor()
    for i = 1, #self.min_lrs do out[i] = self.min_lrs[i] + (self.max_lrs[i] - self.min_lrs[i]) * s end
    return out
  end
  if self.skip_lr_decay then
    for i = 1, #self.min_lrs do out[i] = self.min_lrs[i] end
    return out
  end
  local interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
  for i = 1, #self.min_lrs do out[i] = self.min_lrs[i] / (1 + self.decay_lr_rate * interval) end
  return out
end

-- Per group {beta1, beta2}, or nil when momentum is not cycled.
function OneCycle:get_mom()
  if not self.cycle_momentum then return nil end
  local out = {}
  if self.last_batch_iteration < self.total_size then
    local s = self:_get_scale_factor()
    for i = 1, #self.min_moms do
      local lo, hi = self.min_moms[i][1], self.max_moms[i][1]
      out[i] = { hi - (hi - lo) * s, self.min_moms[i][2] }
    end
    return out
  end
  if self.skip_mom_decay then
    for i = 1, #self.max_moms do out[i] = { self.max_moms[i][1], self.max_moms[i][2] } end
    return out
  end
  local interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
  for i = 1, #self.max_moms do
    out[i] = { self.max_moms[i][1] * (1 + self.decay_mom_rate * interval), self.max_moms[i][2] }
  end
  return out
end

function OneCycle:step(batch_iteration)
  Base.step(self, batch_iteration)
  if self.cycle_momentum then
    for i, m in ipairs(self:get_mom()) do self.param_groups[i].betas = m end
  end
end

-- (restored: the param groups' momentum for the restored iteration, as DeepSpeed's optimizer state holds it)
function OneCycle:load_state_dict(sd)
  Base.load_state_dict(self, sd)
  if self.cycle_momentum and self.last_batch_iteration >= 0 then
    for i, m in ipairs(self:get_mom()) do self.param_groups[i].betas = m end
  end
end

-- LRRangeTest: min_lr × (1 + step_rate × interval), interval = (it+1)/step_size (floored if staircase).
local LRRangeTest = class("LRRangeTest")

function LRRangeTest.new(optimizer, params)
  local kind = "LRRangeTest"
  local self = setmetatable({}, LRRangeTest)
  local p = read_params(kind, params)
  local groups, n = groups_of(optimizer)
  self.optimizer, self.param_groups = optimizer, groups
  self.min_lr = per_group(kind, p.lr_range_test_min_lr, n, "lr_range_test_min_lr")
  self.step_size = p.lr_range_test_step_size
  self.step_rate = p.lr_range_test_step_rate
  self.staircase = p.lr_range_test_staircase
  self.last_batch_iteration = p.last_batch_iteration
  if self.last_batch_iteration == -1 then self._last_lr = update_lr(self, self.min_lr) end
  return self
end

function LRRangeTest:get_lr()
  local interval = (self.last_batch_iteration + 1) / self.step_size
  if self.staircase then interval = floor(interval) end
  local inc, out = 1 + self.step_rate * interval, {}
  for i, lr in ipairs(self.min_lr) do out[i] = lr * inc end
  return out
end

-- Builds the scheduler a config's "scheduler" section names ({type=, params=}), or nil when none.
-- For WarmupCosineLR without an optimizer, params.lr may give the peak.
function M.new(kind, optimizer, params)
  local c = PARAMS[kind] and M[kind]
  if not c then
    local names = {}
    for k in pairs(PARAMS) do names[#names + 1] = k end
    table.sort(names)
    local s = require("zrun.config").suggest(tostring(kind), names)
    error(fmt('unknown scheduler "%s"; expected one of %s%s', tostring(kind), table.concat(names, ", "),
      s and fmt('; did you mean "%s"?', s) or ""), 2)
  end
  return c.new(optimizer, params)
end

-- The schedule a DeepSpeed config's scheduler section ({type=, params=}) describes; nil for none.
function M.from_config(section, optimizer)
  if section == nil then return nil end
  return M.new(section.type, optimizer, section.params)
end

-- The Hugging Face Trainer's own schedules (lr_scheduler_type and lr_scheduler_kwargs): zrun.schedulers_hf.
-- schedulers.hf(name, optimizer, {num_warmup_steps=, num_training_steps=, kwargs=})
function M.hf(name, optimizer, o) return require("zrun.schedulers_hf").new(name, optimizer, o) end
-- What schedulers_hf's schedules share with these (not an API)
M.Base, M.groups_of, M.update_lr = Base, groups_of, update_lr

return M
