-- Fine-tune Llama-3.2-1B on WikiText-2 with a DeepSpeed config: the well-known Hugging Face +
-- DeepSpeed script, in Lua.
--   zrun recipes/finetune_llama.lua                                  # defaults below
--   mpirun -np 4 zrun recipes/finetune_llama.lua --config configs/zero3_offload.json
--   zrun recipes/finetune_llama.lua model=/path/to/Llama-3.2-1B data=/path/to/wikitext-2-raw max_steps=50
-- When the model or the data is not present it says what it looked for and falls back to a
-- built-in tiny Llama, a byte-level tokenizer and a short text written for the project, so the
-- recipe always trains visibly.
local zr = require "zrun"
local dist = zr.dist

-- command line: --config FILE, key=value overrides of the options below
local opt = {
  model = "meta-llama/Llama-3.2-1B",
  data = os.getenv("ZRUN_WIKITEXT") or "wikitext-2-raw",
  split = "train[:2000]",
  config = "configs/ds_config.json",
  max_length = 512,
  output_dir = "output/finetune_llama",
  epochs = 1,
  max_steps = -1,
  device = "auto",
}
local i = 1
while i <= #arg do
  local a = arg[i]
  if a == "--config" or a == "--deepspeed" then opt.config, opt.config_given = arg[i + 1], true; i = i + 1
  elseif a:match("^[%w_]+=") then
    local k, v = a:match("^([%w_]+)=(.*)$")
    opt[k] = tonumber(v) or v
  else error("unknown argument '" .. a .. "' (use --config FILE or key=value)", 0) end
  i = i + 1
end

local function exists(p) local f = io.open(p, "rb"); if f then f:close(); return true end return false end
local home = ZRUN_HOME or "."
if not exists(opt.config) and exists(home .. "/" .. opt.config) then opt.config = home .. "/" .. opt.config end

-- model + tokenizer (or the built-in fallback)
local device = opt.device
if device == "auto" then device = zr.cuda.device_count() > 0 and "cuda" or "cpu" end
local model, tok, fallback
local ok, err = pcall(function()
  local dir = zr.hf.resolve(opt.model)
  tok = zr.tokenizers.load(dir)
  model = zr.models.llama.from_pretrained(dir, { dtype = "f32", device = device })
end)
if not ok then
  dist.print0("[finetune_llama] model '" .. opt.model .. "' not available: " .. tostring(err))
  dist.print0("[finetune_llama] falling back to the built-in tiny Llama (zrun/tiny-llama) with a byte-level tokenizer")
  fallback = true
  zr.manual_seed(0)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.device = device
  model = zr.models.llama.LlamaForCausalLM(cfg)
  tok = zr.tokenizers.ByteTokenizer.new()
  opt.max_length = math.min(opt.max_length, 64)
end

-- data: wikitext train[:2000] (or the built-in sample)
local ds
local okd, derr = pcall(function() ds = zr.datasets.load_dataset(opt.data, { split = opt.split }) end)
if not okd then
  dist.print0("[finetune_llama] dataset not available: " .. tostring(derr))
  local sample = home .. "/recipes/data/sample.txt"
  dist.print0("[finetune_llama] falling back to the built-in text sample " .. sample)
  ds = zr.datasets.load_dataset(sample, { format = "wikitext" })
  fallback = true
end
local tokenized = ds:filter(function(r) return r.text ~= "" end):map(function(r)
  return { input_ids = tok:encode(r.text, true, opt.max_length) }
end)
if fallback then -- short lines: pack them into full blocks so every step sees real text
  tokenized = tokenized:group_texts(opt.max_length)
end
dist.print0(("[finetune_llama] %d training rows, model %s, %d parameters, device %s"):format(
  #tokenized.rows, fallback and "zrun/tiny-llama" or opt.model, model:num_parameters(), device))

local args = {
  output_dir = opt.output_dir, per_device_train_batch_size = 4, gradient_accumulation_steps = 8,
  learning_rate = fallback and 3e-3 or 2e-5, num_train_epochs = opt.epochs, max_steps = opt.max_steps,
  logging_steps = fallback and 5 or 10, deepspeed = opt.config, -- precision comes from the config (bf16)
  warmup_ratio = 0.05, weight_decay = 0.0,
}
if fallback then
  args.gradient_accumulation_steps = 1
  args.max_steps = opt.max_steps > 0 and opt.max_steps or 60
  if not opt.config_given then args.deepspeed = { train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto",
    gradient_clipping = 1.0, steps_per_print = 1000,
    optimizer = { type = "AdamW", params = { lr = "auto", betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = "auto" } },
    scheduler = { type = "WarmupDecayLR", params = { warmup_min_lr = 0, warmup_max_lr = "auto",
      warmup_num_steps = "auto", total_num_steps = "auto" } },
    zero_optimization = { stage = 2 } } end
end
-- Trainer arguments given on the command line (learning_rate=, gradient_accumulation_steps=,
-- logging_steps=, ...) override the ones above; precision=bf16|fp16|fp32 sets args.bf16/fp16
-- (for configs whose bf16/fp16 "enabled" is "auto").
local ARG_KEYS = { learning_rate = true, gradient_accumulation_steps = true, per_device_train_batch_size = true,
  logging_steps = true, weight_decay = true, warmup_ratio = true, seed = true }
for k, v in pairs(opt) do if ARG_KEYS[k] then args[k] = v end end
if opt.precision then
  local p = ({ bf16 = "bf16", fp16 = "fp16", fp32 = "fp32" })[opt.precision]
  if not p then error("precision must be bf16, fp16 or fp32, got '" .. tostring(opt.precision) .. "'", 0) end
  args.bf16, args.fp16 = p == "bf16", p == "fp16"
end
local trainer = zr.Trainer({ model = model, args = args, train_dataset = tokenized,
  data_collator = zr.datasets.causal_lm_collator({ pad_token_id = tok:pad_id() or 0 }) })
local res = trainer:train()
dist.print0(("[finetune_llama] done: %d steps in %.1f s, loss %.3f -> %.3f"):format(res.global_step,
  res.train_runtime, res.first_loss or 0 / 0, res.train_loss or 0 / 0))
