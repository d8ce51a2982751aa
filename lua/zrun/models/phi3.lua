-- Phi-3 (Phi3ForCausalLM: microsoft/Phi-3-mini-4k-instruct, Phi-3-mini-128k / Phi-3.5-mini with longrope,
-- Phi-4-mini with partial_rotary_factor 0.75) with Hugging Face semantics: Llama's layer with the fused
-- checkpoint modules kept as they are, self_attn.qkv_proj ((H + 2 KV)·D rows: q, then k, then v) and
-- mlp.gate_up_proj (2·I rows: gate, then up), so parameter names, state dicts, save_pretrained's files and
-- LoRA targets (PEFT's "qkv_proj", "gate_up_proj") are transformers' and PEFT's; partial rotary embeddings
-- (the first rotary_dim channels of each head rotated) and longrope (short_factor within
-- original_max_position_embeddings, long_factor beyond; cos and sin scaled). Not here: the Llama layer,
-- model and loss (zrun.models.llama), the config's checks (zrun.models.hf_config.phi3).
local zr = require "zrun"
local nn = require "zrun.nn"
local Module = require "zrun.nn.module"
local llama = require "zrun.models.llama"
local hf_config = require "zrun.models.hf_config"
local packed = require "zrun.models.packed"

local M = {}
local unpack = table.unpack or unpack

local head_dim = llama.head_dim
local function linear(cfg, i, o)
  return nn.Linear(i, o, { bias = false, dtype = cfg.dtype, device = cfg.device })
end

-- Attention ---------------------------------------------------------------------------------
local Attention = Module:extend("Phi3Attention")
function Attention:__init(cfg)
  local H, KV, D = cfg.num_attention_heads, cfg.num_key_value_heads, head_dim(cfg)
  self.n_heads, self.n_kv, self.hd = H, KV, D
  self.rotary = hf_config.rotary_dim(cfg)
  self.qkv_proj = linear(cfg, cfg.hidden_size, (H + 2 * KV) * D)
  self.o_proj = linear(cfg, H * D, cfg.hidden_size)
end

-- q, k, v of the product qkv (b, t, (H + 2 KV)·D) as (b, heads, t, D) views (zr.split: their gradients are
-- written into one buffer of the product's size, not one zero-filled product-sized buffer each)
local function split(qkv, H, KV, D)
  local b, t = qkv:size(1), qkv:size(2)
  local q, k, v = unpack(zr.split(qkv, { H * D, KV * D, KV * D }, 3))
  return q:view(b, t, H, D):transpose(2, 3), k:view(b, t, KV, D):transpose(2, 3), v:view(b, t, KV, D):transpose(2, 3)
end

-- x (B, T, C) -> (B, T, C); cos, sin (positions, rotary_dim); segs as LlamaAttention's (zrun.models.packed).
-- The whole head rotated: the product runs through zr.qkv_rope_sdpa (as Llama's fused path); a partial
-- rotary dim: q, k, v split off the product, zr.rope (which rotates the tables' width and passes the rest)
-- and the attention.
function Attention:forward(x, cos, sin, segs)
  local H, KV, D = self.n_heads, self.n_kv, self.hd
  local B, T = x:size(1), x:size(2)
  local seg = segs and segs.seg
  local qkv = self.qkv_proj(x) -- (a LoRA layer over the fused product when adapted, as PEFT's)
  if self.rotary == D then return self.o_proj(llama.qkv_attention(qkv, H, KV, cos, sin, segs)) end
  local function attend(p, c, s, opts)
    local b, t = p:size(1), p:size(2)
    local q, k, v = split(p, H, KV, D)
    q, k = zr.rope(q, c, s), zr.rope(k, c, s)
    return zr.scaled_dot_product_attention(q, k, v, opts):transpose(2, 3):reshape(b, t, H * D)
  end
  if seg then
    return self.o_proj(attend(qkv:view(1, B * T, qkv:size(3)), cos, sin, { segments = seg }):view(B, T, H * D))
  end
  if segs and segs.rows then return self.o_proj(attend(qkv, cos, sin, { segments = segs.rows })) end
  if segs then
    return self.o_proj(packed.attend({ qkv }, segs, function(p, g)
      return attend(p[1], cos:narrow(1, g.p0 + 1, g.T), sin:narrow(1, g.p0 + 1, g.T))
    end))
  end
  return self.o_proj(attend(qkv, cos, sin))
end

-- MLP ---------------------------------------------------------------------------------------
local MLP = Module:extend("Phi3MLP")
function MLP:__init(cfg)
  self.gate_up_proj = linear(cfg, cfg.hidden_size, 2 * cfg.intermediate_size)
  self.down_proj = linear(cfg, cfg.intermediate_size, cfg.hidden_size)
end
-- Phi3MLP: gate, up = gate_up_proj(x).chunk(2); down_proj(up * silu(gate)): zr.swiglu reads the packed
-- (.., 2I) product as gate then up
function MLP:forward(x) return self.down_proj(zr.swiglu(self.gate_up_proj(x))) end

llama.LAYER_PARTS.phi3 = { attention = Attention, mlp = MLP }

-- Causal LM ---------------------------------------------------------------------------------
M.Phi3ForCausalLM = llama.LlamaForCausalLM:extend("Phi3ForCausalLM")
M.Phi3ForCausalLM.family = "phi3"
llama.CLASS_OF.phi3 = M.Phi3ForCausalLM

-- One generation step (zrun.generation's Cache, as LlamaForCausalLM:generation_step). longrope: every
-- step computes what a forward over the whole rows computes (transformers' generate with use_cache=False):
-- the step whose largest position first passes original_max_position_embeddings recomputes the cached keys
-- and values of every earlier token with the long factors. (transformers 5.17's cached generate drops its
-- cache there and then, at every later step, sees the new token alone: Phi3ForCausalLM.prepare_inputs_for_generation.)
function M.Phi3ForCausalLM:generation_step(ids, cache)
  local m, cfg = self.model, self.config
  local r = cfg.rope_parameters
  if r.rope_type == "longrope" then
    local st = cache.phi3 or { ids = {}, pos = {} }
    cache.phi3 = st
    st.ids[#st.ids + 1], st.pos[#st.pos + 1] = ids, cache.pos_rows
    local long = cache.max_position + 1 > r.original_max_position_embeddings
    if long and st.short and #st.ids > 1 then -- (the cache holds short-factor keys: start again from the rows)
      local rows = {}
      for b = 1, #cache.pos_rows do
        local p = {}
        for _, step in ipairs(st.pos) do for _, v in ipairs(step[b]) do p[#p + 1] = v end end
        rows[b] = p
      end
      ids = zr.cat(st.ids, 2)
      st.ids, st.pos = { ids }, { rows }
      cache.layers, cache.len = {}, 0
      cache:begin(rows)
    end
    st.short = not long
  end
  local h = m.embed_tokens(ids)
  local cos, sin = m:rope(llama.step_table_length(cache), h:dtype(), h:device(), cache.max_position + 1)
  local window = cfg.sliding_window or nil
  for i, layer in ipairs(m.layers) do
    local a = layer.self_attn
    local x = layer.input_layernorm(h)
    local q, k, v = split(a.qkv_proj(x), a.n_heads, a.n_kv, a.hd)
    q, k = cache:rope(q, cos, sin), cache:rope(k, cos, sin)
    local y = cache:attend(i, q, k, v, 1 / math.sqrt(a.hd), window)
    h = h + a.o_proj(y:transpose(2, 3):reshape(x:size(1), x:size(2), a.n_heads * a.hd))
    h = h + layer.mlp(layer.post_attention_layernorm(h))
  end
  return self:last_logits(h)
end

-- A config table checked and normalised as transformers' Phi3Config fills it (model_type "phi3").
function M.normalize_config(cfg) return llama.normalize_config(cfg, "phi3") end

-- A config from a config.json path, a HF model directory or a built-in name (as zr.models.llama.config).
M.config = llama.config

-- Builds the model and loads its Hugging Face weights (zr.models.llama.from_pretrained's options);
-- config.json's model_type must be "phi3".
function M.from_pretrained(ref, opts) return llama.from_pretrained(ref, opts, "phi3") end

return M
