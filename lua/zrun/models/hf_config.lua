-- Hugging Face config.json fields for zrun's model families (llama, mistral, qwen2, qwen3, phi3, gemma3_text, gpt2). Reads a
-- config as transformers 4 writes it (rope_theta / rope_scaling at the top level) and as
-- transformers 5 writes it (rope_parameters, with rope_theta inside; dtype for torch_dtype), checks
-- every field that LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM /
-- GPT2LMHeadModel read, and refuses -- one line naming the field, the value and what zrun supports -- a value that
-- changes the computation in a way zrun does not implement.
-- Fields that do not change training (ids, use_cache, architectures, ...) pass untouched.
-- Also gives the config.json layout to write back. Not here: files (hf.lua), modules (llama.lua).
local M = {}

local fmt, type, pairs, ipairs, tostring, floor, huge = string.format, type, pairs, ipairs, tostring, math.floor, math.huge

-- A deep copy without JSON nulls (a table decoded with cjson directly holds cjson.null, which
-- transformers reads as None: the field's default).
local null = require("cjson").null
local function copy(t)
  local c = {}
  for k, v in pairs(t) do
    if v ~= null then c[k] = type(v) == "table" and copy(v) or v end
  end
  return c
end

-- A value as it reads in JSON: strings quoted, tables as {k=v, ...} (sorted, one level deep).
local function show(v)
  if type(v) == "string" then return '"' .. v .. '"' end
  if type(v) == "number" then
    if v == floor(v) and math.abs(v) < 2 ^ 53 then return fmt("%d", v) end
    for p = 15, 16 do -- the shortest form that reads back exactly
      local s = fmt("%." .. p .. "g", v)
      if tonumber(s) == v then return s end
    end
    return fmt("%.17g", v)
  end
  if type(v) ~= "table" then return tostring(v) end
  local ks = {}
  for k in pairs(v) do ks[#ks + 1] = tostring(k) end
  table.sort(ks)
  for i, k in ipairs(ks) do
    local x = v[k] == nil and v[tonumber(k)] or v[k]
    ks[i] = k .. "=" .. (type(x) == "table" and "{...}" or show(x))
  end
  return "{" .. table.concat(ks, ", ") .. "}"
end
M.show = show

local function fail(family, msg, ...) error(fmt("%s config: " .. msg, family, ...), 0) end

-- The model types zrun implements, as error messages list them.
M.MODEL_TYPES = "llama, mistral, qwen2, qwen3, phi3, gemma3_text and gpt2"

-- Field checks. `name` is what the message calls the field (e.g. "rope_parameters.factor").
local function is_int(v) return type(v) == "number" and v == floor(v) and v > -huge and v < huge end

local function pos_int(family, name, v)
  if not is_int(v) or v <= 0 then fail(family, "%s must be a positive integer, got %s", name, show(v)) end
  return v
end
local function pos_num(family, name, v)
  if type(v) ~= "number" or not (v > 0) or v == huge then
    fail(family, "%s must be a positive number, got %s", name, show(v))
  end
  return v
end
local function nonneg_num(family, name, v)
  if type(v) ~= "number" or not (v >= 0) or v == huge then
    fail(family, "%s must be a number >= 0, got %s", name, show(v))
  end
  return v
end
local function bool(family, name, v)
  if type(v) ~= "boolean" then fail(family, "%s must be true or false, got %s", name, show(v)) end
  return v
end
local function required_int(family, c, k)
  if c[k] == nil then fail(family, "'%s' is missing (a positive integer)", k) end
  return pos_int(family, k, c[k])
end

-- Fields of neighbouring families that mean the checkpoint expects a computation zrun's classes do
-- not do; transformers' LlamaForCausalLM / GPT2LMHeadModel would ignore them and silently differ,
-- so zrun refuses them (unless they hold their neutral value).
local FOREIGN = {
  sliding_window = { nil, "sliding-window attention" },
  use_sliding_window = { false, "sliding-window attention" },
  attn_logit_softcapping = { nil, "attention logit soft-capping" },
  final_logit_softcapping = { nil, "final logit soft-capping" },
  quantization_config = { nil, "quantized weights" },
  use_qk_norm = { false, "query/key normalisation" },
  qk_layernorm = { false, "query/key normalisation" },
  partial_rotary_factor = { 1, "partial rotary embeddings" },
}
-- own: keys the family reads itself (mistral's and qwen2's sliding_window), not checked here.
local function refuse_foreign(family, c, supported, own)
  for k, spec in pairs(FOREIGN) do
    local v = c[k]
    if v ~= nil and v ~= spec[1] and not (own and own[k]) then
      fail(family, "%s is %s (%s); zrun's %s implements %s", k, show(v), spec[2], family, supported)
    end
  end
  if c.layer_types ~= nil and not (own and own.layer_types) then
    if type(c.layer_types) ~= "table" then fail(family, "layer_types must be a list, got %s", show(c.layer_types)) end
    for i, t in ipairs(c.layer_types) do
      if t ~= "full_attention" then
        fail(family, "layer_types[%d] is %s; zrun's %s implements full (causal) attention in every layer", i, show(t), family)
      end
    end
  end
end

local function model_type(family, c)
  if c.model_type ~= nil and c.model_type ~= family then
    fail(family, "model_type is %s, not %s; zrun implements the model types %s",
      show(c.model_type), show(family), M.MODEL_TYPES)
  end
end

-- Dropout zrun cannot apply: a hint to load without it, as transformers' from_pretrained(..., key=0.0).
local function refuse_dropout(family, name, v, what)
  fail(family, "%s is %s: %s is not implemented in zrun; train without it by loading with "
    .. "{ config = { %s = 0 } } (transformers: from_pretrained(..., %s=0.0))", name, show(v), what, name, name)
end

-- ---------------------------------------------------------------- rotary embeddings

local ROPE_TYPES = '"default", "linear", "llama3" and "yarn"'

-- The rope parameters as transformers 5 resolves them (RotaryEmbeddingConfigMixin): a non-empty
-- rope_scaling wins over rope_parameters, rope_type falls back to the legacy "type" and then
-- "default", rope_theta to the top-level rope_theta and then 10000, and llama3's
-- original_max_position_embeddings to max_position_embeddings. Returns the canonical table
-- { rope_type=, rope_theta=, factor=, ... } (what transformers 5 writes as rope_parameters).
function M.rope_parameters(family, c)
  local scaling, params = c.rope_scaling, c.rope_parameters
  for _, k in ipairs { "rope_scaling", "rope_parameters" } do
    if c[k] ~= nil and type(c[k]) ~= "table" then fail(family, "%s must be an object, got %s", k, show(c[k])) end
  end
  if scaling and next(scaling) == nil then scaling = nil end
  if params and next(params) == nil then params = nil end
  local function resolve(src, name)
    local r = copy(src or {})
    for k, v in pairs(r) do
      if type(v) == "table" and k ~= "short_factor" and k ~= "long_factor" then
        fail(family, "%s.%s is an object: per-layer-type rope parameters are not implemented (zrun's %s uses one "
          .. "rotary embedding in every layer)", name, tostring(k), family)
      end
    end
    if r.rope_type == nil then r.rope_type = r.type end
    r.type = nil
    if r.rope_type == nil then r.rope_type = "default" end
    if type(r.rope_type) ~= "string" then fail(family, "%s.rope_type must be a string, got %s", name, show(r.rope_type)) end
    local from = name .. ".rope_theta"
    if r.rope_theta == nil then r.rope_theta, from = c.rope_theta, "rope_theta" end
    if r.rope_theta == nil then r.rope_theta = 10000.0 end
    pos_num(family, from, r.rope_theta)
    local t = r.rope_type
    -- llama3's and yarn's pretraining length: the top-level key first (transformers' standardize_rope_params
    -- gives it priority), then the rope table's, then max_position_embeddings
    local function original_max()
      if c.original_max_position_embeddings ~= nil then
        r.original_max_position_embeddings = c.original_max_position_embeddings
      elseif r.original_max_position_embeddings == nil then
        r.original_max_position_embeddings = c.max_position_embeddings
      end
      if r.original_max_position_embeddings == nil then
        fail(family, "%s.original_max_position_embeddings is missing (required by rope_type %s)", name, show(t))
      end
      pos_num(family, name .. ".original_max_position_embeddings", r.original_max_position_embeddings)
    end
    if t == "default" then
      for _, k in ipairs { "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings" } do
        r[k] = nil -- transformers' default rope reads none of them
      end
    elseif t == "linear" then
      if r.factor == nil then fail(family, "%s.factor is missing (required by rope_type \"linear\")", name) end
      pos_num(family, name .. ".factor", r.factor)
    elseif t == "llama3" then
      for _, k in ipairs { "factor", "low_freq_factor", "high_freq_factor" } do
        if r[k] == nil then fail(family, "%s.%s is missing (required by rope_type \"llama3\")", name, k) end
        pos_num(family, name .. "." .. k, r[k])
      end
      original_max()
      if not (r.high_freq_factor > r.low_freq_factor) then
        fail(family, "%s.high_freq_factor (%s) must be greater than low_freq_factor (%s)", name,
          show(r.high_freq_factor), show(r.low_freq_factor))
      end
    elseif t == "yarn" then
      -- transformers' _compute_yarn_parameters (factor required by its validation; the others optional)
      if r.factor == nil then fail(family, "%s.factor is missing (required by rope_type \"yarn\")", name) end
      pos_num(family, name .. ".factor", r.factor)
      original_max()
      for _, k in ipairs { "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim" } do
        if r[k] ~= nil and type(r[k]) ~= "number" then fail(family, "%s.%s must be a number, got %s", name, k, show(r[k])) end
      end
      if r.truncate ~= nil and type(r.truncate) ~= "boolean" then
        fail(family, "%s.truncate must be true or false, got %s", name, show(r.truncate))
      end
    else
      fail(family, "%s.rope_type is %s; zrun implements the rope types %s", name, show(t), ROPE_TYPES)
    end
    if r.partial_rotary_factor ~= nil and r.partial_rotary_factor ~= 1 then
      fail(family, "%s.partial_rotary_factor is %s; zrun rotates the whole head (1.0)", name, show(r.partial_rotary_factor))
    end
    r.partial_rotary_factor = nil
    -- keys transformers reads only for other rope types (attention_factor, beta_fast, ...) are
    -- ignored by it for the others, and so by zrun
    if t ~= "yarn" then
      for _, k in ipairs { "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate" } do
        r[k] = nil
      end
    end
    r.short_factor, r.long_factor = nil, nil
    if t ~= "llama3" then r.low_freq_factor, r.high_freq_factor = nil, nil end
    if t ~= "llama3" and t ~= "yarn" then r.original_max_position_embeddings = nil end
    return r
  end
  local r = resolve(scaling or params, scaling and "rope_scaling" or "rope_parameters")
  if scaling and params then
    -- transformers 4 reads only rope_scaling, transformers 5 prefers it: two that disagree are a
    -- hand-edited file whose meaning depends on the reader
    local other = resolve(params, "rope_parameters")
    if show(other) ~= show(r) then
      fail(family, "rope_scaling %s and rope_parameters %s disagree; keep one (transformers 5 writes rope_parameters)",
        show(r), show(other))
    end
  end
  local inner = (scaling or params or {}).rope_theta
  if inner ~= nil and c.rope_theta ~= nil and inner ~= c.rope_theta then
    fail(family, "rope_theta (%s) and %s.rope_theta (%s) disagree; keep one (transformers 5 writes rope_parameters)",
      show(c.rope_theta), scaling and "rope_scaling" or "rope_parameters", show(inner))
  end
  return r
end

-- Options for zr.rope_tables from canonical rope parameters. "linear" divides every inverse
-- frequency by factor (transformers: inv_freq /= factor); that is llama3 scaling whose
-- low-frequency band (wavelengths above original_max / low_freq_factor = 2^-100) holds every
-- frequency, so the same kernel computes it.
-- longrope (Phi-3) needs c (the normalised config) and seq_len, the largest position + 1 of the forward
-- (transformers' longrope_frequency_update): long_factor beyond original_max_position_embeddings, short_factor
-- within. "yarn" (Qwen2.5's and Qwen3's long-context setting, DeepSeek's mscale form) hands its fields to
-- zr.rope_tables, which computes _compute_yarn_parameters' blend and attention factor.
function M.rope_tables_options(r, c, seq_len)
  local o = { theta = r.rope_theta }
  if r.rope_type == "longrope" then
    local long = seq_len and seq_len > r.original_max_position_embeddings
    o.rope_scaling = { rope_type = "longrope", ext_factors = long and r.long_factor or r.short_factor,
      attention_factor = M.longrope_attention_factor(c) }
  end
  if r.rope_type == "llama3" then
    o.rope_scaling = { rope_type = "llama3", factor = r.factor, low_freq_factor = r.low_freq_factor,
      high_freq_factor = r.high_freq_factor, original_max_position_embeddings = r.original_max_position_embeddings }
  elseif r.rope_type == "linear" then
    o.rope_scaling = { rope_type = "llama3", factor = r.factor, low_freq_factor = 2 ^ 100,
      high_freq_factor = 2 ^ 101, original_max_position_embeddings = 1 }
  elseif r.rope_type == "yarn" then
    o.rope_scaling = { rope_type = "yarn", factor = r.factor, original_max_position_embeddings =
      r.original_max_position_embeddings, beta_fast = r.beta_fast, beta_slow = r.beta_slow, truncate = r.truncate,
      attention_factor = r.attention_factor, mscale = r.mscale, mscale_all_dim = r.mscale_all_dim }
  end
  return o
end

-- ---------------------------------------------------------------- llama, mistral, qwen2, qwen3

local LLAMA_ACTS = { silu = true, swish = true } -- transformers' ACT2FN: "swish" is SiLU
local CONFIG_CLASS = { llama = "Llama", mistral = "Mistral", qwen2 = "Qwen2", qwen3 = "Qwen3" }

-- The Llama architecture's model types and what each fills where config.json is silent, as
-- transformers' LlamaConfig / MistralConfig / Qwen2Config / Qwen3Config do (the sizes stay required, as
-- zrun's Llama always required them). num_key_value_heads: a number, or "heads" (num_attention_heads);
-- head_dim: Qwen3Config's 128 (not hidden_size / num_attention_heads) where config.json has none.
local FAMILY = {
  llama = { num_key_value_heads = "heads", max_position_embeddings = 2048 },
  mistral = { num_key_value_heads = 8, max_position_embeddings = 4096 * 32, sliding_window = 4096 },
  qwen2 = { num_key_value_heads = 32, max_position_embeddings = 32768, sliding_window = 4096, max_window_layers = 28 },
  qwen3 = { num_key_value_heads = 32, max_position_embeddings = 32768, sliding_window = 4096, max_window_layers = 28,
    head_dim = 128 },
  phi3 = { num_key_value_heads = "heads", max_position_embeddings = 4096, sliding_window = false, rms_norm_eps = 1e-5 },
}

-- Fields whose JSON null is not their absence: null is None, absence the default (MistralConfig's
-- sliding_window 4096, num_key_value_heads 8). Kept as false (hf.read_config: nulls are dropped
-- elsewhere), and written back as null (M.to_hf).
M.NULL_IS_NOT_DEFAULT = { mistral = { sliding_window = true, num_key_value_heads = true },
  qwen2 = { sliding_window = true, num_key_value_heads = true }, qwen3 = { sliding_window = true, num_key_value_heads = true },
  phi3 = { pad_token_id = true, bos_token_id = true, eos_token_id = true, sliding_window = true },
  gemma3_text = { sliding_window = true, pad_token_id = true, bos_token_id = true, eos_token_id = true } }
-- In a decoded config.json (cjson.null values), those fields' nulls as false; the table, changed.
function M.keep_nulls(t)
  local keys = type(t) == "table" and M.NULL_IS_NOT_DEFAULT[t.model_type]
  for k in pairs(keys or {}) do
    if t[k] == null then t[k] = false end
  end
  return t
end

-- attention_bias / mlp_bias in a mistral or qwen2 config: transformers' classes hard-code their
-- biases (Mistral none; Qwen2 q/k/v only) and never read these fields, so a true one asks for a
-- model neither computes.
local function fixed_biases(F, c, what)
  for _, k in ipairs { "attention_bias", "mlp_bias" } do
    if c[k] ~= nil and bool(F, k, c[k]) then
      fail(F, "%s is true, but transformers' %s does not read it (%s); for other biases use model_type \"llama\"",
        k, F == "mistral" and "MistralForCausalLM" or "Qwen2ForCausalLM", what)
    end
  end
end

-- A sliding_window value: false (None: no window) or a positive integer; nil: the family's default.
local function window(F, c, d)
  local w = c.sliding_window
  if w == nil then w = d.sliding_window end
  if w ~= false then pos_int(F, "sliding_window", w) end
  return w
end

-- Mistral's window (MistralModel: sliding-window masks in every layer unless sliding_window is None).
-- layer_types is no MistralConfig field (transformers warns and reads it nowhere): accepted only
-- when it says what Mistral does anyway, full attention in each layer (the window aside).
local function mistral_fields(F, c, d)
  fixed_biases(F, c, "MistralForCausalLM has no biases")
  c.sliding_window = window(F, c, d)
  if c.layer_types ~= nil then
    if type(c.layer_types) ~= "table" then fail(F, "layer_types must be a list, got %s", show(c.layer_types)) end
    for i, t in ipairs(c.layer_types) do
      if t ~= "full_attention" then
        fail(F, "layer_types[%d] is %s; transformers' MistralForCausalLM ignores layer_types (sliding_window applies "
          .. "to every layer): a per-layer pattern is model_type \"ministral\", which zrun does not implement", i,
          show(t))
      end
    end
  end
end

-- A config's layer_types lt checked (nil: filled by the caller first): num_hidden_layers entries, each
-- "full_attention" or "sliding_attention", the latter only with a sliding_window (transformers' forward raises
-- without one; why: what the message adds). Returns lt.
local function layer_types(F, c, lt, why)
  if type(lt) ~= "table" or #lt ~= c.num_hidden_layers then
    fail(F, "layer_types must be a list of num_hidden_layers (%d) entries, got %s", c.num_hidden_layers, show(lt))
  end
  for i, t in ipairs(lt) do
    if t ~= "full_attention" and t ~= "sliding_attention" then
      fail(F, "layer_types[%d] is %s; zrun's %s implements \"full_attention\" and \"sliding_attention\"", i, show(t), F)
    end
    if t == "sliding_attention" and not c.sliding_window then
      fail(F, "layer_types[%d] is \"sliding_attention\" but sliding_window is null%s", i, why)
    end
  end
  return lt
end

-- Qwen2Config.__post_init__ (Qwen3Config's is the same): the window only with use_sliding_window, in the
-- layers from max_window_layers on (0-based) unless layer_types says which; Qwen2Attention slides exactly
-- the "sliding_attention" layers. Fills layer_types as transformers does (and writes it).
local function qwen2_fields(F, c, d)
  if F == "qwen2" then
    fixed_biases(F, c, "Qwen2ForCausalLM has biases on q_proj, k_proj and v_proj only")
  else -- Qwen3Attention reads attention_bias (q/k/v/o); Qwen3MLP has no bias and reads no mlp_bias
    if c.attention_bias == nil then c.attention_bias = false end
    bool(F, "attention_bias", c.attention_bias)
    if c.mlp_bias ~= nil and bool(F, "mlp_bias", c.mlp_bias) then
      fail(F, "mlp_bias is true, but transformers' Qwen3ForCausalLM does not read it (its MLP has no biases); "
        .. "for MLP biases use model_type \"llama\"")
    end
  end
  if c.use_sliding_window == nil then c.use_sliding_window = false end
  bool(F, "use_sliding_window", c.use_sliding_window)
  local w = window(F, c, d)
  c.sliding_window = c.use_sliding_window and w or false
  c.max_window_layers = c.max_window_layers or d.max_window_layers
  if not is_int(c.max_window_layers) or c.max_window_layers < 0 then
    fail(F, "max_window_layers must be an integer >= 0, got %s", show(c.max_window_layers))
  end
  local L, lt = c.num_hidden_layers, c.layer_types
  if lt == nil then
    lt = {}
    for i = 1, L do
      lt[i] = (c.sliding_window and i - 1 >= c.max_window_layers) and "sliding_attention" or "full_attention"
    end
  end
  c.layer_types = layer_types(F, c, lt, fmt(" (use_sliding_window is %s)", show(c.use_sliding_window)))
end

-- Layer i's (1-based) attention window in a normalised llama-family config: keys this many positions
-- or more before the query are masked (transformers' sliding_window_overlay: kept while q - k <
-- window): Mistral's and Phi-3's in every layer, Qwen2's, Qwen3's and Gemma 3's where layer_types says
-- "sliding_attention"; nil: full causal attention.
function M.layer_window(c, i)
  if c.model_type == "mistral" or c.model_type == "phi3" then return c.sliding_window or nil end
  local t = c.model_type
  if (t == "qwen2" or t == "qwen3" or t == "gemma3_text") and c.sliding_window and c.layer_types[i] == "sliding_attention" then
    return c.sliding_window
  end
  return nil
end

-- The attention window of a normalised llama-family config (M.layer_window's, the same in every layer
-- that has one) and whether other layers attend fully: nil when no layer has a window. Sequences no
-- longer than it attend causally.
function M.attention_window(c)
  local w, full = nil, false
  for i = 1, c.num_hidden_layers do
    local lw = M.layer_window(c, i)
    if lw then w = lw else full = true end
  end
  return w, w ~= nil and full
end

-- A Llama-architecture config (a config.json table or zrun's own) of model type F checked and
-- normalised: defaults filled as transformers' config class of F fills them, the rope resolved into
-- rope_parameters (rope_theta and rope_scaling removed: one source of truth), dtype/device left to
-- the caller.
local function llama_arch(F, cfg)
  local d = FAMILY[F]
  local nulls = {}
  for k in pairs(M.NULL_IS_NOT_DEFAULT[F] or {}) do -- (a table decoded with cjson: its nulls)
    if cfg[k] == null then nulls[#nulls + 1] = k end
  end
  if #nulls > 0 then -- (one copy: copy drops every null)
    cfg = copy(cfg)
    for _, k in ipairs(nulls) do cfg[k] = false end
  end
  local c = copy(cfg)
  model_type(F, c)
  for _, k in ipairs { "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size" } do
    required_int(F, c, k)
  end
  local H = c.num_attention_heads
  local kv = c.num_key_value_heads
  if kv == nil then kv = d.num_key_value_heads end
  if kv == "heads" or kv == false then kv = H end -- (false: JSON null, None: one per query head)
  c.num_key_value_heads = pos_int(F, "num_key_value_heads", kv)
  if H % c.num_key_value_heads ~= 0 then
    fail(F, "num_attention_heads (%d) must be a multiple of num_key_value_heads (%d%s)", H, c.num_key_value_heads,
      cfg.num_key_value_heads == nil and d.num_key_value_heads ~= "heads"
        and fmt(", %sConfig's default where config.json has none", CONFIG_CLASS[F]) or "")
  end
  if c.head_dim == nil then c.head_dim = d.head_dim end -- (Qwen3Config's 128)
  if c.head_dim == nil then
    if c.hidden_size % H ~= 0 then
      fail(F, "hidden_size (%d) must be a multiple of num_attention_heads (%d), or head_dim must be given",
        c.hidden_size, H)
    end
  else
    pos_int(F, "head_dim", c.head_dim)
  end
  local hd = c.head_dim or c.hidden_size / H
  if hd % 2 ~= 0 then fail(F, "head_dim (%d) must be even: rotary embeddings rotate pairs of channels", hd) end
  -- no limit on zrun's sequence length; transformers' default matters as llama3's default
  -- original_max_position_embeddings
  c.max_position_embeddings = pos_int(F, "max_position_embeddings",
    c.max_position_embeddings or d.max_position_embeddings)
  c.rms_norm_eps = pos_num(F, "rms_norm_eps", c.rms_norm_eps or d.rms_norm_eps or 1e-6)
  c.initializer_range = nonneg_num(F, "initializer_range", c.initializer_range or 0.02)
  if F == "llama" then
    for _, k in ipairs { "attention_bias", "mlp_bias" } do
      if c[k] == nil then c[k] = false end
      bool(F, k, c[k])
    end
  end
  if c.tie_word_embeddings == nil then c.tie_word_embeddings = false end
  bool(F, "tie_word_embeddings", c.tie_word_embeddings)
  c.model_type = F
  c.hidden_act = c.hidden_act or "silu"
  if not LLAMA_ACTS[c.hidden_act] then
    fail(F, "hidden_act is %s; zrun's Llama MLP implements \"silu\" (SwiGLU)", show(c.hidden_act))
  end
  if c.attention_dropout ~= nil then
    nonneg_num(F, "attention_dropout", c.attention_dropout)
    if c.attention_dropout ~= 0 then refuse_dropout(F, "attention_dropout", c.attention_dropout, "attention dropout") end
  end
  -- pretraining_tp > 1 made transformers split each projection into that many slices and add
  -- the partial products: the same sum, rounded differently; zrun does one product.
  if c.pretraining_tp ~= nil then pos_int(F, "pretraining_tp", c.pretraining_tp) end
  -- pad_token_id is the embedding's padding_idx (transformers: nn.Embedding(..., config.pad_token_id)):
  -- that row gets no gradient from the lookup and starts at zero; torch refuses one outside the table
  local pad, V = c.pad_token_id, c.vocab_size
  if pad ~= nil and pad ~= false and (not is_int(pad) or pad < -V or pad >= V) then
    fail(F, "pad_token_id must be an integer in [%d, %d) (the embedding's padding_idx) or null, got %s", -V, V, show(pad))
  end
  local own
  if F == "mistral" then
    mistral_fields(F, c, d)
    own = { sliding_window = true, layer_types = true }
  elseif F == "qwen2" or F == "qwen3" then
    qwen2_fields(F, c, d)
    own = { sliding_window = true, use_sliding_window = true, layer_types = true }
    -- (Qwen3 normalises q and k whatever these say: transformers' Qwen3Attention reads neither)
    if F == "qwen3" then own.use_qk_norm, own.qk_layernorm = true, true end
  elseif F == "phi3" then
    M.phi3_fields(F, c, d)
    own = { sliding_window = true, partial_rotary_factor = true }
  end
  refuse_foreign(F, c, "full causal attention with rotary embeddings", own)
  c.rope_parameters = F == "phi3" and M.phi3_rope(F, c) or M.rope_parameters(F, c)
  c.rope_theta, c.rope_scaling = nil, nil
  if F == "phi3" then c.partial_rotary_factor = nil end -- (inside rope_parameters)
  return c
end

-- A Llama config (a config.json table or zrun's own) checked and normalised: defaults filled as
-- transformers' LlamaConfig fills them, the rope resolved into rope_parameters (rope_theta and
-- rope_scaling removed: one source of truth), dtype/device left to the caller.
function M.llama(cfg) return llama_arch("llama", cfg) end
-- A Mistral config, as M.llama with MistralConfig's defaults: Llama's architecture without biases,
-- and a sliding window (default 4096; false or JSON null: none) that M.attention_window reports.
function M.mistral(cfg) return llama_arch("mistral", cfg) end
-- A Qwen2 config, as M.llama with Qwen2Config's defaults: Llama's architecture with biases on
-- q/k/v, and Qwen2's sliding-window fields (filled as Qwen2Config.__post_init__ does).
function M.qwen2(cfg) return llama_arch("qwen2", cfg) end
-- A Qwen3 config, as M.qwen2 with Qwen3Config's defaults: Llama's architecture with q_norm / k_norm
-- (RMSNorm over each head), head_dim 128 where none is given, attention_bias (q/k/v/o, default false)
-- and Qwen2's sliding-window fields.
function M.qwen3(cfg) return llama_arch("qwen3", cfg) end

-- A Phi-3 config (Phi3ForCausalLM: microsoft/Phi-3-mini-4k-instruct, Phi-3.5-mini, Phi-4-mini), as M.llama
-- with Phi3Config's defaults: rms_norm_eps 1e-5, max_position_embeddings and original_max_position_embeddings
-- 4096, bos 1, eos and pad 32000 (a JSON null: none), no window (sliding_window: M.attention_window), the
-- rope "default" or "longrope" with partial_rotary_factor (M.phi3_rope). Its fused qkv_proj / gate_up_proj are
-- zrun.models.phi3's business.
function M.phi3(cfg) return llama_arch("phi3", cfg) end

-- Phi3Config's own fields on c (normalised in place): no biases, the window (None by default),
-- the dropouts (transformers applies resid_pdrop and attention_dropout in training: zrun refuses a
-- non-zero one; embd_pdrop is read by no Phi-3 module of transformers 5.17, so any value is kept
-- and means nothing), the special ids' defaults.
function M.phi3_fields(F, c, d)
  for _, k in ipairs { "attention_bias", "mlp_bias" } do
    if c[k] ~= nil and bool(F, k, c[k]) then
      fail(F, "%s is true, but transformers' Phi3ForCausalLM has no biases and does not read it", k)
    end
  end
  c.sliding_window = window(F, c, d)
  if c.layer_types ~= nil then fail(F, "layer_types is given; transformers' Phi3ForCausalLM does not read it (one "
    .. "attention in every layer): remove it") end
  for _, k in ipairs { "resid_pdrop", "embd_pdrop", "attention_dropout" } do
    if c[k] == nil then c[k] = 0.0 end
    if type(c[k]) ~= "number" or not (c[k] >= 0 and c[k] < 1) then
      fail(F, "%s must be a probability in [0, 1), got %s", k, show(c[k]))
    end
  end
  if c.resid_pdrop ~= 0 then refuse_dropout(F, "resid_pdrop", c.resid_pdrop, "residual dropout") end
  if c.original_max_position_embeddings == nil then c.original_max_position_embeddings = 4096 end
  pos_int(F, "original_max_position_embeddings", c.original_max_position_embeddings)
  for k, v in pairs { bos_token_id = 1, eos_token_id = 32000, pad_token_id = 32000 } do
    if c[k] == nil then c[k] = v end -- (false: JSON null, None, written back as null)
  end
  local pad, V = c.pad_token_id, c.vocab_size
  if pad and (not is_int(pad) or pad < -V or pad >= V) then
    fail(F, "pad_token_id %s is outside the vocabulary (%d; the embedding's padding_idx%s); set pad_token_id in "
      .. "[0, %d) or null", show(pad), V, c.pad_token_id == 32000 and ", Phi3Config's default 32000" or "", V)
  end
end

-- Phi-3's rope (Phi3Config.convert_rope_params_to_dict / validate_rope and transformers'
-- _compute_longrope_parameters): rope_scaling (or rope_parameters) of type "default" or "longrope"
-- ("su" and "yarn" read as "longrope", as Phi3Config does); partial_rotary_factor from the rope table or
-- the top level (default 1.0); longrope's short_factor and long_factor of rotary_dim/2 numbers each, and
-- original_max_position_embeddings from the top level (transformers gives it priority). Canonical:
-- { rope_type=, rope_theta=, partial_rotary_factor= [, short_factor=, long_factor=,
-- original_max_position_embeddings= [, factor=, attention_factor=]] }.
function M.phi3_rope(F, c)
  for _, k in ipairs { "rope_scaling", "rope_parameters" } do
    if c[k] ~= nil and type(c[k]) ~= "table" then fail(F, "%s must be an object, got %s", k, show(c[k])) end
  end
  local scaling, params = c.rope_scaling, c.rope_parameters
  if scaling and next(scaling) == nil then scaling = nil end
  local name = scaling and "rope_scaling" or "rope_parameters"
  local r = copy(scaling or params or {})
  if r.rope_type == nil then r.rope_type = r.type end
  r.type = nil
  if r.rope_type == nil then r.rope_type = "default" end
  if r.rope_type == "su" or r.rope_type == "yarn" then r.rope_type = "longrope" end
  if r.rope_type ~= "default" and r.rope_type ~= "longrope" then
    fail(F, "%s.rope_type is %s; Phi3Config takes \"default\" or \"longrope\" (transformers raises for others)", name,
      show(r.rope_type))
  end
  if r.rope_theta == nil then r.rope_theta = (params or {}).rope_theta end
  if r.rope_theta == nil then r.rope_theta = c.rope_theta end
  if r.rope_theta == nil then r.rope_theta = 10000.0 end
  pos_num(F, name .. ".rope_theta", r.rope_theta)
  if r.partial_rotary_factor == nil then r.partial_rotary_factor = (params or {}).partial_rotary_factor end
  if r.partial_rotary_factor == nil then r.partial_rotary_factor = c.partial_rotary_factor end
  if r.partial_rotary_factor == nil then r.partial_rotary_factor = 1.0 end
  local prf = r.partial_rotary_factor
  if type(prf) ~= "number" or not (prf > 0 and prf <= 1) then
    fail(F, "partial_rotary_factor must be a number in (0, 1], got %s", show(prf))
  end
  local D = c.head_dim or c.hidden_size / c.num_attention_heads
  local R = floor(D * prf)
  if R < 2 or R % 2 ~= 0 then
    fail(F, "head_dim (%d) x partial_rotary_factor (%s) = %d rotary channels; rotary embeddings need an even number", D,
      show(prf), R)
  end
  if r.rope_type == "default" then
    for k in pairs(r) do
      if k ~= "rope_type" and k ~= "rope_theta" and k ~= "partial_rotary_factor" then r[k] = nil end
    end
    return r
  end
  r.original_max_position_embeddings = c.original_max_position_embeddings
  for _, k in ipairs { "short_factor", "long_factor" } do
    local f = r[k]
    if type(f) ~= "table" or #f ~= R / 2 then
      fail(F, "%s.%s must be a list of rotary_dim/2 = %d numbers, got %s", name, k, R / 2,
        type(f) == "table" and fmt("%d", #f) .. " entries" or show(f))
    end
    for i, v in ipairs(f) do pos_num(F, fmt("%s.%s[%d]", name, k, i), v) end
  end
  if r.factor ~= nil then pos_num(F, name .. ".factor", r.factor) end
  if r.attention_factor ~= nil then nonneg_num(F, name .. ".attention_factor", r.attention_factor) end
  for k in pairs(r) do
    if not ({ rope_type = 1, rope_theta = 1, partial_rotary_factor = 1, short_factor = 1, long_factor = 1,
      original_max_position_embeddings = 1, factor = 1, attention_factor = 1 })[k] then
      r[k] = nil -- (keys longrope does not read)
    end
  end
  return r
end

-- The number of channels of each head the rope rotates (transformers: int(head_dim * partial_rotary_factor)).
function M.rotary_dim(c)
  local D = c.head_dim or floor(c.hidden_size / c.num_attention_heads)
  return floor(D * ((c.rope_parameters or {}).partial_rotary_factor or 1))
end

-- longrope's attention factor (cos and sin multiplied by it): attention_factor, else from factor (else
-- max_position_embeddings / original_max_position_embeddings) as _compute_longrope_parameters.
function M.longrope_attention_factor(c)
  local r = c.rope_parameters
  if r.attention_factor then return r.attention_factor end
  local omp = r.original_max_position_embeddings
  local factor = r.factor or c.max_position_embeddings / omp
  if factor <= 1 then return 1.0 end
  return math.sqrt(1 + math.log(factor) / math.log(omp))
end

-- A config of any Llama-architecture model type, by its model_type (none: llama).
function M.llama_family(cfg)
  local t = cfg.model_type
  if t ~= nil and not FAMILY[t] then model_type("llama", cfg) end -- (refused: names the supported types)
  return llama_arch(t or "llama", cfg)
end

-- ---------------------------------------------------------------- gemma3_text

-- Gemma3TextConfig's defaults (transformers 5.17) where config.json is silent; sliding_window_pattern: every
-- sixth layer attends fully where layer_types is absent.
local GEMMA3 = { vocab_size = 262208, hidden_size = 2304, intermediate_size = 9216, num_hidden_layers = 26,
  num_attention_heads = 8, num_key_value_heads = 4, head_dim = 256, max_position_embeddings = 131072,
  rms_norm_eps = 1e-6, initializer_range = 0.02, query_pre_attn_scalar = 256, sliding_window = 4096,
  pad_token_id = 0, eos_token_id = 1, bos_token_id = 2, tie_word_embeddings = true, attention_bias = false,
  hidden_activation = "gelu_pytorch_tanh", sliding_window_pattern = 6 }
-- hidden_activation -> zr.gelu's approximation (transformers' ACT2FN: the tanh formula or the exact erf one)
local GEMMA3_ACTS = { gelu_pytorch_tanh = "tanh", gelu_new = "tanh", gelu_fast = "tanh", gelu_python_tanh = "tanh",
  gelu_accurate = "tanh", gelu = "none", gelu_python = "none" }

-- Gemma 3's rope parameters per layer type, as Gemma3TextConfig.convert_rope_params_to_dict resolves them:
-- rope_parameters { full_attention = {...}, sliding_attention = {...} } (transformers 5's layout), each
-- missing one "default"; a legacy rope_scaling updates full_attention's; rope_theta (default 1e6) is
-- full_attention's theta and rope_local_base_freq (default 1e4) sliding_attention's where their tables
-- have none. Each table is then checked and made canonical as M.rope_parameters does for one rope.
function M.gemma3_rope(F, c)
  local params, scaling = c.rope_parameters, c.rope_scaling
  for _, k in ipairs { "rope_parameters", "rope_scaling" } do
    if c[k] ~= nil and type(c[k]) ~= "table" then fail(F, "%s must be an object, got %s", k, show(c[k])) end
  end
  params = params or {}
  for k, v in pairs(params) do
    if k ~= "full_attention" and k ~= "sliding_attention" then
      fail(F, "rope_parameters.%s: Gemma 3's rope_parameters holds one table per layer type (full_attention, "
        .. "sliding_attention), got %s", tostring(k), show(params))
    end
    if type(v) ~= "table" then fail(F, "rope_parameters.%s must be an object, got %s", k, show(v)) end
  end
  local full, slide = copy(params.full_attention or {}), copy(params.sliding_attention or {})
  if scaling and next(scaling) ~= nil then for k, v in pairs(scaling) do full[k] = v end end
  if full.rope_theta == nil then full.rope_theta = c.rope_theta or 1000000.0 end
  if slide.rope_theta == nil then slide.rope_theta = c.rope_local_base_freq or 10000.0 end
  local function one(t, name)
    local ok, r = pcall(M.rope_parameters, F, { rope_parameters = t, max_position_embeddings = c.max_position_embeddings })
    if not ok then error((tostring(r):gsub("rope_parameters", "rope_parameters." .. name, 1)), 0) end
    return r
  end
  return { full_attention = one(full, "full_attention"), sliding_attention = one(slide, "sliding_attention") }
end

-- A Gemma 3 text config (Gemma3ForCausalLM: google/gemma-3-270m, gemma-3-1b-pt / -it; model_type
-- "gemma3_text") checked and normalised: Gemma3TextConfig's defaults, layer_types filled from
-- sliding_window_pattern as __post_init__ fills it, the rope per layer type (M.gemma3_rope), gelu_approximate
-- from hidden_activation. Refused in one line: attention or final logit soft-capping (Gemma 2's; null in Gemma 3),
-- bidirectional attention, dropout, an MLP bias, the multimodal "gemma3" config (Gemma3ForConditionalGeneration).
function M.gemma3_text(cfg)
  local F = "gemma3_text"
  if cfg.model_type == "gemma3" then
    fail(F, 'model_type is "gemma3" (Gemma3ForConditionalGeneration, text and vision: gemma-3-4b and larger); zrun '
      .. 'trains the text-only Gemma3ForCausalLM checkpoints, model_type "gemma3_text" (gemma-3-270m, gemma-3-1b)')
  end
  local nulls = {}
  for k in pairs(M.NULL_IS_NOT_DEFAULT[F]) do if cfg[k] == null then nulls[#nulls + 1] = k end end
  local c = copy(cfg)
  for _, k in ipairs(nulls) do c[k] = false end
  model_type(F, c)
  for k, v in pairs(GEMMA3) do if c[k] == nil then c[k] = v end end
  for _, k in ipairs { "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings" } do
    pos_int(F, k, c[k])
  end
  if c.num_attention_heads % c.num_key_value_heads ~= 0 then
    fail(F, "num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", c.num_attention_heads,
      c.num_key_value_heads)
  end
  if c.head_dim % 2 ~= 0 then fail(F, "head_dim (%d) must be even: rotary embeddings rotate pairs of channels", c.head_dim) end
  pos_num(F, "rms_norm_eps", c.rms_norm_eps)
  nonneg_num(F, "initializer_range", c.initializer_range)
  pos_num(F, "query_pre_attn_scalar", c.query_pre_attn_scalar) -- (the attention's scale: its -1/2 power)
  bool(F, "tie_word_embeddings", c.tie_word_embeddings)
  bool(F, "attention_bias", c.attention_bias) -- (q/k/v/o, as Gemma3Attention reads it)
  if c.mlp_bias ~= nil and bool(F, "mlp_bias", c.mlp_bias) then
    fail(F, "mlp_bias is true, but transformers' Gemma3ForCausalLM does not read it (its MLP has no biases)")
  end
  c.gelu_approximate = GEMMA3_ACTS[c.hidden_activation]
  if not c.gelu_approximate then
    fail(F, "hidden_activation is %s; zrun's Gemma 3 MLP implements the GELUs (\"gelu_pytorch_tanh\", \"gelu\", ...)",
      show(c.hidden_activation))
  end
  if c.attention_dropout ~= nil and nonneg_num(F, "attention_dropout", c.attention_dropout) ~= 0 then
    refuse_dropout(F, "attention_dropout", c.attention_dropout, "attention dropout")
  end
  for k, what in pairs { attn_logit_softcapping = "attention logit soft-capping (Gemma 2's)",
    final_logit_softcapping = "final logit soft-capping (Gemma 2's)" } do
    if c[k] ~= nil then fail(F, "%s is %s: %s is not implemented in zrun (Gemma 3 has none: null)", k, show(c[k]), what) end
  end
  if c.use_bidirectional_attention ~= nil and bool(F, "use_bidirectional_attention", c.use_bidirectional_attention) then
    fail(F, "use_bidirectional_attention is true; zrun implements causal attention only")
  end
  if c.sliding_window ~= false then pos_int(F, "sliding_window", c.sliding_window) end
  local L, lt = c.num_hidden_layers, c.layer_types
  if lt == nil then -- Gemma3TextConfig.__post_init__: every pattern-th layer full, the others sliding
    local p = pos_int(F, "sliding_window_pattern", c.sliding_window_pattern)
    lt = {}
    for i = 1, L do lt[i] = i % p ~= 0 and "sliding_attention" or "full_attention" end
  end
  c.layer_types = layer_types(F, c, lt, "")
  refuse_foreign(F, c, "causal attention with rotary embeddings, full or sliding per layer", { sliding_window = true,
    layer_types = true, attn_logit_softcapping = true, final_logit_softcapping = true, use_qk_norm = true,
    qk_layernorm = true }) -- (Gemma 3 normalises q and k whatever those two say)
  c.rope_parameters = M.gemma3_rope(F, c)
  c.rope_theta, c.rope_scaling, c.rope_local_base_freq = nil, nil, nil
  c.model_type = F
  return c
end

-- ---------------------------------------------------------------- gpt2

-- activation_function -> zr gelu approximation, or false for the other activations (gpt2.lua's
-- ACTIVATIONS). gelu_new, gelu_fast, gelu_accurate, gelu_pytorch_tanh and gelu_python_tanh are the same tanh formula
-- 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); "gelu" and gelu_python are the exact erf form.
-- (transformers' ACT2FN names.)
local GPT2_ACTS = { gelu_new = "tanh", gelu_fast = "tanh", gelu_accurate = "tanh", gelu_pytorch_tanh = "tanh",
  gelu_python_tanh = "tanh",   gelu = "none", gelu_python = "none", relu = false, silu = false, swish = false, quick_gelu = false }
M.GPT2_ACTIVATIONS = '"gelu_new", "gelu", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate", "gelu_python", ' ..
  '"gelu_python_tanh", "relu", "silu", "swish" and "quick_gelu"'

-- A GPT-2 config (a config.json table or zrun's own) checked and normalised: defaults filled as
-- transformers' GPT2Config fills them, except the dropouts (0: none), and gelu_approximate set
-- from activation_function (for the GELUs). Raises "gpt2 config: ..." for a missing or bad field or
-- one zrun does not implement (another activation, cross-attention, another family's fields).
function M.gpt2(cfg)
  local F = "gpt2"
  local c = copy(cfg)
  model_type(F, c)
  c.model_type = F
  for _, k in ipairs { "n_embd", "n_layer", "n_head", "vocab_size" } do required_int(F, c, k) end
  if c.n_embd % c.n_head ~= 0 then fail(F, "n_embd (%d) must be a multiple of n_head (%d)", c.n_embd, c.n_head) end
  c.n_positions = pos_int(F, "n_positions", c.n_positions or 1024)
  if c.n_inner ~= nil then pos_int(F, "n_inner", c.n_inner) end
  c.layer_norm_epsilon = pos_num(F, "layer_norm_epsilon", c.layer_norm_epsilon or 1e-5)
  c.initializer_range = nonneg_num(F, "initializer_range", c.initializer_range or 0.02)
  c.activation_function = c.activation_function or "gelu_new"
  if GPT2_ACTS[c.activation_function] == nil then
    fail(F, "activation_function is %s; zrun's GPT-2 implements %s", show(c.activation_function), M.GPT2_ACTIVATIONS)
  end
  -- Dropout: zrun's default is none (transformers' GPT2Config defaults to 0.1, and writes the keys
  -- into every config.json it saves, so a file is read as transformers reads it). attn_pdrop > 0
  -- runs attention unfused while training, as transformers' eager attention does.
  for _, k in ipairs { "resid_pdrop", "embd_pdrop", "attn_pdrop" } do
    c[k] = c[k] or 0
    if type(c[k]) ~= "number" or not (c[k] >= 0 and c[k] < 1) then
      fail(F, "%s must be a probability in [0, 1), got %s", k, show(c[k]))
    end
  end
  -- transformers 5 builds a separate lm_head (nn.Linear, no bias) when tie_word_embeddings is false
  if c.tie_word_embeddings == nil then c.tie_word_embeddings = true end
  bool(F, "tie_word_embeddings", c.tie_word_embeddings)
  -- scale_attn_weights (1/sqrt(head_dim)) and scale_attn_by_inverse_layer_idx (1/(layer + 1)) set
  -- the attention's scale (gpt2.lua's Attention, as GPT2Attention.scaling)
  for k, v in pairs { scale_attn_weights = true, scale_attn_by_inverse_layer_idx = false } do
    if c[k] == nil then c[k] = v end
    bool(F, k, c[k])
  end
  if c.add_cross_attention ~= nil then
    bool(F, "add_cross_attention", c.add_cross_attention)
    if c.add_cross_attention then
      fail(F, "add_cross_attention is true (cross-attention layers); zrun's GPT-2 implements add_cross_attention = false")
    end
  end
  -- reorder_and_upcast_attn only changes the rounding of 16-bit attention scores (transformers
  -- upcasts them to fp32); zrun's attention accumulates in fp32 already.
  if c.reorder_and_upcast_attn ~= nil then bool(F, "reorder_and_upcast_attn", c.reorder_and_upcast_attn) end
  refuse_foreign(F, c, "full causal attention with learned positions")
  c.gelu_approximate = GPT2_ACTS[c.activation_function] or nil
  return c
end

-- ---------------------------------------------------------------- writing

local HF_DTYPE = { f32 = "float32", bf16 = "bfloat16", f16 = "float16", f64 = "float64" }

-- Fields transformers types as float: written as 1.0, not 1 (its strict config classes check types).
M.FLOAT_FIELDS = {}
for _, k in ipairs { "rope_theta", "factor", "low_freq_factor", "high_freq_factor", "rms_norm_eps",
  "layer_norm_epsilon", "initializer_range", "attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
  "summary_first_dropout", "attention_factor", "beta_fast", "beta_slow", "rope_local_base_freq" } do
  M.FLOAT_FIELDS[k] = true
end

-- The config.json table for a model config: the layout transformers 5.x writes (rope_parameters
-- with rope_theta inside, "dtype"), plus the keys older readers need and transformers 5 accepts
-- and resolves to the same values (top-level rope_theta; rope_scaling when the rope is scaled;
-- torch_dtype; checked with transformers 5.17 by tests/golden/check_hf_save.py). zrun-only keys
-- (dtype/device to build in, gelu_approximate) are left out.
function M.to_hf(cfg)
  local c = copy(cfg)
  c.dtype, c.device, c.gelu_approximate = nil, nil, nil -- what zrun builds in, not the file's
  for k in pairs(M.NULL_IS_NOT_DEFAULT[c.model_type] or {}) do -- (None, kept as false: M.keep_nulls)
    if c[k] == false then c[k] = null end
  end
  if c.torch_dtype ~= nil then
    c.torch_dtype = HF_DTYPE[c.torch_dtype] or c.torch_dtype
    c.dtype = c.torch_dtype
  end
  if c.model_type == "gemma3_text" and type(c.rope_parameters) == "table" and c.rope_parameters.full_attention then
    -- Gemma 3's per-layer-type tables (transformers 5's layout), and for transformers 4's Gemma3TextConfig
    -- rope_theta, rope_local_base_freq and rope_scaling (full_attention's), which transformers 5 resolves the same
    local full, slide = c.rope_parameters.full_attention, c.rope_parameters.sliding_attention
    c.rope_theta, c.rope_local_base_freq = full.rope_theta, slide and slide.rope_theta
    c.rope_scaling = nil
    if full.rope_type ~= "default" then
      c.rope_scaling = copy(full)
      c.rope_scaling.rope_theta = nil
    end
  elseif type(c.rope_parameters) == "table" or c.rope_theta ~= nil or type(c.rope_scaling) == "table" then
    -- the layout only, values as given (checking them is the reader's job): transformers 5's
    -- precedence, a non-empty rope_scaling first
    local src = c.rope_scaling
    if type(src) ~= "table" or next(src) == nil then src = c.rope_parameters end
    local r = copy(type(src) == "table" and src or {})
    r.rope_type = r.rope_type or r.type or "default"
    r.type = nil
    if r.rope_theta == nil then r.rope_theta = c.rope_theta end
    c.rope_parameters = r
    c.rope_theta = r.rope_theta
    if r.rope_type ~= "default" then
      local s = copy(r)
      s.rope_theta = nil
      c.rope_scaling = s
    else
      c.rope_scaling = nil
    end
  end
  return c
end

return M
