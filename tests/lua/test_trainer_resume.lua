-- Trainer checkpoints and resume_from_checkpoint: a run interrupted at a checkpoint and resumed in
-- a fresh Trainer (fresh model, fresh engine) gives the uninterrupted run's per-step losses, with
-- gradient accumulation and across an epoch boundary (so the data position, the shuffled order of
-- the next epoch, the scheduler and Adam all have to come back); fp32 and bf16 (fp32 master
-- weights, 16-bit parameters) at ZeRO stages 0 and 2. Bad input is one line and changes nothing.
local zr = require "zrun"
local T = zr.testing
local tckpt = require "zrun.trainer_checkpoint"

local tmp = T.tmpdir()
local function sh(c) assert(os.execute(c) == 0, c) end

-- 26 packed blocks of 24 byte tokens from the project's sample text: with 2 rows per micro-batch
-- and accumulation 2, 13 micro-batches, so 7 steps per epoch, the 7th of one micro-batch.
local tok = zr.tokenizers.ByteTokenizer.new()
local blocks = T.sample_rows(tok):group_texts(24):select(1, 26)

local cfg = zr.models.llama.config("zrun/tiny-llama")
local function model(c)
  zr.manual_seed(7)
  return zr.models.llama.LlamaForCausalLM(c or cfg)
end

local function ds_config(stage, bf16)
  return { train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto", gradient_clipping = 1.0,
    steps_per_print = 1000, bf16 = { enabled = bf16 },
    optimizer = { type = "AdamW", params = { lr = "auto", betas = "auto", eps = "auto", weight_decay = "auto" } },
    zero_optimization = { stage = stage } }
end

local function args(out, stage, bf16, extra)
  local a = { output_dir = out, per_device_train_batch_size = 2, gradient_accumulation_steps = 2, max_steps = 10,
    learning_rate = 3e-3, weight_decay = 0.1, warmup_steps = 2, logging_steps = 1, save_steps = 4,
    deepspeed = ds_config(stage, bf16), seed = 11 }
  for k, v in pairs(extra or {}) do a[k] = v end
  return a
end

local function losses(trainer)
  local out = {}
  for _, r in ipairs(trainer.state.log_history) do if r.loss then out[r.step] = r.loss end end
  return out
end

