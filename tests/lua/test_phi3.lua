-- Phi-3 (Phi3ForCausalLM) against Hugging Face transformers 5.17, from golden files written by
-- tests/golden/make_phi3_golden.py (float32, eager attention): phi3_tiny (fused qkv_proj / gate_up_proj, GQA
-- 4/2, pad_token_id inside the vocabulary, sliding_window 24 over rows of 24), phi3_partial (partial_rotary_factor
-- 0.75, tied, longrope past original_max_position_embeddings), phi3_longrope and phi3_longrope_short (the same
-- weights over 40 and 12 tokens: long and short factors). Each built from its config table and loaded with
-- from_pretrained from the config.json transformers 5 wrote and the transformers 4 layout, and checked as
-- Llama's golden test (tests/lua/golden_parity.lua: logits 2e-5 abs + 1e-4 rel, loss 1e-5, gradients,
-- 5 AdamW steps). Then: transformers' names; Phi3Config's defaults (phi3_defaults.json); the window masking past
-- its length; greedy generate equals transformers' (phi3_generate.json); LoRA over the fused modules; training
-- learns in f32 and bf16.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "golden_parity.lua")
local weights, check, read = GP.weights, GP.check, T.read_file
local hf_config = zr.models.hf_config

local GOLDEN = "tests/golden/"
local tmp = T.tmpdir()
local NAMES = { "phi3_tiny", "phi3_partial", "phi3_longrope", "phi3_longrope_short" }

local golden, built, configs = {}, {}, {}
for _, name in ipairs(NAMES) do
  local g, meta = zr.load_safetensors(GOLDEN .. name .. ".safetensors")
  golden[name], configs[name] = g, cjson.decode(meta.config)
  local model = zr.models.phi3.Phi3ForCausalLM(configs[name])
  local sd = weights(g, model)
  model:load_state_dict(sd, true)
  built[name] = model
  check(name .. " (config table)", model, g, sd)
  for _, layout in ipairs { "config", "legacy_config" } do
    local dir = GP.model_dir(tmp, name .. "_" .. layout, read(GOLDEN .. name .. "." .. layout .. ".json"), sd)
    local loaded = (layout == "config" and zr.models or zr.models.llama).from_pretrained(dir)
    T.test(name .. " (from_pretrained, " .. layout .. ".json) is a Phi3ForCausalLM", function()
      T.eq(loaded.__name, "Phi3ForCausalLM")
    end)
    check(name .. " (from_pretrained, " .. layout .. ".json)", loaded, g, sd)
  end
end

T.test("phi3: transformers' parameter names and shapes (fused qkv_proj, gate_up_proj), tied head", function()
  local shapes = {}
  for n, p in built.phi3_tiny:named_parameters() do shapes[n] = table.concat(p:shape(), "x") end
  T.eq(shapes["model.layers.0.self_attn.qkv_proj.weight"], "96x48", "qkv_proj: (H + 2 KV) D = (4 + 4) 12 rows")
  T.eq(shapes["model.layers.1.mlp.gate_up_proj.weight"], "80x48", "gate_up_proj: 2 I rows")
  T.eq(shapes["model.layers.0.self_attn.q_proj.weight"], nil, "no q_proj")
  T.eq(shapes["lm_head.weight"], "70x48")
  local n = 0
  for name in built.phi3_partial:named_parameters() do n = n + 1; T.eq(name ~= "lm_head.weight", true) end
  T.eq(n, 1 + 2 * 6 + 1, "tied: embed, 6 a layer (qkv, o, gate_up, down, 2 norms), norm")
  T.eq(hf_config.rotary_dim(built.phi3_partial.config), 12, "rotary_dim 16 x 0.75")
end)

T.test("phi3: Phi3Config's defaults as transformers fills them (phi3_defaults.json)", function()
  local D = cjson.decode(read(GOLDEN .. "phi3_defaults.json"))
  for name, case in pairs(D) do
    local c = zr.models.phi3.normalize_config(case.config)
    local want = case.transformers
    for _, k in ipairs { "num_key_value_heads", "max_position_embeddings", "original_max_position_embeddings",
      "rms_norm_eps", "initializer_range", "tie_word_embeddings", "hidden_act", "attention_dropout", "resid_pdrop",
      "embd_pdrop", "bos_token_id", "eos_token_id" } do
      T.eq(c[k], want[k], name .. ": " .. k)
    end
    T.eq(c.pad_token_id or cjson.null, want.pad_token_id, name .. ": pad_token_id")
    T.eq(c.sliding_window or cjson.null, want.sliding_window, name .. ": sliding_window")
    local r, wr = c.rope_parameters, want.rope_parameters
    for _, k in ipairs { "rope_type", "rope_theta", "partial_rotary_factor", "original_max_position_embeddings" } do
      T.eq(r[k], wr[k], name .. ": rope_parameters." .. k)
    end
    T.eq(cjson.encode(r.short_factor), cjson.encode(wr.short_factor), name .. ": short_factor")
  end
end)

