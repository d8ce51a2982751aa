-- The recipes' shared command line (zrun.argparse): key=value, --key=value, --key value, --config,
-- positional values, typed values, TrainingArguments keys, "did you mean", and --help listing every
-- option with its default (recipes/finetune_llama.lua and train_mlp.lua through zrun itself).
local zr = require "zrun"
local T = zr.testing
local argparse = require "zrun.argparse"
local z = os.getenv("ZRUN_BIN") or "./zrun"

local function parser(targs)
  local p = argparse.new("recipes/demo.lua", "A demo.")
  p:option("model", "m0", "the model"):option("block_size", 512, "tokens"):option("config", "c.json", "DeepSpeed config")
  p:option("tokenizer", false, "a tokenizer"):option("hidden", nil, "unset by default"):option("fast", true, "a switch")
  p:alias("deepspeed", "config")
  if targs then p:training_arguments(targs) end
  return p
end

local function sh(cmd)
  local out, rc = T.run(cmd)
  return out .. "rc=" .. rc
end

T.test("key=value, --key=value and --key value set options, typed by their defaults", function()
  local opt, given = parser():parse { "model=x", "--block_size=64", "--config", "z.json", "hidden=7", "fast=false" }
  T.eq(opt.model, "x"); T.eq(opt.block_size, 64); T.eq(opt.config, "z.json"); T.eq(opt.hidden, 7); T.eq(opt.fast, false)
  T.eq(opt.tokenizer, false, "a default stays"); T.eq(given.model, true); T.eq(given.tokenizer, nil)
  T.eq(parser():parse { "model=123" }.model, "123", "a string option keeps digits as text")
  T.eq(parser():parse { "deepspeed=d.json" }.config, "d.json", "an alias")
  T.eq(parser():parse { "--deepspeed", "d.json" }.config, "d.json", "--alias VALUE")
  T.eq(parser():parse { "--block-size", "8" }.block_size, 8, "dashes for underscores")
  T.eq(parser():parse {}.hidden, nil, "nil default: unset")
end)

T.test("bad values and unknown keys are one line naming the fix", function()
  T.raises(function() parser():parse { "block_size=abc" } end, "demo: block_size must be a number, got 'abc'")
  T.raises(function() parser():parse { "fast=maybe" } end, "demo: fast must be true or false, got 'maybe'")
  T.raises(function() parser():parse { "modle=x" } end, "demo: unknown option 'modle' (did you mean 'model'?): it takes model, block_size")
  T.raises(function() parser():parse { "stray" } end, "demo: unknown argument 'stray' (use key=value or --config FILE")
  -- (`block_size = 8` or `block_size 8`: the shell made words of what was meant as one)
  T.raises(function() parser():parse { "block_size", "=", "8" } end,
    "demo: block_size needs its value in the same word: block_size=VALUE, with no spaces around the =")
  T.raises(function() parser():parse { "block_size", "8" } end, "demo: block_size needs its value in the same word")
  T.raises(function() parser():parse { "--config" } end, "demo: --config needs a value")
  local err = T.raises(function() parser():parse { "x=1" } end)
  assert(not err:find(".lua:", 1, true), "zrun's error printer would take '.lua:' for a code position: " .. err)
end)

T.test("TrainingArguments keys go to the args table; others are refused with a suggestion", function()
  local args = { learning_rate = 2e-5 }
  local opt, given, a = parser(args):parse { "learning_rate=3e-4", "max_steps=5", "bf16=true", "model=q", "--logging_first_step" }
  T.eq(a, args); T.eq(args.learning_rate, 3e-4); T.eq(args.max_steps, 5); T.eq(args.bf16, true)
  T.eq(args.logging_first_step, true, "a bare --flag of a boolean key"); T.eq(opt.model, "q"); T.eq(given.max_steps, true)
  T.eq(args.report_to, nil)
  parser(args):parse { "report_to=none" } -- accepted: zrun.trainer_args warns that it has no effect
  T.eq(args.report_to, "none")
  T.raises(function() parser({}):parse { "learning_rte=1" } end, "unknown option 'learning_rte' (did you mean 'learning_rate'?)")
  T.raises(function() parser({}):parse { "learning_rte=1" } end, "or any TrainingArguments key the Trainer implements")
  T.raises(function() parser():parse { "learning_rate=1" } end, "unknown option 'learning_rate'")
end)

