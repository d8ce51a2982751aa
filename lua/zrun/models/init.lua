-- zr.models: model families and built-in configs.
local M = {}
setmetatable(M, { __index = function(t, k)
  local ok, mod = pcall(require, "zrun.models." .. k)
  if ok then rawset(t, k, mod); return mod end
  error(mod, 2)
end })
return M
