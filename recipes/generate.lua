-- Text from a model: what a fine-tuned model (a saved folder, or a base model with a LoRA adapter) now says,
-- as transformers' model.generate + tokenizer.decode. Prints the continuation (the new tokens' text,
-- special tokens skipped).
--   zrun recipes/generate.lua model=DIR prompt="Once upon a time" max_new_tokens=64
--   zrun recipes/generate.lua model=BASE adapter=output/sft_llama chat=true prompt="What is ZeRO?"   # LoRA, chat template
--   zrun recipes/generate.lua model=DIR prompt="..." do_sample=true temperature=0.7 top_p=0.9 seed=1
-- No model on disk (and none named): the built-in tiny Llama with random weights and a byte-level tokenizer,
-- which prints noise but runs every step.
local zr = require "zrun"
local R = require "zrun.recipe"

local cli = require("zrun.argparse").new("recipes/generate.lua",
  "Generates a continuation of a prompt (transformers' model.generate + tokenizer.decode).")
cli:option("model", "meta-llama/Llama-3.2-1B-Instruct", "a Hugging Face model directory or a hub id in the local cache")
cli:option("adapter", false, "a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) applied to the model")
cli:option("tokenizer", false, "a directory or tokenizer.json (default: the adapter's folder when it holds one, else the model's)")
cli:option("prompt", "Once upon a time", "the text to continue (with chat=true: the user's message)")
cli:flag("chat", false, "wrap the prompt as a user message in the tokenizer's chat template, with add_generation_prompt")
cli:option("system", false, "with chat=true: a system message before the user's")
cli:option("max_new_tokens", 64, "tokens to generate at most")
cli:flag("do_sample", false, "sample (temperature, top_k, top_p) instead of greedy decoding")
cli:option("temperature", false, "sampling temperature (default the model's generation_config, else 1.0)")
cli:option("top_k", false, "sampling: keep the k most likely tokens (default the model's, else 50; 0 none)")
cli:option("top_p", false, "sampling: keep the smallest set of tokens whose probability reaches top_p (default 1.0)")
cli:option("repetition_penalty", false, "divide the scores of tokens already in the text by this (default 1.0)")
cli:option("seed", 0, "zr.manual_seed before generating (sampling is reproducible under one seed)")
cli:option("dtype", "f32", "f32 | bf16 | f16: the weights' dtype (loaded in f32, then cast)")
cli:option("device", "auto", "cpu | cuda | auto")
local opt, given = cli:parse(arg)

local function say(fmt, ...) io.stderr:write(("[generate] " .. fmt):format(...) .. "\n") end
local device = R.device(opt.device)

-- the model on device (R.model_and_tokenizer's, or its fallback), the adapter's tokenizer when its folder
-- holds one (the SFT recipe saves it there)
local tok_dir = opt.tokenizer or (opt.adapter and zr._C.path_type(opt.adapter .. "/tokenizer.json") == "file" and opt.adapter) or nil
local model, tok, fallback = R.model_and_tokenizer({ model = opt.model, tokenizer = tok_dir }, given, device, say, opt.seed)
if opt.adapter then
  zr.peft.from_pretrained(model, opt.adapter)
  say("adapter %s applied", opt.adapter)
end
if opt.dtype ~= "f32" then
  if opt.dtype ~= "bf16" and opt.dtype ~= "f16" then error(("generate: dtype %s is not f32, bf16 or f16"):format(opt.dtype), 0) end
  model:to(opt.dtype)
end

local ids
if opt.chat then
  local messages = {}
  if opt.system then messages[#messages + 1] = { role = "system", content = opt.system } end
  messages[#messages + 1] = { role = "user", content = opt.prompt }
  ids = tok:apply_chat_template(messages, { add_generation_prompt = true })
else
  if opt.system then error("generate: system= needs chat=true (it is a chat message)", 0) end
  ids = tok:encode(opt.prompt) -- (with the special tokens the tokenizer adds, as transformers' tokenizer(prompt))
end

local settings = { max_new_tokens = opt.max_new_tokens, do_sample = opt.do_sample }
for _, k in ipairs { "temperature", "top_k", "top_p", "repetition_penalty" } do
  if given[k] then settings[k] = opt[k] end
end
zr.manual_seed(opt.seed)
local t0 = os.time()
local out = model:generate(ids, settings):tolist()[1]
local new = {}
for i = #ids + 1, #out do new[#new + 1] = out[i] end
print(tok:decode(new, true))
say("%d prompt tokens, %d new (%ds)", #ids, #new, os.time() - t0)
