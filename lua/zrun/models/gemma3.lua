-- Gemma 3 text models (Gemma3ForCausalLM: google/gemma-3-270m, gemma-3-1b-pt / -it; model_type "gemma3_text")
-- with Hugging Face semantics: Llama's attention and model (zrun.models.llama) with Gemma's differences --
-- RMSNorms that multiply by (1 + weight) in f32 and round once (weights start at zero), q_norm / k_norm over
-- each head before the rope, the attention scaled by query_pre_attn_scalar^-1/2, a norm after the attention
-- and around the MLP (four per layer), a GELU-gated MLP (hidden_activation), the token embeddings times
-- sqrt(hidden_size) rounded to their dtype, and per layer type its own rope (sliding_attention: the local
-- base, full_attention: the global one, scaled) and window (sliding layers only). Parameter names, state
-- dicts, save_pretrained's files and LoRA targets are transformers' and PEFT's. The config's checks:
-- zrun.models.hf_config.gemma3_text. On a GPU in bf16/f16, head_dim 256 runs the mma.sync flash kernels (packed
-- sequences and the window through the segments, as at other widths); in f32 the attention's composition.
local zr = require "zrun"
local nn = require "zrun.nn"
local Module = require "zrun.nn.module"
local llama = require "zrun.models.llama"
local hf_config = require "zrun.models.hf_config"
local init = require "zrun.nn.init_fns"

local M = {}

local function linear(cfg, i, o, bias)
  return nn.Linear(i, o, { bias = bias or false, dtype = cfg.dtype, device = cfg.device })
end

-- Gemma3RMSNorm ------------------------------------------------------------------------------
local RMSNorm = Module:extend("Gemma3RMSNorm")
M.Gemma3RMSNorm = RMSNorm
-- Gemma3RMSNorm(dim, eps, {dtype=, device=}): over the last dim, its weight (dim) starting at zero.
function RMSNorm:__init(dim, eps, cfg)
  self.dim, self.eps = dim, eps
  self.weight = Module.Parameter(init.zeros_(zr.empty({ dim }, { dtype = cfg.dtype or "f32", device = cfg.device or "cpu" })))
end
-- Whether zr.rms_norm's unit_offset (one op: one kernel on a GPU each way) computes this norm of x exactly:
-- on the CPU always (f32, f64 for f64), on a GPU where the weight is no wider than x (the kernels read it in
-- x's dtype; 16-bit weights widen to f32 exactly).
local function fused_ok(x, w)
  local xd, wd = x:dtype(), w:dtype()
  return x:device() == "cpu" or xd == wd or (xd == "f32" and (wd == "bf16" or wd == "f16"))
end
-- x normalised in f32 (f64 stays f64) and multiplied by (1 + weight) in f32, rounded once to x's dtype
-- (Llama's norm rounds the normalised x first, then multiplies by the weight in the activations' dtype):
-- zr.rms_norm with unit_offset, else its composition (a wider weight on a GPU: f32 copies, one rounding).
function RMSNorm:forward(x)
  if fused_ok(x, self.weight) then return zr.rms_norm(x, self.weight, self.eps, true) end
  local dt = x:dtype()
  local ct = dt == "f64" and "f64" or "f32"
  local y = zr.rms_norm(x:to(ct), self.weight:to(ct) + 1, self.eps)
  return dt == ct and y or y:to(dt)
end
local function add_norm_yh(x, r, ln)
  local h, y = zr.add_rms_norm(x, r, ln.weight, ln.eps, true)
  return y, h
end
-- h = x + r and this norm of h, as one op (zr.add_rms_norm with unit_offset: one kernel on a GPU) where
-- RMSNorm:forward's op runs and the module has no hooks of its own (llama.fused_add_norm; llama.lua's add_norm
-- calls this); else the add, then the module.
function RMSNorm:add_forward(x, r) return llama.fused_add_norm(x, r, self, fused_ok(x, self.weight), add_norm_yh) end
-- "(dim,), eps=..."
function RMSNorm:extra_repr() return ("(%d,), eps=%g"):format(self.dim, self.eps) end

-- Attention: Llama's (zrun.models.llama.Attention: q, k, v split off one product, q_norm / k_norm over each
-- head, the rope, the attention) with Gemma's norms and scale --------------------------------------
local Attention = llama.Attention:extend("Gemma3Attention")
function Attention:__init(cfg)
  llama.Attention.__init(self, cfg)
  self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps, cfg)
  self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps, cfg)
  self.scale = cfg.query_pre_attn_scalar ^ -0.5 -- (Gemma3Attention.scaling)
end

-- MLP: down_proj(act(gate_proj(x)) * up_proj(x)), act the config's GELU ------------------------
local MLP = Module:extend("Gemma3MLP")
function MLP:__init(cfg)
  self.gate_proj = linear(cfg, cfg.hidden_size, cfg.intermediate_size)
  self.up_proj = linear(cfg, cfg.hidden_size, cfg.intermediate_size)
  self.down_proj = linear(cfg, cfg.intermediate_size, cfg.hidden_size)
  rawset(self, "approximate", cfg.gelu_approximate)
