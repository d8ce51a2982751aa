-- nn.Sequential: children named "0", "1", ... (as in torch state_dicts), indexed 1-based from
-- Lua (seq[1] is child "0"); forward feeds each child's output to the next.
local Module = require "zrun.nn.module"

local Sequential = Module:extend("Sequential")

-- Sequential(m1, m2, ...) or Sequential{m1, m2, ...}
function Sequential:__init(...)
  local mods = { ... }
  if #mods == 1 and not Module.is_module(mods[1]) and type(mods[1]) == "table" then mods = mods[1] end
  for _, m in ipairs(mods) do self:append(m) end
end

-- Adds module m as the next child (named "0", "1", ...; also Sequential:add); raises for anything
-- that is not a module. Returns self.
function Sequential:append(m)
  if not Module.is_module(m) then error("Sequential:append: expected a module, got " .. type(m), 2) end
  self[#self + 1] = m
  return self
end
Sequential.add = Sequential.append

-- The number of children.
function Sequential:len() return #self end

-- Feeds x through the children in order (the extra arguments go to the first child only) and
-- returns the last child's output; x itself when there are no children.
function Sequential:forward(x, ...)
  for i = 1, #self do
    if i == 1 then x = self[i](x, ...) else x = self[i](x) end
  end
  return x
end

return Sequential
