-- nn.Dropout(p): zeroes each element with probability p and scales the rest by 1/(1-p) while the
-- module is training; the identity after :eval().
local zr = require "zrun"
local Module = require "zrun.nn.module"

local Dropout = Module:extend("Dropout")

-- Dropout(p = 0.5) or Dropout{p = 0.5}; raises unless p is a probability in [0, 1].
function Dropout:__init(p)
  if type(p) == "table" then p = p.p end
  p = p or 0.5
  if type(p) ~= "number" or p < 0 or p > 1 then
    error(("Dropout: p must be a probability in [0, 1], got %s"):format(tostring(p)), 3)
  end
  self.p = p
end

-- While training with p > 0: zr.dropout(x, p), a new tensor of x's shape (elements zeroed with
-- probability p, the rest scaled by 1/(1-p)); otherwise x itself.
function Dropout:forward(x)
  if not self.training or self.p == 0 then return x end
  return zr.dropout(x, self.p, true)
end

-- "p=0.5" (p as %g).
function Dropout:extra_repr() return ("p=%g"):format(self.p) end

return Dropout