for _, case in ipairs { { 0, false }, { 2, false }, { 2, true } } do
  local stage, bf16 = case[1], case[2]
  local name = ("stage %d %s"):format(stage, bf16 and "bf16" or "fp32")
  T.test("resume from checkpoint-4 continues the uninterrupted loss curve (" .. name .. ")", function()
    local out = ("%s/s%d%s"):format(tmp, stage, bf16 and "bf16" or "")
    local full = zr.Trainer { model = model(), train_dataset = blocks, args = args(out .. "/full", stage, bf16) }
    local r = full:train()
    local ref = losses(full)
    T.eq(r.global_step, 10)
    assert(ref[10] < ref[1] - 0.5, ("the run did not learn: loss %.4f -> %.4f"):format(ref[1], ref[10]))
    local gn = full.state.log_history[#full.state.log_history - 1].grad_norm
    assert(gn and gn > 0, "grad_norm " .. tostring(gn))
    if bf16 then -- the logged loss is the model's f32 loss, not rounded to bf16
      local rounded = 0
      for s = 1, 10 do
        if zr.tensor({ ref[s] }):to("bf16"):to("f32"):item() == ref[s] then rounded = rounded + 1 end
      end
      assert(rounded < 3, rounded .. " of 10 logged losses are bf16 numbers")
    end
    -- the checkpoint of step 4 (written by the same kind of run), resumed by a fresh trainer
    local resumed = zr.Trainer { model = model(), train_dataset = blocks,
      args = args(out .. "/full", stage, bf16, { save_strategy = "no" }) }
    local rr = resumed:train { resume_from_checkpoint = out .. "/full/checkpoint-4" }
    T.eq(rr.global_step, 10)
    local got = losses(resumed)
    for s = 5, 10 do
      -- the CPU is deterministic: the same operations in the same order give the same bits
      T.near(got[s], ref[s], 0, 0, ("loss at step %d after resuming"):format(s))
    end
    assert(got[4] == ref[4], "the log history of steps 1-4 comes back from trainer_state.json")
    assert(not got[11], "trained past max_steps")
  end)
end

T.test("fp16 whose first steps overflow: logged (grad_norm inf), saved and resumed with the loss scale", function()
  -- initial_scale_power 20: the scaled gradients overflow f16 until the scale has halved a few
  -- times (hysteresis 1); those steps are skipped and log grad_norm inf, as DeepSpeed's do. Before,
  -- metrics.jsonl (cjson) refused to write inf: the first logged overflow ended the run
  local dsc = ds_config(2, false)
  dsc.bf16, dsc.fp16 = nil, { enabled = true, initial_scale_power = 20, hysteresis = 1 }
  local out = tmp .. "/fp16_overflow"
  local full = zr.Trainer { model = model(), train_dataset = blocks, args = args(out, 2, false, { deepspeed = dsc }) }
  T.eq(full:train().global_step, 10)
  local ref, inf = losses(full), 0
  for _, r in ipairs(full.state.log_history) do if r.grad_norm == math.huge then inf = inf + 1 end end
  assert(inf > 0 and inf < 5, inf .. " logged steps with grad_norm inf (expected the first few)")
  assert(ref[10] < ref[1] - 0.3, ("the run did not learn: loss %.4f -> %.4f"):format(ref[1], ref[10]))
  local f = assert(io.open(out .. "/metrics.jsonl"))
  local text = f:read("*a")
  f:close()
  T.eq(select(2, text:gsub('"grad_norm":Infinity', "")), inf, "metrics.jsonl: grad_norm Infinity, as Python's json writes it")
  local records = select(2, require("zrun.metrics").read(out .. "/metrics.jsonl"))
  local back = 0
  for _, r in ipairs(records) do if r.grad_norm == math.huge then back = back + 1 end end
  T.eq(back, inf, "metrics.jsonl reads back inf")
  local st = tckpt.read_state(out .. "/checkpoint-4")
  T.eq(st.log_history[1].grad_norm, math.huge, "trainer_state.json keeps step 1's grad_norm inf")
  local resumed = zr.Trainer { model = model(), train_dataset = blocks,
    args = args(out, 2, false, { deepspeed = dsc, save_strategy = "no" }) }
  T.eq(resumed:train({ resume_from_checkpoint = out .. "/checkpoint-4" }).global_step, 10)
  local got = losses(resumed)
  for s = 5, 10 do T.near(got[s], ref[s], 0, 0, ("loss at step %d after resuming"):format(s)) end
end)

for _, case in ipairs { { false }, { true }, { false, "auto" }, { true, "auto" } } do
  local overlap, auto = case[1], case[2] == "auto"
  local name = (overlap and "ZenFlow overlap_step: the host update in flight and pending at the save" or
    "ZenFlow: stage 2, cpu offload") .. (auto and ", update_interval auto" or "")
  T.test("resume from checkpoint-4 continues the uninterrupted loss curve (" .. name .. ")", function()
    -- a step is a ZenFlow window of update_interval micro-batches; the schedule moves at every one.
    -- "auto": a step is gradient_accumulation_steps (2) micro-batches, the host windows adapt, and the
    -- save at step 4 ends the window there
    local zf = ds_config(2, false)
    zf.zero_optimization.offload_optimizer = { device = "cpu" }
    zf.zero_optimization.zenflow = auto and { topk_ratio = 0.25, update_interval = "auto", overlap_step = overlap }
      or { topk_ratio = 0.25, update_interval = 2, select_strategy = "step", select_interval = 4, overlap_step = overlap }
    local out = tmp .. (overlap and "/zenflow_overlap" or "/zenflow") .. (auto and "_auto" or "")
    -- overlap_step: a constant rate, so that every window's host update (both moment sets) reaches the losses
    local sched = overlap and "constant_with_warmup" or nil
    local full = zr.Trainer { model = model(), train_dataset = blocks,
      args = args(out, 2, false, { deepspeed = zf, lr_scheduler_type = sched }) }
    T.eq(full:train().global_step, 10)
    T.eq(full.engine.micro_steps, 20, "micro-batches trained")
    if auto then -- windows of their own length: not one host update per step
      T.eq(full.engine.global_steps ~= 10, true, "host updates (" .. full.engine.global_steps .. ") differ from steps")
    end
    local ref = losses(full)
    assert(ref[10] < ref[1] - 0.5, ("the run did not learn: loss %.4f -> %.4f"):format(ref[1], ref[10]))
    -- "auto": the resumed run saves at the same steps (each save ends a window there), elsewhere
    local more = auto and { output_dir = out .. "/resumed" } or { save_strategy = "no" }
    more.deepspeed, more.lr_scheduler_type = zf, sched
    local resumed = zr.Trainer { model = model(), train_dataset = blocks, args = args(out, 2, false, more) }
    T.eq(resumed:train({ resume_from_checkpoint = out .. "/checkpoint-4" }).global_step, 10)
    local got = losses(resumed)
    for s = 5, 10 do T.near(got[s], ref[s], 0, 0, ("loss at step %d after resuming"):format(s)) end
  end)
end

for _, ui in ipairs { 2, "auto" } do
T.test("ZenFlow with HF's own schedule (none in the config): warm-up and decay span the whole run (update_interval " ..
  ui .. ")", function()
  -- stepped at every micro-batch, the schedule is update_interval x longer: HF's linear formula over
  -- 10 windows x 2 micro-batches with 2 windows (4 micro-batches) of warm-up. "auto": the same over
  -- 10 steps of gradient_accumulation_steps = 2 micro-batches, whatever the host windows
  local zf = ds_config(2, false)
  zf.zero_optimization.offload_optimizer = { device = "cpu" }
  zf.zero_optimization.zenflow = { topk_ratio = 0.25, update_interval = ui }
  local t = zr.Trainer { model = model(), train_dataset = blocks,
    args = args(tmp .. "/zenflow_sched", 2, false, { deepspeed = zf, save_strategy = "no" }) }
  t:train()
  local peak, N, W = 3e-3, 20, 4
  for _, r in ipairs(t.state.log_history) do
    if r.learning_rate and r.step then
      -- the config has an optimizer section, so transformers hands its schedule to the engine
      -- (DummyScheduler), which steps it in the step: the rate logged is the one after 2 * step steps
      local m = 2 * r.step
      local want = m < W and peak * m / W or peak * math.max(0, N - m) / (N - W)
      T.near(r.learning_rate, want, 1e-12, 1e-9, ("learning rate after window %d"):format(r.step))
    end
  end
end)
end

T.test("resume_from_checkpoint=true takes the newest complete checkpoint in output_dir", function()
  local out = tmp .. "/latest"
  local t = zr.Trainer { model = model(), train_dataset = blocks, args = args(out, 0, false, { max_steps = 8 }) }
  t:train()
  -- an interrupted save (no trainer_state.json) is not a checkpoint to resume from
  sh(("mkdir -p %s/checkpoint-12/global_step12"):format(out))
  T.eq(tckpt.latest(out), out .. "/checkpoint-8")
  local t2 = zr.Trainer { model = model(), train_dataset = blocks, args = args(out, 0, false, { max_steps = 10,
    save_strategy = "no", resume_from_checkpoint = true }) }
  local r = t2:train()
  T.eq(r.global_step, 10)
  assert(r.metrics.train_steps_per_second > 0)
  local st = tckpt.read_state(out .. "/checkpoint-8")
  T.eq(st.global_step, 8)
  T.eq(st.max_steps, 8)
  T.near(st.epoch, 1 + 2 / 13, 1e-12) -- (two of the second epoch's 13 micro-batches)
end)

T.test("bad resume input: one line naming it, nothing overwritten", function()
  local out = tmp .. "/bad"
  T.raises(function()
    zr.Trainer { model = model(), train_dataset = blocks, args = args(out, 0, false) }:train { resume_from_checkpoint = true }
  end, "resume_from_checkpoint=true: no complete checkpoint-<step> folder")
  T.raises(function()
    zr.Trainer { model = model(), train_dataset = blocks, args = args(out, 0, false) }:train(tmp .. "/nowhere/checkpoint-3")
  end, "resume_from_checkpoint: " .. tmp .. "/nowhere/checkpoint-3 does not exist")
  -- another model's checkpoint (wider MLP): refused before any weight changes
  local src = tmp .. "/s0/full/checkpoint-8"
  local before = io.open(src .. "/trainer_state.json"):read("*a")
  local c2 = {}
  for k, v in pairs(cfg) do c2[k] = v end
  c2.intermediate_size = cfg.intermediate_size + 16
  local m2 = model(c2)
  local w = m2.model.layers[1].mlp.up_proj.weight:clone()
  local err = T.raises(function()
    zr.Trainer { model = m2, train_dataset = blocks, args = args(tmp .. "/other", 0, false) }:train { resume_from_checkpoint = src }
  end, "checkpoint of a different model")
  assert(not tostring(err):find("\n"), "one line: " .. tostring(err))
  assert(tostring(err):find("up_proj.weight' has shape", 1, true), err)
  assert(tostring(err):find("; resume with the model it was saved from, or start over without resume_from_checkpoint$"), err)
  T.near(m2.model.layers[1].mlp.up_proj.weight, w, 0, 0, "weights untouched")
  T.eq(io.open(src .. "/trainer_state.json"):read("*a"), before, "the checkpoint is unchanged")
  T.eq(#tckpt.list(tmp .. "/other"), 0, "no checkpoint written by the refused run")
end)

T.test("a truncated newest checkpoint names the one before it to resume from (not tags inside its folder)", function()
  local out = tmp .. "/trunc"
  zr.Trainer { model = model(), train_dataset = blocks, args = args(out, 2, false, { max_steps = 2, save_steps = 1 }) }:train()
  T.truncate_file(out .. "/checkpoint-2/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.safetensors", 1000)
  local err = T.raises(function()
    zr.Trainer { model = model(), train_dataset = blocks, args = args(out, 2, false, { max_steps = 3 }) }:train { resume_from_checkpoint = true }
  end, "resume_from_checkpoint " .. out .. "/checkpoint-2: ")
  assert(tostring(err):find("the file was changed or truncated after the save; resume from an earlier one " ..
    "(resume_from_checkpoint=" .. out .. "/checkpoint-1) or start over", 1, true), err)
  assert(not tostring(err):find("load another tag", 1, true), err)
end)

-- save_strategy "epoch": the last step saves, then its epoch's evaluation runs, and transformers saves
-- that checkpoint again (on_epoch_end), so a best last evaluation makes the last checkpoint the best
T.test("save and eval by epoch: the last epoch's evaluation can make the last checkpoint the best", function()
  local out = tmp .. "/byepoch"
  local m = model()
  local t = zr.Trainer { model = m, train_dataset = blocks, eval_dataset = blocks:select(1, 4),
    args = args(out, 0, false, { max_steps = -1, num_train_epochs = 2, save_strategy = "epoch", eval_strategy = "epoch",
      load_best_model_at_end = true }) }
  t:train()
  T.eq(t.engine.global_steps, 14, "7 updates an epoch")
  local evals = {}
  for _, h in ipairs(t.state.log_history) do if h.eval_loss then evals[h.step] = h.eval_loss end end
  assert(evals[14] < evals[7], ("the last evaluation is the best: %g then %g"):format(evals[7], evals[14]))
  T.eq(t.state.best_model_checkpoint, out .. "/checkpoint-14")
  local st = tckpt.read_state(out .. "/checkpoint-14")
  T.eq(st.best_model_checkpoint, out .. "/checkpoint-14", "the saved state knows it")
  local last = st.log_history[#st.log_history]
  T.eq(last.step, 14); T.near(last.eval_loss, evals[14], 0, 0, "the checkpoint holds the last evaluation")
  local best = zr.hf.load_state_dict(out .. "/checkpoint-14")
  for n, p in m:named_parameters() do T.near(p, best[n], 0, 0, n) end
  T.eq(t.last_eval, 14, "the best is the last step's: its evaluation still describes the weights")
end)

T.test("save_total_limit keeps the newest checkpoints and the best one; load_best_model_at_end loads it", function()
  -- greater_is_better with eval_loss, which training lowers: the first evaluation (step 2) stays the best
  local out = tmp .. "/rot"
  local m = model()
  local t = zr.Trainer { model = m, train_dataset = blocks, eval_dataset = blocks:select(1, 4),
    args = args(out, 0, false, { max_steps = 9, save_steps = 2, save_total_limit = 2, eval_strategy = "steps",
      eval_steps = 2, load_best_model_at_end = true, metric_for_best_model = "loss", greater_is_better = true }) }
  t:train()
  -- load_best_model_at_end: the model holds checkpoint-2's weights, not step 9's
  local best = zr.hf.load_state_dict(out .. "/checkpoint-2")
  for n, p in m:named_parameters() do T.near(p, best[n], 0, 0, n) end
  T.eq(t.engine.global_steps, 9)
  -- step 9's evaluation is not of these weights: a script reusing last_eval_metrics for the final weights (the
  -- recipes) evaluates again, as run_clm.py's trainer.evaluate() after train() reports the best model
  T.eq(t.last_eval, nil, "no last evaluation of the loaded weights")
  T.eq(t.last_eval_metrics, nil)
  local evals = {}
  for _, h in ipairs(t.state.log_history) do if h.eval_loss and h.step > 0 then evals[#evals + 1] = h.step end end
  T.eq(table.concat(evals, ","), "2,4,6,8,9", "every eval_steps, and the last step (transformers 5)")
  local kept = {}
  for _, e in ipairs(tckpt.list(out)) do kept[#kept + 1] = e.step end
  -- the best and the newest (the final save, step 9)
  T.eq(table.concat(kept, ","), "2,9")
  local st = tckpt.read_state(out .. "/checkpoint-9")
  T.eq(st.best_model_checkpoint, out .. "/checkpoint-2")
  T.eq(st.best_global_step, 2)
  assert(st.best_metric > 0 and st.best_metric < 6, "best_metric " .. tostring(st.best_metric))
  -- a best checkpoint older than the newest one is kept with limit 1
  tckpt.rotate(out, 1, out .. "/checkpoint-2")
  kept = {}
  for _, e in ipairs(tckpt.list(out)) do kept[#kept + 1] = e.step end
  T.eq(table.concat(kept, ","), "2,9")
  tckpt.rotate(out, 1, nil)
  T.eq(#tckpt.list(out), 1)
  -- save_total_limit = 1: the newest is kept beside the best while training, and at the end only the best
  -- (transformers 5.17's train(): "Delete the last checkpoint when save_total_limit=1 ...")
  local out1 = tmp .. "/rot1"
  zr.Trainer { model = model(), train_dataset = blocks, eval_dataset = blocks:select(1, 4),
    args = args(out1, 0, false, { max_steps = 9, save_steps = 2, save_total_limit = 1, eval_strategy = "steps",
      eval_steps = 2, load_best_model_at_end = true, metric_for_best_model = "loss", greater_is_better = true }) }:train()
  kept = {}
  for _, e in ipairs(tckpt.list(out1)) do kept[#kept + 1] = e.step end
  T.eq(table.concat(kept, ","), "2", "only the best at the end")
end)

T.test("a resumed run whose recorded best checkpoint is gone goes on without it, as transformers does", function()
  -- greater_is_better with eval_loss: the first evaluation (step 2) stays the best; checkpoint-2 is then deleted
  -- (to save space, or the run moved to another machine) and the run resumes from checkpoint-4
  local out = tmp .. "/bestgone"
  local function a(extra)
    local t = args(out, 0, false, { max_steps = 6, save_steps = 2, eval_strategy = "steps", eval_steps = 2,
      load_best_model_at_end = true, metric_for_best_model = "loss", greater_is_better = true })
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end
  zr.Trainer { model = model(), train_dataset = blocks, eval_dataset = blocks:select(1, 4), args = a() }:train()
  T.eq(tckpt.read_state(out .. "/checkpoint-4").best_model_checkpoint, out .. "/checkpoint-2")
  sh(("rm -rf %s/checkpoint-2 %s/checkpoint-6"):format(out, out))
  local m = model()
  local t = zr.Trainer { model = m, train_dataset = blocks, eval_dataset = blocks:select(1, 4), args = a() }
  local r = t:train { resume_from_checkpoint = out .. "/checkpoint-4" } -- (was: an error after the last step)
  T.eq(r.global_step, 6)
  T.eq(t.state.best_model_checkpoint, nil, "dropped at the resume (transformers' _init_training_state)")
  T.eq(t.state.best_global_step, 2, "the best metric and its step stay: later evaluations are not better")
  local st = tckpt.read_state(out .. "/checkpoint-6")
  T.eq(st.best_model_checkpoint, nil, "checkpoint-6 records no best checkpoint")
  local last = zr.hf.load_state_dict(out .. "/checkpoint-6")
  for n, p in m:named_parameters() do T.near(p, last[n], 0, 0, n .. ": the final weights, nothing loaded") end
  T.eq(t.last_eval, 6)
end)

T.test("save_strategy \"best\" saves at each new best evaluation only", function()
  local out = tmp .. "/sbest"
  local t = zr.Trainer { model = model(), train_dataset = blocks, eval_dataset = blocks:select(1, 4),
    args = args(out, 0, false, { max_steps = 6, save_strategy = "best", eval_strategy = "steps", eval_steps = 2,
      metric_for_best_model = "loss" }) }
  t:train()
  local kept = {}
  for _, e in ipairs(tckpt.list(out)) do kept[#kept + 1] = e.step end
  T.eq(table.concat(kept, ","), "2,4,6", "the eval loss falls: each evaluation is a new best")
  local out2 = tmp .. "/sbest2"
  zr.Trainer { model = model(), train_dataset = blocks, eval_dataset = blocks:select(1, 4),
    args = args(out2, 0, false, { max_steps = 6, save_strategy = "best", eval_strategy = "steps", eval_steps = 2,
      metric_for_best_model = "loss", greater_is_better = true }) }:train()
  kept = {}
  for _, e in ipairs(tckpt.list(out2)) do kept[#kept + 1] = e.step end
  T.eq(table.concat(kept, ","), "2", "greater_is_better: only the first evaluation is a best")
  T.raises(function() zr.Trainer { model = model(), args = { save_strategy = "best", eval_strategy = "steps" }, eval_dataset = blocks } end,
    'save_strategy = "best" needs metric_for_best_model')
end)

T.test("the recipe resumes: 12 steps straight = 8 steps, then resume_from_checkpoint=true to 12", function()
  local z = os.getenv("ZRUN_BIN") or "./zrun"
  local function run(out, extra)
    local p = io.popen(("%s recipes/finetune_llama.lua max_steps=12 logging_steps=1 output_dir=%s %s 2>&1"):format(z, out, extra))
    local s = p:read("*a")
    p:close()
    assert(s:find("done: 12 steps", 1, true), s)
    local l = {}
    for step, loss in s:gmatch("\nstep (%d+)/12 | loss ([%d.]+)") do l[tonumber(step)] = loss end
    return l, s
  end
  local straight, sout = run(tmp .. "/recipe_a", "save_strategy=no dump_blocks=" .. tmp .. "/blocks.safetensors")
  -- the summary line: the first and the last logged loss (logging_steps=1: steps 1 and 12)
  local a, b = sout:match("done: 12 steps in [%d.]+ s, loss ([%d.]+) %-> ([%d.]+),")
  assert(a, sout)
  T.near(tonumber(a), tonumber(straight[1]), 6e-4)
  T.near(tonumber(b), tonumber(straight[12]), 6e-4)
  local f = zr._C.safetensors_open(tmp .. "/blocks.safetensors")
  T.eq(table.concat(f:get("train_input_ids"):shape(), "x"), "30x64")
  -- 12 steps of one micro-batch: the first epoch's 8 (30 rows, the last micro-batch of 2), 4 of the next
  T.eq(f:get("train_order"):numel(), 30 + 4 * 4, "12 steps of one micro-batch of 4")
  T.eq(table.concat(f:get("train_epoch_order"):shape(), "x"), "2x30", "the two epochs the run starts")
  f:close()
  local first = run(tmp .. "/recipe_b", "save_steps=4 save_total_limit=2")
  local kept = {}
  for _, e in ipairs(tckpt.list(tmp .. "/recipe_b")) do kept[#kept + 1] = e.step end
  T.eq(table.concat(kept, ","), "8,12", "save_total_limit=2")
  sh(("mkdir -p %s/recipe_c && cp -r %s/recipe_b/checkpoint-8 %s/recipe_c/"):format(tmp, tmp, tmp))
  local resumed, out = run(tmp .. "/recipe_c", "resume_from_checkpoint=true save_strategy=no")
  assert(out:find("resumed from " .. tmp .. "/recipe_c/checkpoint-8 at step 8", 1, true), out)
  assert(not resumed[8] and resumed[9], out)
  for s = 9, 12 do T.eq(resumed[s], straight[s], "loss (printed) at step " .. s) end
  T.eq(first[12], straight[12])
end)

T.test("save_only_model: checkpoints hold the model and trainer_state.json only, and say so on resume", function()
  local out = tmp .. "/som"
  local a = args(out, 2, false, { save_only_model = true, max_steps = 4, save_steps = 2 })
  local t = zr.Trainer { model = model(), train_dataset = blocks, args = a }
  t:train()
  local ck = out .. "/checkpoint-4"
  assert(io.open(ck .. "/model.safetensors"), "the model is in the checkpoint")
  assert(io.open(ck .. "/trainer_state.json"), "and the trainer state")
  T.eq(io.open(ck .. "/latest"), nil, "no engine checkpoint (optimizer, scheduler, RNG)")
  local m = zr.models.llama.from_pretrained(ck)
  local ids = zr.tensor({ { 5, 9, 33, 70 } }):to("i64")
  T.near(m(ids).logits, t.model(ids).logits, 1e-6, 0, "the checkpoint's model is the trained one")
  a.resume_from_checkpoint = true
  T.raises(function() zr.Trainer { model = model(), train_dataset = blocks, args = a }:train() end,
    "holds the model but no optimizer state (saved with save_only_model = true)")
  T.raises(function()
    zr.Trainer { model = model(), args = { save_only_model = true, load_best_model_at_end = true, eval_strategy = "steps" } }
  end, "save_only_model = true cannot be used with load_best_model_at_end")
end)

T.test("the recipe's step lines print no grad_norm before the first optimizer step (ZenFlow \"auto\"), not nan", function()
  local z = os.getenv("ZRUN_BIN") or "./zrun"
  local p = io.popen(("%s recipes/finetune_llama.lua --config configs/zero2_offload_zenflow_auto.json precision=bf16 " ..
    "max_steps=3 logging_steps=1 output_dir=%s/recipe_zfa 2>&1"):format(z, tmp))
  local s = p:read("*a")
  p:close()
  assert(s:find("\nstep 1/3 | loss [%d.]+ | lr "), s) -- the first host update comes later than step 1 here
  assert(not s:find("nan", 1, true), s)
end)

T.test("the recipe's summary with one logging window says so (no 'loss x -> x')", function()
  local z = os.getenv("ZRUN_BIN") or "./zrun"
  local p = io.popen(("%s recipes/finetune_llama.lua max_steps=2 output_dir=%s/recipe_one 2>&1"):format(z, tmp))
  local s = p:read("*a")
  p:close()
  assert(s:find("done: 2 steps in [%d.]+ s, loss [%d.]+ %(one logging window%), validation perplexity"), s)
end)

T.test("the recipe's training line names the gradients' dtype (fp32 by default, DeepSpeed's is the model's)", function()
  local z = os.getenv("ZRUN_BIN") or "./zrun"
  for conf, want in pairs { ["configs/zero2.json"] = "ZeRO stage 2, bf16, f32 gradients",
    ["configs/zero3_bf16_master.json"] = "ZeRO stage 3, bf16, bf16 gradients" } do
    local p = io.popen(("%s recipes/finetune_llama.lua --config %s precision=bf16 max_steps=1 " ..
      "output_dir=%s/recipe_gd 2>&1"):format(z, conf, tmp))
    local s = p:read("*a")
    p:close()
    assert(s:find("[zrun] training: 1 steps", 1, true) and s:find(want, 1, true), conf .. ": " .. s)
  end
end)

sh("rm -rf '" .. tmp .. "'")
T.done()
