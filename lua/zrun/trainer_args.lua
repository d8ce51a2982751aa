-- The Trainer's arguments: Hugging Face TrainingArguments' names, defaults and checks. Every key
-- is either implemented, listed as having no effect here (a warning naming it), or refused with
-- one line naming it; nothing is silently ignored. Not here: the training loop (trainer.lua).
local config = require "zrun.config"

local M = {}
local fmt, concat, sort, floor, ceil, huge = string.format, table.concat, table.sort, math.floor, math.ceil, math.huge

-- Implemented keys and TrainingArguments' defaults (nil: no default; false where HF has False).
-- The ones the DeepSpeed config's "auto" values read live in config.ARG_DEFAULTS (one home).
M.DEFAULTS = {
  output_dir = "trainer_output", per_device_eval_batch_size = 8, lr_scheduler_type = "linear", lr_scheduler_kwargs = false,
  accelerator_config = false,
  optim = "adamw_torch", optim_args = false,
  logging_strategy = "steps", logging_steps = 500, logging_first_step = false, logging_nan_inf_filter = true,
  save_strategy = "steps", save_steps = 500, save_total_limit = false,
  eval_strategy = "no", eval_steps = false,
  metric_for_best_model = false, greater_is_better = false, load_best_model_at_end = false,
  resume_from_checkpoint = false, eval_on_start = false, save_only_model = false, neftune_noise_alpha = false, include_num_input_tokens_seen = "no",
  seed = 42, data_seed = false, bf16 = false, fp16 = false, gradient_checkpointing = false, deepspeed = false,
  label_smoothing_factor = 0, average_tokens_across_devices = true, train_sampling_strategy = "random",
  length_column_name = "length", auto_find_batch_size = false, dataloader_drop_last = false,
  ddp_timeout = false, -- (false: ZRUN_COMM_TIMEOUT / DEEPSPEED_TIMEOUT, else 1800 s, transformers' default too)
  torch_empty_cache_steps = false,
  report_to = "none", logging_dir = false, -- (TensorBoard: zrun.trainer_callbacks.TensorBoardCallback)
  eval_delay = 0, restore_callback_states_from_checkpoint = false,
  use_liger_kernel = false, liger_kernel_config = false, -- (M.liger: the chunked LM head + loss; zrun's kernels otherwise)
}

for k, v in pairs(config.ARG_DEFAULTS) do M.DEFAULTS[k] = v end

-- Keys that change nothing in zrun (logging integrations, worker processes): accepted with a warning.
M.NO_EFFECT = {
  run_name = "used only by reporting integrations", disable_tqdm = "zrun prints one line per logging step",
  dataloader_num_workers = "batches are built in-process",
  dataloader_pin_memory = "batches are built in-process", dataloader_persistent_workers = "batches are built in-process",
  dataloader_prefetch_factor = "batches are built in-process",
  remove_unused_columns = "the collator reads input_ids/labels only",
  overwrite_output_dir = "checkpoints are written to new checkpoint-<step> folders", do_train = "a script flag",
  do_eval = "a script flag", save_safetensors = "zrun always writes safetensors",
  gradient_checkpointing_kwargs = "zr.checkpoint recomputes each layer in backward; there is no reentrant variant",
  log_level = "zrun prints its own lines on rank 0", log_level_replica = "zrun prints its own lines on rank 0",
  ddp_find_unused_parameters = "there is no DDP wrapper: the ZeRO engine reduces every gradient",
  ddp_bucket_cap_mb = "there is no DDP wrapper: the config's reduce_bucket_size sizes the buckets",
  ddp_backend = "zrun joins its ranks itself: NCCL between GPUs, MPI (under mpirun) or TCP (torchrun's variables) between " ..
    "CPU ranks", ddp_broadcast_buffers = "there is no DDP wrapper: every rank builds the same buffers",
  push_to_hub = "zrun does not upload", hub_model_id = "zrun does not upload", hub_strategy = "zrun does not upload",
  hub_private_repo = "zrun does not upload",
  prediction_loss_only = "zrun's evaluation computes the loss only (there is no compute_metrics)",
  eval_accumulation_steps = "zrun's evaluation keeps no predictions to move off the device",
  ignore_data_skip = "a resumed run skips the data already trained on, as ignore_data_skip = false does",
  torch_compile = "zrun's kernels are fused natively; there is nothing to compile",
  torch_compile_backend = "zrun's kernels are fused natively; there is nothing to compile",
  torch_compile_mode = "zrun's kernels are fused natively; there is nothing to compile",
  tf32 = "zrun's f32 products run in full f32 (bf16/fp16 training runs its products in 16 bits)",
  save_on_each_node = "rank 0 writes the model and trainer files, every rank its own shards, as with DeepSpeed",
  use_cpu = "the model's device decides where it trains",
  skip_memory_metrics = "each log line has the memory in use and its peak (memory, peak_memory in metrics.jsonl)",
}
-- Values of those keys that would change training, and what to do instead
M.REFUSED_VALUES = {
  save_safetensors = { [false] = "save_safetensors = false: zrun writes safetensors only" },
  push_to_hub = { [true] = "push_to_hub = true: zrun does not upload; run `huggingface-cli upload REPO OUTPUT_DIR` after training" },
  ignore_data_skip = { [true] = "ignore_data_skip = true: a resumed run always continues at the data position it " ..
    "stopped at (remove the argument)" },
  save_on_each_node = { [true] = "save_on_each_node = true: rank 0 alone writes the model and trainer files; give " ..
    "the nodes a shared output_dir" },
  use_cpu = { [true] = "use_cpu = true: the Trainer trains the model where it is; load it on the CPU (device = \"cpu\")" },
  skip_memory_metrics = { [false] = "skip_memory_metrics = false: transformers' memory metrics are not reported; each " ..
    "log line has memory and peak_memory instead" },
}

-- The keys transformers declares bool (HfArgumentParser reads their values with string_to_bool: true/false,
-- yes/no, 1/0; a bare --key is true, --no_key false): the command line reads them so (zrun.argparse).
M.BOOLEAN = {}
for k in ([[auto_find_batch_size average_tokens_across_devices bf16 bf16_full_eval dataloader_drop_last
  dataloader_persistent_workers dataloader_pin_memory ddp_find_unused_parameters disable_tqdm do_eval do_train
  eval_on_start fp16 fp16_full_eval gradient_checkpointing greater_is_better hub_private_repo ignore_data_skip
  load_best_model_at_end logging_first_step logging_nan_inf_filter overwrite_output_dir prediction_loss_only push_to_hub
  remove_unused_columns restore_callback_states_from_checkpoint save_on_each_node save_only_model save_safetensors
  skip_memory_metrics tf32 torch_compile use_cpu use_liger_kernel]]):gmatch("%S+") do M.BOOLEAN[k] = true end

-- Keys typed `str | bool` in TrainingArguments, which HfArgumentParser reads as bool: alone on the command line
-- they are true (include_num_input_tokens_seen: "all"); zrun also takes their words ("non_padding").
M.BARE_TRUE = { include_num_input_tokens_seen = true }

M.RENAMED = { evaluation_strategy = "eval_strategy" }
-- Keys transformers 5 removed in favour of a value of another key: what to write instead
M.REPLACED = { group_by_length = 'train_sampling_strategy = "group_by_length"' }

local STRATEGIES = { no = true, steps = true, epoch = true }

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  sort(out)
  return out
end

local function bad(msg, ...) error("TrainingArguments: " .. fmt(msg, ...), 0) end

-- report_to (a name, a list of names, "all" or "none") as the list of integrations to run: zrun has
-- TensorBoard's ("all" is the ones installed: TensorBoard here); another is refused with what to do.
function M.report_to(v)
  local list = type(v) == "table" and v or { v }
  local out = {}
  for _, name in ipairs(list) do
    if name == "tensorboard" or name == "all" then out[1] = "tensorboard"
    elseif name ~= "none" and name ~= nil then
      if type(name) ~= "string" then bad("report_to must be a name or a list of names, got %s", config.show(name)) end
      bad("report_to = %s: zrun's Trainer reports to TensorBoard only (report_to = \"tensorboard\": event files in " ..
        "logging_dir, which trackers such as wandb, mlflow or comet import) besides output_dir/metrics.jsonl", config.show(name))
    end
  end
  return out
end

local function check_int(a, k, min)
  local v = a[k]
  if type(v) ~= "number" or v ~= floor(v) or v < min then
    bad("%s must be an integer >= %d, got %s", k, min, tostring(v))
  end
end

-- A *_steps value below 1 is a fraction of the total steps (HF's rule), at least 1.
function M.interval(v, total)
  if v < 1 then return math.max(1, ceil(v * total)) end
  return floor(v)
end

-- transformers' AcceleratorConfig (accelerate's data loading across ranks), its fields' defaults, and what zrun
-- does: each rank reads its own per_device batches (split_batches false, dispatch_batches none), the evaluation's
-- last round completed from the first rows (even_batches true), transformers' seeded sampler order
-- (use_seedable_sampler true); non_blocking (asynchronous host -> device copies) changes no result.
local ACCELERATOR = { split_batches = false, dispatch_batches = false, even_batches = true, use_seedable_sampler = true,
  non_blocking = "any", gradient_accumulation_kwargs = false, use_configured_state = false }

-- accelerator_config (a table, or the command line's JSON object / JSON file, as TrainingArguments reads it): the
-- defaults accepted, non_blocking either way; a value zrun does not run refused, an unknown field refused as
-- AcceleratorConfig refuses it.
function M.check_accelerator_config(a, quiet)
  local v = a.accelerator_config
  if v == false or v == nil then return end
  if type(v) == "string" then
    local text = v
    if not v:match("^%s*{") then
      local f = io.open(v, "rb")
      if not f then bad("accelerator_config must be a JSON object or a JSON file, got %s (no such file)", v) end
      text = f:read("*a")
      f:close()
    end
    local ok, t = pcall(require("cjson").decode, text)
    if not ok or type(t) ~= "table" then bad("accelerator_config must be a JSON object like '{\"even_batches\": true}', got %s", v) end
    v = t
  end
  if type(v) ~= "table" then bad("accelerator_config must be a table of AcceleratorConfig's fields, got %s", config.show(v)) end
  for _, k in ipairs(sorted_keys(v)) do
    local want, got = ACCELERATOR[k], v[k]
    if want == nil then
      bad("accelerator_config: unexpected field '%s' (AcceleratorConfig's fields: %s)", tostring(k),
        concat(sorted_keys(ACCELERATOR), ", "))
    end
    if got == require("cjson").null then got = false end -- (JSON null: None)
    if want == "any" then
      if type(got) ~= "boolean" then bad("accelerator_config.%s must be true or false, got %s", k, config.show(got)) end
      if got and not quiet then -- (said, as NO_EFFECT's keys are)
        require("zrun.dist").print0(fmt("[zrun] Trainer: accelerator_config.%s has no effect in zrun (its host -> device " ..
          "copies are ordered on the device's stream already)", k))
      end
    elseif got ~= want then
      bad("accelerator_config.%s = %s is not what zrun runs (%s: each rank reads its own per-device batches in " ..
        "transformers' seeded order, the evaluation's last round completed); leave it out", k, config.show(got),
        want == false and "false / None" or config.show(want))
    end
  end
  a.accelerator_config = v
end

-- Liger Kernel's options (_apply_liger_kernel_to_instance's keyword arguments, transformers' liger_kernel_config) and
-- what each is in zrun: its fused linear cross-entropy is zrun's chunked LM head + loss (the models' chunked_loss:
-- no full logits; Liger's default, on); the others swap in fused kernels zrun always runs.
local LIGER = { fused_linear_cross_entropy = true, cross_entropy = true, rope = true, rms_norm = true, swiglu = true,
  geglu = true, layer_norm = true }

-- use_liger_kernel / liger_kernel_config (a table, or the command line's JSON object) -> whether the models' forward
-- takes chunked_loss. Unknown keys and non-booleans are refused (as Liger's functions refuse unknown arguments), the
-- kernel switches said to change nothing, and a config without use_liger_kernel said to be unused (transformers
-- applies it only with the flag).
function M.liger(a, quiet)
  local v = a.liger_kernel_config
  if v == false or v == nil or v == require("cjson").null then v = nil end
  if type(v) == "string" then
    local ok, t = pcall(require("cjson").decode, v)
    if not ok or type(t) ~= "table" then bad("liger_kernel_config must be a JSON object like " ..
      "'{\"fused_linear_cross_entropy\": true}', got %s", v) end
    v = t
  end
  if v ~= nil and type(v) ~= "table" then bad("liger_kernel_config must be a table of Liger's options, got %s", config.show(v)) end
  local say = not quiet and require("zrun.dist").print0 or function() end
  for _, k in ipairs(sorted_keys(v or {})) do
    if not LIGER[k] then
      bad("liger_kernel_config: unexpected option '%s' (Liger's: %s)", tostring(k), concat(sorted_keys(LIGER), ", "))
    end
    if type(v[k]) ~= "boolean" then bad("liger_kernel_config.%s must be true or false, got %s", k, config.show(v[k])) end
  end
  local flce = not v or v.fused_linear_cross_entropy ~= false
  if v and v.cross_entropy and flce then
    bad("liger_kernel_config: cross_entropy and fused_linear_cross_entropy cannot both be true (Liger refuses it " ..
      "too); set fused_linear_cross_entropy = false to keep the logits")
  end
  if v and not a.use_liger_kernel then
    say("[zrun] Trainer: liger_kernel_config has no effect without use_liger_kernel = true (as in transformers)")
    return false
  end
  if not a.use_liger_kernel then return false end
  for _, k in ipairs(sorted_keys(v or {})) do
    if k ~= "fused_linear_cross_entropy" then
      say(fmt("[zrun] Trainer: liger_kernel_config.%s has no effect in zrun (its %s kernel is fused always)", k,
        k == "cross_entropy" and "cross-entropy" or k))
    end
  end
  return flce
end

-- Returns the arguments with defaults filled, after checking every key and value. `given` keeps
-- only what the caller set (the DeepSpeed config compares those with its own values). quiet: no
-- warnings (a script checking its arguments early, before the Trainer checks them again).
function M.resolve(user, quiet)
  user = user or {}
  if type(user) ~= "table" then bad("expected a table of arguments, got %s", type(user)) end
  local a, given = {}, {}
  for k, v in pairs(M.DEFAULTS) do a[k] = v end
  local known = sorted_keys(M.DEFAULTS)
  for _, k in ipairs(sorted_keys(user)) do
    local v = user[k]
    if type(k) ~= "string" then bad("argument names are strings, got %s", tostring(k)) end
    if M.RENAMED[k] then
      bad("'%s' was renamed '%s' in transformers; use %s = %s", k, M.RENAMED[k], M.RENAMED[k], tostring(v))
    elseif M.REPLACED[k] then
      bad("'%s' was removed in transformers 5; use %s", k, M.REPLACED[k])
    elseif M.NO_EFFECT[k] then
      local refused = M.REFUSED_VALUES[k] and M.REFUSED_VALUES[k][v]
      if refused then bad("%s", refused) end
      if not quiet then require("zrun.dist").print0(fmt("[zrun] Trainer: %s has no effect in zrun (%s)", k, M.NO_EFFECT[k])) end
    elseif M.DEFAULTS[k] == nil then
      local s = config.suggest(k, known)
      bad("'%s' is not supported by zrun's Trainer%s (supported: %s)", k, s and fmt("; did you mean '%s'?", s) or "",
        concat(known, ", "))
    else
      a[k], given[k] = v, v
    end
  end
  -- (an empty one is a shell variable left unset: checkpoint-<step> would land in the file system's root)
  if a.output_dir == "" or (a.output_dir and type(a.output_dir) ~= "string") then
    bad("output_dir must name a folder, got %s (output_dir=$VAR with VAR unset?)", a.output_dir == "" and "an empty string" or
      config.show(a.output_dir))
  end
  for _, k in ipairs { "logging_strategy", "eval_strategy" } do
    if not STRATEGIES[a[k]] then bad("%s must be \"no\", \"steps\" or \"epoch\", got %s", k, config.show(a[k])) end
  end
  if not STRATEGIES[a.save_strategy] and a.save_strategy ~= "best" then -- "best": at each new best evaluation
    bad("save_strategy must be \"no\", \"steps\", \"epoch\" or \"best\", got %s", config.show(a.save_strategy))
  end
  local na = a.neftune_noise_alpha
  if na ~= false and (type(na) ~= "number" or na <= 0) then
    bad("neftune_noise_alpha must be a positive number (NEFTune's alpha, e.g. 5), got %s", config.show(na))
  end
  -- the optimizer's and the schedule's numbers (transformers refuses a negative warmup_steps, torch's optimizers
  -- a negative lr or weight_decay and betas outside [0, 1); a string or a boolean stopped zrun later with a Lua error)
  local function num(k, lo, hi, hi_open, what)
    local v = a[k]
    if type(v) ~= "number" or v ~= v or v < lo or (hi and (v > hi or (hi_open and v == hi))) then
      bad("%s must be %s, got %s", k, what, config.show(v))
    end
  end
  num("learning_rate", 0, nil, false, "a number >= 0")
  num("weight_decay", 0, nil, false, "a number >= 0")
  num("adam_beta1", 0, 1, true, "a number in [0, 1)")
  num("adam_beta2", 0, 1, true, "a number in [0, 1)")
  num("adam_epsilon", 0, nil, false, "a number >= 0")
  num("warmup_steps", 0, nil, false, "a number >= 0 (steps, or a fraction < 1 of the total steps)")
  num("warmup_ratio", 0, 1, false, "a number in [0, 1] (a fraction of the total steps; transformers 5 reads " ..
    "warmup_steps < 1 so)")
  if a.max_grad_norm ~= false then num("max_grad_norm", -huge, nil, false, "a number (0 or less: no clipping) or false") end
  local _, oerr = require("zrun.config_auto").optimizer_from_args(a)
  if oerr then bad("%s", oerr) end
  local kw = a.lr_scheduler_kwargs
  if type(kw) == "string" then -- the command line's JSON object, as TrainingArguments reads it
    local ok, t = pcall(require("cjson").decode, kw)
    if not ok or type(t) ~= "table" then bad("lr_scheduler_kwargs must be a JSON object like '{\"min_lr\": 1e-6}', got %s", kw) end
    a.lr_scheduler_kwargs, kw = t, t
  end
  local ok, err = pcall(require("zrun.schedulers_hf").check, a.lr_scheduler_type, kw or nil, a.learning_rate)
  if not ok then bad("%s", err) end
  if kw and require("zrun.schedulers_hf").ignores_kwargs(a.lr_scheduler_type) and not quiet then
    require("zrun.dist").print0(fmt("[zrun] Trainer: lr_scheduler_kwargs has no effect on lr_scheduler_type %s " ..
      "(transformers drops them too)", a.lr_scheduler_type))
  end
  M.check_accelerator_config(a, quiet)
  M.liger(a, quiet)
  for _, k in ipairs { "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps" } do
    check_int(a, k, 1)
  end
  local nits = a.include_num_input_tokens_seen -- true/false are "all"/"no", as TrainingArguments maps them
  if type(nits) == "boolean" then a.include_num_input_tokens_seen = nits and "all" or "no" end
  if not ({ all = true, non_padding = true, no = true })[a.include_num_input_tokens_seen] then
    bad('include_num_input_tokens_seen must be "all", "non_padding", "no", true or false, got %s', config.show(nits))
  end
  local ls = a.label_smoothing_factor
  if type(ls) ~= "number" or ls < 0 or ls >= 1 then
    bad("label_smoothing_factor must be a number in [0, 1) (e.g. 0.1), got %s", config.show(ls))
  end
  local tss = a.train_sampling_strategy
  if tss == "batch_rebalance" then
    bad("train_sampling_strategy = \"batch_rebalance\" makes micro-batches of varying row counts, which zrun's " ..
      "Trainer does not run; use \"group_by_length\" (rows of similar length together, less padding)")
  elseif not ({ random = true, sequential = true, group_by_length = true })[tss] then
    bad("train_sampling_strategy must be \"random\", \"sequential\" or \"group_by_length\", got %s", config.show(tss))
  end
  if type(a.length_column_name) ~= "string" then
    bad("length_column_name must be a column name, got %s", config.show(a.length_column_name))
  end
  if given.length_column_name and tss ~= "group_by_length" then -- (transformers ignores it there too)
    bad("length_column_name is read by train_sampling_strategy = \"group_by_length\" only; got %s: set that " ..
      "strategy or drop length_column_name", config.show(tss))
  end
  for _, k in ipairs { "logging_nan_inf_filter", "eval_on_start", "save_only_model", "average_tokens_across_devices",
    "auto_find_batch_size", "dataloader_drop_last", "bf16_full_eval", "fp16_full_eval" } do
    if type(a[k]) ~= "boolean" then bad("%s must be true or false, got %s", k, config.show(a[k])) end
  end
  if a.torch_empty_cache_steps then check_int(a, "torch_empty_cache_steps", 1) end
  a.report_to = M.report_to(a.report_to)
  if a.logging_dir and type(a.logging_dir) ~= "string" then bad("logging_dir must be a directory path, got %s", config.show(a.logging_dir)) end
  if given.logging_dir and #a.report_to == 0 and not quiet then
    require("zrun.dist").print0("[zrun] Trainer: logging_dir not used: report_to is \"none\" (transformers 5's default); " ..
      "report_to = \"tensorboard\" writes its event files there")
  end
  if a.ddp_timeout then check_int(a, "ddp_timeout", 1) end
  if type(a.eval_delay) ~= "number" or a.eval_delay < 0 then
    bad("eval_delay must be a number >= 0 (steps, or epochs with eval_strategy \"epoch\"), got %s", config.show(a.eval_delay))
  end -- (seconds every collective may take; the Trainer sets it)
  check_int(a, "seed", 0)
  if a.data_seed then check_int(a, "data_seed", 0) end
  if a.save_total_limit then check_int(a, "save_total_limit", 1) end
  for _, k in ipairs { "logging_steps", "save_steps", "eval_steps" } do
    local v = a[k]
    if v and (type(v) ~= "number" or v <= 0 or (v > 1 and v ~= floor(v))) then
      bad("%s must be a positive integer (or a fraction < 1 of the total steps), got %s", k, tostring(v))
    end
  end
  if type(a.max_steps) ~= "number" or a.max_steps ~= floor(a.max_steps) then
    bad("max_steps must be an integer (-1: use num_train_epochs), got %s", tostring(a.max_steps))
  end
  if type(a.num_train_epochs) ~= "number" or a.num_train_epochs <= 0 then
    bad("num_train_epochs must be a positive number, got %s", tostring(a.num_train_epochs))
  end
  if a.eval_strategy == "steps" and not a.eval_steps then a.eval_steps = a.logging_steps end -- HF's rule
  if a.load_best_model_at_end and a.save_only_model == true then -- (checked as a boolean below)
    bad("save_only_model = true cannot be used with load_best_model_at_end (transformers refuses it with DeepSpeed " ..
      "too): the best checkpoint would hold no optimizer state to go on from")
  end
  if a.load_best_model_at_end then -- HF's checks and its default metric
    if a.eval_strategy ~= a.save_strategy and a.save_strategy ~= "best" then
      bad("load_best_model_at_end needs save_strategy and eval_strategy to match, got %s and %s",
        config.show(a.save_strategy), config.show(a.eval_strategy))
    end
    local ss, es = a.save_steps, a.eval_steps
    if a.save_strategy == "steps" and es and ss % es ~= 0 then -- (transformers' rule, fractions of the total included)
      if (ss < 1) ~= (es < 1) then
        bad("load_best_model_at_end needs save_steps to be a multiple of eval_steps, which a fraction of the total " ..
          "steps beside a number of steps cannot guarantee: got %s and %s", tostring(ss), tostring(es))
      elseif ss >= 1 or (ss * 1e6) % (es * 1e6) ~= 0 then -- (two fractions: compared in millionths, as transformers
        -- does, so that 0.3 is a multiple of 0.1)
        bad("load_best_model_at_end needs save_steps to be a multiple of eval_steps, got %s and %s", tostring(ss),
          tostring(es))
      end
    end
    if not a.metric_for_best_model then a.metric_for_best_model = "loss" end
  end
  if a.save_strategy == "best" and not a.metric_for_best_model then
    bad("save_strategy = \"best\" needs metric_for_best_model (e.g. \"loss\"), as transformers requires")
  end
  if a.metric_for_best_model then
    local m = a.metric_for_best_model
    if type(m) ~= "string" then bad("metric_for_best_model must be a metric name like \"loss\", got %s", tostring(m)) end
    if m:sub(1, 5) ~= "eval_" then a.metric_for_best_model = "eval_" .. m end
    -- what Trainer:evaluate reports (there is no compute_metrics), as eval_<metric> or, for an eval_dataset of
    -- named datasets, eval_<name>_<metric>
    local known = { "loss", "perplexity", "tokens", "runtime", "samples_per_second", "steps_per_second", "mean_token_accuracy" }
    local base, ok = a.metric_for_best_model:sub(6), false
    for _, k in ipairs(known) do ok = ok or base == k or base:sub(-#k - 1) == "_" .. k end
    if not ok then
      bad("metric_for_best_model = %s: the evaluation reports loss, perplexity, tokens, runtime, samples_per_second, " ..
        "steps_per_second and (SFTTrainer) mean_token_accuracy, as eval_<metric> or eval_<name>_<metric> for named eval " ..
        "datasets (there is no compute_metrics)", config.show(m))
    end
    if given.greater_is_better == nil then a.greater_is_better = not m:match("loss$") end
    if a.eval_strategy == "no" then bad("metric_for_best_model = %s needs evaluation: set eval_strategy", config.show(m)) end
  end
  return a, given
end

return M
