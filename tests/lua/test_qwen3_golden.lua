-- Qwen3 against Hugging Face transformers, from golden files written by tests/golden/make_golden_qwen3.py
-- (transformers 5.17, PEFT 0.21.2, float32, eager attention): qwen3_tiny (Qwen3ForCausalLM: q_norm /
-- k_norm weights drawn around 1, GQA 4/2, head_dim 16 given apart from hidden_size / heads = 10, tied head,
-- no biases) and qwen3_bias (attention_bias on q/k/v/o, 6/3 heads, untied, use_sliding_window with a
-- window of 24 from layer 1 over rows of 24 tokens, which the window leaves causal). Each is built from
-- the config table and loaded with from_pretrained from the config.json transformers 5 wrote and from
-- the transformers 4 layout, and checked as test_llama_golden.lua checks Llama, with its tolerances
-- (tests/lua/golden_parity.lua): logits 2e-5 abs + 1e-4 rel, loss 1e-5, gradients 1e-5 + 1e-4 rel, 5 AdamW
-- steps' losses 1e-4 and norms 1e-4 + 5e-4 rel. Then: HF's parameter names and a fresh model's norm
-- weights (ones); the one q/k/v product's views equal the projections called one by one; packed
-- sequences (on the segments and on the groups) equal separate rows; gradient checkpointing; a sequence
-- past the window masked; save_pretrained's files; LoRA against PEFT's numbers (qwen3_tiny_lora); and
-- training that learns, f32 and bf16 on the CPU.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local packed = require "zrun.models.packed"
local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "golden_parity.lua")
local weights, check, read = GP.weights, GP.check, T.read_file

local GOLDEN = "tests/golden/"
local tmp = T.tmpdir()
local NAMES = { "qwen3_tiny", "qwen3_bias" }
local LAYOUTS = { "config", "legacy_config" }
local NOT_WEIGHTS = { input_ids = 1, labels = 1, logits = 1, loss = 1, adamw_losses = 1, adamw_grad_norms = 1 }

local function maxdiff(a, b) return (a:to("f64") - b:to("f64")):abs():max():item() end

local golden, configs, built = {}, {}, {}
for _, name in ipairs(NAMES) do
  local g, meta = zr.load_safetensors(GOLDEN .. name .. ".safetensors")
  golden[name], configs[name] = g, cjson.decode(meta.config)
  local model = zr.models.qwen3.Qwen3ForCausalLM(configs[name])
  local sd = weights(g, model)
  model:load_state_dict(sd, true)
  built[name] = model
  check(name .. " (config table)", model, g, sd)
  for _, layout in ipairs(LAYOUTS) do
    local dir = GP.model_dir(tmp, name .. "_" .. layout, read(GOLDEN .. name .. "." .. layout .. ".json"), sd)
    -- zr.models.from_pretrained (AutoModelForCausalLM) picks the class by model_type
    local loaded = (layout == "config" and zr.models.qwen3 or zr.models).from_pretrained(dir)
    T.test(name .. " (from_pretrained, " .. layout .. ".json) is a Qwen3ForCausalLM", function()
      T.eq(loaded.__name, "Qwen3ForCausalLM")
    end)
    check(name .. " (from_pretrained, " .. layout .. ".json)", loaded, g, sd)
  end
end

T.test("qwen3: parameter names are transformers' (q_norm / k_norm of head_dim), a fresh model's norms are ones", function()
  for _, name in ipairs(NAMES) do
    local want, n = {}, 0
    for k in pairs(golden[name]) do
      if not k:match("^grad%.") and not NOT_WEIGHTS[k] then want[k] = true; n = n + 1 end
    end
    local got = 0
    for k in built[name]:named_parameters() do T.eq(want[k], true, name .. ": " .. k); got = got + 1 end
    T.eq(got, n, name .. ": as many parameters as transformers'")
  end
  local a = built.qwen3_tiny.model.layers[1].self_attn
  T.eq(table.concat(a.q_norm.weight:shape(), "x"), "16", "q_norm over head_dim")
  T.eq(a.q_proj.bias, nil, "attention_bias false: no q_proj bias")
  local b = built.qwen3_bias.model.layers[2]
  for _, p in ipairs { "q_proj", "k_proj", "v_proj", "o_proj" } do T.eq(b.self_attn[p].bias ~= nil, true, p .. " bias") end
  for _, p in ipairs { "gate_proj", "up_proj", "down_proj" } do T.eq(b.mlp[p].bias, nil, p .. " bias") end
  zr.manual_seed(1)
  local fresh = zr.models.qwen3.Qwen3ForCausalLM(configs.qwen3_tiny)
  for _, l in ipairs(fresh.model.layers) do
    for _, nm in ipairs { "q_norm", "k_norm" } do
      T.eq(l.self_attn[nm].weight:eq(1):to("f32"):sum():item(), 16, nm .. " starts at ones (Qwen3's _init_weights)")
    end
  end
end)

