-- The end of an epoch as transformers 5.17's Trainer runs it, against its own runs
-- (tests/golden/trainer_epochs.json, written by tests/golden/make_trainer_golden.py): a last micro-batch
-- of fewer rows (dataloader_drop_last = false, HF's default), a last accumulation window of fewer
-- micro-batches (an optimizer step of its own, its loss the token mean of that window), the steps per
-- epoch and in all, the epoch counter, the learning rates, the logged losses and gradient norms and
-- where the weights end. llama_tiny's weights, fp32 on the CPU, rows of 6 to 16 tokens taken in order
-- and padded on the right (labels -100 there), so every micro-batch weighs by its tokens, not its rows.
-- Also how the micro-batches are dealt to several ranks, against accelerate's BatchSamplerShard.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"

local GOLDEN = (ZRUN_HOME or ".") .. "/tests/golden/"
local tmp = T.tmpdir()

local golden = cjson.decode(T.read_file(GOLDEN .. "trainer_epochs.json"))
local weights, meta = zr.load_safetensors(GOLDEN .. "llama_tiny.safetensors")
local cfg = cjson.decode(meta.config)

local function model()
  local m = zr.models.llama.LlamaForCausalLM(cfg)
  local sd = {}
  for n in m:named_parameters() do sd[n] = weights[n] end
  m:load_state_dict(sd, true)
  return m
end

local rows = {}
for i, r in ipairs(golden.rows) do rows[i] = { input_ids = r, idx = i - 1 } end
local dataset = zr.datasets.Dataset.from_rows(rows)

local function trained(case)
  local seen, inner = {}, zr.datasets.causal_lm_collator { pad_token_id = golden.pad }
  local function recording(batch_rows) -- the rows of each micro-batch, 0-based as the golden file has them
    local b = {}
    for k, r in ipairs(batch_rows) do b[k] = r.idx end
    seen[#seen + 1] = b
    return inner(batch_rows)
  end
  local m = model()
  local before = {}
  for n, p in m:named_parameters() do before[n] = p:clone() end
  local t = zr.Trainer { model = m, train_dataset = dataset, data_collator = recording,
    args = { output_dir = tmp .. "/" .. case.name, per_device_train_batch_size = case.per_device_train_batch_size,
      gradient_accumulation_steps = case.gradient_accumulation_steps, num_train_epochs = case.num_train_epochs,
      max_steps = case.max_steps, dataloader_drop_last = case.dataloader_drop_last, learning_rate = golden.learning_rate,
      lr_scheduler_type = "linear", warmup_steps = golden.warmup_steps, weight_decay = golden.weight_decay,
      max_grad_norm = golden.max_grad_norm, logging_steps = 1, save_strategy = "no", train_sampling_strategy = "sequential",
      seed = 0 } }
  local res = t:train()
  local moved = 0
  for n, p in m:named_parameters() do moved = moved + ((p - before[n]) ^ 2):sum():item() end
  local steps = {}
  for _, r in ipairs(t.state.log_history) do if r.loss and r.grad_norm then steps[#steps + 1] = r end end
  return t, res, steps, seen, moved
end

for _, case in ipairs(golden.cases) do
  T.test(("%s: %d rows, micro-batch %d, accumulation %d, %s, as transformers %s trains them"):format(case.name,
    #rows, case.per_device_train_batch_size, case.gradient_accumulation_steps, case.max_steps > 0 and
    ("max_steps %d"):format(case.max_steps) or ("%d epochs"):format(case.num_train_epochs), golden.transformers), function()
    local t, res, steps, seen, moved = trained(case)
    T.eq(res.global_step, case.global_step, "optimizer steps")
    T.eq(t.state.max_steps, case.state_max_steps, "max_steps")
    T.eq(#seen, #case.micro_batches, "micro-batches read")
    for k, b in ipairs(case.micro_batches) do
      T.eq(table.concat(seen[k], ","), table.concat(b, ","), ("rows of micro-batch %d"):format(k))
    end
    T.eq(#steps, case.global_step, "a logged step each")
    for s, r in ipairs(steps) do
      local at = (" at step %d"):format(s)
      T.eq(r.step, s, "step" .. at)
      T.near(r.epoch, case.epoch[s], 1e-12, 1e-12, "epoch" .. at)
      T.near(r.learning_rate, case.learning_rate[s], 1e-15, 1e-12, "learning rate" .. at)
      T.near(r.loss, case.loss[s], 1e-5, 2e-5, "loss" .. at)
      T.near(r.grad_norm, case.grad_norm[s], 1e-5, 1e-4, "grad norm" .. at)
    end
    T.near(res.train_loss, case.train_loss, 1e-5, 2e-5, "train_loss")
    T.near(moved, case.moved, 0, 1e-4, "sum of squared weight changes")
  end)
end

T.test(("several ranks: micro-batches dealt as accelerate %s's BatchSamplerShard deals them"):format(golden.accelerate),
  function()
  for _, c in ipairs(golden.dealt) do
    local order = {}
    for i = 1, c.rows do order[i] = i - 1 end
    for r, want in ipairs(c.ranks) do
      local flat = {}
      for _, b in ipairs(want) do for _, i in ipairs(b) do flat[#flat + 1] = i end end
      local what = ("%d rows, micro-batches of %d, rank %d of %d, drop_last %s"):format(c.rows, c.batch_size, r - 1,
        c.processes, tostring(c.drop_last))
      local got = zr.datasets.deal_batches(order, c.batch_size, c.processes, r - 1, c.drop_last)
      T.eq(table.concat(got, ","), table.concat(flat, ","), what)
      -- every micro-batch full, as many as the step arithmetic counts
      for _, b in ipairs(want) do T.eq(#b, c.batch_size, what .. ": a full micro-batch") end
      T.eq(#want, require("zrun.config").micro_batches_per_epoch(c.rows, c.processes, c.batch_size, c.drop_last, false),
        what .. ": micro-batches an epoch")
    end
  end
  -- one process: no dealing, the last micro-batch shorter (accelerate leaves a single process's loader alone)
  T.eq(table.concat(zr.datasets.deal_batches({ 1, 2, 3, 4, 5 }, 2, 1, 0, false), ","), "1,2,3,4,5")
  T.eq(table.concat(zr.datasets.deal_batches({ 1, 2, 3, 4, 5 }, 2, 1, 0, true), ","), "1,2,3,4")
end)

T.test("fewer rows than a micro-batch: one shorter step an epoch, or with dataloader_drop_last one line saying so", function()
  local few = zr.datasets.Dataset.from_rows({ rows[1], rows[2], rows[3] })
  local function trainer(drop)
    return zr.Trainer { model = model(), train_dataset = few, data_collator = zr.datasets.causal_lm_collator { pad_token_id = 0 },
      args = { output_dir = tmp .. "/few", per_device_train_batch_size = 4, gradient_accumulation_steps = 8,
        num_train_epochs = 2, dataloader_drop_last = drop, save_strategy = "no", logging_steps = 1 } }
  end
  local r = trainer(false):train()
  T.eq(r.global_step, 2, "an epoch of one micro-batch of 3 rows is one step")
  T.raises(function() trainer(true):train() end,
    "Trainer: 3 training rows are too few for one micro-batch (4 per device x 1 ranks, dataloader_drop_last): use more " ..
    "data, a smaller per_device_train_batch_size or dataloader_drop_last = false")
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
