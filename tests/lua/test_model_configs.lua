-- Model configs as transformers writes them (zrun.models.hf_config): both rope layouts resolve to
-- the same rotary tables, checked against tables computed here from the formulas; every field that
-- changes the computation and that zrun does not implement is refused in one line naming it;
-- malformed values are refused; fields with no effect on training pass.
local zr = require "zrun"
local T = zr.testing
local llama, gpt2 = zr.models.llama, zr.models.gpt2

local base = { hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1, num_attention_heads = 4,
  vocab_size = 50 }
local function cfg(extra, from)
  local c = {}
  for k, v in pairs(from or base) do c[k] = v end
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end
local gbase = { n_embd = 16, n_layer = 1, n_head = 2, vocab_size = 40, n_positions = 32 }

-- cos table (T, D) of a built model, and the same from the formulas: inverse frequency
-- theta^(-2i/D) (i = 0 .. D/2-1), divided by `scale(inv)`, repeated for both halves.
local function model_cos(c, T)
  local m = llama.LlamaForCausalLM(c)
  return (m.model:rope(T, "f32", "cpu"))
end
local function formula_cos(T, D, theta, scale)
  local rows = {}
  for t = 0, T - 1 do
    local row = {}
    for i = 0, D / 2 - 1 do
      local inv = theta ^ (-2 * i / D)
      inv = inv / (scale and scale(inv) or 1)
      row[i + 1] = math.cos(t * inv)
      row[i + 1 + D / 2] = row[i + 1]
    end
    rows[t + 1] = row
  end
  return zr.tensor(rows)
end
-- transformers' _compute_llama3_parameters, per frequency: the divisor applied to it
local function llama3(factor, low, high, old)
  return function(inv)
    local wavelen = 2 * math.pi / inv
    if wavelen < old / high then return 1 end
    if wavelen > old / low then return factor end
    local smooth = (old / wavelen - low) / (high - low)
    return 1 / ((1 - smooth) / factor + smooth)
  end
end

T.test("rope: legacy top-level keys and transformers 5's rope_parameters give the formula's tables", function()
  local want = formula_cos(40, 8, 500000, llama3(8, 1, 4, 16))
  local l3 = { rope_type = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0,
    original_max_position_embeddings = 16 }
  local new = cfg { rope_parameters = { rope_type = "llama3", rope_theta = 500000.0, factor = 8.0,
    low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 16 } }
  T.near(model_cos(cfg { rope_theta = 500000.0, rope_scaling = l3 }, 40), want, 2e-6, 0, "legacy keys")
  T.near(model_cos(new, 40), want, 2e-6, 0, "rope_parameters")
  -- transformers 4.3x's "type" key; original_max_position_embeddings from max_position_embeddings
  T.near(model_cos(cfg { rope_theta = 500000.0, max_position_embeddings = 16, rope_scaling = { type = "llama3",
    factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0 } }, 40), want, 2e-6, 0, "type key, default original max")
  -- rope_parameters without rope_theta takes the top-level one (transformers: setdefault)
  T.near(model_cos(cfg { rope_theta = 500000.0, rope_parameters = { rope_type = "llama3", factor = 8.0,
    low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 16 } }, 40), want, 2e-6, 0, "split theta")
  -- both layouts at once, agreeing (what zrun writes)
  T.near(model_cos(cfg { rope_theta = 500000.0, rope_scaling = l3, rope_parameters = new.rope_parameters }, 40),
    want, 2e-6, 0, "both layouts")
end)

T.test("rope: rope_type default reads its theta; nothing given means theta 10000", function()
  T.near(model_cos(cfg { rope_parameters = { rope_type = "default", rope_theta = 250000.0 } }, 33),
    formula_cos(33, 8, 250000), 2e-6, 0, "default with theta")
  T.near(model_cos(cfg {}, 33), formula_cos(33, 8, 10000), 2e-6, 0, "no rope keys")
  T.near(model_cos(cfg { rope_scaling = {}, rope_parameters = {} }, 33), formula_cos(33, 8, 10000), 2e-6, 0, "empty objects")
end)

T.test("rope: linear scaling divides every frequency by factor", function()
  local want = formula_cos(50, 8, 10000, function() return 2.5 end)
  T.near(model_cos(cfg { rope_parameters = { rope_type = "linear", factor = 2.5 } }, 50), want, 2e-6, 0, "rope_parameters")
  T.near(model_cos(cfg { rope_scaling = { type = "linear", factor = 2.5 } }, 50), want, 2e-6, 0, "legacy rope_scaling")
end)

