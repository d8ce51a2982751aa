-- One case of the memory plan's time-line check (tests/mpi/plan_timeline_check.lua and the GPU
-- diagnostic tests/cuda/plan_gap_gpu.lua): train a tiny Llama a few steps on this rank's device
-- and return the measured peaks with the plan for the same settings.
local zr = require "zrun"
local P = require "zrun.memory_plan"
local Module = require "zrun.nn.module"
local mem, dist = zr.memory, zr.dist
local W, rank = dist.world_size(), dist.rank()
local gpu = os.getenv("ZRUN_CHECK_DEVICE") == "cuda"
local dev = gpu and ("cuda:" .. zr._C.cuda.current_device()) or "cpu"

local CLASS = { llama = "LlamaForCausalLM", mistral = "MistralForCausalLM", qwen2 = "Qwen2ForCausalLM",
  qwen3 = "Qwen3ForCausalLM" }
local phi3 = zr.models.phi3 -- (Phi-3: fused qkv_proj / gate_up_proj; its class registers with zr.models.llama)
local gemma3 = zr.models.gemma3

-- Gemma 3 at the tiny Llama's sizes: every other layer full (sliding_window_pattern 2), head_dim 16 unless given
local function gemma3_config(t, c)
  return { model_type = "gemma3_text", hidden_size = t.hidden_size, intermediate_size = t.intermediate_size,
    num_attention_heads = t.num_attention_heads, num_key_value_heads = t.num_key_value_heads, num_hidden_layers = c.layers,
    head_dim = c.head_dim or 16, query_pre_attn_scalar = 24, vocab_size = t.vocab_size, sliding_window = c.window or 512,
    sliding_window_pattern = 2, max_position_embeddings = 1024, hidden_activation = "gelu_pytorch_tanh",
    rms_norm_eps = 1e-6, pad_token_id = 0, bos_token_id = 2, eos_token_id = 1, tie_word_embeddings = true }
end

