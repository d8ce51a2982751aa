-- Qwen2 (Qwen2ForCausalLM) with Hugging Face semantics: Llama's architecture with biases on
-- q_proj, k_proj and v_proj (not o_proj or the MLP), Qwen2Config's defaults (num_key_value_heads
-- 32, max_position_embeddings 32768) and its window fields (use_sliding_window, sliding_window,
-- max_window_layers, layer_types).
-- zrun.models.llama computes it (by the config's model_type); this module names it. A window
-- shorter than a sequence masks through the attention's segments (the CPU, CUDA in bf16/f16 at
-- head_dim 64, 128, 256 or a multiple of 8 between 64 and 128; elsewhere refused in one line naming sliding_window and the length).
local llama = require "zrun.models.llama"

local M = {}

M.Qwen2ForCausalLM = llama.Qwen2ForCausalLM

-- A config table checked and normalised as transformers' Qwen2Config fills it (model_type "qwen2").
function M.normalize_config(cfg) return llama.normalize_config(cfg, "qwen2") end

-- A config from a config.json path or a HF model directory (as zr.models.llama.config).
M.config = llama.config

-- Builds the model and loads its Hugging Face weights (zr.models.llama.from_pretrained's options);
-- config.json's model_type must be "qwen2".
function M.from_pretrained(ref, opts) return llama.from_pretrained(ref, opts, "qwen2") end

return M
