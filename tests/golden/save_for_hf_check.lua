-- Writes model directories with zrun's save_pretrained for tests/golden/check_hf_save.py, which
-- loads each with transformers and compares its logits with zrun's:
--   ./zrun tests/golden/save_for_hf_check.lua DIR        (then, where transformers is installed)
--   python3 tests/golden/check_hf_save.py DIR
-- DIR/<name>/ holds config.json + model.safetensors; DIR/expected.safetensors holds, per name,
-- "<name>.input_ids" and zrun's "<name>.logits". The configs cover every rope type and option
-- zrun implements, so the check proves transformers reads zrun's config.json as zrun does. DIR/generation/
-- holds a model directory with its own generation_config.json (src) and zrun's save of it (out).
local zr = require "zrun"
local dir = assert(arg[1], "usage: zrun tests/golden/save_for_hf_check.lua DIR")

local llama = { model_type = "llama", hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2,
  num_attention_heads = 4, vocab_size = 61, rms_norm_eps = 1e-5, max_position_embeddings = 128 }
local function with(base, extra)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(extra) do c[k] = v end
  return c
end

local models = {
  -- Llama 3 style: theta 500000, llama3 scaling, GQA, untied head (legacy keys in the table)
  llama3 = { zr.models.llama.LlamaForCausalLM, with(llama, { num_key_value_heads = 2, head_dim = 16,
    rope_theta = 500000.0, rope_scaling = { rope_type = "llama3", factor = 8.0, low_freq_factor = 1.0,
      high_freq_factor = 4.0, original_max_position_embeddings = 16 } }) },
  -- transformers 5 layout in the table: default rope with a non-default theta, tied head
  llama_default = { zr.models.llama.LlamaForCausalLM, with(llama, { tie_word_embeddings = true,
    rope_parameters = { rope_type = "default", rope_theta = 250000.0 } }) },
  llama_linear_bias = { zr.models.llama.LlamaForCausalLM, with(llama, { attention_bias = true, mlp_bias = true,
    rope_parameters = { rope_type = "linear", factor = 4.0, rope_theta = 10000.0 } }) },
  -- Mistral v0.3 style: no window (sliding_window null), theta 1e6, GQA; and a window longer than the rows
  mistral_no_window = { zr.models.mistral.MistralForCausalLM, with(llama, { model_type = "mistral",
    num_key_value_heads = 2, sliding_window = false, rope_parameters = { rope_type = "default", rope_theta = 1e6 } }) },
  mistral_window = { zr.models.mistral.MistralForCausalLM, with(llama, { model_type = "mistral",
    num_key_value_heads = 2, head_dim = 12, sliding_window = 64 }) },
  -- Qwen2.5 style: q/k/v biases, tied head, the window fields off
  qwen2 = { zr.models.qwen2.Qwen2ForCausalLM, with(llama, { model_type = "qwen2", num_key_value_heads = 2,
    tie_word_embeddings = true, use_sliding_window = false, sliding_window = 32768, max_window_layers = 21,
    rope_theta = 1e6 }) },
  -- Qwen3-0.6B style: q_norm / k_norm, head_dim 16 (not hidden_size / heads = 8), GQA, tied, the window off; and
  -- biases on q/k/v/o with an untied head and the window on from layer 1 (longer than the rows)
  qwen3 = { zr.models.qwen3.Qwen3ForCausalLM, with(llama, { model_type = "qwen3", num_key_value_heads = 2, head_dim = 16,
    tie_word_embeddings = true, use_sliding_window = false, sliding_window = false, max_window_layers = 28,
    rope_theta = 1e6 }) },
  qwen3_bias_window = { zr.models.qwen3.Qwen3ForCausalLM, with(llama, { model_type = "qwen3", num_key_value_heads = 2,
    head_dim = 8, attention_bias = true, use_sliding_window = true, sliding_window = 64, max_window_layers = 1 }) },
  gpt2 = { zr.models.gpt2.GPT2LMHeadModel, { model_type = "gpt2", n_embd = 32, n_layer = 2, n_head = 4,
    vocab_size = 61, n_positions = 64 } },
  gpt2_exact_gelu = { zr.models.gpt2.GPT2LMHeadModel, { n_embd = 32, n_layer = 2, n_head = 4,
    vocab_size = 61, n_positions = 64, activation_function = "gelu", n_inner = 48 } },
  -- the other GPT2Config fields zrun implements: an untied head, unscaled and layer-scaled attention, quick_gelu
  gpt2_untied = { zr.models.gpt2.GPT2LMHeadModel, { n_embd = 32, n_layer = 2, n_head = 4, vocab_size = 61,
    n_positions = 64, tie_word_embeddings = false, scale_attn_weights = false, scale_attn_by_inverse_layer_idx = true,
    activation_function = "quick_gelu", layer_norm_epsilon = 1e-3 } },
}

local expected = {}
zr.manual_seed(5)
for name, m in pairs(models) do
  local model = m[1](m[2])
  zr.no_grad(function()
    for n, p in model:named_parameters() do
      if n:match("%.bias$") then p:normal_(0, 0.05) end -- biases start at zero; make them matter
      if n:match("[qk]_norm%.weight$") then p:normal_(1, 0.3) end -- (Qwen3's start at ones)
    end
  end)
  model:eval()
  model:save_pretrained(dir .. "/" .. name)
  local ids = (zr.rand({ 2, 40 }) * 60):to("i64")
  expected[name .. ".input_ids"] = ids
  expected[name .. ".logits"] = zr.no_grad(function() return model(ids).logits end):contiguous()
end
-- generation_config.json through from_pretrained -> save_pretrained: DIR/generation/src holds TinyLlama-chat's
-- settings with sampling (as a hub model's), DIR/generation/out what zrun writes after loading it
local gsrc = dir .. "/generation/src"
zr.models.llama.LlamaForCausalLM(models.llama3[2]):save_pretrained(gsrc)
zr.testing.write_file(gsrc .. "/generation_config.json", '{"bos_token_id": 1, "do_sample": true, "eos_token_id": [2, 5], ' ..
  '"max_length": 2048, "pad_token_id": 0, "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.35.0"}')
zr.models.llama.from_pretrained(gsrc):save_pretrained(dir .. "/generation/out")
-- GPT-2's tokenizer saved alone (its tokenizer_config.json names no class; config.json beside it does): DIR/tokenizer/
-- holds zrun's save and source.txt the folder it came from (test data: ZRUN_TEST_DATA, default ../shared/data)
local tokdir = (os.getenv("ZRUN_TEST_DATA") or "../shared/data") .. "/tokenizers/gpt2"
if zr._C.path_type(tokdir .. "/tokenizer.json") == "file" then
  zr.tokenizers.load(tokdir):save_pretrained(dir .. "/tokenizer")
  zr.testing.write_file(dir .. "/tokenizer/source.txt", tokdir)
end
zr.save_safetensors(dir .. "/expected.safetensors", expected)
print("wrote " .. dir)
