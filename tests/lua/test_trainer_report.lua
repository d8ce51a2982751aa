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
