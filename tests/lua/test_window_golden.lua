-- Sliding-window attention in the models against Hugging Face transformers, from golden files written by
-- tests/golden/make_window_golden.py (transformers 5.17, float32, eager attention), where the window masks
-- keys (the script asserts the logits differ from full causal attention's): mistral_window (sliding_window
-- 5 over rows of 19 tokens) and qwen2_window (use_sliding_window with max_window_layers 1: layer 0 attends
-- fully, layer 1 through a window of 6; rows of 17), qwen3_window (q_norm / k_norm, the same layers, rows of 18)
-- and phi3_window (fused modules, partial rotary 0.75: the
-- unfused attention path; window 7 over rows of 21) checked as test_llama_golden.lua checks Llama (forward,
-- every gradient, 5 AdamW steps; tests/lua/golden_parity.lua's tolerances), with gradient checkpointing
-- too; mistral_window_packed: the same Mistral over packed rows (position_ids restarting: each sequence
-- masked to itself and the window inside it), forward and gradients; bf16 learns.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "golden_parity.lua")

local GOLDEN = "tests/golden/"
local CLASS = { mistral_window = zr.models.mistral.MistralForCausalLM, qwen2_window = zr.models.qwen2.Qwen2ForCausalLM,
  qwen3_window = zr.models.qwen3.Qwen3ForCausalLM, phi3_window = zr.models.phi3.Phi3ForCausalLM }

local function build(name)
  local g, meta = zr.load_safetensors(GOLDEN .. name .. ".safetensors")
  local model = CLASS[name](cjson.decode(meta.config))
  local sd = GP.weights(g, model)
  model:load_state_dict(sd, true)
  return model, g, sd
end

for _, name in ipairs { "mistral_window", "qwen2_window", "qwen3_window", "phi3_window" } do
  local model, g, sd = build(name)
  GP.check(name, model, g, sd)
  T.test(name .. ": gradient checkpointing gives the same loss and gradients", function()
    local m = build(name)
    m:gradient_checkpointing_enable()
    m:train()
    m(g.input_ids, g.labels).loss:backward()
    for n, p in m:named_parameters() do T.near(p.grad, g["grad." .. n], 1e-5, 1e-4, "grad of " .. n) end
  end)
end

T.test("mistral_window over packed rows matches transformers (forward and gradients)", function()
  local model = build("mistral_window")
  local g = zr.load_safetensors(GOLDEN .. "mistral_window_packed.safetensors")
  local out = model(g.input_ids, g.labels, { position_ids = g.position_ids })
  T.near(out.logits, g.logits, 2e-5, 1e-4, "logits")
  T.near(out.loss, g.loss, 1e-5, 0, "loss")
  model:zero_grad()
  model(g.input_ids, g.labels, { position_ids = g.position_ids }).loss:backward()
  for n, p in model:named_parameters() do T.near(p.grad, g["grad." .. n], 1e-5, 1e-4, "grad of " .. n) end
end)

T.test("mistral_window learns in bf16 under ZeRO-2: the loss halves in 30 steps, the gradient norm is not zero", function()
  local model, g = build("mistral_window")
  local e = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
    gradient_clipping = 1.0, bf16 = { enabled = true }, zero_optimization = { stage = 2 },
    optimizer = { type = "AdamW", params = { lr = 1e-2 } } } })
  local first, last
  for step = 1, 30 do
    local loss = e(g.input_ids, g.labels).loss
    e:backward(loss)
    e:step()
    if step == 1 then first = loss:item() end
    last = loss:item()
    T.eq(e:get_global_grad_norm() > 0, true, "grad norm at step " .. step)
  end
  for _, p in ipairs(model:parameters()) do T.eq(p:dtype(), "bf16") end
  T.eq(last < first / 2, true, ("loss %.4f -> %.4f"):format(first, last))
  print(("  bf16 loss %.4f -> %.4f"):format(first, last))
end)

T.done()