-- Refusals: one line that names the field (and, where it helps, the value and what zrun does).
local refused = {
  { "rope type dynamic", cfg { rope_parameters = { rope_type = "dynamic", factor = 4.0, original_max_position_embeddings = 64 } },
    'rope_parameters.rope_type is "dynamic"; zrun implements the rope types "default", "linear", "llama3" and "yarn"' },
  { "yarn without factor", cfg { rope_parameters = { rope_type = "yarn", original_max_position_embeddings = 64 } },
    'rope_parameters.factor is missing %(required by rope_type "yarn"%)' },
  { "rope type dynamic (legacy)", cfg { rope_scaling = { type = "dynamic", factor = 2.0 } }, 'rope_scaling.rope_type is "dynamic"' },
  { "rope type longrope", cfg { rope_parameters = { rope_type = "longrope", short_factor = { 1 }, long_factor = { 1 } } },
    'rope_type is "longrope"' },
  { "partial rotary", cfg { rope_parameters = { rope_type = "default", partial_rotary_factor = 0.5 } },
    "rope_parameters.partial_rotary_factor is 0.5" },
  { "per-layer rope", cfg { rope_parameters = { full_attention = { rope_type = "default" } } }, "rope_parameters.full_attention is an object" },
  { "llama3 without low_freq_factor", cfg { rope_scaling = { rope_type = "llama3", factor = 8.0, high_freq_factor = 4.0 } },
    "rope_scaling.low_freq_factor is missing" },
  { "llama3 high <= low", cfg { rope_parameters = { rope_type = "llama3", factor = 8.0, low_freq_factor = 4.0,
    high_freq_factor = 1.0, original_max_position_embeddings = 16 } }, "high_freq_factor %(1%) must be greater than low_freq_factor %(4%)" },
  { "linear without factor", cfg { rope_parameters = { rope_type = "linear" } }, "rope_parameters.factor is missing" },
  { "string rope_theta", cfg { rope_theta = "10000" }, 'rope_theta must be a positive number, got "10000"' },
  { "negative theta in rope_parameters", cfg { rope_parameters = { rope_theta = -1 } }, "rope_parameters.rope_theta must be a positive number, got %-1" },
  { "rope_scaling not an object", cfg { rope_scaling = "llama3" }, 'rope_scaling must be an object, got "llama3"' },
  { "two layouts disagree", cfg { rope_scaling = { rope_type = "linear", factor = 2.0 },
    rope_parameters = { rope_type = "linear", factor = 4.0 } }, "rope_scaling .* and rope_parameters .* disagree" },
  { "two thetas disagree", cfg { rope_theta = 10000.0, rope_parameters = { rope_type = "default", rope_theta = 500000.0 } },
    "rope_theta %(10000%) and rope_parameters.rope_theta %(500000%) disagree" },
  { "attention dropout", cfg { attention_dropout = 0.1 }, "attention_dropout is 0.1: attention dropout is not implemented in zrun; "
    .. "train without it by loading with { config = { attention_dropout = 0 } }" },
  { "hidden_act gelu", cfg { hidden_act = "gelu" }, 'hidden_act is "gelu"; zrun\'s Llama MLP implements "silu"' },
  { "sliding window", cfg { sliding_window = 4096 }, "sliding_window is 4096 %(sliding%-window attention%)" },
  { "sliding layer types", cfg { layer_types = { "full_attention", "sliding_attention" } }, 'layer_types%[2%] is "sliding_attention"' },
  { "quantized", cfg { quantization_config = { quant_method = "bitsandbytes" } }, "quantization_config is .* %(quantized weights%)" },
  { "another family", cfg { model_type = "mistral" }, 'model_type is "mistral", not "llama"' },
  { "zero heads", cfg { num_attention_heads = 0 }, "num_attention_heads must be a positive integer, got 0" },
  { "negative size", cfg { hidden_size = -32 }, "hidden_size must be a positive integer, got %-32" },
  { "fractional vocab", cfg { vocab_size = 50.5 }, "vocab_size must be a positive integer, got 50.5" },
  { "string size", cfg { intermediate_size = "64" }, 'intermediate_size must be a positive integer, got "64"' },
  { "missing vocab", cfg { vocab_size = false }, "vocab_size must be a positive integer, got false" },
  { "hidden not divisible", cfg { hidden_size = 30 }, "hidden_size %(30%) must be a multiple of num_attention_heads %(4%), or head_dim must be given" },
  { "kv heads", cfg { num_key_value_heads = 3 }, "num_attention_heads %(4%) must be a multiple of num_key_value_heads %(3%)" },
  { "odd head_dim", cfg { head_dim = 7 }, "head_dim %(7%) must be even" },
  { "eps", cfg { rms_norm_eps = 0 }, "rms_norm_eps must be a positive number, got 0" },
  { "bias flag", cfg { attention_bias = "yes" }, 'attention_bias must be true or false, got "yes"' },
  { "pad_token_id outside the table", cfg { pad_token_id = 50 }, "pad_token_id must be an integer in %[%-50, 50%)" },
}
for _, r in ipairs(refused) do
  T.test("llama config refuses: " .. r[1], function()
    local ok, err = pcall(llama.LlamaForCausalLM, r[2])
    T.eq(ok, false, "refused")
    err = tostring(err)
    if not err:find("^llama config: ") or not err:find(r[3]) then
      error(("message %q does not start with 'llama config: ' and match %q"):format(err, r[3]))
    end
    T.eq(err:find("\n"), nil, "one line")
  end)
