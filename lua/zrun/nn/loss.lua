-- nn.CrossEntropyLoss: softmax cross entropy between logits (N, C) (or (..., C)) and class-index
-- targets, with torch's ignore_index (-100), reduction ("mean" | "sum" | "none") and
-- label_smoothing. The computation is zr.cross_entropy; this module holds the options.
local zr = require "zrun"
local Module = require "zrun.nn.module"

local CrossEntropyLoss = Module:extend("CrossEntropyLoss")

local reductions = { mean = true, sum = true, none = true }

-- CrossEntropyLoss{ignore_index = -100, reduction = "mean", label_smoothing = 0}
function CrossEntropyLoss:__init(opts)
  opts = require("zrun.kwargs").check("CrossEntropyLoss", opts, { "ignore_index", "reduction", "label_smoothing" })
  self.ignore_index = opts.ignore_index or -100
  self.reduction = opts.reduction or "mean"
  self.label_smoothing = opts.label_smoothing or 0
  if not reductions[self.reduction] then
    error(("CrossEntropyLoss: reduction must be 'mean', 'sum' or 'none', got '%s'"):format(tostring(self.reduction)), 3)
  end
  if type(self.label_smoothing) ~= "number" or self.label_smoothing < 0 or self.label_smoothing > 1 then
    error(("CrossEntropyLoss: label_smoothing must be in [0, 1], got %s"):format(tostring(self.label_smoothing)), 3)
  end
end

-- zr.cross_entropy(logits, targets) with this module's ignore_index, reduction and
-- label_smoothing: a scalar for "mean" and "sum", one loss per target for "none".
function CrossEntropyLoss:forward(logits, targets)
  return zr.cross_entropy(logits, targets, {
    ignore_index = self.ignore_index, reduction = self.reduction, label_smoothing = self.label_smoothing,
  })
end

-- The options that differ from their defaults, e.g. "ignore_index=0, reduction='sum',
-- label_smoothing=0.1"; "" when all are the defaults.
function CrossEntropyLoss:extra_repr()
  local parts = {}
  if self.ignore_index ~= -100 then parts[#parts + 1] = "ignore_index=" .. self.ignore_index end
  if self.reduction ~= "mean" then parts[#parts + 1] = "reduction='" .. self.reduction .. "'" end
  if self.label_smoothing ~= 0 then parts[#parts + 1] = "label_smoothing=" .. self.label_smoothing end
  return table.concat(parts, ", ")
end

return CrossEntropyLoss
