-- The run tests/lua/test_checkpoint_atomic.lua and its kill worker share: a tiny Llama at ZeRO
-- stage 1 with AdamW, step s training on a batch drawn from seed 500 + s, so every process that
-- runs steps 1..k holds the same state, bit for bit.
local zr = require "zrun"
local M = {}

function M.engine()
  zr.manual_seed(77)
  local m = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
  return zr.initialize({ model = m, config = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
    optimizer = { type = "AdamW", params = { lr = 2e-3, weight_decay = 0.05 } }, zero_optimization = { stage = 1 } } })
end

-- Trains step s; returns its loss.
function M.step(e, s)
  zr.manual_seed(500 + s)
  local ids = (zr.rand({ 2, 9 }) * 250):to("i64")
  local loss = e(ids, ids).loss
  e:backward(loss)
  e:step()
  return loss:item()
end

return M
