-- Writes zrun-zero-to-fp32 consolidations for tests/golden/check_zero_to_fp32.py: each model is
-- built in f32, trained 2 steps in bf16 with model_parameters taken before the cast (the seed's
-- direct API) at ZeRO stage 2 or 3, checkpointed, and consolidated with `zrun zero-to-fp32`.
--   ./zrun tests/golden/save_zero_for_hf_check.lua DIR     (then, where transformers is installed)
--   python3 tests/golden/check_zero_to_fp32.py DIR
-- DIR/<name>/ holds config.json + model.safetensors (the consolidated fp32 weights); expected
-- logits of the fp32 weights come in DIR/expected.safetensors as "<name>.input_ids/.logits".
local zr = require "zrun"
local dir = assert(arg[1], "usage: zrun tests/golden/save_zero_for_hf_check.lua DIR")
zr.makedirs(dir)
local cases = { { name = "untied_stage2", stage = 2, tie = false }, { name = "tied_stage3", stage = 3, tie = true } }
local expected = {}
for _, c in ipairs(cases) do
  zr.manual_seed(5)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.tie_word_embeddings = c.tie
  local m = zr.models.llama.LlamaForCausalLM(cfg)
  local e = zr.initialize({ model = m, model_parameters = m:parameters(), config = { train_micro_batch_size_per_gpu = 2,
    steps_per_print = 1e9, bf16 = { enabled = true }, optimizer = { type = "AdamW", params = { lr = 1e-2 } },
    zero_optimization = { stage = c.stage } } })
  local ids = (zr.rand({ 2, 12 }) * (cfg.vocab_size - 1)):to("i64")
  for _ = 1, 2 do
    local out = e(ids, ids)
    e:backward(out.loss)
    e:step()
  end
  local ck, out = dir .. "/ckpt_" .. c.name, dir .. "/" .. c.name
  e:save_checkpoint(ck)
  zr.makedirs(out)
  assert(require("zrun.zero_to_fp32").main({ ck, out .. "/model.safetensors" }) == 0)
  zr.hf.save_config(out, m.config)
  -- zrun's logits of the consolidated fp32 weights, in an f32 model
  local f = zr.models.llama.LlamaForCausalLM(cfg)
  require("zrun.zero_to_fp32").load_state_dict_from_zero_checkpoint(f, ck)
  local x = (zr.rand({ 1, 10 }) * (cfg.vocab_size - 1)):to("i64")
  expected[c.name .. ".input_ids"] = x
  expected[c.name .. ".logits"] = zr.no_grad(function() return f(x).logits end)
end
zr.save_safetensors(dir .. "/expected.safetensors", expected)
print("wrote " .. dir)
