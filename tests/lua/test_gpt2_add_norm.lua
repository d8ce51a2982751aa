-- GPT-2's residual adds run with the LayerNorm after them as zr.add_layer_norm (within a block, and
-- across blocks: a block's last add with the next ln_1 or ln_f). Checks which adds take it (hooks,
-- ZeRO-3's Module.fetch and checkpointing keep the module calls) and that every path gives the
-- logits, loss and gradients of transformers' block written out with the modules (f64).
local zr = require "zrun"
local T = zr.testing
local Module = require "zrun.nn.module"
local gpt2 = zr.models.gpt2

local cfg = { n_embd = 12, n_layer = 3, n_head = 2, vocab_size = 29, n_positions = 16, dtype = "f64" }
zr.manual_seed(21)
local ids = (zr.rand({ 2, 7 }) * 28):to("i64")

-- transformers' GPT2Model: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)) per block, then ln_f; the
-- tied head; every module called as a module, every add separate.
local function reference(m)
  local tr = m.transformer
  local x = tr.wte(ids) + tr.wpe(zr.arange(ids:size(2)))
  for _, b in ipairs(tr.h) do
    x = x + b.attn(b.ln_1(x))
    x = x + b.mlp(b.ln_2(x))
  end
  local logits = zr.linear(tr.ln_f(x), tr.wte.weight)
  return logits, zr.models.llama.causal_lm_loss(logits, ids)
end

-- The model's logits, loss and gradients, and how many times zr.add_layer_norm ran (forward and
-- backward: checkpointing recomputes).
local function run(m, fn)
  local real, calls = zr.add_layer_norm, 0
  zr.add_layer_norm = function(...) calls = calls + 1; return real(...) end
  m:zero_grad()
  local ok, logits, loss = pcall(function()
    local l, s = (fn or function() local o = m(ids, ids); return o.logits, o.loss end)()
    s:backward()
    return l, s
  end)
  zr.add_layer_norm = real
  if not ok then error(logits, 0) end
  local g = {}
  for n, p in m:named_parameters() do g[n] = p.grad:clone() end
  return logits, loss, g, calls
end

local model = gpt2.GPT2LMHeadModel(cfg)
local want_logits, want_loss, want_g = run(model, function() return reference(model) end)

local function same(what, logits, loss, g)
  T.near(logits, want_logits, 1e-12, 1e-12, what .. ": logits")
  T.near(loss, want_loss, 1e-12, 1e-12, what .. ": loss")
  for n, w in pairs(want_g) do T.near(g[n], w, 1e-12, 1e-12, what .. ": grad of " .. n) end
end

T.test("gpt2: every residual add with its LayerNorm (2 per block: ln_2, the next ln_1 or ln_f)", function()
  local logits, loss, g, calls = run(model)
  T.eq(calls, 2 * cfg.n_layer, "add_layer_norm calls")
  same("fused", logits, loss, g)
end)

T.test("gpt2: gradient checkpointing fuses within each block only (one zr.checkpoint output)", function()
  model:gradient_checkpointing_enable()
  local logits, loss, g, calls = run(model)
  rawset(model.transformer, "gradient_checkpointing", nil)
  -- the forward's ln_2 of each block; backward's recomputation calls it again
  T.eq(calls, 2 * cfg.n_layer, "add_layer_norm calls, forward and recomputation")
  same("checkpointed", logits, loss, g)
end)

T.test("gpt2: a hooked block is called as a module on the summed residual, a hooked norm as itself", function()
  local tr, seen = model.transformer, {}
  local h1 = tr.h[2]:register_forward_hook(function(_, out) seen[#seen + 1] = out:size(3) end)
  local logits, loss, g, calls = run(model)
  h1:remove()
  T.eq(#seen, 1, "block 2's hook ran")
  -- block 2's ln_1 (its input arrives summed) and block 3's ln_1 (block 2's output too) are plain
  T.eq(calls, 2 * cfg.n_layer - 2, "add_layer_norm calls with block 2 hooked")
  same("block hooked", logits, loss, g)
  local ran = 0
  local h2 = tr.ln_f:register_forward_pre_hook(function() ran = ran + 1 end)
  logits, loss, g, calls = run(model)
  h2:remove()
  T.eq(ran, 1, "ln_f's hook ran")
  T.eq(calls, 2 * cfg.n_layer - 1, "add_layer_norm calls with ln_f hooked")
  same("ln_f hooked", logits, loss, g)
end)

T.test("gpt2: with ZeRO-3's Module.fetch set every norm and block is called as a module", function()
  Module.fetch = function(p) return p end
  local ok, logits, loss, g, calls = pcall(run, model)
  Module.fetch = nil
  if not ok then error(logits, 0) end
  T.eq(calls, 0, "add_layer_norm calls under ZeRO-3")
  same("Module.fetch", logits, loss, g)
end)

T.done()
