-- zr.Trainer{callbacks=}: transformers' TrainerCallback events in their order, TrainerControl's flags
-- (stop, log, evaluate, save at this step), refusals, and EarlyStoppingCallback (stop, best model,
-- its counter across a resume).
local zr = require "zrun"
local T = zr.testing
local tckpt = require "zrun.trainer_checkpoint"

local tmp = T.tmpdir()
local function sh(c) assert(os.execute(c) == 0, c) end

local tok = zr.tokenizers.ByteTokenizer.new()
local blocks = T.sample_rows(tok):group_texts(24)
local train_ds, eval_ds = blocks:select(1, 40), blocks:select(41, 48)

local function model()
  zr.manual_seed(5)
  return zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
end
local function args(out, extra)
  local a = { output_dir = tmp .. "/" .. out, per_device_train_batch_size = 4, gradient_accumulation_steps = 2,
    max_steps = 4, learning_rate = 3e-3, logging_steps = 2, save_strategy = "no" }
  for k, v in pairs(extra or {}) do a[k] = v end
  return a
end

T.test("events in transformers' order: step end, then log, evaluate, save", function()
  local seen = {}
  local rec = {}
  for _, ev in ipairs(require("zrun.trainer_callbacks").EVENTS) do
    rec[ev] = function(_, _, state) seen[#seen + 1] = ev .. "@" .. state.global_step end
  end
  zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds, callbacks = { rec },
    args = args("order", { eval_strategy = "steps", eval_steps = 2, save_strategy = "steps", save_steps = 4 }) }:train()
  -- each step of 2 micro-batches: the first ends a substep, the second steps the optimizer (the global step
  -- counts it before on_step_end, as in transformers)
  local function step(n) return "on_step_begin@" .. n, "on_substep_end@" .. n, "on_pre_optimizer_step@" .. n,
    "on_optimizer_step@" .. n, "on_step_end@" .. (n + 1) end
  local want = { "on_init_end@0", "on_train_begin@0", "on_epoch_begin@0" }
  local function add(...) for _, v in ipairs { ... } do want[#want + 1] = v end end
  add(step(0)); add(step(1)); add("on_log@2", "on_log@2", "on_evaluate@2")
  add(step(2)); add(step(3)); add("on_log@4", "on_log@4", "on_evaluate@4", "on_save@4", "on_epoch_end@4", "on_log@4", "on_train_end@4")
  T.eq(table.concat(seen, " "), table.concat(want, " "), "(max_steps ends the epoch too, as in transformers)")
end)

T.test("the strategies' decisions are control flags the callbacks see and may cancel (DefaultFlowCallback)", function()
  -- transformers 5.17 (a recording callback, then one clearing should_log at step 2; 4 steps of 2 micro-batches,
  -- logging_first_step, logging_steps 2, eval_steps 3, save_strategy "epoch"): each event with the flags
  -- should_log/evaluate/save/training_stop as that callback saw them. The flags are set before on_step_end /
  -- on_epoch_end (the step-2 log cancelled), each cleared as its event runs; "epoch" saves after on_epoch_end.
  local want = "on_train_begin@0:0000 on_epoch_begin@0:0000 on_step_begin@0:0000 on_substep_end@0:0000 " ..
    "on_pre_optimizer_step@0:0000 on_optimizer_step@0:0000 on_step_end@1:1000 on_log@1:0000 on_step_begin@1:0000 " ..
    "on_substep_end@1:0000 on_pre_optimizer_step@1:0000 on_optimizer_step@1:0000 on_step_end@2:1000 " ..
    "on_step_begin@2:0000 on_substep_end@2:0000 on_pre_optimizer_step@2:0000 on_optimizer_step@2:0000 " ..
    "on_step_end@3:0100 on_log@3:0100 on_evaluate@3:0000 on_step_begin@3:0000 on_substep_end@3:0000 " ..
    "on_pre_optimizer_step@3:0000 on_optimizer_step@3:0000 on_step_end@4:1101 on_log@4:0101 on_log@4:0101 " ..
    "on_evaluate@4:0001 on_epoch_end@4:0011 on_save@4:0001 on_log@4:0001 on_train_end@4:0001"
  local seen, rec = {}, {}
  local function b(v) return v and "1" or "0" end
  for _, ev in ipairs(require("zrun.trainer_callbacks").EVENTS) do
    rec[ev] = function(_, _, state, c)
      seen[#seen + 1] = ("%s@%d:%s%s%s%s"):format(ev, state.global_step, b(c.should_log), b(c.should_evaluate),
        b(c.should_save), b(c.should_training_stop))
    end
  end
  rec.on_init_end = nil
  local cancel = { on_step_end = function(_, _, state, c) if state.global_step == 2 then c.should_log = false end end }
  local t = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds, callbacks = { rec, cancel },
    args = args("flow", { logging_first_step = true, eval_strategy = "steps", eval_steps = 3, save_strategy = "epoch" }) }
  t:train()
  T.eq(table.concat(seen, " "), want)
  local logged = {}
  for _, h in ipairs(t.state.log_history) do if h.loss then logged[#logged + 1] = h.step end end
  T.eq(table.concat(logged, " "), "1 4", "the step-2 log cancelled")
end)

T.test("control: a callback stops training, or asks for a log, an evaluation or a save at this step", function()
  local kws = {}
  local cb = { on_step_end = function(_, _, state, control, _, kw)
    kws[#kws + 1] = kw
    if state.global_step == 1 then control.should_save, control.should_evaluate, control.should_log = true, true, true end
    if state.global_step == 3 then control.should_training_stop = true end
  end }
  local t = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds, callbacks = { cb },
    args = args("control", { max_steps = 10, logging_steps = 100 }) }
  local r = t:train()
  T.eq(r.global_step, 3, "stopped after step 3")
  T.eq(kws[1].model, t.model, "kw.model"); T.eq(kws[1].optimizer, t.engine.optimizer, "kw.optimizer")
  T.eq(kws[1].lr_scheduler, t.engine.lr_scheduler, "kw.lr_scheduler"); T.eq(kws[1].trainer, t, "kw.trainer")
  assert(io.open(tmp .. "/control/checkpoint-1/trainer_state.json"), "should_save made checkpoint-1")
  local at = {}
  for _, h in ipairs(t.state.log_history) do
    if h.eval_loss then at[#at + 1] = "eval@" .. h.step elseif h.loss then at[#at + 1] = "loss@" .. h.step end
  end
  -- (as in transformers, a stop before max_steps logs nothing more: steps 2-3 fall in no logging window)
  T.eq(table.concat(at, " "), "loss@1 eval@1", "logged and evaluated at step 1 on request")
end)

T.test("save_state() writes the stateful callbacks as the last checkpoint saved them (transformers 5.17)", function()
  -- transformers 5.17 keeps stateful_callbacks in its TrainerState as of the last checkpoint's save (or the start
  -- of train()): EarlyStoppingCallback evaluated once more after training (its counter 3) is saved by save_state()
  -- with the counter of the last checkpoint (2). Here a stateful callback counting evaluations, eval and save every
  -- 2 steps of 4, then one evaluation more.
  local counter = { name = "Counter", n = 0 }
  function counter.on_evaluate(self) self.n = self.n + 1 end
  function counter.state(self) return { args = {}, attributes = { n = self.n } } end
  local t = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds, callbacks = { counter },
    args = args("snap", { eval_strategy = "steps", eval_steps = 2, save_strategy = "steps", save_steps = 2 }) }
  t:train()
  t:evaluate()
  T.eq(counter.n, 3)
  t:save_state()
  local function n_in(dir) return tckpt.read_state(dir).stateful_callbacks.Counter.attributes.n end
  T.eq(n_in(tmp .. "/snap/checkpoint-4"), 2, "at the last checkpoint"); T.eq(n_in(tmp .. "/snap"), 2, "save_state()")
  local ctl = tckpt.read_state(tmp .. "/snap").stateful_callbacks.TrainerControl.args
  T.eq(ctl.should_save and ctl.should_training_stop, true, "the last checkpoint's flags")
end)

