-- Parity with Hugging Face transformers, from golden files written by tests/golden/make_golden.py
-- (transformers 5.17, float32, eager attention): llama_tiny (GQA, untied head, rope_theta 500000
-- with llama3 scaling over 64 positions), llama_linear (linear rope scaling, attention and MLP
-- biases, tied head) and gpt2_tiny. Each model is built three ways -- from the config table in the
-- golden file, and with from_pretrained from a directory holding the config.json transformers 5
-- wrote (rope_parameters) or the same config in transformers 4's layout (rope_theta/rope_scaling)
-- -- and checked for logits, loss, every gradient and the losses of 5 AdamW steps with clipping.
-- Tolerances: logits 2e-5 abs + 1e-4 rel, loss 1e-5 (fp32 rounding over a few hundred terms);
-- gradients 1e-5 abs + 1e-4 rel; optimizer-step losses 1e-4 abs and gradient norms 1e-4 abs + 5e-4
-- rel, as rounding compounds over steps at lr 1e-2: at llama_tiny's step 3, where the loss goes
-- back up and the norm jumps to 8.8, transformers' fp32 norm is 1.0e-3 from zrun's fp64 run
-- while zrun's fp32 run is 7e-5 from it. The last tests show that the forward comparison fails
-- for a wrong rope (theta or scaling off, or rope_parameters not read).
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "golden_parity.lua")
local weights, read = GP.weights, T.read_file

local GOLDEN = "tests/golden/"
local tmp = os.tmpname()
os.remove(tmp)

local families = {
  llama_tiny = zr.models.llama, llama_linear = zr.models.llama, gpt2_tiny = zr.models.gpt2,
}
local function build(family, cfg)
  return family == zr.models.llama and family.LlamaForCausalLM(cfg) or family.GPT2LMHeadModel(cfg)
end

local golden = {}
for _, name in ipairs { "llama_tiny", "llama_linear", "gpt2_tiny" } do
  local family = families[name]
  golden[name] = GP.parity(tmp, name, function(cfg) return build(family, cfg) end,
    function(dir) return family.from_pretrained(dir) end)
end

T.test("the two config.json layouts hold the same rope, as transformers wrote them", function()
  local new = cjson.decode(read(GOLDEN .. "llama_tiny.config.json"))
  local old = cjson.decode(read(GOLDEN .. "llama_tiny.legacy_config.json"))
  T.eq(new.rope_theta, nil, "transformers 5 writes no top-level rope_theta")
  T.eq(new.rope_scaling, nil, "transformers 5 writes no rope_scaling")
  T.eq(new.rope_parameters.rope_theta, 500000, "rope_parameters.rope_theta")
  T.eq(new.rope_parameters.rope_type, "llama3")
  T.eq(old.rope_parameters, nil)
  T.eq(old.rope_theta, 500000)
  local a = zr.models.llama.normalize_config(new).rope_parameters
  local b = zr.models.llama.normalize_config(old).rope_parameters
  T.eq(zr.models.hf_config.show(a), zr.models.hf_config.show(b), "resolved rope parameters")
end)

-- The parity above must be able to fail on the bug it exists for: a reader that misses
-- rope_parameters (theta 10000, no scaling), or gets theta or the scaling alone wrong, must fail
-- the forward comparison (its tolerances) -- by a wide margin, so it is no rounding accident.
local function wrong_rope(name, what, edit)
  T.test(name .. ": the forward comparison fails with " .. what, function()
    local g = golden[name]
    local cfg = cjson.decode(read(GOLDEN .. name .. ".config.json"))
    edit(cfg)
    local model = zr.models.llama.LlamaForCausalLM(cfg)
    model:load_state_dict(weights(g, model), true)
    local logits = zr.no_grad(function() return model(g.input_ids).logits end)
    T.raises(function() T.near(logits, g.logits, 2e-5, 1e-4, "logits") end, "logits")
    local d = (logits - g.logits):abs():max():item()
    if not (d > 20 * 2e-5) then error(("max logit difference %.2e is within 20x the tolerance"):format(d)) end
    print(("  %s, %s: max logit difference %.2e (largest logit %.2f)"):format(name, what, d,
      g.logits:abs():max():item()))
  end)
end
wrong_rope("llama_tiny", "rope_parameters ignored (theta 10000, no scaling)", function(c) c.rope_parameters = nil end)
wrong_rope("llama_tiny", "theta 10000 and llama3 scaling", function(c) c.rope_parameters.rope_theta = 10000 end)
wrong_rope("llama_tiny", "theta 500000 and no scaling", function(c) c.rope_parameters = { rope_theta = 500000 } end)
wrong_rope("llama_tiny", "llama3 factor 4 instead of 8", function(c) c.rope_parameters.factor = 4 end)
wrong_rope("llama_linear", "linear scaling dropped", function(c) c.rope_parameters.rope_type = "default" end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
