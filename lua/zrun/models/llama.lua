-- Llama (LlamaForCausalLM) with Hugging Face semantics: RMSNorm, rotary embeddings (rope_theta,
-- "llama3", "linear" or "yarn" scaling; either config.json layout, resolved by zrun.models.hf_config),
-- grouped-query attention with explicit head_dim, optional attention/MLP biases, SwiGLU MLP, tied
-- or untied embeddings, and HF parameter names ("model.layers.0.self_attn.q_proj.weight").
-- The same architecture computes Mistral (MistralForCausalLM: no biases, a sliding window),
-- Qwen2 (Qwen2ForCausalLM: biases on q/k/v only) and Qwen3 (Qwen3ForCausalLM: an RMSNorm over each
-- head of q and k before the rope), by the config's model_type; their sliding window masks keys
-- through the attention's segments (zrun.models.packed) where a sequence is longer than it.
-- Padding is expected on the right (the collator's layout), where causal attention alone gives
-- HF's results for every real token.
local zr = require "zrun"
local nn = require "zrun.nn"
local Module = require "zrun.nn.module"
local hf_config = require "zrun.models.hf_config"
local init = require "zrun.nn.init_fns"
local packed = require "zrun.models.packed"

local M = {}

-- A normalised config's head_dim: its own, else hidden_size / num_attention_heads.
function M.head_dim(cfg) return cfg.head_dim or math.floor(cfg.hidden_size / cfg.num_attention_heads) end
local head_dim = M.head_dim

-- Which projections carry a bias (q/k/v, o, MLP): Llama's attention_bias and mlp_bias; Qwen2's
-- q/k/v always, o and the MLP never (Qwen2Attention); Mistral's none (hf_config refuses the fields
-- for those two, which transformers does not read); Qwen3's attention_bias on q/k/v/o, the MLP none.
local function biases(cfg)
  if cfg.model_type == "qwen2" then return true, false, false end
  if cfg.model_type == "qwen3" then return cfg.attention_bias, cfg.attention_bias, false end
  if cfg.model_type == "mistral" then return false, false, false end
  return cfg.attention_bias, cfg.attention_bias, cfg.mlp_bias
end

local function linear(cfg, i, o, bias)
  return nn.Linear(i, o, { bias = bias or false, dtype = cfg.dtype, device = cfg.device })
end