T.test("load_best_model_at_end loads after the final metrics' record (transformers 5.17): on_log sees the last weights", function()
  -- transformers 5.17's _finalize_training logs the train metrics (on_log) and then loads the best checkpoint
  -- (here step 2's: greater_is_better with the loss makes the first evaluation the best)
  local function sum(m) return m:parameters()[1]:to("f64"):sum():item() end
  local at_end, at_log
  local cb = {}
  function cb.on_step_end(_, _, state, _, _, kw) if state.global_step == 4 then at_end = sum(kw.model) end end
  function cb.on_log(_, _, _, _, logs, kw) if logs.train_loss then at_log = sum(kw.model) end end
  local t = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds, callbacks = { cb },
    args = args("bestlast", { eval_strategy = "steps", eval_steps = 2, save_strategy = "steps", save_steps = 2,
      load_best_model_at_end = true, metric_for_best_model = "loss", greater_is_better = true }) }
  t:train()
  T.eq(t.state.best_global_step, 2)
  T.eq(at_log, at_end, "the final record: the last weights")
  assert(sum(t.model) ~= at_end, "then the best checkpoint's weights")
end)

T.test("callbacks are tables of on_* events the Trainer calls; others are refused", function()
  T.raises(function() zr.Trainer { model = model(), callbacks = { { on_prediction_step = function() end } } } end,
    "callbacks[1].on_prediction_step is not an event zrun's Trainer calls")
  T.raises(function() zr.Trainer { model = model(), callbacks = { print } } end, "callbacks[1] is a function")
  -- under ZenFlow the optimizer steps are split between the device and the host: refused, not silently uncalled
  T.raises(function()
    zr.Trainer { model = model(), train_dataset = train_ds, callbacks = { { on_optimizer_step = function() end } },
      args = args("zf", { deepspeed = (ZRUN_HOME or ".") .. "/configs/zero2_offload_zenflow.json" }) }:train()
  end, "callbacks[1] has on_pre_optimizer_step / on_optimizer_step, which the Trainer does not call under ZenFlow")
  T.raises(function() zr.EarlyStoppingCallback { patience = 2 } end, "unknown option 'patience'")
  T.raises(function() zr.EarlyStoppingCallback { early_stopping_patience = 0 } end, "early_stopping_patience must be")
  T.raises(function()
    zr.Trainer { model = model(), train_dataset = train_ds, callbacks = { zr.EarlyStoppingCallback() }, args = args("es0") }:train()
  end, "EarlyStoppingCallback requires metric_for_best_model")
end)

