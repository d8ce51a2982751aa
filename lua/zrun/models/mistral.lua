-- Mistral (MistralForCausalLM) with Hugging Face semantics: Llama's architecture without biases,
-- MistralConfig's defaults (num_key_value_heads 8, max_position_embeddings 131072, sliding_window
-- 4096: a JSON null or false is none).
-- zrun.models.llama computes it (by the config's model_type); this module names it. A window
-- shorter than a sequence masks through the attention's segments (the CPU, CUDA in bf16/f16 at
-- head_dim 64, 128, 256 or a multiple of 8 between 64 and 128; elsewhere refused in one line naming sliding_window and the length).
local llama = require "zrun.models.llama"

local M = {}

M.MistralForCausalLM = llama.MistralForCausalLM

-- A config table checked and normalised as transformers' MistralConfig fills it (model_type "mistral").
function M.normalize_config(cfg) return llama.normalize_config(cfg, "mistral") end

-- A config from a config.json path or a HF model directory (as zr.models.llama.config).
M.config = llama.config

-- Builds the model and loads its Hugging Face weights (zr.models.llama.from_pretrained's options);
-- config.json's model_type must be "mistral".
function M.from_pretrained(ref, opts) return llama.from_pretrained(ref, opts, "mistral") end

return M
