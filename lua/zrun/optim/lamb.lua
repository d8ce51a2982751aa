-- zr.optim.Lamb with DeepSpeed's FusedLamb semantics (deepspeed/ops/lamb/fused_lamb.py): Adam's
-- moments, then each parameter tensor moves by lr * trust ratio * u, the ratio ||p|| / ||u|| clamped
-- to [min_coeff, max_coeff] (the formula: kernels/cpu/offload.h). One C call per parameter
-- (runtime/ops/optim.c); f32 parameters; state: step, exp_avg, exp_avg_sq (tagged "optimizer").
local C = require "zrun._C"
local Optimizer = require "zrun.optim.optimizer"

local fmt = string.format
local lamb_step, has_grad = C.lamb_step, C.has_grad

local Lamb = Optimizer:extend("Lamb", {
  lr = 1e-3, bias_correction = true, betas = { 0.9, 0.999 }, eps = 1e-8, eps_inside_sqrt = false,
  weight_decay = 0, max_coeff = 10.0, min_coeff = 0.01, amsgrad = false,
})

-- Checks a parameter group's hyperparameters (errors name the value and what is allowed).
function Lamb:check_group(g)
  for _, k in ipairs { "lr", "eps", "weight_decay", "max_coeff", "min_coeff" } do
    if type(g[k]) ~= "number" or g[k] < 0 then error(fmt("Lamb: %s must be a number >= 0, got %s", k, tostring(g[k])), 0) end
  end
  Optimizer.check_betas("Lamb", g.betas)
  if g.amsgrad then error("Lamb: amsgrad is not supported (DeepSpeed's FusedLamb refuses it too)", 0) end
end

-- One step for every parameter that has a gradient, each with its own trust ratio. closure
-- (optional) re-evaluates the loss with autograd on and its result is returned.
function Lamb:step(closure)
  local loss
  if closure then loss = closure() end
  for _, g in ipairs(self.param_groups) do
    local opts = { beta1 = g.betas[1], beta2 = g.betas[2], eps = g.eps, bias_correction = g.bias_correction,
      eps_inside_sqrt = g.eps_inside_sqrt, max_coeff = g.max_coeff, min_coeff = g.min_coeff }
    for _, p in ipairs(g.params) do
      if has_grad(p) then
        local s = self:adam_state(p)
        -- grad nil: the kernel reads p.grad in C; the whole tensor is one segment
        lamb_step(p, s.exp_avg, s.exp_avg_sq, nil, { { start = 1, n = p:numel(), lr = g.lr, weight_decay = g.weight_decay } },
          opts, s.step)
      end
    end
  end
  return loss
end

return Lamb
