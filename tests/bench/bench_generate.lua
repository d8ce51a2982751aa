-- model:generate with the KV cache against without it (use_cache = false: the whole rows' forward every
-- step), greedy, random weights, f32 on the CPU (or device=cuda): GPT-2 small's shape (124M) and a
-- Llama of TinyLlama's width with 4 layers. Prints seconds and tokens/s of each and the speed-up.
--   ./zrun tests/bench/bench_generate.lua [prompt=32] [new=64] [device=cpu]
local zr = require "zrun"
local C = zr._C
local cli = require("zrun.argparse").new("tests/bench/bench_generate.lua", "generate: cache vs no cache")
cli:option("prompt", 32, "prompt tokens"):option("new", 64, "new tokens"):option("device", "cpu", "cpu | cuda")
local opt = cli:parse(arg)

local MODELS = {
  { "gpt2 (124M)", function(dev)
    return zr.models.gpt2.GPT2LMHeadModel { vocab_size = 50257, n_positions = 1024, n_embd = 768, n_layer = 12, n_head = 12,
      resid_pdrop = 0, embd_pdrop = 0, attn_pdrop = 0, device = dev }
  end },
  { "llama (2048 wide, 4 layers, GQA 32/4)", function(dev)
    return zr.models.llama.LlamaForCausalLM { vocab_size = 32000, hidden_size = 2048, intermediate_size = 5632,
      num_hidden_layers = 4, num_attention_heads = 32, num_key_value_heads = 4, max_position_embeddings = 2048, device = dev }
  end },
}

for _, m in ipairs(MODELS) do
  zr.manual_seed(0)
  local model = m[2](opt.device)
  local ids = {}
  for i = 1, opt.prompt do ids[i] = 100 + i end
  local o = { max_new_tokens = opt.new, eos_token_id = false }
  model:generate(ids, { max_new_tokens = 2, eos_token_id = false }) -- (warm-up)
  local t0 = C.now()
  local a = model:generate(ids, o)
  local t1 = C.now()
  o.use_cache = false
  local b = model:generate(ids, o)
  local t2 = C.now()
  local same = a:to("cpu"):tolist()[1]
  local other = b:to("cpu"):tolist()[1]
  local eq = #same == #other
  for i = 1, #same do eq = eq and same[i] == other[i] end
  print(("%-40s %d+%d tokens: cache %.2f s (%.1f tok/s), none %.2f s (%.1f tok/s): %.1fx; same ids: %s"):format(
    m[1], opt.prompt, opt.new, t1 - t0, opt.new / (t1 - t0), t2 - t1, opt.new / (t2 - t1), (t2 - t1) / (t1 - t0), tostring(eq)))
end
