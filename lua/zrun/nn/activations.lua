-- Activation modules (no parameters): ReLU, GELU(approximate = "none" | "tanh"), SiLU, Tanh,
-- Sigmoid. Each wraps the elementwise op of the same name.
local Module = require "zrun.nn.module"
local M = {}

M.ReLU = Module:extend("ReLU")
function M.ReLU:forward(x) return x:relu() end

M.GELU = Module:extend("GELU")
function M.GELU:__init(approximate)
  if type(approximate) == "table" then approximate = approximate.approximate end
  approximate = approximate or "none"
  if approximate ~= "none" and approximate ~= "tanh" then
    error(("GELU: approximate must be 'none' or 'tanh', got '%s'"):format(tostring(approximate)), 3)
  end
  self.approximate = approximate
end
function M.GELU:forward(x) return x:gelu(self.approximate) end
function M.GELU:extra_repr() return self.approximate == "none" and "" or "approximate='tanh'" end

M.SiLU = Module:extend("SiLU")
function M.SiLU:forward(x) return x:silu() end

M.Tanh = Module:extend("Tanh")
function M.Tanh:forward(x) return x:tanh() end

M.Sigmoid = Module:extend("Sigmoid")
function M.Sigmoid:forward(x) return x:sigmoid() end

return M