T.test("booleans read as HfArgumentParser reads them: --bf16 False is false, --flag alone true, --no_flag false", function()
  -- (transformers' string_to_bool: `--bf16 False`, `--use_peft 0`, `--packing no` are False there; a Lua string
  -- "False" or the number 0 would be true)
  local function p()
    return parser({ output_dir = "o" }):flag("use_peft", false, "a LoRA adapter")
  end
  for _, c in ipairs { { "False", false }, { "false", false }, { "0", false }, { "no", false }, { "n", false },
    { "True", true }, { "TRUE", true }, { "1", true }, { "yes", true }, { "t", true } } do
    local opt, _, args = p():parse { "--use_peft", c[1], "--bf16", c[1], "--gradient_checkpointing=" .. c[1], "fast=" .. c[1] }
    T.eq(opt.use_peft, c[2], "--use_peft " .. c[1]); T.eq(args.bf16, c[2], "--bf16 " .. c[1])
    T.eq(args.gradient_checkpointing, c[2], "--gradient_checkpointing=" .. c[1]); T.eq(opt.fast, c[2], "fast=" .. c[1])
  end
  T.eq(p():parse({ "use_peft=False" }).use_peft, false, "key=value reads it the same")
  local opt, given, args = p():parse { "--use_peft", "--do_train", "--do_eval", "--no_remove_unused_columns", "--no_fast",
    "--no_logging_nan_inf_filter", "--output_dir", "x" }
  T.eq(opt.use_peft, true); T.eq(args.do_train, true); T.eq(args.do_eval, true, "not taken as do_train's value")
  T.eq(args.remove_unused_columns, false); T.eq(opt.fast, false); T.eq(given.fast, true)
  T.eq(args.logging_nan_inf_filter, false); T.eq(args.output_dir, "x")
  T.eq(select(3, p():parse { "--do_train" }).do_train, true, "a bare flag last on the line")
  T.raises(function() p():parse { "--use_peft", "maybe" } end, "demo: use_peft must be true or false, got 'maybe'")
  T.raises(function() p():parse { "--bf16=maybe" } end, "demo: bf16 must be true or false, got 'maybe'")
  T.raises(function() p():parse { "--no_model" } end, "demo: unknown option 'no_model'")
  T.raises(function() p():parse { "--model", "--bf16" } end, "demo: --model needs a value")
  -- an option whose false default means "unset" is no boolean: argparse (nargs=None) says "expected one argument"
  T.raises(function() p():parse { "--tokenizer" } end, "demo: --tokenizer needs a value")
  T.raises(function() p():parse { "--save_total_limit", "--bf16" } end, "demo: --save_total_limit needs a value")
  T.raises(function() p():parse { "--resume_from_checkpoint" } end, "demo: --resume_from_checkpoint needs a value")
  T.eq(p():parse({ "--fast" }).fast, true, "an option whose default is true is a boolean")
  T.raises(function() p():parse { "--tokenizer", "block_size=3" } end, "demo: --tokenizer needs a value")
  T.eq(p():parse({ "--tokenizer", "a=b" }).tokenizer, "a=b", "a value with '=' that names no option")
  -- TrainingArguments' include_num_input_tokens_seen is `str | bool`, parsed as bool there: alone it is True ("all")
  args = select(3, p():parse { "--include_num_input_tokens_seen", "block_size=3" })
  T.eq(args.include_num_input_tokens_seen, true)
  T.eq(p():parse({ "hidden=False" }).hidden, false, "an untyped option: Python's False is false too")
  T.eq(p():parse({ "model=False" }).model, "False", "a string option keeps the text")
end)

T.test("sft_llama: --use_peft False trains the whole model, as TRL's ModelConfig reads it", function()
  local out = sh(z .. " recipes/sft_llama.lua --use_peft False --packing False max_steps=1 eval_strategy=no save_strategy=no " ..
    "output_dir=" .. T.tmpdir() .. "/o")
  assert(out:find("rc=0", 1, true) and not out:find("LoRA", 1, true), out)
end)

