-- What run_clm.py calls after training: log_metrics, save_metrics and save_state as transformers writes
-- them (trainer_pt_utils.py metrics_format / log_metrics / save_metrics; the expected texts below are
-- worked out by hand from those rules), total_flos as its 6 x non-embedding parameters x input tokens,
-- and the callback list's add / pop / remove.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local report = require "zrun.trainer_report"

local tmp = T.tmpdir()
local tok = zr.tokenizers.ByteTokenizer.new()
local blocks = T.sample_rows(tok):group_texts(32)
local function trainer(args, extra)
  zr.manual_seed(3)
  local a = { output_dir = tmp .. "/out", max_steps = 2, per_device_train_batch_size = 2, logging_steps = 1,
    save_strategy = "no", learning_rate = 3e-3 }
  for k, v in pairs(args or {}) do a[k] = v end
  local o = { model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama")),
    train_dataset = blocks:select(1, 8), eval_dataset = blocks:select(9, 12), args = a }
  for k, v in pairs(extra or {}) do o[k] = v end
  return zr.Trainer(o)
end
local function read(p) local f = assert(io.open(p, "rb")); local s = f:read("*a"); f:close(); return s end

T.test("metrics_format: runtimes h:mm:ss.cc, memory MB, FLOPs GF, floats to 4 decimals, counts as integers", function()
  local f = report.metrics_format { train_runtime = 5.1234, train_loss = 2.345678, epoch = 1, train_samples = 100,
    total_flos = 3 * 2 ^ 30 + 5, eval_mem_cpu_alloc_delta = 5 * 2 ^ 20 + 7, eval_runtime = 90061.5,
    train_samples_per_second = 12.5 }
  T.same(f, { train_runtime = "0:00:05.12", train_loss = "2.3457", epoch = "1.0", train_samples = "100",
    total_flos = "3GF", eval_mem_cpu_alloc_delta = "5MB", eval_runtime = "1 day, 1:01:01.50",
    train_samples_per_second = "12.5" })
end)

T.test("log_metrics prints transformers' block; save_metrics writes <split>_results.json and all_results.json", function()
  local t = trainer()
  local out = T.printed(function() t:log_metrics("train", { epoch = 1, train_loss = 2.34567 }) end)
  T.eq(out, "***** train metrics *****\n  epoch      =    1.0\n  train_loss = 2.3457")
  t:save_metrics("train", { epoch = 1, train_loss = 2.5 })
  T.eq(read(tmp .. "/out/train_results.json"), '{\n    "epoch": 1.0,\n    "train_loss": 2.5\n}')
  t:save_metrics("eval", { eval_loss = 3.25, epoch = 1 })
  T.same(cjson.decode(read(tmp .. "/out/all_results.json")), { epoch = 1, train_loss = 2.5, eval_loss = 3.25 })
  -- (TRL 1.10's num_tokens and eval_num_tokens are floats, the means of its metric lists: 600.0; transformers'
  -- num_input_tokens_seen an int)
  t:save_metrics("sft", { num_tokens = 600, eval_num_tokens = 600, num_input_tokens_seen = 640 }, false)
  T.eq(read(tmp .. "/out/sft_results.json"),
    '{\n    "eval_num_tokens": 600.0,\n    "num_input_tokens_seen": 640,\n    "num_tokens": 600.0\n}')
  t:save_metrics("test", { test_loss = 1.5 }, false)
  T.eq(cjson.decode(read(tmp .. "/out/all_results.json")).test_loss, nil, "combined = false: all_results.json as it was")
  T.raises(function() t:log_metrics(nil, {}) end, "log_metrics(split, metrics): split must be a name")
end)

