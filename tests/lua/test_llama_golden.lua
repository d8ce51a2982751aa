-- Parity with Hugging Face transformers: a tiny Llama (GQA, llama3 rope scaling, untied
-- embeddings) and a tiny GPT-2, from golden files written by tests/golden/make_golden.py
-- (transformers, float32, eager attention). Checks logits, loss, every gradient, and the
-- losses of 5 AdamW steps with global-norm clipping.
-- Tolerances: logits/loss 1e-5 abs (fp32 rounding over a few hundred terms); gradients 1e-5 abs
-- + 1e-4 rel; optimizer-step losses 1e-4 (rounding compounds over steps).
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local clip = require("zrun.nn.utils").clip_grad_norm_

local function golden_test(name, file, build)
  local g, meta = zr.load_safetensors(file)
  local cfg = cjson.decode(meta.config)
  local model = build(cfg)
  local sd = {}
  for n, p in model:named_parameters() do
    if not g[n] then error("golden file has no tensor " .. n) end
    sd[n] = g[n]
  end
  model:load_state_dict(sd, true)

  T.test(name .. " forward matches transformers", function()
    local out = model(g.input_ids, g.labels)
    T.near(out.logits, g.logits, 2e-5, 1e-4, "logits")
    T.near(out.loss, g.loss, 1e-5, 0, "loss")
  end)

  T.test(name .. " gradients match transformers", function()
    model:zero_grad()
    local out = model(g.input_ids, g.labels)
    out.loss:backward()
    for n, p in model:named_parameters() do
      T.near(p.grad, g["grad." .. n], 1e-5, 1e-4, "grad of " .. n)
    end
  end)

  T.test(name .. " 5 AdamW steps with clipping match", function()
    model:load_state_dict(sd, true)
    local params = {}
    for _, p in model:named_parameters() do params[#params + 1] = p end
    local opt = zr.optim.AdamW(params, { lr = 1e-2, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 })
    local want, norms = g.adamw_losses:flat_table(), g.adamw_grad_norms:flat_table()
    for step = 1, 5 do
      opt:zero_grad()
      local loss = model(g.input_ids, g.labels).loss
      loss:backward()
      local norm = clip(params, 1.0)
      opt:step()
      T.near(loss, want[step], 1e-4, 0, "loss at step " .. step)
      T.near(norm, norms[step], 1e-4, 1e-4, "grad norm at step " .. step)
    end
  end)
end

golden_test("llama", "tests/golden/llama_tiny.safetensors", function(cfg)
  return zr.models.llama.LlamaForCausalLM(cfg)
end)

if io.open("lua/zrun/models/gpt2.lua") then
  golden_test("gpt2", "tests/golden/gpt2_tiny.safetensors", function(cfg)
    return zr.models.gpt2.GPT2LMHeadModel(cfg)
  end)
end

T.done()
