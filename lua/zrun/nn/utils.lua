-- nn.utils: gradient clipping with torch.nn.utils semantics.
local zr = require "zrun"
local M = {}

-- Global L2 norm of all gradients (computed in float64), then every gradient is scaled by
-- min(1, max_norm / (norm + 1e-6)). Returns the norm before clipping.
function M.clip_grad_norm_(params, max_norm)
  local total = 0
  local grads = {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g then
      grads[#grads + 1] = g
      local gd = g:to("f64")
      total = total + (gd * gd):sum():item()
    end
  end
  local norm = math.sqrt(total)
  local coef = max_norm / (norm + 1e-6)
  if coef < 1 then for _, g in ipairs(grads) do g:mul_(coef) end end
  return norm
end

return M