T.test("phi3: one-line refusals (dropout, rope types, factor lengths, pad outside the vocabulary)", function()
  local base = { model_type = "phi3", hidden_size = 32, intermediate_size = 40, num_hidden_layers = 1,
    num_attention_heads = 4, vocab_size = 100, pad_token_id = 0 }
  local function with(t)
    local c = {}
    for k, v in pairs(base) do c[k] = v end
    for k, v in pairs(t) do c[k] = v end
    return c
  end
  local cases = {
    { { resid_pdrop = 0.1 }, "resid_pdrop is 0.1: residual dropout is not implemented in zrun; train without it by loading with { config = { resid_pdrop = 0 } }" },
    { { attention_dropout = 0.1 }, "attention_dropout is 0.1" },
    { { rope_scaling = { type = "linear", factor = 2 } }, "Phi3Config takes \"default\" or \"longrope\"" },
    { { rope_scaling = { type = "longrope", short_factor = { 1, 2 }, long_factor = { 1, 2, 3, 4 } } },
      "rope_scaling.short_factor must be a list of rotary_dim/2 = 4 numbers, got 2 entries" },
    { { partial_rotary_factor = 0.375 }, "head_dim (8) x partial_rotary_factor (0.375) = 3 rotary channels" },
    { {}, "pad_token_id 32000 is outside the vocabulary (100; the embedding's padding_idx, Phi3Config's default 32000)",
      "pad_token_id" },
  }
  for _, case in ipairs(cases) do
    local c = with(case[1])
    if case[3] then c[case[3]] = nil end
    local err = T.raises(function() zr.models.phi3.normalize_config(c) end, case[2])
    T.eq(tostring(err):find("\n"), nil, "one line")
  end
  T.eq(zr.models.phi3.normalize_config(with { embd_pdrop = 0.1 }).embd_pdrop, 0.1, "embd_pdrop: read by no module")
  local ok = zr.models.phi3.normalize_config(with { partial_rotary_factor = 0.5 })
  T.eq(hf_config.rotary_dim(ok), 4)
end)

T.test("phi3: a sequence past sliding_window is masked, not refused (test_window_golden.lua: transformers' logits)", function()
  local g = golden.phi3_tiny
  local ids = zr.cat({ g.input_ids, g.input_ids:narrow(2, 1, 1) }, 2)
  local out = zr.no_grad(function() return built.phi3_tiny(ids) end)
  T.near(out.logits:narrow(2, 1, 24), g.logits, 2e-5, 1e-4, "the first 24 tokens' logits (causal)")
end)

T.test("phi3 longrope: the factors follow the forward's largest position (packed rows)", function()
  -- the long golden rows split into packed sequences of 12 and 28 tokens: the largest position 27 > 16 picks
  -- the long factors, as transformers' max(position_ids) + 1
  local g = golden.phi3_longrope
  local row = {}
  for t = 0, 39 do row[t + 1] = t < 12 and t or t - 12 end
  local pos = zr.tensor({ row, row }, { dtype = "i64" })
  local out = zr.no_grad(function() return built.phi3_longrope(g.input_ids, nil, { position_ids = pos }) end)
  local alone = zr.no_grad(function() return built.phi3_longrope(g.input_ids:narrow(2, 13, 28)) end)
  T.near(out.logits:narrow(2, 13, 28), alone.logits, 2e-5, 1e-4, "the second sequence as its own row")
end)

