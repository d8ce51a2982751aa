-- zr.Trainer: the Hugging Face Trainer loop on top of zr.initialize. Arguments are
-- TrainingArguments' (zrun.trainer_args checks them); `deepspeed` is a config path or table (none:
-- ZeRO stage 0 with every value taken from the arguments, as plain HF training). It logs, evaluates
-- and saves on HF's strategies (steps / epoch), writes checkpoint-<step> folders that resume to the
-- same loss curve, and saves a Hugging Face model directory. Rank 0 prints (a progress bar on a
-- terminal) and writes metrics.jsonl, a new file per run (zrun.metrics; `zrun plot` draws it).
--   local trainer = zr.Trainer{ model = model, args = {...}, train_dataset = ds, eval_dataset = ev,
--                               processing_class = tok }
--   trainer:train()   -- or trainer:train{ resume_from_checkpoint = true }
--   trainer:evaluate(); trainer:save_model()
local zr = require "zrun"
local C = zr._C
local dist = require "zrun.dist"
local datasets = require "zrun.datasets"
local targs = require "zrun.trainer_args"
local tckpt = require "zrun.trainer_checkpoint"
local cbs = require "zrun.trainer_callbacks"
local cjson = require "cjson"
local metrics_file = require "zrun.metrics"
local json_line = require("zrun.hf").encode_json_line
local progress = require "zrun.progress"
local packed = require "zrun.models.packed"
local release_outputs = require("zrun.models.llama").release_outputs

local Trainer = {}
Trainer.__index = Trainer
Trainer.last = setmetatable({}, { __mode = "v" })

local fmt, floor, ceil, huge = string.format, math.floor, math.ceil, math.huge

local OPTIONS = { model = true, model_init = true, args = true, train_dataset = true, eval_dataset = true, data_collator = true,
  tokenizer = true, processing_class = true, callbacks = true }

-- The model's forward options for a batch: opts (label smoothing), plus the batch's position_ids when
-- the collator gives them (a padding-free batch of packed sequences, TRL's: the model keeps attention
-- inside each sequence), kept where the collator made them (the model reads them on the host).
-- stats: the per-token entropy and argmax too (opts.token_stats, for token_sums).
local function forward_options(opts, batch, stats)
  if not batch.position_ids and not stats then return opts end
  local o = { position_ids = batch.position_ids, token_stats = stats or nil }
  for k, v in pairs(opts or {}) do o[k] = v end
  return o
end