T.test("sft_llama: SFTConfig's bool | None fields alone are true (HfArgumentParser: nargs '?', const True)", function()
  local out = sh(z .. " recipes/sft_llama.lua --eval_packing --completion_only_loss False max_steps=1 eval_strategy=no " ..
    "save_strategy=no output_dir=" .. T.tmpdir() .. "/o")
  assert(out:find("rc=0", 1, true) and not out:find("needs a value", 1, true), out)
end)

T.test("sft_llama: TRL's --dataset_name names the rows; a hub id is one line before the model loads", function()
  local out = sh(z .. " recipes/sft_llama.lua --dataset_name trl-lib/Capybara max_steps=1")
  assert(out:find("data: trl-lib/Capybara is not a file or folder here", 1, true) and out:find("rc=1", 1, true), out)
  assert(out:find('load_dataset("trl-lib/Capybara", split="train").to_json("rows.jsonl")', 1, true), out)
  assert(not out:find("tiny Llama", 1, true), out)
end)

T.test("--config takes DeepSpeed's JSON: a YAML arguments file or bad JSON is one line, before the model loads", function()
  local d = T.tmpdir()
  local f = io.open(d .. "/recipe.yaml", "w"); f:write("learning_rate: 2.0e-5\nuse_peft: true\n"); f:close()
  f = io.open(d .. "/ds.json", "w"); f:write('{"train_micro_batch_size_per_gpu": "auto",}'); f:close()
  local out = sh(z .. " recipes/sft_llama.lua --config " .. d .. "/recipe.yaml")
  assert(out:find("takes a DeepSpeed JSON config; an arguments file (TRL's --config recipe.yaml", 1, true), out)
  assert(out:find("rc=1", 1, true) and not out:find("recipe.lua:", 1, true) and not out:find("tiny Llama", 1, true), out)
  out = sh(z .. " recipes/finetune_llama.lua --deepspeed " .. d .. "/ds.json")
  assert(out:find("ds.json: not valid JSON (line 1, column 43)", 1, true), out)
  assert(out:find("rc=1", 1, true) and not out:find("recipe.lua:", 1, true) and not out:find("tiny Llama", 1, true), out)
end)

T.test("positional values fill the named options in order", function()
  local p = argparse.new("recipes/p.lua"):option("epochs", 3, "e"):option("batch_size", 4, "b"):positional("epochs", "batch_size")
  local opt = p:parse { "5" }
  T.eq(opt.epochs, 5); T.eq(opt.batch_size, 4)
  opt = p:parse { "5", "batch_size=9" }
  T.eq(opt.batch_size, 9)
  T.raises(function() p:parse { "1", "2", "3" } end, "p: unknown argument '3'")
end)

T.test("--help lists every option with its default, and exits 0 before any work", function()
  local h = parser({ output_dir = "out/x" }):help_text()
  assert(h:find("usage: zrun recipes/demo.lua [--config FILE] [key=value ...]", 1, true), h)
  assert(h:find("block_size%s+tokens %[512%]"), h)
  assert(h:find("config%s+DeepSpeed config %(also deepspeed%) %[c.json%]"), h)
  assert(h:find("hidden%s+unset by default %[unset%]"), h)
  assert(h:find("output_dir=out/x", 1, true) and h:find("seed=42", 1, true), h)
  local out = sh(z .. " recipes/finetune_llama.lua --help")
  assert(out:find("rc=0", 1, true) and out:find("block_size", 1, true) and out:find("[configs/ds_config.json]", 1, true), out)
  assert(out:find("per_device_train_batch_size=4", 1, true) and not out:find("falling back", 1, true), out)
  out = sh(z .. " recipes/train_mlp.lua --help")
  assert(out:find("usage: zrun recipes/train_mlp.lua [EPOCHS] [BATCH_SIZE]", 1, true) and out:find("rc=0", 1, true), out)
  assert(not out:find("epoch 1", 1, true), out)
end)

