-- zr.optim.SGD with torch.optim.SGD semantics: weight_decay added to the gradient, momentum
-- buffer initialised to the first gradient (undamped), dampening, nesterov. One C kernel per
-- parameter (runtime/ops/optim.c); state: momentum_buffer (tagged "optimizer") when momentum > 0.
local C = require "zrun._C"
local Optimizer = require "zrun.optim.optimizer"

local fmt = string.format
local sgd_step, has_grad = C.sgd_step, C.has_grad

local SGD = Optimizer:extend("SGD", {
  lr = 1e-3, momentum = 0, dampening = 0, weight_decay = 0, nesterov = false, maximize = false,
})

-- Checks a parameter group's hyperparameters (errors name the value and what is allowed).
function SGD:check_group(g)
  if type(g.lr) ~= "number" or g.lr < 0 then error(fmt("SGD: lr must be a number >= 0, got %s", tostring(g.lr)), 0) end
  if type(g.momentum) ~= "number" or g.momentum < 0 then error(fmt("SGD: momentum must be >= 0, got %s", tostring(g.momentum)), 0) end
  if type(g.weight_decay) ~= "number" or g.weight_decay < 0 then
    error(fmt("SGD: weight_decay must be >= 0, got %s", tostring(g.weight_decay)), 0)
  end
  if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
    error("SGD: nesterov momentum requires momentum > 0 and dampening = 0", 0)
  end
  if g.maximize then error("SGD: maximize is not supported", 0) end
end

-- One update of every parameter with a gradient (torch.optim.SGD's rule, momentum and
-- nesterov included); closure, when given, recomputes the loss first. Returns that loss.
function SGD:step(closure)
  local loss
  if closure then loss = closure() end
  for _, g in ipairs(self.param_groups) do
    local hp = { lr = g.lr, momentum = g.momentum, dampening = g.dampening, weight_decay = g.weight_decay,
      nesterov = g.nesterov, first = false }
    for _, p in ipairs(g.params) do
      if has_grad(p) then
        local buf
        hp.first = false
        if g.momentum ~= 0 then
          local s = self.state[p]
          if not s then
            s = { momentum_buffer = Optimizer.zeros_like(p) }
            self.state[p] = s
            hp.first = true
          end
          buf = s.momentum_buffer
        end
        sgd_step(p, nil, buf, hp) -- nil: p.grad, read in C
      end
    end
  end
  return loss
end

return SGD
