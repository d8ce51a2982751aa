-- Gemma 3's residual adds run with the RMSNorm after them as zr.add_rms_norm with unit_offset (within a layer with
-- pre_feedforward_layernorm, and across layers: a layer's last add with the next input_layernorm or the final
-- norm), as Llama's do (add_norm_common.lua's checks: which adds take it with hooks, checkpointing, global hooks),
-- against transformers' Gemma3DecoderLayer written out with the modules (f64), every add separate.
local zr = require "zrun"
local cjson = require "cjson"
local AN = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "add_norm_common.lua")
local llama = zr.models.llama
local gemma3 = zr.models.gemma3

local f = assert(io.open("tests/golden/gemma3_a.config.json"))
local cfg = cjson.decode(f:read("a"))
f:close()
cfg.dtype = "f64" -- (3 layers, sliding and full, window 8: rows of 7 tokens attend causally)
zr.manual_seed(29)
local model = gemma3.Gemma3ForCausalLM(cfg)
for n, p in model:named_parameters() do -- the norms' weights away from their zero start
  if n:match("norm%.weight$") then zr.no_grad(function() p:copy_(zr.randn(p:shape(), { dtype = "f64" }) * 0.3) end) end
end
local ids = (zr.rand({ 2, 7 }) * 100):to("i64")
local md = model.model

local function reference()
  local h = md:embed(ids)
  for i, l in ipairs(md.layers) do
    local cos, sin = md:rope(ids:size(2), h:dtype(), h:device(), nil, md:layer_rope(i))
    h = h + l.post_attention_layernorm(l.self_attn(l.input_layernorm(h), cos, sin))
    h = h + l.post_feedforward_layernorm(l.mlp(l.pre_feedforward_layernorm(h)))
  end
  local logits = zr.linear(md.norm(h), model:output_weight()) -- (tied: the embedding)
  return logits, llama.causal_lm_loss(logits, ids)
end

AN.check { name = "gemma3", op = "add_rms_norm", model = model, ids = ids, reference = reference,
  blocks = md.layers, final_norm = md.norm, ckpt_owner = md }
zr.testing.done()
