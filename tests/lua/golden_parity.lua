-- What the golden-file parity tests (test_llama_golden.lua, test_mistral_qwen2_golden.lua,
-- test_yarn_golden.lua, test_gemma3_golden.lua) share: the golden weights under a model's parameter names, a model directory from
-- a config.json text and those weights, a golden file's parity from its config table and both config.json
-- layouts, and the three checks against transformers' numbers -- forward (logits 2e-5 abs + 1e-4 rel,
-- loss 1e-5), every gradient (1e-5 abs + 1e-4 rel) and 5 AdamW steps with clipping (losses 1e-4, norms
-- 1e-4 abs + 5e-4 rel; the test files say why these tolerances).
--   local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "golden_parity.lua")
local zr = require "zrun"
local T = zr.testing
local hf = require "zrun.hf"
local clip = require("zrun.nn.utils").clip_grad_norm_

local M = {}

-- The golden tensors g under model's parameter names (a missing one is an error).
function M.weights(g, model)
  local sd = {}
  for n in model:named_parameters() do
    if not g[n] then error("golden file has no tensor " .. n) end
    sd[n] = g[n]
  end
  return sd
end

-- A model directory under root: the given config.json text plus the weights sd.
function M.model_dir(root, name, config_text, sd)
  local dir = root .. "/" .. name
  hf.save_state_dict(dir, sd) -- makes the directory
  T.write_file(dir .. "/config.json", config_text)
  return dir
end

-- The parity of golden file NAME (tests/golden/NAME.safetensors, its config table in the metadata, and
-- NAME.config.json / NAME.legacy_config.json, transformers 5's and 4's layouts): the model build(config)
-- makes with the golden weights, then load(dir, layout) of a directory holding each config.json and
-- those weights (after_load(model, layout), optional, runs first), each through M.check. root: where the
-- directories go. Returns the golden tensors, the built model and its weights.
function M.parity(root, name, build, load, after_load)
  local cjson = require "cjson"
  local g, meta = zr.load_safetensors("tests/golden/" .. name .. ".safetensors")
  local model = build(cjson.decode(meta.config))
  local sd = M.weights(g, model)
  model:load_state_dict(sd, true)
  M.check(name .. " (config table)", model, g, sd)
  for _, layout in ipairs { "config", "legacy_config" } do
    local dir = M.model_dir(root, name .. "_" .. layout, T.read_file("tests/golden/" .. name .. "." .. layout .. ".json"), sd)
    local loaded = load(dir, layout)
    if after_load then after_load(loaded, layout) end
    M.check(name .. " (from_pretrained, " .. layout .. ".json)", loaded, g, sd)
  end
  return g, model, sd
end

-- The largest |a - b| (for the report lines).
local function maxdiff(a, b) return (a:to("f64") - b:to("f64")):abs():max():item() end

-- The three tests of model (weights sd) against the golden file g, named by label; each prints its
-- largest difference.
function M.check(label, model, g, sd)
  T.test(label .. " forward matches transformers", function()
    local out = zr.no_grad(function() return model(g.input_ids, g.labels) end)
    T.near(out.logits, g.logits, 2e-5, 1e-4, "logits")
    T.near(out.loss, g.loss, 1e-5, 0, "loss")
    print(("  %s: max logit diff %.2e, loss diff %.2e"):format(label, maxdiff(out.logits, g.logits),
      maxdiff(out.loss:reshape(1), g.loss)))
  end)
  T.test(label .. " gradients match transformers", function()
    model:zero_grad()
    model(g.input_ids, g.labels).loss:backward()
    local worst, at = 0, nil
    for n, p in model:named_parameters() do
      T.near(p.grad, g["grad." .. n], 1e-5, 1e-4, "grad of " .. n)
      local d = maxdiff(p.grad, g["grad." .. n])
      if d > worst then worst, at = d, n end
    end
    print(("  %s: max grad diff %.2e (%s)"):format(label, worst, at))
  end)
  T.test(label .. " 5 AdamW steps with clipping match", function()
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
      T.near(norm, norms[step], 1e-4, 5e-4, "grad norm at step " .. step)
    end
    model:load_state_dict(sd, true)
  end)
end

-- A test that the forward comparison with golden file g (name) fails, by more than 20x its tolerance, for the
-- model make() returns (the golden weights loaded, with what = the thing it gets wrong): the parity can fail on
-- what it exists for. Prints the difference.
function M.fails_with(name, what, g, make)
  T.test(name .. ": the forward comparison fails with " .. what, function()
    local model = make()
    local logits = zr.no_grad(function() return model(g.input_ids).logits end)
    local d = (logits - g.logits):abs():max():item()
    if not (d > 20 * 2e-5) then error(("max logit difference %.2e is within 20x the tolerance"):format(d)) end
    print(("  %s, %s: max logit difference %.2e"):format(name, what, d))
  end)
end

-- model's loss and gradients on g with its q/k/v projections called one by one (a forward hook on each layer's
-- k_proj makes them unfusable) against its own fused run: the golden loss, and the fused run's gradients.
function M.check_unfused(model, g, label)
  model:zero_grad()
  model(g.input_ids, g.labels).loss:backward()
  local fused = {}
  for n, p in model:named_parameters() do fused[n] = p.grad:clone() end
  local hooks = {}
  for _, layer in ipairs(model.model.layers) do
    hooks[#hooks + 1] = layer.self_attn.k_proj:register_forward_hook(function() end)
  end
  model:zero_grad()
  local out = model(g.input_ids, g.labels)
  out.loss:backward()
  for _, h in ipairs(hooks) do h:remove() end
  T.near(out.loss, g.loss, 1e-5, 0, label .. "unfused loss")
  for n, p in model:named_parameters() do T.near(p.grad, fused[n], 1e-6, 1e-5, label .. "grad of " .. n) end
end

return M