end
local missing = cfg {}
missing.vocab_size = nil
T.test("llama config refuses: missing vocab_size", function()
  T.raises(function() llama.LlamaForCausalLM(missing) end, "llama config: 'vocab_size' is missing")
end)

T.test("llama config: fields with no effect on training pass", function()
  local m = llama.LlamaForCausalLM(cfg { use_cache = true, bos_token_id = 1, eos_token_id = { 2, 3 }, pad_token_id = 0,
    pretraining_tp = 2, architectures = { "LlamaForCausalLM" }, transformers_version = "5.17.0", torch_dtype = "bfloat16",
    initializer_range = 0.01, max_position_embeddings = 8, id2label = { ["0"] = "A" }, attention_dropout = 0.0,
    hidden_act = "swish", attention_bias = false, mlp_bias = false, output_hidden_states = false, is_encoder_decoder = false,
    rope_scaling = { rope_type = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, attention_factor = 1.0 } })
  T.eq(m:parameters()[1]:dtype(), "f32", "torch_dtype is metadata: built in f32")
  T.eq(m.config.rope_parameters.original_max_position_embeddings, 8, "llama3 default from max_position_embeddings")
end)

-- pad_token_id is transformers' padding_idx (LlamaModel: nn.Embedding(vocab, hidden, config.pad_token_id)):
-- transformers 5.17, pad_token_id=3, f32, ids holding 3 at positions the loss counts: the gradient of
-- embed_tokens.weight[3] is exactly 0 with an untied head, and only the head's part when tied; the row
-- starts at 0. Without it zrun gave that row the lookup's gradient (|g| ~ 60 for a zero row under RMSNorm).
T.test("llama: pad_token_id's embedding row gets no gradient from the lookup (transformers' padding_idx)", function()
  zr.manual_seed(21)
  local c = cfg { pad_token_id = 3, num_hidden_layers = 2, initializer_range = 0.3 }
  local untied = llama.LlamaForCausalLM(c)
  T.eq(untied.model.embed_tokens.weight:narrow(1, 4, 1):abs():sum():item(), 0, "initialised to zero")
  local ids = (zr.rand({ 2, 12 }) * 49):to("i64")
  ids:narrow(2, 3, 2):fill_(3)
  ids:narrow(2, 6, 1):fill_(7)
  local function grads(m)
    m:zero_grad()
    m(ids, ids).loss:backward()
    return m.model.embed_tokens.weight.grad
  end
  local g = grads(untied)
  T.eq(g:narrow(1, 4, 1):abs():sum():item(), 0, "untied: pad row")
  if not (g:narrow(1, 8, 1):abs():sum():item() > 0) then error("untied: the other rows must have gradients") end
  -- tied: the pad row's gradient is the head's alone, what the untied twin's lm_head gets there
  local tied = llama.LlamaForCausalLM(cfg({ tie_word_embeddings = true }, c))
  local sd = untied:state_dict()
  zr.no_grad(function() sd["model.embed_tokens.weight"]:narrow(1, 4, 1):copy_(sd["lm_head.weight"]:narrow(1, 4, 1)) end)
  sd["lm_head.weight"] = nil
  tied:load_state_dict(sd, true)
  zr.no_grad(function() untied.lm_head.weight:copy_(tied.model.embed_tokens.weight) end)
  local gt = grads(tied)
  grads(untied)
  T.near(gt:narrow(1, 4, 1), untied.lm_head.weight.grad:narrow(1, 4, 1), 1e-6, 1e-5, "tied: pad row = head's part")
  -- no pad_token_id: every row the ids name gets the lookup's gradient
  local nopad = cfg({}, c)
  nopad.pad_token_id = nil
  local plain = llama.LlamaForCausalLM(nopad)
  if not (grads(plain):narrow(1, 4, 1):abs():sum():item() > 0) then error("no pad_token_id: row 3 must have a gradient") end
end)

