-- Trainer checks under mpirun for tests/mpi/test_trainer.sh (2 ranks, CPU, tiny Llama):
--   full   STAGE WORK   10 steps with accumulation 2, checkpoints every 4 steps in WORK/s<STAGE>;
--                       asserts learning (loss falls by 0.5, grad_norm > 0)
--   resume STAGE WORK   a fresh process resumes WORK/s<STAGE>/checkpoint-4 and must give the losses
--                       of steps 5-10 that checkpoint-10's trainer_state.json holds, bit for bit
--   eval   STAGE        Trainer:evaluate over 2 ranks with an odd number of uneven rows equals the
--                       token-weighted loss computed row by row in one process (before ZeRO shards)
--   early  STAGE WORK   EarlyStoppingCallback + save_strategy "best" + load_best_model_at_end: every
--                       rank stops at the same step
--   tokens STAGE WORK   padded rows of different lengths, micro-batch 1 x accumulation 2 on each rank:
--                       the losses and gradient norms of one process with micro-batches of 2 (run
--                       first as `zrun trainer_check.lua tokens_ref STAGE WORK`, without mpirun), as
--                       average_tokens_across_devices makes them; without it they differ
--   hf_epochs 0 WORK    transformers' own Trainer on 2 processes (tests/golden/trainer_epochs_2ranks.json):
--                       each rank's micro-batches, the logged losses, grad norms, learning rates, epochs,
--                       train_loss and the weights' movement, case by case (tests/lua/trainer_golden.lua)
--   train_loss 0 WORK   the final train_loss where steps follow the last logged one (logging_steps 2 with max_steps 5;
--                       logging_strategy "no"): transformers adds each process's own loss of those steps, not the
--                       mean over the processes, so each rank reports its own train_loss (hard-coded from torchrun)
--   sft_eval 0 WORK     zr.SFTTrainer on 2 ranks as TRL's on 2 processes (hard-coded): the training logs' num_tokens,
--                       mean_token_accuracy and entropy, and the evaluations' eval_mean_token_accuracy and eval_entropy:
--                       accelerate deals evaluation batches, not rows, completing the last round from the first rows,
--                       and TRL's gather_for_metrics keeps at the end of a loader (the step reading an epoch's last
--                       micro-batch; an evaluation's last round) the first n mod (batch x ranks) processes' sums only,
--                       their repeated rows counted
--   hf_eval 0 WORK      Trainer:evaluate with dataloader_drop_last on 2 ranks: the rows transformers' evaluation reads
--                       (an incomplete last round dropped; its eval_loss, hard-coded), and one line where it drops them all
--   epoch_end STAGE WORK 9 padded rows, micro-batch 1 x accumulation 2, 2 epochs: each rank reads 5 micro-batches
--                       an epoch (rank 1's last one row 1 again, as accelerate completes the last round) in
--                       steps of 2, 2 and 1 micro-batches; the losses and gradient norms of one process reading
--                       rows 1-9 and 1 in micro-batches of 2 (epoch_end_ref, without mpirun)
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local tckpt = require "zrun.trainer_checkpoint"
local mode, stage, work = arg[1], tonumber(arg[2]), arg[3]

local tok = zr.tokenizers.ByteTokenizer.new()
local text = T.read_file((ZRUN_HOME or ".") .. "/recipes/data/sample.txt")
local blocks = T.sample_rows(tok):group_texts(24)

local function model()
  zr.manual_seed(5)
  return zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
end
local function args(out, extra)
  local a = { output_dir = out, per_device_train_batch_size = 2, gradient_accumulation_steps = 2, max_steps = 10,
    learning_rate = 3e-3, weight_decay = 0.1, warmup_steps = 2, logging_steps = 1, save_steps = 4, seed = 3,
    deepspeed = { train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto", gradient_clipping = 1.0,
      steps_per_print = 1000, optimizer = { type = "AdamW", params = { lr = "auto", weight_decay = "auto" } },
      zero_optimization = { stage = stage, stage3_gather_16bit_weights_on_model_save = true } } }
  for k, v in pairs(extra or {}) do a[k] = v end
  return a
end
local function losses(log)
  local out = {}
  for _, r in ipairs(log) do if r.loss then out[r.step] = r.loss end end
  return out
end
local name = ("stage %d, %d ranks"):format(stage, dist.world_size())
-- rank 0 reports; an error on another rank ends that process, and mpirun with it
local function test(what, fn) if dist.rank() == 0 then T.test(what, fn) else fn() end end

-- The Trainer on padded rows of different lengths (sequential order, accumulation 2, ZeRO `stage`),
-- micro-batches of bs rows, more arguments in extra: its step count, steps an epoch and per-step
-- { loss, grad_norm }.
local function padded_run(rs, bs, extra)
  local a = { output_dir = work .. "/padded", per_device_train_batch_size = bs, gradient_accumulation_steps = 2,
    logging_steps = 1, save_strategy = "no", train_sampling_strategy = "sequential",
    deepspeed = { train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto", gradient_clipping = "auto",
      zero_optimization = { stage = stage } } }
  for k, v in pairs(extra) do a[k] = v end
  local t = zr.Trainer { model = model(), train_dataset = zr.datasets.Dataset.from_rows(rs),
    data_collator = zr.datasets.causal_lm_collator { pad_token_id = 0 }, args = a }
  local r = t:train()
  local out = { steps = r.global_step, per_epoch = t.steps_per_epoch, log = {} }
  for _, l in ipairs(t.state.log_history) do if l.loss then out.log[#out.log + 1] = { l.loss, l.grad_norm } end end
  return out
end

if mode == "full" then
  test("Trainer learns on " .. name, function()
    local t = zr.Trainer { model = model(), train_dataset = blocks, args = args(work .. "/s" .. stage) }
    t:train()
    local l = losses(t.state.log_history)
    assert(l[10] < l[1] - 0.5, ("loss %.4f -> %.4f"):format(l[1], l[10]))
    assert(t.engine.last_grad_norm > 0, "grad_norm 0")
    T.eq(#tckpt.list(work .. "/s" .. stage), 3)
    -- total_flos: 6 x non-embedding parameters x every rank's input tokens (transformers sums the processes')
    local a = t.args
    local tokens = 10 * a.gradient_accumulation_steps * a.per_device_train_batch_size * 24 * dist.world_size()
    T.eq(t.state.total_flos, 6 * t.model:num_parameters(false, true) * tokens, "total_flos")
    T.eq(tckpt.read_state(work .. "/s" .. stage .. "/checkpoint-8").total_flos, t.state.total_flos * 8 / 10,
      "total_flos at checkpoint-8")
  end)
elseif mode == "resume" then
  test("resume on " .. name .. " gives the uninterrupted losses bit for bit", function()
    local dir = work .. "/s" .. stage
    local ref = losses(tckpt.read_state(dir .. "/checkpoint-10").log_history)
    local t = zr.Trainer { model = model(), train_dataset = blocks, args = args(dir, { save_strategy = "no" }) }
    t:train { resume_from_checkpoint = dir .. "/checkpoint-4" }
    local got = losses(t.state.log_history)
    for s = 5, 10 do T.near(got[s], ref[s], 0, 0, "loss at step " .. s) end
    T.eq(t.state.total_flos, tckpt.read_state(dir .. "/checkpoint-10").total_flos, "total_flos after the resume")
  end)
elseif mode == "eval" then
  test("evaluate on " .. name .. ": every token once, weighted equally", function()
    local m = model()
    local rows = {}
    for i = 1, 7 do rows[i] = { input_ids = tok:encode(text:sub(i * 40, i * 40 + 5 + 4 * i)) } end
    local sum, count = 0, 0
    zr.no_grad(function()
      for _, r in ipairs(rows) do
        local ids = zr.tensor({ r.input_ids }, { dtype = "i64" })
        sum, count = sum + m(ids, ids).loss:item() * (#r.input_ids - 1), count + #r.input_ids - 1
      end
    end)
    local t = zr.Trainer { model = m, eval_dataset = zr.datasets.Dataset.from_rows(rows), processing_class = tok,
      args = args(work .. "/eval", { per_device_eval_batch_size = 2 }) }
    local r = t:evaluate()
    T.eq(r.eval_tokens, count)
    T.near(r.eval_loss, sum / count, 1e-6, 1e-6, "eval_loss")
    -- a padding-free collator joins a batch into one row: the row repeated to keep the ranks in step must
    -- still count nothing (its labels -100 before collation)
    local pf = zr.Trainer { model = m, eval_dataset = zr.datasets.Dataset.from_rows(rows), processing_class = tok,
      data_collator = zr.datasets.causal_lm_collator { pad_token_id = 0, padding_free = true },
      args = args(work .. "/eval_pf", { per_device_eval_batch_size = 2 }) }
    local rp = pf:evaluate()
    T.eq(rp.eval_tokens, count, "padding-free: eval_tokens")
    T.near(rp.eval_loss, sum / count, 1e-6, 1e-6, "padding-free: eval_loss")
    T.eq(t:save_model(work .. "/eval/model"), true)
    if dist.rank() == 0 then
      local m2 = zr.models.llama.from_pretrained(work .. "/eval/model")
      local n = 0
      for _ in pairs(m2:state_dict()) do n = n + 1 end
      assert(n > 0)
    end
  end)
elseif mode == "early" then
  -- EarlyStoppingCallback with save_strategy "best" and load_best_model_at_end over the ranks: the
  -- evaluation is all-reduced, so every rank stops at the same step (no rank left in a collective)
  test("EarlyStoppingCallback and save_strategy \"best\" on " .. name .. ": every rank stops at step 3", function()
    local out = work .. "/early" .. stage
    local t = zr.Trainer { model = model(), train_dataset = blocks, eval_dataset = blocks:select(1, 6),
      callbacks = { zr.EarlyStoppingCallback { early_stopping_patience = 2 } },
      args = args(out, { eval_strategy = "steps", eval_steps = 1, save_strategy = "best", save_total_limit = 1,
        metric_for_best_model = "loss", greater_is_better = true, load_best_model_at_end = true }) }
    local r = t:train()
    T.eq(r.global_step, 3, "stopped after two evaluations without a new best")
    T.eq(t.state.best_global_step, 1)
    local kept = {}
    for _, c in ipairs(tckpt.list(out)) do kept[#kept + 1] = c.step end
    T.eq(table.concat(kept, ","), "1", "save_strategy best: only the first evaluation was a best")
  end)
elseif mode == "tokens" or mode == "tokens_ref" then
  local rows = T.varied_rows(tok, 12, function(i) return 4 + (i * 29) % 41 end).rows
  local function run(bs, avg)
    return padded_run(rows, bs, { max_steps = 3, optim = "sgd", learning_rate = 0.5, lr_scheduler_type = "constant",
      max_grad_norm = 0, average_tokens_across_devices = avg }).log
  end
  local ref_file = ("%s/tokens_ref%d.json"):format(work, stage)
  if mode == "tokens_ref" then -- one process, the 2 ranks' rows in each micro-batch
    local f = assert(io.open(ref_file, "w"))
    f:write(require("cjson").encode(run(2, true)))
    f:close()
  else
    test("average_tokens_across_devices on " .. name .. ": the losses and gradient norms of one batch of all rows", function()
      local ref = require("cjson").decode(T.read_file(ref_file))
      local got = run(1, true)
      for s = 1, 3 do
        T.near(got[s][1], ref[s][1], 1e-5, 1e-5, "loss at step " .. s)
        T.near(got[s][2], ref[s][2], 1e-5, 1e-5, "grad_norm at step " .. s)
      end
      local per_rank = run(1, false) -- each rank's own token mean, averaged: another gradient for these rows
      assert(math.abs(per_rank[1][2] - ref[1][2]) > 1e-4 * ref[1][2],
        ("per-rank normalisation gives another gradient: %.6f vs %.6f"):format(per_rank[1][2], ref[1][2]))
    end)
  end
elseif mode == "hf_epochs" then
  local TG = dofile((ZRUN_HOME or ".") .. "/tests/lua/trainer_golden.lua")
  local g = TG.load("trainer_epochs_2ranks.json")
  for _, case in ipairs(g.cases) do
    test(("%s on %d ranks: as transformers %s's Trainer on %d processes"):format(case.name, dist.world_size(),
      g.transformers, g.processes), function() TG.check(g, case, work .. "/" .. case.name) end)
  end
elseif mode == "train_loss" then
  local TG = dofile((ZRUN_HOME or ".") .. "/tests/lua/trainer_golden.lua")
  local g = TG.load("trainer_epochs_2ranks.json")
  -- transformers 5.17 / torch 2.11 on 2 torchrun processes (gloo), the golden model and rows in order, micro-batch 2:
  -- res.training_loss on process 0 and 1 (its _finalize_training adds the process's own tr_loss after the last log)
  local cases = {
    { "max_steps 5, logging_steps 2 (step 5 not logged)", { max_steps = 5, logging_steps = 2 },
      { 5.684676933288574, 5.361337566375733 } },
    { "logging_strategy \"no\"", { logging_strategy = "no" }, { 5.409259033203125, 5.63675537109375 } },
    { "logging_strategy \"no\", average_tokens_across_devices = false",
      { logging_strategy = "no", average_tokens_across_devices = false }, { 5.595022201538086, 5.437699890136718 } },
  }
  for _, c in ipairs(cases) do
    test(("train_loss on %d ranks, %s: each rank's own, as transformers 5.17's processes"):format(dist.world_size(), c[1]),
      function()
        local a = TG.args(g, { per_device_train_batch_size = 2, gradient_accumulation_steps = 1, num_train_epochs = 1,
          max_steps = -1 }, work .. "/train_loss")
        for k, v in pairs(c[2]) do a[k] = v end
        local t = zr.Trainer { model = g.model(), train_dataset = g.dataset,
          data_collator = zr.datasets.causal_lm_collator { pad_token_id = g.pad }, args = a }
        local r = t:train()
        T.near(r.train_loss, c[3][dist.rank() + 1], 1e-6, 1e-6, "train_loss of rank " .. dist.rank())
      end)
  end
elseif mode == "sft_eval" then
  local TG = dofile((ZRUN_HOME or ".") .. "/tests/lua/trainer_golden.lua")
  local g = TG.load("trainer_epochs_2ranks.json")
  local rows = {}
  for i, r in ipairs(g.rows) do rows[i] = { input_ids = r } end
  -- TRL 1.10 / transformers 5.17 / torch 2.11, SFTTrainer on 2 torchrun processes (gloo), the golden model and rows
  -- pre-tokenized, in order, micro-batch 2, 6 steps at a constant 5e-3; then evaluate() on the first n rows in
  -- batches of bs: { n, bs, eval_mean_token_accuracy, eval_entropy }
  local trl_losses = { 5.537783622741699, 5.597387313842773, 5.547009468078613, 5.582597255706787, 5.4267168045043945,
    5.094573020935059 }
  local trl_evals = { { 7, 3, 0.41546161472797394, 5.517402410507202 }, { 13, 4, 0.2635888531804085, 5.5185792446136475 },
    { 3, 4, 0.5074626803398132, 5.514588356018066 }, { 9, 2, 0.3218614806731542, 5.520425796508789 },
    { 5, 1, 0.3597612877686818, 5.518411795298259 } }
  -- and trained on the first 13 rows (4 micro-batches of 2 a process an epoch, the last round completed from rows 1-3),
  -- accumulation 2, 3 epochs: each step's { loss, num_tokens, mean_token_accuracy, entropy }, which count the last step
  -- of an epoch as TRL's gather_for_metrics keeps it (process 0's sums only: 13 mod (2 x 2) = 1)
  local trl_steps = { { 5.556494235992432, 90, 0.02440476231276989, 5.544672727584839 },
    { 5.368154048919678, 130, 0.11764705926179886, 5.543526887893677 },
    { 4.855888843536377, 220, 0.8071428537368774, 5.5386974811553955 },
    { 4.7592573165893555, 260, 0.43188855051994324, 5.536384344100952 },
    { 4.427676677703857, 350, 0.7958333492279053, 5.515902996063232 },
    { 4.268691062927246, 390, 0.6424148678779602, 5.502220153808594 } }
  local sft_args = { output_dir = work .. "/sft_train", bf16 = false, save_strategy = "no", per_device_train_batch_size = 2,
    gradient_accumulation_steps = 2, num_train_epochs = 3, learning_rate = 5e-3, logging_steps = 1,
    lr_scheduler_type = "constant", seed = 0, train_sampling_strategy = "sequential" }
  test(("SFTTrainer on %d ranks logs TRL's num_tokens, mean_token_accuracy and entropy where an epoch's last round is " ..
    "completed"):format(dist.world_size()), function()
    local first = {}
    for i = 1, 13 do first[i] = rows[i] end
    local t = zr.SFTTrainer { model = g.model(), processing_class = tok, train_dataset = zr.datasets.Dataset.from_rows(first),
      args = sft_args }
    t:train()
    local n = 0
    for _, h in ipairs(t.state.log_history) do
      if h.loss then
        n = n + 1
        local want, at = trl_steps[h.step], " at step " .. h.step
        T.near(h.loss, want[1], 1e-5, 2e-5, "loss" .. at)
        T.eq(h.num_tokens, want[2], "num_tokens" .. at)
        T.near(h.mean_token_accuracy, want[3], 1e-6, 1e-6, "mean_token_accuracy" .. at)
        T.near(h.entropy, want[4], 1e-5, 1e-5, "entropy" .. at)
      end
    end
    T.eq(n, 6, "logged steps")
  end)
  local t = zr.SFTTrainer { model = g.model(), processing_class = tok, train_dataset = zr.datasets.Dataset.from_rows(rows),
    args = { output_dir = work .. "/sft_eval", bf16 = false, save_strategy = "no", per_device_train_batch_size = 2,
      max_steps = 6, learning_rate = 5e-3, logging_steps = 1, lr_scheduler_type = "constant", seed = 0,
      train_sampling_strategy = "sequential" } }
  test(("SFTTrainer on %d ranks trains as TRL 1.10's SFTTrainer on 2 processes"):format(dist.world_size()), function()
    t:train()
    for _, h in ipairs(t.state.log_history) do
      if h.loss then T.near(h.loss, trl_losses[h.step], 1e-5, 2e-5, "loss at step " .. h.step) end
    end
  end)
  for _, c in ipairs(trl_evals) do
    test(("SFTTrainer's evaluation of %d rows in batches of %d on %d ranks: TRL's eval_mean_token_accuracy and " ..
      "eval_entropy"):format(c[1], c[2], dist.world_size()), function()
      local ev = {}
      for i = 1, c[1] do ev[i] = rows[i] end
      t.args.per_device_eval_batch_size = c[2]
      local r = t:evaluate(zr.datasets.Dataset.from_rows(ev))
      T.near(r.eval_mean_token_accuracy, c[3], 1e-6, 1e-6, "eval_mean_token_accuracy")
      T.near(r.eval_entropy, c[4], 1e-5, 1e-5, "eval_entropy")
    end)
  end
elseif mode == "hf_eval" then
  local TG = dofile((ZRUN_HOME or ".") .. "/tests/lua/trainer_golden.lua")
  local g = TG.load("trainer_epochs_2ranks.json")
  local function evaluate(n, bs)
    local rows = {}
    for i = 1, n do rows[i] = { input_ids = g.rows[i] } end
    local t = zr.Trainer { model = g.model(), data_collator = zr.datasets.causal_lm_collator { pad_token_id = g.pad },
      args = { output_dir = work .. "/hf_eval", per_device_eval_batch_size = bs, dataloader_drop_last = true } }
    return t:evaluate(zr.datasets.Dataset.from_rows(rows))
  end
  test(("evaluate with dataloader_drop_last on %d ranks reads the rows transformers 5.17 reads"):format(dist.world_size()),
    function()
      -- transformers 5.17 / torch 2.11, Trainer.evaluate() on 2 torchrun processes (gloo), the golden model, its first 13
      -- rows in batches of 4, dataloader_drop_last: one round of 2 batches (rows 1-8), the last round dropped
      local r = evaluate(13, 4)
      T.near(r.eval_loss, 5.556494235992432, 1e-6, 1e-6, "eval_loss")
      T.near(r.eval_samples_per_second / r.eval_steps_per_second, 6.5, 0, 1e-4, "rows a step (transformers: all 13, 2 steps)")
      -- 3 rows in batches of 4: transformers evaluates nothing and reports no eval_loss
      local ok, err = pcall(evaluate, 3, 4)
      assert(not ok and err:find("dataloader_drop_last = true drops all 3 evaluation rows", 1, true), tostring(err))
    end)
elseif mode == "epoch_end" or mode == "epoch_end_ref" then
  local rows = T.varied_rows(tok, 9, function(i) return 4 + (i * 29) % 41 end).rows
  local function run(rs, bs)
    return padded_run(rs, bs, { num_train_epochs = 2, learning_rate = 3e-3, warmup_steps = 1 })
  end
  local ref_file = ("%s/epoch_end_ref%d.json"):format(work, stage)
  if mode == "epoch_end_ref" then -- one process: the rows both ranks read, in micro-batches of their two rows
    local rs = {}
    for i = 1, 9 do rs[i] = rows[i] end
    rs[10] = rows[1]
    local f = assert(io.open(ref_file, "w"))
    f:write(require("cjson").encode(run(rs, 2)))
    f:close()
  else
    test("an epoch's last round and shorter step on " .. name .. ": the losses and gradient norms of one process", function()
      local ref = require("cjson").decode(T.read_file(ref_file))
      local got = run(rows, 1)
      T.eq(ref.per_epoch, 3, "one process: 5 micro-batches of 2 an epoch, steps of 2, 2 and 1")
      T.eq(got.per_epoch, 3, "each rank: 5 micro-batches of 1 an epoch")
      T.eq(got.steps, 6)
      T.eq(#got.log, 6)
      for s = 1, 6 do
        T.near(got.log[s][1], ref.log[s][1], 1e-5, 1e-5, "loss at step " .. s)
        T.near(got.log[s][2], ref.log[s][2], 1e-5, 1e-5, "grad_norm at step " .. s)
      end
    end)
  end
else
  error("trainer_check.lua: mode must be full, resume, eval, early, tokens, tokens_ref, epoch_end, epoch_end_ref, " ..
    "hf_epochs, train_loss, sft_eval or hf_eval, got " .. tostring(mode), 0)
end
T.done()
