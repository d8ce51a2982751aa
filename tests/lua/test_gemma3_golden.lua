-- Gemma 3 text models (Gemma3ForCausalLM, model_type "gemma3_text") against Hugging Face transformers, from golden
-- files written by tests/golden/make_gemma3_golden.py (transformers 5.17, float32, eager attention, the norm weights
-- drawn at random): gemma3_a (tied; query_pre_attn_scalar 24 at head_dim 32; a window of 8 over 24 tokens in every
-- other layer; the full layers' rope linear x4 on theta 1e6, the sliding ones' the local base 1e4; GELU-tanh; a
-- padding token in the batch) and gemma3_b (untied; attention biases; the erf GELU; layer_types given). Each is built
-- from the config table and loaded with from_pretrained from transformers 5's and 4's config.json layouts, and
-- checked as test_llama_golden.lua checks Llama, with its tolerances (logits 2e-5 abs + 1e-4 rel, loss 1e-5,
-- gradients 1e-5 + 1e-4 rel, 5 AdamW steps). The comparison must fail where one of Gemma's differences is taken
-- away. Then one Gemma3RMSNorm in bfloat16 against transformers' bits (one rounding of x_hat * (1 + w)), the
-- config's refusals, and save_pretrained's config.json read back.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "golden_parity.lua")
local gemma3 = zr.models.gemma3
local weights, read = GP.weights, T.read_file

local GOLDEN = "tests/golden/"
local tmp = os.tmpname()
os.remove(tmp)

local golden = {}
for _, name in ipairs { "gemma3_a", "gemma3_b" } do
  golden[name] = GP.parity(tmp, name, gemma3.Gemma3ForCausalLM, function(dir) return zr.models.from_pretrained(dir) end,
    function(m) T.eq(m.__name, "Gemma3ForCausalLM", "class from model_type") end)
end

-- The parity must be able to fail on what it exists for: each of Gemma's differences from Llama taken away
-- moves the logits far past the tolerance.
-- golden file NAME's model from its config.json (edit(cfg) first, when given) with the golden weights
local function golden_model(name, edit)
  local cfg = cjson.decode(read(GOLDEN .. name .. ".config.json"))
  if edit then edit(cfg) end
  local model = gemma3.Gemma3ForCausalLM(cfg)
  model:load_state_dict(weights(golden[name], model), true)
  return model
end
local function wrong(name, what, edit, edit_model)
  GP.fails_with(name, what, golden[name], function()
    local model = golden_model(name, edit)
    if edit_model then edit_model(model) end
    return model
  end)
end
wrong("gemma3_a", "the scale 1/sqrt(head_dim)", function(c) c.query_pre_attn_scalar = 32 end)
wrong("gemma3_a", "no window", function(c) c.sliding_window = 64 end)
wrong("gemma3_a", "one rope in every layer", function(c)
  c.rope_parameters.sliding_attention = c.rope_parameters.full_attention
end)
wrong("gemma3_a", "the full layers' rope unscaled", function(c)
  c.rope_parameters.full_attention = { rope_type = "default", rope_theta = 1000000.0 }
end)
wrong("gemma3_a", "the embeddings unscaled", nil, function(m) m.model.embed = function(self, ids) return self.embed_tokens(ids) end end)
wrong("gemma3_b", "the norms multiplying by w (Llama's), not 1 + w", nil, function(m)
  for _, mod in m:named_modules() do
    if mod.__name == "Gemma3RMSNorm" then mod.forward = function(self, x) return zr.rms_norm(x, self.weight, self.eps) end end
  end
end)

T.test("gemma3_a: the padding row (pad_token_id 0, in the batch) takes no gradient from the lookup", function()
  local g = golden.gemma3_a
  local model = golden_model("gemma3_a", function(c) c.pad_token_id = cjson.null end) -- (None: no padding_idx)
  model(g.input_ids, g.labels).loss:backward()
  local row = function(t) return t:narrow(1, 1, 1) end
  local d = (row(model.model.embed_tokens.weight.grad) - row(g["grad.model.embed_tokens.weight"])):abs():max():item()
  if not (d > 20 * 1e-5) then error(("without padding_idx row 0's gradient is within %.2e of transformers'"):format(d)) end
  print(("  without padding_idx: row 0's gradient differs by %.2e (the tied head's part alone in transformers')"):format(d))
end)