-- c = {model_type = "mistral", "qwen2", "qwen3", "phi3" or "gemma3_text" (else Llama), stage=, B=, T=, layers=, gas=, ckpt=, overlap=, offload=, grads=, head_dim=, lora = {r =, target_modules =,
-- lora_dropout =} (zr.peft's adapters), dft = true (TRL's loss_type), chunked = true or N (the forward's chunked_loss:
-- the LM head + loss a slice of N columns at a time), packed = LEN (padding-free rows of sequences of
-- LEN tokens), window = W (a sliding window of W keys), partial = F (Phi-3's partial_rotary_factor)}: trains 3 x gas
-- micro-batches; returns the training peak of the sum above the baseline, the plan, the host's
-- peak and each category at the peak (above the baseline).
local function measure(c)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  if c.model_type == "gemma3_text" then cfg = gemma3_config(cfg, c) end
  cfg.model_type = c.model_type or cfg.model_type -- Mistral, Qwen2: the same shapes (Qwen2 with q/k/v biases)
  cfg.num_hidden_layers = c.layers
  if cfg.model_type == "phi3" then -- (ids in the vocabulary; Phi3Config takes no llama3 rope)
    cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id, cfg.rope_scaling = false, 1, 2, nil
    cfg.partial_rotary_factor = c.partial -- (nil: the whole head)
  end
  if c.window and cfg.model_type ~= "gemma3_text" then -- a sliding window shorter than the sequences: Mistral's in every layer, Qwen2's from layer 1 on
    if cfg.model_type == "qwen2" or cfg.model_type == "qwen3" then cfg.use_sliding_window, cfg.max_window_layers = true, 1 end
    cfg.sliding_window = c.window
  end
  cfg.head_dim = c.head_dim or cfg.head_dim -- 16: CUDA runs the f32 attention composition; 64: the flash kernel
  if gpu then cfg.device, cfg.dtype = "cuda", "bf16" end
  if jit and jit.flush then jit.flush() end -- compiled traces can keep the last case's engine alive
  local last
  repeat
    last = mem.stats().total_current
    collectgarbage()
  until mem.stats().total_current == last
  if gpu then zr._C.cuda.synchronize() end
  local b0 = mem.stats(dev)
  local base, hbase = b0.total_current, mem.stats("cpu").total_current
  zr.manual_seed(7)
  local model = cfg.model_type == "phi3" and phi3.Phi3ForCausalLM(cfg)
    or cfg.model_type == "gemma3_text" and gemma3.Gemma3ForCausalLM(cfg) or zr.models.llama[CLASS[cfg.model_type]](cfg)
  if c.lora then
    model = zr.peft.get_peft_model(model, zr.peft.LoraConfig { r = c.lora.r, lora_alpha = 2 * c.lora.r,
      target_modules = c.lora.target_modules, lora_dropout = c.lora.lora_dropout })
  end
  if c.ckpt then model:gradient_checkpointing_enable() end
  local ds = { train_micro_batch_size_per_gpu = c.B, gradient_accumulation_steps = c.gas or 1, steps_per_print = 1e6,
    optimizer = { type = "AdamW", params = { lr = 1e-3 } }, bf16 = { enabled = gpu },
    zero_optimization = { stage = c.stage, overlap_comm = c.overlap, stage3_param_persistence_threshold = 0,
      offload_optimizer = c.offload and { device = "cpu" } or nil } }
  zr.setenv("ZRUN_OFFLOAD_GRADS", c.grads) -- where offloaded gradients live: "device" or "host"
  local engine = zr.initialize({ model = model, config = ds })
  zr.setenv("ZRUN_OFFLOAD_GRADS", nil)
  mem.reset_peak(dev)
  if gpu then mem.reset_peak("cpu") end
  for s = 1, 3 * (c.gas or 1) do
    local rows = {}
    for i = 1, c.B do
      local r = {}
      for j = 1, c.T do r[j] = (i * 37 + j * 11 + s * 5 + rank) % 251 end
      rows[i] = r
    end
    local ids = zr.tensor(rows, { dtype = "i64" })
    if gpu then ids = ids:to("cuda") end
    local opts = c.dft and { loss_type = "dft" } or c.chunked and { chunked_loss = c.chunked } or nil
    if c.packed then -- each row c.T / c.packed sequences, told apart by their positions (read on the host)
      opts = { position_ids = zr.testing.packed_positions(c.B, c.T, c.packed) }
    end
    local out = engine(ids, ids, opts)
    engine:backward(out.loss)
    engine:step()
  end
  local st = mem.stats(dev)
  local measured = st.total_peak - base
  local host = mem.stats("cpu").total_peak - hbase
  local at = {} -- each category at the peak, above the baseline
  for _, k in ipairs(mem.categories) do at[k] = st[k].at_peak - b0[k].current end
  -- offload: the gradients where the engine keeps them
  local plan = P.plan { model = cfg, config = ds, seq_len = c.T, world_size = W, device = gpu and "cuda" or "cpu",
    dtype = gpu and "bf16" or "f32", gradient_checkpointing = c.ckpt, offload_grads = c.offload and engine.offload_grads or nil,
    lora = c.lora, loss_type = c.dft and "dft" or nil, chunked_loss = c.chunked, packed = c.packed }
  if c.offload and engine.offload_grads ~= c.grads then error("the engine keeps the gradients on the " ..
    tostring(engine.offload_grads) .. ", not where ZRUN_OFFLOAD_GRADS=" .. c.grads .. " asked", 0) end
  for _, h in ipairs(engine.hook_handles or {}) do h.remove() end
  Module.fetch = nil
  engine, model = nil, nil
  return measured, plan, host, at
end

-- "activations +2,825,574, other +37,248": measured minus planned at the peak, the categories that differ
-- (on CPU ranks the plan's host column is the same memory, held from the first step on)
local function gaps(at, plan)
  local out = {}
  for _, k in ipairs(mem.categories) do
    local d = at[k] - (plan.training_at_peak[k] or 0) - (gpu and 0 or plan.host[k] or 0)
    if d ~= 0 then out[#out + 1] = ("%s %+d"):format(k, d) end
  end
  return #out > 0 and table.concat(out, ", ") or "none"
end

return { measure = measure, gaps = gaps, gpu = gpu, dev = dev }
