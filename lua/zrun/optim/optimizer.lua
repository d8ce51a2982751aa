-- Optimizer base class (torch.optim.Optimizer semantics): parameter groups with per-group
-- hyperparameters, per-parameter state, zero_grad, state_dict/load_state_dict. Subclasses
-- (sgd.lua, adamw.lua) define defaults, check_group and step.
local C = require "zrun._C"

local is_tensor, fmt = C.is_tensor, string.format

local Optimizer = {}
Optimizer.__index = Optimizer
Optimizer.__name = "Optimizer"

-- Subclass: local AdamW = Optimizer:extend("AdamW", {lr = 1e-3, ...})
function Optimizer:extend(name, defaults)
  local cls = setmetatable({ __name = name, defaults = defaults }, { __index = self,
    __call = function(c, ...) return c.new(c, ...) end })
  cls.__index = cls
  cls.__tostring = self.__tostring -- metamethods are not inherited through __index
  return cls
end

-- new(params, opts): params is a list of tensors, or a list of groups {params = {...}, lr = ...};
-- opts override the class defaults for every group that does not set its own value.
function Optimizer.new(cls, params, opts)
  local self = setmetatable({ param_groups = {}, state = {} }, cls)
  self.defaults = {}
  for k, v in pairs(cls.defaults) do self.defaults[k] = v end
  for k, v in pairs(opts or {}) do
    if cls.defaults[k] == nil then
      error(fmt("%s: unknown option '%s'", cls.__name, tostring(k)), 3)
    end
    self.defaults[k] = v
  end
  if type(params) ~= "table" then error(fmt("%s: params must be a list of tensors or of groups, got %s", cls.__name, type(params)), 3) end
  if #params == 0 then error(fmt("%s got an empty parameter list", cls.__name), 3) end
  if is_tensor(params[1]) then params = { { params = params } } end
  for _, g in ipairs(params) do self:add_param_group(g, 4) end
  return self
end