-- The one q/k/v product, narrowed into q, k and v views (the norms sit between it and the rope), against the
-- projections called one by one (a hook on k_proj makes them unfusable): the same logits and gradients.
T.test("qwen3: the one q/k/v product's views equal the projections called one by one", function()
  for _, name in ipairs(NAMES) do
    GP.check_unfused(built[name], golden[name], name .. ": ")
  end
end)

-- Packed sequences: row 1's first 20 tokens and row 2's first 12 in one row (position_ids restarting) give
-- those rows' own logits and, with labels on both, the gradients of the two rows run alone -- on the segments
-- (the rows joined, zr.sdpa_segments_ok) and on the groups (packed.use_segments = false).
local SEG_MODES = { true, false }
T.test("qwen3: packed sequences equal the separate rows (segments and groups), gradients too", function()
  local g, model = golden.qwen3_tiny, built.qwen3_tiny
  local a, b = g.input_ids:narrow(1, 1, 1):narrow(2, 1, 20), g.input_ids:narrow(1, 2, 1):narrow(2, 1, 12)
  local ids = zr.cat({ a, b }, 2)
  local pos = zr.cat({ zr.arange(0, 20, { dtype = "i64" }), zr.arange(0, 12, { dtype = "i64" }) }, 1):view(1, 32)
  model:zero_grad()
  local la = model(a, a).loss * 19
  local lb = model(b, b).loss * 11
  local want_loss = (la + lb) / 30
  want_loss:backward()
  local want = {}
  for n, p in model:named_parameters() do want[n] = p.grad:clone() end
  local sep_a = zr.no_grad(function() return model(a).logits end)
  local sep_b = zr.no_grad(function() return model(b).logits end)
  local keep = packed.use_segments
  for _, seg in ipairs(SEG_MODES) do
    packed.use_segments = seg
    local ok, err = pcall(function()
      local what = seg and "segments" or "groups"
      -- labels: each sequence scores its own next tokens (the first token of b is no label for a's last)
      local labels = ids:clone()
      labels:narrow(2, 21, 1):fill_(-100)
      model:zero_grad()
      local out = model(ids, labels, { position_ids = pos })
      T.near(out.logits:narrow(2, 1, 20), sep_a, 2e-5, 1e-4, what .. ": first sequence's logits")
      T.near(out.logits:narrow(2, 21, 12), sep_b, 2e-5, 1e-4, what .. ": second sequence's logits")
      T.near(out.loss, want_loss:item(), 1e-5, 0, what .. ": loss")
      out.loss:backward()
      for n, p in model:named_parameters() do T.near(p.grad, want[n], 1e-5, 1e-4, what .. ": grad of " .. n) end
    end)
    packed.use_segments = keep
    if not ok then error(err, 0) end
  end
end)

T.test("qwen3: gradient checkpointing gives the same loss and gradients", function()
  for _, name in ipairs(NAMES) do
    local g, model = golden[name], built[name]
    model:train()
    model:gradient_checkpointing_enable()
    model:zero_grad()
    local out = model(g.input_ids, g.labels)
    out.loss:backward()
    model:gradient_checkpointing_disable()
    T.near(out.loss, g.loss, 1e-5, 0, name .. ": loss")
    for n, p in model:named_parameters() do T.near(p.grad, g["grad." .. n], 1e-5, 1e-4, name .. ": grad of " .. n) end
  end
end)

T.test("qwen3: a sequence past sliding_window (use_sliding_window) is masked (test_window_golden.lua), one at it is causal", function()
  local g, model = golden.qwen3_bias, built.qwen3_bias
  local ids = zr.cat({ g.input_ids, g.input_ids:narrow(2, 1, 1) }, 2)
  local out = zr.no_grad(function() return model(ids) end)
  T.near(out.logits:narrow(2, 1, 24), g.logits, 2e-5, 1e-4, "the first 24 tokens' logits")
  local nc = zr.models.qwen3.normalize_config(configs.qwen3_bias)
  T.eq(cjson.encode(nc.layer_types), '["full_attention","sliding_attention"]', "layer_types as Qwen3Config fills them")
  T.eq(zr.models.hf_config.attention_window(nc), 24, "the window")
  T.eq(zr.models.hf_config.attention_window(zr.models.qwen3.normalize_config(configs.qwen3_tiny)), nil, "no window")
end)

-- save_pretrained: config.json with transformers' model_type, architectures and fields, names as transformers'
-- state dict, read back by zrun to the same logits (tests/golden/check_hf_save.py runs transformers on such a
-- directory: reference.sh).
local SAVED_KEYS = { "sliding_window", "use_sliding_window", "max_window_layers", "num_key_value_heads",
  "tie_word_embeddings", "head_dim", "attention_bias", "rms_norm_eps" }
for _, name in ipairs(NAMES) do
  T.test(name .. ": save_pretrained writes Qwen3ForCausalLM files that load back", function()
    local g = golden[name]
    local dir = tmp .. "/saved_" .. name
    built[name]:save_pretrained(dir)
    local c = cjson.decode(read(dir .. "/config.json"))
    T.eq(c.model_type, "qwen3", "model_type")
    T.eq(c.architectures[1], "Qwen3ForCausalLM", "architectures")
    local want = cjson.decode(read(GOLDEN .. name .. ".config.json"))
    for _, k in ipairs(SAVED_KEYS) do
      T.eq(zr.models.hf_config.show(c[k]), zr.models.hf_config.show(want[k]), k .. " as transformers wrote it")
    end
    T.eq(cjson.encode(c.layer_types), cjson.encode(want.layer_types), "layer_types")
    local names = zr.load_safetensors(dir .. "/model.safetensors")
    T.eq(names["model.layers.1.self_attn.k_norm.weight"] ~= nil, true, "k_norm saved under transformers' name")
    local back = zr.models.from_pretrained(dir)
    T.eq(back.__name, "Qwen3ForCausalLM")
    local logits = zr.no_grad(function() return back(g.input_ids).logits end)
    T.near(logits, g.logits, 2e-5, 1e-4, "logits after save and load")
  end)
end

-- LoRA against PEFT (qwen3_tiny_lora.safetensors: PEFT's default targets for qwen3, q_proj and v_proj, r 4,
-- alpha 8, lora_B drawn at random): the same adapted modules, logits, loss and adapter gradients; then
-- all-linear (7 modules a layer) merges to the adapted model's logits.
T.test("qwen3: LoRA (PEFT's default targets) equals PEFT's logits, loss and adapter gradients", function()
  local g = golden.qwen3_tiny
  local L, meta = zr.load_safetensors(GOLDEN .. "qwen3_tiny_lora.safetensors")
  T.eq(meta.targets, '["q_proj", "v_proj"]', "PEFT's default targets for qwen3")
  local m = zr.models.qwen3.Qwen3ForCausalLM(configs.qwen3_tiny)
  m:load_state_dict(weights(g, m), true)
  local pm = zr.peft.get_peft_model(m, zr.peft.LoraConfig { r = 4, lora_alpha = 8, lora_dropout = 0 })
  local n = 0
  zr.no_grad(function()
    for name, p in pm:named_parameters() do
      if name:find("lora_") then
        local key = "base_model.model." .. name
        T.eq(L[key] ~= nil, true, "PEFT has " .. key)
        p:copy_(L[key])
        n = n + 1
      end
    end
  end)
  T.eq(n, 2 * 2 * 2, "lora_A and lora_B of q_proj and v_proj in 2 layers")
  local out = pm(g.input_ids, g.labels)
  T.near(out.logits, L.logits, 2e-5, 1e-4, "logits")
  T.near(out.loss, L.loss, 1e-5, 0, "loss")
  out.loss:backward()
  local worst = 0
  for name, p in pm:named_parameters() do
    if name:find("lora_") then
      local want = L["grad.base_model.model." .. name]
      T.near(p.grad, want, 1e-5, 1e-4, "grad of " .. name)
      worst = math.max(worst, maxdiff(p.grad, want))
    else
      T.eq(p.grad, nil, "no gradient for the frozen " .. name)
    end
  end
  print(("  qwen3_tiny LoRA: max logit diff %.2e, max adapter grad diff %.2e"):format(maxdiff(out.logits, L.logits), worst))
end)

T.test("qwen3: LoRA (all-linear) trains the adapters only and merges to the same logits", function()
  local g = golden.qwen3_tiny
  local m = zr.models.qwen3.Qwen3ForCausalLM(configs.qwen3_tiny)
  m:load_state_dict(weights(g, m), true)
  local pm = zr.peft.get_peft_model(m, zr.peft.LoraConfig { r = 4, lora_alpha = 8, lora_dropout = 0,
    target_modules = "all-linear" })
  local n = 0
  zr.manual_seed(5)
  zr.no_grad(function()
    for name, p in pm:named_parameters() do
      if name:find("lora_B") then p:normal_(0, 0.05) end
      if name:find("lora_A") then n = n + 1 end
    end
  end)
  T.eq(n, 7 * 2, "adapted modules (q_norm / k_norm are no Linear)")
  pm(g.input_ids, g.labels).loss:backward()
  for name, p in pm:named_parameters() do T.eq(p.grad ~= nil, name:find("lora_") ~= nil, "gradient of " .. name) end
  local lora_logits = zr.no_grad(function() return pm(g.input_ids).logits end)
  T.raises(function() T.near(lora_logits, g.logits, 2e-5, 1e-4) end) -- (the adapter changes them)
  local merged = zr.peft.merge_and_unload(pm)
  T.near(zr.no_grad(function() return merged(g.input_ids).logits end), lora_logits, 1e-5, 1e-4, "adapted vs merged")
end)

-- Training learns: 30 steps of the engine (zr.initialize: AdamW lr 3e-3, gradient_clipping 1.0, ZeRO stage 2; bf16:
-- 16-bit weights with fp32 master weights) on qwen3_tiny's batch from its golden weights, f32 and bf16 on the
-- CPU: the loss falls by more than 40% (f32 falls from 4.29 to ~1.2), the gradient norm stays nonzero, and the
-- q_norm / k_norm weights move.
local DTYPES = { "f32", "bf16" }
for _, dt in ipairs(DTYPES) do
  T.test("qwen3: training learns (" .. dt .. ", CPU): the loss falls by more than 40%", function()
    local g = golden.qwen3_tiny
    local m = zr.models.qwen3.Qwen3ForCausalLM(configs.qwen3_tiny)
    m:load_state_dict(weights(g, m), true)
    local cfg = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000, gradient_clipping = 1.0,
      optimizer = { type = "AdamW", params = { lr = 3e-3, weight_decay = 0.0 } }, zero_optimization = { stage = 2 } }
    if dt == "bf16" then cfg.bf16 = { enabled = true } end
    local engine = zr.initialize({ model = m, config = cfg })
    T.eq(m.model.layers[1].self_attn.k_norm.weight:dtype(), dt, "weights in " .. dt)
    local qn0 = m.model.layers[1].self_attn.q_norm.weight:to("f32"):clone()
    local kn0 = m.model.layers[2].self_attn.k_norm.weight:to("f32"):clone()
    local first, last, norm
    for step = 1, 30 do
      local out = engine(g.input_ids, g.labels)
      engine:backward(out.loss)
      engine:step()
      norm = engine:get_global_grad_norm()
      if step == 1 then first = out.loss:item() end
      last = out.loss:item()
    end
    print(("  qwen3_tiny %s: loss %.3f -> %.3f, last grad norm %.3g"):format(dt, first, last, tonumber(norm)))
    T.eq(last < 0.6 * first, true, ("loss %.3f -> %.3f"):format(first, last))
    T.eq(tonumber(norm) > 0, true, "grad norm nonzero")
    T.eq(maxdiff(m.model.layers[1].self_attn.q_norm.weight, qn0) > 0, true, "q_norm's weight trained")
    T.eq(maxdiff(m.model.layers[2].self_attn.k_norm.weight, kn0) > 0, true, "k_norm's weight trained")
  end)
end

T.done()
