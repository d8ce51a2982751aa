-- GPT2Config fields that change the computation, each next to transformers 5.17's GPT2LMHeadModel
-- (tests/golden/make_gpt2_variants.py: float32, eager attention, training mode, dropout 0, weights at
-- initializer_range 0.5 so that every field moves the loss): activation_function (gelu, the tanh
-- forms, relu, silu, quick_gelu), n_inner, scale_attn_weights false, scale_attn_by_inverse_layer_idx
-- (with and without reorder_and_upcast_attn), layer_norm_epsilon and an untied head. Each variant is
-- built from its config table and through from_pretrained, and checked for logits, loss and every
-- gradient.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local hf = require "zrun.hf"
local gpt2 = zr.models.gpt2

local g, meta = zr.load_safetensors("tests/golden/gpt2_variants.safetensors")
local tmp = os.tmpname()
os.remove(tmp)

-- variant name's weights under the model's parameter names (every one of them in the file)
local function weights(name, model)
  local sd = {}
  for n in model:named_parameters() do
    sd[n] = g[name .. "." .. n] or error(("golden variant %s has no tensor %s"):format(name, n))
  end
  return sd
end

local function check(name, model)
  model:train()
  local out = model(g.input_ids, g.labels)
  T.near(out.logits, g[name .. ".logits"], 2e-5, 1e-4, name .. " logits")
  T.near(out.loss, g[name .. ".loss"], 1e-5, 0, name .. " loss")
  out.loss:backward()
  local n = 0
  for pn, p in model:named_parameters() do
    T.near(p.grad, g[name .. ".grad." .. pn], 1e-5, 1e-4, name .. " grad of " .. pn)
    n = n + 1
  end
  local want = 0
  for k in pairs(g) do if k:find("^" .. name:gsub("%p", "%%%0") .. "%.grad%.") then want = want + 1 end end
  T.eq(n, want, name .. ": parameters with a gradient (transformers' named_parameters)")
end