T.test("the recipes refuse a misspelt option before loading anything", function()
  local out = sh(z .. " recipes/finetune_llama.lua learning_rte=1e-3")
  assert(out:find("zrun: finetune_llama: unknown option 'learning_rte' (did you mean 'learning_rate'?)", 1, true), out)
  assert(out:find("rc=1", 1, true) and not out:find("ZRUN_DEBUG", 1, true), out)
  -- run_clm.py's and TRL's names for the model and tokenizer are the recipes' own
  for _, r in ipairs { "finetune_llama", "sft_llama" } do
    out = sh(z .. " recipes/" .. r .. ".lua --model_name_or_path /nonexistent/m max_steps=1")
    assert(out:find("no model found at '/nonexistent/m'", 1, true) and out:find("rc=1", 1, true), out)
  end
  out = sh(z .. " recipes/train_mlp.lua epochs=x")
  assert(out:find("train_mlp: epochs must be a number, got 'x'", 1, true) and out:find("rc=1", 1, true), out)
end)

T.test("--local_rank as DeepSpeed's launcher appends it: taken when it matches the launcher's local rank", function()
  if require("zrun.dist").env_local_rank() then return T.skip("--local_rank without a launcher", "LOCAL_RANK is set") end
  local p = parser({ output_dir = "o" })
  for _, argv in ipairs { { "--local_rank=0" }, { "--local-rank=0", "block_size=8" }, { "--local_rank", "0", "block_size=8" },
    { "--local_rank=-1" } } do
    local opt, given, targs = p:parse(argv)
    T.eq(opt.local_rank == nil and given.local_rank == nil and targs.local_rank == nil, true, table.concat(argv, " "))
  end
  T.eq(p:parse({ "--local_rank", "0", "block_size=8" }).block_size, 8, "the value after it is its own, not an option's")
  T.raises(function() p:parse { "--local_rank=2" } end, "demo: --local_rank=2 without a launcher; zrun takes each process's GPU")
end)

T.test("DeepSpeed's own arguments: --deepspeed_config FILE, and --deepspeed alone as its switch", function()
  local p = argparse.new("recipes/demo.lua"):option("config", "c.json", "DeepSpeed config"):option("block_size", 512, "tokens")
  p:alias("deepspeed", "config", true):alias("deepspeed_config", "config")
  T.eq(p:parse({ "--deepspeed", "--deepspeed_config", "z1.json" }).config, "z1.json")
  T.eq(p:parse({ "--deepspeed_config=z1.json", "--deepspeed" }).config, "z1.json")
  T.eq(p:parse({ "--deepspeed", "block_size=8" }).config, "c.json", "the switch alone: the default config")
  T.eq(p:parse({ "--deepspeed", "z2.json" }).config, "z2.json", "HF's --deepspeed FILE")
  T.raises(function() p:parse { "--deepspeed_config" } end, "--deepspeed_config needs a value")
  T.raises(function() argparse.new("recipes/demo.lua"):option("config", "c.json"):alias("deepspeed", "config"):parse { "--deepspeed" } end,
    "--deepspeed needs a value")
end)

T.test("dist.env_local_rank: LOCAL_RANK, else the MPI launcher's, without joining the job", function()
  local dist = require "zrun.dist"
  local function env(t) return function(k) return t[k] end end
  T.eq(dist.env_local_rank(env {}), nil)
  T.eq(dist.env_local_rank(env { LOCAL_RANK = "3" }), 3)
  T.eq(dist.env_local_rank(env { OMPI_COMM_WORLD_RANK = "5", OMPI_COMM_WORLD_LOCAL_RANK = "1" }), 1)
  T.eq(dist.env_local_rank(env { SLURM_PROCID = "9", SLURM_LOCALID = "2" }), 2)
end)

T.done()

T.test("a space-separated list (HfArgumentParser's nargs) is refused with the comma-separated form", function()
  local p = argparse.new("r"):option("lora_target_modules", false, "comma-separated module names"):option("config", false, "a file")
  T.raises(function() p:parse { "--lora_target_modules", "q_proj", "v_proj" } end,
    "unknown argument 'v_proj' after --lora_target_modules q_proj: zrun takes a list as one comma-separated value " ..
    "(--lora_target_modules q_proj,v_proj)")
  T.raises(function() p:parse { "--config", "ds.json", "extra" } end, "unknown argument 'extra' (use key=value")
  T.eq(p:parse({ "--lora_target_modules", "q_proj,v_proj" }).lora_target_modules, "q_proj,v_proj")
end)