end
-- (gate and up as one product where they can: llama.gate_up; zr.geglu computes gelu(gate) * up in f32 and rounds
-- once, where transformers rounds the activation first)
function MLP:forward(x)
  local g, u = self.gate_proj, self.up_proj
  local gu = llama.gate_up(x, g, u)
  if gu then return self.down_proj(zr.geglu(gu, nil, self.approximate)) end
  return self.down_proj(zr.geglu(g(x), u(x), self.approximate))
end

-- Decoder layer: each sub-block's output normalised before the residual add -----------------
local Layer = Module:extend("Gemma3DecoderLayer")
function Layer:__init(cfg)
  self.self_attn = Attention(cfg)
  self.mlp = MLP(cfg)
  for _, n in ipairs { "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
    "post_feedforward_layernorm" } do
    self[n] = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
  end
end
-- The layer as (h, m), its output h + m not yet summed (as Llama's: Model:forward adds m with the next layer's
-- input_layernorm, or the final norm, as one op); pending, the previous layer's m, is added to x with this
-- layer's input_layernorm. Each residual add runs with the norm after it (RMSNorm:add_forward).
function Layer:residual_forward(x, cos, sin, pending, segs)
  local y
  if pending then x, y = self.input_layernorm:add_forward(x, pending) else y = self.input_layernorm(x) end
  local a = self.post_attention_layernorm(self.self_attn(y, cos, sin, segs))
  local h, y2 = self.pre_feedforward_layernorm:add_forward(x, a)
  return h, self.post_feedforward_layernorm(self.mlp(y2))
end
function Layer:forward(x, cos, sin, segs)
  local h, m = self:residual_forward(x, cos, sin, nil, segs)
  return h + m
end
Layer.split_forward = Layer.forward -- (llama.Model:forward: the forward residual_forward splits)

-- Model: Llama's forward (zrun.models.llama.Model) over Gemma's layers ----------------------
local Model = llama.Model:extend("Gemma3TextModel")
function Model:__init(cfg)
  self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, { dtype = cfg.dtype, device = cfg.device,
    padding_idx = cfg.pad_token_id or nil })
  self.layers = nn.ModuleList()
  for _ = 1, cfg.num_hidden_layers do self.layers:append(Layer(cfg)) end
  self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg)
  rawset(self, "cfg", cfg)
  rawset(self, "rope_cache", {})
  local window, full = hf_config.attention_window(cfg)
  rawset(self, "window", window and { size = window, full = full } or false)
end
-- Gemma3TextScaledWordEmbedding: the embeddings times sqrt(hidden_size) rounded to their dtype (bf16: 34
-- for 1152's 33.94)
function Model:embed(input_ids)
  local e = self.embed_tokens(input_ids)
  local scales = rawget(self, "embed_scales") -- (per dtype, made once)
  if not scales then scales = {}; rawset(self, "embed_scales", scales) end
  local s = scales[e:dtype()]
  if not s then
    s = zr.tensor({ math.sqrt(self.cfg.hidden_size) }):to(e:dtype()):item()
    scales[e:dtype()] = s
  end
  return e * s
end
-- Layer i's rope: its layer type's parameters, cached under the type's name
function Model:layer_rope(i)
  local t = self.cfg.layer_types[i]
  return self.cfg.rope_parameters[t], t
end

-- Causal LM ---------------------------------------------------------------------------------
local CausalLM = llama.LlamaForCausalLM:extend("Gemma3ForCausalLM")
M.Gemma3ForCausalLM = CausalLM
CausalLM.family = "gemma3_text" -- (Gemma3ForCausalLM(cfg): a config table of that model_type, none taken as one)
CausalLM.Model = Model
-- Gemma3PreTrainedModel._init_weights: Llama's, but the RMSNorm weights zero (the norms multiply by 1 + weight)
CausalLM.NORM_INIT = 0
llama.CLASS_OF.gemma3_text = CausalLM

-- One generation step (zrun.generation's Cache), as LlamaForCausalLM:generation_step with Gemma's layer:
-- the scaled embeddings, each layer type's rope and window, the four norms.
function CausalLM:generation_step(ids, cache)
  local m, cfg = self.model, self.config
  local h = m:embed(ids)
  local P = llama.step_table_length(cache)
  local tables = {}
  for i, layer in ipairs(m.layers) do
    local r, tag = m:layer_rope(i)
    tables[tag] = tables[tag] or { m:rope(P, h:dtype(), h:device(), nil, r, tag) }
    local cs = tables[tag]
    local a = llama.cached_attention(layer.self_attn, layer.input_layernorm(h), cs[1], cs[2], cache, i,
      hf_config.layer_window(cfg, i))
    h = h + layer.post_attention_layernorm(a)
    h = h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
  end
  return self:last_logits(h)
end

-- A config table checked and normalised as transformers' Gemma3TextConfig fills it (model_type "gemma3_text").
function M.normalize_config(cfg) return llama.normalize_config(cfg, "gemma3_text") end

-- A config from a config.json path, a HF model directory or a built-in name (as zr.models.llama.config).
M.config = llama.config

-- Builds the model and loads its Hugging Face weights (zr.models.llama.from_pretrained's options);
-- config.json's model_type must be "gemma3_text".
function M.from_pretrained(ref, opts) return llama.from_pretrained(ref, opts, "gemma3_text") end

return M
