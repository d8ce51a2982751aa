-- Runs zrun's Trainer on a case of transformers' own Trainer runs (tests/golden/trainer_epochs*.json,
-- written by tests/golden/make_trainer_golden.py) and checks it step by step: shared by
-- test_trainer_epochs.lua (one process) and tests/mpi/trainer_check.lua (the 2-process file, under mpirun).
-- llama_tiny's golden weights, fp32 on the CPU; the file's rows in order, padded on the right.
local zr = require "zrun"
local cjson = require "cjson"
local M = {}

local GOLDEN = (ZRUN_HOME or ".") .. "/tests/golden/"

-- The golden file `name` (in tests/golden), with the model and dataset its runs start from:
-- g.model() (a fresh llama_tiny with the golden weights), g.dataset (rows {input_ids =, idx = 0-based}).
function M.load(name)
  local T = zr.testing
  local g = cjson.decode(T.read_file(GOLDEN .. name))
  local weights, meta = zr.load_safetensors(GOLDEN .. "llama_tiny.safetensors")
  local cfg = cjson.decode(meta.config)
  function g.model()
    local m = zr.models.llama.LlamaForCausalLM(cfg)
    local sd = {}
    for n in m:named_parameters() do sd[n] = weights[n] end
    m:load_state_dict(sd, true)
    return m
  end
  local rows = {}
  for i, r in ipairs(g.rows) do rows[i] = { input_ids = r, idx = i - 1 } end
  g.dataset = zr.datasets.Dataset.from_rows(rows)
  return g
end

-- The case's arguments, as the golden run's TrainingArguments.
function M.args(g, case, output_dir)
  return { output_dir = output_dir, per_device_train_batch_size = case.per_device_train_batch_size,
    gradient_accumulation_steps = case.gradient_accumulation_steps, num_train_epochs = case.num_train_epochs,
    max_steps = case.max_steps, dataloader_drop_last = case.dataloader_drop_last, learning_rate = g.learning_rate,
    lr_scheduler_type = "linear", warmup_steps = g.warmup_steps, weight_decay = g.weight_decay,
    max_grad_norm = g.max_grad_norm, logging_steps = 1, save_strategy = "no", train_sampling_strategy = "sequential",
    seed = 0 }
end

-- Trains the case and checks it against the golden run: steps, max_steps, this rank's micro-batches
-- (rows; the 2-process file keeps one list a rank), per step the epoch, learning rate, logged loss
-- (over the ranks) and grad norm, train_loss and how far the weights moved.
function M.check(g, case, output_dir)
  local T = zr.testing
  local seen, inner = {}, zr.datasets.causal_lm_collator { pad_token_id = g.pad }
  local function recording(batch_rows) -- the rows of each micro-batch, 0-based as the golden file has them
    local b = {}
    for k, r in ipairs(batch_rows) do b[k] = r.idx end
    seen[#seen + 1] = b
    return inner(batch_rows)
  end
  local m = g.model()
  local before = {}
  for n, p in m:named_parameters() do before[n] = p:clone() end
  local t = zr.Trainer { model = m, train_dataset = g.dataset, data_collator = recording, args = M.args(g, case, output_dir) }
  local res = t:train()
  local moved = 0
  for n, p in m:named_parameters() do moved = moved + ((p - before[n]) ^ 2):sum():item() end
  local steps = {}
  for _, r in ipairs(t.state.log_history) do if r.loss and r.grad_norm then steps[#steps + 1] = r end end

  T.eq(res.global_step, case.global_step, "optimizer steps")
  T.eq(t.state.max_steps, case.state_max_steps, "max_steps")
  local want = g.processes and case.micro_batches[zr.dist.rank() + 1] or case.micro_batches
  T.eq(#seen, #want, "micro-batches read")
  for k, b in ipairs(want) do
    T.eq(table.concat(seen[k], ","), table.concat(b, ","), ("rows of micro-batch %d"):format(k))
  end
  T.eq(#steps, case.global_step, "a logged step each")
  for s, r in ipairs(steps) do
    local at = (" at step %d"):format(s)
    T.eq(r.step, s, "step" .. at)
    T.near(r.epoch, case.epoch[s], 1e-12, 1e-12, "epoch" .. at)
    T.near(r.learning_rate, case.learning_rate[s], 1e-15, 1e-12, "learning rate" .. at)
    T.near(r.loss, case.logged_loss[s], 1e-5, 2e-5, "loss" .. at)
    T.near(r.grad_norm, case.grad_norm[s], 1e-5, 1e-4, "grad norm" .. at)
  end
  T.near(res.train_loss, case.train_loss, 1e-5, 2e-5, "train_loss")
  T.near(moved, case.moved, 0, 1e-4, "sum of squared weight changes")
end

return M
