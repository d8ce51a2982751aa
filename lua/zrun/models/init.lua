-- zr.models: model families and built-in configs.
local M = {}
setmetatable(M, { __index = function(t, k)
  local ok, mod = pcall(require, "zrun.models." .. k)
  if ok then rawset(t, k, mod); return mod end
  error(mod, 2)
end })

-- config.json's model_type -> the family that loads it (transformers' AutoModelForCausalLM mapping, for
-- the types zrun implements; Mistral, Qwen2 and Qwen3 are Llama's code, whose from_pretrained picks their class).
-- A config without model_type is read by its fields: n_embd is GPT-2's.
local FAMILIES = { llama = "llama", mistral = "llama", qwen2 = "llama", qwen3 = "llama", phi3 = "phi3", gpt2 = "gpt2",
  gemma3_text = "gemma3", gemma3 = "gemma3" } -- (gemma3, the multimodal config: refused there, saying which Gemma 3 loads)

-- transformers' AutoModelForCausalLM.from_pretrained: the model directory (or cached hub id) loaded by
-- the family its config.json's model_type names, opts as that family's from_pretrained. Another model
-- type is refused in one line.
function M.from_pretrained(ref, opts)
  local cfg = require("zrun.hf").read_config(ref, opts and { revision = opts.revision, cache_dir = opts.cache_dir })
  local t = cfg.model_type or (cfg.n_embd and "gpt2" or "llama")
  local family = FAMILIES[t]
  if not family then
    error(("from_pretrained: model_type %q is not implemented; zrun loads the model types %s"):format(
      tostring(t), require("zrun.models.hf_config").MODEL_TYPES), 0)
  end
  return M[family].from_pretrained(ref, opts)
end
return M
