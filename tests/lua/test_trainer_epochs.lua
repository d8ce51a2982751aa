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
local TG = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "trainer_golden.lua")

local tmp = T.tmpdir()
local golden = TG.load("trainer_epochs.json")
local rows = golden.dataset.rows

for _, case in ipairs(golden.cases) do
  T.test(("%s: %d rows, micro-batch %d, accumulation %d, %s, as transformers %s trains them"):format(case.name,
    #rows, case.per_device_train_batch_size, case.gradient_accumulation_steps, case.max_steps > 0 and
    ("max_steps %d"):format(case.max_steps) or ("%d epochs"):format(case.num_train_epochs), golden.transformers), function()
    TG.check(golden, case, tmp .. "/" .. case.name)
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
      T.eq(#want, require("zrun.config").micro_batches_per_epoch(c.rows, c.processes, c.batch_size, c.drop_last),
        what .. ": micro-batches an epoch")
    end
  end
  -- one process: no dealing, the last micro-batch shorter (accelerate leaves a single process's loader alone)
  T.eq(table.concat(zr.datasets.deal_batches({ 1, 2, 3, 4, 5 }, 2, 1, 0, false), ","), "1,2,3,4,5")
  T.eq(table.concat(zr.datasets.deal_batches({ 1, 2, 3, 4, 5 }, 2, 1, 0, true), ","), "1,2,3,4")
end)

T.test("save and eval strategy \"epoch\" end on the shorter step; resuming after it gives transformers' steps", function()
  local case = golden.cases[2] -- partial_window: 3 steps an epoch, the 3rd of one micro-batch
  assert(case.name == "partial_window")
  local out = tmp .. "/epoch_strategy"
  local a = TG.args(golden, case, out)
  a.save_strategy, a.eval_strategy = "epoch", "epoch"
  local collator = zr.datasets.causal_lm_collator { pad_token_id = golden.pad }
  local t = zr.Trainer { model = golden.model(), train_dataset = golden.dataset, eval_dataset = golden.dataset,
    data_collator = collator, args = a }
  t:train()
  local kept, evals = {}, {}
  for _, e in ipairs(require("zrun.trainer_checkpoint").list(out)) do kept[#kept + 1] = e.step end
  for _, h in ipairs(t.state.log_history) do if h.eval_loss then evals[#evals + 1] = h.step end end
  T.eq(table.concat(kept, ","), "3,6", "checkpoints at the epochs' ends")
  T.eq(table.concat(evals, ","), "3,6", "evaluations at the epochs' ends")
  local b = TG.args(golden, case, out)
  b.save_strategy = "no"
  local t2 = zr.Trainer { model = golden.model(), train_dataset = golden.dataset, data_collator = collator, args = b }
  t2:train { resume_from_checkpoint = out .. "/checkpoint-3" }
  local n = 0
  for _, h in ipairs(t2.state.log_history) do
    if h.loss and h.grad_norm then
      n = n + 1
      T.near(h.loss, case.logged_loss[h.step], 1e-5, 2e-5, ("loss at step %d"):format(h.step))
    end
  end
  T.eq(n, 6, "steps 1-3 from checkpoint-3's trainer_state.json, then 4-6 trained")
  T.eq(t2.state.global_step, 6)
end)

T.test("fewer rows than a micro-batch: one shorter step an epoch, or with dataloader_drop_last one line saying so", function()
  local few = zr.datasets.Dataset.from_rows({ rows[1], rows[2], rows[3] })
  local function trainer(drop)
    return zr.Trainer { model = golden.model(), train_dataset = few, data_collator = zr.datasets.causal_lm_collator { pad_token_id = 0 },
      args = { output_dir = tmp .. "/few", per_device_train_batch_size = 4, gradient_accumulation_steps = 8,
        num_train_epochs = 2, dataloader_drop_last = drop, save_strategy = "no", logging_steps = 1 } }
  end
  local r = trainer(false):train()
  T.eq(r.global_step, 2, "an epoch of one micro-batch of 3 rows is one step")
  T.raises(function() trainer(true):train() end,
    "Trainer: 3 training rows are too few for one micro-batch (4 per device x 1 ranks, dataloader_drop_last): use more " ..
    "data, a smaller per_device_train_batch_size or dataloader_drop_last = false")
end)

-- transformers 5.17 / torch 2.11, Trainer.evaluate() in one process on the golden model, per_device_eval_batch_size 4,
-- dataloader_drop_last: 7 rows read as one batch of 4 (eval_loss 5.537783622741699), 3 rows as none (no eval_loss)
T.test("evaluate with dataloader_drop_last drops the last shorter batch, as transformers 5.17 evaluates", function()
  local function evaluate(n)
    local ev = {}
    for i = 1, n do ev[i] = rows[i] end
    local t = zr.Trainer { model = golden.model(), data_collator = zr.datasets.causal_lm_collator { pad_token_id = 0 },
      args = { output_dir = tmp .. "/eval_drop", per_device_eval_batch_size = 4, dataloader_drop_last = true } }
    return t:evaluate(zr.datasets.Dataset.from_rows(ev))
  end
  T.near(evaluate(7).eval_loss, 5.537783622741699, 1e-6, 1e-6, "eval_loss of rows 1-4")
  T.raises(function() evaluate(3) end, "Trainer:evaluate: dataloader_drop_last = true drops all 3 evaluation rows (fewer " ..
    "than per_device_eval_batch_size 4 x 1 ranks: transformers reports no eval_loss then); lower per_device_eval_batch_size")
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
