-- nn.ModuleList: an indexable list of submodules (children "0", "1", ..., so a model's
-- self.layers gives names like "layers.0.mlp.up_proj.weight"); 1-based from Lua, ipairs works.
-- It has no forward: the owner iterates it.
local Module = require "zrun.nn.module"

local ModuleList = Module:extend("ModuleList")

-- ModuleList([mods]): a list holding the modules of the list mods, in order (empty without it).
function ModuleList:__init(mods)
  for _, m in ipairs(mods or {}) do self:append(m) end
end

-- Adds module m as the next child (named "0", "1", ...); raises for anything that is not a
-- module. Returns self.
function ModuleList:append(m)
  if not Module.is_module(m) then error("ModuleList:append: expected a module, got " .. type(m), 2) end
  self[#self + 1] = m
  return self
end

-- list:extend(mods) appends each module of the list mods and returns the list; called on a class
-- (ModuleList:extend("Name")) it makes a subclass, as Module.extend does.
function ModuleList.extend(self, mods)
  if rawget(self, "__mt") then return Module.extend(self, mods) end -- ModuleList:extend("Name") subclasses
  for _, m in ipairs(mods) do self:append(m) end
  return self
end

-- The number of modules in the list.
function ModuleList:len() return #self end

-- Raises: a ModuleList has no forward; its owner iterates it (for i, layer in ipairs(self.layers)).
function ModuleList:forward()
  error("ModuleList has no forward(); iterate it: for i, layer in ipairs(self.layers) do ... end", 2)
end

return ModuleList
