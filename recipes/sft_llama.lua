-- Supervised fine-tuning of a Llama on chat or instruction data with a DeepSpeed config: TRL's sft.py
-- (SFTTrainer: the chat template, the loss on completions / assistant turns) in Lua.
--   zrun recipes/sft_llama.lua                       # no model on disk: the built-in tiny Llama, a built-in chat set
--   zrun recipes/sft_llama.lua model=DIR data=FILE.jsonl [--config FILE] [any SFTConfig / TrainingArguments key=value]
--   zrun recipes/sft_llama.lua ... use_peft=true [lora_r=16 lora_alpha=32 lora_target_modules=all-linear]  # LoRA
-- data: JSON lines of one dataset type (zr.sft): {"messages": [{"role": ..., "content": ...}, ...]},
-- {"prompt": ..., "completion": ...} (strings or message lists), {"text": ...} or ShareGPT
-- {"conversations": [{"from": ..., "value": ...}]}; the first validation_split_percentage % of the rows
-- evaluate. Chat rows use the tokenizer's chat template (chat_template_path= another one).
local zr = require "zrun"
local dist = zr.dist
local R = require "zrun.recipe"

local cli = require("zrun.argparse").new("recipes/sft_llama.lua",
  "Supervised fine-tuning on chat / instruction rows (TRL's SFTTrainer + DeepSpeed).")
