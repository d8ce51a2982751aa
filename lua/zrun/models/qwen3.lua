-- Qwen3 (Qwen3ForCausalLM) with Hugging Face semantics: Llama's architecture with q_norm and k_norm
-- (an RMSNorm over head_dim of each query and key head, after the projection and before the rope),
-- an explicit head_dim (Qwen3Config's default 128, not hidden_size / heads), attention_bias on
-- q/k/v/o (default false), Qwen3Config's defaults (num_key_value_heads 32, max_position_embeddings
-- 32768) and Qwen2's window fields (use_sliding_window, sliding_window, max_window_layers, layer_types).
-- zrun.models.llama computes it (by the config's model_type); this module names it. A window
-- shorter than a sequence is refused at forward time, naming sliding_window and the length.
local llama = require "zrun.models.llama"

local M = {}

M.Qwen3ForCausalLM = llama.Qwen3ForCausalLM

-- A config table checked and normalised as transformers' Qwen3Config fills it (model_type "qwen3").
function M.normalize_config(cfg) return llama.normalize_config(cfg, "qwen3") end

-- A config from a config.json path or a HF model directory (as zr.models.llama.config).
M.config = llama.config

-- Builds the model and loads its Hugging Face weights (zr.models.llama.from_pretrained's options);
-- config.json's model_type must be "qwen3".
function M.from_pretrained(ref, opts) return llama.from_pretrained(ref, opts, "qwen3") end

return M
