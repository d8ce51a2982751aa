-- ZeRO optimizer offload, host side: the per-step pieces of the engine (runtime/zero/engine.c +
-- zero/offload.c) on a flat partition of N parameters held as bf16 CPU tensors, timed one by one.
--   zrun tests/bench/bench_offload.lua [N] [STAGE] [STEPS]   (or n=2e8 stage=2 steps=4)
-- STAGE 2 on one CPU process is the engine's direct mode (gradients are views into the fp32
-- partition); STAGE 3 goes through the bucket path the GPU run uses (pack -> flush -> add into
-- the host partition), so it also times backward with the gradient intake. Median of the steps
-- after the first. Set ZRUN_OFFLOAD_PROFILE=1 for the engine's own per-step breakdown.
local zr = require "zrun"
local C = zr._C
local cli = require("zrun.argparse").new("tests/bench/bench_offload.lua", "ZeRO optimizer offload, host side, timed piece by piece.")
cli:option("n", 2e8, "parameters in the partition"):option("stage", 2, "ZeRO stage (2 or 3)")
cli:option("steps", 4, "steps (the first is not measured)"):positional("n", "stage", "steps")
local opt = cli:parse(arg)
local N, STAGE, STEPS = opt.n, opt.stage, opt.steps

-- Llama-like shapes: per layer a (2048, 8192) and a (2048, 2048) matrix and a 2048 norm vector.
local H, params, wds, total = 2048, {}, {}, 0
local function add(shape)
  local p = zr.full(shape, 0.01, { dtype = "bf16" })
  p:requires_grad_(true)
  params[#params + 1], wds[#wds + 1] = p, #shape == 1 and 0 or 0.1
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  total = total + n
end
while total < N do add({ H, 4 * H }); add({ H, H }); add({ H }) end
io.write(("bench_offload: %d parameters in %d tensors (bf16 on the CPU), stage %d\n"):format(total, #params, STAGE))

local t0 = C.now()
-- DeepSpeed's defaults, from the one place that holds them
local zc = require("zrun.config").load({ train_batch_size = 1, zero_optimization = { stage = STAGE } },
  { world_size = 1 }).zero_optimization
local z = C.zero_new({ stage = STAGE, offload_optimizer = true, pin_memory = true, reduce_bucket_size = zc.reduce_bucket_size,
  allgather_bucket_size = zc.allgather_bucket_size, persistence_threshold = zc.stage3_param_persistence_threshold,
  max_live_parameters = zc.stage3_max_live_parameters }, params, wds)
local idx = {}
for i = 1, #params do idx[i] = i end
io.write(("engine set-up %.0f ms\n"):format((C.now() - t0) * 1e3))

local phases = { "backward+grads", "grad_norm", "step", "zero_grad", "total" }
local times = {}
for _, p in ipairs(phases) do times[p] = {} end
for s = 1, STEPS do
  local tb = C.now()
  if STAGE == 3 then
    z:gather(idx)
    z:backward_begin(true)
    local loss
    for _, p in ipairs(params) do loss = loss and loss + p:sum() or p:sum() end
    loss:backward()
    z:backward_end()
  else
    z:state(3):uniform_(-0.01, 0.01) -- direct mode: the gradients are views into this partition
    tb = C.now()
  end
  local t1 = C.now()
  local norm = z:grad_norm(1.0)
  local t2 = C.now()
  z:step(0.5, s, 1e-4, 0.9, 0.95, 1e-8)
  local t3 = C.now()
  z:zero_grad()
  local t4 = C.now()
  if s > 1 or STEPS == 1 then
    local r = { t1 - tb, t2 - t1, t3 - t2, t4 - t3, t4 - tb }
    for k, p in ipairs(phases) do table.insert(times[p], r[k] * 1e3) end
  end
  if norm ~= norm then error("grad norm is nan") end
end
local function med(t) table.sort(t); return t[math.ceil(#t / 2)] end
for _, p in ipairs(phases) do
  if not (STAGE ~= 3 and p == "backward+grads") then io.write(("%-16s %10.1f ms\n"):format(p, med(times[p]))) end
end
