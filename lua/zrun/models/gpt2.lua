-- GPT-2 (GPT2LMHeadModel) with Hugging Face semantics and names: learned positions, pre-LayerNorm
-- blocks, GELU (tanh approximation, or exact for activation_function "gelu"; also ReLU, SiLU and
-- quick_gelu), Conv1D projections (weights stored (in, out)), the head tied to wte (or a separate
-- lm_head with tie_word_embeddings false), and transformers' embedding, residual and attention
-- dropout while training. The config is checked by zrun.models.hf_config.
local zr = require "zrun"
local nn = require "zrun.nn"
local Module = require "zrun.nn.module"
local hf_config = require "zrun.models.hf_config"
local init = require "zrun.nn.init_fns"
local packed = require "zrun.models.packed"

local M = {}

-- HF's Conv1D: y = x W + b with W (in, out). zr.conv1d reads W as stored (no transposed copy on a
-- GPU) and makes its gradient (in, out), straight into an existing one (the engine's fp32 partition).
-- std: the weight's init (default initializer_range).
local Conv1D = Module:extend("Conv1D")
function Conv1D:__init(nx, nf, cfg, std)
  local td = { dtype = cfg.dtype, device = cfg.device }
  self.weight = nn.Parameter(init.normal_(zr.empty({ nx, nf }, td), 0, std or cfg.initializer_range))
  self.bias = nn.Parameter(init.zeros_(zr.empty({ nf }, td)))
end
function Conv1D:forward(x) return zr.conv1d(x, self.weight, self.bias) end

-- The c_proj weights' init (transformers' GPT2PreTrainedModel._init_weights, GPT-2's scheme):
-- initializer_range / sqrt(2 n_layer), the residual branches' outputs scaled down with depth.
local function proj_std(cfg) return cfg.initializer_range / math.sqrt(2 * cfg.n_layer) end

-- transformers' nn.Dropout: active while training, p = 0 costs nothing.
local function dropout(x, p, training)
  if p == 0 or not training then return x end
  return zr.dropout(x, p, true)
end

-- (T, T) u8 mask of the future (key after query), per length and device (kept: a few lengths).
local future_masks = {}
local function future_mask(T, device)
  local key = T .. device
  local m = future_masks[key]
  if not m then
    local rows = {}
    for i = 1, T do
      local r = {}
      for j = 1, T do r[j] = j > i and 1 or 0 end
      rows[i] = r
    end
    m = zr.persist(zr.tensor(rows):to("u8"):to(device)) -- built inside a forward: kept by its scope
    future_masks[key] = m
  end
  return m
end

-- transformers' eager GPT-2 attention: softmax(q k^T · scale over the past) with dropout p on
-- the probabilities, times v. q, k, v: (B, H, T, D). It materialises the (B, H, T, T)
-- probabilities, so it runs only while training with attn_pdrop > 0 (the fused kernel has no
-- dropout); otherwise the fused causal attention computes the same without them. scale: default
-- 1/sqrt(D).
function M.eager_attention(q, k, v, p, scale)
  local T, D = q:size(3), q:size(4)
  local scores = zr.matmul(q, k:transpose(3, 4)) * (scale or 1 / math.sqrt(D))
  local probs = zr.softmax(scores:masked_fill(future_mask(T, q:device()), -1e30), -1)
  if p > 0 then probs = zr.dropout(probs, p, true) end
  return zr.matmul(probs, v)
end

-- The attention's scale, as GPT2Attention.scaling: 1/sqrt(head_dim) unless scale_attn_weights is false,
-- divided by layer_idx + 1 (0-based) with scale_attn_by_inverse_layer_idx. (reorder_and_upcast_attn
-- computes the same scores in fp32, which zrun's attention does in every dtype.)
local function attention_scale(cfg, layer_idx)
  local s = cfg.scale_attn_weights and 1 / math.sqrt(cfg.n_embd / cfg.n_head) or 1
  if cfg.scale_attn_by_inverse_layer_idx then s = s / (layer_idx + 1) end
  return s
end

local Attention = Module:extend("GPT2Attention")
function Attention:__init(cfg, layer_idx)
  self.n_head, self.n_embd, self.scale = cfg.n_head, cfg.n_embd, attention_scale(cfg, layer_idx)
  self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd, cfg)
  self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd, cfg, proj_std(cfg))
  self.resid_pdrop, self.attn_pdrop = cfg.resid_pdrop, cfg.attn_pdrop