T.test("train() returns transformers' metrics; total_flos is 6 x non-embedding parameters x input tokens", function()
  local t = trainer { output_dir = tmp .. "/flos" }
  local r = t:train()
  local n = t.model:num_parameters(false, true)
  T.eq(n, t.model:num_parameters() - t.model.config.vocab_size * t.model.config.hidden_size,
    "the tied embedding (vocab x hidden) left out")
  local tokens = 2 * 2 * 32 -- two steps of two 32-token rows
  T.eq(r.metrics.total_flos, 6 * n * tokens)
  T.eq(r.metrics.step, nil, "the metrics have no step (transformers' do not)")
  T.eq(r.global_step, 2); T.eq(r.training_loss, r.metrics.train_loss, "TrainOutput's training_loss")
  T.eq(t:is_world_process_zero() and t:is_local_process_zero(), true)
  T.eq(t.state.log_history[#t.state.log_history].step, 2, "the log record has it")
  for _, k in ipairs { "train_runtime", "train_loss", "epoch", "train_steps_per_second", "train_samples_per_second" } do
    T.eq(type(r.metrics[k]), "number", k)
  end
  t:save_state()
  local st = cjson.decode(read(tmp .. "/flos/trainer_state.json"))
  T.eq(st.global_step, 2); T.eq(st.total_flos, 6 * n * tokens); T.eq(#st.log_history, #t.state.log_history)
  -- a Trainer that never trained (no train_dataset): the initial state, as transformers writes it
  local idle = zr.Trainer { model = t.model, args = { output_dir = tmp .. "/idle" } }
  idle:save_state()
  T.eq(cjson.decode(read(tmp .. "/idle/trainer_state.json")).global_step, 0)
end)

-- x has at most n decimals (Python's round(x, n), transformers' speed_metrics)
local function rounded(x, n) local m = 10 ^ n; return math.abs(x * m - math.floor(x * m + 0.5)) < 1e-6 end
-- a rate of k over the runtime rt (both as speed_metrics rounds them: rt to 4 decimals)
local function rate(v, k, rt, what) T.near(v * rt, k, k * (6e-5 / rt + 2e-3), 0, what) end

T.test("speed metrics as transformers 5.17's speed_metrics: rounded, rates over the planned run", function()
  -- transformers 5.17, a callback stopping training after 2 of max_steps 4 (EarlyStoppingCallback there): its
  -- train_steps_per_second is max_steps / train_runtime and train_samples_per_second max_steps x total batch /
  -- train_runtime (here 4 and 8 over the runtime, not the 2 steps trained); runtime to 4 decimals, rates to 3
  local stop = { on_step_end = function(_, _, state, control) if state.global_step == 2 then control.should_training_stop = true end end }
  local t = trainer({ output_dir = tmp .. "/speed", max_steps = 4 }, { callbacks = { stop } })
  local m = t:train().metrics
  T.eq(t.state.global_step, 2)
  T.eq(rounded(m.train_runtime, 4) and rounded(m.train_steps_per_second, 3) and rounded(m.train_samples_per_second, 3), true,
    "rounded as speed_metrics")
  rate(m.train_steps_per_second, 4, m.train_runtime, "max_steps / runtime")
  rate(m.train_samples_per_second, 8, m.train_runtime, "max_steps x 2 rows / runtime")
  -- by epochs: the rows x num_train_epochs (8 x 1.5 = 12 samples; 6 steps)
  m = trainer({ output_dir = tmp .. "/speed_ep", max_steps = -1, num_train_epochs = 1.5 }):train().metrics
  rate(m.train_samples_per_second, 12, m.train_runtime, "rows x epochs / runtime")
  rate(m.train_steps_per_second, 6, m.train_runtime, "steps / runtime")
  -- evaluate: eval_steps_per_second (transformers 5.17 reports it: ceil(rows / (eval batch x ranks)) batches)
  local ev = trainer({ output_dir = tmp .. "/speed_ev", per_device_eval_batch_size = 3 }):evaluate()
  T.eq(rounded(ev.eval_runtime, 4) and rounded(ev.eval_samples_per_second, 3) and rounded(ev.eval_steps_per_second, 3), true)
  rate(ev.eval_steps_per_second, 2, ev.eval_runtime, "2 batches of the 4 rows / runtime")
  rate(ev.eval_samples_per_second, 4, ev.eval_runtime, "4 rows / runtime")
end)

T.test("train_loss after a resume is transformers 5.17's: this run's step losses over the global step", function()
  -- transformers 5.17 (_finalize_training: _total_loss_scalar / global_step) resumed at step 2 of 4 reports
  -- (loss3 + loss4) / 4, not their mean (max_steps 12 resumed at 4: 3.0096 where the steps' mean is 4.5144)
  trainer({ output_dir = tmp .. "/res", max_steps = 4, save_strategy = "steps", save_steps = 2 }):train()
  local t = trainer({ output_dir = tmp .. "/res", max_steps = 4, save_strategy = "no" })
  local r = t:train { resume_from_checkpoint = tmp .. "/res/checkpoint-2" }
  local l = {}
  for _, h in ipairs(t.state.log_history) do if h.loss then l[h.step] = h.loss end end
  T.near(r.metrics.train_loss, (l[3] + l[4]) / 4, 1e-9, 1e-9, "train_loss")
  T.eq(r.training_loss, r.metrics.train_loss)
end)

T.test("include_num_input_tokens_seen: every record has the inputs seen, training logs train_runtime and tokens/s", function()
  -- transformers 5.17's log(): num_input_tokens_seen in every record (training logs, evaluations, the final
  -- metrics), the count at that step (an evaluation between two logs too), and in the training logs
  -- speed_metrics("train", start_time, num_tokens = the tokens seen since train() began)
  local t = trainer { output_dir = tmp .. "/seen", max_steps = 4, logging_steps = 2, eval_strategy = "steps", eval_steps = 3,
    include_num_input_tokens_seen = true }
  local r = t:train()
  local h = t.state.log_history
  local kinds = {}
  for _, rec in ipairs(h) do
    T.eq(rec.num_input_tokens_seen, rec.step * 2 * 32, "step " .. rec.step) -- (two rows of 32 tokens a step)
    if rec.loss then
      T.eq(rounded(rec.train_runtime, 4) and rounded(rec.train_tokens_per_second, 3), true)
      rate(rec.train_tokens_per_second, rec.num_input_tokens_seen, rec.train_runtime, "tokens / runtime")
    end
    kinds[#kinds + 1] = (rec.loss and "log" or rec.eval_loss and "eval" or "end") .. "@" .. rec.step
  end
  T.eq(table.concat(kinds, " "), "log@2 eval@3 log@4 eval@4 end@4")
  T.eq(r.metrics.num_input_tokens_seen, 4 * 64, "the final metrics")
end)

T.test("an evaluation before train(): its preparation time in every later evaluation, no record in the run's history", function()
  -- transformers 5.17 (evaluate(), then train() with eval_on_start, max_steps 2, eval_steps 2): evaluate() before
  -- training prepares the model and adds eval_model_preparation_time (rounded to 4 places) to its metrics and to
  -- every later evaluation's; train() starts a new TrainerState, so that evaluation is in no log_history, and
  -- eval_on_start evaluates again (its record's epoch TrainerState's starting 0, a Python int: "epoch": 0). A
  -- Trainer that trains first reports no preparation time.
  local t = trainer { output_dir = tmp .. "/prep", max_steps = 2, eval_strategy = "steps", eval_steps = 2,
    eval_on_start = true }
  local before = t:evaluate()
  T.eq(type(before.eval_model_preparation_time), "number")
  -- (transformers 5.17's evaluate() returns the metrics log() saw, epoch added, without the step its record has)
  T.eq(before.step, nil, "evaluate()'s metrics have no step")
  T.eq(before.epoch, 0, "evaluate()'s metrics have the epoch")
  T.eq(rounded(before.eval_model_preparation_time, 4), true)
  t:train()
  local kinds = {}
  for _, h in ipairs(t.state.log_history) do
    if h.eval_loss then T.eq(h.eval_model_preparation_time, before.eval_model_preparation_time) end
    kinds[#kinds + 1] = (h.loss and "log" or h.eval_loss and "eval" or "end") .. "@" .. h.step
  end
  T.eq(table.concat(kinds, " "), "eval@0 log@1 log@2 eval@2 end@2")
  t:save_state()
  T.eq(read(tmp .. "/prep/trainer_state.json"):find('\n      "epoch": 0,\n', 1, true) ~= nil, true, "epoch 0 an int")
  local t2 = trainer { output_dir = tmp .. "/prep2", max_steps = 2 }
  t2:train()
  T.eq(t2:evaluate().eval_model_preparation_time, nil, "trained first: none")
end)

T.test("trainer_state.json as transformers 5.17 writes it: floats, eval_steps, TrainerControl", function()
  -- transformers 5.17, 2 epochs with a checkpoint each: "epoch": 1.0 and "total_flos": N.0 (Python floats),
  -- eval_steps 500 (TrainerState's default) without an eval_steps argument, and stateful_callbacks.TrainerControl
  -- with should_save true, should_training_stop true only in the last step's checkpoint
  local t = trainer { output_dir = tmp .. "/state", max_steps = -1, num_train_epochs = 2, save_strategy = "epoch",
    per_device_train_batch_size = 4, learning_rate = 0 }
  t:train()
  local text1 = read(tmp .. "/state/checkpoint-2/trainer_state.json")
  T.eq(text1:find('\n  "epoch": 1.0,', 1, true) ~= nil, true, "epoch as a float")
  T.eq(text1:find('\n  "total_flos": %d+%.0,') ~= nil, true, "total_flos as a float")
  T.eq(text1:find('"learning_rate": 0.0,', 1, true) ~= nil, true, "a whole learning rate as a float")
  T.eq(text1:find('"step": 2[,\n]') ~= nil and text1:find('"global_step": 2,', 1, true) ~= nil, true, "counts as integers")
  local s1, s2 = cjson.decode(text1), cjson.decode(read(tmp .. "/state/checkpoint-4/trainer_state.json"))
  T.eq(s1.eval_steps, 500); T.eq(s1.logging_steps, 1); T.eq(s1.save_steps, 500)
  T.same(s1.stateful_callbacks.TrainerControl, { args = { should_training_stop = false, should_epoch_stop = false,
    should_save = true, should_evaluate = false, should_log = false }, attributes = {} })
  T.eq(s2.stateful_callbacks.TrainerControl.args.should_training_stop, true, "the last step's checkpoint")
  -- no record yet (a checkpoint before the first log, or a state never trained): "log_history": [], a list
  local idle = zr.Trainer { model = t.model, args = { output_dir = tmp .. "/state_idle" } }
  idle:save_state()
  T.eq(read(tmp .. "/state_idle/trainer_state.json"):find('\n  "log_history": [],', 1, true) ~= nil, true, "an empty list")
end)

T.test("add_callback, pop_callback (by table or name), remove_callback", function()
  local t = trainer()
  local seen = {}
  local cb = { name = "Mine", on_log = function(_, _, state) seen[#seen + 1] = state.global_step end }
  t:add_callback(cb)
  T.raises(function() t:add_callback { on_predict = function() end } end, "on_predict is not an event zrun's Trainer calls")
  t:train()
  T.eq(#seen >= 2, true, "the added callback ran")
  T.eq(t:pop_callback("Mine"), cb)
  T.eq(t:pop_callback(cb), nil)
  t:add_callback(cb); t:remove_callback(cb)
  T.eq(#t.callbacks, 0)
end)

T.done()
