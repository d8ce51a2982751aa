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
local zr = require "zrun"
local T = zr.testing
local P = require "zrun.memory_plan"
local Module = require "zrun.nn.module"
local mem, dist = zr.memory, zr.dist
local W, rank = dist.world_size(), dist.rank()
local gpu = os.getenv("ZRUN_CHECK_DEVICE") == "cuda"
local dev = gpu and ("cuda:" .. zr._C.cuda.current_device()) or "cpu"

-- Trains `steps` optimizer steps; returns the training peak of the sum above the baseline, and the plan.
local function measure(c)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.num_hidden_layers = c.layers
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
  local model = zr.models.llama.LlamaForCausalLM(cfg)
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
    local out = engine(ids, ids)
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
    dtype = gpu and "bf16" or "f32", gradient_checkpointing = c.ckpt, offload_grads = c.offload and engine.offload_grads or nil }
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
  -- optimizer offload with the gradients in the host partition, or in the device one (then the
  -- step copies them through the ring: memcpy on CPU ranks)
  { stage = 2, B = 4, T = 97, layers = 2, offload = true, grads = "host" },
  { stage = 3, B = 4, T = 97, layers = 2, offload = true, grads = "host" },
  { stage = 2, B = 4, T = 97, layers = 2, offload = true, grads = "device" },
  { stage = 3, B = 4, T = 97, layers = 2, offload = true, grads = "device" },
}
for _, c in ipairs(cases) do
  local name = ("plan time-line peak within 1%% of measured: %s np=%d stage %d B=%d T=%d %d layers%s%s%s%s"):format(dev, W,
    c.stage, c.B, c.T, c.layers, c.gas and (" gas " .. c.gas) or "", c.ckpt and " checkpointing" or "",
    c.overlap and " overlap_comm" or "", c.offload and (" offload, gradients in the " .. c.grads .. " partition") or "")
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
    if not gpu and W > 1 and (c.stage == 1 or c.stage == 2) and not c.overlap and not c.offload then
      local sum = plan.device.sum + plan.host.sum
      if sum / m < 1.05 then error("the sum of the categories' peaks should be >5% over here: " .. msg, 0) end
    end
  end
  if rank == 0 then T.test(name, check) else check() end
end
T.done()