local refused_gpt2 = {
  { "activation mish", cfg({ activation_function = "mish" }, gbase), 'activation_function is "mish"; zrun\'s GPT%-2 implements "gelu_new"' },
  { "scale flag not a boolean", cfg({ scale_attn_weights = 0 }, gbase), "scale_attn_weights must be true or false, got 0" },
  { "cross-attention", cfg({ add_cross_attention = true }, gbase), "add_cross_attention is true" },
  { "another family", cfg({ model_type = "gpt_neox" }, gbase), 'model_type is "gpt_neox", not "gpt2"' },
  { "n_embd not divisible", cfg({ n_head = 3 }, gbase), "n_embd %(16%) must be a multiple of n_head %(3%)" },
  { "dropout out of range", cfg({ resid_pdrop = 1 }, gbase), "resid_pdrop must be a probability in %[0, 1%), got 1" },
  { "zero layers", cfg({ n_layer = 0 }, gbase), "n_layer must be a positive integer, got 0" },
}
for _, r in ipairs(refused_gpt2) do
  T.test("gpt2 config refuses: " .. r[1], function()
    local ok, err = pcall(gpt2.GPT2LMHeadModel, r[2])
    T.eq(ok, false, "refused")
    err = tostring(err)
    if not err:find("^gpt2 config: ") or not err:find(r[3]) then
      error(("message %q does not start with 'gpt2 config: ' and match %q"):format(err, r[3]))
    end
  end)
end

