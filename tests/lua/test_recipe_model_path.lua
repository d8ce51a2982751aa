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

os.execute("rm -rf '" .. dir .. "'")
T.done()
