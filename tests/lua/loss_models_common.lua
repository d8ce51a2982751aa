-- Shared by tests/lua/test_models_ce_inplace.lua and test_models_chunked_loss.lua: the tiny causal LMs whose loss
-- paths they compare, a batch, and the gradients taken off a model.
--   local LM = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "loss_models_common.lua")
local zr = require "zrun"
local llama, gpt2 = zr.models.llama, zr.models.gpt2
local M = {}

-- A 2-layer tiny Llama (tied or not) and a 2-layer GPT-2 of 61 tokens, seeded alike, in dtype (default f32).
function M.llama_model(tied, dtype)
  local cfg = llama.config("zrun/tiny-llama")
  cfg.num_hidden_layers, cfg.tie_word_embeddings, cfg.dtype = 2, tied, dtype or "f32"
  zr.manual_seed(3)
  return llama.LlamaForCausalLM(cfg)
end
function M.gpt2_model(dtype)
  zr.manual_seed(3)
  return gpt2.GPT2LMHeadModel { n_embd = 16, n_layer = 2, n_head = 2, vocab_size = 61, n_positions = 16,
    dtype = dtype or "f32" }
end
-- Input ids (3, 11) below V, and labels: one ignored (as the collator pads), and with prompt each row's first 5 too.
function M.batch(V, s, prompt)
  zr.manual_seed(100 + s)
  local ids = (zr.rand({ 3, 11 }) * (V - 1)):to("i64")
  local labels = ids:clone()
  labels[2][4] = -100
  if prompt then for r = 1, 3 do for t = 1, 5 do labels[r][t] = -100 end end end
  return ids, labels
end
function M.vocab(m) return m.config.vocab_size end
-- ids and labels (B, T) right-padded to rows of lens[b] tokens (pad id 0, labels -100 there), as the collator pads
-- them: {input_ids, labels, attention_mask}.
function M.padded(ids, labels, lens)
  local mask = {}
  for r = 1, ids:size(1) do
    mask[r] = {}
    for t = 1, ids:size(2) do
      mask[r][t] = t <= lens[r] and 1 or 0
      if t > lens[r] then ids[r][t], labels[r][t] = 0, -100 end
    end
  end
  return { input_ids = ids, labels = labels, attention_mask = zr.tensor(mask, { dtype = "i64" }) }
end
-- Each parameter's gradient (cloned), the model's cleared.
function M.grads(m)
  local g = {}
  for n, p in m:named_parameters() do g[n] = p.grad:clone(); p.grad = nil end
  return g
end

return M
