-- The plan's peak total (the most live at once over a step) against the allocator's peak of the
-- sum of every category (zr.memory.stats().total_peak), on each rank, for a tiny Llama trained
-- on CPU ranks at every stage, with accumulation, activation checkpointing, and a step-bound case.
-- Tolerance 1% (the plan is byte-exact on CPU ranks, a few bytes off with accumulation). Each case
-- prints the gap by category at the peak (zr.memory.stats' at_peak against the plan's
-- training_at_peak), so a failing case names what the plan misses. The old rule, each category's own peak added up, is >5% over at stages 1-2 on
-- several ranks (the communication buffers of the step are not live when the activations peak):
-- checked too, so this test fails on a plan that adds the peaks.
-- ZRUN_CHECK_DEVICE=cuda: each rank trains on its GPU (bf16 weights, as on the GPU the plan is
-- for); the GPU's training peak is compared with the plan's GPU column and, with offload, the
-- host's with its host column (tests/cuda/test_plan_timeline_gpu.sh).
--   mpirun -np N zrun tests/mpi/plan_timeline_check.lua
-- ZRUN_PLAN_ONLY=MODEL_TYPE runs that family's cases alone (llama: the cases without a model_type).
local zr = require "zrun"
local T = zr.testing
local M = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "plan_measure.lua")
local measure, gaps, gpu, dev = M.measure, M.gaps, M.gpu, M.dev
local W, rank = zr.dist.world_size(), zr.dist.rank()

