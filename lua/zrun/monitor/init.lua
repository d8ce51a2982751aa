-- DeepSpeed's monitors (MonitorMaster): the `tensorboard` and `csv_monitor` sections of the config
-- write the events DeepSpeed's engine writes, on rank 0, at every optimizer step (the gradient
-- accumulation boundary), against the number of samples seen (global_samples):
--   Train/Samples/train_loss   the step's loss, the mean of its micro-batches (rank 0's), at the
--                              samples before the step (DeepSpeed logs it from backward())
--   Train/Samples/lr           the first param group's learning rate after the step
--   Train/Samples/loss_scale   fp16 only: the loss scale after the step
--   Train/Samples/elapsed_time_ms_{forward,backward,step}   with wall_clock_breakdown: this step's
--                              times (zrun does not split backward into _inner and _allreduce)
-- wandb and comet cannot be reached from zrun: config.lua refuses them when enabled.
local ffi = require "ffi"

local M = {}
local Monitor = {}
Monitor.__index = Monitor

-- os.path.join(output_path, job_name)
local function join(dir, name)
  if dir == "" or name:sub(1, 1) == "/" then return name end
  return (dir:gsub("/+$", "")) .. "/" .. name
end
-- The directory a tensorboard or csv_monitor config section writes to: its output_path joined with
-- its job_name (job_name alone when output_path is "" or job_name starts with "/").
M.log_dir = function(section) return join(section.output_path, section.job_name) end

-- The monitor for a resolved config on this rank, or nil when nothing is enabled or rank ~= 0.
-- opts.now: a clock for the event files (tests).
function M.from_config(cfg, rank, opts)
  if rank ~= 0 then return nil end
  local tb, csv = cfg.tensorboard, cfg.csv_monitor
  if not (tb.enabled or csv.enabled) then return nil end
  local self = setmetatable({ writers = {}, last = { forward = 0, backward = 0, step = 0 } }, Monitor)
  if tb.enabled then
    local w = require("zrun.monitor.tensorboard").new(M.log_dir(tb), opts)
    self.tensorboard = w
    self.writers[#self.writers + 1] = function(tag, v, step) w:add_scalar(tag, v, step) end
    self.flushers = { function() w:flush() end }
  end
  if csv.enabled then
    local w = require("zrun.monitor.csv").new(M.log_dir(csv))
    self.csv = w
    self.writers[#self.writers + 1] = function(tag, v, step, is_int) w:write(tag, v, step, is_int) end
  end
  return self
end

-- MonitorMaster.write_events: {{tag, value, step [, is_int]}, ...}, then a flush (as DeepSpeed).
function Monitor:write_events(events)
  for _, e in ipairs(events) do
    for _, w in ipairs(self.writers) do w(e[1], e[2], e[3], e[4]) end
  end
  for _, f in ipairs(self.flushers or {}) do f() end
end

local f32 = ffi.new("float[1]")
local function float32(x) f32[0] = x; return tonumber(f32[0]) end

-- Each micro-batch's loss: DeepSpeed sums loss / gradient_accumulation_steps over the step's
-- micro-batches, in float32. (Reading the loss back costs a GPU sync per micro-batch, only while a
-- monitor is on.)
function Monitor:backward(loss, gas)
  self.loss_sum = float32((self.loss_sum or 0) + float32(loss:item() / gas))
end

-- After an optimizer step (engine.global_steps already counts it): the events DeepSpeed writes.
function Monitor:step(engine)
  local tbs = engine.config.train_batch_size
  local after = engine.global_steps * tbs
  local before = after - tbs
  self:write_events { { "Train/Samples/train_loss", self.loss_sum or 0, before } }
  self.loss_sum = nil
  local events = { { "Train/Samples/lr", engine:get_lr()[1], after } }
  local s = engine.scaler
  if s then
    -- DeepSpeed's dynamic scale is the Python int 2**initial_scale_power until it first changes
    -- (then a float); a static loss_scale is a float
    local init = 2 ^ engine.config.fp16.initial_scale_power
    self.scale_changed = self.scale_changed or s.scale ~= init
    local is_int = s.dynamic and not self.scale_changed
    events[#events + 1] = { "Train/Samples/loss_scale", s.scale, after, is_int }
  end
  if engine.wall_clock_breakdown then
    local t, last = engine.timers, self.last
    for _, k in ipairs { "forward", "backward", "step" } do
      events[#events + 1] = { "Train/Samples/elapsed_time_ms_" .. k, (t[k] - last[k]) * 1000, after }
      last[k] = t[k]
    end
  end
  self:write_events(events)
end

-- The engine reset its timers (after printing them).
function Monitor:timers_reset() self.last = { forward = 0, backward = 0, step = 0 } end

function Monitor:close()
  if self.tensorboard then self.tensorboard:close() end
end

return M
