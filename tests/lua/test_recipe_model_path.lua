-- The fine-tuning recipe's real path (not the fallback): a Hugging Face model directory with a
-- tokenizer.json, a WikiText file, configs/ds_config.json (bf16, ZeRO-2, accumulation 8).
local zr = require "zrun"
local T = zr.testing
local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local tokdir = data .. "/tokenizers/tinyllama-1.1b-chat-v1.0"
local wiki = data .. "/wikitext-2-raw/wiki.valid.raw"
if not io.open(tokdir .. "/tokenizer.json") or not io.open(wiki) then
  T.skip("recipe with a model directory", "data not found at " .. data)
  return
end
local dir = os.tmpname()
os.remove(dir)

T.test("finetune_llama.lua trains a model directory on WikiText with ds_config.json", function()
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.vocab_size = 32000
  zr.manual_seed(2)
  zr.models.llama.LlamaForCausalLM(cfg):save_pretrained(dir .. "/model")
  assert(os.execute(("cp %s/tokenizer.json %s/tokenizer_config.json %s/model/"):format(tokdir, tokdir, dir)) == 0)
  local z = os.getenv("ZRUN_BIN") or "./zrun"
  local cmd = ("%s recipes/finetune_llama.lua model=%s/model data=%s max_steps=1 block_size=48 eval_steps=1 validation_split_percentage=1 output_dir=%s/out 2>&1")
    :format(z, dir, wiki, dir)
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  assert(out:find("done: 1 steps", 1, true), out)
  assert(not out:find("falling back", 1, true), "the recipe fell back to the built-in model:\n" .. out)
  assert(out:find("ZeRO stage 2, bf16", 1, true), out)
  assert(out:find("no train split in " .. wiki, 1, true), out)
  assert(out:find("validation perplexity [%d.]+ %-> [%d.]+; model saved to " .. dir .. "/out"), out)
  local m2 = zr.models.llama.from_pretrained(dir .. "/out")
  T.eq(m2.config.vocab_size, 32000)
  assert(io.open(dir .. "/out/tokenizer.json"), "the tokenizer is saved beside the model")
  local m = io.open(dir .. "/out/metrics.jsonl")
  assert(m, "no metrics.jsonl written")
  m:close()
end)

-- A GPT-2 directory (config.json's model_type "gpt2", GPT-2's tokenizer): loaded as GPT-2, as
-- transformers' AutoModelForCausalLM in run_clm.py does (zrun before: "llama config: model_type is
-- \"gpt2\", not \"llama\"").
local gpt2tok = data .. "/tokenizers/gpt2"
T.test("finetune_llama.lua trains a GPT-2 directory (model_type gpt2)", function()
  if not io.open(gpt2tok .. "/tokenizer.json") then return T.skip("gpt2 recipe", "no " .. gpt2tok) end
  zr.manual_seed(3)
  zr.models.gpt2.GPT2LMHeadModel({ n_embd = 8, n_layer = 1, n_head = 2, vocab_size = 50257, n_positions = 64 })
    :save_pretrained(dir .. "/gpt2")
  assert(os.execute(("cp %s/tokenizer.json %s/tokenizer_config.json %s/gpt2/"):format(gpt2tok, gpt2tok, dir)) == 0)
  local z = os.getenv("ZRUN_BIN") or "./zrun"
  local cmd = ("%s recipes/finetune_llama.lua model=%s/gpt2 data=%s max_steps=1 block_size=32 eval_steps=1 " ..
    "validation_split_percentage=1 --config configs/zero2.json per_device_train_batch_size=2 gradient_accumulation_steps=1 " ..
    "output_dir=%s/gout 2>&1"):format(z, dir, wiki, dir)
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  assert(out:find("done: 1 steps", 1, true), out)
  assert(not out:find("falling back", 1, true), "the recipe fell back to the built-in model:\n" .. out)
  local m = zr.models.from_pretrained(dir .. "/gout")
  T.eq(m.__name, "GPT2LMHeadModel")
end)

T.test("zr.models.from_pretrained: the family config.json's model_type names, another refused in one line", function()
  T.eq(zr.models.from_pretrained(dir .. "/model").__name, "LlamaForCausalLM")
  local f = assert(io.open(dir .. "/model/config.json", "rb"))
  local c = require("cjson").decode(f:read("*a"))
  f:close()
  c.model_type = "mistral" -- (Llama's code, its own class)
  T.write_file(dir .. "/model/config.json", require("cjson").encode(c))
  T.eq(zr.models.from_pretrained(dir .. "/model").__name, "MistralForCausalLM")
  c.model_type = "gemma"
  T.write_file(dir .. "/model/config.json", require("cjson").encode(c))
  T.raises(function() zr.models.from_pretrained(dir .. "/model") end,
    'from_pretrained: model_type "gemma" is not implemented; zrun loads the model types llama, mistral, qwen2, qwen3, phi3, gemma3_text and gpt2')
end)

os.execute("rm -rf '" .. dir .. "'")
T.done()