T.test("gemma3_a: the rows unjoined (CUDA's composition: each row's windowed segments, .rows) as joined", function()
  local g = golden.gemma3_a
  local packed = require "zrun.models.packed"
  local model = golden_model("gemma3_a")
  packed.use_segments = false
  local ok, out = pcall(model, g.input_ids, g.labels)
  packed.use_segments = true
  T.eq(ok, true, tostring(out))
  T.near(out.logits, g.logits, 2e-5, 1e-4, "logits")
  out.loss:backward()
  for n, p in model:named_parameters() do T.near(p.grad, g["grad." .. n], 1e-5, 1e-4, "grad of " .. n) end
end)

T.test("gemma3_a: greedy generation past the window as transformers' generate, with the cache and without", function()
  local g = golden.gemma3_a
  local want = cjson.decode(read(GOLDEN .. "gemma3_generate.json"))
  local model = golden_model("gemma3_a")
  model:eval()
  local prompt = zr.tensor({ want.prompt }, { dtype = "i64" })
  for _, cache in ipairs { true, false } do
    local ids = model:generate(prompt, { max_new_tokens = 14, eos_token_id = false, use_cache = cache })
    T.eq(table.concat(ids:flat_table(), " "), table.concat(want.ids, " "), "use_cache " .. tostring(cache))
  end
end)

T.test("gemma3_a: packed sequences (position_ids restarting) as each sequence alone: both ropes, the window", function()
  local g = golden.gemma3_a
  local model = golden_model("gemma3_a")
  local ids = g.input_ids:narrow(1, 1, 1):flat_table() -- 24 tokens: sequences of 14 (past the window of 8) and 10
  local a, b = {}, {}
  for i = 1, 14 do a[i] = ids[i] end
  for i = 15, 24 do b[i - 14] = ids[i] end
  local pos = {}
  for i = 1, 24 do pos[i] = i <= 14 and i - 1 or i - 15 end
  local function t(r) return zr.tensor({ r }, { dtype = "i64" }) end
  for _, flat in ipairs { true, false } do
    require("zrun.models.packed").use_segments = flat
    local ok, err = pcall(function()
      local lp = zr.no_grad(function() return model(t(ids), nil, { position_ids = t(pos) }).logits end)
      local la = zr.no_grad(function() return model(t(a)).logits end)
      local lb = zr.no_grad(function() return model(t(b)).logits end)
      T.near(lp:narrow(2, 1, 14), la, 1e-5, 1e-4, "the first sequence")
      T.near(lp:narrow(2, 15, 10), lb, 1e-5, 1e-4, "the second sequence")
    end)
    require("zrun.models.packed").use_segments = true
    if flat then
      T.eq(ok, true, tostring(err))
    else -- (the grouped path, where the rows are not joined, takes no window: a packed sequence past it is refused)
      T.eq(ok, false)
      T.eq(tostring(err):find("sliding_window 8 masks keys of a sequence of 14 tokens in a batch of packed sequences", 1,
        true) ~= nil, true, tostring(err))
    end
  end
end)

T.test("gemma3_a: gradient checkpointing gives transformers' gradients (each layer recomputed with its type's rope)", function()
  local g = golden.gemma3_a
  local model = golden_model("gemma3_a")
  model:gradient_checkpointing_enable()
  model(g.input_ids, g.labels).loss:backward()
  for n, p in model:named_parameters() do T.near(p.grad, g["grad." .. n], 1e-5, 1e-4, "grad of " .. n) end
end)

