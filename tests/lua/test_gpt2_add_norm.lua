-- GPT-2's residual adds run with the LayerNorm after them as zr.add_layer_norm (within a block, and
-- across blocks: a block's last add with the next ln_1 or ln_f). Checks which adds take it (hooks
-- of a module's own or global ones other than ZeRO-3's kind, and checkpointing, keep the module calls) and that every path gives the
-- logits, loss and gradients of transformers' block written out with the modules (f64).
local zr = require "zrun"
local AN = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "add_norm_common.lua")
local gpt2 = zr.models.gpt2

local cfg = { n_embd = 12, n_layer = 3, n_head = 2, vocab_size = 29, n_positions = 16, dtype = "f64" }
zr.manual_seed(21)
local ids = (zr.rand({ 2, 7 }) * 28):to("i64")
local model = gpt2.GPT2LMHeadModel(cfg)
local tr = model.transformer

-- transformers' GPT2Model: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)) per block, then ln_f; the
-- tied head; every module called as a module, every add separate.
local function reference()
  local x = tr.wte(ids) + tr.wpe(zr.arange(ids:size(2)))
  for _, b in ipairs(tr.h) do
    x = x + b.attn(b.ln_1(x))
    x = x + b.mlp(b.ln_2(x))
  end
  local logits = zr.linear(tr.ln_f(x), tr.wte.weight)
  return logits, zr.models.llama.causal_lm_loss(logits, ids)
end

AN.check { name = "gpt2", op = "add_layer_norm", model = model, ids = ids, reference = reference,
  blocks = tr.h, final_norm = tr.ln_f, ckpt_owner = tr }
zr.testing.done()
