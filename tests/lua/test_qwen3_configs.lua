-- Qwen3 configs (zrun.models.hf_config): the defaults transformers 5.17 fills for a config.json that gives
-- only the sizes (tests/golden/qwen3_defaults.json, written by make_golden_qwen3.py) read the same in zrun
-- (head_dim 128 whatever hidden_size / heads is; num_key_value_heads 32; the window fields as Qwen2's);
-- fields zrun does not implement (or that Qwen3ForCausalLM does not read) refused in one line naming them;
-- the published Qwen3-0.6B config.json read as transformers reads it, and the built-in Qwen3 configs'
-- parameter counts (transformers 5.17 on the meta device: 596,049,920 / 1,720,574,976 / 4,022,468,096 /
-- 8,190,735,360).
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local hf_config = zr.models.hf_config
local llama = zr.models.llama

local tmp = T.tmpdir()
local n_dirs = 0
local function config_dir(text)
  n_dirs = n_dirs + 1
  local d = tmp .. "/c" .. n_dirs
  os.execute("mkdir -p '" .. d .. "'")
  T.write_file(d .. "/config.json", text)
  return d
end
local function same(want, got)
  if want == cjson.null then return got == false or got == nil end
  if type(want) == "table" then return cjson.encode(want) == cjson.encode(got) end
  return want == got
end
local function count(c)
  local n = 0
  for _, p in ipairs(require("zrun.memory_estimate").param_list(c)) do n = n + p.numel end
  return n
end

local defaults = cjson.decode(T.read_file("tests/golden/qwen3_defaults.json"))
local CASES = { "qwen3", "qwen3_use_sliding_window", "qwen3_kv_null" }
for _, case in ipairs(CASES) do
  T.test("defaults as transformers fills them: " .. case, function()
    local d = defaults[case]
    local c = llama.normalize_config((llama.config(config_dir(cjson.encode(d.config)))))
    T.eq(c.model_type, "qwen3")
    for k, want in pairs(d.transformers) do
      local got = c[k]
      if k == "rope_parameters" then got = { rope_theta = c.rope_parameters.rope_theta, rope_type = c.rope_parameters.rope_type }
      elseif k == "attention_dropout" then got = c[k] or 0 end
      if not same(want, got) then
        error(("%s: transformers %s, zrun %s"):format(k, cjson.encode(want), hf_config.show(got)))
      end
    end
  end)
end

T.test("qwen3: head_dim 128 where config.json has none builds 128-wide heads and norms", function()
  local m = zr.models.qwen3.Qwen3ForCausalLM { model_type = "qwen3", hidden_size = 32, intermediate_size = 16,
    num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 1, vocab_size = 11 }
  local a = m.model.layers[1].self_attn
  T.eq(table.concat(a.q_proj.weight:shape(), "x"), "256x32", "q_proj: 2 heads of 128")
  T.eq(table.concat(a.k_norm.weight:shape(), "x"), "128", "k_norm over 128")
  local out = zr.no_grad(function() return m(zr.tensor({ { 1, 2, 3 } }, { dtype = "i64" })) end)
  T.eq(table.concat(out.logits:shape(), "x"), "1x3x11")
end)

local base = { model_type = "qwen3", hidden_size = 32, intermediate_size = 64, num_hidden_layers = 2,
  num_attention_heads = 4, num_key_value_heads = 2, head_dim = 8, vocab_size = 50 }
local function cfg(extra)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end
local no_kv = cfg()
no_kv.num_key_value_heads = nil
local REFUSED = {
  { "mlp_bias", cfg { mlp_bias = true }, "mlp_bias is true, but transformers' Qwen3ForCausalLM does not read it" },
  { "attention_bias not a bool", cfg { attention_bias = "yes" }, 'attention_bias must be true or false, got "yes"' },
  { "default num_key_value_heads", no_kv,
    "num_attention_heads (4) must be a multiple of num_key_value_heads (32, Qwen3Config's default where config.json has none)" },
  { "chunked layer", cfg { layer_types = { "full_attention", "chunked_attention" } },
    'layer_types[2] is "chunked_attention"; zrun\'s qwen3 implements "full_attention" and "sliding_attention"' },
  { "sliding layer without a window", cfg { layer_types = { "full_attention", "sliding_attention" } },
    'layer_types[2] is "sliding_attention" but sliding_window is null (use_sliding_window is false)' },
  { "odd head_dim", cfg { head_dim = 7 }, "head_dim (7) must be even" },
  { "attention dropout", cfg { attention_dropout = 0.1 }, "attention_dropout is 0.1: attention dropout is not implemented" },
  { "dynamic rope", cfg { rope_parameters = { rope_type = "dynamic", factor = 4.0 } }, 'rope_parameters.rope_type is "dynamic"' },
  { "another model type", cfg { model_type = "qwen2" }, 'qwen3 config: model_type is "qwen2", not "qwen3"' },
}
for _, r in ipairs(REFUSED) do
  T.test("qwen3 config refuses: " .. r[1], function()
    local ok, err = pcall(zr.models.qwen3.Qwen3ForCausalLM, r[2])
    T.eq(ok, false, "refused")
    err = tostring(err)
    if err:sub(1, 14) ~= "qwen3 config: " or not err:find(r[3], 1, true) then
      error(("message %q does not start with 'qwen3 config: ' and contain %q"):format(err, r[3]))
    end
    T.eq(err:find("\n"), nil, "one line")
  end)
end

T.test("qwen3: use_qk_norm / qk_layernorm (fields of other models) do not change Qwen3, which always norms", function()
  local c = zr.models.qwen3.normalize_config(cfg { use_qk_norm = true, qk_layernorm = true })
  T.eq(c.model_type, "qwen3")
  T.raises(function() llama.normalize_config(cfg { model_type = "llama", use_qk_norm = true }) end,
    "use_qk_norm is true (query/key normalisation)")
end)

T.test("qwen3: each class takes its own model type; from_pretrained picks Qwen3ForCausalLM", function()
  T.raises(function() zr.models.qwen2.Qwen2ForCausalLM(cfg()) end, 'qwen2 config: model_type is "qwen3", not "qwen2"')
  local d = tmp .. "/saved"
  zr.models.qwen3.Qwen3ForCausalLM(cfg()):save_pretrained(d)
  T.eq(zr.models.from_pretrained(d).__name, "Qwen3ForCausalLM", "AutoModelForCausalLM's dispatch")
  T.eq(llama.from_pretrained(d).__name, "Qwen3ForCausalLM")
  T.raises(function() zr.models.qwen2.from_pretrained(d) end, 'qwen2 config: model_type is "qwen3", not "qwen2"')
  local c = cjson.decode(T.read_file(d .. "/config.json"))
  c.model_type = "qwen3_moe"
  T.write_file(d .. "/config.json", cjson.encode(c))
  T.raises(function() zr.models.from_pretrained(d) end,
    'model_type "qwen3_moe" is not implemented; zrun loads the model types llama, mistral, qwen2, qwen3, phi3, gemma3_text and gpt2')
end)

-- Qwen/Qwen3-0.6B's config.json as on the hub; transformers 5.17 reads sliding_window None (use_sliding_window
-- false), 28 full_attention layers, head_dim 128 (hidden 1024 / 16 heads is 64), tied, rope_theta 1e6.
T.test("published config: Qwen3-0.6B (head_dim 128, tied, window off) and its 596,049,920 parameters", function()
  local q = llama.normalize_config((llama.config(config_dir([[
{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
 "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
 "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
 "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
 "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
 "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
 "vocab_size": 151936}]]))))
  T.eq(q.model_type, "qwen3")
  T.eq(hf_config.attention_window(q), nil, "no window")
  T.eq(q.sliding_window, false, "None")
  T.eq(#q.layer_types, 28)
  T.eq(q.head_dim, 128)
  T.eq(q.num_key_value_heads, 8)
  T.eq(q.tie_word_embeddings, true)
  T.eq(q.attention_bias, false)
  T.eq(q.rope_parameters.rope_theta, 1e6)
  T.eq(count(q), 596049920, "Qwen3-0.6B's parameters (q_norm / k_norm included, the embedding counted once)")
  -- the built-in config reads the same
  local b = llama.normalize_config("Qwen/Qwen3-0.6B")
  for _, k in ipairs { "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
    "max_window_layers", "sliding_window", "use_sliding_window", "attention_bias", "rms_norm_eps" } do
    T.eq(hf_config.show(b[k]), hf_config.show(q[k]), "built-in " .. k)
  end
  T.eq(cjson.encode(b.layer_types), cjson.encode(q.layer_types), "built-in layer_types")
end)

-- (transformers 5.17: Qwen3ForCausalLM built on the meta device from each config, its parameters summed)
local COUNTS = { ["Qwen/Qwen3-0.6B"] = 596049920, ["Qwen/Qwen3-1.7B"] = 1720574976, ["Qwen/Qwen3-4B"] = 4022468096,
  ["Qwen/Qwen3-8B"] = 8190735360 }
local BUILTIN = { "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B" }
T.test("built-in Qwen3 configs: transformers' parameter counts, tied up to 4B, no window", function()
  for _, n in ipairs(BUILTIN) do
    local c = llama.normalize_config(n)
    T.eq(c.model_type, "qwen3", n)
    T.eq(hf_config.attention_window(c), nil, n .. ": no window")
    T.eq(c.tie_word_embeddings, n ~= "Qwen/Qwen3-8B", n .. ": tie_word_embeddings")
    T.eq(count(c), COUNTS[n], n .. "'s parameters")
    T.eq(count(zr.models.configs[n]), COUNTS[n], n .. "'s parameters from the raw table")
  end
end)

T.done()
