-- Writes DeepSpeed-style monitor output (TensorBoard event file + CSV files) from a short fp16 run of
-- the tiny built-in Llama, for tests/bench/check_tensorboard.py to read with TensorBoard's reader.
--   zrun tests/bench/monitor_run.lua OUT_DIR     -> OUT_DIR/tb/job/events.out.tfevents.*, OUT_DIR/csv/job/*.csv
local zr = require "zrun"
local out = assert(arg[1], "usage: zrun tests/bench/monitor_run.lua OUT_DIR")
zr.manual_seed(11)
local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
local engine = zr.initialize({ model = model, config = {
  train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = 2, steps_per_print = 1000,
  wall_clock_breakdown = true, fp16 = { enabled = true, initial_scale_power = 8 },
  optimizer = { type = "AdamW", params = { lr = 1e-3 } },
  scheduler = { type = "WarmupLR", params = { warmup_max_lr = 1e-3, warmup_num_steps = 4, warmup_type = "linear" } },
  tensorboard = { enabled = true, output_path = out .. "/tb", job_name = "job" },
  csv_monitor = { enabled = true, output_path = out .. "/csv", job_name = "job" } } })
zr.manual_seed(5)
local ids = (zr.rand({ 2, 16 }) * 250):to("i64")
for _ = 1, 20 do
  local o = engine(ids, ids)
  engine:backward(o.loss)
  engine:step()
end
engine.monitor:close()
print("monitor_run: 10 steps written under " .. out)
