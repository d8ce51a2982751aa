-- Mistral and Qwen2 configs (zrun.models.hf_config): the defaults transformers 5.17 fills for a
-- config.json that gives only the sizes (tests/golden/hf_model_defaults.json, written by
-- make_golden_models.py) read the same in zrun; a JSON null sliding_window is None (no window), not
-- the default 4096; Qwen2's window fields act as Qwen2Config.__post_init__ sets them (only with
-- use_sliding_window, only in the layers from max_window_layers on); a window shorter than a
-- sequence masks (refused in one line where the attention's segments do not run); fields zrun does not implement (or that
-- transformers' classes do not read, such as attention_bias) are refused in one line naming them.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local hf_config = zr.models.hf_config
local llama = zr.models.llama

local tmp = os.tmpname()
os.remove(tmp)

local read = T.read_file

-- A model directory holding config.json (text) only: what from_pretrained and llama.config read.
local n_dirs = 0
local function config_dir(text)
  n_dirs = n_dirs + 1
  local d = tmp .. "/c" .. n_dirs
  os.execute("mkdir -p '" .. d .. "'")
  zr.testing.write_file(d .. "/config.json", text)
  return d
end

-- transformers' value of a field vs zrun's normalised config (JSON null: None, zrun's false or nil)
local function same(want, got)
  if want == cjson.null then return got == false or got == nil end
  if type(want) == "table" then return cjson.encode(want) == cjson.encode(got) end
  return want == got
end

local defaults = cjson.decode(read("tests/golden/hf_model_defaults.json"))
for _, case in ipairs { "mistral", "mistral_sliding_window_null", "qwen2", "qwen2_use_sliding_window" } do
  T.test("defaults as transformers fills them: " .. case, function()
    local d = defaults[case]
    -- through config.json (hf.read_config keeps the null that is not the default)
    local c = llama.normalize_config((llama.config(config_dir(cjson.encode(d.config)))))
    local D = c.head_dim or c.hidden_size / c.num_attention_heads
    for k, want in pairs(d.transformers) do
      local got = c[k]
      if k == "head_dim" then got = D
      elseif k == "rope_parameters" then got = { rope_theta = c.rope_parameters.rope_theta, rope_type = c.rope_parameters.rope_type }
      elseif k == "attention_dropout" then got = c[k] or 0 end
      if not same(want, got) then
        error(("%s: transformers %s, zrun %s"):format(k, cjson.encode(want), hf_config.show(got)))
      end
    end
  end)
end

T.test("mistral: config.json's null and absent sliding_window, and false from Lua", function()
  local base = '{"model_type": "mistral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, '
    .. '"num_attention_heads": 8, "vocab_size": 50'
  local function window(text) return hf_config.attention_window(llama.normalize_config((llama.config(config_dir(text))))) end
  T.eq(window(base .. ', "sliding_window": null}'), nil, "null")
  T.eq(window(base .. "}"), 4096, "absent: MistralConfig's default")
  T.eq(window(base .. ', "sliding_window": 100}'), 100)
  local c = (llama.config(config_dir(base .. "}")))
  c.sliding_window = false
  T.eq(hf_config.attention_window(zr.models.mistral.normalize_config(c)), nil, "false from Lua")
  -- a table decoded with cjson directly (cjson.null values) reads the same
  T.eq(hf_config.attention_window(zr.models.mistral.normalize_config(cjson.decode(base .. ', "sliding_window": null}'))),
    nil, "cjson.null")
  T.eq(hf_config.to_hf(zr.models.mistral.normalize_config(cjson.decode(base .. ', "sliding_window": null}')))
    .sliding_window, cjson.null, "written back as null")
end)

local mbase = { model_type = "mistral", hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2,
  num_attention_heads = 4, num_key_value_heads = 2, vocab_size = 50 }
local qbase = { model_type = "qwen2", hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2,
  num_attention_heads = 4, num_key_value_heads = 2, vocab_size = 50 }
local function cfg(base, extra)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

T.test("qwen2: use_sliding_window false leaves the window off whatever sliding_window says", function()
  local c = zr.models.qwen2.normalize_config(cfg(qbase, { sliding_window = 8, max_window_layers = 0 }))
  T.eq(c.sliding_window, false)
  T.eq(cjson.encode(c.layer_types), '["full_attention","full_attention"]')
  T.eq(hf_config.attention_window(c), nil)
end)

T.test("qwen2: use_sliding_window with every layer below max_window_layers changes nothing", function()
  local c = zr.models.qwen2.normalize_config(cfg(qbase, { use_sliding_window = true, sliding_window = 8, max_window_layers = 2 }))
  T.eq(c.sliding_window, 8)
  T.eq(hf_config.attention_window(c), nil, "no sliding layer")
  zr.manual_seed(1)
  local on = zr.models.qwen2.Qwen2ForCausalLM(cfg(qbase, { use_sliding_window = true, sliding_window = 8, max_window_layers = 2 }))
  local off = zr.models.qwen2.Qwen2ForCausalLM(cfg(qbase))
  off:load_state_dict(on:state_dict(), true)
  local ids = (zr.rand({ 1, 20 }) * 49):to("i64")
  zr.no_grad(function() T.near(on(ids).logits, off(ids).logits, 0, 0, "same logits over 20 tokens") end)
end)

T.test("qwen2: a sliding layer's window masks longer sequences; on unjoined rows too (.rows); packed ones there refused", function()
  local c = cfg(qbase, { use_sliding_window = true, sliding_window = 8, max_window_layers = 1 })
  local n = zr.models.qwen2.normalize_config(c)
  T.eq(cjson.encode(n.layer_types), '["full_attention","sliding_attention"]')
  local m = zr.models.qwen2.Qwen2ForCausalLM(c)
  local full = zr.models.qwen2.Qwen2ForCausalLM(cfg(qbase))
  full:load_state_dict(m:state_dict(), true)
  local ids = (zr.rand({ 2, 12 }) * 49):to("i64")
  zr.no_grad(function()
    local a, b = m(ids).logits, full(ids).logits
    T.near(a:narrow(2, 1, 8), b:narrow(2, 1, 8), 1e-6, 1e-5, "at the window: causal attention")
    T.raises(function() T.near(a, b, 1e-4, 1e-4) end) -- (past it the window masks: test_window_golden.lua)
  end)
  -- where the rows are not joined (CUDA in f32, other head_dims; packed.use_segments = false here) plain rows take
  -- each row's own windowed segments (.rows): the same logits and gradients; packed sequences are refused in one line
  local packed = require "zrun.models.packed"
  local function run(flat)
    packed.use_segments = flat
    m:zero_grad()
    local ok, out = pcall(m, ids, ids)
    packed.use_segments = true
    T.eq(ok, true, tostring(out))
    out.loss:backward()
    return out.logits, m.model.layers[2].self_attn.q_proj.weight.grad:clone()
  end
  local la, ga = run(true)
  local lb, gb = run(false)
  T.near(lb, la, 1e-6, 1e-5, "rows: logits")
  T.near(gb, ga, 1e-6, 1e-5, "rows: a sliding layer's gradient")
  local pos = zr.tensor({ { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 }, { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1 } }, { dtype = "i64" })
  packed.use_segments = false
  local ok, err = pcall(m, ids, nil, { position_ids = pos })
  packed.use_segments = true
  T.eq(ok, false)
  T.eq(tostring(err):find("sliding_window 8 masks keys of a sequence of 12 tokens in a batch of packed sequences", 1,
    true) ~= nil, true, tostring(err))
  T.eq(tostring(err):find("\n"), nil, "one line")
  -- explicit layer_types decide, as in transformers
  local m2 = zr.models.qwen2.Qwen2ForCausalLM(cfg(qbase, { use_sliding_window = true, sliding_window = 8,
    layer_types = { "full_attention", "full_attention" } }))
  m2(zr.zeros({ 1, 20 }, { dtype = "i64" }))
end)

local refused = {
  { "mistral", "attention_bias", cfg(mbase, { attention_bias = true }), "attention_bias is true, but transformers' MistralForCausalLM does not read it" },
  { "mistral", "mlp_bias", cfg(mbase, { mlp_bias = true }), "mlp_bias is true, but transformers' MistralForCausalLM does not read it" },
  { "mistral", "sliding layer types", cfg(mbase, { layer_types = { "full_attention", "sliding_attention" } }),
    'layer_types[2] is "sliding_attention"; transformers\' MistralForCausalLM ignores layer_types' },
  { "mistral", "zero window", cfg(mbase, { sliding_window = 0 }), "sliding_window must be a positive integer, got 0" },
  { "mistral", "string window", cfg(mbase, { sliding_window = "4096" }), 'sliding_window must be a positive integer, got "4096"' },
  { "mistral", "attention dropout", cfg(mbase, { attention_dropout = 0.1 }), "attention_dropout is 0.1: attention dropout is not implemented" },
  { "mistral", "dynamic rope", cfg(mbase, { rope_parameters = { rope_type = "dynamic", factor = 4.0 } }), 'rope_parameters.rope_type is "dynamic"' },
  { "mistral", "soft-capping", cfg(mbase, { attn_logit_softcapping = 50 }), "attn_logit_softcapping is 50" },
  { "qwen2", "attention_bias", cfg(qbase, { attention_bias = true }), "attention_bias is true, but transformers' Qwen2ForCausalLM does not read it" },
  { "qwen2", "layer_types length", cfg(qbase, { layer_types = { "full_attention" } }), "layer_types must be a list of num_hidden_layers (2) entries" },
  { "qwen2", "chunked layer", cfg(qbase, { layer_types = { "full_attention", "chunked_attention" } }),
    'layer_types[2] is "chunked_attention"; zrun\'s qwen2 implements "full_attention" and "sliding_attention"' },
  { "qwen2", "sliding layer without a window", cfg(qbase, { layer_types = { "full_attention", "sliding_attention" } }),
    'layer_types[2] is "sliding_attention" but sliding_window is null (use_sliding_window is false)' },
  { "qwen2", "use_sliding_window not a bool", cfg(qbase, { use_sliding_window = "yes" }), 'use_sliding_window must be true or false, got "yes"' },
  { "qwen2", "negative max_window_layers", cfg(qbase, { max_window_layers = -1 }), "max_window_layers must be an integer >= 0, got -1" },
  { "qwen2", "llama3 rope without factor", cfg(qbase, { rope_parameters = { rope_type = "llama3" } }), "rope_parameters.factor is missing" },
}
-- no num_key_value_heads: the class's default (8, 32), not num_attention_heads as Llama's
for _, f in ipairs { { "mistral", mbase, 8, "MistralConfig" }, { "qwen2", qbase, 32, "Qwen2Config" } } do
  local c = cfg(f[2])
  c.num_key_value_heads = nil
  refused[#refused + 1] = { f[1], "default num_key_value_heads", c, ("num_attention_heads (4) must be a multiple of "
    .. "num_key_value_heads (%d, %s's default where config.json has none)"):format(f[3], f[4]) }
end
for _, r in ipairs(refused) do
  T.test(r[1] .. " config refuses: " .. r[2], function()
    local cls = r[1] == "mistral" and zr.models.mistral.MistralForCausalLM or zr.models.qwen2.Qwen2ForCausalLM
    local ok, err = pcall(cls, r[3])
    T.eq(ok, false, "refused")
    err = tostring(err)
    if err:sub(1, #r[1] + 9) ~= r[1] .. " config: " or not err:find(r[4], 1, true) then
      error(("message %q does not start with '%s config: ' and contain %q"):format(err, r[1], r[4]))
    end
    T.eq(err:find("\n"), nil, "one line")
  end)
end

T.test("each class takes its own model type; from_pretrained picks the class by model_type", function()
  T.raises(function() llama.LlamaForCausalLM(cfg(qbase)) end, 'llama config: model_type is "qwen2", not "llama"')
  T.raises(function() zr.models.mistral.MistralForCausalLM(cfg(qbase)) end, 'mistral config: model_type is "qwen2", not "mistral"')
  T.raises(function() zr.models.qwen2.Qwen2ForCausalLM(cfg(mbase, { model_type = "llama" })) end,
    'qwen2 config: model_type is "llama", not "qwen2"')
  local m = cfg(mbase)
  m.model_type = nil
  T.eq(zr.models.mistral.MistralForCausalLM(m).config.model_type, "mistral", "none: the class's")
  local d = tmp .. "/q"
  zr.models.qwen2.Qwen2ForCausalLM(cfg(qbase)):save_pretrained(d)
  T.eq(llama.from_pretrained(d).__name, "Qwen2ForCausalLM")
  T.raises(function() zr.models.mistral.from_pretrained(d) end, 'mistral config: model_type is "qwen2", not "mistral"')
  local g = tmp .. "/gemma"
  zr.models.qwen2.Qwen2ForCausalLM(cfg(qbase)):save_pretrained(g)
  local c = cjson.decode(read(g .. "/config.json"))
  c.model_type = "gemma"
  zr.testing.write_file(g .. "/config.json", cjson.encode(c))
  T.raises(function() llama.from_pretrained(g) end,
    'model_type is "gemma", not "llama"; zrun implements the model types llama, mistral, qwen2, qwen3, phi3, gemma3_text and gpt2')
end)

-- The published config.json files (their text as on the hub; what transformers 5.17's AutoConfig reads
-- from them is in the comments), through a model directory as from_pretrained reads them.
T.test("published configs: Mistral-7B-v0.3 (sliding_window null) and Qwen2.5-0.5B (tied, window off)", function()
  -- transformers: sliding_window None, num_key_value_heads 8, head_dim 128, rope_theta 1e6
  local m = llama.normalize_config((llama.config(config_dir([[
{"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
 "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
 "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
 "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
 "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0", "use_cache": true,
 "vocab_size": 32768}]]))))
  T.eq(m.model_type, "mistral")
  T.eq(hf_config.attention_window(m), nil, "no window")
  T.eq(m.num_key_value_heads, 8)
  T.eq(m.hidden_size / m.num_attention_heads, 128)
  T.eq(m.rope_parameters.rope_theta, 1e6)
  T.eq(m.tie_word_embeddings, false)
  local count = function(c)
    local n = 0
    for _, p in ipairs(require("zrun.memory_estimate").param_list(c)) do n = n + p.numel end
    return n
  end
  T.eq(count(m), 7248023552, "Mistral-7B-v0.3's parameters (no biases)")
  -- transformers: sliding_window None (use_sliding_window false), 24 full_attention layers, tied
  local q = llama.normalize_config((llama.config(config_dir([[
{"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
 "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
 "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
 "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
 "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
 "use_cache": true, "use_mrope": false, "use_sliding_window": false, "vocab_size": 151936}]]))))
  T.eq(q.model_type, "qwen2")
  T.eq(hf_config.attention_window(q), nil, "no window")
  T.eq(q.sliding_window, false, "None")
  T.eq(#q.layer_types, 24)
  for _, t in ipairs(q.layer_types) do T.eq(t, "full_attention") end
  T.eq(q.num_key_value_heads, 2)
  T.eq(q.tie_word_embeddings, true)
  T.eq(q.rope_parameters.rope_theta, 1e6)
  -- zr.memory's count (q/k/v biases) is the published 494,032,768 (the embedding counted once: tied)
  T.eq(count(q), 494032768, "Qwen2.5-0.5B's parameters")
end)

T.test("built-in configs: Mistral-7B-v0.3 and Qwen2.5 read as their config.json files do", function()
  local m = llama.normalize_config("mistralai/Mistral-7B-v0.3")
  T.eq(m.model_type, "mistral")
  T.eq(hf_config.attention_window(m), nil, "no window")
  for _, n in ipairs { "Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B" } do
    local q = llama.normalize_config(n)
    T.eq(q.model_type, "qwen2", n)
    T.eq(hf_config.attention_window(q), nil, n .. ": no window")
  end
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