end
-- segs (zrun.models.packed.segments): packed sequences, each attending to itself (segs.seg, the
-- segments: the rows joined into one (1, B·T) row; else the groups)
function Attention:forward(x, segs)
  local C, H = self.n_embd, self.n_head
  -- one c_attn product (B, T, 3C), q, k, v in its columns: zr.sdpa_packed reads them in place and
  -- writes their gradients into one (B, T, 3C) buffer (the product's, whole)
  local qkv = self.c_attn(x)
  local function attend(t)
    if self.training and self.attn_pdrop > 0 then
      local B, T = t:size(1), t:size(2)
      local q, k, v = unpack(zr.split(t, C, 3))
      local function heads(u) return u:view(B, T, H, C / H):transpose(2, 3) end
      return M.eager_attention(heads(q), heads(k), heads(v), self.attn_pdrop, self.scale):transpose(2, 3):reshape(B, T, C)
    end
    return zr.sdpa_packed(t, H, H, self.scale)
  end
  local y
  if segs and segs.seg then
    local B, T = qkv:size(1), qkv:size(2)
    y = zr.sdpa_packed(qkv:view(1, B * T, qkv:size(3)), H, H, { segments = segs.seg, scale = self.scale }):view(B, T, C)
  elseif segs then
    y = packed.attend({ qkv }, segs, function(p) return attend(p[1]) end)
  else
    y = attend(qkv)
  end
  return dropout(self.c_proj(y), self.resid_pdrop, self.training)
end

-- The activations other than the GELUs (transformers' ACT2FN; hf_config lists the names it accepts).
local ACTIVATIONS = {
  relu = function(x) return x:relu() end,
  silu = function(x) return x:silu() end,
  swish = function(x) return x:silu() end,
  quick_gelu = function(x) return x * (x * 1.702):sigmoid() end, -- QuickGELUActivation
}

local MLP = Module:extend("GPT2MLP")
function MLP:__init(cfg)
  local inner = cfg.n_inner or 4 * cfg.n_embd
  self.c_fc = Conv1D(cfg.n_embd, inner, cfg)
  self.c_proj = Conv1D(inner, cfg.n_embd, cfg, proj_std(cfg))
  self.approximate, self.resid_pdrop = cfg.gelu_approximate, cfg.resid_pdrop
  self.act = not cfg.gelu_approximate and ACTIVATIONS[cfg.activation_function] or nil
end
-- c_fc, the tanh GELU and c_proj run as one op (zr.mlp_gelu: on a GPU the c_fc GEMM's epilogue
-- applies the GELU and keeps its input; in backward c_proj's dX GEMM applies the GELU's derivative)
-- when both are plain Conv1Ds without hooks of their own (ZeRO-3's run for both around the op,
-- Module.call_group, as llama.lua's fusable()).
local function fusable(m) return m.forward == Conv1D.forward and m:groupable() end
local function mlp_gelu(x, fc, proj) return zr.mlp_gelu(x, fc.weight, fc.bias, proj.weight, proj.bias, "conv1d") end
function MLP:forward(x)
  local fc, proj, y = self.c_fc, self.c_proj, nil
  if self.approximate == "tanh" and fusable(fc) and fusable(proj) then
    y = Module.call_group({ fc, proj }, mlp_gelu, x, fc, proj)
  elseif self.act then
    y = proj(self.act(fc(x)))
  else
    y = proj(fc(x):gelu(self.approximate))
  end
  return dropout(y, self.resid_pdrop, self.training)
end

local Block = Module:extend("GPT2Block")
function Block:__init(cfg, layer_idx)
  local o = { eps = cfg.layer_norm_epsilon or 1e-5, dtype = cfg.dtype, device = cfg.device }
  self.ln_1 = nn.LayerNorm(cfg.n_embd, o)
  self.attn = Attention(cfg, layer_idx)
  self.ln_2 = nn.LayerNorm(cfg.n_embd, o)
  self.mlp = MLP(cfg)
end
-- A residual add and the LayerNorm after it run as one op (zr.add_layer_norm: one kernel on a
-- GPU, h = x + r and ln(h)) when the norm is a plain nn.LayerNorm without hooks of its own
-- (ZeRO-3's run around the op, the norm's output first), as llama.lua's add_norm.
local layernorm_forward = nn.LayerNorm.forward
local function add_layer_norm_yh(x, r, ln)
  local h, y = zr.add_layer_norm(x, r, ln.weight, ln.bias, ln.eps)
  return y, h
end
local function add_norm(x, r, ln)
  if ln.forward == layernorm_forward and ln:groupable() then
    local y, h = Module.call_group({ ln }, add_layer_norm_yh, x, r, ln)
    return h, y
  end
  local h = x + r
  return h, ln(h)
end
-- The block as (h, m), its output h + m not yet summed: pending, the previous block's m, is added
-- to x together with ln_1 (Transformer:forward passes it on; nil: x is the block's input as is).
function Block:residual_forward(x, pending, segs)
  local y
  if pending then x, y = add_norm(x, pending, self.ln_1) else y = self.ln_1(x) end
  local h, y2 = add_norm(x, self.attn(y, segs), self.ln_2)
  return h, self.mlp(y2)
end
function Block:forward(x, segs)
  local h, m = self:residual_forward(x, nil, segs)
  return h + m
end

local Transformer = Module:extend("GPT2Model")
function Transformer:__init(cfg)
  local td = { dtype = cfg.dtype, device = cfg.device }
  self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd, td)
  self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd, td)
  self.h = nn.ModuleList()
  for i = 1, cfg.n_layer do self.h:append(Block(cfg, i - 1)) end
  self.ln_f = nn.LayerNorm(cfg.n_embd, { eps = cfg.layer_norm_epsilon or 1e-5, dtype = cfg.dtype, device = cfg.device })
  rawset(self, "cfg", cfg)
end
-- Each block's last residual add runs with the next block's ln_1 (or ln_f) as one op: a block
-- called as itself (a plain GPT2Block that Module:skippable() allows, no checkpointing) hands on its
-- (h, m) and the next add_norm sums them; any other block is called as a module on the summed x.
-- position_ids (B, T), optional: each token's learned position, and where they restart a new packed
-- sequence begins (packed.lua; the segments where the attention takes them, not with the attention
-- dropout's eager path).
local block_forward = Block.forward
function Transformer:forward(ids, position_ids)
  local B, T = ids:size(1), ids:size(2)
  local cfg = self.cfg
  local flat = not (self.training and cfg.attn_pdrop > 0) and
    packed.flat_ok(ids:device(), self.wte.weight:dtype(), cfg.n_embd / cfg.n_head)
  local segs = position_ids and packed.segments(position_ids, B, T, ids:device(), flat)
  local ckpt = rawget(self, "gradient_checkpointing") and self.training
  if segs and segs.seg and ckpt then zr.persist(segs.seg) end -- (the checkpointed blocks' recomputation reads it)
  local last = segs and segs.max_position + 1 or T
  if last > self.cfg.n_positions then -- (transformers: "IndexError: index out of range in self" from wpe)
    error(("gpt2: %s %d exceeds n_positions %d (GPT-2's learned positions end there: cut rows to at most %d tokens, "
      .. "e.g. block_size= or max_length=)"):format(segs and "position" or "sequence length", segs and last - 1 or T,
      self.cfg.n_positions, self.cfg.n_positions), 0)
  end
  local scope = self:temporaries_scope()
  local pos
  if segs then
    pos = position_ids:to(self.wpe.weight:device(), "i64")
  else
    pos = rawget(self, "pos_" .. T)
    if not pos then pos = zr.persist(zr.arange(T, { device = self.cfg.device })); rawset(self, "pos_" .. T, pos) end
  end
  local x = dropout(self.wte(ids) + self.wpe(pos), self.cfg.embd_pdrop, self.training)
  local pending -- the last block's m, not yet added to x
  for _, block in ipairs(self.h) do
    if not ckpt and block.forward == block_forward and block:skippable() then
      x, pending = block:residual_forward(x, pending, segs)
    else
      if pending then x, pending = x + pending, nil end
      if ckpt then x = zr.checkpoint(function(v) return block(v, segs) end, x) else x = block(x, segs) end
    end
  end
  if pending then x = select(2, add_norm(x, pending, self.ln_f)) else x = self.ln_f(x) end
  return (Module.end_scope(scope, x))
end

local LM = Module:extend("GPT2LMHeadModel")
-- forward(ids, labels) returns the mean loss over the labels that count after the shift, and takes
-- {label_smoothing=} third: the Trainer weights each micro-batch by its token count (transformers'
-- num_items_in_batch) and passes label_smoothing_factor.
LM.token_mean_loss = true
LM.supports_token_stats = true -- (forward's token_stats: the Trainer asks for TRL's statistics)
LM.supports_loss_type = { nll = true, dft = true } -- (forward's loss_type: TRL's SFTConfig loss_type)
LM.supports_chunked_loss = true -- (forward's chunked_loss: use_liger_kernel, TRL's chunked_nll)
M.GPT2LMHeadModel = LM
-- cfg: a Hugging Face config table (config.json fields) or a built-in name, plus optional
-- dtype/device for the parameters.
function LM:__init(cfg)
  if type(cfg) == "string" then cfg = require("zrun.models.llama").config(cfg) end
  local c = hf_config.gpt2(cfg)
  c.dtype, c.device = c.dtype or "f32", c.device or "cpu"
  rawset(self, "config", c)
  self.transformer = Transformer(c)
  if not c.tie_word_embeddings then -- transformers' lm_head: nn.Linear without bias, init normal(0, initializer_range)
    self.lm_head = nn.Linear(c.n_embd, c.vocab_size, { bias = false, dtype = c.dtype, device = c.device })
  end
  zr.no_grad(function()
    for name, p in self:named_parameters() do
      if name:match("ln_%w+%.weight$") then init.ones_(p)
      elseif name:match("ln_%w+%.bias$") then init.zeros_(p)
      elseif name:match("wte") or name:match("wpe") or name == "lm_head.weight" then init.normal_(p, 0, c.initializer_range) end
    end
  end)
end
-- Whether packed sequences (position_ids) run here as one row on the segments, as Transformer:forward decides
-- (llama's CausalLM:packs_flat: the Trainer then runs a right-padded batch padding-free).
function LM:packs_flat()
  local c, w = self.config, self.transformer.wte.weight
  return not (self.training and c.attn_pdrop > 0) and packed.flat_ok(w:device(), w:dtype(), c.n_embd / c.n_head)
end
-- forward(ids (B,T) i64 [, labels (B,T) [, {label_smoothing = eps, loss_type =, position_ids =, token_stats =,
-- chunked_loss =}]]) -> {logits=, loss= [, entropy=, argmax=]}, as LlamaForCausalLM's (position_ids: packed sequences;
-- token_stats: TRL's statistics; loss_type "dft": TRL's; chunked_loss: no logits, llama.chunked_causal_lm_loss; labels on
-- the host beside a GPU's model: llama.labels_for): a loss that will be recorded takes the logits over for its gradient,
-- and out.logits is then made again on first read (one more LM-head product).
function LM:forward(ids, labels, opts)
  if opts then
    require("zrun.kwargs").check("GPT2LMHeadModel:forward", opts,
      { "label_smoothing", "position_ids", "token_stats", "loss_type", "chunked_loss" })
  end
  local scope = self:temporaries_scope()
  local h = self.transformer(ids, opts and opts.position_ids)
  local llama = require "zrun.models.llama"
  labels = llama.labels_for(labels, h, opts)
  -- The head: (logits (B,T,V), full (B,T,Vp)). GPU GEMMs want leading dimensions that are
  -- multiples of 8 elements; GPT-2's 50257 is odd, so (as llm.c does) the head runs on a
  -- zero-padded copy of the matrix. The padding logits get a bias of -1e30 (the GEMM's bias
  -- epilogue, free): the loss is taken over the padded rows as they are (no narrowed copy of the
  -- logits forward, no scatter back), the padding adds exp(-1e30) = 0 to every softmax and gets
  -- zero gradient; the caller sees the first V logits (a view).
  local function head()
    local fetch = Module.fetch or function(p) return p end -- ZeRO-3 gathers wte (tied head) or lm_head here
    local w = fetch(self.lm_head and self.lm_head.weight or self.transformer.wte.weight)
    local V, C = w:size(1), w:size(2)
    local Vp = w:device() ~= "cpu" and math.ceil(V / 64) * 64 or V
    if Vp == V then
      local logits = zr.linear(h, w)
      return logits, logits
    end
    w = zr.cat({ w, zr.zeros({ Vp - V, C }, { dtype = w:dtype(), device = w:device() }) }, 1)
    local pb = rawget(self, "_pad_bias")
    if not pb or pb:dtype() ~= w:dtype() or pb:device() ~= w:device() or pb:numel() ~= Vp then
      pb = zr.persist(zr.cat({ zr.zeros({ V }), zr.full({ Vp - V }, -1e30) }):to(w:dtype()):to(w:device()))
      rawset(self, "_pad_bias", pb)
    end
    local full = zr.linear(h, w, pb)
    return full:narrow(3, 1, V), full
  end
  if labels and opts and opts.chunked_loss then -- (LlamaForCausalLM:forward's; the head unpadded: no logits are kept)
    local out = {}
    out.loss, out.entropy, out.argmax = llama.chunked_causal_lm_loss(self.__name, h,
      llama.head_weight(self.__name, self.lm_head, self.transformer.wte.weight), labels, opts)
    return (Module.end_scope(scope, llama.lazy_logits(out, function() return (head()) end, h), h, out.entropy,
      out.argmax))
  end
  local logits, full = head()
  -- (over the padded head's rows: its extra columns, at -1e30, add nothing and are never the argmax)
  local entropy, argmax = llama.token_stats(full, opts)
  if not labels then
    return (Module.end_scope(scope, { logits = logits, entropy = entropy, argmax = argmax }, entropy, argmax))
  end
  local recorded = zr.is_grad_enabled() and full.requires_grad
  local eps = opts and opts.label_smoothing
  -- label smoothing spreads eps over the V real classes: the padded head's extra columns would count,
  -- so the loss then takes the V-column view (copied; its gradient scattered back: no in-place pass)
  local lt = opts and opts.loss_type
  local out = { loss = (eps and eps ~= 0 and full ~= logits) and llama.causal_lm_loss(logits, labels, false, eps, lt)
    or llama.causal_lm_loss(full, labels, recorded, eps, lt), entropy = entropy, argmax = argmax }
  -- h stays for the lazy logits; the logits the loss wrote its gradient over go with the scope
  if recorded then
    return (Module.end_scope(scope, llama.lazy_logits(out, function() return (head()) end, h), h, entropy, argmax))
  end
  out.logits = logits
  return (Module.end_scope(scope, out, entropy, argmax))
end
-- model:generate(input_ids [, opts]): transformers' generate (zrun.generation.generate says its options).
function LM:generate(input_ids, opts) return require("zrun.generation").generate(self, input_ids, opts) end

-- One generation step: the logits (B, 1, V) of the last of the new tokens ids (B, Tq) after the tokens
-- in cache (zrun.generation's Cache: keys and values appended per block, the new tokens' learned
-- positions and attention masks), as llama.lua's generation_step; the projections called as modules.
function LM:generation_step(ids, cache)
  local t, cfg = self.transformer, self.config
  if cache.max_position >= cfg.n_positions then
    error(("gpt2: generating position %d exceeds n_positions %d (GPT-2's learned positions end there): ask for " ..
      "fewer new tokens"):format(cache.max_position, cfg.n_positions), 0)
  end
  local B, T, C, H = ids:size(1), ids:size(2), cfg.n_embd, cfg.n_head
  local x = t.wte(ids) + t.wpe(cache.positions)
  local function heads(u) return u:view(B, T, H, C / H):transpose(2, 3) end
  for i, block in ipairs(t.h) do
    local a = block.attn
    local q, k, v = unpack(zr.split(a.c_attn(block.ln_1(x)), C, 3))
    local y = cache:attend(i, heads(q), heads(k), heads(v), a.scale)
    x = x + a.c_proj(y:transpose(2, 3):reshape(B, T, C))
    x = x + block.mlp(block.ln_2(x))
  end
  x = t.ln_f(x:narrow(2, T, 1))
  return zr.linear(x, self.lm_head and self.lm_head.weight or t.wte.weight)
end
-- A Hugging Face model folder (config.json + model.safetensors) that transformers loads.
function LM:save_pretrained(dir, opts) return require("zrun.models.llama").save_pretrained(self, dir, opts) end

-- Builds the model from a Hugging Face model directory (or cached hub id) and loads its weights.
-- Names are taken as transformers saves them ("transformer.h.0...") or as the original OpenAI
-- checkpoints store them ("h.0...", with the attention-mask buffers "attn.bias"/"attn.masked_bias",
-- which are not parameters); with tie_word_embeddings a lm_head.weight in the files must equal wte
-- (one that differs is refused: transformers 5 would untie them), without it the files' lm_head.weight
-- is the head. A dropout key config.json lacks is GPT2Config's default, 0.1. opts as llama.from_pretrained.
function M.from_pretrained(ref, opts)
  local hf = require "zrun.hf"
  local cfg, dir = hf.pretrained_config(ref, opts) -- (checks opts: dtype, device, config, revision, cache_dir, threads)
  -- a config.json without the dropout keys (hand-written, or trimmed) gets GPT2Config's defaults, as
  -- transformers reads it; zrun's own default (none) is for config tables
  for _, k in ipairs { "resid_pdrop", "embd_pdrop", "attn_pdrop" } do if cfg[k] == nil then cfg[k] = 0.1 end end
  local model = init.no_init(LM, cfg) -- every weight comes from the files
  local tied, head = model.config.tie_word_embeddings, false
  local ok, err = pcall(hf.load_weights, model, dir, { threads = opts and opts.threads, rename = function(name)
    if name == "lm_head.weight" then head = true; return not tied and name or nil end
    if name:match("%.attn%.bias$") or name:match("%.attn%.masked_bias$") then return nil end
    return name:match("^transformer%.") and name or "transformer." .. name
  end })
  if not ok and not tied and not head and tostring(err):find('"lm_head.weight"', 1, true) then -- (missing: transformers
    -- would start the head from random weights, with a warning)
    error(("gpt2: %s has no lm_head.weight and config.json's tie_word_embeddings is false, so the output head would " ..
      "be random; if the head is wte, load with { config = { tie_word_embeddings = true } }"):format(dir), 0)
  elseif not ok then
    hf.raise_load_error("gpt2", dir, err)
  end
  if head and tied then
    require("zrun.models.llama").check_tied_head(dir, model.transformer.wte.weight, "gpt2", "transformer.wte.weight",
      "load with { config = { tie_word_embeddings = false } } to keep both")
  end
  hf.keep_source(model, ref, dir)
  return model
end
-- Activation checkpointing per block in training mode (zr.checkpoint). Returns the model.
-- The token embedding module (transformers' get_input_embeddings): wte.
function LM:get_input_embeddings() return self.transformer.wte end
function LM:gradient_checkpointing_enable() rawset(self.transformer, "gradient_checkpointing", true); return self end
-- transformers' enable_input_require_grads / disable_input_require_grads (called before LoRA with gradient
-- checkpointing, so that the checkpointed layers' input needs a gradient): nothing to do in zrun, whose
-- checkpoint re-runs a layer whose parameters need gradients even when its input does not. Return the model.
function LM:enable_input_require_grads() return self end
function LM:disable_input_require_grads() return self end

return M