-- Adds {params = {...}, lr = ..., ...}; keys not given take the optimizer's defaults.
function Optimizer:add_param_group(group, level)
  level = level or 2
  if type(group) ~= "table" or type(group.params) ~= "table" then
    error(fmt("%s: a parameter group is a table with a 'params' list", self.__name), level)
  end
  local g = { params = {} }
  for k, v in pairs(group) do
    if k ~= "params" then
      if self.defaults[k] == nil then error(fmt("%s: unknown option '%s' in a parameter group", self.__name, tostring(k)), level) end
      g[k] = v
    end
  end
  for k, v in pairs(self.defaults) do
    if g[k] == nil then g[k] = type(v) == "table" and { unpack(v) } or v end -- groups never share tables
  end
  local seen = {}
  for _, og in ipairs(self.param_groups) do for _, p in ipairs(og.params) do seen[p] = true end end
  for i, p in ipairs(group.params) do
    if not is_tensor(p) then error(fmt("%s: parameter %d of group %d is a %s, not a tensor", self.__name, i, #self.param_groups + 1, type(p)), level) end
    if not p.is_leaf then error(fmt("%s: can't optimize a non-leaf tensor (parameter %d of group %d)", self.__name, i, #self.param_groups + 1), level) end
    if seen[p] then error(fmt("%s: some parameters appear in more than one parameter group", self.__name), level) end
    seen[p] = true
    g.params[i] = p
  end
  if self.check_group then
    local ok, err = pcall(self.check_group, self, g)
    if not ok then error(err, level) end
  end
  self.param_groups[#self.param_groups + 1] = g
end

-- set_to_none (default true) drops gradients; false zeroes them in place.
function Optimizer:zero_grad(set_to_none)
  for _, g in ipairs(self.param_groups) do
    for _, p in ipairs(g.params) do
      if set_to_none == false then
        if C.has_grad(p) then p.grad:zero_() end
      else
        p.grad = nil
      end
    end
  end
end

-- Checks a group's betas (a pair, each in [0, 1)); errors name the optimizer `name`.
function Optimizer.check_betas(name, betas)
  if type(betas) ~= "table" or #betas ~= 2 then error(name .. ": betas must be a pair {beta1, beta2}", 0) end
  for i = 1, 2 do
    local b = betas[i]
    if type(b) ~= "number" or b < 0 or b >= 1 then error(fmt("%s: betas[%d] must be in [0, 1), got %s", name, i, tostring(b)), 0) end
  end
end

-- A zero tensor shaped like p for optimizer state, its memory tagged "optimizer".
function Optimizer.zeros_like(p)
  local t = C.zeros(p:shape(), { dtype = p:dtype(), device = p:device() })
  t:category("optimizer")
  return t
end

-- p's Adam-style state ({step, exp_avg, exp_avg_sq}, made on first use) with its step counted
-- for the update about to run.
function Optimizer:adam_state(p)
  local s = self.state[p]
  if not s then
    s = { step = 0, exp_avg = Optimizer.zeros_like(p), exp_avg_sq = Optimizer.zeros_like(p) }
    self.state[p] = s
  end
  s.step = s.step + 1
  return s
end

-- {state = {[i] = {name = number or tensor}}, param_groups = {{lr = ..., params = {i, ...}}}},
-- where i numbers the parameters 1, 2, ... across groups in order. Tensors are shared, not
-- copied (as in torch); load_state_dict copies.
function Optimizer:state_dict()
  local state, groups, idx = {}, {}, 0
  for gi, g in ipairs(self.param_groups) do
    local og = { params = {} }
    for k, v in pairs(g) do
      if k ~= "params" then og[k] = type(v) == "table" and { unpack(v) } or v end
    end
    for _, p in ipairs(g.params) do
      idx = idx + 1
      og.params[#og.params + 1] = idx
      local s = self.state[p]
      if s then
        local c = {}
        for k, v in pairs(s) do c[k] = v end
        state[idx] = c
      end
    end
    groups[gi] = og
  end
  return { state = state, param_groups = groups }
end

-- Restores what state_dict() returned (per-parameter state and the groups' hyperparameters).
function Optimizer:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.param_groups) ~= "table" or type(sd.state) ~= "table" then
    error(fmt("%s:load_state_dict: expected a table with 'state' and 'param_groups'", self.__name), 2)
  end
  if #sd.param_groups ~= #self.param_groups then
    error(fmt("%s:load_state_dict: the state has %d parameter groups, the optimizer %d", self.__name,
      #sd.param_groups, #self.param_groups), 2)
  end
  local byidx = {}
  for gi, g in ipairs(self.param_groups) do
    local sg = sd.param_groups[gi]
    if #sg.params ~= #g.params then
      error(fmt("%s:load_state_dict: group %d has %d parameters in the state, %d in the optimizer",
        self.__name, gi, #sg.params, #g.params), 2)
    end
    for i, p in ipairs(g.params) do byidx[sg.params[i]] = p end
  end
  local new_state = {}
  for idx, s in pairs(sd.state) do
    local p = byidx[idx]
    if not p then error(fmt("%s:load_state_dict: state for parameter %s, which no group lists", self.__name, tostring(idx)), 2) end
    local c = {}
    for k, v in pairs(s) do
      if is_tensor(v) then
        if table.concat(v:shape(), ",") ~= table.concat(p:shape(), ",") then
          error(fmt("%s:load_state_dict: state '%s' of parameter %s has shape (%s), the parameter (%s)",
            self.__name, k, tostring(idx), table.concat(v:shape(), ","), table.concat(p:shape(), ",")), 2)
        end
        local t = Optimizer.zeros_like(p)
        t:copy_(v)
        c[k] = t
      else
        c[k] = v
      end
    end
    new_state[p] = c
  end
  for gi, g in ipairs(self.param_groups) do
    for k, v in pairs(sd.param_groups[gi]) do
      if k ~= "params" then g[k] = type(v) == "table" and { unpack(v) } or v end
    end
  end
  self.state = new_state
end

function Optimizer:__tostring()
  local lines = { self.__name .. " (" }
  for gi, g in ipairs(self.param_groups) do
    lines[#lines + 1] = fmt("Parameter Group %d", gi - 1)
    local keys = {}
    for k in pairs(g) do if k ~= "params" then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local v = g[k]
      if type(v) == "table" then v = "(" .. table.concat(v, ", ") .. ")" end
      lines[#lines + 1] = fmt("    %s: %s", k, tostring(v))
    end
  end
  lines[#lines + 1] = ")"
  return table.concat(lines, "\n")
end

return Optimizer