-- zrun's models attend causally and read no attention_mask: a row's padding after its tokens changes nothing
-- they see, but padding before a token (left padding: transformers' tokenizer padding_side "left", rows
-- tokenized so) would be attended to where transformers masks it. Such a batch is refused, and one without
-- input_ids or labels (transformers' model returns no loss then, and its Trainer stops).
local function check_batch(batch)
  if type(batch) ~= "table" or not batch.input_ids or not batch.labels then
    local keys = {}
    for k in pairs(type(batch) == "table" and batch or {}) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    error(fmt("Trainer: the data collator's batch has no %s (it has: %s); the loss needs input_ids and labels " ..
      "(zr.datasets.causal_lm_collator makes labels from input_ids)", type(batch) ~= "table" and "input_ids or labels" or
      not batch.input_ids and "input_ids" or "labels", type(batch) == "table" and table.concat(keys, ", ") or type(batch)), 0)
  end
  local m = batch.attention_mask
  if not m then return end
  local B, T_, f = m:size(1), m:size(2), m:flat_table()
  for b = 0, B - 1 do
    for t = b * T_ + 2, (b + 1) * T_ do
      if f[t - 1] == 0 and f[t] ~= 0 then
        error(fmt("Trainer: row %d of a batch has padding before a token (attention_mask 0 at position %d, 1 at %d): " ..
          "zrun's models read no attention_mask and attend causally, so only right padding is masked; pad on the " ..
          "right (tokenizer padding_side \"right\", as the default collator does)", b + 1, t - 1 - b * T_, t - b * T_), 0)
      end
    end
  end
end

-- A right-padded batch as the padding-free batch of its rows (zrun.models.packed's unpad: one row, position_ids
-- counting from 0 in each, the padding not computed; the same losses and gradients) where the model runs packed
-- sequences as one row (its packs_flat: zrun's Llama family and GPT-2 where the attention takes the segments);
-- transformers computes the padding and drops it. nil: run the batch as collated (no padding, a collator's
-- position_ids, a padded label that counts, or trainer.unpad_batches = false). Returns the batch and the map of
-- its other labels (packed.unpad).
function Trainer:unpadded(batch)
  local m = self.model
  if self.unpad_batches == false or type(m) ~= "table" or type(m.packs_flat) ~= "function" or not m:packs_flat() then
    return nil
  end
  return packed.unpad(batch)
end

-- The model's forward options for the loss: label_smoothing_factor, the loss_type zr.SFTTrainer sets (TRL's "dft"),
-- and chunked_loss (the LM head and loss without the full logits: use_liger_kernel's fused linear cross-entropy,
-- TRL's chunked_nll); nil for the plain token-mean cross-entropy.
local function loss_options(self)
  local ls = self.args.label_smoothing_factor
  local chunked = self.chunked_loss
  if ls == 0 and not self.loss_type and not chunked then return nil end
  return { label_smoothing = ls ~= 0 and ls or nil, loss_type = self.loss_type, chunked_loss = chunked or nil }
end

-- TRL's per-micro-batch sums over the labels that count after the shift, from a forward run with
-- token_stats: {entropy of the softmax at the position before each, argmax hits, labels} as one (3)
-- f32 tensor on the labels' device (nothing read back); the forward's entropy and argmax are released.
local function token_sums(out, labels)
  local scope = C.handle_serial() -- (its temporaries freed here, not left to a full collection)
  local T_ = labels:size(2)
  local tgt = labels:narrow(2, 2, T_ - 1):to("f32")
  local mask = tgt:ne(-100):to("f32")
  local ent, am = out.entropy:narrow(2, 1, T_ - 1), out.argmax:narrow(2, 1, T_ - 1):to("f32")
  local r = zr.cat({ (ent * mask):sum():view(1), (am:eq(tgt):to("f32") * mask):sum():view(1), mask:sum():view(1) })
  zr.release(out.entropy, out.argmax)
  out.entropy, out.argmax = nil, nil
  C.release_since(scope, r)
  return r
end

-- TRL's logged entropy and mean_token_accuracy are means over micro-batches of each one's entropy sum /
-- labels and hits / labels (0 without labels), its sums taken over the ranks. A list of token_sums (emptied;
-- one all-reduce, collective: every rank holds as many) is folded into tok = {sum of entropies, sum of
-- accuracies, micro-batches}; token_means(tok) then gives the two means (nil before any).
local function fold_tokens(list, tok)
  if #list == 0 then return end
  local c = zr.cat(list)
  local t = c:to("cpu", "f64")
  if t ~= c then zr.release(c) end
  for i = #list, 1, -1 do zr.release(list[i]); list[i] = nil end
  dist.all_reduce(t, "sum")
  local v = t:flat_table()
  zr.release(t)
  for i = 1, #v, 3 do
    if v[i + 2] > 0 then tok[1], tok[2] = tok[1] + v[i] / v[i + 2], tok[2] + v[i + 1] / v[i + 2] end
  end
  tok[3] = tok[3] + #v / 3
end
local function token_means(tok)
  if tok[3] == 0 then return nil, nil end
  return tok[1] / tok[3], tok[2] / tok[3]
end

-- Python's round(x, n), as transformers' speed_metrics rounds runtimes (4 places) and rates (3).
local function round(x, n)
  local m = 10 ^ n
  return floor(x * m + 0.5) / m
end

-- transformers' speed_metrics(split, start_time, ...): <split>_runtime (seconds, rounded to 4 places) and,
-- unless it is 0, <split>_samples/steps/tokens_per_second (counts over the runtime, rounded to 3) into rec.
local function speed_metrics(rec, split, runtime, samples, steps, tokens)
  rec[split .. "_runtime"] = round(runtime, 4)
  if runtime == 0 then return rec end
  if samples then rec[split .. "_samples_per_second"] = round(samples / runtime, 3) end
  if steps then rec[split .. "_steps_per_second"] = round(steps / runtime, 3) end
  if tokens then rec[split .. "_tokens_per_second"] = round(tokens / runtime, 3) end
  return rec
end

local function hms(s)
  s = math.max(0, floor(s + 0.5))
  return fmt("%02d:%02d:%02d", floor(s / 3600), floor(s / 60) % 60, s % 60)
end

-- transformers' default logging_dir: output_dir/runs/<Mon DD_HH-MM-SS>_<host>
local function default_logging_dir(output_dir)
  return fmt("%s/runs/%s_%s", output_dir, os.date("%b%d_%H-%M-%S"), require("zrun.monitor.tensorboard").hostname())
end

-- A dataset as the Trainer reads it: a zrun Dataset, or a list of rows (made one); nil stays nil.
local function as_dataset(ds, what)
  if ds == nil or (type(ds) == "table" and ds.rows) then return ds end
  if type(ds) == "table" and (ds[1] ~= nil or next(ds) == nil) then return datasets.Dataset.from_rows(ds) end
  error(fmt("Trainer: %s must be a dataset (zr.datasets.Dataset or a list of rows), got %s", what,
    type(ds) == "table" and "a table of named values" or type(ds)), 0)
end
-- eval_dataset: one dataset, or several by name ({name = dataset}, transformers' dict: each evaluated with
-- the metrics prefix eval_<name>).
local function as_datasets(ds)
  if not datasets.is_named(ds) then return as_dataset(ds, "eval_dataset") end
  local named = {}
  for name, d in pairs(ds) do
    if type(name) ~= "string" then error("Trainer: eval_dataset's names must be strings", 0) end
    named[name] = as_dataset(d, "eval_dataset." .. name)
  end
  return named
end

-- The default collator's rows: tables with input_ids (token ids). Text rows or bare values stop here, with
-- the fix, not inside the collator at the first step (a data_collator of one's own reads what it likes).
local function check_rows(ds, what)
  local r = ds and ds.rows and ds.rows[1]
  if r == nil then return end
  if type(r) ~= "table" then
    error(fmt("Trainer: %s's row 1 is a %s, not a row (a table such as { input_ids = {...} })", what, type(r)), 0)
  end
  local t = type(r.input_ids)
  if t == "table" or t == "userdata" then return end
  local has = {}
  for k in pairs(r) do has[#has + 1] = tostring(k) end
  table.sort(has)
  error(fmt("Trainer: %s's rows need input_ids (token ids), row 1 has %s: tokenize them first, e.g. " ..
    "ds:map(function(r) return { input_ids = tok:encode(r.text) } end)%s", what, #has > 0 and table.concat(has, ", ")
    or "no fields", (r.messages or r.prompt or r.conversations) and " (chat / instruction rows: zr.SFTTrainer prepares them)"
    or ""), 0)
end

-- transformers' Trainer options zrun does not take, and what to do instead (they were "unknown option")
local NOT_TAKEN = {
  compute_metrics = "zrun's evaluation keeps no predictions; it reports eval_loss and eval_perplexity (SFTTrainer also " ..
    "eval_mean_token_accuracy and eval_entropy): compute other metrics after training from model:generate or the " ..
    "model's forward over the evaluation rows",
  preprocess_logits_for_metrics = "zrun's evaluation keeps no logits (there is no compute_metrics); it reports " ..
    "eval_loss and eval_perplexity",
  optimizers = "the optimizer and its schedule come from args (optim, learning_rate, weight_decay, lr_scheduler_type, " ..
    "...) or the DeepSpeed config's optimizer / scheduler sections",
  optimizer_cls_and_kwargs = "the optimizer comes from args.optim and its arguments (adam_beta1, ..., optim_args) or " ..
    "the DeepSpeed config's optimizer section",
  compute_loss_func = "the loss is the model's own: the token-mean cross-entropy (label_smoothing_factor; SFTTrainer's " ..
    "loss_type \"dft\")",
}

-- zr.Trainer{ model =, args =, train_dataset =, eval_dataset =, data_collator =, processing_class =, callbacks = }
-- (also model_init, a function returning the model, and tokenizer, processing_class's old name), as
-- transformers' Trainer: args are TrainingArguments (zrun.trainer_args checks every key), with
-- args.deepspeed a DeepSpeed config path or table. Unknown options are refused. Sets args.seed first.
function Trainer.new(opts)
  if type(opts) ~= "table" then error("Trainer{model=, args=, train_dataset=, ...}: expected a table", 2) end
  -- (a user's script gets its line in front; zrun's own caller, SFTTrainer, none: the mistake is the user's)
  local level = (debug.getinfo(2, "S").source or ""):find("/lua/zrun/", 1, true) and 0 or 2
  for k in pairs(opts) do
    if NOT_TAKEN[k] then error(fmt("Trainer: %s is not supported: %s", k, NOT_TAKEN[k]), level) end
    if not OPTIONS[k] then
      local names = {}
      for n in pairs(OPTIONS) do names[#names + 1] = n end
      table.sort(names)
      error(fmt("Trainer: unknown option '%s' (options: %s)", tostring(k), table.concat(names, ", ")), level)
    end
  end
  local self = setmetatable({}, Trainer)
  self.args, self.user_args = targs.resolve(opts.args)
  self.chunked_loss = targs.liger(self.args, true) -- (use_liger_kernel: the LM head and loss without full logits)
  -- HF's set_seed(args.seed), first in Trainer.__init__: model_init (a function returning the model)
  -- builds it after, so args.seed decides its initial weights, as in HF.
  zr.manual_seed(self.args.seed)
  if opts.model and opts.model_init then error("Trainer: pass model or model_init, not both", 2) end
  self.model = opts.model or (opts.model_init and opts.model_init())
  if not self.model then error("Trainer: model (or model_init, a function returning it) is required", 2) end
  if self.chunked_loss and not self.model.supports_chunked_loss then
    error("Trainer: use_liger_kernel = true runs the LM head and loss without the full logits (its fused linear " ..
      "cross-entropy) through the model's forward option chunked_loss, which this model does not declare " ..
      "(supports_chunked_loss: zrun's Llama family and GPT-2 do); set liger_kernel_config = " ..
      "{fused_linear_cross_entropy = false} or drop use_liger_kernel", 2)
  end
  self.train_dataset, self.eval_dataset = as_dataset(opts.train_dataset, "train_dataset"), as_datasets(opts.eval_dataset)
  if not opts.data_collator then
    check_rows(self.train_dataset, "train_dataset")
    if datasets.is_named(self.eval_dataset) then
      for name, d in pairs(self.eval_dataset) do check_rows(d, "eval_dataset." .. name) end
    else
      check_rows(self.eval_dataset, "eval_dataset")
    end
  end
  self.processing_class = opts.processing_class or opts.tokenizer
  if self.args.eval_strategy ~= "no" and not self.eval_dataset then
    error(fmt("Trainer: eval_strategy = \"%s\" needs an eval_dataset", self.args.eval_strategy), 2)
  end
  local pad = self.processing_class and self.processing_class.pad_id and self.processing_class:pad_id() or nil
  -- (on a GPU the default collator pads rows of different lengths to a multiple of 64 tokens: fewer
  -- distinct shapes, half the time on padded rows at the same losses, RESULTS.md session 25; right padding
  -- with -100 labels changes nothing the real tokens see. Rows of one length stay as they are.)
  local plain = datasets.causal_lm_collator({ pad_token_id = pad })
  local p1 = self.model.parameters and self.model:parameters()[1]
  local rounded = p1 and p1:device() ~= "cpu" and
    Trainer.counted_unrounded(datasets.causal_lm_collator({ pad_token_id = pad, pad_to_multiple_of = 64 }))
  self.collator = opts.data_collator or rounded and function(rows)
    for _, r in ipairs(rows) do if #r.input_ids ~= #rows[1].input_ids then return rounded(rows) end end
    return plain(rows)
  end or plain
  self.state = { global_step = 0, epoch = 0, log_history = {}, num_input_tokens_seen = 0 }
  self.callbacks, self.control = cbs.check(opts.callbacks), cbs.new_control() -- zrun.trainer_callbacks
  if self.args.report_to[1] == "tensorboard" then -- (a copy: the caller's list stays as it was)
    local list = { cbs.TensorBoardCallback(self.args.logging_dir or default_logging_dir(self.args.output_dir)) }
    for _, cb in ipairs(self.callbacks) do list[#list + 1] = cb end
    self.callbacks = list
  end
  self:callback("on_init_end")
  return self
end
setmetatable(Trainer, { __call = function(_, opts) return Trainer.new(opts) end })
require("zrun.trainer_report").install(Trainer) -- log_metrics, save_metrics, save_state, add/pop/remove_callback

-- HF's grouping (transformers 5.17 get_decay_parameter_names): no weight decay for the parameters of
-- LayerNorm modules (by class) and for those whose full dotted name matches its forbidden_name_patterns
-- (bias, layernorm, rmsnorm, (^|.)norm($|.), _norm($|.), lower-cased): Llama's RMSNorms by their names.
-- A collator whose batches zrun pads further than the user asked (to a multiple of 64 tokens on a GPU, for fewer
-- shapes): each batch notes counted_numel, its rows x the longest row, the input_ids.numel() transformers' collator
-- (padding to the longest) gives, which num_input_tokens_seen and total_flos count as transformers does.
function Trainer.counted_unrounded(collate)
  return function(rows)
    local b, longest = collate(rows), 0
    for _, r in ipairs(rows) do longest = math.max(longest, #r.input_ids) end
    b.counted_numel = #rows * longest
    return b
  end
end

function Trainer.no_decay_name(name)
  local n = "." .. name:lower() .. "."
  return n:find("bias", 1, true) or n:find("layernorm", 1, true) or n:find("rmsnorm", 1, true)
    or n:find("%.norm%.") or n:find("_norm%.") or false
end
local no_decay_name = Trainer.no_decay_name

-- The set of model's parameters HF does not decay (parameter -> true).
function Trainer.no_decay_params(model)
  local no_decay = {}
  for mname, nm in model:named_modules() do
    local ln = zr.nn.Module.isinstance(nm, zr.nn.LayerNorm)
    for _, pname in ipairs(nm._param_order) do
      if ln or no_decay_name(mname == "" and pname or mname .. "." .. pname) then no_decay[nm._parameters[pname]] = true end
    end
  end
  return no_decay
end

-- The optimizer's parameter groups as HF builds them: { params, weight_decay } for the weights that
-- decay and { params, weight_decay = 0 } for the others (Trainer.no_decay_params: transformers 5.17's rule).
function Trainer.param_groups(model, weight_decay)
  local no_decay = Trainer.no_decay_params(model)
  local decay, nd = {}, {}
  for _, p in ipairs(model:parameters()) do
    if p.requires_grad then
      if no_decay[p] then nd[#nd + 1] = p else decay[#decay + 1] = p end
    end
  end
  local groups = {}
  if #decay > 0 then groups[#groups + 1] = { params = decay, weight_decay = weight_decay } end
  if #nd > 0 then groups[#groups + 1] = { params = nd, weight_decay = 0.0 } end
  return groups
end

-- Without a DeepSpeed config the Trainer trains as plain HF does: stage 0, everything from the arguments
-- (the optimizer from args.optim, as for a config without an "optimizer" section: config_auto.lua).
local function default_config()
  return { train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto", gradient_clipping = "auto",
    bf16 = { enabled = "auto" }, fp16 = { enabled = "auto" }, steps_per_print = 1e9, zero_optimization = { stage = 0 } }
end

-- What `accelerate launch` hands the Trainer (zrun.accelerate_env): with DeepSpeed, its DeepSpeed config
-- where TrainingArguments names none (as transformers takes its DeepSpeedPlugin's; beside one, it is
-- said unused); without, its mixed_precision where the arguments set neither bf16 nor fp16 (as
-- TrainingArguments keeps ACCELERATE_MIXED_PRECISION then), into hf_args for the default config's "auto".
local function launch_config(a, hf_args)
  local acc = require "zrun.accelerate_env"
  local cfg, what = acc.deepspeed_config(a)
  if cfg and a.deepspeed then
    dist.print0(fmt("[zrun] Trainer: %s not used: TrainingArguments' deepspeed config is (as in transformers)", what))
    return nil
  elseif cfg then
    dist.print0(fmt("[zrun] Trainer: DeepSpeed config from accelerate launch: %s", (what:gsub("^accelerate's ", ""))))
    if acc.zero3_init() then
      dist.print0("[zrun] Trainer: zero3_init_flag: zrun builds each rank's model whole before the engine partitions it " ..
        "(no deepspeed.zero.Init: the same weights, more memory while loading)")
    end
    return cfg
  end
  local mp = not a.deepspeed and acc.mixed_precision(a)
  if mp then
    hf_args[mp] = true
    dist.print0(fmt("[zrun] Trainer: %s from accelerate launch's mixed_precision (ACCELERATE_MIXED_PRECISION=%s)", mp, mp))
  end
end

-- NEFTune (transformers' neftune_noise_alpha): in training mode the token embeddings' output gets
-- uniform noise in [-m, m], m = alpha / sqrt(T * hidden) (T: the batch's sequence length), as
-- transformers' forward hook on get_input_embeddings() adds it; evaluation sees none.
function Trainer:activate_neftune(alpha)
  local emb = self.model.get_input_embeddings and self.model:get_input_embeddings()
  if not emb then error("Trainer: neftune_noise_alpha needs a model with get_input_embeddings()", 0) end
  self.neftune_hook = emb:register_forward_hook(function(m, out)
    if not m.training then return nil end
    local mag = alpha / math.sqrt(out:size(2) * out:size(3))
    local noise = zr.rand(out:shape(), { dtype = out:dtype(), device = out:device() })
    return out + (noise * (2 * mag) - mag)
  end, { keeps_tensors = false })
end

-- Builds the engine (zr.initialize with args.deepspeed or a stage-0 config from the arguments), the
-- schedule and the step counts; train(), evaluate() and save_model() call it (it runs once).
function Trainer:setup()
  if self.engine then return end
  local a = self.args
  local W = dist.world_size()
  -- transformers' ddp_timeout: the deadline of every collective from here on (as init_process_group's
  -- timeout; zrun's ranks have met already, under ZRUN_COMM_TIMEOUT)
  if a.ddp_timeout then dist.set_timeout(a.ddp_timeout) end
  local hf_args = {}
  for k, v in pairs(self.user_args) do hf_args[k] = v end
  hf_args.optim, hf_args.optim_args = a.optim, a.optim_args or nil -- HF's optimizer when the config has none
  local launched = launch_config(a, hf_args)
  local ds_cfg = a.deepspeed or launched or default_config()
  -- The config's micro-batch and accumulation drive the data (a number in the file that the
  -- arguments did not set wins, as the engine will use it; a conflicting argument is an error here).
  local pre = require("zrun.config").load(ds_cfg, { world_size = W, args = hf_args,
    hidden_size = self.model.config and self.model.config.hidden_size })
  if a.label_smoothing_factor ~= 0 and not self.model.token_mean_loss then
    error(fmt("Trainer: label_smoothing_factor = %g needs a model whose forward(ids, labels, {label_smoothing=}) " ..
      "smooths its loss (zrun's Llama and GPT-2 do; %s does not declare token_mean_loss)", a.label_smoothing_factor,
      self.model.__name or "this model"), 0)
  end
  if a.auto_find_batch_size then pre = self:find_batch_size(pre, ds_cfg, hf_args, W) end
  a.per_device_train_batch_size = pre.train_micro_batch_size_per_gpu or a.per_device_train_batch_size
  a.gradient_accumulation_steps = pre.gradient_accumulation_steps or a.gradient_accumulation_steps
  -- ZenFlow: DeepSpeed replaces the accumulation by update_interval (a step is one update window) and
  -- steps the schedule at every micro-batch, so the schedule's length is in micro-batches. update_interval
  -- "auto": the host update windows vary, and a step stays gradient_accumulation_steps micro-batches, as
  -- HF's Trainer counts them over DeepSpeed (self.count_micro: steps counted in micro-batches)
  local zf = pre.zero_optimization and pre.zero_optimization.zenflow
  local per_micro = zf and type(zf.update_interval) == "number" and zf.update_interval or nil
  if per_micro then a.gradient_accumulation_steps = per_micro end
  if zf and zf.update_interval == "auto" then per_micro, self.count_micro = a.gradient_accumulation_steps,
    a.gradient_accumulation_steps end
  -- An epoch as transformers 5 runs it: micro-batches of the rows (the last one shorter unless
  -- dataloader_drop_last), an optimizer step every gradient_accumulation_steps of them and one more for
  -- the epoch's last few (a shorter window). ZenFlow's update windows stay whole: there the last few
  -- micro-batches of an epoch are left out (said below).
  local n = self.train_dataset and #self.train_dataset.rows or 0
  local bs, gas = a.per_device_train_batch_size, a.gradient_accumulation_steps
  local mbs = require("zrun.config").micro_batches_per_epoch(n, W, bs, a.dataloader_drop_last)
  local per_epoch = zf and floor(mbs / gas) or ceil(mbs / gas)
  if self.train_dataset and per_epoch < 1 then
    error(fmt("Trainer: %d training rows are too few for one %s (%d per device x %d ranks%s%s): use more data, a " ..
      "smaller per_device_train_batch_size%s%s", n, zf and "ZenFlow update window" or "micro-batch", bs, W,
      zf and fmt(" x %d micro-batches", gas) or "", a.dataloader_drop_last and ", dataloader_drop_last" or "",
      zf and " / update_interval" or "", a.dataloader_drop_last and " or dataloader_drop_last = false" or ""), 0)
  end
  if self.train_dataset and zf and mbs % gas ~= 0 then
    dist.print0(fmt("[zrun] Trainer: ZenFlow updates every %d micro-batches: the last %d of each epoch's %d are left " ..
      "out", gas, mbs % gas, mbs))
  end
  self.steps_per_epoch = math.max(per_epoch, 1)
  self.micro_per_epoch = zf and self.steps_per_epoch * gas or math.max(mbs, 1)
  self.total_steps = a.max_steps > 0 and a.max_steps or ceil(self.steps_per_epoch * a.num_train_epochs)
  hf_args.max_steps = self.total_steps * (per_micro or 1)
  if a.gradient_checkpointing and self.model.gradient_checkpointing_enable then self.model:gradient_checkpointing_enable() end
  if a.neftune_noise_alpha then self:activate_neftune(a.neftune_noise_alpha) end
  self.engine = zr.initialize({ model = self.model, config = ds_cfg, args = hf_args,
    num_training_steps = self.total_steps * (per_micro or 1), model_parameters = Trainer.param_groups(self.model, nil) })
  local e = self.engine
  if not e.lr_scheduler then -- HF builds its own schedule when the config has none (with ZenFlow in
    -- micro-batches too, as it is stepped: warm-up and length scaled by update_interval)
    local warm = require("zrun.config").warmup_steps(a.warmup_steps, a.warmup_ratio, self.total_steps)
    e.lr_scheduler = require("zrun.schedulers").hf(a.lr_scheduler_type, e.optimizer,
      { num_warmup_steps = warm * (per_micro or 1), num_training_steps = self.total_steps * (per_micro or 1),
        kwargs = a.lr_scheduler_kwargs or nil })
    self.hf_schedule = true
    -- a DeepSpeed file with an optimizer section: transformers hands this schedule to the engine
    -- (DummyScheduler with its callable), which steps it inside the step, before the Trainer reads the rate
    self.engine_steps_hf_schedule = (a.deepspeed or launched) and e.config:source("optimizer") == "file"
  end
  if (self.user_args.optim or self.user_args.optim_args) and e.config:source("optimizer") ~= "args" then
    dist.print0(fmt("[zrun] Trainer: %s not used: the DeepSpeed config's optimizer (%s) is",
      self.user_args.optim and fmt("optim = \"%s\" is", a.optim) or "optim_args are", e.config.optimizer.type))
  end
  -- the config's dataloader_drop_last is for DeepSpeed's own loader (deepspeed.initialize(training_data=));
  -- transformers' Trainer batches with its own, by TrainingArguments.dataloader_drop_last
  if e.config:source("dataloader_drop_last") == "file" and e.config.dataloader_drop_last ~= a.dataloader_drop_last then
    dist.print0(fmt("[zrun] Trainer: the DeepSpeed config's dataloader_drop_last = %s not used: the Trainer's loader " ..
      "follows dataloader_drop_last = %s (TrainingArguments), as transformers' does", tostring(e.config.dataloader_drop_last),
      tostring(a.dataloader_drop_last)))
  end
  if e.lr_scheduler and not self.hf_schedule and (self.user_args.lr_scheduler_type or self.user_args.lr_scheduler_kwargs) then
    dist.print0(fmt("[zrun] Trainer: %s not used: the DeepSpeed config's scheduler (%s) is",
      self.user_args.lr_scheduler_type and fmt("lr_scheduler_type = \"%s\" is", a.lr_scheduler_type) or
      "lr_scheduler_kwargs are", e.config.scheduler.type))
  end
  self:say_unused_args()
  self.is_main = dist.rank() == 0
  local st = self.state
  st.max_steps, st.num_train_epochs = self.total_steps, ceil(self.total_steps / self.steps_per_epoch)
  st.logging_steps = targs.interval(a.logging_steps, self.total_steps)
  st.save_steps = targs.interval(a.save_steps, self.total_steps)
  -- (eval_steps: TrainerState's default 500 where the arguments have none: eval_strategy "no" or "epoch")
  st.eval_steps = a.eval_steps and targs.interval(a.eval_steps, self.total_steps) or 500
  st.train_batch_size = a.per_device_train_batch_size
  if self.is_main and a.output_dir then
    -- (called through pcall, so the message carries no position inside zrun: the fix is the argument)
    local ok, err = pcall(C.makedirs, a.output_dir)
    if not ok then error(fmt("output_dir: %s; pass output_dir= a folder you can write to", tostring(err)), 0) end
    self:open_metrics()
  end
  -- zr.plot() draws the latest run: this trainer while it lives (weak: it holds the model), else its file
  Trainer.last[1], Trainer.last_output_dir = self, a.output_dir
end

-- The search itself: o = { model = (its config), config =, seq_len =, world_size =, loss_type =, chunked_loss =, packed =,
-- gradient_checkpointing =,
-- lora = (a PEFT model's peft_config: the base frozen, the adapters trained), start =, gpu_memory = (bytes) }. Returns
-- the micro-batch (0: not even 1 fits), its plan and the usable bytes it was held to.
local function pick_batch_size(o)
  local plan, usable = require "zrun.memory_plan", require("zrun.memory_offload").usable(o.gpu_memory)
  local bs, p = o.start, nil
  while bs > 0 do
    p = plan.plan { model = o.model, config = o.config, micro_batch = bs, seq_len = o.seq_len, world_size = o.world_size,
      gradient_checkpointing = o.gradient_checkpointing or nil, loss_type = o.loss_type, packed = o.packed,
      chunked_loss = o.chunked_loss,
      lora = o.lora }
    if p.device.total <= usable then return bs, p, usable end
    if bs == 1 then return 0, p, usable end
    bs = floor(bs * 0.9)
  end
  return 0, p, usable
end
Trainer.pick_batch_size = pick_batch_size

-- auto_find_batch_size: the largest micro-batch from per_device_train_batch_size down, in accelerate's
-- steps (x 0.9, rounded down), whose memory plan (zrun.memory_plan, which follows what runs to ~1%)
-- fits the GPU with the longest training row: the search runs before anything is allocated, so no
-- step has to fail out of memory first. The accumulation stays (HF's rule: the effective batch
-- shrinks with it). On the CPU nothing is searched. Returns the config loaded with the batch found.
function Trainer:find_batch_size(pre, ds_cfg, hf_args, W)
  local a = self.args
  local kind = pre:source("train_micro_batch_size_per_gpu")
  if kind == "file" or kind == "override" then
    error(fmt("Trainer: auto_find_batch_size sets the micro-batch, but the DeepSpeed config fixes " ..
      "train_micro_batch_size_per_gpu = %s: make it \"auto\" (or drop auto_find_batch_size)",
      tostring(pre.train_micro_batch_size_per_gpu)), 0)
  end
  local p1 = self.model:parameters()[1]
  local dev = p1 and p1:device() or "cpu"
  local gpu = dev ~= "cpu" and C.cuda and C.cuda.memory_summary(tonumber(dev:match(":(%d+)$")) or 0).device_total
  if not gpu or gpu == 0 then
    dist.print0(fmt("[zrun] Trainer: auto_find_batch_size: the model is on the %s, whose memory is not searched; " ..
      "micro-batch %d", dev, a.per_device_train_batch_size))
    return pre
  end
  local T = 0
  for _, r in ipairs(self.train_dataset and self.train_dataset.rows or {}) do T = math.max(T, #r.input_ids) end
  -- a LoRA model (zr.peft) plans its frozen base and trained adapters (far less than a full fine-tune); an adapter
  -- the plan does not model (lm_head among its targets) is planned as a full fine-tune, an upper bound, and said so
  local peft = require "zrun.peft"
  local lora = peft.is_peft_model(self.model) and self.model.peft_config or nil
  local function search(l)
    return Trainer.pick_batch_size { model = self.model.config, config = pre, seq_len = T, world_size = W,
      gradient_checkpointing = a.gradient_checkpointing, start = a.per_device_train_batch_size, gpu_memory = gpu,
      loss_type = self.loss_type, chunked_loss = self.chunked_loss or nil, packed = self.packed_batches, lora = l }
  end
  local ok, bs, p, usable = pcall(search, lora)
  if not ok and lora then
    dist.print0(fmt("[zrun] Trainer: auto_find_batch_size: %s; planning this LoRA model as a full fine-tune (more " ..
      "memory than it needs: a smaller micro-batch may be chosen)", (tostring(bs):gsub("^memory plan: ", "the memory plan: "))))
    ok, bs, p, usable = pcall(search, nil)
  end
  if not ok then error(bs, 0) end
  if bs == 0 then
    error(fmt("Trainer: auto_find_batch_size: even a micro-batch of 1 row of %d tokens needs %s of the GPU's %s " ..
      "usable (memory plan); run `zrun plan` with --fit for settings that fit (gradient_checkpointing, ZeRO " ..
      "stage 3, offload)", T, zr.memory.human(p.device.total), zr.memory.human(usable)), 0)
  end
  dist.print0(fmt("[zrun] Trainer: auto_find_batch_size: micro-batch %d%s (memory plan %s of %s usable, rows of " ..
    "up to %d tokens)", bs, bs ~= a.per_device_train_batch_size and fmt(" (from %d)", a.per_device_train_batch_size)
    or "", zr.memory.human(p.device.total), zr.memory.human(usable), T))
  if bs == a.per_device_train_batch_size then return pre end
  a.per_device_train_batch_size, hf_args.per_device_train_batch_size = bs, bs
  return require("zrun.config").load(ds_cfg, { world_size = W, args = hf_args,
    hidden_size = self.model.config and self.model.config.hidden_size })
end

-- The trainer's global step: the engine's optimizer steps, or with ZenFlow's update_interval "auto"
-- the micro-batches trained / gradient_accumulation_steps (its host updates come when they come).
function Trainer:step_count()
  local e = self.engine
  if self.count_micro then return floor(e.micro_steps / self.count_micro) end
  return e.global_steps
end

local function norm_dir(p) return (p:gsub("/+$", ""):gsub("^%./", "")) end

-- Starts output_dir/metrics.jsonl for this run (rank 0): the previous run's file is renamed to
-- metrics.<its run id>.jsonl and the new one opens with a header record (zrun.metrics).
function Trainer:open_metrics()
  local a, e = self.args, self.engine
  local h = { run_id = metrics_file.new_run_id(), world_size = dist.world_size(), zrun_version = zr.version,
    model = self.model.__name, zero_stage = e.stage, precision = e.precision, max_steps = self.total_steps,
    deepspeed_config = e.config, args = self.user_args }
  local path = self.resume_path
  if path then
    local ok, saved = pcall(tckpt.read_state, path)
    h.resumed_from = ok and saved.global_step or tonumber(path:match("checkpoint%-(%d+)/?$"))
    h.resume_checkpoint = path
    -- a checkpoint of this output_dir: the previous metrics file is the run it resumes (zrun plot joins them)
    h.continues = norm_dir(norm_dir(path):match("^(.*)/[^/]+$") or ".") == norm_dir(a.output_dir)
  end
  local f, header = metrics_file.open(a.output_dir, h)
  self.metrics, self.run_id = f, header.run_id
end

-- Draws this run's curves (zrun.plot): a text chart on stdout; opts.svg = path also writes the SVG.
function Trainer:plot(opts) return require("zrun.plot").show(self, opts) end

-- Appends a record to log_history and metrics.jsonl (rank 0). A non-finite value (an fp16 step
-- whose gradients overflowed logs grad_norm inf) is written as Python's json writes it (Infinity).
-- With include_num_input_tokens_seen every record gets num_input_tokens_seen, as transformers' log() adds it.
function Trainer:log(rec)
  if self.args.include_num_input_tokens_seen ~= "no" then rec.num_input_tokens_seen = self.state.num_input_tokens_seen end
  local h = self.state.log_history
  h[#h + 1] = rec
  if self.is_main and self.metrics then
    self.metrics:write(json_line(rec), "\n")
    self.metrics:flush()
  end
  self.control.should_log = false -- (transformers' CallbackHandler.on_log)
  self:callback("on_log", rec)
end

-- Calls event on the callbacks (zrun.trainer_callbacks) with the arguments, state and control.
function Trainer:callback(event, extra)
  if #self.callbacks == 0 then return end
  local e = self.engine -- (events after setup: the engine and its schedule are final; on_init_end comes before)
  local kw = self.callback_kw or { model = self.model, optimizer = e and e.optimizer, lr_scheduler = e and e.lr_scheduler,
    processing_class = self.processing_class, trainer = self }
  if e then self.callback_kw = kw end
  cbs.call(self.callbacks, event, self.args, self.state, self.control, extra, kw)
end

-- transformers 5's _determine_best_metric, after each evaluation the strategy runs in training:
-- best_metric and best_global_step follow metric_for_best_model (the checkpoint is named at the save).
-- Returns whether this evaluation is a new best.
function Trainer:update_best(metrics)
  local a, st = self.args, self.state
  local m = a.metric_for_best_model
  if not m then return end
  local v = metrics[m]
  if v == nil then -- (transformers raises a KeyError)
    local names = {}
    for k in pairs(metrics) do if type(k) == "string" and k:match("^eval_") then names[#names + 1] = k end end
    table.sort(names)
    error(fmt("metric_for_best_model = %s is not among the evaluation's metrics (%s)", m, table.concat(names, ", ")), 0)
  end
  if st.best_metric == nil then st.best_metric = a.greater_is_better and -huge or huge end
  if (a.greater_is_better and v > st.best_metric) or (not a.greater_is_better and v < st.best_metric) then
    st.best_metric = v
    if a.save_strategy ~= "no" then st.best_global_step = st.global_step end
    return true
  end
  return false
end

-- Whether a strategy fires now: at every `every` steps ("steps") or at an epoch's end ("epoch").
local function due(strategy, every, step, epoch_end)
  if strategy == "steps" then return not epoch_end and step % every == 0 end
  return strategy == "epoch" and epoch_end
end

-- Arguments the run does not read, given by the caller, each said in one line (transformers takes the
-- same values and says nothing of most): warmup_ratio beside warmup_steps (warmup_steps wins, which
-- transformers logs), Adam's arguments with optim sgd/adagrad, a model without gradient checkpointing,
-- and arguments whose DeepSpeed key the config leaves out (neither set nor "auto": the config's
-- value, or DeepSpeed's default, is what runs).
function Trainer:say_unused_args()
  local a, u, cfg = self.args, self.user_args, self.engine.config
  local function say(...) dist.print0("[zrun] Trainer: " .. fmt(...)) end
  if (a.warmup_steps or 0) > 0 and (u.warmup_ratio or 0) > 0 then
    say("warmup_ratio = %s not used: warmup_steps = %s overrides it, as in transformers", tostring(a.warmup_ratio),
      tostring(a.warmup_steps))
  end
  local otype = cfg.optimizer and cfg.optimizer.type
  if cfg:source("optimizer") == "args" and otype ~= "AdamW" then
    for _, k in ipairs { "adam_beta1", "adam_beta2", "adam_epsilon" } do
      if u[k] ~= nil then say("%s not used: optim = \"%s\" (%s) takes no Adam arguments", k, a.optim, otype) end
    end
  end
  if a.gradient_checkpointing and not self.model.gradient_checkpointing_enable then
    say("gradient_checkpointing not used: this model has no gradient_checkpointing_enable (zrun's Llama and GPT-2 do)")
  end
  local file_opt = cfg:source("optimizer") == "file"
  for _, t in ipairs(require("zrun.config_auto").ARG_KEYS) do
    local k, path = t[1], t[2]
    local src = cfg:source(path)
    if u[k] ~= nil and (file_opt or path == "gradient_clipping") and src == "default" then
      say("%s not used: the DeepSpeed config has no %s (set it to \"auto\" to take the argument)", k, path)
    end
  end
end

-- Trains for max_steps (or num_train_epochs). resume: true (the latest checkpoint in output_dir) or
-- a checkpoint-<step> folder, or {resume_from_checkpoint = ...}; default args.resume_from_checkpoint.
-- Returns {global_step=, train_loss= (transformers': this run's step losses summed over the global step, their mean
-- but after a resume, whose earlier steps it does not sum; also training_loss, TrainOutput's name),
-- first_loss=, last_loss= (the first and last logged averages; the last also the final steps' when the last step is off
-- the logging grid, which is printed but not recorded, as transformers logs none there), n_logged= (the records), metrics=
-- (transformers': train_runtime, train_loss, total_flos, epoch, train_samples/steps_per_second, rounded as its
-- speed_metrics and over the planned run: max_steps)}.
function Trainer:train(resume)
  if type(resume) == "table" then -- keyword arguments: the one train() reads here (a misspelling would start over)
    for k in pairs(resume) do
      if k ~= "resume_from_checkpoint" then
        error(fmt("Trainer:train: unknown argument %s (it takes resume_from_checkpoint = true or a checkpoint folder)",
          tostring(k)), 2)
      end
    end
    resume = resume.resume_from_checkpoint
  end
  if resume == nil then resume = self.args.resume_from_checkpoint end
  if not self.train_dataset then error("Trainer:train: no train_dataset (pass zr.Trainer{train_dataset=})", 2) end
  local path
  if resume then path = tckpt.resolve(resume, self.args.output_dir) end -- checked before anything is built
  if path and self.metrics then -- set up before (an evaluate first): the header has no resume, a record says it
    local ok, saved = pcall(tckpt.read_state, path)
    self.metrics:write(json_line({ resumed_from = ok and saved.global_step or cjson.null, resume_checkpoint = path }), "\n")
  end
  self.resume_path = path
  self:setup()
  local a, e, st = self.args, self.engine, self.state
  -- transformers' train() starts a new TrainerState (a checkpoint's when resuming): an evaluation before it is in
  -- no log_history of the run (nor in its trainer_state.json); metrics.jsonl keeps it
  if path then self:load_checkpoint(path) else st.log_history = {} end
  self.control.should_training_stop = false
  if e.zenflow then -- (its optimizer steps are split between the device and the host: no one step to call them around)
    for i, cb in ipairs(self.callbacks) do
      if cb.on_pre_optimizer_step or cb.on_optimizer_step then
        error(fmt("Trainer: callbacks[%d] has on_pre_optimizer_step / on_optimizer_step, which the Trainer does not call " ..
          "under ZenFlow (its optimizer steps are split between the device and the host)", i), 0)
      end
    end
  end
  self:snapshot_callbacks() -- (transformers' new TrainerState holds its callbacks' states from here)
  -- what a Ctrl-C says after "interrupted" (lua/main.c): which checkpoint a resume continues from
  C.set_interrupt_note(path and fmt("no checkpoint saved since resuming from %s, which resume_from_checkpoint=true " ..
    "continues from again", path) or "no checkpoint saved in this run yet")
  self:callback("on_train_begin")
  if a.eval_on_start then -- HF: one evaluation before the first step, a check of the evaluation path
    if not self.eval_dataset then error("Trainer: eval_on_start = true needs an eval_dataset", 0) end
    self:evaluate()
  end
  local W = dist.world_size()
  local bs, gas = a.per_device_train_batch_size, a.gradient_accumulation_steps
  local micro_per_epoch = self.micro_per_epoch
  local rows = self.train_dataset.rows
  e:train()
  local t_start, t_log, tokens = C.now(), C.now(), 0
  local seen0 = st.num_input_tokens_seen -- (the inputs seen before this run: a resumed checkpoint's)
  -- Micro-batch losses stay tensors until they are logged (reading one back each micro-batch would
  -- stall the GPU, as HF's tr_loss avoids too); then they are summed in double.
  -- pending_w: each loss's weight (below; a micro-batch with no label to predict counts 0, as in HF),
  -- pending_s: the steps this logging interval had completed before it. A micro-batch adds loss x weight /
  -- accumulation to sum, HF's tr_loss: over a step, the step's loss (the token mean of its window);
  -- logged is sum / the interval's steps (isteps), and the run's train_loss (logged_sum + tail_sum) / the global step:
  -- logged_sum the recorded intervals' sums, each the mean over the ranks (transformers' _total_loss_scalar gathers
  -- tr_loss at each log), tail_sum this rank's own sum of the steps after the last record (transformers adds its
  -- process's remaining tr_loss unreduced: with several ranks each reports its own train_loss, rank 0's is logged)
  local pending, pending_w, pending_s, sum, n, isteps, logged_sum, tail_sum = {}, {}, {}, 0, 0, 0, 0, 0
  -- token_accuracy (zr.SFTTrainer sets it): TRL's entropy and mean_token_accuracy in the training logs; the
  -- micro-batches' token_sums wait in pending_tok, folded into tok (sums of ratios, count) at 256 and at a log
  local pending_tok, tok = {}, { 0, 0, 0 }
  -- TRL gathers those and num_tokens with gather_for_metrics, which at the end of an epoch's loader (rows not a
  -- multiple of micro-batch x ranks, no dataloader_drop_last) keeps the first n mod (micro-batch x ranks) ranks' only
  local cut = not a.dataloader_drop_last and #rows % (bs * W) or 0
  local unlogged = 0 -- micro-batches trained since the last record of the training logs
  local token_stats = self.token_accuracy and self.model.supports_token_stats -- (zrun's Llama and GPT-2)
  local first_loss, last_loss, n_logged = nil, nil, 0
  local nan_inf_filter = a.logging_nan_inf_filter
  local function drain() -- folds the pending losses into sum, n (this logging interval) and the run's total
    for k, l in ipairs(pending) do
      local w = pending_w[k]
      local v = w == 0 and 0 or l:item() * w / gas
      zr.release(l)
      -- logging_nan_inf_filter (HF's default): a NaN or inf micro-batch loss counts as HF's tr_loss / (1 +
      -- steps since the last log): the interval's sum so far over its completed steps + 1
      if nan_inf_filter and (v ~= v or v == huge or v == -huge) then v = sum / (1 + pending_s[k]) end
      sum, n, pending[k], pending_w[k], pending_s[k] = sum + v, n + 1, nil, nil, nil
    end
  end
  -- transformers' num_items_in_batch: a step's micro-batches are collated before its first forward and
  -- their labels that count (after the shift) summed, over the ranks with average_tokens_across_devices;
  -- a micro-batch's mean loss is then weighted by count x accumulation x ranks / that sum, so the step's
  -- gradient is the mean over every counted token of the step (not the mean of micro-batch means, which
  -- weighs the tokens of short micro-batches more). Packed rows: every weight is exactly 1, but in a
  -- shorter last window (k micro-batches) accumulation / k, as without token counts, where HF divides
  -- each loss by the window's k (its current_gradient_accumulation_steps).
  local weigh = self.model.token_mean_loss
  local fwd_opts = loss_options(self)
  local ranks = a.average_tokens_across_devices and W or 1
  local window = {} -- micro-batch index -> { batch =, w =, last = }, for the accumulation window being trained
  local window_serial -- C.handle_serial() before the window was collated
  local function collate_window(idx, mb0)
    local tot, last = 0, math.min(mb0 + gas - 1, micro_per_epoch - 1)
    for m = mb0, last do
      local batch_rows = {}
      for k = m * bs + 1, math.min(m * bs + bs, #idx) do batch_rows[#batch_rows + 1] = rows[idx[k]] end
      local batch = self.collator(batch_rows)
      check_batch(batch)
      local L = batch.labels
      local scope = C.handle_serial() -- (the count's temporaries: freed once read)
      local c = weigh and L:narrow(2, 2, L:size(2) - 1):ne(-100):to("f64"):sum():item() or 1
      C.release_since(scope)
      window[m], tot = { batch = batch, w = c, last = last }, tot + c
    end
    if weigh and ranks > 1 then
      local t = zr.tensor({ tot }, { dtype = "f64" })
      dist.all_reduce(t, "sum")
      tot = t:item()
    end
    for m = mb0, last do
      local c = window[m].w
      window[m].w = not weigh and gas / (last - mb0 + 1) or tot == 0 and 1 or -- (no label in the step: 0/0, NaN as in HF)
        c * gas * ranks / tot
    end
  end
  local start_step = self:step_count()
  local epoch = floor(start_step / self.steps_per_epoch)
  local skip = (start_step % self.steps_per_epoch) * gas -- micro-batches of this epoch already trained
  dist.print0(fmt("[zrun] training: %d steps (%d per epoch), %d ranks, micro-batch %d, accumulation %d, ZeRO stage %d, %s, %s gradients%s",
    self.total_steps, self.steps_per_epoch, W, bs, gas, e.stage, e.precision, e.grad_dtype,
    path and fmt(", resumed from %s at step %d", path, start_step) or ""))

  -- this rank's input tokens seen and training FLOPs (transformers' floating_point_ops: 6 x the non-embedding
  -- parameters x the input tokens) since the last sync; summed over the ranks into the state at each log and save
  local count_seen, seen_local, flos_local = a.include_num_input_tokens_seen ~= "no" and a.include_num_input_tokens_seen, 0, 0
  local flops_per_token = 6 * self.model:num_parameters(false, true)
  -- self.log_num_tokens (SFTTrainer): TRL's num_tokens, the non-padding tokens trained on by every rank since
  -- this process started (TRL keeps it outside the trainer state: a resumed run counts from 0 again)
  local ntok_local = 0
  self.num_tokens = self.num_tokens or 0
  local function sync_counts() -- collective: every rank logs and saves at the same steps
    local t = zr.tensor({ seen_local, flos_local, ntok_local }, { dtype = "f64" })
    if W > 1 then dist.all_reduce(t, "sum") end
    local sums = t:flat_table()
    if count_seen then st.num_input_tokens_seen = st.num_input_tokens_seen + floor(sums[1] + 0.5) end
    self.num_tokens = self.num_tokens + floor(sums[3] + 0.5)
    st.total_flos, seen_local, flos_local, ntok_local = (st.total_flos or 0) + sums[2], 0, 0, 0
  end
  -- Full Lua collections before backward (C.collect_tensor_garbage) walk the whole heap, the datasets'
  -- rows included; zrun's models and this loop free their tensors so none runs. Where they take more
  -- than 10% of the training time (a model zrun does not scope, a hook that may keep tensors), say so once.
  local gc0, _, gc_s0 = C.tensor_gc_counts()
  local gc_warned = false
  local function check_gc(now)
    if gc_warned then return end
    local n, _, secs = C.tensor_gc_counts()
    secs = secs - gc_s0
    if secs > 0.2 and secs > 0.1 * (now - t_start) then
      gc_warned = true
      dist.print0(fmt("[zrun] full Lua collections took %.1f s of the %.1f s trained (%d of them, %.0f ms each): " ..
        "the model's forward leaves its tensors to Lua's collector, which walks the whole Lua heap, the datasets' rows " ..
        "included. zrun's Llama and GPT-2 free their own unless a forward hook could keep a tensor (declare one that " ..
        "does not: register_forward_hook(fn, {keeps_tensors = false})); a model of yours can free its temporaries with " ..
        "zr.release or Module:temporaries_scope (docs/memory_tour.md)", secs, now - t_start, n - gc0,
        1000 * secs / math.max(n - gc0, 1)))
    end
  end
  -- unrecorded: the last step off the logging grid, which transformers does not log: its loss is printed and
  -- becomes the result's last_loss, but no record goes to log_history, metrics.jsonl or the callbacks
  local function log_train(s, unrecorded)
    drain()
    sync_counts()
    local t = zr.tensor({ sum / math.max(isteps, 1) }, { dtype = "f64" })
    dist.all_reduce(t, "avg")
    local avg = t:item()
    zr.release(t)
    first_loss = first_loss or avg
    last_loss, n_logged = avg, n_logged + (unrecorded and 0 or 1)
    local now = C.now()
    check_gc(now)
    local tps = tokens / math.max(now - t_log, 1e-9)
    local mem = zr.memory.stats(e.device)
    local eta = (now - t_start) / math.max(s - start_step, 1) * (self.total_steps - s)
    -- HF logs the rate its own schedule applied in this step, but where DeepSpeed's engine steps the
    -- schedule (the config's, or HF's handed to it) the one after it: zrun logs as HF does in each case
    local lr = (self.hf_schedule and not self.engine_steps_hf_schedule) and self.step_lr or e:get_lr()[1]
    fold_tokens(pending_tok, tok)
    local entropy, accuracy = token_means(tok)
    local rec = { step = s, epoch = st.epoch, loss = avg, learning_rate = lr, grad_norm = e.last_grad_norm,
      tokens_per_s = tps, memory = mem.total_current, peak_memory = mem.total_peak,
      num_tokens = self.log_num_tokens and self.num_tokens or nil,
      entropy = entropy, mean_token_accuracy = accuracy }
    if not unrecorded then tok[1], tok[2], tok[3], unlogged = 0, 0, 0, 0 end -- (TRL's final metrics take them)
    -- include_num_input_tokens_seen: transformers' training logs have speed_metrics("train") since train() began
    if count_seen then speed_metrics(rec, "train", now - t_start, nil, nil, st.num_input_tokens_seen - seen0) end
    -- (no grad_norm before the first optimizer step, as HF logs none: ZenFlow "auto"'s first window may span steps)
    dist.print0(fmt("step %d/%d | loss %.4f%s | lr %.3e | %.0f tok/s | mem %s | ETA %s", s, self.total_steps, avg,
      e.last_grad_norm and fmt(" | grad_norm %.4f", e.last_grad_norm) or "", rec.learning_rate, tps,
      zr.memory.human(mem.total_current), hms(eta)))
    if not unrecorded then self:log(rec) end
    if unrecorded then tail_sum = tail_sum + sum else logged_sum = logged_sum + avg * isteps end
    t_log, tokens, sum, n, isteps = now, 0, 0, 0, 0
  end
  -- whether a checkpoint will be saved at the end of step s (or of its epoch), for ZenFlow's windows below
  local function save_due(s, epoch_end) -- ("best" saves at a new best evaluation instead)
    return (due(a.save_strategy, st.save_steps, s, epoch_end) or
      (s == self.total_steps and (a.save_strategy == "steps" or a.save_strategy == "epoch"))) and self.last_save ~= s
  end
  -- transformers' DefaultFlowCallback: the strategies' decisions at the end of step s (epoch_end: of its epoch)
  -- set as the control's flags before the callbacks' on_step_end / on_epoch_end, which see them and may change
  -- them. The "steps" strategies also act at the last step (transformers 5 evaluates there when the steps would
  -- not); eval_delay: they evaluate from that step on (that epoch with "epoch"); "epoch" saves at an epoch's
  -- end, which training stopping inside an epoch ends too.
  local function default_flow(s, epoch_end)
    local ctl = self.control
    if epoch_end then
      ctl.should_log = ctl.should_log or a.logging_strategy == "epoch"
      ctl.should_evaluate = ctl.should_evaluate or (a.eval_strategy == "epoch" and a.eval_delay <= st.epoch)
      ctl.should_save = ctl.should_save or a.save_strategy == "epoch"
      return
    end
    local last = s >= self.total_steps
    ctl.should_log = ctl.should_log or (s == 1 and a.logging_first_step) or
      (a.logging_strategy == "steps" and s % st.logging_steps == 0)
    ctl.should_evaluate = ctl.should_evaluate or (a.eval_strategy == "steps" and a.eval_delay <= s and
      (s % st.eval_steps == 0 or last))
    ctl.should_save = ctl.should_save or (a.save_strategy == "steps" and (s % st.save_steps == 0 or last))
    if last then ctl.should_training_stop = true end
  end
  -- what the control's flags ask for at the end of step s: log, evaluate (once a step), save
  local function checkpoints(s)
    local ctl = self.control
    if ctl.should_log and #pending + n > 0 then log_train(s) end
    local t0 = C.now()
    local new_best, evaluated = false, false
    if ctl.should_evaluate and self.last_eval ~= s then
      sync_counts() -- (the evaluation's record has the inputs seen so far, and TRL's num_tokens)
      new_best, evaluated = self:update_best(self:evaluate()), true
    end
    -- save_strategy "best": an evaluation decides (transformers sets should_save = is_new_best); a step saved
    -- already is saved again after an evaluation (the last step's, then its epoch's), to hold it and be the best
    local save = ctl.should_save
    if evaluated and a.save_strategy == "best" then save = new_best end
    if save and (self.last_save ~= s or evaluated) then sync_counts(); self:save_checkpoint() end
    ctl.should_log, ctl.should_evaluate, ctl.should_save = false, false, false
    t_log = t_log + (C.now() - t0) -- tokens/s counts training time only
  end

  -- a bar on a terminal (the log lines above print as before; in a pipe they are the progress)
  local bar = progress.new { total = self.total_steps, initial = start_step, desc = "train", lines = false }
  bar:run(function()
    local ctl, in_step = self.control, false
    while self:step_count() < self.total_steps and not ctl.should_training_stop do
      local idx = self:epoch_order(epoch)
      for k in pairs(window) do window[k] = nil end
      ctl.should_epoch_stop = false
      self:callback("on_epoch_begin")
      for mb = skip, micro_per_epoch - 1 do
        if not in_step then in_step = true; self:callback("on_step_begin") end
        if not window[mb] then window_serial = C.handle_serial(); collate_window(idx, mb) end
        local batch, w, boundary = window[mb].batch, window[mb].w, window[mb].last == mb
        -- (TRL's metrics, above: transformers reads a step's micro-batches before its first forward, so the whole
        -- step that reads an epoch's last micro-batch sees accelerate's end of the loader)
        local uncounted = cut > 0 and window[mb].last == micro_per_epoch - 1 and dist.rank() >= cut
        window[mb] = nil
        if not e.zenflow then e:set_gradient_accumulation_boundary(boundary) end
        local fb = self:unpadded(batch) -- (the padding-free batch of a padded one's rows, or nil)
        local ids, labels = (fb or batch).input_ids, (fb or batch).labels
        -- (the chunked loss reads its labels on the host: handed over as collated, no copy back from the GPU)
        local mlabels = fwd_opts and fwd_opts.chunked_loss and labels
        if e.device ~= "cpu" then
          ids = ids:to(e.device)
          if not mlabels or token_stats then labels = labels:to(e.device) end -- (TRL's statistics read them there)
        end
        local cm = self.count_micro
        if cm and (e.micro_steps + 1) % cm == 0 then
          -- ZenFlow "auto": a checkpoint after this micro-batch ends the host window there (a save
          -- inside one would lose its accumulated gradients; DeepSpeed's does)
          local s = (e.micro_steps + 1) / cm
          if save_due(s, false) or (mb == micro_per_epoch - 1 and s % self.steps_per_epoch == 0 and save_due(s, true)) then
            e.zenflow:force_boundary(e.micro_steps)
          end
        end
        local okstep, out = pcall(function()
          if w ~= 1 and w > 0 then e:set_loss_weight(w) end
          local o = e(ids, mlabels or labels, forward_options(fwd_opts, fb or batch, token_stats))
          e:backward(o.loss)
          return o
        end)
        if not okstep then error(self:explain_oom(out, batch.input_ids), 0) end
        pending[#pending + 1], pending_w[#pending + 1], pending_s[#pending + 1] = out.loss:detach(), w, isteps
        unlogged = unlogged + 1
        if rawget(out, "entropy") then
          pending_tok[#pending_tok + 1] = token_sums(out, labels)
          if uncounted then pending_tok[#pending_tok]:zero_() end
          if #pending_tok >= 256 then fold_tokens(pending_tok, tok) end
        end
        if #pending >= 256 then drain() end -- (few logs: bound the tensors kept)
        tokens = tokens + batch.input_ids:numel() * W
        local counted = batch.counted_numel or batch.input_ids:numel() -- (transformers': padded to the longest row)
        flos_local = flos_local + flops_per_token * counted
        if count_seen or self.log_num_tokens then -- this rank's, summed over the ranks when logged or saved
          local all = counted
          local masked = (count_seen == "non_padding" or self.log_num_tokens) and batch.attention_mask and
            batch.attention_mask:to("f64"):sum():item()
          if count_seen == "non_padding" then -- (transformers: the attention_mask's ones, else the tokens that are
            -- not processing_class's pad token, a padding-free batch's included, else every token)
            local pc = self.processing_class
            local pad = not masked and pc and pc.pad_id and pc:pad_id()
            seen_local = seen_local + (masked or pad and batch.input_ids:ne(pad):to("f64"):sum():item() or all)
          elseif count_seen then seen_local = seen_local + all end
          if self.log_num_tokens and not uncounted then ntok_local = ntok_local + (masked or all) end -- (TRL's num_tokens)
        end
        -- the micro-batch's tensors and outputs go now, not at the next full Lua collection (which walks the
        -- whole heap, the dataset's rows included): engine:backward then need not run one for them (the
        -- collator's only if it made them for this window, not a tensor it keeps)
        release_outputs(out)
        C.release_made_since(window_serial, ids, labels, batch.input_ids, batch.labels, batch.attention_mask,
          batch.position_ids, fb and fb.input_ids, fb and fb.labels, fb and fb.position_ids)
        self.step_lr = e:get_lr()[1] -- the rate this step applies (engine:step moves the schedule on)
        -- (the engine clips and steps inside engine:step, so the first is called before its clipping)
        local opt_step = boundary and not e.zenflow
        if opt_step then self:callback("on_pre_optimizer_step") end
        local ended = e:step()
        if opt_step then self:callback("on_optimizer_step") end
        if self.count_micro then ended = e.micro_steps % self.count_micro == 0 end
        if not ended then self:callback("on_substep_end") end
        if ended then
          isteps = isteps + 1
          local s = self:step_count()
          st.global_step, st.epoch, in_step = s, epoch + (mb + 1) / micro_per_epoch, false
          -- torch_empty_cache_steps: the device's cached free blocks back to the driver every that many steps
          if a.torch_empty_cache_steps and s % a.torch_empty_cache_steps == 0 and e.device ~= "cpu" then zr.cuda.empty_cache() end
          default_flow(s, false)
          self:callback("on_step_end")
          checkpoints(s)
          bar:update(1, last_loss and { loss = last_loss })
          if s >= self.total_steps or ctl.should_training_stop or ctl.should_epoch_stop then break end
        end
      end
      skip = 0
      -- transformers ends an epoch also where training stops inside it (max_steps, a callback): the epoch
      -- strategies and on_epoch_end run there too
      local s = self:step_count()
      if s % self.steps_per_epoch == 0 or s >= self.total_steps or ctl.should_training_stop or ctl.should_epoch_stop then
        default_flow(s, true)
        self:callback("on_epoch_end")
        checkpoints(s)
      end
      epoch = epoch + 1
    end
  end)
  -- the steps after the last record (the last step off the logging grid): printed and the result's last_loss
  if #pending + n > 0 and a.logging_strategy ~= "no" then log_train(self:step_count(), true) end
  drain()
  sync_counts() -- (the last steps' tokens and FLOPs, as transformers' store_flos at the end)
  -- transformers' train_loss: this run's step losses summed over the global step (max 0.001), so after a resume
  -- (whose steps before it this run did not see) lower than their mean
  local steps = self:step_count()
  local train_loss = (logged_sum + tail_sum + sum) / math.max(steps, 0.001) -- (sum: logging_strategy "no"'s steps)
  local runtime = C.now() - t_start
  -- its rates count the whole run as planned (max_steps; the samples of max_steps x the total batch, or of the
  -- epochs over every row), not the steps trained since a resume or before an early stop
  local samples = a.max_steps > 0 and self.total_steps * bs * gas * W or #rows * a.num_train_epochs
  local metrics = speed_metrics({ train_loss = train_loss, epoch = st.epoch, total_flos = st.total_flos or 0 }, "train",
    runtime, samples, self.total_steps)
  -- TRL's SFTTrainer adds its training metrics of the micro-batches after the last record (entropy,
  -- mean_token_accuracy, num_tokens) to the final metrics, unless an evaluation at the last step left its model
  -- in evaluation mode
  fold_tokens(pending_tok, tok)
  if unlogged > 0 and self.last_eval ~= steps then
    metrics.entropy, metrics.mean_token_accuracy = token_means(tok)
    metrics.num_tokens = self.log_num_tokens and self.num_tokens or nil
  end
  local rec = { step = steps } -- (the log record has the step, as transformers' log_history; the metrics do not)
  for k, v in pairs(metrics) do rec[k] = v end
  self:log(rec)
  metrics.num_input_tokens_seen = rec.num_input_tokens_seen -- (transformers' log() adds it to the metrics too)
  -- load_best_model_at_end: after the metrics' record, as transformers loads it (its on_log sees the last weights;
  -- the runtime does not count the loading)
  if a.load_best_model_at_end and st.best_model_checkpoint then self:load_best() end
  -- save_total_limit = 1 with a best checkpoint: at the end only the best is kept, as transformers does
  -- (the newest was kept beside it while training)
  if a.save_total_limit == 1 and st.best_model_checkpoint and self.is_main then
    for _, p in ipairs(tckpt.rotate(a.output_dir, 1, st.best_model_checkpoint, true)) do
      print(fmt("[zrun] deleted checkpoint %s (save_total_limit = 1 keeps the best at the end)", p))
    end
  end
  dist.barrier()
  self:callback("on_train_end")
  C.set_interrupt_note()
  return { global_step = steps, train_loss = metrics.train_loss, training_loss = metrics.train_loss, first_loss = first_loss,
    last_loss = last_loss, n_logged = n_logged, train_runtime = runtime, metrics = metrics }
end

-- The training rows this rank reads in an epoch (1-based, in order): micro-batch m (0-based) is rows
-- m x per_device_train_batch_size + 1 .. (the last one shorter where the rows run out). The epoch's
-- order: train_sampling_strategy "random": torch.randperm with a generator seeded (data_seed or seed) + epoch,
-- transformers' order under accelerate, row for row;
-- "sequential": the rows in order; "group_by_length": transformers' LengthGroupedSampler over micro-batch
-- x accumulation rows (shuffled as "random" is, then sorted by length within mega-batches, the longest
-- row first; transformers draws that shuffle from torch's global generator, whose state no seed alone gives,
-- so its order is another one). It is cut into micro-batches dealt to the ranks in turn, as accelerate shards the
-- Trainer's loader (datasets.deal_batches): with several ranks the last round is completed from the
-- first rows (every rank's micro-batches full), or dropped with dataloader_drop_last.
function Trainer:epoch_order(epoch)
  self:setup()
  local a = self.args
  local rows, W, rank, bs = self.train_dataset.rows, dist.world_size(), dist.rank(), a.per_device_train_batch_size
  local seed = a.data_seed or a.seed
  local order
  if a.train_sampling_strategy == "sequential" then
    order = {}
    for i = 1, #rows do order[i] = i end
  else
    -- (torch.randperm with a generator seeded seed + epoch: transformers' order under accelerate)
    local perm = C.randperm_torch(#rows, seed + epoch):flat_table()
    if a.train_sampling_strategy == "random" then order = perm
    else
      if not self.row_lengths then -- the length column when the rows have one, else the input_ids' length
        local col, len = a.length_column_name, {}
        for i, r in ipairs(rows) do len[i] = type(r[col]) == "number" and r[col] or #r.input_ids end
        self.row_lengths = len
      end
      order = datasets.length_grouped_indices(self.row_lengths, bs * a.gradient_accumulation_steps, perm)
    end
  end
  local idx = datasets.deal_batches(order, bs, W, rank, a.dataloader_drop_last)
  for k = #idx, self.micro_per_epoch * bs + 1, -1 do idx[k] = nil end -- (ZenFlow's whole windows)
  return idx
end

-- Every training row this rank reads over the whole run, in order, and the rows of each micro-batch
-- (per_device_train_batch_size but an epoch's last one; gradient_accumulation_steps micro-batches per
-- step, but an epoch's last step): to feed another trainer the same data in the same order. Third:
-- the whole order of each epoch the run starts (epoch_order's, one list an epoch).
function Trainer:data_order()
  self:setup()
  local a, out, sizes, epochs = self.args, {}, {}, {}
  local bs, gas, M = a.per_device_train_batch_size, a.gradient_accumulation_steps, self.micro_per_epoch
  local steps, epoch = 0, 0
  while steps < self.total_steps do
    local idx = self:epoch_order(epoch)
    epochs[epoch + 1] = idx
    for m = 0, M - 1 do
      local first, last = m * bs + 1, math.min(m * bs + bs, #idx)
      for k = first, last do out[#out + 1] = idx[k] end
      sizes[#sizes + 1] = last - first + 1
      if (m + 1) % gas == 0 or m == M - 1 then
        steps = steps + 1
        if steps == self.total_steps then break end
      end
    end
    epoch = epoch + 1
  end
  return out, sizes, epochs
end

-- What a side-by-side run elsewhere needs to read the same rows the same way (the recipes'
-- dump_blocks, tests/bench/hf_finetune.py): tensors train_order (every row of the run, 0-based, in
-- order) and train_epoch_order (each epoch's rows, one epoch a row, as many epochs as the run starts),
-- and the arguments that cut them into micro-batches and steps, as strings (safetensors metadata).
function Trainer:order_tensors()
  local order, _, epochs = self:data_order()
  for _, t in ipairs { order, unpack(epochs) } do
    for k, v in ipairs(t) do t[k] = v - 1 end
  end
  local a = self.args
  return { train_order = zr.tensor(order, { dtype = "i64" }), train_epoch_order = zr.tensor(epochs, { dtype = "i64" }) },
    { per_device_train_batch_size = tostring(a.per_device_train_batch_size), max_steps = tostring(self.total_steps),
      gradient_accumulation_steps = tostring(a.gradient_accumulation_steps),
      dataloader_drop_last = tostring(a.dataloader_drop_last) }
end

-- A checkpoint the engine refuses (truncated, changed after its save): the engine's hint names tags inside the
-- folder; a Trainer's fix is another checkpoint-<step> beside it, which is named instead.
local function raise_resume(path, err)
  local msg = tostring(err):gsub("; load another tag %(tags in [^)]*%) or save this one again$", "")
  local others = {}
  for _, c in ipairs(tckpt.list(path:match("^(.*)/[^/]+/*$") or ".")) do
    if c.complete and c.path ~= path then others[#others + 1] = c.path end
  end
  local hint = #others > 0 and fmt("; resume from an earlier one (resume_from_checkpoint=%s) or start over",
    others[#others]) or "; start over without resume_from_checkpoint"
  if msg:find("checkpoint of a different model", 1, true) then -- (no earlier checkpoint of it would fit either)
    hint = "; resume with the model it was saved from, or start over without resume_from_checkpoint"
  end
  error(fmt("resume_from_checkpoint %s: %s%s", path, msg, hint), 0)
end

-- Restores the engine (weights, optimizer, scheduler, RNG) and the trainer state from a
-- checkpoint-<step> folder; a checkpoint of another model is refused before anything changes.
function Trainer:load_checkpoint(path)
  self:setup()
  local saved = tckpt.read_state(path)
  local ok, err = pcall(self.engine.load_checkpoint, self.engine, path)
  if not ok then raise_resume(path, err) end
  local st = self.state
  st.global_step, st.epoch = self:step_count(), saved.epoch or 0
  st.log_history = saved.log_history or {}
  st.num_input_tokens_seen = saved.num_input_tokens_seen or 0
  st.total_flos = saved.total_flos or 0
  st.best_metric, st.best_model_checkpoint, st.best_global_step = saved.best_metric, saved.best_model_checkpoint,
    saved.best_global_step
  -- a best checkpoint that is no longer there (deleted to save space, or the checkpoint copied to another
  -- machine) is dropped with one line, as transformers' _init_training_state does: the run goes on, and
  -- load_best_model_at_end loads only a best found after this point (not an error after the last step)
  if st.best_model_checkpoint and C.path_type(st.best_model_checkpoint) ~= "dir" then
    dist.print0(fmt("[zrun] resume_from_checkpoint: the best checkpoint %s recorded in %s does not exist anymore; " ..
      "ignoring it for this run (as transformers does)", st.best_model_checkpoint, path))
    st.best_model_checkpoint = nil
  end
  -- callbacks' states (EarlyStoppingCallback's counter) only when asked, as transformers' _load_callback_state
  if self.args.restore_callback_states_from_checkpoint then
    for _, cb in ipairs(self.callbacks) do
      if cb.name and cb.load_state and saved.stateful_callbacks then cb:load_state(saved.stateful_callbacks[cb.name]) end
    end
  end
  local sc = saved.stateful_callbacks and saved.stateful_callbacks.ZrunTrainer
  local z, a = sc and sc.args or {}, self.args
  local now = { world_size = dist.world_size(), per_device_train_batch_size = a.per_device_train_batch_size,
    gradient_accumulation_steps = a.gradient_accumulation_steps, data_seed = a.data_seed or a.seed,
    train_rows = self.train_dataset and #self.train_dataset.rows or 0 }
  for k, v in pairs(now) do
    if z[k] ~= nil and z[k] ~= v then
      dist.print0(fmt("[zrun] resume_from_checkpoint: %s was %s and is now %s; the data order after step %d differs " ..
        "from an uninterrupted run", k, tostring(z[k]), tostring(v), st.global_step))
    end
  end
end

-- load_best_model_at_end: the weights of the best checkpoint (the engine's whole state comes back,
-- then the step counters and trainer state of the finished run are put back, as HF keeps its state).
function Trainer:load_best()
  local e, st = self.engine, self.state
  local best = st.best_model_checkpoint
  if C.path_type(best) ~= "dir" then
    error(fmt("load_best_model_at_end: the best checkpoint %s is gone (deleted by hand?)", best), 0)
  end
  dist.print0(fmt("[zrun] Loading best model from %s (score: %s).", best, tostring(st.best_metric)))
  local keep = { e.global_steps, e.micro_steps, e.skipped_steps, e.opt_steps }
  e:load_checkpoint(best)
  e.global_steps, e.micro_steps, e.skipped_steps, e.opt_steps = keep[1], keep[2], keep[3], keep[4]
  -- the weights are now the best step's: an evaluation at the last step no longer describes them (a script
  -- reusing last_eval_metrics when last_eval is the final step, as the recipes do, evaluates again)
  if best ~= tckpt.dir_for(self.args.output_dir, self:step_count()) then self.last_eval, self.last_eval_metrics = nil, nil end
end

-- Writes output_dir/checkpoint-<step>: the engine checkpoint, the model (as save_model), then
-- trainer_state.json; then removes checkpoints beyond save_total_limit.
function Trainer:save_checkpoint()
  local a, e, st = self.args, self.engine, self.state
  local step = self:step_count()
  local dir = tckpt.dir_for(a.output_dir, step)
  self.last_save = step
  -- save_only_model: the model and trainer_state.json only (no optimizer, scheduler or RNG state)
  if not a.save_only_model then e:save_checkpoint(dir, "global_step" .. step) end
  self:save_model(dir, { in_checkpoint = true })
  if st.best_global_step then -- transformers 5: the best evaluation's checkpoint, where one was saved at its step
    local best = tckpt.dir_for(a.output_dir, st.best_global_step)
    if C.path_type(best) == "dir" then st.best_model_checkpoint = best end
  end
  if self.is_main then
    tckpt.write_state(dir, self:state_json(step, true))
    C.set_interrupt_note(fmt("the last checkpoint is %s: resume_from_checkpoint=true continues from it", dir))
    print(fmt("[zrun] saved checkpoint %s", dir))
    for _, p in ipairs(tckpt.rotate(a.output_dir, a.save_total_limit or nil, st.best_model_checkpoint)) do
      print(fmt("[zrun] deleted older checkpoint %s (save_total_limit = %d)", p, a.save_total_limit))
    end
  end
  dist.barrier()
  self.control.should_save = false -- (transformers' CallbackHandler.on_save)
  self:callback("on_save")
end

-- Writes a Hugging Face model directory (config.json, model.safetensors in the training dtype,
-- generation_config.json, the tokenizer's files) to dir (default output_dir); collective. At ZeRO
-- stage 3 the weights are gathered when stage3_gather_16bit_weights_on_model_save is set;
-- otherwise dir gets the sharded engine checkpoint and the other files, and the message says how
-- to consolidate the weights into dir/model.safetensors. A model with a LoRA adapter (zr.peft) gets the
-- adapter's files instead (Trainer:save_adapter).
function Trainer:save_model(dir, o)
  self:setup()
  o = require("zrun.kwargs").check("Trainer:save_model", o, { "in_checkpoint" })
  dir = dir or self.args.output_dir
  if require("zrun.peft").is_peft_model(self.model) then return self:save_adapter(dir, o) end
  local e = self.engine
  local zc = e.config.zero_optimization or {}
  local gather = e.stage < 3 or zc.stage3_gather_16bit_weights_on_model_save
  if gather then e:save_16bit_model(dir)
  elseif not o.in_checkpoint then e:save_checkpoint(dir, "global_step" .. self:step_count()) end
  if self.is_main then
    local hf = require "zrun.hf"
    local cfg = {}
    for k, v in pairs(self.model.config or {}) do if k ~= "dtype" and k ~= "device" then cfg[k] = v end end
    cfg.architectures = cfg.architectures or { self.model.__name }
    cfg.torch_dtype = gather and ({ bf16 = "bfloat16", f16 = "float16" })[e.precision] or "float32"
    hf.save_config(dir, cfg)
    -- (the model's generation_config.json as from_pretrained read it, else the config's token ids)
    hf.save_generation_config(dir, rawget(self.model, "generation_config"), cfg)
    local files = self.processing_class and require("zrun.tokenizers").save_pretrained(self.processing_class, dir) or {}
    local also = "config.json, generation_config.json" .. (#files > 0 and ", " .. table.concat(files, ", ") or "")
    if not gather then
      print(fmt("[zrun] save_model: ZeRO stage 3 without zero_optimization.stage3_gather_16bit_weights_on_model_save: " ..
        "%s holds the sharded checkpoint and %s, not the weights; consolidate them with `zrun zero-to-fp32 %s " ..
        "%s/model.safetensors` (or set stage3_gather_16bit_weights_on_model_save: true)", dir, also, dir, dir))
    elseif not o.in_checkpoint then
      print(fmt("[zrun] saved the model to %s (model.safetensors, %s)", dir, also))
    end
  end
  dist.barrier()
  return gather and true or false
end

-- save_model of a model with a LoRA adapter (zr.peft), as transformers' Trainer saves a PEFT model: the
-- adapter (adapter_model.safetensors, adapter_config.json: zr.peft.save_pretrained) and the tokenizer's
-- files, not the frozen base. At ZeRO stage 3 the adapter is gathered for it (collective).
function Trainer:save_adapter(dir, o)
  local e, was = self.engine, {}
  if e.stage == 3 then
    for i = 1, #e.params do if not e.zero:is_gathered(i) then was[#was + 1] = i end end
    e:gather_parameters()
  end
  local ok, err = true, nil
  if self.is_main then
    ok, err = pcall(function()
      local files = require("zrun.peft").save_pretrained(self.model, dir)
      local tf = self.processing_class and require("zrun.tokenizers").save_pretrained(self.processing_class, dir) or {}
      for _, f in ipairs(tf) do files[#files + 1] = f end
      if not o.in_checkpoint then print(fmt("[zrun] saved the adapter to %s (%s)", dir, table.concat(files, ", "))) end
    end)
  end
  if #was > 0 then e.zero:release(was) end
  dist.barrier()
  if not ok then error(err, 0) end
  return true
end

-- The stateful callbacks' states as transformers' TrainerState keeps them: TrainerControl's flags and each
-- ExportableState callback's (EarlyStoppingCallback), taken as train() starts and at each checkpoint's save
-- (saving: should_save true, should_training_stop at the last step or once a callback stopped training), so
-- that save_state() writes the last checkpoint's, as transformers' does.
function Trainer:snapshot_callbacks(saving)
  local ctl, st = self.control, self.state
  local s = { TrainerControl = { attributes = {}, args = { should_save = saving or false,
    should_training_stop = saving and (ctl.should_training_stop or st.global_step >= (st.max_steps or huge)) or false,
    should_epoch_stop = saving and ctl.should_epoch_stop or false, should_evaluate = false, should_log = false } } }
  for _, cb in ipairs(self.callbacks) do if cb.name and cb.state then s[cb.name] = cb:state() end end
  self.callback_states = s
end

-- trainer_state.json's fields for a state at `step` (transformers' TrainerState.save_to_json): the
-- state, the process flags, and the stateful callbacks (ZrunTrainer's: what the data position after a
-- resume depends on; HF ignores a callback it does not know; the others Trainer:snapshot_callbacks's,
-- taken now when saving a checkpoint).
function Trainer:state_json(step, saving)
  local a, st = self.args, self.state
  local out = {}
  for k, v in pairs(st) do out[k] = v end
  out.is_hyper_param_search, out.is_local_process_zero, out.is_world_process_zero = false, true, true
  out.total_flos, out.num_input_tokens_seen = st.total_flos or 0, st.num_input_tokens_seen or 0
  out.stateful_callbacks = { ZrunTrainer = { attributes = {}, args = { world_size = dist.world_size(),
    per_device_train_batch_size = a.per_device_train_batch_size, gradient_accumulation_steps = a.gradient_accumulation_steps,
    data_seed = a.data_seed or a.seed, train_rows = self.train_dataset and #self.train_dataset.rows or 0, engine_tag = "global_step" .. step } } }
  if saving or not self.callback_states then self:snapshot_callbacks(saving) end
  for k, v in pairs(self.callback_states) do out.stateful_callbacks[k] = v end
  return out
end

-- An out-of-memory error gets the predicted plan and the cheapest settings that fit beside the
-- allocator's per-category breakdown (which the error already carries).
function Trainer:explain_oom(err, ids)
  err = tostring(err)
  if not err:find("out of memory", 1, true) then return err end
  local e = self.engine
  local ok, res = pcall(function()
    local gpu
    if e.device ~= "cpu" and zr._C.cuda then
      local sm = zr._C.cuda.memory_summary(0)
      gpu = sm and sm.device_total
    end
    local plan = require "zrun.memory_plan"
    local cfg = self.model.config
    local peft = require "zrun.peft"
    return plan.fit({ model = cfg, config = e.config, micro_batch = ids:size(1), seq_len = ids:size(2),
      world_size = e.world_size, gpu_memory = gpu or 0, gradient_checkpointing = self.args.gradient_checkpointing,
      loss_type = self.loss_type, chunked_loss = self.chunked_loss or nil, packed = ids:size(1) == 1 and self.packed_batches or nil,
      lora = peft.is_peft_model(self.model) and self.model.peft_config or nil })
  end)
  if ok and res and res.text then return err .. "\n\nzrun plan for this run, and settings that fit:\n" .. res.text end
  return err .. "\n\n(run `zrun plan MODEL --fit --gpu-memory SIZE` for settings that fit: " .. tostring(res) .. ")"
end

-- This rank's share of n evaluation rows in batches of bs, as accelerate shards transformers' evaluation loader
-- (datasets.deal_batches: batches dealt to the ranks in turn, the last round completed from the first rows, so
-- every rank runs as many forwards: stage 3 gathers in lockstep; drop_last: a shorter last batch, and then an
-- incomplete last round, dropped): the row indices, and per index whether it is a row of that round (false: a
-- repeat, which gather_for_metrics drops from the per-row losses).
local function eval_share(n, bs, W, rank, drop_last)
  local idx, real = {}, {}
  for i = 1, n do idx[i] = i end
  local mine = datasets.deal_batches(idx, bs, W, rank, drop_last)
  for k = 1, #mine do -- (with several ranks every batch has bs rows: the k-th row is in global batch b)
    local b = W == 1 and 0 or rank + floor((k - 1) / bs) * W
    real[k] = W == 1 or b * bs + (k - 1) % bs < n
  end
  return mine, real
end

-- Loss over every predicted token of the evaluation set (all ranks, each row once) and its
-- perplexity: the sum of per-token losses over the count of labels that are not -100 (after the
-- shift: a row's first label predicts nothing). Rows are read in order (train_sampling_strategy
-- "group_by_length": in transformers' LengthGroupedSampler order of per_device_eval_batch_size rows, shuffled
-- with data_seed or seed, as transformers 5.17 evaluates) and dealt as accelerate deals them (eval_share); a
-- repeated row counts nothing in the loss (its labels -100). dataloader_drop_last drops a last shorter batch (an
-- incomplete last round), as transformers' evaluation loader does.
function Trainer:evaluate(ds, prefix)
  if not self.engine then -- transformers' model_preparation_time: an evaluation before training prepares the model
    -- (here the engine); this and every later evaluation report how long that took, as <prefix>_model_preparation_time
    local t = C.now()
    self:setup()
    self.model_preparation_time = round(C.now() - t, 4)
  end
  ds = ds and as_datasets(ds) or self.eval_dataset
  prefix = prefix or "eval"
  if not ds then error("Trainer:evaluate: no eval_dataset (pass one to zr.Trainer{eval_dataset=} or to evaluate(ds))", 0) end
  if datasets.is_named(ds) then -- each by name, in name order, with the prefix <prefix>_<name>; the metrics merged
    local names, all, first = {}, {}, self.first_eval_metrics
    for name in pairs(ds) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
      for k, v in pairs(self:evaluate(ds[name], prefix .. "_" .. name)) do all[k] = v end
    end
    self.last_eval_metrics, self.first_eval_metrics = all, first or all
    return all
  end
  local e = self.engine
  local W, rank = dist.world_size(), dist.rank()
  local rows, bs = ds.rows, self.args.per_device_eval_batch_size
  if self.args.train_sampling_strategy == "group_by_length" then -- (transformers 5.17 evaluates in a
    -- LengthGroupedSampler's order too, of per_device_eval_batch_size rows, its shuffle seeded data_seed or seed)
    local col, len, by_len = self.args.length_column_name, {}, {}
    for i, r in ipairs(rows) do len[i] = type(r[col]) == "number" and r[col] or #r.input_ids end
    local perm = C.randperm_torch(#rows, self.args.data_seed or self.args.seed):flat_table()
    for k, i in ipairs(datasets.length_grouped_indices(len, bs, perm)) do by_len[k] = rows[i] end
    rows = by_len
  end
  -- label smoothing (or TRL's dft loss): the loss is the smoothed one (transformers evaluates through its
  -- LabelSmoother, TRL through its compute_loss_func too), the perplexity that of the plain cross-entropy over
  -- the same logits
  local fwd_opts = loss_options(self)
  local smoothed = fwd_opts and (fwd_opts.label_smoothing or fwd_opts.loss_type == "dft") -- (loss not the plain one)
  local drop = self.args.dataloader_drop_last -- (transformers' evaluation loader drops as its training loader does)
  local mine, real = eval_share(#rows, bs, W, rank, drop)
  if #mine == 0 and #rows > 0 then
    error(fmt("Trainer:evaluate: dataloader_drop_last = true drops all %d evaluation rows (fewer than " ..
      "per_device_eval_batch_size %d x %d ranks: transformers reports no %s_loss then); lower per_device_eval_batch_size",
      #rows, bs, W, prefix), 0)
  end
  -- TRL's eval_entropy / eval_mean_token_accuracy gather each rank's sums of a batch with gather_for_metrics, which
  -- in the last round keeps the first n mod (bs x ranks) ranks' (a rank's repeated rows counted): the others' are 0
  -- (nothing is cut where dataloader_drop_last drops that round)
  local cut = not drop and #rows % (bs * W) or 0
  local t0 = C.now()
  e:eval()
  local sum, count, nll = 0, 0, 0
  -- token_accuracy (zr.SFTTrainer sets it): TRL's eval_entropy and eval_mean_token_accuracy, each batch's
  -- (over the ranks) entropy and share of counted labels that are the argmax at the position before them,
  -- averaged over the batches (fold_tokens)
  local acc, tok_list, tok = self.token_accuracy and self.model.supports_token_stats, {}, { 0, 0, 0 }
  local bar = progress.new { total = ceil(#mine / bs), desc = prefix, leave = false }
  bar:run(zr.no_grad, function()
    for b = 1, #mine, bs do
      local batch_rows, padding, last = {}, {}, b + bs > #mine
      for k = b, math.min(b + bs - 1, #mine) do
        batch_rows[#batch_rows + 1] = rows[mine[k]]
        if not real[k] then padding[#padding + 1] = #batch_rows end
      end
      local as_read = acc and #padding > 0 and { unpack(batch_rows) } -- (the rows as read: the repeats lose their labels)
      for _, r in ipairs(padding) do -- (a row repeated to keep the ranks in step counts nothing: its labels
        -- -100 before collation, for a collator that flattens the batch into one row, and after, whatever the collator)
        local c = {}
        for k, v in pairs(batch_rows[r]) do c[k] = v end
        c.labels = {}
        for k = 1, #(c.input_ids or {}) do c.labels[k] = -100 end
        batch_rows[r] = c
      end
      local made = C.handle_serial()
      local batch = self.collator(batch_rows)
      check_batch(batch)
      -- (TRL's batch statistics count a repeated row, with its labels as they are)
      local stat = as_read and (cut == 0 or rank < cut) and self.collator(as_read)
      local ids, labels = batch.input_ids, batch.labels
      local scope = C.handle_serial() -- (this loop's own temporaries: freed as soon as read)
      if labels:size(1) == #batch_rows then
        for _, r in ipairs(padding) do labels:narrow(1, r, 1):fill_(-100) end
      end
      C.release_since(scope)
      local fb, map = self:unpadded(batch) -- (the padding-free batch of a padded one's rows, or nil)
      if fb then ids, labels = fb.input_ids, fb.labels end
      local stat_host = stat and (fb and map(stat.labels) or stat.labels)
      local stat_labels = stat_host and e.device ~= "cpu" and stat_host:to(e.device) or stat_host
      scope = C.handle_serial()
      local n = labels:narrow(2, 2, labels:size(2) - 1):ne(-100):to("f64"):sum():item() -- (on the CPU)
      C.release_since(scope)
      local hlabels = labels -- (the chunked loss reads them on the host)
      if e.device ~= "cpu" then ids, labels = ids:to(e.device), labels:to(e.device) end
      -- (the chunked loss makes the statistics of the counted rows only: a round completed from the first rows, whose
      -- statistics count the repeated rows' labels as read, runs with the logits)
      local o = fwd_opts
      if stat_labels and acc and o and o.chunked_loss then
        o = {}
        for k, v in pairs(fwd_opts) do if k ~= "chunked_loss" then o[k] = v end end
      end
      local out = e(ids, o and o.chunked_loss and hlabels or labels, forward_options(o, fb or batch, acc))
      if acc then -- (every batch: the ranks' sums)
        local sums = token_sums(out, stat_labels or labels)
        if last and cut > 0 and rank >= cut then sums:zero_() end
        tok_list[#tok_list + 1] = sums
        if #tok_list >= 256 then fold_tokens(tok_list, tok) end
      end
      if n > 0 then
        scope = C.handle_serial()
        sum, count = sum + out.loss:item() * n, count + n
        if smoothed then nll = nll + require("zrun.models.llama").causal_lm_loss(out.logits, labels):item() * n end
        C.release_since(scope)
      end
      -- a forward's tensors are garbage once its loss is read; Lua does not see their memory, so the next
      -- batches (and, after the evaluation, the next training forward) would run beside them. Free them now
      -- (the full-vocabulary logits included; the models free their own temporaries when their forward
      -- returns): a full collection walks the whole Lua heap, the datasets' rows included (with 50k chat rows,
      -- ~190 ms a batch). What is left (a model of the user's) is collected when it is worth it.
      C.release_made_since(made, out.loss, rawget(out, "logits"), ids, labels, batch.input_ids, batch.labels,
        batch.attention_mask, batch.position_ids, stat_labels, stat and stat.input_ids, stat and stat.labels,
        stat and stat.attention_mask, stat and stat.position_ids, fb and fb.input_ids, fb and fb.labels, fb and fb.position_ids,
        stat_host)
      out = nil
      C.collect_tensor_garbage(e.device)
      bar:update(1)
    end
  end)
  e:train()
  local t = zr.tensor({ sum, count, nll }, { dtype = "f64" })
  dist.all_reduce(t, "sum")
  if acc then fold_tokens(tok_list, tok) end -- (every rank evaluates as many batches)
  local ent, accuracy = token_means(tok)
  local tot, cnt = t[1], t[2]
  if cnt == 0 then error(fmt("Trainer:evaluate: the %d evaluation rows have no label to predict (all -100)", #rows), 0) end
  local loss = tot / cnt
  local rt = C.now() - t0
  local ppl = math.exp(smoothed and t[3] / cnt or loss)
  -- (transformers' speed_metrics: rows and batches of per_device_eval_batch_size x ranks over the runtime)
  local metrics = speed_metrics({ [prefix .. "_loss"] = loss, [prefix .. "_perplexity"] = ppl, [prefix .. "_tokens"] = cnt,
    epoch = self.state.epoch, [prefix .. "_mean_token_accuracy"] = accuracy,
    [prefix .. "_model_preparation_time"] = self.model_preparation_time,
    [prefix .. "_entropy"] = ent,
    [prefix .. "_num_tokens"] = self.log_num_tokens and (self.num_tokens or 0) or nil }, -- (TRL: the training total)
    prefix, rt, #rows, ceil(#rows / (bs * W)))
  dist.print0(fmt("[zrun] %s at step %d: loss %.4f%s | perplexity %.3f%s%s | %d tokens", prefix, self:step_count(), loss,
    smoothed and (fwd_opts.loss_type == "dft" and " (dft)" or fmt(" (label smoothing %g)", fwd_opts.label_smoothing)) or "",
    ppl, smoothed and (fwd_opts.loss_type == "dft" and " (of the cross-entropy)" or " (unsmoothed)") or "",
    accuracy and fmt(" | mean token accuracy %.4f", accuracy) or "", cnt))
  -- (the log record has the step, as transformers' log_history; the metrics returned, saved by save_metrics and given
  -- to on_evaluate do not, but num_input_tokens_seen, which transformers' log() adds to them)
  local rec = { step = self:step_count() }
  for k, v in pairs(metrics) do rec[k] = v end
  self:log(rec)
  metrics.num_input_tokens_seen = rec.num_input_tokens_seen
  self.last_eval, self.last_eval_metrics = self:step_count(), metrics
  self.first_eval_metrics = self.first_eval_metrics or metrics
  self.control.should_evaluate = false -- (transformers' CallbackHandler.on_evaluate)
  self:callback("on_evaluate", metrics)
  return metrics
end

return Trainer
