-- zr.memory.plan with zero_optimization.zenflow: the selected columns' moments the engine really
-- allocates (summed from a live ZenFlow engine's tensors, with the selected gradients' buffer), the
-- whole gradient stage 2 keeps over several ranks, overlap_step's gradient snapshot, second
-- moment set and pending weights, offload's moments on the host, and the gradients kept on the GPU
-- as the engine keeps them.
local zr = require "zrun"
local T = zr.testing
local P = require "zrun.memory_plan"

local cfg = zr.models.llama.config("zrun/tiny-llama")
local ZF = { topk_ratio = 0.3, update_interval = 2 }
local function ds(zf)
  return { train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = 1,
    optimizer = { type = "AdamW", params = { lr = 1e-3 } },
    zero_optimization = { stage = 2, offload_optimizer = { device = "cpu" }, zenflow = zf } }
end
local function plan(zf, device, W)
  return P.plan { model = cfg, config = ds(zf), micro_batch = 2, seq_len = 16, world_size = W or 1, dtype = "f32",
    device = device or "cpu" }
end

T.test("plan: ZenFlow's selected columns' moments are what the engine allocates", function()
  zr.manual_seed(1)
  local e = zr.initialize { model = zr.models.llama.LlamaForCausalLM(cfg), config = ds(ZF) }
  local bytes = 0
  for _, q in ipairs(e.zenflow.p) do bytes = bytes + 4 * (q.m:numel() + q.v:numel()) end
  assert(bytes > 0)
  bytes = bytes + 4 * e.zenflow.red:numel()
  local with, without = plan(ZF), plan(nil)
  T.eq(with.device.optimizer - without.device.optimizer, bytes, "device optimizer: + the moments and gradients")
  T.eq(with.host.optimizer, without.host.optimizer, "host optimizer unchanged without overlap_step")
end)

T.test("plan: ZenFlow update_interval auto keeps the last micro-step's gradients (one rank), as the engine does", function()
  local A = { topk_ratio = 0.3, update_interval = "auto" }
  zr.manual_seed(1)
  local model = zr.models.llama.LlamaForCausalLM(cfg)
  local e = zr.initialize { model = model, config = ds(A) }
  local ids = (zr.rand({ 2, 16 }) * (cfg.vocab_size - 1)):to("i64")
  for _ = 1, 3 do
    e:backward(e(ids, ids).loss)
    e:step()
  end
  local kept, measured = 0, 0
  for _, q in ipairs(e.zenflow.p) do
    if q.last then
      kept = kept + 4 * q.last:numel()
      T.eq(q.last:category(), "grads", "kept in the grads category")
    end
    if q.two and q.rows > 1 then measured = measured + 4 * q.rows * q.cols end
  end
  T.eq(kept, measured, "one f32 copy of every measured weight's gradient")
  local auto, fixed = plan(A), plan(ZF)
  T.eq(auto.device.grads - fixed.device.grads, kept, "device grads: + the kept copy")
  T.eq(plan(A, nil, 2).device.grads - plan(ZF, nil, 2).device.grads, 2 * kept, "several ranks: up to two copies")
end)

T.test("plan: ZenFlow offload puts the selected columns' moments on the host, one weight's on the GPU at a time", function()
  local o = { topk_ratio = 0.3, update_interval = 2, offload = true }
  local c = ds(o)
  c.zero_optimization.overlap_comm = true -- (DeepSpeed asserts it with offload)
  zr.manual_seed(1)
  local e = zr.initialize { model = zr.models.llama.LlamaForCausalLM(cfg), config = c }
  local moments, most = 0, 0
  for _, q in ipairs(e.zenflow.p) do
    moments, most = moments + 4 * (q.m:numel() + q.v:numel()), math.max(most, q.m:numel())
  end
  local with = P.plan { model = cfg, config = c, micro_batch = 2, seq_len = 16, world_size = 1, dtype = "f32", device = "cpu" }
  local without = plan(nil)
  T.eq(with.device.optimizer - without.device.optimizer, 4 * e.zenflow.red:numel() + 2 * 4 * most,
    "device optimizer: + the gradients' buffer and the largest weight's moments")
  T.eq(with.host.optimizer - without.host.optimizer, moments, "host optimizer: + the moments")
end)

T.test("plan: ZenFlow overlap_step adds the gradient snapshot (GPU) and a moment set + the new weights (host)", function()
  local o = {}
  for k, v in pairs(ZF) do o[k] = v end
  o.overlap_step = true
  local with, without = plan(o), plan(ZF)
  local S = with.partition_numel
  T.eq(with.device.grads - without.device.grads, S * 4, "device grads: + one f32 partition")
  T.eq(with.host.optimizer - without.host.optimizer, 2 * S * 4, "host optimizer: + exp_avg and exp_avg_sq")
  T.eq(with.host.params - without.host.params, S * 4, "host params: + the new weights (f32 here)")
end)

T.test("plan: ZenFlow at stage 2 over several ranks keeps each micro-step's whole gradient", function()
  local n = 0
  zr.manual_seed(1)
  for _, p in ipairs(zr.models.llama.LlamaForCausalLM(cfg):parameters()) do n = n + p:numel() end
  T.eq(plan(ZF, "cpu", 2).device.grads - plan(nil, "cpu", 2).device.grads, n * 4, "device grads: + one f32 gradient")
  T.eq(plan(ZF, "cpu", 1).device.grads, plan(nil, "cpu", 1).device.grads, "one rank: .grad is the partition")
end)

T.test("plan: ZenFlow on a GPU keeps the gradients there, as the engine does", function()
  local p = plan(ZF, "cuda")
  T.eq(p.settings.offload_grads, "device")
  local said = false
  for _, n in ipairs(p.notes) do said = said or n:find("ZenFlow reads each micro%-batch's there") ~= nil end
  assert(said, "the note says why the gradients are on the GPU")
end)
T.done()
