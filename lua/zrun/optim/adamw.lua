-- zr.optim.AdamW with torch.optim.AdamW semantics: decoupled weight decay (p *= 1 - lr*wd),
-- bias-corrected moments, eps added outside the square root. The update runs in one fused C
-- kernel per parameter (runtime/ops/optim.c);
-- state: step, exp_avg, exp_avg_sq (tagged "optimizer").
local C = require "zrun._C"
local Optimizer = require "zrun.optim.optimizer"

local fmt = string.format
local adamw_step, has_grad = C.adamw_step, C.has_grad

local AdamW = Optimizer:extend("AdamW", {
  lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 1e-2, amsgrad = false, maximize = false,
})

-- Checks a parameter group's hyperparameters (errors name the value and what is allowed).
function AdamW:check_group(g)
  if type(g.lr) ~= "number" or g.lr < 0 then error(fmt("AdamW: lr must be a number >= 0, got %s", tostring(g.lr)), 0) end
  if type(g.eps) ~= "number" or g.eps < 0 then error(fmt("AdamW: eps must be >= 0, got %s", tostring(g.eps)), 0) end
  Optimizer.check_betas("AdamW", g.betas)
  if type(g.weight_decay) ~= "number" or g.weight_decay < 0 then
    error(fmt("AdamW: weight_decay must be >= 0, got %s", tostring(g.weight_decay)), 0)
  end
  if g.amsgrad then error("AdamW: amsgrad is not supported", 0) end
  if g.maximize then error("AdamW: maximize is not supported", 0) end
end

-- One step for every parameter that has a gradient. closure (optional) re-evaluates the loss
-- with autograd on and its result is returned.
function AdamW:step(closure)
  local loss
  if closure then loss = closure() end
  for _, g in ipairs(self.param_groups) do
    -- parameters are stepped in batches that share a step count (usually the whole group)
    local batches, order = {}, {}
    for _, p in ipairs(g.params) do
      if has_grad(p) then
        local s = self:adam_state(p)
        local b = batches[s.step]
        if not b then
          b = { {}, {}, {} }
          batches[s.step] = b
          order[#order + 1] = s.step
        end
        local n = #b[1] + 1
        b[1][n], b[2][n], b[3][n] = p, s.exp_avg, s.exp_avg_sq
      end
    end
    for _, step in ipairs(order) do
      local b = batches[step]
      -- grads nil: the kernel reads each p.grad in C (a Lua reference would delay its freeing)
      adamw_step(b[1], nil, b[2], b[3], {
        lr = g.lr, beta1 = g.betas[1], beta2 = g.betas[2], eps = g.eps, weight_decay = g.weight_decay, step = step,
      })
    end
  end
  return loss
end

return AdamW
