-- Llama's residual adds run with the RMSNorm after them as zr.add_rms_norm (within a layer with
-- post_attention_layernorm, and across layers: a layer's last add with the next input_layernorm or
-- the final norm). Checks which adds take it (hooks of a module's own or global ones other than
-- ZeRO-3's kind, and checkpointing, keep the module calls) and that every path gives the logits, loss and gradients of transformers'
-- decoder layer written out with the modules (f64).
local zr = require "zrun"
local AN = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "add_norm_common.lua")
local llama = zr.models.llama

local cfg = llama.config("zrun/tiny-llama")
cfg.num_hidden_layers, cfg.dtype = 3, "f64"
zr.manual_seed(23)
local ids = (zr.rand({ 2, 7 }) * 258):to("i64")
local model = llama.LlamaForCausalLM(cfg)
local md = model.model

-- transformers' LlamaModel: h = h + attn(input_layernorm(h)); h = h + mlp(post_attention_layernorm(h))
-- per layer, then the final norm and lm_head; every module called as a module, every add separate.
local function reference()
  local h = md.embed_tokens(ids)
  local cos, sin = md:rope(ids:size(2), h:dtype(), h:device())
  for _, l in ipairs(md.layers) do
    h = h + l.self_attn(l.input_layernorm(h), cos, sin)
    h = h + l.mlp(l.post_attention_layernorm(h))
  end
  local logits = model.lm_head(md.norm(h))
  return logits, llama.causal_lm_loss(logits, ids)
end

AN.check { name = "llama", op = "add_rms_norm", model = model, ids = ids, reference = reference,
  blocks = md.layers, final_norm = md.norm, ckpt_owner = md }
zr.testing.done()
