-- The memory plan next to the GPU, category by category, at the measured peak: trains the tiny
-- Llama of the plan's time-line check on this GPU and prints, per zr.memory category, the bytes
-- live at the peak (zr.memory.stats' at_peak) beside the plan's training_at_peak, and the
-- caching allocator's rounded figures (which also hold the cuBLASLt workspace, in no category).
--   zrun tests/cuda/plan_gap_gpu.lua [stage=0] [B=4] [T=97] [layers=2] [head_dim=16] [gas=1] [ckpt=1]
--   (ZRUN_CHECK_DEVICE=cpu: the same on the CPU, where the plan is byte-exact)
local zr = require "zrun"
local o = { stage = 0, B = 4, T = 97, layers = 2 }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.+)$")
  if not k or not ({ stage = 1, B = 1, T = 1, layers = 1, head_dim = 1, gas = 1, ckpt = 1 })[k] or not tonumber(v) then
    error("plan_gap_gpu: arguments are stage=, B=, T=, layers=, head_dim=, gas=, ckpt= with numbers, got '" ..
      a .. "'", 0)
  end
  o[k] = tonumber(v)
end
o.ckpt = o.ckpt == 1 or nil
if os.getenv("ZRUN_CHECK_DEVICE") == nil then
  if not (zr._C.cuda and zr._C.cuda.device_count() > 0) then
    error("plan_gap_gpu: no GPU found (this zrun sees none); ZRUN_CHECK_DEVICE=cpu runs it on the CPU", 0)
  end
  zr.setenv("ZRUN_CHECK_DEVICE", "cuda")
end
local M = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../mpi/plan_measure.lua")
local measured, plan, _, at = M.measure(o)
local fmt = string.format
print(fmt("%s, stage %d, B=%d T=%d, %d layers, head_dim %s%s%s: measured peak %d B, planned %d B (%.4f), peak in %s",
  M.dev, o.stage, o.B, o.T, o.layers, tostring(o.head_dim or 16), o.gas and (", gas " .. o.gas) or "",
  o.ckpt and ", checkpointing" or "", measured, plan.training_total, plan.training_total / measured, plan.peak_in.device))
print(fmt("  %-12s %14s %14s %14s", "at the peak", "measured", "planned", "gap"))
for _, k in ipairs(zr.memory.categories) do
  local p = plan.training_at_peak[k] or 0
  print(fmt("  %-12s %14d %14d %+14d", k, at[k], p, at[k] - p))
end
print(fmt("  %-12s %14d %14d %+14d", "total", measured, plan.training_total, measured - plan.training_total))
if M.gpu then -- the allocator's blocks: sizes rounded to 512 B, the cuBLASLt workspace
  local c = zr._C.cuda.memory_summary(zr._C.cuda.current_device())
  print(fmt("  caching allocator since the start: blocks in use at most %d B (sizes rounded, cuBLASLt's " ..
    "workspace included, in no category), reserved at most %d B", c.peak_blocks, c.peak_reserved))
end
