-- Mistral and Qwen2 against Hugging Face transformers, from golden files written by
-- tests/golden/make_golden_models.py (transformers 5.17, float32, eager attention): mistral_tiny
-- (MistralForCausalLM: no biases, GQA 4/2, head_dim 12 given apart from hidden_size, rope_theta 1e6,
-- sliding_window 24 over rows of 24 tokens, which the window leaves causal) and qwen2_tiny
-- (Qwen2ForCausalLM: random biases on q/k/v, none on o_proj, 7 query heads per kv head, tied head,
-- Qwen2.5's window fields with use_sliding_window false). Each is built from the config table and loaded with
-- from_pretrained from the config.json transformers 5 wrote and from the transformers 4 layout,
-- and checked as test_llama_golden.lua checks Llama, with its tolerances: logits 2e-5 abs + 1e-4
-- rel, loss 1e-5, gradients 1e-5 + 1e-4 rel, 5 AdamW steps' losses 1e-4 and norms 1e-4 + 5e-4 rel.
-- Then: Qwen2's fused q/k/v product with its biases equals the projections called one by one; a
-- sequence one token past Mistral's window runs (masked: test_window_golden.lua); save_pretrained's
-- files carry transformers' model_type, architectures and window fields and load back; LoRA (zr.peft,
-- PEFT's default q_proj/v_proj and all-linear) trains the adapters only and merges to the same logits.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "golden_parity.lua")
local weights, read = GP.weights, T.read_file

local GOLDEN = "tests/golden/"
local tmp = os.tmpname()
os.remove(tmp)

local MODELS = {
  mistral_tiny = { module = zr.models.mistral, class = zr.models.mistral.MistralForCausalLM, arch = "MistralForCausalLM" },
  qwen2_tiny = { module = zr.models.qwen2, class = zr.models.qwen2.Qwen2ForCausalLM, arch = "Qwen2ForCausalLM" },
}

local golden, built = {}, {}
for _, name in ipairs { "mistral_tiny", "qwen2_tiny" } do
  local m = MODELS[name]
  -- zr.models.llama.from_pretrained picks the class by model_type (what the recipes call)
  golden[name], built[name] = GP.parity(tmp, name, m.class,
    function(dir, layout) return (layout == "config" and m.module or zr.models.llama).from_pretrained(dir) end,
    function(loaded, layout)
      T.test(name .. " (from_pretrained, " .. layout .. ".json) is a " .. m.arch, function()
        T.eq(loaded.__name, m.arch)
      end)
    end)
end

T.test("qwen2: q/k/v carry biases, o_proj and the MLP none (Qwen2Attention); mistral none", function()
  local q = built.qwen2_tiny.model.layers[1]
  for _, p in ipairs { "q_proj", "k_proj", "v_proj" } do T.eq(q.self_attn[p].bias ~= nil, true, p .. " bias") end
  T.eq(q.self_attn.o_proj.bias, nil, "o_proj bias")
  for _, p in ipairs { "gate_proj", "up_proj", "down_proj" } do T.eq(q.mlp[p].bias, nil, p .. " bias") end
  for n in built.mistral_tiny:named_parameters() do T.eq(n:find("%.bias$"), nil, n) end
end)

-- The fused q/k/v product (one GEMM with the three biases, zr.qkv_rope_sdpa) against the projections
-- one by one (a hook on k_proj makes them unfusable): the same logits and gradients.
T.test("qwen2: the fused biased q/k/v product equals the projections called one by one", function()
  GP.check_unfused(built.qwen2_tiny, golden.qwen2_tiny, "")
end)

T.test("mistral: a sequence past sliding_window is masked, not refused (test_window_golden.lua: transformers' logits)", function()
  local g = golden.mistral_tiny
  local model = built.mistral_tiny
  local ids = zr.cat({ g.input_ids, g.input_ids:narrow(2, 1, 1) }, 2)
  local out = zr.no_grad(function() return model(ids) end)
  -- causal: the first 24 tokens' logits are the golden's; token 25 does not see token 1
  T.near(out.logits:narrow(2, 1, 24), g.logits, 2e-5, 1e-4, "the first 24 tokens' logits")
  -- packed rows: each sequence attends to itself, so the longest sequence is what counts
  local pos = zr.tensor({ { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
    0 }, { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 0 } }, { dtype = "i64" })
  out = zr.no_grad(function() return model(ids, nil, { position_ids = pos }) end)
  T.near(out.logits:narrow(2, 1, 24), g.logits, 2e-5, 1e-4, "packed: the first 24 tokens' logits")
end)

-- save_pretrained: config.json with transformers' model_type and architectures, names as transformers'
-- state dict, read back by zrun to the same logits (tests/golden/check_hf_save.py runs transformers on
-- such a directory).
for _, name in ipairs { "mistral_tiny", "qwen2_tiny" } do
  T.test(name .. ": save_pretrained writes " .. MODELS[name].arch .. " files that load back", function()
    local g = golden[name]
    local dir = tmp .. "/saved_" .. name
    built[name]:save_pretrained(dir)
    local c = cjson.decode(read(dir .. "/config.json"))
    T.eq(c.model_type, name:match("^[^_]+"), "model_type")
    T.eq(c.architectures[1], MODELS[name].arch, "architectures")
    local want = cjson.decode(read(GOLDEN .. name .. ".config.json"))
    for _, k in ipairs { "sliding_window", "use_sliding_window", "max_window_layers", "num_key_value_heads",
      "tie_word_embeddings", "head_dim" } do
      T.eq(zr.models.hf_config.show(c[k]), zr.models.hf_config.show(want[k]), k .. " as transformers wrote it")
    end
    T.eq(cjson.encode(c.layer_types), cjson.encode(want.layer_types), "layer_types")
    T.eq(c.attention_bias, nil, "no attention_bias (not a field of this config class)")
    local back = zr.models.llama.from_pretrained(dir)
    T.eq(back.__name, MODELS[name].arch)
    local logits = zr.no_grad(function() return back(g.input_ids).logits end)
    T.near(logits, g.logits, 2e-5, 1e-4, "logits after save and load")
  end)
end

-- LoRA: PEFT's default targets for mistral and qwen2 (q_proj, v_proj), and all-linear; a random
-- lora_B (PEFT starts it at zero) so the adapter matters; the adapted model's logits equal the merged
-- model's, and its gradients reach the adapters only.
for _, name in ipairs { "mistral_tiny", "qwen2_tiny" } do
  for _, targets in ipairs { "default", "all-linear" } do
    T.test(name .. ": LoRA (" .. targets .. ") runs and merges to the same logits", function()
      local g = golden[name]
      local m = MODELS[name].class(cjson.decode(select(2, zr.load_safetensors(GOLDEN .. name .. ".safetensors")).config))
      m:load_state_dict(weights(g, m), true)
      local cfg = { r = 4, lora_alpha = 8, lora_dropout = 0 }
      if targets ~= "default" then cfg.target_modules = targets end
      local pm = zr.peft.get_peft_model(m, zr.peft.LoraConfig(cfg))
      local names = {}
      zr.manual_seed(5)
      zr.no_grad(function()
        for n, p in pm:named_parameters() do
          if n:find("lora_B") then p:normal_(0, 0.05) end
          if n:find("lora_A") then names[#names + 1] = n end
        end
      end)
      local per_layer = targets == "default" and 2 or 7
      T.eq(#names, per_layer * 2, "adapted modules")
      local out = pm(g.input_ids, g.labels)
      out.loss:backward()
      for n, p in pm:named_parameters() do
        T.eq(p.grad ~= nil, n:find("lora_") ~= nil, "gradient of " .. n)
      end
      local lora_logits = zr.no_grad(function() return pm(g.input_ids).logits end)
      T.raises(function() T.near(lora_logits, g.logits, 2e-5, 1e-4) end) -- (the adapter changes them)
      local merged = zr.peft.merge_and_unload(pm)
      local ml = zr.no_grad(function() return merged(g.input_ids).logits end)
      T.near(lora_logits, ml, 1e-5, 1e-4, "adapted vs merged logits")
    end)
  end
end

os.execute("rm -rf '" .. tmp .. "'")
T.done()
