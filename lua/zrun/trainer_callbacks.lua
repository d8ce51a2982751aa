-- The Trainer's callbacks, as transformers' TrainerCallback, TrainerControl and CallbackHandler:
-- zr.Trainer{callbacks = {cb, ...}} calls cb:on_<event>(args, state, control, logs_or_metrics, kw)
-- for the events below (on_init_end at the end of zr.Trainer{}; each micro-batch but a step's last ends with
-- on_substep_end, the last steps the optimizer between on_pre_optimizer_step and on_optimizer_step, both
-- around engine:step, which clips and steps, and not called under ZenFlow), in list order (logs for
-- on_log, metrics for on_evaluate, else nil; kw:
-- transformers' keyword arguments {model=, optimizer=, lr_scheduler=, processing_class=, trainer=});
-- a callback sets control's should_* flags to stop training (should_training_stop,
-- should_epoch_stop) or to log, evaluate or save at the end of this step. As transformers'
-- DefaultFlowCallback, the Trainer sets the strategies' own should_log / should_evaluate / should_save (and
-- should_training_stop at the last step) before on_step_end and on_epoch_end, so a callback sees them and
-- may clear them; each is cleared as its event (on_log, on_evaluate, on_save) runs.
-- Also transformers' EarlyStoppingCallback.
--
--   local cb = { on_log = function(self, args, state, control, logs) print(state.global_step, logs.loss) end }
--   zr.Trainer{ ..., callbacks = { cb, zr.EarlyStoppingCallback{ early_stopping_patience = 3 } } }
local dist = require "zrun.dist"
local M = {}
local fmt = string.format

M.EVENTS = { "on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin",
  "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log", "on_evaluate", "on_save" }
local KNOWN = {}
for _, e in ipairs(M.EVENTS) do KNOWN[e] = true end

-- TrainerControl's flags, all false.
function M.new_control()
  return { should_training_stop = false, should_epoch_stop = false, should_save = false, should_evaluate = false,
    should_log = false }
end

-- The on_* names a callback answers to: its own keys and its class chain's (__index tables).
local function methods(cb)
  local out, seen, t = {}, {}, cb
  while type(t) == "table" and not seen[t] do
    seen[t] = true
    for k, v in pairs(t) do
      if type(k) == "string" and k:match("^on_") and type(v) == "function" then out[k] = true end
    end
    local mt = getmetatable(t)
    t = mt and mt.__index
  end
  return out
end

-- Checks zr.Trainer's callbacks option (nil: none): a list of tables whose on_* methods are events
-- the Trainer calls; one this Trainer never calls is refused rather than left silent. Returns the list.
function M.check(list)
  if list == nil then return {} end
  if type(list) ~= "table" then error(fmt("Trainer: callbacks must be a list of tables, got %s", type(list)), 0) end
  for i, cb in ipairs(list) do
    if type(cb) ~= "table" then
      error(fmt("Trainer: callbacks[%d] is a %s, not a table with on_* methods", i, type(cb)), 0)
    end
    for k in pairs(methods(cb)) do
      if not KNOWN[k] then
        error(fmt("Trainer: callbacks[%d].%s is not an event zrun's Trainer calls (it calls %s)", i, k,
          table.concat(M.EVENTS, ", ")), 0)
      end
    end
  end
  return list
end

-- Calls event on each callback that has it: cb:event(args, state, control, extra, kw).
function M.call(list, event, args, state, control, extra, kw)
  for _, cb in ipairs(list) do
    local f = cb[event]
    if f then f(cb, args, state, control, extra, kw) end
  end
end

-- transformers' TensorBoardCallback (report_to = "tensorboard"): on rank 0, every logged record as scalars
-- at the global step, its keys as transformers' rewrite_logs names them (eval_x -> eval/x, test_x ->
-- test/x, the others train/x; the step itself is the x axis), into an event file in log_dir (created at
-- the first record), flushed each time; closed at the end of training.
local TB = { name = "TensorBoardCallback" }
TB.__index = TB

function M.TensorBoardCallback(log_dir) return setmetatable({ log_dir = log_dir }, TB) end

