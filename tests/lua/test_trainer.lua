-- The Trainer against what Hugging Face's Trainer does: argument checks, parameter groups for
-- weight decay (LayerNorms by class, the rest by name), the causal-LM collator (DataCollatorForLanguageModeling), token-
-- weighted evaluation, HF's lr schedules, the save/eval/log strategies and metrics.jsonl, and
-- save_model's Hugging Face directory (at ZeRO stage 3 too). Resume: test_trainer_resume.lua.
local zr = require "zrun"
local T = zr.testing
local nn = zr.nn
local cjson = require "cjson"
local tckpt = require "zrun.trainer_checkpoint"
local targs = require "zrun.trainer_args"

local tmp = T.tmpdir()
local function sh(c) assert(os.execute(c) == 0, c) end

local tok = zr.tokenizers.ByteTokenizer.new()
local text = T.read_file((ZRUN_HOME or ".") .. "/recipes/data/sample.txt")
local blocks = T.sample_rows(tok):group_texts(32)
local train_ds, eval_ds = blocks:select(1, 64), blocks:select(65, #blocks.rows)

local cfg = zr.models.llama.config("zrun/tiny-llama")
local function model()
  zr.manual_seed(3)
  return zr.models.llama.LlamaForCausalLM(cfg)
end

local function read_jsonl(p)
  local out = {}
  for line in io.lines(p) do out[#out + 1] = cjson.decode(line) end
  return out
end

T.test("TrainingArguments: misspelled values and keys are one line naming what is allowed", function()
  local function new(a) return zr.Trainer { model = model(), train_dataset = train_ds, args = a } end
  T.raises(function() new { save_strategy = "step" } end,
    'TrainingArguments: save_strategy must be "no", "steps", "epoch" or "best", got "step"')
  T.raises(function() new { eval_strategy = "epochs" } end, 'eval_strategy must be "no", "steps" or "epoch"')
  T.raises(function() new { learning_rte = 1e-3 } end, "'learning_rte' is not supported by zrun's Trainer; did you mean 'learning_rate'?")
  T.raises(function() new { optim = "adafactor" } end, 'optim = "adafactor" is not an optimizer zrun runs')
  T.raises(function() new { load_best_model_at_end = true } end,
    'load_best_model_at_end needs save_strategy and eval_strategy to match, got "steps" and "no"')
  T.raises(function() new { evaluation_strategy = "steps" } end, "'evaluation_strategy' was renamed 'eval_strategy'")
  T.raises(function() new { eval_strategy = "steps" } end, 'eval_strategy = "steps" needs an eval_dataset')
  T.raises(function() new { lr_scheduler_type = "cosine_with_restart" } end,
    'lr_scheduler_type must be one of constant, constant_with_warmup, cosine, cosine_warmup_with_min_lr, cosine_with_min_lr, ' ..
    'cosine_with_restarts, inverse_sqrt, linear, polynomial, warmup_stable_decay, got "cosine_with_restart"; did you mean "cosine_with_restarts"?')
  T.raises(function() new { lr_scheduler_type = "reduce_lr_on_plateau" } end, "it steps on evaluation metrics")
  T.raises(function() new { lr_scheduler_type = "cosine", lr_scheduler_kwargs = { min_lr = 1e-6 } } end,
    'lr_scheduler_kwargs: cosine takes num_cycles, not "min_lr"')
  T.raises(function() new { lr_scheduler_type = "cosine_with_min_lr", lr_scheduler_kwargs = "{min_lr: 1}" } end,
    "lr_scheduler_kwargs must be a JSON object")
  T.raises(function() new { lr_scheduler_type = "warmup_stable_decay", lr_scheduler_kwargs = { num_decay_steps = "2" } } end,
    "lr_scheduler_kwargs: num_decay_steps must be a number")
  T.raises(function() new { lr_scheduler_type = "cosine_with_min_lr" } end,
    "lr_scheduler_type cosine_with_min_lr: one of min_lr or min_lr_rate should be set through lr_scheduler_kwargs")
  T.raises(function() new { save_total_limit = 0 } end, "save_total_limit must be an integer >= 1, got 0")
  T.raises(function() new { metric_for_best_model = "accuracy", eval_strategy = "steps" } end,
    'metric_for_best_model = "accuracy": the evaluation reports loss, perplexity')
  -- keys that change nothing here are accepted (a warning names them), unless their value would change training
  T.raises(function() new { push_to_hub = true } end, "push_to_hub = true: zrun does not upload")
  T.raises(function() new { save_safetensors = false } end, "save_safetensors = false: zrun writes safetensors only")
  T.raises(function() new { dataloader_drop_last = "yes" } end, "dataloader_drop_last must be true or false")
  new { gradient_checkpointing_kwargs = { use_reentrant = false }, push_to_hub = false, log_level = "info",
    ddp_find_unused_parameters = false, dataloader_drop_last = true, prediction_loss_only = true, ignore_data_skip = false,
    ddp_backend = "gloo", ddp_broadcast_buffers = false } -- (the last two: TrainingArguments of a multi-process run)
  T.raises(function() new { ignore_data_skip = true } end, "ignore_data_skip = true: a resumed run always continues")
  new { save_on_each_node = false, use_cpu = false, skip_memory_metrics = true } -- (their defaults: what zrun does)
  T.raises(function() new { save_on_each_node = true } end, "save_on_each_node = true: rank 0 alone writes")
  T.raises(function() new { use_cpu = true } end, "use_cpu = true: the Trainer trains the model where it is")
  T.raises(function() new { skip_memory_metrics = false } end, "skip_memory_metrics = false: transformers' memory metrics")
  T.raises(function() new { save_steps = 2.5 } end, "save_steps must be a positive integer")
  -- the optimizer's and the schedule's numbers: a negative warm-up (transformers refuses it) was read as none, a
  -- warmup_ratio above 1 or below 0 bent the schedule, a string stopped the run at its first step with a Lua error
  T.raises(function() new { warmup_steps = -1 } end, "warmup_steps must be a number >= 0 (steps, or a fraction < 1 of the total steps), got -1")
  T.raises(function() new { warmup_ratio = -0.5 } end, "warmup_ratio must be a number in [0, 1]")
  T.raises(function() new { warmup_ratio = 2 } end, "warmup_ratio must be a number in [0, 1]")
  T.raises(function() new { warmup_steps = "10" } end, 'warmup_steps must be a number >= 0 (steps, or a fraction < 1 of the total steps), got "10"')
  T.raises(function() new { learning_rate = "1e-4" } end, 'learning_rate must be a number >= 0, got "1e-4"')
  T.raises(function() new { weight_decay = -0.1 } end, "weight_decay must be a number >= 0, got -0.1")
  T.raises(function() new { adam_beta2 = 1 } end, "adam_beta2 must be a number in [0, 1), got 1")
  T.raises(function() new { adam_epsilon = "x" } end, 'adam_epsilon must be a number >= 0, got "x"')
  T.raises(function() new { max_grad_norm = "1.0" } end, 'max_grad_norm must be a number (0 or less: no clipping) or false')
  new { warmup_steps = 0.1, warmup_ratio = 1, max_grad_norm = false, learning_rate = 0 } -- (false: no clipping)
  new { max_grad_norm = -1, adam_beta1 = 0, warmup_steps = 2.5 } -- (-1: no clipping, as transformers)
  -- load_best_model_at_end's save_steps multiple of eval_steps, as transformers 5.17 checks it: two fractions of the
  -- total compared in millionths (0.3 is a multiple of 0.1, which Lua's 0.3 % 0.1 is not), a fraction beside a number
  -- of steps refused unless the modulo is exact (4 and 0.5)
  local best = { eval_strategy = "steps", save_strategy = "steps", load_best_model_at_end = true }
  local function with(ss, es)
    local a = { save_steps = ss, eval_steps = es }
    for k, v in pairs(best) do a[k] = v end
    return a
  end
  for _, ok in ipairs { { 0.3, 0.1 }, { 0.6, 0.2 }, { 0.5, 0.25 }, { 4, 0.5 }, { 8, 4 } } do
    targs.resolve(with(ok[1], ok[2]), true)
  end
  T.raises(function() targs.resolve(with(0.3, 0.2), true) end, "needs save_steps to be a multiple of eval_steps, got 0.3 and 0.2")
  T.raises(function() targs.resolve(with(6, 4), true) end, "needs save_steps to be a multiple of eval_steps, got 6 and 4")
  T.raises(function() targs.resolve(with(0.5, 2), true) end, "a fraction of the total steps beside a number of steps")
  T.raises(function() zr.Trainer { model = model(), args = {}, train_data = train_ds } end, "Trainer: unknown option 'train_data'")
  local t = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds,
    args = { report_to = "none", eval_steps = 0.5, eval_strategy = "steps", max_steps = 10 } }
  t:setup()
  T.eq(t.state.eval_steps, 5, "a fraction < 1 is a share of the total steps")
end)

-- accelerator_config (transformers 5.17's AcceleratorConfig): its defaults are what zrun runs (accepted, as a table or
-- the command line's JSON), non_blocking either way; another value, or a field AcceleratorConfig does not have
-- (transformers: TypeError "unexpected keyword argument"), one line. (Was refused as an unknown argument.)
T.test("TrainingArguments: accelerator_config's defaults accepted, other values and unknown fields one line", function()
  local TA = require "zrun.trainer_args"
  local function resolve(v) return TA.resolve({ output_dir = "/tmp/zrun_acc", accelerator_config = v }, true) end
  resolve { even_batches = true, use_seedable_sampler = true, split_batches = false, non_blocking = true }
  resolve '{"dispatch_batches": null, "use_configured_state": false}'
  local said = T.printed(TA.resolve, { output_dir = "/tmp/zrun_acc", accelerator_config = { non_blocking = true } })
  assert(said:find("accelerator_config.non_blocking has no effect in zrun", 1, true), said) -- (said, not ignored)
  T.raises(function() resolve '{"split_batches": true}' end, "accelerator_config.split_batches = true is not what zrun runs")
  T.raises(function() resolve { even_batches = false } end, "accelerator_config.even_batches = false is not what zrun runs")
  T.raises(function() resolve { dispatch_batches = true } end, "accelerator_config.dispatch_batches = true is not")
  T.raises(function() resolve '{"bogus": 1}' end, "accelerator_config: unexpected field 'bogus' (AcceleratorConfig's fields: ")
  T.raises(function() resolve "/nonexistent/acc.json" end, "accelerator_config must be a JSON object or a JSON file, got " ..
    "/nonexistent/acc.json (no such file)")
end)

-- transformers' Trainer options zrun does not take say so and what to do (were "unknown option" with the list)
T.test("zr.Trainer{compute_metrics = ...} and the other Trainer options zrun does not take: one line with what to do", function()
  local function new(k)
    return function() zr.Trainer { model = zr.nn.Linear(2, 2), args = { output_dir = "/tmp/zrun_nt" }, [k] = function() end } end
  end
  T.raises(new "compute_metrics", "Trainer: compute_metrics is not supported: zrun's evaluation keeps no predictions; " ..
    "it reports eval_loss and eval_perplexity")
  T.raises(new "preprocess_logits_for_metrics", "Trainer: preprocess_logits_for_metrics is not supported")
  T.raises(new "optimizers", "Trainer: optimizers is not supported: the optimizer and its schedule come from args")
  T.raises(new "compute_loss_func", "Trainer: compute_loss_func is not supported: the loss is the model's own")
  T.raises(new "compute_metric", "Trainer: unknown option 'compute_metric'")
  -- through SFTTrainer (zrun's own caller) the message has no position in zrun's source in front
  local ok, err = pcall(zr.SFTTrainer, { model = zr.nn.Linear(2, 2), args = { output_dir = "/tmp/zrun_nt" }, compute_metrics = 1 })
  T.eq(ok, false)
  T.eq(tostring(err):sub(1, 40), "Trainer: compute_metrics is not supporte", "no sft.lua:N: in front")
end)

T.test("datasets the default collator cannot read stop at zr.Trainer{}, with the fix", function()
  local function new(ds, extra)
    local o = { model = model(), train_dataset = ds, args = { output_dir = tmp .. "/rows" } }
    for k, v in pairs(extra or {}) do o[k] = v end
    return zr.Trainer(o)
  end
  -- (was: datasets.lua:823 "attempt to index local 'r' (a number value)" at the first step)
  T.raises(function() new { 1, 2, 3 } end, "Trainer: train_dataset's row 1 is a number, not a row (a table such as { input_ids = {...} })")
  T.raises(function() new { { text = "abc", label = 1 } } end, "Trainer: train_dataset's rows need input_ids (token ids), row 1 " ..
    "has label, text: tokenize them first, e.g. ds:map(function(r) return { input_ids = tok:encode(r.text) } end)")
  T.raises(function() new { { messages = {} } } end, "(chat / instruction rows: zr.SFTTrainer prepares them)")
  T.raises(function() new(train_ds, { eval_dataset = { a = { { text = "x" } } }, args = { eval_strategy = "steps",
    output_dir = tmp .. "/rows" } }) end, "Trainer: eval_dataset.a's rows need input_ids")
  new({ { text = "abc" } }, { data_collator = function(rows) return rows end }) -- (a collator of one's own reads any rows)
end)

T.test("seed decides the model's initial weights: model_init runs after set_seed(args.seed), as in HF", function()
  local function first_weight(seed)
    local t = zr.Trainer { model_init = function() return zr.models.llama.LlamaForCausalLM(cfg) end,
      train_dataset = train_ds, args = { seed = seed } }
    return t.model:parameters()[1]:flat_table()
  end
  local a, b, c = first_weight(5), first_weight(5), first_weight(6)
  T.eq(a[1], b[1], "the same seed, the same weights")
  assert(a[1] ~= c[1] or a[2] ~= c[2], "another seed must give other weights")
  zr.manual_seed(5)
  T.eq(zr.models.llama.LlamaForCausalLM(cfg):parameters()[1]:flat_table()[1], a[1], "manual_seed(seed) then build")
  T.raises(function() zr.Trainer { train_dataset = train_ds, args = {} } end, "Trainer: model (or model_init")
  T.raises(function() zr.Trainer { model = model(), model_init = model, train_dataset = train_ds, args = {} } end,
    "pass model or model_init, not both")
end)

-- transformers 5.17's get_decay_parameter_names: nn.LayerNorm by class, everything else by the full
-- lower-cased name (bias, layernorm, rmsnorm, (^|.)norm($|.), _norm($|.)), so an RMSNorm decays unless its
-- name says norm, as Llama's input_layernorm / post_attention_layernorm / norm do
T.test("weight decay groups follow transformers 5.17: LayerNorms by class, the rest by name", function()
  local Block = nn.Module:extend("Block")
  function Block:__init()
    self.proj = nn.Linear(4, 4)                 -- weight decays, bias not
    self.ln_x = nn.LayerNorm(4)                 -- a LayerNorm whatever its name: weight and bias
    self.normalizer = nn.Linear(4, 4, { bias = false }) -- "norm" inside a word: decays
    self.rms = nn.RMSNorm(4)                    -- an RMSNorm whose name says nothing: decays
    self.post_norm = nn.RMSNorm(4)              -- _norm: not decayed
  end
  local MyNorm = nn.LayerNorm:extend("MyNorm")  -- a subclass of LayerNorm is one
  local m = nn.Sequential(Block(), MyNorm(4))
  local names = {}
  for n, p in m:named_parameters() do names[p] = n end
  local groups = zr.Trainer.param_groups(m, 0.1)
  local function list(g)
    local out = {}
    for _, p in ipairs(g.params) do out[#out + 1] = names[p] end
    table.sort(out)
    return table.concat(out, " ")
  end
  T.eq(#groups, 2)
  T.eq(groups[1].weight_decay, 0.1)
  T.eq(list(groups[1]), "0.normalizer.weight 0.proj.weight 0.rms.weight")
  T.eq(groups[2].weight_decay, 0)
  T.eq(list(groups[2]), "0.ln_x.bias 0.ln_x.weight 0.post_norm.weight 0.proj.bias 1.bias 1.weight")
  -- Llama: every RMSNorm weight is in the no-decay group, every projection in the decay group
  local lg = zr.Trainer.param_groups(model(), 0.1)
  local n_norm = 0
  for _, p in ipairs(lg[2].params) do
    T.eq(p:dim(), 1)
    n_norm = n_norm + 1
  end
  T.eq(n_norm, 2 * cfg.num_hidden_layers + 1)
  -- GPT-2: HF's no-decay set is every bias and every LayerNorm weight; embeddings and Conv1D weights decay
  local g2 = zr.models.gpt2.GPT2LMHeadModel({ vocab_size = 50, n_positions = 16, n_embd = 8, n_layer = 2, n_head = 2 })
  local gn = {}
  for n, p in g2:named_parameters() do gn[p] = n end
  for _, p in ipairs(zr.Trainer.param_groups(g2, 0.1)[2].params) do
    assert(gn[p]:match("bias$") or gn[p]:match("ln_[12f]%.weight$"), gn[p] .. " is not decayed")
  end
  for _, p in ipairs(zr.Trainer.param_groups(g2, 0.1)[1].params) do
    assert(gn[p]:match("weight$") and not gn[p]:match("ln_"), gn[p] .. " is decayed")
  end
  T.eq(#zr.Trainer.param_groups(g2, 0.1)[2].params, 2 * (4 + 4) + 2, "4 Conv1D biases and 2 LayerNorms per block, ln_f")
  -- and the engine applies it so: one AdamW step with weight_decay 10 at lr 1e-3 shrinks a decayed
  -- weight by 1% but moves a norm weight (1.0) only by Adam's step (about lr)
  local m = model()
  local norm_before = m.model.norm.weight:clone()
  local emb_before = m.model.embed_tokens.weight:clone()
  zr.Trainer { model = m, train_dataset = train_ds, args = { output_dir = tmp .. "/wd", per_device_train_batch_size = 8,
    max_steps = 1, learning_rate = 1e-3, weight_decay = 10, save_strategy = "no" } }:train()
  local dn = (m.model.norm.weight - norm_before):abs():max():item()
  assert(dn > 0 and dn < 2e-3, "norm weight moved by " .. dn .. " (decayed?)")
  local ratio = (m.model.embed_tokens.weight:narrow(1, 200, 50):abs():sum():item()) /
    (emb_before:narrow(1, 200, 50):abs():sum():item()) -- ids 199..248 = bytes 196..245: not in the ASCII text, no gradient, decay only
  T.near(ratio, 0.99, 1e-4, 0, "embedding rows without gradient shrink by lr x weight_decay")
end)

T.test("collator = DataCollatorForLanguageModeling(mlm=False): labels are ids, every pad id -100", function()
  local D = zr.datasets
  -- pad == eos (GPT-2/Llama scripts): HF masks every position holding the pad id, eos included
  local col = D.causal_lm_collator({ pad_token_id = 2 })
  local b = col({ { input_ids = { 1, 5, 2 } }, { input_ids = { 1, 6, 7, 2, 8 } } })
  T.near(b.input_ids, { 1, 5, 2, 2, 2, 1, 6, 7, 2, 8 })
  T.near(b.attention_mask, { 1, 1, 1, 0, 0, 1, 1, 1, 1, 1 })
  T.near(b.labels, { 1, 5, -100, -100, -100, 1, 6, 7, -100, 8 })
  -- packed rows carry labels (group_texts) and keep them, as HF's default_data_collator does
  local p = col({ { input_ids = { 2, 3 }, labels = { 2, 3 } } })
  T.near(p.labels, { 2, 3 })
  -- no pad id: equal rows need none, unequal ones are refused in one line
  local nopad = D.causal_lm_collator()
  T.near(nopad({ { input_ids = { 0, 4 } }, { input_ids = { 5, 0 } } }).labels, { 0, 4, 5, 0 })
  T.raises(function() nopad({ { input_ids = { 1 } }, { input_ids = { 1, 2 } } }) end,
    "collator: rows of 1 and 2 tokens need padding but there is no pad_token_id")
  -- pad_to_multiple_of: the longest row rounded up, the extra positions padding
  local m4 = D.causal_lm_collator({ pad_token_id = 2, pad_to_multiple_of = 4 })
  T.near(m4({ { input_ids = { 1, 5, 6, 7, 8 } } }).labels, { 1, 5, 6, 7, 8, -100, -100, -100 })
  T.raises(function() D.causal_lm_collator({ pad_token_id = 2, pad_to_multiple_of = "64" }) end,
    "collator: pad_to_multiple_of must be a positive integer (e.g. 64), got 64")
end)

T.test("evaluate weights every predicted token equally (uneven rows, padding, partial batches)", function()
  local m = model()
  local rows = {}
  for i = 1, 7 do rows[i] = { input_ids = tok:encode(text:sub(i * 50, i * 50 + 4 + 3 * i)) } end
  local ds = zr.datasets.Dataset.from_rows(rows)
  -- the reference: each row alone, its mean loss times its predicted tokens
  local sum, count = 0, 0
  zr.no_grad(function()
    for _, r in ipairs(rows) do
      local ids = zr.tensor({ r.input_ids }, { dtype = "i64" })
      local n = #r.input_ids - 1
      sum, count = sum + m(ids, ids).loss:item() * n, count + n
    end
  end)
  local t = zr.Trainer { model = m, eval_dataset = ds, processing_class = tok,
    args = { output_dir = tmp .. "/eval", per_device_eval_batch_size = 3 } }
  local r = t:evaluate()
  T.eq(r.eval_tokens, count)
  T.near(r.eval_loss, sum / count, 1e-6, 1e-6, "eval_loss")
  T.near(r.eval_perplexity, math.exp(sum / count), 0, 1e-6, "perplexity")
  -- a plain mean of batch means would differ: the batches have different token counts
  local plain = 0
  zr.no_grad(function()
    for b = 1, 7, 3 do
      local batch = t.collator({ rows[b], rows[b + 1], rows[b + 2] })
      plain = plain + m(batch.input_ids, batch.labels).loss:item() / 3
    end
  end)
  assert(math.abs(plain - r.eval_loss) > 1e-4, "test data too uniform to tell the weighting apart")
end)

T.test("HF lr schedules: the first step at full lr without warmup, linear/cosine decay to 0", function()
  local S = require "zrun.schedulers"
  local function lrs(name, warm, total)
    local opt = { param_groups = { { lr = 1.0 } } }
    local s = S.hf(name, opt, { num_warmup_steps = warm, num_training_steps = total })
    local out = { opt.param_groups[1].lr }
    for _ = 1, total - 1 do s:step(); out[#out + 1] = opt.param_groups[1].lr end
    return out
  end
  T.near(lrs("linear", 0, 4), { 1, 0.75, 0.5, 0.25 }, 1e-15)
  T.near(lrs("linear", 2, 6), { 0, 0.5, 1, 0.75, 0.5, 0.25 }, 1e-15)
  T.near(lrs("constant_with_warmup", 2, 4), { 0, 0.5, 1, 1 }, 1e-15)
  T.near(lrs("cosine", 1, 5), { 0, 1, (1 + math.cos(math.pi / 4)) / 2, 0.5, (1 + math.cos(3 * math.pi / 4)) / 2 }, 1e-15)
  T.near(lrs("constant", 0, 3), { 1, 1, 1 }, 0)
end)

T.test("lr_scheduler_type + lr_scheduler_kwargs (a JSON string, as on the command line) drive the steps", function()
  -- warmup_stable_decay over 6 steps, 2 of warm-up and 2 of decay, floor 10%: HF's factors per step
  -- 0.1, 0.55, 1, 1, 1, 0.55 (transformers' values for every schedule: test_hf_schedules.lua)
  local t = zr.Trainer { model = model(), train_dataset = train_ds, args = { output_dir = tmp .. "/wsd",
    per_device_train_batch_size = 8, max_steps = 6, warmup_steps = 2, learning_rate = 1e-3, logging_steps = 1,
    save_strategy = "no", lr_scheduler_type = "warmup_stable_decay",
    lr_scheduler_kwargs = '{"num_decay_steps": 2, "min_lr_ratio": 0.1}' } }
  t:train()
  local want, got, losses = { 0.1, 0.55, 1, 1, 1, 0.55 }, {}, {}
  for _, r in ipairs(t.state.log_history) do
    if r.loss then got[#got + 1], losses[#losses + 1] = r.learning_rate / 1e-3, r.loss end
  end
  T.near(got, want, 1e-12, 0, "the learning rate of each step, as a fraction of learning_rate")
  assert(losses[6] < losses[1] - 0.2, ("loss %.4f -> %.4f"):format(losses[1], losses[6]))
end)

-- transformers 5.17 reads the rate after optimizer.step and before its own scheduler.step: the rate the
-- step applied. Under a DeepSpeed file with an optimizer section but no scheduler it hands its schedule to
-- the engine (DummyScheduler), which steps it inside the step: the logged rate is the next step's.
T.test("the logged learning_rate: the step's own, or the next one where DeepSpeed's engine steps HF's schedule", function()
  local function lrs(deepspeed)
    local t = zr.Trainer { model = model(), train_dataset = train_ds, args = { output_dir = tmp .. "/lrlog",
      per_device_train_batch_size = 8, max_steps = 4, warmup_steps = 2, learning_rate = 1e-3, logging_steps = 1,
      save_strategy = "no", deepspeed = deepspeed } }
    t:train()
    local got = {}
    for _, r in ipairs(t.state.log_history) do if r.loss then got[#got + 1] = r.learning_rate / 1e-3 end end
    return got
  end
  -- linear, 2 of warm-up over 4 steps: factors 0, 0.5, 1, 0.5, then 0 at 4
  T.near(lrs(nil), { 0, 0.5, 1, 0.5 }, 1e-12, 0, "no DeepSpeed file")
  T.near(lrs({ train_micro_batch_size_per_gpu = "auto", optimizer = { type = "AdamW", params = { lr = "auto" } } }),
    { 0.5, 1, 0.5, 0 }, 1e-12, 0, "a DeepSpeed optimizer, HF's schedule")
  T.near(lrs({ train_micro_batch_size_per_gpu = "auto" }), { 0, 0.5, 1, 0.5 }, 1e-12, 0,
    "neither section: HF's optimizer and schedule, the Trainer steps it")
end)

T.test("a DeepSpeed config without an optimizer: HF's optimizer from optim, optim_args and the arguments", function()
  -- transformers builds its own optimizer then (TrainingArguments.optim, default adamw_torch) with
  -- learning_rate, adam_beta1/2, adam_epsilon and weight_decay; zrun took DeepSpeed's AdamW defaults
  -- (lr 1e-3) and dropped learning_rate
  local ds = { train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto",
    zero_optimization = { stage = 2 } }
  local function run(extra)
    local args = { output_dir = tmp .. "/noopt", per_device_train_batch_size = 8, max_steps = 3, learning_rate = 7e-4,
      logging_steps = 1, save_strategy = "no", lr_scheduler_type = "constant", adam_beta2 = 0.95, deepspeed = ds }
    for k, v in pairs(extra or {}) do args[k] = v end
    local t = zr.Trainer { model = model(), train_dataset = train_ds, args = args }
    t:train()
    local losses = {}
    for _, r in ipairs(t.state.log_history) do if r.loss then losses[#losses + 1] = r.loss end end
    assert(losses[3] < losses[1], ("loss %.4f -> %.4f"):format(losses[1], losses[3]))
    return t.engine, t.state.log_history[1].learning_rate
  end
  local e, lr = run()
  T.eq(e.config.optimizer.type, "AdamW")
  T.eq(lr, 7e-4, "the step's learning rate is learning_rate")
  T.eq(e.hp.betas[2], 0.95, "adam_beta2")
  e, lr = run { optim = "sgd", optim_args = "momentum=0.9, nesterov=True", learning_rate = 0.05 }
  T.eq(e.config.optimizer.type, "SGD")
  -- transformers sets zero_allow_untested_optimizer for the optimizer it builds: no SGD-under-ZeRO warning
  T.eq(e.config.zero_allow_untested_optimizer, true)
  T.eq(table.concat(e.config:warnings(), "\n"):find("SGD", 1, true), nil, "warnings: " .. table.concat(e.config:warnings()))
  T.eq(lr, 0.05)
  T.eq(e.hp.extra.momentum, 0.9)
  T.eq(e.hp.extra.nesterov, true)
  e = run { optim = "adagrad", learning_rate = 0.05 }
  T.eq(e.config.optimizer.type, "Adagrad")
  T.raises(function() run { optim = "adamw_8bit" } end, 'optim = "adamw_8bit" is not an optimizer zrun runs')
  for _, name in ipairs { "adamw_torch_fused", "adamw_apex_fused", "paged_adamw_32bit" } do -- (AdamW's update, other kernels)
    T.eq(run({ optim = name }).config.optimizer.type, "AdamW", name)
  end
  T.raises(function() run { optim = "sgd", optim_args = "momentum=x" } end, "optim_args: momentum must be a number")
end)

-- One step of a Trainer with `args` (and defaults for the rest); returns the "[zrun] Trainer:" lines it printed.
T.test("eval_dataset by name (transformers' dict): each evaluated as eval_<name>, the best metric one of them", function()
  local a_rows, b_rows = {}, {}
  for i = 1, 4 do a_rows[i] = eval_ds[i]; b_rows[i] = eval_ds[#eval_ds - i + 1] end
  local t = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = { wiki = a_rows, other = b_rows },
    args = { max_steps = 2, eval_strategy = "steps", eval_steps = 1, save_strategy = "no", output_dir = tmp .. "/named",
      metric_for_best_model = "wiki_loss" } }
  t:train()
  local m = t.last_eval_metrics
  local best = math.huge
  for _, r in ipairs(t.state.log_history) do if r.eval_wiki_loss then best = math.min(best, r.eval_wiki_loss) end end
  T.eq(t.state.best_metric, best, "the best of eval_wiki_loss")
  -- the same numbers as evaluating each alone (a list of rows is a dataset too)
  T.near(t:evaluate(a_rows).eval_loss, m.eval_wiki_loss, 1e-12, 1e-12, "eval_wiki_loss")
  T.near(t:evaluate(b_rows).eval_loss, m.eval_other_loss, 1e-12, 1e-12, "eval_other_loss")
  local both = t:evaluate({ x = a_rows, y = b_rows }, "test")
  T.near(both.test_x_loss, m.eval_wiki_loss, 1e-12, 1e-12); T.near(both.test_y_loss, m.eval_other_loss, 1e-12, 1e-12)
  local names = {}
  for _, r in ipairs(t.state.log_history) do if r.eval_wiki_loss then names[#names + 1] = r.step end end
  T.eq(#names, 2, "one log record per named dataset and evaluation")
  T.raises(function() zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = { wiki = 3 }, args = {} } end,
    "eval_dataset.wiki must be a dataset")
  T.raises(function() zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = { wiki = a_rows },
    args = { eval_strategy = "steps", metric_for_best_model = "wiki_acc" } } end, 'metric_for_best_model = "wiki_acc"')
end)

T.test("eval_delay: no evaluation by the strategy before that step (epoch with \"epoch\"), as transformers' flow", function()
  local function evals(a)
    local args = { max_steps = 4, eval_strategy = "steps", eval_steps = 1, save_strategy = "no", output_dir = tmp .. "/delay",
      logging_steps = 100 }
    for k, v in pairs(a) do args[k] = v end
    local t = zr.Trainer { model = model(), train_dataset = train_ds:select(1, 16), eval_dataset = eval_ds:select(1, 4), args = args }
    t:train()
    local at = {}
    for _, r in ipairs(t.state.log_history) do if r.eval_loss then at[#at + 1] = r.step end end
    return table.concat(at, " ")
  end
  T.eq(evals {}, "1 2 3 4")
  T.eq(evals { eval_delay = 3 }, "3 4")
  -- 16 rows, micro-batch 8: 2 steps an epoch; evaluation at each epoch's end from epoch 2 on
  T.eq(evals { eval_strategy = "epoch", eval_delay = 2, per_device_train_batch_size = 8 }, "4")
  T.raises(function() evals { eval_delay = -1 } end, "eval_delay must be a number >= 0")
end)

T.test("bf16_full_eval / fp16_full_eval fill the config's \"auto\" precision, as transformers fills DeepSpeed's", function()
  local function precision(a)
    a.max_steps = 1
    local t = zr.Trainer { model = model(), train_dataset = train_ds, args = a }
    t:setup()
    return t.engine.precision
  end
  T.eq(precision { bf16_full_eval = true }, "bf16")
  T.eq(precision { fp16_full_eval = true }, "f16")
  T.eq(precision { bf16_full_eval = false }, "f32")
  T.raises(function() precision { bf16_full_eval = true, deepspeed = { train_micro_batch_size_per_gpu = "auto",
    bf16 = { enabled = false } } } end, "bf16.enabled = false (file) but args.bf16_full_eval = true")
  T.raises(function() precision { bf16_full_eval = "yes" } end, "bf16_full_eval must be true or false")
end)

T.test("ddp_timeout (transformers' collective deadline, seconds) sets zrun's from the Trainer's set-up on", function()
  local function new(a) return zr.Trainer { model = model(), train_dataset = train_ds, args = a } end
  T.raises(function() new { ddp_timeout = 0 } end, "ddp_timeout must be an integer >= 1, got 0")
  T.raises(function() new { torch_empty_cache_steps = 0.5 } end, "torch_empty_cache_steps must be an integer >= 1, got 0.5")
  T.raises(function() new { ddp_timeout = "long" } end, "ddp_timeout must be an integer >= 1, got long")
  local before = zr.dist.timeout()
  new({ max_steps = 1 }):setup()
  T.eq(zr.dist.timeout(), before, "unset: ZRUN_COMM_TIMEOUT's (or 1800 s) stays")
  local ok, err = pcall(function()
    new({ max_steps = 1, ddp_timeout = 180000000 }):setup() -- (LLaMA-Factory's value)
    T.eq(zr.dist.timeout(), 180000000)
  end)
  zr.dist.set_timeout(before)
  assert(ok, err)
end)

local function trainer_lines(args)
  local out = T.printed(function()
    local a = { output_dir = tmp .. "/said", per_device_train_batch_size = 8, max_steps = 1, save_strategy = "no" }
    for k, v in pairs(args) do a[k] = v end
    zr.Trainer { model = model(), train_dataset = train_ds, args = a }:train()
  end)
  local lines = {}
  for l in out:gmatch("[^\n]+") do if l:find("[zrun] Trainer:", 1, true) == 1 then lines[#lines + 1] = l end end
  return table.concat(lines, "\n")
end

T.test("the config's dataloader_drop_last under the Trainer: not used (TrainingArguments' is), and said so", function()
  local function run(cfg_drop, args_drop)
    return trainer_lines { dataloader_drop_last = args_drop,
      deepspeed = { train_micro_batch_size_per_gpu = "auto", dataloader_drop_last = cfg_drop } }
  end
  local said = "the DeepSpeed config's dataloader_drop_last = true not used: the Trainer's loader follows " ..
    "dataloader_drop_last = false"
  T.eq(run(true, false):find(said, 1, true) ~= nil, true)
  T.eq(run(true, true):find("dataloader_drop_last", 1, true), nil, "the same value: nothing to say")
end)

T.test("arguments the run does not read are said, one line each; train{} refuses an unknown keyword", function()
  local function has(out, s) T.eq(out:find(s, 1, true) ~= nil, true, "expected " .. s .. " in:\n" .. out) end
  has(trainer_lines { warmup_steps = 1, warmup_ratio = 0.5 },
    "warmup_ratio = 0.5 not used: warmup_steps = 1 overrides it, as in transformers")
  has(trainer_lines { optim = "sgd", adam_beta1 = 0.5 }, 'adam_beta1 not used: optim = "sgd" (SGD) takes no Adam arguments')
  -- a config whose optimizer and clipping leave out what the arguments set (neither given nor "auto")
  local out = trainer_lines { max_grad_norm = 0.5, adam_beta2 = 0.9, deepspeed = { train_micro_batch_size_per_gpu = "auto",
    optimizer = { type = "AdamW", params = { lr = 1e-3 } } } }
  has(out, 'max_grad_norm not used: the DeepSpeed config has no gradient_clipping (set it to "auto" to take the argument)')
  has(out, "adam_beta2 not used: the DeepSpeed config has no optimizer.params.betas")
  -- taken: no config, "auto" in the config, or the Trainer's own optimizer
  for _, args in ipairs {
    { max_grad_norm = 0.5, adam_beta2 = 0.9, learning_rate = 1e-3, weight_decay = 0.1, adam_epsilon = 1e-6 },
    { max_grad_norm = 0.5, adam_beta2 = 0.9, deepspeed = { train_micro_batch_size_per_gpu = "auto",
      gradient_clipping = "auto" } },
    { warmup_steps = 1 },
  } do
    T.eq(trainer_lines(args), "", "nothing to say")
  end
  local t = zr.Trainer { model = model(), train_dataset = train_ds, args = { output_dir = tmp .. "/said",
    per_device_train_batch_size = 8, max_steps = 1, save_strategy = "no" } }
  T.raises(function() t:train { resume_from_checkpont = true } end,
    "Trainer:train: unknown argument resume_from_checkpont (it takes resume_from_checkpoint")
end)

T.test("eval_on_start evaluates once before the first step (and needs an eval_dataset)", function()
  local t = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds, args = { output_dir = tmp .. "/eos",
    per_device_train_batch_size = 8, max_steps = 2, logging_steps = 1, save_strategy = "no", eval_on_start = true } }
  t:train()
  local h = t.state.log_history
  T.eq(h[1].step, 0); assert(h[1].eval_loss, "the first record is an evaluation")
  T.eq(h[2].step, 1); assert(h[2].loss, "then the first step's loss")
  local n = 0
  for _, r in ipairs(h) do if r.eval_loss then n = n + 1 end end
  T.eq(n, 1, "no other evaluation (eval_strategy no)")
  T.raises(function()
    zr.Trainer { model = model(), train_dataset = train_ds, args = { max_steps = 1, eval_on_start = true } }:train()
  end, "eval_on_start = true needs an eval_dataset")
  T.raises(function() zr.Trainer { model = model(), args = { eval_on_start = "yes" } } end, "eval_on_start must be true or false")
end)

T.test("include_num_input_tokens_seen counts the inputs (all, or non-padding), saves and resumes the count", function()
  local function seen(t)
    local out = {}
    for _, r in ipairs(t.state.log_history) do if r.loss then out[#out + 1] = r.num_input_tokens_seen end end
    return out
  end
  local out = tmp .. "/seen"
  local args = { output_dir = out, per_device_train_batch_size = 8, max_steps = 4, logging_steps = 1, save_steps = 2,
    include_num_input_tokens_seen = true }
  local t = zr.Trainer { model = model(), train_dataset = train_ds, args = args }
  t:train()
  T.eq(table.concat(seen(t), ","), "256,512,768,1024", "8 blocks of 32 tokens a step")
  T.eq(tckpt.read_state(out .. "/checkpoint-2").num_input_tokens_seen, 512, "trainer_state.json's count")
  args.resume_from_checkpoint = out .. "/checkpoint-2"
  local r = zr.Trainer { model = model(), train_dataset = train_ds, args = args }
  r:train()
  T.eq(table.concat(seen(r), ","), "256,512,768,1024", "resumed: the count goes on from the checkpoint's")
  -- uneven rows padded by the collator: "non_padding" counts attention_mask's ones, "all" every position
  local rows = {}
  for i = 1, 16 do rows[i] = { input_ids = tok:encode(("x"):rep(4 + i)) } end
  local ds = zr.datasets.Dataset.from_rows(rows)
  local function count(mode)
    local tt = zr.Trainer { model = model(), train_dataset = ds, processing_class = tok, args = { output_dir = tmp .. "/seen2",
      per_device_train_batch_size = 4, max_steps = 1, logging_steps = 1, save_strategy = "no",
      include_num_input_tokens_seen = mode, data_seed = 1 } }
    tt:train()
    return seen(tt)[1], tt
  end
  local all, tt = count("all")
  local nonpad = count("non_padding")
  local real, longest = 0, 0
  local order = tt:data_order()
  for j = 1, 4 do
    local n = #rows[order[j]].input_ids
    real, longest = real + n, math.max(longest, n)
  end
  T.eq(nonpad, real, "the real tokens of the step's rows")
  T.eq(all, 4 * longest, "rows padded to the longest")
  T.raises(function() zr.Trainer { model = model(), args = { include_num_input_tokens_seen = "some" } } end,
    'include_num_input_tokens_seen must be "all", "non_padding", "no", true or false')
end)

T.test("non_padding counts and padding sides as transformers 5.17's Trainer (rows' own attention_mask, padding-free)", function()
  -- 8 rows, 4 a step, in order; their last token is the pad (0). Expected: transformers 5.17's state.num_input_tokens_seen
  -- at steps 1 and 2 on these rows (include_num_input_tokens_seen = "non_padding")
  local ids = { { 13, 59, 42, 17, 0 }, { 40, 16, 86, 68, 77, 0 }, { 90, 5, 21, 76, 8, 82, 0 }, { 6, 42, 84, 56, 61, 42, 48, 0 },
    { 26, 19, 54, 45, 40, 14, 14, 37, 0 }, { 17, 92, 75, 51, 0 }, { 67, 60, 83, 81, 65, 0 }, { 32, 15, 8, 83, 47, 84, 0 } }
  local function run(rows, collator)
    local tt = zr.Trainer { model = model(), train_dataset = rows, processing_class = tok, data_collator = collator,
      args = { output_dir = tmp .. "/seen3", per_device_train_batch_size = 4, max_steps = 2, logging_steps = 1,
        save_strategy = "no", train_sampling_strategy = "sequential", include_num_input_tokens_seen = "non_padding" } }
    tt:train()
    local out = {}
    for _, r in ipairs(tt.state.log_history) do if r.loss then out[#out + 1] = r.num_input_tokens_seen end end
    return table.concat(out, ",")
  end
  -- a padding-free batch (no attention_mask): the tokens that are not processing_class's pad token (transformers 5.17
  -- with TRL 1.10's DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=16): 22,45)
  local rows = {}
  for i, r in ipairs(ids) do rows[i] = { input_ids = r } end
  T.eq(run(rows, zr.datasets.causal_lm_collator { pad_token_id = 0, mask_pad_token = false, padding_free = true,
    pad_to_multiple_of = 16 }), "22,45", "padding-free: the tokens that are not the pad")
  -- rows tokenized with padding to 9 tokens, their attention_mask with them (transformers 5.17,
  -- DataCollatorForLanguageModeling(tokenizer, mlm=False): 22,45, the masks' ones)
  local function padded(left)
    local out = {}
    for i, r in ipairs(ids) do
      local n, x, m = #r - 1, {}, {}
      for t = 1, 9 do
        local real = left and t > 9 - n or not left and t <= n
        x[t], m[t] = real and r[left and t - (9 - n) or t] or 0, real and 1 or 0
      end
      out[i] = { input_ids = x, attention_mask = m }
    end
    return out
  end
  T.eq(run(padded(false)), "22,45", "right-padded rows: their attention_mask's ones")
  -- left padding: transformers masks it, zrun's models would attend to it
  T.raises(function() run(padded(true)) end, "row 1 of a batch has padding before a token")
  -- a collator without labels: transformers' model returns no loss and its Trainer stops (ValueError); one line here
  T.raises(function()
    run(rows, function(b) local x = zr.datasets.causal_lm_collator { pad_token_id = 0 }(b); x.labels = nil; return x end)
  end, "the data collator's batch has no labels (it has: attention_mask, input_ids)")
end)

T.test("neftune_noise_alpha: uniform noise on the token embeddings in training mode only (transformers' NEFTune)", function()
  local m = model()
  local t = zr.Trainer { model = m, train_dataset = train_ds, args = { output_dir = tmp .. "/neft", max_steps = 4,
    per_device_train_batch_size = 8, learning_rate = 3e-3, logging_steps = 1, save_strategy = "no", neftune_noise_alpha = 5 } }
  t:train()
  local h = t.state.log_history
  assert(h[4].loss < h[1].loss, ("loss %.4f -> %.4f"):format(h[1].loss, h[4].loss))
  local emb, T_, H = m:get_input_embeddings(), 32, cfg.hidden_size
  local ids = (zr.rand({ 4, T_ }) * 200):to("i64")
  m:eval()
  local plain = emb(ids)
  T.near(emb(ids), plain, 0, 0, "no noise in evaluation")
  m:train()
  local d1, d2 = emb(ids) - plain, emb(ids) - plain
  local mag = 5 / math.sqrt(T_ * H)
  local big = d1:abs():max():item()
  assert(big <= mag * (1 + 1e-6) and big > 0.95 * mag, ("noise up to %g, expected uniform in [-%g, %g]"):format(big, mag, mag))
  assert(math.abs(d1:mean():item()) < 0.05 * mag, "the noise has mean 0")
  assert((d1 - d2):abs():max():item() > 0, "fresh noise at every forward")
  T.raises(function() zr.Trainer { model = model(), args = { neftune_noise_alpha = -1 } } end,
    "neftune_noise_alpha must be a positive number")
end)

T.test("the last step off the logging grid is printed and is last_loss, but not recorded (transformers logs none there)", function()
  local out = tmp .. "/offgrid"
  local t = zr.Trainer { model = model(), train_dataset = train_ds, processing_class = tok,
    args = { output_dir = out, per_device_train_batch_size = 8, max_steps = 5, logging_steps = 2, save_strategy = "no" } }
  local said, r = T.printed(function() return t:train() end)
  local steps = {}
  for _, h in ipairs(t.state.log_history) do if h.loss then steps[#steps + 1] = h.step end end
  T.eq(table.concat(steps, ","), "2,4", "records at the logging steps only")
  local jl = {}
  for _, rec in ipairs(read_jsonl(out .. "/metrics.jsonl")) do if rec.loss then jl[#jl + 1] = rec.step end end
  T.eq(table.concat(jl, ","), "2,4", "metrics.jsonl the same")
  T.eq(r.n_logged, 2, "two records")
  assert(said:find("step 5/5 | loss", 1, true), said)
  local five = tonumber(said:match("step 5/5 | loss (%d+%.%d+)"))
  T.near(r.last_loss, five, 1e-4, 0, "last_loss: step 5's")
end)

T.test("training learns; epoch strategies log, evaluate and save; metrics.jsonl holds full-precision values", function()
  local out = tmp .. "/learn"
  local t = zr.Trainer { model = model(), train_dataset = train_ds, eval_dataset = eval_ds, processing_class = tok,
    args = { output_dir = out, per_device_train_batch_size = 8, num_train_epochs = 3, learning_rate = 3e-3,
      weight_decay = 0.01, logging_strategy = "epoch", eval_strategy = "epoch", save_strategy = "epoch",
      logging_first_step = true, save_total_limit = 5, lr_scheduler_type = "cosine", warmup_ratio = 0.1 } }
  local before = t:evaluate()
  local r = t:train()
  T.eq(r.global_step, 24)
  local recs = read_jsonl(out .. "/metrics.jsonl")
  local steps, evals, grad = {}, {}, nil
  for _, rec in ipairs(recs) do
    if rec.loss then steps[#steps + 1] = rec.step; grad = rec.grad_norm end
    if rec.eval_loss then evals[#evals + 1] = rec end
  end
  T.eq(table.concat(steps, ","), "1,8,16,24", "logging_first_step, then each epoch")
  T.eq(#evals, 4, "before training and after each epoch")
  T.eq(evals[4].step, 24)
  assert(evals[4].eval_loss < before.eval_loss - 1.0, ("eval loss %.4f -> %.4f"):format(before.eval_loss, evals[4].eval_loss))
  T.near(evals[4].eval_perplexity, math.exp(evals[4].eval_loss), 0, 1e-12)
  assert(grad and grad > 0, "grad_norm " .. tostring(grad))
  assert(r.last_loss < r.first_loss - 1.0, ("train loss %.4f -> %.4f"):format(r.first_loss, r.last_loss))
  assert(tostring(recs[#recs].train_loss):len() > 8, "train_loss is written with all its digits")
  local kept = {}
  for _, e in ipairs(tckpt.list(out)) do kept[#kept + 1] = e.step end
  T.eq(table.concat(kept, ","), "8,16,24")
  local st = tckpt.read_state(out .. "/checkpoint-16")
  T.eq(st.global_step, 16)
  T.eq(st.epoch, 2)
  T.eq(st.max_steps, 24)
  T.eq(st.num_train_epochs, 3)
  assert(st.log_history[#st.log_history].eval_loss, "the epoch's evaluation is in the state saved after it")
end)

T.test("logging_nan_inf_filter (HF's default): a NaN micro-batch loss is logged as HF's tr_loss formula counts it", function()
  -- row 5's labels are all -100: its loss is 0/0 = NaN (its gradient zero). HF adds tr_loss / (1 + steps
  -- since the last log) in its place: 0 when it opens the interval (one micro-batch a step, a log each
  -- step); without the filter the step logs NaN
  local rows = {}
  for i = 1, 8 do
    local ids = train_ds.rows[i].input_ids
    local labels = {}
    for j = 1, #ids do labels[j] = i == 5 and -100 or ids[j] end
    rows[i] = { input_ids = ids, labels = labels }
  end
  local ds = zr.datasets.Dataset.from_rows(rows)
  local function run(filter)
    local t = zr.Trainer { model = model(), train_dataset = ds, args = { output_dir = tmp .. "/naninf_" .. tostring(filter),
      per_device_train_batch_size = 1, max_steps = 8, logging_steps = 1, learning_rate = 1e-3, save_strategy = "no",
      logging_nan_inf_filter = filter } }
    local r = t:train()
    local losses = {}
    for _, rec in ipairs(t.state.log_history) do if rec.loss then losses[rec.step] = rec.loss end end
    return losses, r.train_loss
  end
  local raw, raw_mean = run(false)
  local nan_step
  for s = 1, 8 do if raw[s] ~= raw[s] then assert(not nan_step, "one NaN step"); nan_step = s end end
  assert(nan_step, "the row without labels gives a NaN loss")
  T.eq(raw_mean ~= raw_mean, true, "train_loss without the filter is NaN")
  local got, mean = run(true)
  for s = 1, 8 do T.eq(got[s], s == nan_step and 0 or raw[s], ("logged loss at step %d"):format(s)) end
  T.eq(mean == mean, true, "train_loss with the filter is a number")
  T.eq(pcall(zr.Trainer, { model = model(), train_dataset = ds, args = { logging_nan_inf_filter = "yes" } }), false,
    "a non-boolean is refused")
end)

T.test("micro-batches of one-token rows (an empty text with its BOS) predict nothing: training goes on, as in HF", function()
  -- transformers' loss pads the shifted labels with -100: a row of one token counts no label, its micro-batch
  -- adds nothing to the step (a step of them only: 0/0, NaN, logged as 0 by the filter, a zero gradient);
  -- zrun's causal LM loss refused such a batch, stopping the run there
  local rows = {}
  for i = 1, 6 do
    local ids = train_ds.rows[i].input_ids
    rows[i] = { input_ids = (i == 2 or i == 5) and { ids[1] } or ids }
  end
  local t = zr.Trainer { model = model(), train_dataset = zr.datasets.Dataset.from_rows(rows), args = {
    output_dir = tmp .. "/one_token", per_device_train_batch_size = 1, max_steps = 6, logging_steps = 1, learning_rate = 1e-3,
    save_strategy = "no", train_sampling_strategy = "sequential" } }
  t:train()
  local logged = {}
  for _, rec in ipairs(t.state.log_history) do if rec.loss then logged[rec.step] = rec end end
  for s = 1, 6 do
    local one = s == 2 or s == 5
    T.eq(logged[s].loss == 0, one, ("step %d's loss %s"):format(s, tostring(logged[s].loss)))
    T.eq(logged[s].grad_norm == 0, one, ("step %d's grad_norm %s"):format(s, tostring(logged[s].grad_norm)))
  end
  -- the loss itself, both models: no label counts, no gradient reaches the logits
  local V = 11
  local logits = zr.randn({ 2, 1, V }):requires_grad_()
  local loss = zr.models.llama.causal_lm_loss(logits, zr.tensor({ { 3 }, { 4 } }, { dtype = "i64" }))
  loss:backward()
  T.eq(logits.grad:abs():sum():item(), 0)
  local g2 = zr.models.gpt2.GPT2LMHeadModel({ vocab_size = 50, n_positions = 16, n_embd = 8, n_layer = 1, n_head = 2 })
  local ids = zr.tensor({ { 7 }, { 9 } }, { dtype = "i64" })
  local out = g2(ids, ids)
  assert(out.loss:item() ~= nil, "GPT-2 takes a batch of one-token rows")
end)

T.test("data_order() is the order training reads the rows (accumulation, across epochs)", function()
  local pos, seen = {}, {}
  for i, r in ipairs(train_ds.rows) do pos[r] = i end
  local inner = zr.datasets.causal_lm_collator()
  local function recording(rows)
    for _, r in ipairs(rows) do seen[#seen + 1] = pos[r] end
    return inner(rows)
  end
  local t = zr.Trainer { model = model(), train_dataset = train_ds, data_collator = recording,
    args = { output_dir = tmp .. "/order", per_device_train_batch_size = 5, gradient_accumulation_steps = 2,
      max_steps = 9, save_strategy = "no", data_seed = 4 } }
  local order = t:data_order()
  t:train()
  -- 64 rows: 13 micro-batches of 5 (the last of 4 rows), 6 windows of 2 and a 7th of one; steps 8 and 9 in
  -- the second epoch
  T.eq(t.steps_per_epoch, 7)
  local order2, sizes = t:data_order()
  T.eq(#order, 64 + 4 * 5)
  T.eq(table.concat(sizes, ","), "5,5,5,5,5,5,5,5,5,5,5,5,4,5,5,5,5")
  T.eq(table.concat(order2, ","), table.concat(order, ","))
  T.eq(table.concat(seen, ","), table.concat(order, ","))
  assert(table.concat(order, ",", 1, 20) ~= table.concat(order, ",", 65, 84), "each epoch has its own order")
end)

T.test("save_model writes a Hugging Face directory that loads back to the same logits", function()
  local out = tmp .. "/hf"
  local m = model()
  local t = zr.Trainer { model = m, train_dataset = train_ds, processing_class = tok,
    args = { output_dir = out, per_device_train_batch_size = 8, max_steps = 2, learning_rate = 1e-2, save_strategy = "no" } }
  t:train()
  T.eq(t:save_model(), true)
  for _, n in ipairs { "config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json" } do
    assert(zr._C.path_type(out .. "/" .. n) == "file", n .. " missing")
  end
  T.eq(#tckpt.list(out), 0, "save_strategy = no writes no checkpoint")
  local c = cjson.decode(io.open(out .. "/config.json"):read("*a"))
  T.eq(c.architectures[1], "LlamaForCausalLM")
  T.eq(c.torch_dtype, "float32")
  T.eq(c.model_type, "llama")
  local g = cjson.decode(io.open(out .. "/generation_config.json"):read("*a"))
  T.eq(g._from_model_config, true)
  local m2 = zr.models.llama.from_pretrained(out)
  local sd2 = {}
  for n, p in m2:named_parameters() do sd2[n] = p end
  for n, p in m:named_parameters() do T.near(sd2[n], p, 0, 0, n) end
  local ids = zr.tensor({ tok:encode("The keeper wrote the weather") }, { dtype = "i64" })
  T.near(m2(ids).logits, m(ids).logits, 1e-6, 0, "logits of the reloaded model")
  local t2 = zr.tokenizers.load(out)
  T.eq(table.concat(t2:encode("Ships, salt & oil ✓"), " "), table.concat(tok:encode("Ships, salt & oil ✓"), " "))
end)

T.test("save_model at ZeRO stage 3: gathers with stage3_gather_16bit_weights_on_model_save, else says how to consolidate", function()
  for _, gather in ipairs { true, false } do
    local out = ("%s/z3_%s"):format(tmp, tostring(gather))
    local t = zr.Trainer { model = model(), train_dataset = train_ds,
      args = { output_dir = out, per_device_train_batch_size = 8, max_steps = 1, save_strategy = "no",
        deepspeed = { train_micro_batch_size_per_gpu = "auto", steps_per_print = 1000,
          optimizer = { type = "AdamW", params = { lr = "auto" } },
          zero_optimization = { stage = 3, stage3_gather_16bit_weights_on_model_save = gather } } } }
    t:train()
    T.eq(t:save_model(), gather)
    T.eq(zr._C.path_type(out .. "/model.safetensors") == "file", gather)
    assert(zr._C.path_type(out .. "/config.json") == "file", "config.json")
    if not gather then -- the sharded checkpoint instead, which zero-to-fp32 turns into the missing weights
      assert(zr._C.path_type(out .. "/latest") == "file", "the sharded checkpoint is written instead")
      require("zrun.zero_to_fp32").main({ out, out .. "/model.safetensors" })
      local m2 = zr.models.llama.from_pretrained(out)
      T.eq(m2.config.hidden_size, cfg.hidden_size)
    end
  end
end)

sh("rm -rf '" .. tmp .. "'")
T.done()