-- "better" = a higher eval loss while training lowers it: every evaluation after the first fails to
-- improve, so patience 2 stops after the third step; the best (first) checkpoint is loaded
local function es_args(out, extra)
  return args(out, { max_steps = 10, eval_strategy = "steps", eval_steps = 1, save_strategy = "steps", save_steps = 1,
    logging_steps = 1, metric_for_best_model = "loss", greater_is_better = true, load_best_model_at_end = true,
    resume_from_checkpoint = extra and extra.resume_from_checkpoint,
    restore_callback_states_from_checkpoint = extra and extra.restore })
end

T.test("EarlyStoppingCallback stops after patience evaluations without improvement; the best model is loaded", function()
  local es = zr.EarlyStoppingCallback { early_stopping_patience = 2 }
  local t = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds, callbacks = { es },
    args = es_args("es") }
  local r = t:train()
  T.eq(r.global_step, 3, "stopped at step 3 (two evaluations worse than step 1's)")
  local evals = {}
  for _, h in ipairs(t.state.log_history) do if h.eval_loss then evals[#evals + 1] = h.eval_loss end end
  assert(evals[2] < evals[1] and evals[3] < evals[1], "training lowers the eval loss")
  T.eq(t.state.best_global_step, 1)
  T.eq(t.state.best_metric, evals[1])
  T.eq(t.state.best_model_checkpoint, tmp .. "/es/checkpoint-1")
  T.near(t:evaluate().eval_loss, evals[1], 1e-9, 1e-9, "the best (step 1) model is the one loaded at the end")
  local saved = tckpt.read_state(tmp .. "/es/checkpoint-2")
  T.eq(saved.stateful_callbacks.EarlyStoppingCallback.attributes.early_stopping_patience_counter, 1,
    "trainer_state.json keeps the counter, as transformers' stateful_callbacks does")
  -- resumed from step 2 with a fresh callback and restore_callback_states_from_checkpoint: the counter
  -- comes back, so it stops at step 3 again
  local es2 = zr.EarlyStoppingCallback { early_stopping_patience = 2 }
  local r2 = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds, callbacks = { es2 },
    args = es_args("es", { resume_from_checkpoint = tmp .. "/es/checkpoint-2", restore = true }) }:train()
  T.eq(r2.global_step, 3, "resumed: stopped at step 3")
  -- without it (transformers' default) the counter starts at 0: two more evaluations without improvement
  local r3 = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds,
    callbacks = { zr.EarlyStoppingCallback { early_stopping_patience = 2 } },
    args = es_args("es", { resume_from_checkpoint = tmp .. "/es/checkpoint-2" }) }:train()
  T.eq(r3.global_step, 4, "resumed without the callbacks' states: stopped at step 4")
end)

sh("rm -rf '" .. tmp .. "'")
T.done()
