-- Fine-tune a Llama on WikiText-2 with a DeepSpeed config: Hugging Face's run_clm.py (tokenize,
-- pack into blocks with group_texts, Trainer, evaluate, save) + DeepSpeed, in Lua.
--   zrun recipes/finetune_llama.lua                 # no model on disk: the built-in tiny Llama on a sample text
--   zrun recipes/finetune_llama.lua model=DIR [tokenizer=DIR|tokenizer.json] data=DIR|FILE [--config FILE]
--        [any TrainingArguments key=value: max_steps=50 learning_rate=3e-4 eval_steps=10 save_strategy=no ...]
--   mpirun -np 4 zrun recipes/finetune_llama.lua --config configs/zero3_offload.json
-- model: a Llama or a GPT-2 directory (config.json's model_type picks the class, as AutoModelForCausalLM).
-- data: a folder with wiki.train.raw and wiki.valid.raw, or only wiki.valid.raw (or one text file),
-- which is then split: the first validation_split_percentage % of its lines evaluate, the rest
-- train (run_clm's rule for a dataset without a validation split).
local zr = require "zrun"
local dist = zr.dist
local R = require "zrun.recipe"

-- Script options (run_clm's ModelArguments and DataTrainingArguments) ...
local cli = require("zrun.argparse").new("recipes/finetune_llama.lua",
  "Fine-tunes a Llama on WikiText-2 with a DeepSpeed config (Hugging Face's run_clm.py + DeepSpeed).")
cli:option("model", "meta-llama/Llama-3.2-1B", "a Hugging Face model directory or a hub id in the local cache")
cli:option("tokenizer", false, "a directory or tokenizer.json (default: the model's own)")
cli:option("data", os.getenv("ZRUN_WIKITEXT") or "wikitext-2-raw", "a WikiText folder or one text file (default: $ZRUN_WIKITEXT when set)")
cli:alias("model_name_or_path", "model"):alias("tokenizer_name", "tokenizer"):alias("train_file", "data") -- (run_clm.py's names)
cli:option("train_split", "train", "e.g. train[:2000]")
cli:option("block_size", 512, "tokens per training block (run_clm's group_texts)")
cli:option("packing", true, "false: one row per line (at most block_size tokens), padded per micro-batch with the tokenizer's pad token (else eos) instead of packed blocks")
cli:option("pad_to_multiple_of", false, "packing=false: pad each micro-batch to a multiple of this many tokens (HF's DataCollatorForLanguageModeling option; default 64 on a GPU, where fewer distinct shapes halve the time, 1 on the CPU)")
cli:option("validation_split_percentage", 5, "share of the lines that evaluate when there is no train split")
R.deepspeed_options(cli)
cli:option("dump_blocks", false, "FILE.safetensors: the token blocks and the order training reads them")
-- ... and TrainingArguments. Anything on the command line overrides either.
local args = {
  output_dir = "output/finetune_llama",
  per_device_train_batch_size = 4, per_device_eval_batch_size = 4, gradient_accumulation_steps = 8,
  learning_rate = 2e-5, weight_decay = 0.0, warmup_ratio = 0.05, num_train_epochs = 1,
  logging_steps = 10, eval_strategy = "steps", eval_steps = 50,
  save_strategy = "steps", save_steps = 500, save_total_limit = 2,
}
local opt, given = cli:training_arguments(args):parse(arg)

local resolved = require("zrun.trainer_args").resolve(args, true) -- a bad argument value stops here, before the data is read
-- (the script's own numbers too: a fraction or a block of one token would be cut or predict nothing, silently)
if opt.block_size ~= math.floor(opt.block_size) or opt.block_size < 2 then
  error(("finetune_llama: block_size must be a whole number of tokens >= 2, got %s"):format(tostring(opt.block_size)), 0)
end
local vsp = opt.validation_split_percentage
if vsp ~= math.floor(vsp) or vsp < 1 or vsp > 99 then
  error(("finetune_llama: validation_split_percentage must be a whole percentage from 1 to 99, got %s"):format(tostring(vsp)), 0)
end

local function exists(p) local f = io.open(p, "rb"); if f then f:close(); return true end return false end
local home = ZRUN_HOME or "."
opt.config = R.config_path(opt.config, given)
local device = R.device(opt.device)
local function say(fmt, ...) dist.print0(("[finetune_llama] " .. fmt):format(...)) end

-- Model and tokenizer. Only when no model was named and the default is not on disk: the built-in
-- tiny Llama with a byte-level tokenizer (zr.manual_seed(seed) first, run_clm's set_seed), so `make
-- run` always trains something visibly.
local model, tok, fallback = R.model_and_tokenizer(opt, given, device, say, resolved.seed)
local model_name = fallback and "zrun/tiny-llama" or opt.model -- (fallback also turns on below when only the data falls back)
if fallback then opt.block_size = math.min(opt.block_size, 64) end

-- Raw text: train and validation splits, or one file split by lines.
local function load(split) return zr.datasets.load_dataset(opt.data, { split = split }) end
local is_dir = exists(opt.data .. "/.")
local raw_train, raw_eval, okd, derr
-- (an option the data's layout leaves unread is said, not silently ignored)
local function unread(key, why) if given[key] then say("%s=%s has no effect: %s", key, tostring(opt[key]), why) end end
okd, derr = pcall(function()
  if is_dir and (exists(opt.data .. "/wiki.train.raw") or exists(opt.data .. "/train.txt")) then
    raw_train, raw_eval = load(opt.train_split), load("validation")
    unread("validation_split_percentage", opt.data .. " has a validation split of its own")
  else
    local p = opt.validation_split_percentage
    raw_eval, raw_train = load(("validation[:%d%%]"):format(p)), load(("validation[%d%%:]"):format(p))
    say("no train split in %s: training on the last %d%% of %s's lines, evaluating on the first %d%%",
      opt.data, 100 - p, raw_eval.source, p)
    unread("train_split", opt.data .. " has no train split (its lines are split by validation_split_percentage)")
  end
end)
local env_data = not given.data and os.getenv("ZRUN_WIKITEXT") or "" -- (named data too: no silent fallback from it)
if not okd and (given.data or env_data ~= "") then
  derr = tostring(derr) .. (env_data ~= "" and (" (data comes from ZRUN_WIKITEXT=%s)"):format(env_data) or "")
  if derr:find("selects none of the file's", 1, true) then -- (the slice is this script's, not one the user wrote)
    derr = derr .. (" (validation_split_percentage=%s makes that slice)"):format(opt.validation_split_percentage)
  end
  error(derr, 0)
end
if not okd then
  say("dataset not available: %s", tostring(derr))
  local sample = home .. "/recipes/data/sample.txt"
  local p = 20 -- the sample is 29 lines: a fifth of them evaluate
  say("falling back to the built-in text sample %s: training on its last %d%% of lines, evaluating on the first %d%%",
    sample, 100 - p, p)
  raw_eval = zr.datasets.load_dataset(sample, { format = "wikitext", split = ("train[:%d%%]"):format(p) })
  raw_train = zr.datasets.load_dataset(sample, { format = "wikitext", split = ("train[%d%%:]"):format(p) })
  unread("train_split", "the built-in sample is split as said above")
  unread("validation_split_percentage", "the built-in sample is split as said above")
  fallback = true
end

-- Tokenize every line, then concatenate and cut into full blocks of block_size tokens (run_clm's
-- group_texts, per batch of 1000 lines as its datasets.map runs it): every position of every batch is a
-- real token, no padding. Blank lines are tokenized too, as run_clm does (a tokenizer that adds a BOS
-- gives each a lone BOS; GPT-2's gives nothing).
-- packing=false: each line is a row of its own (cut to block_size; a line of one token predicts nothing
-- and is dropped), and the collator pads each micro-batch to its longest row, the padding's labels -100
-- (HF scripts set the pad token to eos when the tokenizer has none, as here).
local function lm_dataset(raw)
  local r1 = raw[1]
  if r1 and r1.text == nil and (r1.messages or r1.prompt or r1.conversations) then
    error(("%s holds chat / instruction rows (messages, prompt + completion): train them with recipes/sft_llama.lua data=%s")
      :format(opt.data, opt.data), 0)
  end
  if opt.packing then -- (every line, a blank one too: with a tokenizer that adds a BOS it is a lone BOS, as in run_clm)
    return raw:map(function(r) return { input_ids = tok:encode(r.text) } end):group_texts(opt.block_size)
  end
  local ds = raw:filter(function(r) return r.text ~= "" end)
    :map(function(r) return { input_ids = tok:encode(r.text) } end)
  return ds:map(function(r)
    local ids = r.input_ids
    for k = #ids, opt.block_size + 1, -1 do ids[k] = nil end
    return r
  end):filter(function(r) return #r.input_ids >= 2 end)
end
local train_dataset, eval_dataset = lm_dataset(raw_train), lm_dataset(raw_eval)
for _, d in ipairs { { train_dataset, "training" }, { eval_dataset, "evaluation" } } do
  if #d[1] == 0 and opt.packing then -- (the Trainer would blame the batch size; the cut is block_size's)
    error(("the %s text of %s makes no full block of block_size=%d tokens (group_texts drops the rest, as run_clm does): " ..
      "pass more text or a smaller block_size"):format(d[2], fallback and "the sample" or opt.data, opt.block_size), 0)
  end
end
local pad_id = tok:pad_id() or tok:eos_id()
-- (on a GPU every new row length is a new set of product shapes to plan; rounding to 64 keeps them few:
-- half the time on WikiText's lines at the same losses, RESULTS.md session 25. Right padding with -100
-- labels changes nothing the real tokens see.)
if opt.pad_to_multiple_of and opt.packing then
  error("pad_to_multiple_of pads the rows of packing=false; packed blocks have no padding (add packing=false or drop it)", 0)
end
local multiple = opt.pad_to_multiple_of or (device ~= "cpu" and 64 or nil)
local collator = not opt.packing and zr.datasets.causal_lm_collator { pad_token_id = pad_id,
  pad_to_multiple_of = multiple ~= 1 and multiple or nil } or nil
say("%d training %s and %d evaluation %s, model %s (%d parameters), device %s", #train_dataset,
  opt.packing and "blocks" or "rows", #eval_dataset, opt.packing and ("blocks of %d tokens"):format(opt.block_size) or
  ("rows (lines of at most %d tokens, padded with token %s%s)"):format(opt.block_size, tostring(pad_id),
  multiple and multiple ~= 1 and (" to a multiple of %s"):format(multiple) or ""),
  model_name, model:num_parameters(), device)

if fallback then -- CPU-sized settings for the tiny model
  R.tiny_settings(args, opt, given, { gradient_accumulation_steps = 1, learning_rate = 3e-3, max_steps = 60,
    logging_steps = 5, eval_steps = 20, warmup_ratio = 0.05 }, true)
end
-- precision comes from the config (bf16 in ds_config.json), or from precision= when the config says
-- "auto" or has no bf16/fp16 section; a number the file fixes wins over this script's default
R.deepspeed_args(args, opt, given)

local trainer = zr.Trainer({ model = model, args = args, train_dataset = train_dataset, eval_dataset = eval_dataset,
  processing_class = tok, data_collator = collator })
if opt.dump_blocks then -- for a side-by-side run elsewhere (HF Trainer) on the same blocks in the same order
  local function blocks(ds) -- rows of different lengths (packing=false) end in -1s up to the longest
    local t, T = {}, 0
    for _, r in ipairs(ds.rows) do T = math.max(T, #r.input_ids) end
    for k, r in ipairs(ds.rows) do
      local row = {}
      for j = 1, T do row[j] = r.input_ids[j] or -1 end
      t[k] = row
    end
    return zr.tensor(t, { dtype = "i64" })
  end
  local tensors, meta = trainer:order_tensors()
  tensors.train_input_ids, tensors.eval_input_ids = blocks(train_dataset), blocks(eval_dataset)
  meta.format, meta.pad_token_id = "pt", tostring(pad_id)
  if dist.rank() == 0 then zr._C.save_safetensors(opt.dump_blocks, tensors, meta) end
  say("wrote %s: train_input_ids, eval_input_ids, train_order and train_epoch_order (0-based rows, micro-batches of " ..
    "%d, %d per step; rank 0's order)", opt.dump_blocks, trainer.args.per_device_train_batch_size,
    trainer.args.gradient_accumulation_steps)
end
-- (resume_from_checkpoint=true or =output_dir/checkpoint-<step> continues a run: no "before" then)
-- (with eval_on_start the Trainer evaluates first itself: its metrics are the "before")
local before = not args.resume_from_checkpoint and not trainer.args.eval_on_start and trainer:evaluate() or nil
local res = trainer:train()
if trainer.args.eval_on_start and not args.resume_from_checkpoint then before = trainer.first_eval_metrics end
-- (eval_steps may have just evaluated the final weights)
local after = trainer.last_eval == res.global_step and trainer.last_eval_metrics or trainer:evaluate()
trainer:save_model()
-- run_clm.py's reports: train_results.json, eval_results.json, all_results.json, trainer_state.json
local train_metrics = { train_samples = #train_dataset.rows }
for k, v in pairs(res.metrics) do train_metrics[k] = v end
trainer:log_metrics("train", train_metrics); trainer:save_metrics("train", train_metrics); trainer:save_state()
local eval_metrics = { eval_samples = #eval_dataset.rows, perplexity = after.eval_perplexity }
for k, v in pairs(after) do if k:match("^eval_") or k == "epoch" then eval_metrics[k] = v end end
trainer:log_metrics("eval", eval_metrics); trainer:save_metrics("eval", eval_metrics)
-- the training loss as logged: first and last window, or the one window when only one was logged
local loss = (res.n_logged or 0) > 1 and ("loss %.3f -> %.3f"):format(res.first_loss, res.last_loss)
  or ("loss %.3f (one logging window)"):format(res.last_loss or 0 / 0)
say("done: %d steps in %.1f s, %s, validation perplexity %s%.2f; model saved to %s",
  res.global_step, res.train_runtime, loss, before and ("%.2f -> "):format(before.eval_perplexity) or "",
  after.eval_perplexity, args.output_dir)