local names = {}
for k in pairs(meta) do if k ~= "transformers" and k ~= "torch" and k ~= "format" and k ~= "openai_bin" then names[#names + 1] = k end end
table.sort(names)
T.test("the golden file holds the variants", function() T.eq(#names, 11) end)

for _, name in ipairs(names) do
  local cfg = cjson.decode(meta[name])
  T.test("gpt2 " .. name .. " (config table) matches transformers", function()
    local m = gpt2.GPT2LMHeadModel(cfg)
    m:load_state_dict(weights(name, m), true)
    check(name, m)
  end)
  T.test("gpt2 " .. name .. " (from_pretrained) matches transformers", function()
    local m = gpt2.GPT2LMHeadModel(cfg)
    local dir = tmp .. "/" .. name
    hf.save_state_dict(dir, weights(name, m))
    local f = assert(io.open(dir .. "/config.json", "wb"))
    f:write(cjson.encode(cfg))
    f:close()
    check(name, gpt2.from_pretrained(dir))
  end)
end

-- attention dropout runs transformers' eager attention instead of the fused kernel: the same scale there
-- (p = 1e-12 drops nothing, its 1/(1-p) rounds to 1 in fp32)
for _, name in ipairs { "unscaled", "inverse_layer_idx" } do
  T.test("gpt2 " .. name .. ": the eager attention (attn_pdrop > 0) takes the same scale", function()
    local cfg = cjson.decode(meta[name])
    cfg.attn_pdrop = 1e-12
    local m = gpt2.GPT2LMHeadModel(cfg)
    m:load_state_dict(weights(name, m), true)
    check(name, m)
  end)
end

-- packed rows (position_ids restarting, TRL's padding-free batches) attend within each sequence with the
-- variant's scale too, on both packed paths (the segmented kernel where it runs, else groups)
T.test("gpt2 unscaled / inverse_layer_idx: packed sequences take the same scale", function()
  local packed = require "zrun.models.packed"
  for _, name in ipairs { "unscaled", "inverse_layer_idx" } do
    local m = gpt2.GPT2LMHeadModel(cjson.decode(meta[name]))
    m:load_state_dict(weights(name, m), true)
    m:eval()
    local row = zr.cat({ g.input_ids[1]:view(1, 9), g.input_ids[2]:view(1, 9) }, 2) -- (1, 18)
    local pos = zr.cat({ zr.arange(9), zr.arange(9) }):view(1, 18):to("i64")
    local keep = packed.use_segments
    for _, seg in ipairs { true, false } do
      packed.use_segments = seg
      local lg = zr.no_grad(function() return m(row, nil, { position_ids = pos }).logits end)
      T.near(lg:narrow(2, 1, 9), g[name .. ".logits"]:narrow(1, 1, 1), 2e-5, 1e-4, name .. " first sequence")
      T.near(lg:narrow(2, 10, 9), g[name .. ".logits"]:narrow(1, 2, 1), 2e-5, 1e-4, name .. " second sequence")
    end
    packed.use_segments = keep
  end
end)

-- zrun estimate / plan count parameters from the config alone: the untied head's lm_head.weight too
T.test("gpt2 untied: the memory estimate counts transformers' parameters (lm_head.weight too)", function()
  local want = 0
  for k, v in pairs(g) do if k:find("^untied%.") and not k:find("^untied%.grad%.") and k ~= "untied.logits"
    and k ~= "untied.loss" then want = want + v:numel() end end
  T.eq((require("zrun.memory_estimate").count(cjson.decode(meta.untied))), want)
end)

-- tie_word_embeddings false with no lm_head.weight in the files: transformers would start the head at random
-- (with a warning); zrun refuses in one line naming the fix
T.test("gpt2 untied from_pretrained: files without lm_head.weight are refused naming the fix", function()
  local cfg = cjson.decode(meta.untied)
  local m = gpt2.GPT2LMHeadModel(cfg)
  local sd = weights("untied", m)
  sd["lm_head.weight"] = nil
  local dir = tmp .. "/untied_no_head"
  hf.save_state_dict(dir, sd)
  T.write_file(dir .. "/config.json", cjson.encode(cfg))
  T.raises(function() gpt2.from_pretrained(dir) end, "has no lm_head.weight and config.json's tie_word_embeddings is " ..
    "false, so the output head would be random; if the head is wte, load with { config = { tie_word_embeddings = true } }")
  T.eq(gpt2.from_pretrained(dir, { config = { tie_word_embeddings = true } }).lm_head, nil)
end)

-- openai-community/gpt2's layout: pytorch_model.bin (torch.save) with no "transformer." prefix, no lm_head and
-- the causal-mask buffers attn.bias (float, bool) / attn.masked_bias, config.json as transformers 4 wrote it
T.test("gpt2 from_pretrained: OpenAI's pytorch_model.bin layout gives transformers' logits", function()
  local m = gpt2.from_pretrained("tests/golden/gpt2_openai_bin")
  m:eval()
  T.near(zr.no_grad(function() return m(g.input_ids).logits end), g["openai_bin.logits"], 2e-5, 1e-4, "logits")
end)

-- a config.json without resid_pdrop / embd_pdrop / attn_pdrop: transformers 5.17's GPT2Config fills 0.1
-- (AutoConfig on {"model_type": "gpt2", "n_embd": 8, ...} gives 0.1 0.1 0.1), so dropout acts while training
T.test("gpt2 from_pretrained: dropout keys missing from config.json are GPT2Config's 0.1", function()
  local cfg = cjson.decode(meta.gelu)
  cfg.resid_pdrop, cfg.embd_pdrop, cfg.attn_pdrop = nil, nil, nil
  local m = gpt2.GPT2LMHeadModel(cfg)
  T.eq(m.config.resid_pdrop, 0, "a config table's default: none")
  local dir = tmp .. "/no_dropout_keys"
  hf.save_state_dict(dir, weights("gelu", m))
  T.write_file(dir .. "/config.json", cjson.encode(cfg))
  local l = gpt2.from_pretrained(dir)
  T.eq(l.config.resid_pdrop, 0.1); T.eq(l.config.embd_pdrop, 0.1); T.eq(l.config.attn_pdrop, 0.1)
  T.eq(gpt2.from_pretrained(dir, { config = { attn_pdrop = 0 } }).config.attn_pdrop, 0, "an override still wins")
  l:train()
  local a = zr.no_grad(function() return l(g.input_ids).logits end)
  assert((a - g["gelu.logits"]):abs():max():item() > 1e-3, "dropout acts while training")
  l:eval()
  T.near(zr.no_grad(function() return l(g.input_ids).logits end), g["gelu.logits"], 2e-5, 1e-4, "eval: no dropout")
end)

-- transformers 5.17 raises "IndexError: index out of range in self" (wpe) for a row longer than n_positions;
-- zrun names the limit and the fix in one line
T.test("gpt2: a row longer than n_positions is refused naming the limit and the fix", function()
  local m = gpt2.GPT2LMHeadModel(cjson.decode(meta.gelu))
  T.raises(function() m(zr.zeros({ 1, 13 }):to("i64")) end,
    "gpt2: sequence length 13 exceeds n_positions 12 (GPT-2's learned positions end there: cut rows to at most 12 tokens")
end)

-- weights that do not fit the config's model (here ln_f's missing): one line naming the folder and the fix, as Llama's
T.test("gpt2: a directory whose weights do not fit config.json's model is one line", function()
  local m = gpt2.GPT2LMHeadModel(cjson.decode(meta.gelu))
  local sd = weights("gelu", m)
  sd["transformer.ln_f.weight"] = nil
  local dir = tmp .. "/no_ln_f"
  hf.save_state_dict(dir, sd)
  T.write_file(dir .. "/config.json", meta.gelu)
  local err = T.raises(function() gpt2.from_pretrained(dir) end, "gpt2: " .. dir .. ": the weights do not fit config.json's " ..
    "model: Error(s) in loading state_dict for GPT2LMHeadModel: Missing key(s) in state_dict: \"transformer.ln_f.weight\".")
  T.eq(tostring(err):find("\n"), nil, "one line")
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