T.test("phi3: the built-in microsoft/Phi-3-mini-4k-instruct has 3,821,079,552 parameters (transformers' count)", function()
  local total = require("zrun.memory_estimate").count("microsoft/Phi-3-mini-4k-instruct")
  T.eq(type(total) == "table" and total.total or total, 3821079552)
  local c = zr.models.phi3.normalize_config(zr.models.phi3.config("microsoft/Phi-3-mini-4k-instruct"))
  T.eq(hf_config.attention_window(c), 2047)
  -- the memory plan takes it (tests/mpi/plan_timeline_check.lua: planned = measured on CPU ranks), a partial rotary
  -- factor too (Phi-4-mini's: q, k, v split off the product, narrower tables)
  local p = zr.memory.plan({ model = "microsoft/Phi-3-mini-4k-instruct", seq_len = 512, micro_batch = 1, stage = 2,
    dtype = "bf16", device = "cuda" })
  T.eq(p.device.total > 3821079552 * 2, true, "at least the bf16 weights")
  local c2 = zr.models.phi3.config("microsoft/Phi-3-mini-4k-instruct")
  c2.partial_rotary_factor = 0.75
  local p2 = zr.memory.plan({ model = c2, seq_len = 512, micro_batch = 1, stage = 2, dtype = "bf16", device = "cuda" })
  T.eq(p2.device.params, p.device.params, "the same parameters")
end)

-- Generation ------------------------------------------------------------------------------------
local G = cjson.decode(read(GOLDEN .. "phi3_generate.json"))
for _, name in ipairs { "phi3_tiny", "phi3_partial", "phi3_longrope" } do
  local sd = {}
  for n, p in built[name]:named_parameters() do sd[n] = p:dim() == 2 and p * 16 or p end
  local m = zr.models.phi3.Phi3ForCausalLM(configs[name])
  m:load_state_dict(sd, true)
  for _, case in ipairs { "single", "long", "batch" } do
    local c = G[name][case]
    T.test(name .. " greedy (" .. case .. ") equals transformers' generate", function()
      local got = m:generate(c.input_ids, { max_new_tokens = c.max_new_tokens, attention_mask = c.attention_mask,
        eos_token_id = c.eos_token_id, pad_token_id = c.pad_token_id }):tolist()
      T.eq(cjson.encode(got), cjson.encode(c.output), "ids")
      if case ~= "batch" then -- (phi3_tiny's rows pass its window: the whole rows' forward masks it too)
        local full = m:generate(c.input_ids, { max_new_tokens = c.max_new_tokens, eos_token_id = false, use_cache = false })
        T.eq(cjson.encode(full:tolist()), cjson.encode(c.output), "use_cache = false")
      end
    end)
  end
end

-- LoRA ------------------------------------------------------------------------------------------
T.test("phi3 LoRA: qkv_proj / gate_up_proj adapted as PEFT (one adapter over the fused product), merges", function()
  local g = golden.phi3_partial
  local m = zr.models.phi3.Phi3ForCausalLM(configs.phi3_partial)
  m:load_state_dict(weights(g, m), true)
  T.raises(function() zr.peft.get_peft_model(m, zr.peft.LoraConfig { r = 4 }) end,
    "no default target_modules for model_type phi3")
  local pm = zr.peft.get_peft_model(m, zr.peft.LoraConfig { r = 4, lora_alpha = 8,
    target_modules = { "qkv_proj", "o_proj", "gate_up_proj", "down_proj" } })
  local shapes = {}
  zr.manual_seed(5)
  zr.no_grad(function()
    for n, p in pm:named_parameters() do
      if n:find("lora_") then shapes[n] = table.concat(p:shape(), "x") end
      if n:find("lora_B") then p:normal_(0, 0.05) end
    end
  end)
  T.eq(shapes["model.layers.0.self_attn.qkv_proj.lora_B.default.weight"] or
    shapes["base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight"] or
    shapes["model.layers.0.self_attn.qkv_proj.lora_B.weight"], "96x4", "lora_B of (H + 2 KV) D = (4 + 2) 16 rows")
  local out = pm(g.input_ids, g.labels)
  out.loss:backward()
  for n, p in pm:named_parameters() do T.eq(p.grad ~= nil, n:find("lora_") ~= nil, "gradient of " .. n) end
  local ll = zr.no_grad(function() return pm(g.input_ids).logits end)
  local merged = zr.peft.merge_and_unload(pm)
  T.near(zr.no_grad(function() return merged(g.input_ids).logits end), ll, 1e-5, 1e-4, "adapted vs merged")
end)

-- Training ------------------------------------------------------------------------------------
-- The engine (zr.initialize) as recipes train: AdamW, clipping, bf16 mixed precision (f32 master weights) or f32.
for _, dt in ipairs { "f32", "bf16" } do
  T.test("phi3 training learns (" .. dt .. ", partial rotary + longrope): loss falls by 30% in 30 AdamW steps", function()
    local g = golden.phi3_partial
    local m = zr.models.phi3.Phi3ForCausalLM(configs.phi3_partial)
    m:load_state_dict(weights(g, m), true)
    local e = zr.initialize({ model = m, config = { train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = 1,
      gradient_clipping = 1.0, steps_per_print = 1000000, bf16 = { enabled = dt == "bf16" },
      optimizer = { type = "AdamW", params = { lr = 3e-3, weight_decay = 0.0 } }, zero_optimization = { stage = 0 } } })
    local first, last, norm
    for step = 1, 30 do
      local loss = e(g.input_ids, g.labels).loss
      e:backward(loss)
      e:step()
      norm = e:get_global_grad_norm()
      if step == 1 then first = loss:item() end
      last = loss:item()
    end
    print(("  phi3 %s: loss %.4f -> %.4f, last grad norm %.4f"):format(dt, first, last, norm))
    T.eq(last < 0.7 * first, true, "loss falls by 30%")
    T.eq(norm > 0, true, "grad norm nonzero")
  end)
end

T.done()