-- One Gemma3RMSNorm in bf16: transformers rounds x_hat * (1 + w) once (computed in f32); Llama's norm rounds x_hat
-- to bf16 first, then multiplies. zrun's must give transformers' bits (the reduction's order aside: at most one
-- bf16 ulp, in few elements), and the two-rounding form must be told apart from it.
T.test("Gemma3RMSNorm in bf16 gives transformers' output and gradients", function()
  local g = zr.load_safetensors(GOLDEN .. "gemma3_norm.safetensors")
  local norm = gemma3.Gemma3RMSNorm(256, 1e-6, { dtype = "bf16" })
  zr.no_grad(function() norm.weight:copy_(g.weight) end)
  local x = g.x:clone()
  x.requires_grad = true
  local y = norm(x)
  y:backward(g.dy)
  local function ulps(a, b) -- elements that differ, and the largest difference over b's bf16 spacing bound (|b| 2^-7)
    local d = (a:to("f32") - b:to("f32")):abs()
    return d:gt(0):to("f32"):sum():item(), (d / (b:to("f32"):abs() * 2 ^ -7 + 1e-30)):max():item()
  end
  local n, u = ulps(y, g.y)
  print(("  output: %d of %d elements differ, at most %.2f ulp"):format(n, y:numel(), u))
  T.eq(u <= 1 and n <= y:numel() / 100, true, "output within one ulp in at most 1% of the elements")
  T.near(x.grad, g.dx, 2e-2, 2e-2, "dx")
  T.near(norm.weight.grad, g.dweight, 0.5, 2e-2, "dweight")
  -- Llama's two roundings with the same (1 + w) in bf16 differ from transformers' in many elements
  local llama_y = zr.no_grad(function() return zr.rms_norm(g.x, (g.weight:to("f32") + 1):to("bf16"), 1e-6) end)
  local n2 = ulps(llama_y, g.y)
  print(("  Llama's rounding: %d of %d elements differ"):format(n2, y:numel()))
  T.eq(n2 > 10 * math.max(n, 1), true, "the two-rounding form is told apart")
end)

T.test("gemma3_text config: what zrun cannot compute is refused in one line naming it", function()
  local base = cjson.decode(read(GOLDEN .. "gemma3_a.config.json"))
  local function refused(edit, pattern)
    local c = cjson.decode(cjson.encode(base))
    edit(c)
    T.raises(function() gemma3.normalize_config(c) end, pattern)
  end
  refused(function(c) c.attn_logit_softcapping = 50.0 end, "attn_logit_softcapping is 50: attention logit soft-capping (Gemma 2's) is not implemented")
  refused(function(c) c.final_logit_softcapping = 30.0 end, "final_logit_softcapping is 30")
  refused(function(c) c.use_bidirectional_attention = true end, "use_bidirectional_attention is true")
  refused(function(c) c.hidden_activation = "silu" end, 'hidden_activation is "silu"')
  refused(function(c) c.layer_types[2] = "chunked_attention" end, 'layer_types[2] is "chunked_attention"')
  refused(function(c) c.layer_types[3] = nil end, "layer_types must be a list of num_hidden_layers (3)")
  refused(function(c) c.sliding_window = cjson.null end, 'layer_types[1] is "sliding_attention" but sliding_window is null')
  refused(function(c) c.rope_parameters.full_attention.rope_type = "dynamic" end,
    'rope_parameters.full_attention.rope_type is "dynamic"')
  refused(function(c) c.rope_parameters = { rope_type = "default", rope_theta = 10000.0 } end,
    "one table per layer type")
  refused(function(c) c.mlp_bias = true end, "mlp_bias is true")
  refused(function(c) c.model_type = "gemma3" end, 'model_type is "gemma3" (Gemma3ForConditionalGeneration')
  T.raises(function() zr.models.from_pretrained(GP.model_dir(tmp, "mm", cjson.encode { model_type = "gemma3",
    text_config = {} }, {})) end, 'model_type is "gemma3"')
end)