function TB:on_log(args, state, control, logs)
  if dist.rank() ~= 0 or type(logs) ~= "table" then return end
  self.writer = self.writer or require("zrun.monitor.tensorboard").new(self.log_dir)
  local keys = {}
  for k, v in pairs(logs) do if k ~= "step" and type(v) == "number" then keys[#keys + 1] = k end end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local tag = k:match("^eval_(.+)") and "eval/" .. k:sub(6) or k:match("^test_(.+)") and "test/" .. k:sub(6) or "train/" .. k
    self.writer:add_scalar(tag, logs[k], state.global_step)
  end
  self.writer:flush()
end

function TB:on_train_end()
  if self.writer then self.writer:close(); self.writer = nil end
end

-- transformers' EarlyStoppingCallback: stops training once the evaluation's metric_for_best_model
-- has not improved on the best so far (by more than early_stopping_threshold) early_stopping_patience
-- evaluations in a row. Its counter is saved in trainer_state.json and restored on resume with
-- restore_callback_states_from_checkpoint = true (transformers' default false starts it at 0).
local ES = { name = "EarlyStoppingCallback" }
ES.__index = ES

-- EarlyStoppingCallback{early_stopping_patience = 1, early_stopping_threshold = 0.0}, for
-- zr.Trainer's callbacks. Raises for a patience that is not an integer >= 1, a negative threshold
-- or another option; at the start of training, without metric_for_best_model or with eval_strategy
-- "no".
function M.EarlyStoppingCallback(o)
  o = o or {}
  local p, th = o.early_stopping_patience or 1, o.early_stopping_threshold or 0.0
  if type(p) ~= "number" or p < 1 or p ~= math.floor(p) then
    error(fmt("EarlyStoppingCallback: early_stopping_patience must be an integer >= 1, got %s", tostring(p)), 2)
  end
  if type(th) ~= "number" or th < 0 then
    error(fmt("EarlyStoppingCallback: early_stopping_threshold must be a number >= 0, got %s", tostring(th)), 2)
  end
  for k in pairs(o) do
    if k ~= "early_stopping_patience" and k ~= "early_stopping_threshold" then
      error(fmt("EarlyStoppingCallback: unknown option '%s' (early_stopping_patience, early_stopping_threshold)",
        tostring(k)), 2)
    end
  end
  return setmetatable({ early_stopping_patience = p, early_stopping_threshold = th, early_stopping_patience_counter = 0 },
    ES)
end

function ES:on_train_begin(args)
  if not args.metric_for_best_model then
    error("EarlyStoppingCallback requires metric_for_best_model (e.g. \"loss\") in the arguments", 0)
  end
  if args.eval_strategy == "no" then error("EarlyStoppingCallback requires eval_strategy \"steps\" or \"epoch\"", 0) end
  if not args.load_best_model_at_end then
    dist.print0("[zrun] warning: EarlyStoppingCallback without load_best_model_at_end = true: the best model will " ..
      "not be loaded when training stops")
  end
end

function ES:on_evaluate(args, state, control, metrics)
  local v = metrics[args.metric_for_best_model]
  if v == nil then
    dist.print0(fmt("[zrun] warning: EarlyStoppingCallback: no %s in the evaluation's metrics; early stopping is off",
      args.metric_for_best_model))
    return
  end
  local best = state.best_metric -- the best before this evaluation, as transformers compares
  local better = best ~= nil and ((args.greater_is_better and v > best) or (not args.greater_is_better and v < best))
  if best == nil or (better and math.abs(v - best) > self.early_stopping_threshold) then
    self.early_stopping_patience_counter = 0
  else
    self.early_stopping_patience_counter = self.early_stopping_patience_counter + 1
  end
  if self.early_stopping_patience_counter >= self.early_stopping_patience then control.should_training_stop = true end
end

-- transformers' ExportableState: what trainer_state.json's stateful_callbacks keeps.
function ES:state()
  return { args = { early_stopping_patience = self.early_stopping_patience,
    early_stopping_threshold = self.early_stopping_threshold },
    attributes = { early_stopping_patience_counter = self.early_stopping_patience_counter } }
end
function ES:load_state(s)
  if s and s.attributes and s.attributes.early_stopping_patience_counter then
    self.early_stopping_patience_counter = s.attributes.early_stopping_patience_counter
  end
end

return M
