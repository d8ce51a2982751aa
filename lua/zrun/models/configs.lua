-- Built-in model configurations (Hugging Face config.json fields), so models can be built and
-- planned with no files present. Values from the published configs of each model.
local llama3_rope = { rope_type = "llama3", factor = 32.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
  original_max_position_embeddings = 8192 }
local llama31_rope = { rope_type = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
  original_max_position_embeddings = 8192 }

local C = {}
C["meta-llama/Llama-3.2-1B"] = { model_type = "llama", hidden_size = 2048, intermediate_size = 8192,
  num_hidden_layers = 16, num_attention_heads = 32, num_key_value_heads = 8, head_dim = 64,
  vocab_size = 128256, rms_norm_eps = 1e-5, rope_theta = 500000.0, rope_scaling = llama3_rope,
  tie_word_embeddings = true, max_position_embeddings = 131072, bos_token_id = 128000, eos_token_id = 128001 }
C["meta-llama/Llama-3.2-3B"] = { model_type = "llama", hidden_size = 3072, intermediate_size = 8192,
  num_hidden_layers = 28, num_attention_heads = 24, num_key_value_heads = 8, head_dim = 128,
  vocab_size = 128256, rms_norm_eps = 1e-5, rope_theta = 500000.0, rope_scaling = llama3_rope,
  tie_word_embeddings = true, max_position_embeddings = 131072 }
C["meta-llama/Meta-Llama-3-8B"] = { model_type = "llama", hidden_size = 4096, intermediate_size = 14336,
  num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 8, vocab_size = 128256,
  rms_norm_eps = 1e-5, rope_theta = 500000.0, tie_word_embeddings = false, max_position_embeddings = 8192 }
C["meta-llama/Llama-3.1-8B"] = { model_type = "llama", hidden_size = 4096, intermediate_size = 14336,
  num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 8, vocab_size = 128256,
  rms_norm_eps = 1e-5, rope_theta = 500000.0, rope_scaling = llama31_rope, tie_word_embeddings = false,
  max_position_embeddings = 131072 }
C["meta-llama/Meta-Llama-3-70B"] = { model_type = "llama", hidden_size = 8192, intermediate_size = 28672,
  num_hidden_layers = 80, num_attention_heads = 64, num_key_value_heads = 8, vocab_size = 128256,
  rms_norm_eps = 1e-5, rope_theta = 500000.0, tie_word_embeddings = false, max_position_embeddings = 8192 }
C["TinyLlama/TinyLlama-1.1B-Chat-v1.0"] = { model_type = "llama", hidden_size = 2048, intermediate_size = 5632,
  num_hidden_layers = 22, num_attention_heads = 32, num_key_value_heads = 4, vocab_size = 32000,
  rms_norm_eps = 1e-5, rope_theta = 10000.0, tie_word_embeddings = false, max_position_embeddings = 2048 }
-- Mistral v0.3: no sliding window (config.json's "sliding_window": null, false here: MistralConfig's default is 4096)
C["mistralai/Mistral-7B-v0.3"] = { model_type = "mistral", hidden_size = 4096, intermediate_size = 14336,
  num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 8, vocab_size = 32768,
  rms_norm_eps = 1e-5, rope_theta = 1000000.0, sliding_window = false, tie_word_embeddings = false,
  max_position_embeddings = 32768, bos_token_id = 1, eos_token_id = 2 }
-- Qwen2.5: q/k/v biases (implied by model_type), the window off (use_sliding_window false)
C["Qwen/Qwen2.5-0.5B"] = { model_type = "qwen2", hidden_size = 896, intermediate_size = 4864,
  num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2, vocab_size = 151936,
  rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = true, max_position_embeddings = 32768,
  use_sliding_window = false, sliding_window = 32768, max_window_layers = 24, bos_token_id = 151643,
  eos_token_id = 151643 }
C["Qwen/Qwen2.5-7B"] = { model_type = "qwen2", hidden_size = 3584, intermediate_size = 18944,
  num_hidden_layers = 28, num_attention_heads = 28, num_key_value_heads = 4, vocab_size = 152064,
  rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = false, max_position_embeddings = 131072,
  use_sliding_window = false, sliding_window = 131072, max_window_layers = 28, bos_token_id = 151643,
  eos_token_id = 151643 }
-- Phi-3-mini-4k: fused qkv_proj / gate_up_proj (3,821,079,552 parameters), sliding_window 2047 (masked in longer
-- sequences, as transformers masks them)
C["microsoft/Phi-3-mini-4k-instruct"] = { model_type = "phi3", hidden_size = 3072, intermediate_size = 8192,
  num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 32, vocab_size = 32064,
  rms_norm_eps = 1e-5, rope_theta = 10000.0, tie_word_embeddings = false, max_position_embeddings = 4096,
  original_max_position_embeddings = 4096, sliding_window = 2047, bos_token_id = 1, eos_token_id = 32000,
  pad_token_id = 32000 }
-- Qwen3 (the published config.json files: q_norm / k_norm implied by model_type, head_dim 128, no biases, the
-- window off: "sliding_window": null); 0.6B, 1.7B and 4B tie the head to the embedding, 8B does not
for name, d in pairs { ["0.6B"] = { 1024, 3072, 28, 16, true }, ["1.7B"] = { 2048, 6144, 28, 16, true },
  ["4B"] = { 2560, 9728, 36, 32, true }, ["8B"] = { 4096, 12288, 36, 32, false } } do
  C["Qwen/Qwen3-" .. name] = { model_type = "qwen3", hidden_size = d[1], intermediate_size = d[2],
    num_hidden_layers = d[3], num_attention_heads = d[4], num_key_value_heads = 8, head_dim = 128,
    vocab_size = 151936, rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = d[5],
    max_position_embeddings = 40960, use_sliding_window = false, sliding_window = false, max_window_layers = d[3],
    attention_bias = false, bos_token_id = 151643, eos_token_id = 151645 }
end
-- A tiny Llama for CPU runs and tests: GQA, llama3 rope scaling, untied embeddings.
C["zrun/tiny-llama"] = { model_type = "llama", hidden_size = 64, intermediate_size = 176,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 16,
  vocab_size = 259, rms_norm_eps = 1e-5, rope_theta = 10000.0, tie_word_embeddings = false,
  rope_scaling = { rope_type = "llama3", factor = 4.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
    original_max_position_embeddings = 32 }, max_position_embeddings = 512 }
for _, n in ipairs { "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl" } do
  local dims = { gpt2 = { 768, 12, 12 }, ["gpt2-medium"] = { 1024, 24, 16 }, ["gpt2-large"] = { 1280, 36, 20 },
    ["gpt2-xl"] = { 1600, 48, 25 } }
  local d = dims[n]
  C[n] = { model_type = "gpt2", n_embd = d[1], n_layer = d[2], n_head = d[3], vocab_size = 50257,
    n_positions = 1024, layer_norm_epsilon = 1e-5, tie_word_embeddings = true }
  C["openai-community/" .. n] = C[n]
end
return C