-- Whether projections that read one input can run as ONE product (zr.linear_multi: one GEMM per
-- direction when their weights sit back to back, as in the ZeRO engine's flat buffer) instead of
-- one module call each: plain nn.Linear modules without hooks of their own (global hooks only
-- ZeRO-3's, which Module.call_group runs for each of them around the product), all with or all
-- without a bias; otherwise they are called one by one.
local linear_forward = nn.Linear.forward
local function fusable(...)
  local first = ...
  for i = 1, select("#", ...) do
    local m = select(i, ...)
    if m.forward ~= linear_forward or not m:groupable() or (m.bias == nil) ~= (first.bias == nil) then
      return false
    end
  end
  return true
end
local function weights(...)
  local w, b = {}, {}
  for i = 1, select("#", ...) do
    local m = select(i, ...)
    w[i], b[i] = m.weight, m.bias
  end
  return w, #b > 0 and b or nil
end
-- x through fusable projections as one product (their modules' hooks around it)
local function project(x, ...)
  local mods = { ... }
  return Module.call_group(mods, function(y) return zr.linear_multi(y, weights(unpack(mods))) end, x)
end

-- zr.peft's LoraLayers (bases frozen) and frozen plain projections beside them as one zr.lora_multi,
-- their outputs side by side as project's; nil when they cannot (zr.peft.project says when)
local function project_lora(x, ...)
  for i = 1, select("#", ...) do
    if (select(i, ...)).lora_A then return require("zrun.peft").project(x, { ... }) end
  end
end

-- Attention ---------------------------------------------------------------------------------
-- zr.qkv_rope_sdpa over one (B, T, (H + 2 KV)·D) q/k/v product with the rows as segs has them (zrun.models.packed:
-- nil, the plain rows; .seg, the rows joined with per-token cos, sin; else its groups): (B, T, H·D), o_proj's input.
-- (zrun.models.phi3's fused qkv_proj takes it too.) norm: Qwen3's q_norm / k_norm as { q weight, k weight, eps }
-- (zr.qkv_norm_rope_sdpa: each head of q and k through them before the rope).
function M.qkv_attention(qkv, H, KV, cos, sin, segs, norm)
  local B, T = qkv:size(1), qkv:size(2)
  local seg = segs and segs.seg
  local function attend(x, c, s, opts)
    if norm then return zr.qkv_norm_rope_sdpa(x, H, KV, norm[1], norm[2], norm[3], c, s, opts) end
    return zr.qkv_rope_sdpa(x, H, KV, c, s, opts)
  end
  if seg then
    local y = attend(qkv:view(1, B * T, qkv:size(3)), cos, sin, { segments = seg })
    return y:view(B, T, y:size(3))
  end
  if segs and segs.rows then -- (plain rows windowed where the attention is a composition, which the packed ops do not
    -- run over segments: q, k, v views of the product, q and k normalised (norm) and rotated, the attention)
    local D = qkv:size(3) / (H + 2 * KV)
    local q, k, v = unpack(zr.split(qkv, { H * D, KV * D, KV * D }, 3))
    q, k, v = q:view(B, T, H, D), k:view(B, T, KV, D), v:view(B, T, KV, D):transpose(2, 3)
    if norm then q, k = zr.rms_norm(q, norm[1], norm[3]), zr.rms_norm(k, norm[2], norm[3]) end
    q, k = zr.rope(q:transpose(2, 3), cos, sin), zr.rope(k:transpose(2, 3), cos, sin)
    return zr.scaled_dot_product_attention(q, k, v, { segments = segs.rows }):transpose(2, 3):reshape(B, T, H * D)
  end
  if segs then
    return packed.attend({ qkv }, segs, function(p, g)
      return attend(p[1], cos:narrow(1, g.p0 + 1, g.T), sin:narrow(1, g.p0 + 1, g.T))
    end)
  end
  return attend(qkv, cos, sin)
end

-- Qwen3's q_norm and k_norm run inside zr.qkv_norm_rope_sdpa (one node, fused kernels) when both are plain
-- nn.RMSNorm modules without hooks of their own (ZeRO-3's run around the op: Module.call_group) with one eps
-- and the op fuses them on qkv's device; else the layer runs them as modules (the unfused path below).
local function fused_qk_norms(qn, kn, qkv, D)
  local f = nn.RMSNorm.forward
  return qn.forward == f and kn.forward == f and qn:groupable() and kn:groupable() and qn.eps == kn.eps and
    qn.weight ~= nil and kn.weight ~= nil and zr.qkv_norm_rope_fused(qkv:device(), qkv:dtype(), D)
end

local Attention = Module:extend("LlamaAttention")
M.Attention = Attention -- (zrun.models.gemma3's extends it)
function Attention:__init(cfg)
  local H, KV, D = cfg.num_attention_heads, cfg.num_key_value_heads, head_dim(cfg)
  self.n_heads, self.n_kv, self.hd = H, KV, D
  local b, ob = biases(cfg)
  self.q_proj = linear(cfg, cfg.hidden_size, H * D, b)
  self.k_proj = linear(cfg, cfg.hidden_size, KV * D, b)
  self.v_proj = linear(cfg, cfg.hidden_size, KV * D, b)
  self.o_proj = linear(cfg, H * D, cfg.hidden_size, ob)
  if cfg.model_type == "qwen3" then -- Qwen3Attention's q_norm / k_norm: RMSNorm over head_dim, weights ones
    self.q_norm = nn.RMSNorm(D, { eps = cfg.rms_norm_eps, dtype = cfg.dtype, device = cfg.device })
    self.k_norm = nn.RMSNorm(D, { eps = cfg.rms_norm_eps, dtype = cfg.dtype, device = cfg.device })
  end
end
-- segs (zrun.models.packed.segments): the batch holds packed sequences, each attending to itself
-- with its own positions: with segs.seg (the segments) the rows run joined as one (1, B·T) row and
-- cos, sin hold each token's own (B·T, D) rows; else (the groups) cos, sin are tables long enough
-- for the largest position
function Attention:forward(x, cos, sin, segs)
  local H, KV, D = self.n_heads, self.n_kv, self.hd
  local qp, kp, vp = self.q_proj, self.k_proj, self.v_proj
  local seg = segs and segs.seg
  local B, T = x:size(1), x:size(2)
  local qn, kn = self.q_norm, self.k_norm
  local qkv = fusable(qp, kp, vp) and project(x, qp, kp, vp) or project_lora(x, qp, kp, vp)
  if qkv and qn and fused_qk_norms(qn, kn, qkv, D) then
    return self.o_proj(Module.call_group({ qn, kn }, function(y)
      return M.qkv_attention(y, H, KV, cos, sin, segs, { qn.weight, kn.weight, qn.eps })
    end, qkv))
  end
  if qkv and not qn and not self.scale then
    -- one (B, T, (H + 2 KV) D) product (LoRA adapters' products written into it: project_lora);
    -- qkv_rope_sdpa rotates q and k of it and runs the attention over them (read in place on the
    -- GPU), and in backward writes the product's gradient in one pass (the rope's transpose folded
    -- into the attention's last pass) for its one backward GEMM per operand; it returns (B, T, H D),
    -- o_proj's input
    return self.o_proj(M.qkv_attention(qkv, H, KV, cos, sin, segs))
  end
  -- q, k, v (b, t, heads·D) as (b, heads, t, D) views, q and k rotated (Qwen3: each head of q and k
  -- through q_norm / k_norm first), the attention (opts: the segments; self.scale, Gemma 3's, for
  -- 1/sqrt(D)), back to (b, t, H·D)
  local scale = self.scale
  local function attend(q, k, v, c, s, opts)
    local b, t = q:size(1), q:size(2)
    if scale then opts = opts or {}; opts.scale = scale end
    q, k, v = q:view(b, t, H, D), k:view(b, t, KV, D), v:view(b, t, KV, D):transpose(2, 3)
    if qn then q, k = qn(q), kn(k) end
    q, k = zr.rope(q:transpose(2, 3), c, s), zr.rope(k:transpose(2, 3), c, s)
    return zr.scaled_dot_product_attention(q, k, v, opts):transpose(2, 3):reshape(b, t, H * D)
  end
  -- (Qwen3: the norms sit between the product and the rope, which zr.qkv_rope_sdpa fuses: the one
  -- product's q, k, v parts, (B, T, heads·D) views of it (zr.split: their gradients written into one
  -- buffer of the product's size), take this path)
  local q, k, v
  if qkv then
    q, k, v = unpack(zr.split(qkv, { H * D, KV * D, KV * D }, 3))
  else
    q, k, v = qp(x), kp(x), vp(x)
  end
  if segs and segs.rows then return self.o_proj(attend(q, k, v, cos, sin, { segments = segs.rows })) end
  if seg then
    local function row(u) return u:view(1, B * T, u:size(3)) end
    return self.o_proj(attend(row(q), row(k), row(v), cos, sin, { segments = seg }):view(B, T, H * D))
  end
  if segs then
    return self.o_proj(packed.attend({ q, k, v }, segs, function(p, g)
      return attend(p[1], p[2], p[3], cos:narrow(1, g.p0 + 1, g.T), sin:narrow(1, g.p0 + 1, g.T))
    end))
  end
  return self.o_proj(attend(q, k, v, cos, sin))
end

-- MLP ---------------------------------------------------------------------------------------
local MLP = Module:extend("LlamaMLP")
function MLP:__init(cfg)
  local b = select(3, biases(cfg))
  self.gate_proj = linear(cfg, cfg.hidden_size, cfg.intermediate_size, b)
  self.up_proj = linear(cfg, cfg.hidden_size, cfg.intermediate_size, b)
  self.down_proj = linear(cfg, cfg.intermediate_size, cfg.hidden_size, b)
end
-- gate_proj and up_proj of x as one (.., 2I) product, gate then up (adapters' products written into it), or nil
-- where they cannot run as one (zrun.models.gemma3's MLP takes it too)
function M.gate_up(x, g, u) return fusable(g, u) and project(x, g, u) or project_lora(x, g, u) end
function MLP:forward(x)
  local g, u = self.gate_proj, self.up_proj
  local gu = M.gate_up(x, g, u) -- (read packed by swiglu)
  if gu then return self.down_proj(zr.swiglu(gu)) end
  return self.down_proj(zr.swiglu(g(x), u(x))) -- silu(gate) * up, fused
end

-- Decoder layer -----------------------------------------------------------------------------
local Layer = Module:extend("LlamaDecoderLayer")
-- Attention and MLP classes of model types whose modules differ from Llama's (zrun.models.phi3's fused
-- qkv_proj / gate_up_proj register theirs here): model_type -> { attention =, mlp = }
M.LAYER_PARTS = {}
function Layer:__init(cfg)
  local eps = cfg.rms_norm_eps
  local parts = M.LAYER_PARTS[cfg.model_type] or {}
  self.self_attn = (parts.attention or Attention)(cfg)
  self.mlp = (parts.mlp or MLP)(cfg)
  self.input_layernorm = nn.RMSNorm(cfg.hidden_size, { eps = eps, dtype = cfg.dtype, device = cfg.device })
  self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, { eps = eps, dtype = cfg.dtype, device = cfg.device })
end
-- A residual add and the RMSNorm after it run as one op (zr.add_rms_norm: one kernel on a GPU,
-- h = x + r and norm(h)) when the norm is a plain nn.RMSNorm without hooks of its own (ZeRO-3's
-- run around the op, which hands the norm first, so that its backward gathers the weight where
-- the norm module's would).
local rmsnorm_forward = nn.RMSNorm.forward
local function add_rms_norm_yh(x, r, ln)
  local h, y = zr.add_rms_norm(x, r, ln.weight, ln.eps)
  return y, h
end
-- h = x + r and ln(h): fn(x, r, ln) -> y, h (one op) standing for ln's call (Module.call_group: ZeRO-3's hooks
-- around it) where ok and ln has no hooks of its own, else the add, then the module (zrun.models.gemma3's norm too)
function M.fused_add_norm(x, r, ln, ok, fn)
  if ok and ln:groupable() then
    local y, h = Module.call_group({ ln }, fn, x, r, ln)
    return h, y
  end
  local h = x + r
  return h, ln(h)
end
local function add_norm(x, r, ln)
  if ln.add_forward then return ln:add_forward(x, r) end -- (a norm with its own: Gemma 3's)
  return M.fused_add_norm(x, r, ln, ln.forward == rmsnorm_forward, add_rms_norm_yh)
end
-- The layer as (h, m), its output h + m not yet summed: pending, the previous layer's m, is added
-- to x together with input_layernorm (Model:forward passes it on; nil: x is the layer's input as is).
function Layer:residual_forward(x, cos, sin, pending, segs)
  local y
  if pending then x, y = add_norm(x, pending, self.input_layernorm) else y = self.input_layernorm(x) end
  local h, y2 = add_norm(x, self.self_attn(y, cos, sin, segs), self.post_attention_layernorm)
  return h, self.mlp(y2)
end
function Layer:forward(x, cos, sin, segs)
  local h, m = self:residual_forward(x, cos, sin, nil, segs)
  return h + m
end
-- The forward that residual_forward splits (Model:forward calls that in its place unless forward was replaced;
-- a layer class with its own pair sets its own: Gemma 3's).
Layer.split_forward = Layer.forward

-- Model -------------------------------------------------------------------------------------
local Model = Module:extend("LlamaModel")
M.Model = Model -- (zrun.models.gemma3's extends it)
function Model:__init(cfg)
  -- pad_token_id: transformers' padding_idx (no gradient from the lookup for that row)
  self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, { dtype = cfg.dtype, device = cfg.device,
    padding_idx = cfg.pad_token_id or nil }) -- (false: Phi-3's JSON null, None)
  self.layers = nn.ModuleList()
  for _ = 1, cfg.num_hidden_layers do self.layers:append(Layer(cfg)) end
  self.norm = nn.RMSNorm(cfg.hidden_size, { eps = cfg.rms_norm_eps, dtype = cfg.dtype, device = cfg.device })
  rawset(self, "cfg", cfg)
  rawset(self, "rope_cache", {})
  -- the sliding window (some layers' or every layer's: hf_config.layer_window), and whether other layers
  -- attend fully
  local window, full = hf_config.attention_window(cfg)
  rawset(self, "window", window and { size = window, full = full } or false)
end

-- cos/sin tables for T positions (cached per length, device, dtype and tag). Their values are rounded
-- to dtype (as transformers casts them to the activations' dtype); 16-bit ones are kept in f32,
-- which the rope kernels compute in, so no call converts them again. Their width is the rotary dim
-- (Phi-3's partial_rotary_factor: narrower than the head). seq_len (default T): the forward's largest
-- position + 1, which picks longrope's short or long factors (Phi-3). r, tag: other rope parameters than
-- the config's and the name they are cached under (Model:layer_rope's).
function Model:rope(T, dtype, device, seq_len, r, tag)
  local cfg = self.cfg
  r = r or cfg.rope_parameters
  local long = r.rope_type == "longrope" and (seq_len or T) > r.original_max_position_embeddings
  local key = T .. dtype .. device .. (long and "long" or "") .. (tag or "")
  local c = self.rope_cache[key]
  if not c then
    local o = hf_config.rope_tables_options(r, cfg, seq_len or T)
    o.dtype = "f32"
    local cos, sin = zr.rope_tables(T, hf_config.rotary_dim(cfg), o)
    if dtype ~= "f32" and dtype ~= "f64" then cos, sin = cos:to(dtype):to("f32"), sin:to(dtype):to("f32") end
    if dtype == "f64" or device ~= "cpu" then
      local dt = dtype == "f64" and "f64" or "f32"
      cos, sin = cos:to(device, dt), sin:to(device, dt)
    end
    c = { zr.persist(cos), zr.persist(sin) } -- built inside a forward: kept by its scope
    self.rope_cache[key] = c
  end
  return c[1], c[2]
end

-- The token embeddings of input_ids (Gemma 3's scaled: zrun.models.gemma3).
function Model:embed(input_ids) return self.embed_tokens(input_ids) end
-- The rope parameters layer i rotates with and the tag its tables are cached under: nil, nil, the config's
-- rope in every layer (Gemma 3's per layer type: zrun.models.gemma3).
function Model:layer_rope(_) return nil, nil end

-- A forward's cos, sin for rope parameters r (nil: the config's; tag: their cache name): the table of its length
-- (Model:rope), and where the attention runs on the segments (segs.seg) each token's rows gathered once, outside
-- the layers, so that a checkpointed layer's recomputation and every layer read the same ones (kept with ckpt).
function Model:forward_rope(r, tag, segs, B, T, h, position_ids, ckpt)
  local cos, sin = self:rope(segs and not segs.plain and segs.table_length or T, h:dtype(), h:device(),
    segs and segs.max_position + 1, r, tag)
  if segs and segs.seg then
    if segs.plain then -- plain rows under the window: each row's positions 0 .. T - 1, the table's rows repeated
      local function rows(u) return u:view(1, T, u:size(2)):expand(B, T, u:size(2)):reshape(B * T, u:size(2)) end
      cos, sin = rows(cos), rows(sin)
    else
      local pos = position_ids:to(h:device(), "i64"):reshape(B * T)
      cos, sin = zr.embedding(cos, pos), zr.embedding(sin, pos)
    end
    if ckpt then zr.persist(cos); zr.persist(sin) end
  end
  return cos, sin
end

-- Each layer's last residual add runs with the next layer's input_layernorm (or the final norm)
-- as one op: a layer called as itself (a plain LlamaDecoderLayer that Module:skippable() allows,
-- no checkpointing) hands on its (h, m) and the next add_norm sums them; any other layer is
-- called as a module on the summed h (as gpt2.lua's blocks).
-- position_ids (B, T), optional: where they restart, a new packed sequence begins (packed.lua).
-- Where the attention takes the segments (packed.flat_ok) each token's cos and sin rows are
-- gathered here once (B·T, D), made outside the layers so that a checkpointed layer's recomputation
-- and every layer read the same ones.
function Model:forward(input_ids, position_ids)
  local scope = self:temporaries_scope()
  local B, T = input_ids:size(1), input_ids:size(2)
  local h = self:embed(input_ids)
  -- a sliding window that masks a key (a sequence longer than it) runs on the segments, plain rows too
  -- (packed.segments: the windowed .seg; .full_seg for the layers without a window)
  local win = rawget(self, "window")
  local segs = (position_ids or (win and T > win.size)) and packed.segments(position_ids, B, T, h:device(),
    packed.flat_ok(h:device(), h:dtype(), head_dim(self.cfg)), win or nil)
  local ckpt = rawget(self, "gradient_checkpointing") and self.training
  -- temporaries of this forward, which the attention's nodes keep; a checkpointed layer recomputes with
  -- them in backward, after this forward has returned (then freed when the collector finds them)
  if ckpt and segs and segs.seg then
    zr.persist(segs.seg)
    if segs.full_seg then zr.persist(segs.full_seg) end
  end
  -- the rope tables: the config's, the same in every layer; per layer type where Model:layer_rope says (Gemma 3),
  -- made on a layer type's first layer
  local per_type = self.layer_rope ~= Model.layer_rope and {}
  local cos, sin
  if not per_type then cos, sin = self:forward_rope(nil, nil, segs, B, T, h, position_ids, ckpt) end
  -- the layers without the window read the whole sequences' segments
  -- (plain rows windowed by .rows: those layers attend causally, no segments)
  local full_segs = segs
  if segs and segs.full_seg then full_segs = setmetatable({ seg = segs.full_seg }, { __index = segs })
  elseif segs and segs.rows then full_segs = nil end
  local pending -- the last layer's m, not yet added to h
  for i, layer in ipairs(self.layers) do
    local ls = segs
    if segs and segs.window and not hf_config.layer_window(self.cfg, i) then ls = full_segs end
    local c, s = cos, sin -- (this layer's: a checkpointed layer's recomputation reads them after the loop)
    if per_type then
      local r, tag = self:layer_rope(i)
      local t = per_type[tag]
      if not t then
        t = { self:forward_rope(r, tag, segs, B, T, h, position_ids, ckpt) }
        per_type[tag] = t
      end
      c, s = t[1], t[2]
    end
    if not ckpt and layer.forward == layer.split_forward and layer:skippable() then
      h, pending = layer:residual_forward(h, c, s, pending, ls)
    else
      if pending then h, pending = h + pending, nil end
      if ckpt then
        h = zr.checkpoint(function(x) return layer(x, c, s, ls) end, h)
      else
        h = layer(h, c, s, ls)
      end
    end
  end
  if pending then h = select(2, add_norm(h, pending, self.norm)) else h = self.norm(h) end
  return (Module.end_scope(scope, h))
end

-- Causal LM ---------------------------------------------------------------------------------
local CausalLM = Module:extend("LlamaForCausalLM")
M.LlamaForCausalLM = CausalLM
-- forward(ids, labels) returns the mean loss over the labels that count after the shift, and takes
-- {label_smoothing=} third: the Trainer weights each micro-batch by its token count (transformers'
-- num_items_in_batch) and passes label_smoothing_factor.
CausalLM.token_mean_loss = true
CausalLM.supports_token_stats = true -- (forward's token_stats: the Trainer asks for TRL's statistics)
CausalLM.supports_loss_type = { nll = true, dft = true } -- (forward's loss_type: TRL's SFTConfig loss_type)
CausalLM.supports_chunked_loss = true -- (forward's chunked_loss: use_liger_kernel, TRL's chunked_nll)

CausalLM.family = "llama" -- (the model type its configs must have)
CausalLM.Model = Model -- (the decoder stack it builds; Gemma 3's extends it)
CausalLM.NORM_INIT = 1 -- (RMSNorm weights' initial value)

-- The same architecture under transformers' class names for Mistral, Qwen2 and Qwen3 (the names their
-- config.json's architectures carry); each takes configs of its model type only.
M.MistralForCausalLM = CausalLM:extend("MistralForCausalLM")
M.MistralForCausalLM.family = "mistral"
M.Qwen2ForCausalLM = CausalLM:extend("Qwen2ForCausalLM")
M.Qwen2ForCausalLM.family = "qwen2"
M.Qwen3ForCausalLM = CausalLM:extend("Qwen3ForCausalLM")
M.Qwen3ForCausalLM.family = "qwen3"
local CLASS_OF = { llama = CausalLM, mistral = M.MistralForCausalLM, qwen2 = M.Qwen2ForCausalLM,
  qwen3 = M.Qwen3ForCausalLM }
M.CLASS_OF = CLASS_OF -- (zrun.models.phi3 adds its class; from_pretrained loads it for model_type "phi3")

-- cfg: a Hugging Face config table (config.json), plus optional dtype/device for parameters; its
-- model_type (none: the class's) must be the class's (from_pretrained picks the class by it).
function CausalLM:__init(cfg)
  cfg = M.normalize_config(cfg, self.family)
  rawset(self, "config", cfg)
  self.model = self.Model(cfg)
  if not cfg.tie_word_embeddings then
    self.lm_head = linear(cfg, cfg.hidden_size, cfg.vocab_size, false)
  end
  self:init_weights()
end

-- Hugging Face's _init_weights: N(0, initializer_range) for Linear and Embedding weights (the
-- pad_token_id row zero), zero biases, the class's NORM_INIT for RMSNorm weights (ones; Gemma's zeros).
function CausalLM:init_weights()
  local std = self.config.initializer_range
  zr.no_grad(function()
    for name, p in self:named_parameters() do
      if name:match("norm%.weight$") then init.constant_(p, self.NORM_INIT)
      elseif name:match("%.bias$") then init.zeros_(p)
      else init.normal_(p, 0, std) end
    end
    self.model.embed_tokens:zero_padding_row()
  end)
end

-- Whether packed sequences (position_ids) run here as one row on the segments (packed.flat_ok: no gathers):
-- the Trainer then runs a right-padded batch as the padding-free batch of its rows (packed.unpad).
function CausalLM:packs_flat()
  local w = self.model.embed_tokens.weight
  return packed.flat_ok(w:device(), w:dtype(), head_dim(self.config))
end

-- The token embedding module (transformers' get_input_embeddings).
function CausalLM:get_input_embeddings() return self.model.embed_tokens end

-- The (vocab_size, hidden_size) output projection: lm_head's weight, or the embedding when tied.
function CausalLM:output_weight()
  return self.lm_head and self.lm_head.weight or self.model.embed_tokens.weight
end

-- forward(input_ids (B,T) i64 [, labels (B,T) [, {label_smoothing = eps, loss_type =, position_ids =, token_stats =,
-- chunked_loss =}]]) -> {logits=, loss= [, entropy=, argmax=]}.
-- labels are shifted inside (position t predicts token t+1); -100 is ignored; the loss is the mean
-- over counted tokens (token_mean_loss: the Trainer weights it by the step's token count), with
-- label smoothing eps as Hugging Face's LabelSmoother (the Trainer's label_smoothing_factor), or
-- loss_type "dft" (TRL's, causal_lm_loss).
-- position_ids (B,T) as transformers takes them without an attention mask: each token's position,
-- a new packed sequence where they do not go up by one (zrun.models.packed); the labels of each
-- sequence's first token should be -100 (TRL's padding-free collator sets them), else the last
-- token of the sequence before is scored against it.
-- When the loss will be recorded for backward (labels, grad mode on, trainable head), its
-- gradient is written over the logits in the forward (causal_lm_loss's inplace: no second
-- logits-sized buffer in backward), and out.logits is made again on first read from the final
-- hidden states by the same head: reading it after a training forward costs one more LM-head
-- product, with the weights as they are then (read it before the optimizer step). Otherwise
-- (eval, no_grad, no labels) out.logits is the logits tensor itself.
-- chunked_loss (true, or the vocabulary columns of a slice; with labels): the loss without the logits
-- (M.chunked_causal_lm_loss: Liger's fused linear cross-entropy, TRL's chunked_nll), out.logits made on first read.
-- labels may be on the host beside a model on a GPU (M.labels_for).
function CausalLM:forward(input_ids, labels, opts)
  if not zr._C.is_tensor(input_ids) then -- (a transformers habit, model(**batch), or a missing argument: said, not indexed)
    error(("LlamaForCausalLM:forward(input_ids [, labels [, opts]]): input_ids must be a tensor of token ids (B, T), got %s%s")
      :format(type(input_ids), type(input_ids) == "table" and " (zrun takes the tensors as arguments: model(batch.input_ids, " ..
      "batch.labels), not transformers' model(**batch))" or ""), 2)
  end
  if opts then
    require("zrun.kwargs").check(self.__name .. ":forward", opts,
      { "label_smoothing", "position_ids", "token_stats", "loss_type", "chunked_loss" })
  end
  local scope = self:temporaries_scope()
  local h = self.model(input_ids, opts and opts.position_ids)
  labels = M.labels_for(labels, h, opts)
  local function head()
    if self.lm_head then return self.lm_head(h) end
    -- tied: the embedding matrix is used outside its module (ZeRO-3 gathers it via fetch)
    local fetch = Module.fetch or function(p) return p end
    return zr.linear(h, fetch(self.model.embed_tokens.weight))
  end
  if labels and opts and opts.chunked_loss then
    local out = {}
    out.loss, out.entropy, out.argmax = M.chunked_causal_lm_loss(self.__name, h,
      M.head_weight(self.__name, self.lm_head, self.model.embed_tokens.weight), labels, opts)
    return (Module.end_scope(scope, M.lazy_logits(out, head, h), h, out.entropy, out.argmax))
  end
  local logits = head()
  local entropy, argmax = M.token_stats(logits, opts)
  if not labels then
    return (Module.end_scope(scope, { logits = logits, entropy = entropy, argmax = argmax }, entropy, argmax))
  end
  local recorded = zr.is_grad_enabled() and logits.requires_grad
  local out = { loss = M.causal_lm_loss(logits, labels, recorded, opts and opts.label_smoothing, opts and opts.loss_type),
    entropy = entropy, argmax = argmax }
  -- h stays for the lazy logits; the logits the loss wrote its gradient over go with the scope
  if recorded then return (Module.end_scope(scope, M.lazy_logits(out, head, h), h, entropy, argmax)) end
  out.logits = logits
  return (Module.end_scope(scope, out, entropy, argmax))
end

-- Generation (zrun.generation) --------------------------------------------------------------
-- model:generate(input_ids [, opts]): transformers' generate (zrun.generation.generate says its options).
function CausalLM:generate(input_ids, opts) return require("zrun.generation").generate(self, input_ids, opts) end

-- The attention of layer i's new tokens x (B, Tq, C) over the cache (zrun.generation's): the projections
-- called as modules (LoRA layers as they stand), q and k rotated at the step's positions (Qwen3, Gemma 3:
-- after q_norm / k_norm), scaled by a.scale (Gemma 3's) or 1/sqrt(head_dim).
local function cached_attention(a, x, cos, sin, cache, i, window)
  local B, T, H, KV, D = x:size(1), x:size(2), a.n_heads, a.n_kv, a.hd
  local q = a.q_proj(x):view(B, T, H, D)
  local k = a.k_proj(x):view(B, T, KV, D)
  if a.q_norm then q, k = a.q_norm(q), a.k_norm(k) end
  q, k = q:transpose(2, 3), k:transpose(2, 3)
  local v = a.v_proj(x):view(B, T, KV, D):transpose(2, 3)
  q, k = cache:rope(q, cos, sin), cache:rope(k, cos, sin)
  return a.o_proj(cache:attend(i, q, k, v, a.scale or 1 / math.sqrt(D), window):transpose(2, 3):reshape(B, T, H * D))
end
M.cached_attention = cached_attention -- (zrun.models.gemma3's generation step)

-- The rope tables' length for a generation step over cache: a power of two of positions (64 at least) past its
-- largest (each step's one more position would else build and keep a table per length; the rope types zrun takes
-- give each position's row whatever the table's length).
function M.step_table_length(cache)
  local P = 64
  while P <= cache.max_position do P = P * 2 end
  return P
end

-- One generation step: the logits (B, 1, V) of the last of the new tokens ids (B, Tq) after the
-- tokens in cache (zrun.generation's Cache: their keys and values, appended to here; the new tokens'
-- positions and attention masks). Eval mode, no gradients (generate runs it so).
function CausalLM:generation_step(ids, cache)
  local m, cfg = self.model, self.config
  local h = m.embed_tokens(ids)
  local cos, sin = m:rope(M.step_table_length(cache), h:dtype(), h:device())
  for i, layer in ipairs(m.layers) do
    h = h + cached_attention(layer.self_attn, layer.input_layernorm(h), cos, sin, cache, i, hf_config.layer_window(cfg, i))
    h = h + layer.mlp(layer.post_attention_layernorm(h))
  end
  return self:last_logits(h)
end

-- The logits (B, 1, V) of h's last position after the final norm (the generation steps' end).
function CausalLM:last_logits(h)
  local m = self.model
  h = m.norm(h:narrow(2, h:size(2), 1))
  if self.lm_head then return self.lm_head(h) end
  return zr.linear(h, m.embed_tokens.weight)
end

-- opts.token_stats: each position's entropy of the softmax (f32) and argmax (i64, 0-based) from the logits
-- (B, T, V), read before the loss takes them over (zr.logits_stats, one pass, no gradient): TRL's logged
-- entropy and mean_token_accuracy. nil, nil otherwise.
function M.token_stats(logits, opts)
  if not (opts and opts.token_stats) then return nil, nil end
  return zr.logits_stats(logits)
end

-- out (a forward's result table) whose out.logits is made by make() on first read, then kept:
-- the logits of a training forward whose loss took them over for its gradient. hidden: the final
-- hidden states make() reads (M.release_outputs frees them).
function M.lazy_logits(out, make, hidden)
  return setmetatable(out, { hidden = hidden, __index = function(t, k)
    if k ~= "logits" then return nil end
    local lg = make()
    rawset(t, "logits", lg)
    return lg
  end })
end

-- Whether head (an lm_head module) has a LoRA adapter (is not a plain Linear): its weight alone would drop the delta.
function M.adapted_head(head) return head ~= nil and head.__name ~= "Linear" end

-- The LM head's weight (V, D) for zr.linear_cross_entropy, which reads it outside the head's module: head (the
-- lm_head module; nil: tied, the embedding's weight `tied`), gathered by ZeRO-3 (Module.fetch: whole until the end of
-- backward). A LoRA-wrapped head is refused (its delta would be dropped), as TRL refuses it for chunked_nll. name: the
-- model's, for the message.
function M.head_weight(name, head, tied)
  local fetch = Module.fetch or function(p) return p end
  if M.adapted_head(head) then
    error(("%s: chunked_loss reads the LM head's weight alone, and lm_head is a %s (a LoRA adapter on it would be " ..
      "dropped); leave lm_head out of target_modules, or use the plain loss"):format(name, tostring(head.__name)), 0)
  end
  return fetch(head and head.weight or tied)
end

-- opts.chunked_loss (true, or the vocabulary columns of a slice): causal_lm_loss's loss without the logits
-- (zr.linear_cross_entropy over the final hidden states h (B, T, D) and the head's weight w (V, D): the logits are made
-- a slice at a time, only the counted tokens' rows, and made again in backward; one more LM-head product over the
-- counted tokens than the plain loss). The same loss and gradients as the plain path, to the summation order; label
-- smoothing as there. opts.token_stats: also the entropy and argmax (B, T) of the positions whose shifted label
-- counts (made from the same slices; 0 elsewhere: what the Trainer's token sums read). name: the model's, for
-- messages. Returns loss [, entropy, argmax].
function M.chunked_causal_lm_loss(name, h, w, labels, opts)
  local c = opts.chunked_loss
  if not (c == true or (type(c) == "number" and c >= 1 and c == math.floor(c))) then
    error(("%s:forward: chunked_loss must be true or a whole number of vocabulary columns a slice, got %s"):format(name,
      tostring(c)), 0)
  end
  if opts.loss_type ~= nil and opts.loss_type ~= "nll" then
    error(("%s:forward: chunked_loss computes the plain token-mean loss; loss_type %s needs the per-token losses " ..
      "of the full logits: drop chunked_loss (TRL's chunked_nll is the plain loss)"):format(name, tostring(opts.loss_type)), 0)
  end
  local B, T, D = h:size(1), h:size(2), h:size(3)
  local loss, entropy, argmax = zr.linear_cross_entropy(h:reshape(B * T, D), w, M.shift_labels(labels):view(B * T),
    { ignore_index = -100, label_smoothing = opts.label_smoothing or 0, chunk = c == true and 0 or c,
      token_stats = opts.token_stats or nil })
  if entropy then entropy, argmax = entropy:view(B, T), argmax:view(B, T) end
  return loss, entropy, argmax
end

-- The labels a forward scores its hidden states h against: labels on the host beside a GPU's h go to h's device, but
-- for chunked_loss, whose op reads them on the host (no copy back from the GPU, which would wait for the forward so
-- far: the Trainer hands the collator's labels over as they are).
function M.labels_for(labels, h, opts)
  if not labels or labels:device() == h:device() or (opts and opts.chunked_loss) then return labels end
  return labels:to(h:device())
end

-- labels (B, T) shifted for the causal loss: position t scored against token t+1 and the last against -100 (so the
-- logits or hidden states are used as they are, with no (B, T-1, ...) slice); rows of one token predict nothing.
function M.shift_labels(labels)
  local B, T = labels:size(1), labels:size(2)
  local pad = zr.full({ B, 1 }, -100, { dtype = labels:dtype(), device = labels:device() })
  return T < 2 and zr.full({ B, T }, -100, { dtype = labels:dtype(), device = labels:device() })
    or zr.cat({ labels:narrow(2, 2, T - 1), pad }, 2)
end

-- Frees a training forward's result now (zr.release): its loss and, for lazy logits, the hidden
-- states kept to make them (logits a model returned as such are left to the collector: the model
-- may hold them). For a training loop that has read what it needs (the Trainer): the next
-- collection need not run for them. out.loss is unusable after.
function M.release_outputs(out)
  local mt = getmetatable(out)
  zr.release(rawget(out, "loss"), type(mt) == "table" and mt.hidden or nil)
end

-- Mean cross-entropy of logits (B, T, V) against labels (B, T) shifted by one (position t scores
-- token t+1); label -100 is ignored. inplace: the loss's gradient is written over the logits
-- (zr.cross_entropy's inplace; the caller must not read them again) when it is recorded.
-- label_smoothing (default 0): Hugging Face's LabelSmoother over the V classes.
-- loss_type "dft" (TRL's SFTConfig loss_type, its dft_loss): each counted token's cross-entropy
-- weighted by the probability the model gives the label, exp(-ce), taken as a constant; the mean over
-- the counted tokens (NaN when none counts, as TRL's 0 / 0). It runs the plain (not in-place)
-- cross-entropy per token: the gradient is a second logits-sized tensor in backward.
function M.causal_lm_loss(logits, labels, inplace, label_smoothing, loss_type)
  local B, T, V = logits:size(1), logits:size(2), logits:size(3)
  -- Shift the labels, not the logits (as HF's ForCausalLMLoss does): position t is scored against
  -- token t+1 and the last position against -100, so the full logits are used as they are, with
  -- no (B, T-1, V) slice to copy forward and scatter back. Rows of one token (a micro-batch of them:
  -- an empty text with its BOS) predict nothing: every label -100, as HF's padded shift gives, so the
  -- loss counts no token there (0, no gradient) and training goes on, as transformers' does.
  local shifted = M.shift_labels(labels)
  -- HF upcasts 16-bit logits to fp32 for the loss; cross_entropy already computes in fp32 (and
  -- its gradient is rounded to the logits' dtype exactly where HF's cast rounds it), so the
  -- full-vocabulary fp32 copy is skipped.
  if loss_type == "dft" then
    if label_smoothing and label_smoothing ~= 0 then
      error("causal LM loss: loss_type \"dft\" takes no label smoothing (TRL's dft_loss replaces the LabelSmoother)", 0)
    end
    local per = zr.cross_entropy(logits:reshape(B * T, V), shifted:view(B * T), { ignore_index = -100, reduction = "none" })
    local counted = shifted:ne(-100):to(per:dtype()):sum()
    return (per * per:detach():neg():exp()):sum() / counted
  elseif loss_type ~= nil and loss_type ~= "nll" then
    error(("causal LM loss: loss_type %s is not one of \"nll\" or \"dft\""):format(tostring(loss_type)), 0)
  end
  return zr.cross_entropy(logits:reshape(B * T, V), shifted:view(B * T),
    { ignore_index = -100, inplace = inplace or nil, label_smoothing = label_smoothing or nil })
end

-- Activation checkpointing per decoder layer in training mode: keeps each layer's input and
-- recomputes the layer in backward (zr.checkpoint). Returns the model.
function CausalLM:gradient_checkpointing_enable() rawset(self.model, "gradient_checkpointing", true); return self end
function CausalLM:gradient_checkpointing_disable() rawset(self.model, "gradient_checkpointing", false); return self end
-- transformers' enable_input_require_grads / disable_input_require_grads (called before LoRA with gradient
-- checkpointing, so that the checkpointed layers' input needs a gradient): nothing to do in zrun, whose
-- checkpoint re-runs a layer whose parameters need gradients even when its input does not. Return the model.
function CausalLM:enable_input_require_grads() return self end
function CausalLM:disable_input_require_grads() return self end

-- Writes a Hugging Face model directory (config.json + model.safetensors + generation_config.json) that
-- transformers' from_pretrained loads. Works for any zrun causal LM with HF parameter names.
-- The config is written as transformers 5 writes it (hf.save_config); generation_config.json is the
-- model's generation_config (the one from_pretrained read: sampling settings, max_length, eos ids carry
-- through), else the config's token ids, as transformers writes it for a model built from a config.
function M.save_pretrained(model, dir, opts)
  local cfg = {}
  for k, v in pairs(model.config) do if k ~= "dtype" and k ~= "device" then cfg[k] = v end end
  cfg.architectures = cfg.architectures or { model.__name }
  local sd = {}
  for name, p in model:named_parameters() do sd[name] = p end
  cfg.torch_dtype = model:parameters()[1]:dtype()
  local hf = require "zrun.hf"
  local files = hf.save_pretrained(dir, sd, cfg, opts)
  files[#files + 1] = hf.save_generation_config(dir, rawget(model, "generation_config"), cfg)
  return files
end
-- model:save_pretrained(dir): M.save_pretrained(model, dir) above.
function CausalLM:save_pretrained(dir, opts) return M.save_pretrained(self, dir, opts) end

-- Config ------------------------------------------------------------------------------------
-- A config table (config.json fields, either rope format) checked and normalised by
-- zrun.models.hf_config; a value zrun does not implement is refused there, naming the field.
-- dtype/device: what to build the parameters in (default f32 on the CPU). family: the model type
-- it must have (llama, mistral, qwen2, qwen3); nil: any of them, by its model_type (none: llama).
function M.normalize_config(cfg, family)
  if type(cfg) == "string" then cfg = M.config(cfg) end
  local c = family and hf_config[family](cfg) or hf_config.llama_family(cfg)
  c.dtype = c.dtype or "f32"
  c.device = c.device or "cpu"
  return c
end

-- A config by name (built-in table), from a config.json path, or from a HF model directory.
function M.config(name_or_path)
  local builtin = require("zrun.models.configs")[name_or_path]
  if builtin then
    local c = {}
    for k, v in pairs(builtin) do c[k] = v end
    return c
  end
  local hf = require "zrun.hf"
  return hf.read_config(name_or_path)
end

-- Builds the model and loads Hugging Face weights from a model directory or cached hub id.
-- opts: dtype (default "f32"; "auto": config.json's, else the files', as transformers), device (default "cpu"),
-- config (fields that override config.json's,
-- as keyword arguments do in transformers' from_pretrained), revision, cache_dir, threads (reading
-- the files; default min(8, CPUs)). The model is built without initialising its weights (each one
-- is then read from the files, once, straight into the parameter: hf.load_weights). The rotary_emb.inv_freq
-- buffers older checkpoints hold are skipped, as transformers skips them; with tie_word_embeddings a
-- lm_head.weight in the files must equal the embedding (M.check_tied_head).
-- The class is config.json's model_type's (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
-- Qwen3ForCausalLM); family (zr.models.mistral's, qwen2's and qwen3's from_pretrained): the one model
-- type to accept.
function M.from_pretrained(ref, opts, family)
  local hf = require "zrun.hf"
  local cfg, dir = hf.pretrained_config(ref, opts) -- (checks opts: dtype, device, config, revision, cache_dir, threads)
  local t = family or cfg.model_type
  if t == "phi3" then require "zrun.models.phi3" end -- (registers Phi3ForCausalLM)
  if t == "gemma3_text" then require "zrun.models.gemma3" end -- (registers Gemma3ForCausalLM)
  local model = init.no_init(CLASS_OF[t] or CausalLM, cfg)
  local F = model.config.model_type
  local tied, head = model.config.tie_word_embeddings, false
  local ok, err = pcall(hf.load_weights, model, dir, { threads = opts and opts.threads, rename = function(name)
    if name == "lm_head.weight" then head = true; if tied then return nil end end
    -- the rotary frequencies older transformers saved per layer (model.layers.N.self_attn.rotary_emb.inv_freq,
    -- Llama 2 era checkpoints): a buffer computed from the config, which transformers 5 skips on load too
    if name:match("rotary_emb%.inv_freq$") then return nil end
    return name
  end })
  if not ok and not tied and not head and tostring(err):find('"lm_head.weight"', 1, true) then -- (missing: transformers
    -- would start the head from random weights, with a warning)
    error(("%s: %s has no lm_head.weight and config.json's tie_word_embeddings is false, so the output head would " ..
      "be random; if the head is the embedding, load with { config = { tie_word_embeddings = true } }"):format(F, dir),
      0)
  elseif not ok then
    hf.raise_load_error(F, dir, err)
  end
  if head and tied then
    M.check_tied_head(dir, model.model.embed_tokens.weight, F, "model.embed_tokens.weight",
      "load with { config = { tie_word_embeddings = false } } to keep both")
  end
  hf.keep_source(model, ref, dir)
  return model
end

-- A tied model's checkpoint that holds lm_head.weight too (torch .bin files always do): transformers
-- 5 ties the head to the embedding only when the two are equal (PreTrainedModel.tie_weights; else it
-- warns and keeps them apart, untied), so one that differs is refused here, naming both and what to
-- do (hint). emb: the loaded embedding parameter.
function M.check_tied_head(dir, emb, family, emb_name, hint)
  local hf = require "zrun.hf"
  local h = hf.load_state_dict(dir, { names = { "lm_head.weight" }, dtype = emb:dtype(), device = emb:device() })["lm_head.weight"]
  local same = h:dim() == 2 and h:size(1) == emb:size(1) and h:size(2) == emb:size(2)
    and h:ne(emb):to("f32"):sum():item() == 0
  if not same then
    error(("%s: tie_word_embeddings is true but the checkpoint's lm_head.weight differs from %s; "
      .. "transformers 5 then keeps them apart (untied): %s"):format(family, emb_name, hint), 0)
  end
end

return M
