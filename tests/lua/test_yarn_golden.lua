-- YaRN rope scaling (rope_type "yarn", Qwen2.5's and Qwen3's long-context setting; DeepSeek's mscale form)
-- against Hugging Face transformers, from golden files written by tests/golden/make_yarn_golden.py
-- (transformers 5.17, float32, eager attention): qwen2_yarn (Qwen2, head_dim 32, factor 4 over 64
-- original positions, 96 tokens, the attention factor from factor) and llama_yarn (Llama, head_dim 16, factor 8
-- over 256, mscale 1 / mscale_all_dim 0.5, beta_fast 16, beta_slow 2, truncate false: the ramp 0.69 .. 2.23). Each is built
-- from the config table and loaded with from_pretrained from transformers 5's and 4's config.json layouts,
-- and checked as test_llama_golden.lua checks Llama, with its tolerances (logits 2e-5 abs + 1e-4 rel, loss
-- 1e-5, gradients 1e-5 + 1e-4 rel, 5 AdamW steps). Then the comparison must fail where the yarn fields are
-- dropped or changed, and the fields zrun cannot take are refused in one line.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "golden_parity.lua")
local weights, read = GP.weights, T.read_file

local GOLDEN = "tests/golden/"
local tmp = os.tmpname()
os.remove(tmp)

local MODELS = {
  qwen2_yarn = { module = zr.models.qwen2, class = zr.models.qwen2.Qwen2ForCausalLM },
  llama_yarn = { module = zr.models.llama, class = zr.models.llama.LlamaForCausalLM },
}
local golden = {}
for _, name in ipairs { "qwen2_yarn", "llama_yarn" } do
  local m = MODELS[name]
  golden[name] = GP.parity(tmp, name, m.class, function(dir) return m.module.from_pretrained(dir) end)
end

-- The parity must be able to fail on what it exists for: the frequencies' blend or the attention factor
-- dropped or wrong moves the logits far past the tolerance.
local function wrong(name, what, edit)
  GP.fails_with(name, what, golden[name], function()
    local cfg = cjson.decode(read(GOLDEN .. name .. ".config.json"))
    edit(cfg.rope_parameters)
    local model = MODELS[name].class(cfg)
    model:load_state_dict(weights(golden[name], model), true)
    return model
  end)
end
wrong("qwen2_yarn", "yarn dropped (the default rope)", function(r) r.rope_type = "default" end)
wrong("qwen2_yarn", "factor 2 instead of 4", function(r) r.factor = 2 end)
wrong("qwen2_yarn", "the attention factor 1 (the blend alone)", function(r) r.attention_factor = 1.0 end)
wrong("llama_yarn", "truncate true", function(r) r.truncate = true end)
wrong("llama_yarn", "mscale_all_dim dropped (the attention factor from factor)", function(r) r.mscale_all_dim = nil end)
wrong("llama_yarn", "beta_fast and beta_slow dropped (32 and 1)", function(r) r.beta_fast, r.beta_slow = nil, nil end)

T.test("yarn: the attention factor transformers computes (0.1 ln(factor) + 1, or DeepSeek's mscale ratio)", function()
  -- cos at position 0 is the attention factor itself
  local function factor_at_0(rp)
    local cos = zr.rope_tables(1, 8, { theta = 10000, rope_scaling = rp })
    return cos:max():item()
  end
  T.near(factor_at_0 { rope_type = "yarn", factor = 4, original_max_position_embeddings = 64 },
    0.1 * math.log(4) + 1, 1e-6, 0, "factor 4")
  T.near(factor_at_0 { rope_type = "yarn", factor = 8, original_max_position_embeddings = 32, mscale = 1, mscale_all_dim = 0.5 },
    (0.1 * math.log(8) + 1) / (0.05 * math.log(8) + 1), 1e-6, 0, "mscale ratio")
  T.near(factor_at_0 { rope_type = "yarn", factor = 4, original_max_position_embeddings = 64, attention_factor = 0.75 },
    0.75, 1e-7, 0, "given attention_factor")
  T.near(factor_at_0 { rope_type = "yarn", factor = 0.5, original_max_position_embeddings = 64 }, 1, 0, 0, "factor <= 1")
end)

T.test("yarn: a field of the wrong type or a missing factor is refused in one line naming it", function()
  local base = cjson.decode(read(GOLDEN .. "qwen2_yarn.config.json"))
  local function refused(edit, pattern)
    local c = cjson.decode(cjson.encode(base))
    edit(c.rope_parameters)
    T.raises(function() zr.models.qwen2.normalize_config(c) end, pattern)
  end
  refused(function(r) r.factor = nil end, "factor is missing")
  refused(function(r) r.beta_fast = "32" end, "beta_fast must be a number")
  refused(function(r) r.truncate = 1 end, "truncate must be true or false")
  T.raises(function() zr.rope_tables(4, 8, { rope_scaling = { rope_type = "yarn", factor = 2 } }) end,
    "original_max_position_embeddings is required")
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
