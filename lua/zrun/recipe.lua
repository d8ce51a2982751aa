-- What the recipes share (recipes/finetune_llama.lua, recipes/sft_llama.lua): the device, the DeepSpeed
-- config's path, the model and tokenizer with the built-in tiny fallback, and the DeepSpeed settings the
-- command line and the config file agree on.
local zr = require "zrun"
local M = {}

local function exists(p) local f = io.open(p, "rb"); if f then f:close(); return true end return false end

-- The options both recipes take for the DeepSpeed side: config (alias deepspeed, as HF's scripts take
-- it, and deepspeed_config, as deepspeed.add_config_arguments does; a bare --deepspeed is that
-- function's switch), precision, device.
function M.deepspeed_options(cli)
  cli:option("config", "configs/ds_config.json", "DeepSpeed config (bf16, ZeRO-2, 8 micro-batches of 4)")
  cli:alias("deepspeed", "config", true)
  cli:alias("deepspeed_config", "config")
  cli:option("precision", false, "bf16 | fp16 | fp32: sets args.bf16/fp16 (for configs whose \"enabled\" is \"auto\" or that have no such section)")
  cli:option("device", "auto", "cpu | cuda | auto")
  return cli
end

-- "cpu" | "cuda" from device = "auto" | "cpu" | "cuda".
function M.device(name)
  if name == "auto" then return zr.cuda.device_count() > 0 and "cuda" or "cpu" end
  -- (checked here: a bad name otherwise stops inside the first layer the model builds)
  if type(name) ~= "string" or not (name == "cpu" or name == "cuda" or name:match("^cuda:%d+$")) then
    error(("device must be cpu, cuda, cuda:N or auto, got '%s'"):format(tostring(name)), 0)
  end
  return name
end

-- The DeepSpeed config's path, also looked up under ZRUN_HOME (configs/... from any folder); false
-- under `accelerate launch` with DeepSpeed when the command line names no config: the Trainer then
-- takes accelerate's (zrun.accelerate_env), as transformers' does.
function M.config_path(path, given)
  if given and not given.config and require("zrun.accelerate_env").active() then return false end
  local home = ZRUN_HOME or "."
  if not exists(path) and exists(home .. "/" .. path) then path = home .. "/" .. path end
  if not exists(path) then error("DeepSpeed config " .. path .. " not found (pass --config FILE)", 0) end
  if path:match("%.ya?ml$") then -- (TRL's `--config recipe.yaml` is an arguments file, not DeepSpeed's)
    error(("--config %s: --config (--deepspeed) takes a DeepSpeed JSON config; an arguments file (TRL's " ..
      "--config recipe.yaml, HfArgumentParser.parse_yaml_file) is not read: pass its keys on the command line as " ..
      "key=value"):format(path), 0)
  end
  require("zrun.config").read_json(path) -- (not JSON: one line now, before the model and the data load)
  return path
end

-- model, tok, fallback: the model directory's (or hub id's) Llama or GPT-2 in f32 on device and its tokenizer
-- (opt.tokenizer overrides it). Only when neither was named on the command line and the default is
-- not on disk: the built-in tiny Llama (zrun/tiny-llama, built after zr.manual_seed(seed)) with a
-- byte-level tokenizer, so the recipe always trains something visibly; say(fmt, ...) reports it.
function M.model_and_tokenizer(opt, given, device, say, seed, what)
  local model, tok
  local ok, err = pcall(function()
    local dir = zr.hf.resolve(opt.model)
    tok = zr.tokenizers.load(opt.tokenizer or dir)
    model = zr.models.from_pretrained(dir, { dtype = "f32", device = device }) -- (llama or gpt2, by config.json)
  end)
  if not ok and (given.model or given.tokenizer) then error(tostring(err), 0) end
  if ok then
    if tok:vocab_size() > model.config.vocab_size then
      error(("the tokenizer has %d tokens but the model's vocab_size is %d: pass tokenizer= the model's own"):format(
        tok:vocab_size(), model.config.vocab_size), 0)
    end
    return model, tok, false
  end
  say("model '%s' not available: %s", opt.model, tostring(err))
  say("falling back to the built-in tiny Llama (zrun/tiny-llama) with %s", what or "a byte-level tokenizer")
  zr.manual_seed(seed)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.device = device
  return zr.models.llama.LlamaForCausalLM(cfg), zr.tokenizers.ByteTokenizer.new(), true
end

-- CPU-sized settings for the tiny model: args' values (where the command line set none) and, unless
-- --config was given, a small ZeRO-2 config (with the warmup-decay schedule when schedule is true).
function M.tiny_settings(args, opt, given, small, schedule)
  for k, v in pairs(small) do if not given[k] then args[k] = v end end
  if given.config or opt.config == false then return end
  opt.config = { train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto",
    gradient_clipping = 1.0, steps_per_print = 1000,
    optimizer = { type = "AdamW", params = { lr = "auto", betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = "auto" } },
    scheduler = schedule and { type = "WarmupDecayLR", params = { warmup_min_lr = 0, warmup_max_lr = "auto",
      warmup_num_steps = "auto", total_num_steps = "auto", warmup_type = "linear" } } or nil,
    zero_optimization = { stage = 2 } }
end

-- args.deepspeed = opt.config, after the rule that a number the DeepSpeed file fixes itself (not "auto")
-- wins over the script's default for it (a value given on the command line must agree with the file:
-- the Trainer says so when not); precision = bf16 | fp16 | fp32 sets args.bf16 / fp16 for configs whose
-- "enabled" is "auto" or that have no such section.
function M.deepspeed_args(args, opt, given)
  if type(opt.config) == "string" then
    local c = require("zrun.config").read_json(opt.config)
    local op = type(c.optimizer) == "table" and type(c.optimizer.params) == "table" and c.optimizer.params or {}
    local fixed = { learning_rate = op.lr, weight_decay = op.weight_decay, gradient_accumulation_steps =
      c.gradient_accumulation_steps, per_device_train_batch_size = c.train_micro_batch_size_per_gpu }
    for k, v in pairs(fixed) do if type(v) == "number" and not given[k] then args[k] = nil end end
  end
  args.deepspeed = opt.config
  if opt.precision then
    local p = ({ bf16 = "bf16", fp16 = "fp16", fp32 = "fp32" })[opt.precision]
    if not p then error("precision must be bf16, fp16 or fp32, got '" .. tostring(opt.precision) .. "'", 0) end
    args.bf16, args.fp16 = p == "bf16", p == "fp16"
  end
end

return M