-- Published configs (meta-llama/Llama-3.2-1B, transformers 4.45 layout; openai-community/gpt2)
-- load as they are, resolved as transformers resolves them.
T.test("published configs load: Llama-3.2-1B (legacy rope keys) and GPT-2 (dropout 0.1, n_ctx, summary_*)", function()
  local cjson = require "cjson"
  local l = llama.normalize_config(cjson.decode([[{"architectures": ["LlamaForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0,
    "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
    "use_cache": true, "vocab_size": 128256}]]))
  T.eq(zr.models.hf_config.show(l.rope_parameters), "{factor=32, high_freq_factor=4, low_freq_factor=1, "
    .. "original_max_position_embeddings=8192, rope_theta=500000, rope_type=\"llama3\"}")
  local g = zr.models.hf_config.gpt2(cjson.decode([[{"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12,
    "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": true, "summary_type": "cls_index", "summary_use_proj": true,
    "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}}, "vocab_size": 50257}]]))
  T.eq(g.attn_pdrop, 0.1); T.eq(g.gelu_approximate, "tanh")
end)

T.test("config.json decoded directly (JSON nulls as cjson.null) reads as transformers reads None", function()
  local cjson = require "cjson"
  local g = gpt2.GPT2LMHeadModel(cjson.decode('{"n_embd": 16, "n_layer": 1, "n_head": 2, "vocab_size": 40, '
    .. '"n_positions": 32, "n_inner": null, "summary_activation": null, "pad_token_id": null}'))
  T.eq(g.transformer.h[1].mlp.c_fc.weight:size(2), 64, "n_inner null: 4 * n_embd")
  local l = llama.LlamaForCausalLM(cjson.decode('{"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, '
    .. '"num_attention_heads": 4, "vocab_size": 50, "rope_scaling": null, "num_key_value_heads": null}'))
  T.eq(l.config.num_key_value_heads, 4)
end)

T.test("gpt2: eager attention (for attention dropout) is the fused causal attention when p = 0", function()
  zr.manual_seed(8)
  local q, k, v = zr.randn(2, 3, 7, 4, { dtype = "f64", requires_grad = true }), zr.randn(2, 3, 7, 4, { dtype = "f64",
    requires_grad = true }), zr.randn(2, 3, 7, 4, { dtype = "f64", requires_grad = true })
  local w = zr.randn(2, 3, 7, 4, { dtype = "f64" })
  local a = gpt2.eager_attention(q, k, v, 0)
  ;(a * w):sum():backward()
  local ga = { q.grad:clone(), k.grad:clone(), v.grad:clone() }
  q.grad, k.grad, v.grad = nil, nil, nil
  local b = zr.scaled_dot_product_attention(q, k, v)
  ;(b * w):sum():backward()
  T.near(a, b, 1e-12, 0, "forward")
  T.near(ga[1], q.grad, 1e-12, 0, "grad q"); T.near(ga[2], k.grad, 1e-12, 0, "grad k"); T.near(ga[3], v.grad, 1e-12, 0, "grad v")
end)

T.test("gpt2: embedding, residual and attention dropout act while training, not in eval", function()
  zr.manual_seed(3)
  local m = gpt2.GPT2LMHeadModel(cfg({ resid_pdrop = 0.5, embd_pdrop = 0.5, attn_pdrop = 0.5, n_ctx = 32,
    summary_first_dropout = 0.1 }, gbase))
  local plain = gpt2.GPT2LMHeadModel(cfg({}, gbase))
  plain:load_state_dict(m:state_dict(), true)
  local ids = (zr.rand({ 2, 9 }) * 39):to("i64")
  local ref = zr.no_grad(function() return plain(ids).logits end)
  m:eval()
  T.near(zr.no_grad(function() return m(ids).logits end), ref, 0, 0, "eval: no dropout")
  m:train()
  local d = (zr.no_grad(function() return m(ids).logits end) - ref):abs():max():item()
  if not (d > 1e-2) then error("training: dropout changed the logits by only " .. d) end
  -- attention dropout alone changes the training forward too
  local a = gpt2.GPT2LMHeadModel(cfg({ attn_pdrop = 0.5 }, gbase))
  a:load_state_dict(m:state_dict(), true)
  d = (zr.no_grad(function() return a(ids).logits end) - ref):abs():max():item()
  if not (d > 1e-3) then error("training: attention dropout changed the logits by only " .. d) end
end)

T.test("gpt2: with dropout, gradient checkpointing replays the same masks (same gradients)", function()
  local c = cfg({ resid_pdrop = 0.3, embd_pdrop = 0.3, attn_pdrop = 0.3, n_layer = 2 }, gbase)
  zr.manual_seed(11)
  local m = gpt2.GPT2LMHeadModel(c)
  local ids = (zr.rand({ 2, 9 }) * 39):to("i64")
  local function grads()
    m:zero_grad()
    zr.manual_seed(12)
    m(ids, ids).loss:backward()
    local g = {}
    for n, p in m:named_parameters() do g[n] = p.grad:clone() end
    return g
  end
  local plain = grads()
  m:gradient_checkpointing_enable()
  local ckpt = grads()
  for n, g in pairs(plain) do T.near(ckpt[n], g, 1e-6, 1e-5, n) end
end)

-- transformers 5.17's GPT2PreTrainedModel._init_weights (GPT-2's scheme): c_proj weights (attention and
-- MLP) from N(0, initializer_range / sqrt(2 n_layer)), the other Conv1Ds and the embeddings from
-- N(0, initializer_range); there, n_layer 8: c_proj std 0.0049-0.0050, c_attn/c_fc/wte 0.020. zrun drew
-- c_proj from N(0, 0.02) too.
T.test("gpt2: init as transformers' (c_proj scaled by 1/sqrt(2 n_layer))", function()
  zr.manual_seed(5)
  local m = gpt2.GPT2LMHeadModel(cfg({ n_embd = 64, n_layer = 8, n_head = 4, vocab_size = 100 }, gbase))
  local function rms(p) return (p * p):mean():item() ^ 0.5 end
  for n, p in m:named_parameters() do
    local want = n:match("c_proj%.weight$") and 0.02 / 4 or (n:match("c_attn%.weight$") or n:match("c_fc%.weight$")
      or n:match("wte") or n:match("wpe")) and 0.02 or nil
    if want then T.near(rms(p), want, 0, 0.1, n) end
  end
end)

T.test("gpt2: exact gelu for activation_function \"gelu\", tanh form for gelu_new", function()
  zr.manual_seed(4)
  local tanh = gpt2.GPT2LMHeadModel(cfg({}, gbase))
  local exact = gpt2.GPT2LMHeadModel(cfg({ activation_function = "gelu" }, gbase))
  exact:load_state_dict(tanh:state_dict(), true)
  local x = zr.randn(3, 16)
  T.near(exact.transformer.h[1].mlp:forward(x), tanh.transformer.h[1].mlp.c_proj(
    tanh.transformer.h[1].mlp.c_fc(x):gelu()), 0, 0, "exact")
  T.near(tanh.transformer.h[1].mlp:forward(x), tanh.transformer.h[1].mlp.c_proj(
    tanh.transformer.h[1].mlp.c_fc(x):gelu("tanh")), 0, 0, "tanh")
end)

T.done()