cli:option("model", "meta-llama/Llama-3.2-1B-Instruct", "a Hugging Face model directory or a hub id in the local cache")
cli:option("tokenizer", false, "a directory or tokenizer.json (default: the model's own)")
cli:option("data", false, "a .jsonl (or .json list, or .csv) file of chat / instruction rows (default: a built-in set for the tiny model)")
cli:alias("model_name_or_path", "model"):alias("tokenizer_name", "tokenizer"):alias("dataset_name", "data") -- (TRL's sft.py names)
cli:option("validation_split_percentage", 5, "share of the rows that evaluate")
R.deepspeed_options(cli)
-- TRL's ModelConfig (trl sft --use_peft ...): a LoRA adapter trained instead of the whole model (zr.peft)
cli:flag("use_peft", false, "train a LoRA adapter (PEFT's LoraConfig from the lora_* options) instead of the model")
cli:option("lora_r", 16, "LoRA rank (TRL's default 16)")
cli:option("lora_alpha", 32, "LoRA alpha: the adapter's scaling is lora_alpha / lora_r (TRL's default 32)")
cli:option("lora_dropout", 0.05, "dropout on the adapter's input (TRL's default 0.05)")
cli:option("lora_target_modules", false, "comma-separated module names, or all-linear (default: PEFT's for the model: q_proj,v_proj)")
cli:option("lora_task_type", "CAUSAL_LM", "PEFT's task_type")
cli:flag("use_rslora", false, "rank-stabilized LoRA: scaling lora_alpha / sqrt(lora_r)")
cli:flag("use_dora", false, "DoRA (refused: not implemented)")
cli:option("lora_modules_to_save", false, "modules trained whole beside the adapter (refused: not implemented)")
cli:option("dump_blocks", false, "FILE.safetensors: the prepared rows (input_ids, labels) and the order training reads them")
-- TrainingArguments and SFTConfig's keys (max_length, assistant_only_loss, completion_only_loss, ...)
local args = {
  output_dir = "output/sft_llama", per_device_train_batch_size = 4, per_device_eval_batch_size = 4,
  gradient_accumulation_steps = 8, learning_rate = 2e-5, warmup_ratio = 0.03, num_train_epochs = 1, logging_steps = 10,
  eval_strategy = "steps", eval_steps = 50, save_strategy = "steps", save_steps = 500, save_total_limit = 2,
}
local sft_keys = {}
for k in pairs(zr.sft.DEFAULTS) do sft_keys[#sft_keys + 1] = k end
for k in pairs(zr.sft.NO_EFFECT) do sft_keys[#sft_keys + 1] = k end
table.sort(sft_keys)
-- SFTConfig's bool fields (--packing False, --no_packing; a bare --completion_only_loss is true there too: HfArgumentParser
-- gives bool | None fields nargs "?" and const True)
local sft_bool = { activation_offloading = true, assistant_only_loss = true, completion_only_loss = true, eval_packing = true,
  packing = true, padding_free = true, shuffle_dataset = true, trust_remote_code = true }
for _, k in ipairs(sft_keys) do
  cli[sft_bool[k] and "flag" or "option"](cli, k, false, zr.sft.NO_EFFECT[k] and ("SFTConfig's %s: no effect in zrun"):format(k) or
    ("SFTConfig's %s (default %s)"):format(k, tostring(zr.sft.DEFAULTS[k])))
end
local opt, given = cli:training_arguments(args):parse(arg)
for _, k in ipairs(sft_keys) do if given[k] then args[k] = opt[k] end end

local home = ZRUN_HOME or "."
opt.config = R.config_path(opt.config, given)
local device = R.device(opt.device)
if opt.data and not zr._C.path_type(opt.data) then -- (before the model loads; a hub id is TRL's --dataset_name)
  error(("sft_llama: data: %s is not a file or folder here: zrun reads local .jsonl, .json or .csv rows and downloads nothing; for a hub " ..
    "dataset, write it once with Python's datasets: load_dataset(%q, split=\"train\").to_json(\"rows.jsonl\"), then " ..
    "data=rows.jsonl"):format(opt.data, opt.data), 0)
end
local function say(fmt, ...) dist.print0(("[sft_llama] " .. fmt):format(...)) end

local model, tok, fallback = R.model_and_tokenizer(opt, given, device, say, 42,
  "a byte-level tokenizer and a Zephyr-style chat template")
if fallback then -- each assistant turn in a generation block, so assistant_only_loss can mask the rest
  tok:set_chat_template("{% for m in messages %}{{ '<|' + m.role + '|>\\n' }}{% if m.role == 'assistant' %}" ..
    "{% generation %}{{ m.content + eos_token }}{% endgeneration %}{% else %}{{ m.content + eos_token }}{% endif %}" ..
    "{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
end

-- The rows: a .jsonl file, or (no data given, tiny model) the sample text's sentences as "continue" turns
local rows
if opt.data then
  local ext = opt.data:match("%.(%w+)$")
  if ext == "txt" or ext == "raw" then -- (read as JSON lines it fails at its first character)
    error(("sft_llama: data: %s is plain text; this recipe reads rows from .jsonl, .json or .csv (messages, prompt + " ..
      "completion, or text fields); to train on plain text: zrun recipes/finetune_llama.lua data=%s"):format(opt.data, opt.data), 0)
  end
  rows = zr.datasets.load_dataset(opt.data, { format = (ext == "json" or ext == "csv") and ext or "jsonl" }).rows
elseif fallback then
  rows = {}
  for line in io.lines(home .. "/recipes/data/sample.txt") do
    for s in line:gmatch("[^%.]+%.") do
      local words = {}
      for w in s:gmatch("%S+") do words[#words + 1] = w end
      if #words >= 6 then
        local h = math.floor(#words / 2)
        rows[#rows + 1] = { messages = { { role = "user", content = "Continue: " .. table.concat(words, " ", 1, h) },
          { role = "assistant", content = table.concat(words, " ", h + 1) } } }
      end
    end
  end
  if not given.assistant_only_loss then args.assistant_only_loss = true end
else
  error("data= a .jsonl file of chat / instruction rows is required with a model (see the recipe's header)", 0)
end
local n_eval = math.max(1, math.floor(#rows * opt.validation_split_percentage / 100 + 0.5))
local eval_rows, train_rows = {}, {}
for i, r in ipairs(rows) do if i <= n_eval then eval_rows[#eval_rows + 1] = r else train_rows[#train_rows + 1] = r end end

if fallback then -- CPU-sized settings for the tiny model
  R.tiny_settings(args, opt, given, { gradient_accumulation_steps = 1, learning_rate = 3e-3, max_steps = 60,
    logging_steps = 5, eval_steps = 20, max_length = 256 }, false)
end
R.deepspeed_args(args, opt, given)

-- TRL's get_peft_config(model_args): the LoraConfig use_peft asks for; lora_* without it are said to do nothing
local peft_config
local LORA_KEYS = { "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_task_type", "use_rslora",
  "use_dora", "lora_modules_to_save" }
if opt.use_peft then
  local tm = opt.lora_target_modules
  if tm and tm ~= "all-linear" then
    local list = {}
    for name in tostring(tm):gmatch("[^,%s]+") do list[#list + 1] = name end
    tm = list
  end
  local mts = opt.lora_modules_to_save
  peft_config = zr.peft.LoraConfig { task_type = opt.lora_task_type, r = opt.lora_r, target_modules = tm or nil,
    lora_alpha = opt.lora_alpha, lora_dropout = opt.lora_dropout, bias = "none", use_rslora = opt.use_rslora or false,
    use_dora = opt.use_dora or false, modules_to_save = mts and { mts } or nil }
else
  for _, k in ipairs(LORA_KEYS) do
    if given[k] then say("%s has no effect without use_peft=true (TRL's ModelConfig reads it only then)", k) end
  end
end

local D = zr.datasets.Dataset
local train_ds, eval_ds = D.from_rows(train_rows), D.from_rows(eval_rows)
if opt.data then -- (a row that fails to prepare is then named by its place in the file)
  train_ds.source, train_ds.row_offset, eval_ds.source, eval_ds.row_offset = opt.data, n_eval, opt.data, 0
end
local trainer = zr.SFTTrainer { model = model, processing_class = tok, args = args, peft_config = peft_config,
  train_dataset = train_ds, eval_dataset = eval_ds }
local prep = trainer.train_dataset.sft
local learned = 0
for _, r in ipairs(trainer.train_dataset.rows) do for _, l in ipairs(r.labels) do if l ~= -100 then learned = learned + 1 end end end
say("%d training rows (%s; %d tokens learned%s) and %d evaluation rows, model %s (%d parameters%s), device %s",
  #trainer.train_dataset, prep.kind, learned, prep.dropped > 0 and (", %d rows dropped by max_length"):format(prep.dropped) or "",
  #trainer.eval_dataset, fallback and "zrun/tiny-llama" or opt.model, model:num_parameters(),
  peft_config and (", %d of them trained: the LoRA adapter"):format(model:num_parameters(true)) or "", device)
if opt.dump_blocks then -- for a side-by-side run elsewhere (tests/bench/hf_finetune.py) on the same rows, same order
  local function padded(ds, key, fill) -- rows of different lengths, filled up to the longest
    local t, T = {}, 0
    for _, r in ipairs(ds.rows) do T = math.max(T, #r.input_ids) end
    for k, r in ipairs(ds.rows) do
      local row = {}
      for j = 1, T do row[j] = r[key][j] or fill end
      t[k] = row
    end
    return zr.tensor(t, { dtype = "i64" })
  end
  local tensors, meta = trainer:order_tensors()
  tensors.train_input_ids, tensors.train_labels = padded(trainer.train_dataset, "input_ids", -1),
    padded(trainer.train_dataset, "labels", -100)
  tensors.eval_input_ids, tensors.eval_labels = padded(trainer.eval_dataset, "input_ids", -1),
    padded(trainer.eval_dataset, "labels", -100)
  meta.format, meta.pad_token_id = "pt", tostring(tok:pad_id() or tok:eos_id())
  if dist.rank() == 0 then zr._C.save_safetensors(opt.dump_blocks, tensors, meta) end
  say("wrote %s: the rows (input_ids ending in -1s, labels in -100s), train_order and train_epoch_order", opt.dump_blocks)
end
local before = trainer:evaluate()
local res = trainer:train()
local after = trainer.last_eval == res.global_step and trainer.last_eval_metrics or trainer:evaluate()
trainer:save_model()
say("done: %d steps in %.1f s, loss %.3f -> %.3f, evaluation loss %.3f -> %.3f; %s and tokenizer saved to %s",
  res.global_step, res.train_runtime, res.first_loss or 0 / 0, res.last_loss or 0 / 0, before.eval_loss, after.eval_loss,
  peft_config and "LoRA adapter" or "model", args.output_dir)
