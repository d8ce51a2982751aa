-- Llama's residual adds run with the RMSNorm after them as zr.add_rms_norm (within a layer with
-- post_attention_layernorm, and across layers: a layer's last add with the next input_layernorm or
-- the final norm). Checks which adds take it (hooks, ZeRO-3's Module.fetch and checkpointing keep
-- the module calls) and that every path gives the logits, loss and gradients of transformers'
-- decoder layer written out with the modules (f64).
local zr = require "zrun"
local T = zr.testing
local Module = require "zrun.nn.module"
local llama = zr.models.llama

local cfg = llama.config("zrun/tiny-llama")
cfg.num_hidden_layers, cfg.dtype = 3, "f64"
zr.manual_seed(23)
local ids = (zr.rand({ 2, 7 }) * 258):to("i64")

-- transformers' LlamaModel: h = h + attn(input_layernorm(h)); h = h + mlp(post_attention_layernorm(h))
-- per layer, then the final norm and lm_head; every module called as a module, every add separate.
local function reference(m)
  local md = m.model
  local h = md.embed_tokens(ids)
  local cos, sin = md:rope(ids:size(2), h:dtype(), h:device())
  for _, l in ipairs(md.layers) do
    h = h + l.self_attn(l.input_layernorm(h), cos, sin)
    h = h + l.mlp(l.post_attention_layernorm(h))
  end
  local logits = m.lm_head(md.norm(h))
  return logits, llama.causal_lm_loss(logits, ids)
end

-- The model's logits, loss and gradients, and how many times zr.add_rms_norm ran (forward and
-- backward: checkpointing recomputes).
local function run(m, fn)
  local real, calls = zr.add_rms_norm, 0
  zr.add_rms_norm = function(...) calls = calls + 1; return real(...) end
  m:zero_grad()
  local ok, logits, loss = pcall(function()
    local l, s = (fn or function() local o = m(ids, ids); return o.logits, o.loss end)()
    s:backward()
    return l, s
  end)
  zr.add_rms_norm = real
  if not ok then error(logits, 0) end
  local g = {}
  for n, p in m:named_parameters() do g[n] = p.grad:clone() end
  return logits, loss, g, calls
end

local model = llama.LlamaForCausalLM(cfg)
local want_logits, want_loss, want_g = run(model, function() return reference(model) end)

local function same(what, logits, loss, g)
  T.near(logits, want_logits, 1e-12, 1e-12, what .. ": logits")
  T.near(loss, want_loss, 1e-12, 1e-12, what .. ": loss")
  for n, w in pairs(want_g) do T.near(g[n], w, 1e-12, 1e-12, what .. ": grad of " .. n) end
end

T.test("llama: every residual add with its RMSNorm (2 per layer: post_attention, the next input or final norm)", function()
  local logits, loss, g, calls = run(model)
  T.eq(calls, 2 * cfg.num_hidden_layers, "add_rms_norm calls")
  same("fused", logits, loss, g)
end)

T.test("llama: gradient checkpointing fuses within each layer only (one zr.checkpoint output)", function()
  model:gradient_checkpointing_enable()
  local logits, loss, g, calls = run(model)
  rawset(model.model, "gradient_checkpointing", nil)
  -- each layer's post_attention add in the forward, again in backward's recomputation
  T.eq(calls, 2 * cfg.num_hidden_layers, "add_rms_norm calls, forward and recomputation")
  same("checkpointed", logits, loss, g)
end)

T.test("llama: a hooked layer is called as a module on the summed residual, a hooked norm as itself", function()
  local md, seen = model.model, {}
  local h1 = md.layers[2]:register_forward_hook(function(_, out) seen[#seen + 1] = out:size(3) end)
  local logits, loss, g, calls = run(model)
  h1:remove()
  T.eq(#seen, 1, "layer 2's hook ran")
  -- layer 2's input_layernorm (its input arrives summed) and layer 3's (layer 2's output too) are plain
  T.eq(calls, 2 * cfg.num_hidden_layers - 2, "add_rms_norm calls with layer 2 hooked")
  same("layer hooked", logits, loss, g)
  local ran = 0
  local h2 = md.norm:register_forward_pre_hook(function() ran = ran + 1 end)
  logits, loss, g, calls = run(model)
  h2:remove()
  T.eq(ran, 1, "the final norm's hook ran")
  T.eq(calls, 2 * cfg.num_hidden_layers - 1, "add_rms_norm calls with the final norm hooked")
  same("final norm hooked", logits, loss, g)
end)

T.test("llama: with ZeRO-3's Module.fetch set every norm and layer is called as a module", function()
  Module.fetch = function(p) return p end
  local ok, logits, loss, g, calls = pcall(run, model)
  Module.fetch = nil
  if not ok then error(logits, 0) end
  T.eq(calls, 0, "add_rms_norm calls under ZeRO-3")
  same("Module.fetch", logits, loss, g)
end)

T.done()
