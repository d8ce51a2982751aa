-- ZeRO optimizer offload, host side: the per-step pieces of the engine (runtime/zero/engine.c +
-- zero/offload.c) on a flat partition of N parameters held as bf16 CPU tensors, timed one by one.
--   zrun tests/bench/bench_offload.lua [N] [STAGE] [STEPS] [GRADS]   (or n=2e8 stage=2 steps=4 grads=host)
-- GRADS device: the gradient partition is a separate tensor the step pipeline copies through its
-- ring chunk by chunk (memcpy here, D2H on a GPU), as with gradients kept on the GPU.
-- Ends with the host AdamW's bandwidth (30 B per parameter: p, m, v, g read; p, m, v and the
-- 16-bit weight written) next to the CPU's from a stream test (a += b, 12 B per element).
-- STAGE 2 on one CPU process is the engine's direct mode (gradients are views into the fp32
-- partition); STAGE 3 goes through the bucket path the GPU run uses (pack -> flush -> add into
-- the host partition), so it also times backward with the gradient intake. Median of the steps
-- after the first. Set ZRUN_OFFLOAD_PROFILE=1 for the engine's own per-step breakdown.
local zr = require "zrun"
local C = zr._C
local cli = require("zrun.argparse").new("tests/bench/bench_offload.lua", "ZeRO optimizer offload, host side, timed piece by piece.")
cli:option("n", 2e8, "parameters in the partition"):option("stage", 2, "ZeRO stage (2 or 3)")
cli:option("steps", 4, "steps (the first is not measured)")
cli:option("grads", "host", "where the gradient partition is: host or device (see above)")
cli:positional("n", "stage", "steps", "grads")
local opt = cli:parse(arg)
local N, STAGE, STEPS = opt.n, opt.stage, opt.steps
if opt.grads ~= "host" and opt.grads ~= "device" then error("grads must be host or device, got " .. opt.grads, 0) end

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
io.write(("bench_offload: %d parameters in %d tensors (bf16 on the CPU), stage %d, %s gradients\n"):format(total,
  #params, STAGE, opt.grads))

local t0 = C.now()
-- DeepSpeed's defaults, from the one place that holds them
local zc = require("zrun.config").load({ train_batch_size = 1, zero_optimization = { stage = STAGE } },
  { world_size = 1 }).zero_optimization
local z = C.zero_new({ stage = STAGE, offload_optimizer = true, pin_memory = true, reduce_bucket_size = zc.reduce_bucket_size,
  allgather_bucket_size = zc.allgather_bucket_size, persistence_threshold = zc.stage3_param_persistence_threshold,
  max_live_parameters = zc.stage3_max_live_parameters, offload_grads_on_device = opt.grads == "device" }, params, wds)
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

-- the step's bandwidth next to the CPU's (a += b over the same count of f32: read 8, write 4 bytes)
local a, b = zr.zeros({ total }), zr.ones({ total })
local st = {}
for k = 1, 3 do
  local t = C.now()
  a:add_(b)
  st[k] = C.now() - t
end
local stream = 12 * total / med(st) / 1e9
local adam = 30 * total / (med(times.step) / 1e3) / 1e9
io.write(("host AdamW %8.1f GB/s (30 B/param)   CPU stream (a += b) %8.1f GB/s   AdamW/stream %5.1f%%\n"):format(adam,
  stream, 100 * adam / stream))