local cases = {
  { stage = 0, B = 4, T = 97, layers = 2 },
  { stage = 1, B = 4, T = 97, layers = 2 },
  { stage = 2, B = 4, T = 97, layers = 2 },
  { stage = 3, B = 4, T = 97, layers = 2 },
  { stage = 2, B = 3, T = 61, layers = 3, gas = 2 },
  { stage = 2, B = 3, T = 61, layers = 2, overlap = true },
  { stage = 1, B = 2, T = 131, layers = 2, ckpt = true },
  { stage = 3, B = 2, T = 131, layers = 2, gas = 2, ckpt = true },
  { stage = 2, B = 1, T = 8, layers = 2 }, -- tiny activations: over several ranks the step's all-gather is the peak
  -- head_dim 64: on a GPU the flash kernel (16 above: the f32 composition with its T x T scores)
  { stage = 0, B = 4, T = 97, layers = 2, head_dim = 64 },
  { stage = 3, B = 2, T = 131, layers = 2, gas = 2, ckpt = true, head_dim = 64 },
  -- head_dim 128 (Llama-3-8B's, Mistral's, Qwen's): on a GPU the Hopper kernels read q, k, v in place as at 64
  { stage = 2, B = 4, T = 97, layers = 2, head_dim = 128 },
  { stage = 3, B = 2, T = 131, layers = 2, gas = 2, ckpt = true, head_dim = 128 },
  { model_type = "qwen3", stage = 2, B = 4, T = 97, layers = 2, head_dim = 128 },
  -- optimizer offload with the gradients in the host partition, or in the device one (then the
  -- step copies them through the ring: memcpy on CPU ranks)
  { stage = 2, B = 4, T = 97, layers = 2, offload = true, grads = "host" },
  { stage = 3, B = 4, T = 97, layers = 2, offload = true, grads = "host" },
  { stage = 2, B = 4, T = 97, layers = 2, offload = true, grads = "device" },
  { stage = 3, B = 4, T = 97, layers = 2, offload = true, grads = "device" },
  -- SFT's settings (head_dim 64: the GPU's flash kernels): LoRA adapters (zr.peft), TRL's dft loss, padding-free rows
  -- of packed sequences
  { stage = 0, B = 4, T = 96, layers = 2, head_dim = 64, lora = { r = 8, target_modules = { "q_proj", "v_proj" } } },
  { stage = 2, B = 2, T = 128, layers = 2, head_dim = 64, ckpt = true,
    lora = { r = 4, target_modules = "all-linear", lora_dropout = 0.1 } },
  { stage = 2, B = 4, T = 96, layers = 2, head_dim = 64, dft = true },
  { stage = 0, B = 2, T = 128, layers = 2, head_dim = 64, packed = 32 },
  -- the chunked LM head + loss (use_liger_kernel, TRL's chunked_nll): no logits, one slice at a time
  { stage = 2, B = 4, T = 96, layers = 2, head_dim = 64, chunked = 64 },
  { stage = 2, B = 4, T = 96, layers = 2, head_dim = 64, chunked = true }, -- (the logits kept for backward)
  { stage = 3, B = 2, T = 128, layers = 2, head_dim = 64, ckpt = true, gas = 2, chunked = true },
  { stage = 0, B = 4, T = 96, layers = 2, head_dim = 64, chunked = 100, lora = { r = 8, target_modules = { "q_proj", "v_proj" } } },
  -- LoRA's zr.lora_multi without checkpointing: with dropout the peak is in forward, in down_proj's (rows, in) buffer
  -- for the dropped copies (workspace); at stage 1 over several ranks the adapters' gradients go into their .grad
  -- (no new tensor); at stage 3 a group's adapters (q/k/v, gate/up) gathered around one op
  { stage = 1, B = 4, T = 96, layers = 2, head_dim = 64, lora = { r = 8, target_modules = "all-linear", lora_dropout = 0.1 } },
  { stage = 3, B = 2, T = 128, layers = 2, head_dim = 64, ckpt = true, gas = 2,
    lora = { r = 4, target_modules = { "k_proj", "o_proj", "up_proj" } } },
  -- packed sequences with checkpointing, at stage 3, and under LoRA (q/k/v one zr.lora_multi, then the plain model's
  -- attention); on the CPU the segments (one attention over the rows joined, per-token rope tables), on a GPU they or
  -- the groups
  { stage = 3, B = 2, T = 128, layers = 2, head_dim = 64, packed = 32, ckpt = true, gas = 2 },
  { stage = 2, B = 2, T = 96, layers = 2, head_dim = 64, packed = 24,
    lora = { r = 4, target_modules = { "q_proj", "v_proj" } } },
  { stage = 1, B = 4, T = 64, layers = 2, packed = 16 },
  -- Qwen2 (q/k/v biases in the fused q/k/v product, gathered with their weights at stage 3) and Mistral
  { model_type = "qwen2", stage = 0, B = 4, T = 97, layers = 2 },
  { model_type = "qwen2", stage = 2, B = 3, T = 61, layers = 3, gas = 2 },
  { model_type = "qwen2", stage = 3, B = 2, T = 131, layers = 2, gas = 2, ckpt = true },
  { model_type = "qwen2", stage = 1, B = 4, T = 96, layers = 2, head_dim = 64,
    lora = { r = 8, target_modules = "all-linear", lora_dropout = 0.1 } },
  { model_type = "qwen2", stage = 3, B = 2, T = 128, layers = 2, head_dim = 64, ckpt = true, gas = 2,
    lora = { r = 4, target_modules = { "q_proj", "v_proj" } } },
  -- Qwen3 (q_norm / k_norm between the split q/k/v product and the rope: llama.lua's unfused attention path)
  { model_type = "qwen3", stage = 0, B = 4, T = 97, layers = 2 },
  { model_type = "qwen3", stage = 2, B = 3, T = 61, layers = 3, gas = 2 },
  { model_type = "qwen3", stage = 3, B = 2, T = 131, layers = 2, gas = 2, ckpt = true },
  { model_type = "qwen3", stage = 3, B = 4, T = 97, layers = 2 },
  { model_type = "qwen3", stage = 1, B = 4, T = 96, layers = 2, head_dim = 64,
    lora = { r = 8, target_modules = "all-linear", lora_dropout = 0.1 } },
  { model_type = "qwen3", stage = 2, B = 2, T = 96, layers = 2, head_dim = 64, packed = 24 },
  { model_type = "qwen3", stage = 3, B = 2, T = 128, layers = 2, head_dim = 64, ckpt = true, gas = 2, packed = 32,
    lora = { r = 4, target_modules = { "q_proj", "v_proj" } } },
  { model_type = "qwen3", stage = 0, B = 4, T = 97, layers = 2, dft = true },
  { model_type = "mistral", stage = 2, B = 4, T = 97, layers = 2 },
  { model_type = "mistral", stage = 3, B = 4, T = 97, layers = 2 },
  { model_type = "mistral", stage = 2, B = 2, T = 128, layers = 2, head_dim = 64, ckpt = true,
    lora = { r = 4, target_modules = "all-linear", lora_dropout = 0.1 } },
  -- a sliding window shorter than the sequences (the windowed segments, plain rows too; Qwen2: layer 0 attends fully;
  -- head_dim 64: where a GPU's flash kernels take the window)
  { model_type = "mistral", stage = 2, B = 4, T = 97, layers = 2, head_dim = 64, window = 40 },
  { model_type = "mistral", stage = 3, B = 2, T = 128, layers = 2, head_dim = 64, ckpt = true, gas = 2, window = 50 },
  { model_type = "mistral", stage = 0, B = 2, T = 128, layers = 2, head_dim = 64, packed = 64, window = 20 },
  { model_type = "qwen2", stage = 2, B = 3, T = 96, layers = 2, head_dim = 64, window = 30 },
  { model_type = "qwen2", stage = 1, B = 2, T = 131, layers = 3, head_dim = 64, ckpt = true, window = 33 },
  { model_type = "qwen3", stage = 2, B = 2, T = 100, layers = 2, head_dim = 64, window = 30 },
  { model_type = "qwen3", stage = 3, B = 2, T = 128, layers = 2, head_dim = 128, ckpt = true, packed = 64, window = 40 },
  -- Phi-3: fused qkv_proj / gate_up_proj (one product each), head_dim 96 as Phi-3-mini's; LoRA over the fused modules
  { model_type = "phi3", stage = 2, B = 2, T = 100, layers = 2, head_dim = 96 },
  { model_type = "phi3", stage = 3, B = 2, T = 128, layers = 2, head_dim = 64, ckpt = true, gas = 2, window = 50 },
  { model_type = "phi3", stage = 1, B = 2, T = 96, layers = 2, head_dim = 64, packed = 32,
    lora = { r = 4, target_modules = { "qkv_proj", "o_proj", "gate_up_proj", "down_proj" } } },
  -- Phi-4-mini's partial rotary (0.75): q, k, v split off the product, zr.rope with narrower tables
  { model_type = "phi3", stage = 2, B = 2, T = 100, layers = 2, head_dim = 64, partial = 0.75 },
  { model_type = "phi3", stage = 3, B = 2, T = 128, layers = 2, head_dim = 64, partial = 0.75, ckpt = true, packed = 32 },
  { model_type = "phi3", stage = 0, B = 2, T = 96, layers = 2, head_dim = 96, partial = 0.5, window = 40 },
  -- Gemma 3 (every other layer full): q/k norms, norms after the attention and the MLP, the scaled embeddings behind
  -- padding_idx's where, GeGLU, each layer type's rope tables (per token on the segments: two pairs)
  { model_type = "gemma3_text", stage = 0, B = 4, T = 97, layers = 2 },
  { model_type = "gemma3_text", stage = 3, B = 2, T = 131, layers = 2, gas = 2, ckpt = true },
  { model_type = "gemma3_text", stage = 2, B = 4, T = 97, layers = 2, head_dim = 64, window = 40 },
  { model_type = "gemma3_text", stage = 3, B = 2, T = 128, layers = 3, head_dim = 64, ckpt = true, gas = 2, window = 50 },
  { model_type = "gemma3_text", stage = 0, B = 2, T = 128, layers = 2, head_dim = 64, packed = 32 },
  { model_type = "gemma3_text", stage = 1, B = 4, T = 96, layers = 2, head_dim = 64,
    lora = { r = 8, target_modules = "all-linear", lora_dropout = 0.1 } },
  -- (head_dim 256, Gemma 3's: on a GPU the mma.sync flash kernels over contiguous copies, the rows joined)
  { model_type = "gemma3_text", stage = 2, B = 2, T = 100, layers = 2, head_dim = 256, window = 40 },
  { model_type = "gemma3_text", stage = 2, B = 2, T = 96, layers = 2, head_dim = 64, chunked = 64 },
  -- head_dim 96 (Phi-3's): on a GPU the 128-wide flash kernels over zero-padded copies
  { stage = 2, B = 2, T = 100, layers = 2, head_dim = 96 },
  { stage = 3, B = 2, T = 100, layers = 2, head_dim = 96, ckpt = true },
  { model_type = "mistral", stage = 0, B = 2, T = 128, layers = 2, head_dim = 96, packed = 64, window = 20 },
}
local only = os.getenv("ZRUN_PLAN_ONLY")
for _, c in ipairs(cases) do
  if only and (c.model_type or "llama") ~= only then goto next end
  local name = ("plan time-line peak within 1%% of measured: %s np=%d stage %d B=%d T=%d %d layers%s%s%s%s%s"):format(dev, W,
    c.stage, c.B, c.T, c.layers, c.head_dim and (" head_dim " .. c.head_dim) or "", c.gas and (" gas " .. c.gas) or "",
    c.ckpt and " checkpointing" or "", c.overlap and " overlap_comm" or "", c.offload and (" offload, gradients in the " .. c.grads .. " partition") or "") ..
    (c.lora and (" LoRA r " .. c.lora.r) or "") .. (c.dft and " dft" or "") .. (c.chunked and (" chunked loss " .. tostring(c.chunked)) or "") .. (c.packed and (" packed " .. c.packed) or "") ..
    (c.window and (" window " .. c.window) or "") .. (c.partial and (" partial rotary " .. c.partial) or "")
  if c.model_type then name = c.model_type .. ": " .. name end
  local function check()
    local m, plan, hm, at = measure(c)
    -- on the CPU the plan's device and host columns are the same memory; the setup is not in `m`
    local p = plan.training_total + (gpu and 0 or plan.host.total)
    local msg = ("rank %d %s: measured %d, planned %d (%.4f; the categories' peaks add up to %d), peak in %s"):format(rank,
      dev, m, p, p / m, plan.device.sum + (gpu and 0 or plan.host.sum), plan.peak_in.device)
    msg = msg .. "; gap by category at the peak (measured - planned): " .. gaps(at, plan)
    if rank == 0 then print(msg) end
    if math.abs(p / m - 1) > 0.01 then error(msg, 0) end
    if gpu and plan.host.total > 0 then -- the host's peak (the batch built there is in it: a few KiB)
      local hmsg = ("rank %d host: measured %d, planned %d (%.4f)"):format(rank, hm, plan.host.total, plan.host.total / hm)
      if rank == 0 then print(hmsg) end
      if math.abs(plan.host.total / hm - 1) > 0.01 then error(hmsg, 0) end
    end
    -- (not with LoRA: its buckets hold the adapters only, too small to move the peak)
    if not gpu and W > 1 and (c.stage == 1 or c.stage == 2) and not c.overlap and not c.offload and not c.lora then
      local sum = plan.device.sum + plan.host.sum
      if sum / m < 1.05 then error("the sum of the categories' peaks should be >5% over here: " .. msg, 0) end
    end
  end
  if rank == 0 then T.test(name, check) else check() end
  ::next::
end
T.done()