T.test("gemma3_text config: transformers' defaults where config.json is silent", function()
  local c = gemma3.normalize_config { model_type = "gemma3_text", num_hidden_layers = 7 }
  T.eq(c.hidden_size, 2304, "hidden_size")
  T.eq(c.head_dim, 256, "head_dim")
  T.eq(c.query_pre_attn_scalar, 256, "query_pre_attn_scalar")
  T.eq(c.sliding_window, 4096, "sliding_window")
  T.eq(table.concat(c.layer_types, ","), "sliding_attention,sliding_attention,sliding_attention,sliding_attention," ..
    "sliding_attention,full_attention,sliding_attention", "layer_types from the pattern of 6")
  T.eq(c.rope_parameters.full_attention.rope_theta, 1000000, "global theta")
  T.eq(c.rope_parameters.sliding_attention.rope_theta, 10000, "local theta")
  T.eq(c.pad_token_id, 0, "pad_token_id")
  T.eq(c.tie_word_embeddings, true, "tied")
  -- (the two GELUs' logits differ by less than the golden tolerance here: the mapping is checked as such)
  T.eq(c.gelu_approximate, "tanh", "gelu_pytorch_tanh: the tanh form")
  T.eq(gemma3.normalize_config({ hidden_activation = "gelu" }).gelu_approximate, "none", "gelu: the erf form")
  -- transformers 4's keys: rope_theta, rope_local_base_freq, rope_scaling (the full layers')
  local old = gemma3.normalize_config { num_hidden_layers = 2, rope_theta = 5e5, rope_local_base_freq = 1e3,
    rope_scaling = { rope_type = "linear", factor = 8.0 } }
  local full = old.rope_parameters.full_attention
  T.eq(("%s %s %s"):format(full.rope_type, full.factor, full.rope_theta), "linear 8 500000", "full_attention")
  T.eq(old.rope_parameters.sliding_attention.rope_theta, 1000, "sliding theta")
end)

T.test("gemma3_a: save_pretrained writes a config.json that reads back the same, in both layouts", function()
  local g = golden.gemma3_a
  local model = golden_model("gemma3_a")
  local dir = tmp .. "/saved"
  model:save_pretrained(dir)
  local written = cjson.decode(read(dir .. "/config.json"))
  T.eq(written.rope_parameters.full_attention.rope_type, "linear", "rope_parameters per layer type")
  T.eq(written.rope_theta, 1000000, "rope_theta (transformers 4's key)")
  T.eq(written.rope_local_base_freq, 10000, "rope_local_base_freq (transformers 4's key)")
  T.eq(written.rope_scaling.factor, 4, "rope_scaling (transformers 4's key)")
  T.eq(written.gelu_approximate, nil, "no zrun-only key")
  local back = zr.models.from_pretrained(dir)
  local a = zr.no_grad(function() return back(g.input_ids).logits end)
  T.near(a, g.logits, 2e-5, 1e-4, "logits after save and load")
end)

T.test("gemma3_text: zrun estimate's parameter list is the model's, in order; zrun plan models it", function()
  local E = require "zrun.memory_estimate"
  for _, name in ipairs { "gemma3_a", "gemma3_b" } do
    local cfg = cjson.decode(read(GOLDEN .. name .. ".config.json"))
    local list, i = E.param_list(cfg), 0
    for n, p in gemma3.Gemma3ForCausalLM(cfg):named_parameters() do
      i = i + 1
      T.eq(list[i] and list[i].name, n, name .. ": parameter " .. i)
      T.eq(list[i].numel, p:numel(), name .. ": " .. n .. " numel")
    end
    T.eq(#list, i, name .. ": parameters")
  end
  -- (the plan's peaks against measured ones: tests/mpi/plan_timeline_check.lua's Gemma 3 cases)
  local cfg = cjson.decode(read(GOLDEN .. "gemma3_a.config.json"))
  local plan = require("zrun.memory_plan").plan { model = cfg, micro_batch = 1, seq_len = 16 }
  T.eq(plan.device.activations > 0, true, "activations planned")
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
