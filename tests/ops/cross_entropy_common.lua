-- Shared by tests/ops/test_cross_entropy_inplace.lua and test_cross_entropy_cuda.lua: one
-- cross_entropy forward and its backwards under a loss-gradient hint, on a fresh copy of the logits.
local zr = require "zrun"
local M = {}

-- The loss, x's gradient and x as the op left it, for cross_entropy(producer(x), tgt, o) on a copy
-- of x0 on dev (nil: x0's device), with backward once per seed of `seeds` (retain_graph between
-- them) while zr.set_loss_grad_hint(hint) holds. producer (nil: none) stands for what makes the
-- logits (a head's matmul), so the gradient travels on through a node.
function M.run(x0, tgt, o, seeds, hint, dev, producer)
  local prev = zr.set_loss_grad_hint(hint)
  local x = x0:to(dev or x0:device()):clone():detach() -- its own copy: inplace writes over it
  x.requires_grad = true
  local ok, l = pcall(function()
    local l = zr.cross_entropy(producer and producer(x) or x, tgt:to(x:device()), o)
    for i, s in ipairs(seeds) do
      local keep = i < #seeds
      if s == 1 then l:backward(nil, keep) else (l * s):backward(nil, keep) end
    end
    return l
  end)
  zr.set_loss_grad_hint(prev)
  if not ok then error(l, 0) end
  return l:item(), x.grad, x:detach()
end

return M
