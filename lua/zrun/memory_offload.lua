-- Optimizer offload in the memory plan: one table of bytes per partition element for each place
-- the gradients can live (the GPU or the host), data_types.grad_accum_dtype and
-- offload_optimizer.ratio; the engine's automatic choice between them; and the host-memory and
-- locked-memory checks zr.initialize runs before it allocates (what does not fit, and what fixes it).
local M = {}
local fmt, ceil, floor, min = string.format, math.ceil, math.floor, math.min
local human = require("zrun.format").human

-- The ring the step streams through (runtime/zero/offload.c): `slots` chunks of `chunk` partition
-- elements (ZRUN_OFFLOAD_CHUNK; at most the partition), each an f32-sized in-slot for a chunk's
-- gradients coming to the host and an out-slot (parameter dtype) for its new weights going back.
M.RING = { slots = 3, chunk = tonumber(os.getenv("ZRUN_OFFLOAD_CHUNK") or "") or 2 ^ 24 }

-- Whether the new weights go back through the ring's out-slots (engine_step.c weights_target: one
-- rank at stages 0-2, or the GPU shard at stage 3); otherwise they are written in place (the host
-- shard with offload_param, or any parameter buffer on the CPU) or all-gathered (stages 1-2 over
-- several ranks).
function M.uploads(e)
  return e.gpu and ((e.stage < 3 and e.Wc == 1) or (e.stage == 3 and not e.offload_param))
end

-- Bytes of one rank's buffers under optimizer offload, by where the gradients live. e: S (this
-- rank's partition elements), h (the host's share, ceil(ratio * S)), k (the optimizer's states
-- beside the master: AdamW 2, Lion/Adagrad/SGD-with-momentum 1), mb, sb (bytes of a master and of
-- a state element: 4, or 2 with bf16_master_weights_and_grads / bf16_optimizer_states), g (bytes of a gradient
-- element: 4, or 2 with grad_accum_dtype bf16/fp16), b (bytes of a parameter), cap (gradient
-- bucket elements), stage, Wc (chunks per parameter), offload_param, gpu (training on a GPU; on
-- the CPU both columns are the same memory). `pinned`: the host categories page-locked with
-- pin_memory on a GPU, those DMA reads or writes (engine.c pin(): a host gradient partition;
-- offload.c: its staging and ring; the master and the states stay pageable). The one place to
-- change when the engine's layout does.
local function ring(e, slot_bytes) return M.RING.slots * min(M.RING.chunk, e.h) * slot_bytes end
M.LAYOUT = {
  -- (a) the gradient partition on the device as without offload (direct mode in one rank at stages
  -- 0-2: .grad are views into it, no buckets); the step streams chunks D2H (memcpy on the CPU)
  -- into the ring's in-slots -> optimizer -> the new weights back through its out-slots where
  -- M.uploads says so (offload.c ring_ready)
  device = {
    device = {
      grads = function(e) return e.S * e.g end,
      optimizer = function(e) return (e.S - e.h) * (e.mb + e.k * e.sb) end,
    },
    host = {
      optimizer = function(e) return e.h * (e.mb + e.k * e.sb) end,
      comm = function(e) return ring(e, 4) + (M.uploads(e) and ring(e, e.b) or 0) end,
    },
    pinned = { comm = true },
  },
  -- (b) the gradients of the host's share go to the host bucket by bucket (from a GPU through a
  -- pinned staging buffer of one bucket, f32-sized) and accumulate there in fp32 or
  -- grad_accum_dtype; the new weights go back through the ring's out-slots where M.uploads says so
  host = {
    device = {
      grads = function(e) return (e.S - e.h) * e.g end,
      optimizer = function(e) return (e.S - e.h) * (e.mb + e.k * e.sb) end,
    },
    host = {
      optimizer = function(e) return e.h * (e.mb + e.k * e.sb) end,
      grads = function(e) return e.h * e.g end,
      comm = function(e) return (e.gpu and e.cap * 4 or 0) + (M.uploads(e) and ring(e, e.b) or 0) end,
    },
    pinned = { grads = true, comm = true },
  },
}

-- The layout's inputs for settings s, a partition of S elements and buckets of cap elements.
local function env(s, S, cap)
  return { S = S, h = ceil(s.offload_ratio * S), k = s.opt_states, g = s.grad_bytes, b = s.dtype_bytes, cap = cap,
    mb = s.master_bytes or 4, sb = s.state_bytes or 4,
    stage = s.stage, Wc = s.stage == 0 and 1 or s.world_size, offload_param = s.offload_param, gpu = s.device ~= "cpu" }
end

-- Adds the offloaded model states of settings s to the plan's dev and host tables; returns the
-- page-locked host bytes (pin_memory, on a GPU).
function M.place(s, S, cap, dev, host)
  local L, e = M.LAYOUT[s.offload_grads], env(s, S, cap)
  local pinned = 0
  for c, f in pairs(L.device) do dev[c] = dev[c] + f(e) end
  for c, f in pairs(L.host) do
    local n = f(e)
    host[c] = host[c] + n
    if L.pinned[c] and s.pin_memory and e.gpu then pinned = pinned + n end
  end
  return pinned
end

-- ZRUN_OFFLOAD_GRADS forces where the gradients live; otherwise "auto".
function M.grads_setting(v)
  v = v or os.getenv("ZRUN_OFFLOAD_GRADS")
  if v == nil or v == "" or v == "auto" then return "auto" end
  if v ~= "device" and v ~= "host" then
    error(fmt("ZRUN_OFFLOAD_GRADS / --offload-grads must be device, host or auto, got '%s'", tostring(v)), 0)
  end
  return v
end

-- The engine's automatic placement (engine.lua offload_grads_place): the gradient partition (S
-- elements of grad_bytes) stays on the GPU when it takes at most half of the `free` GPU memory at
-- zr.initialize; the other half is left for activations.
function M.device_grads_fit(S, grad_bytes, free) return S * grad_bytes <= free / 2 end

-- The GPU memory a plan may use: 5% and 1 GiB are kept for the CUDA context, the allocator's
-- rounding and fragmentation (as zr.memory.fit does).
function M.usable(gpu, headroom, reserve)
  return floor(gpu * (1 - (headroom or 0.05))) - (reserve or 2 ^ 30)
end

-- The training GPU's memory when this process sees one, else nil.
function M.detect_gpu_memory()
  local ok, total = pcall(function()
    local cu = require("zrun._C").cuda
    if cu and cu.device_count() > 0 then return cu.memory_summary(cu.current_device()).device_total end
  end)
  return ok and total or nil
end

-- ---------------------------------------------------------------------------------------------
-- Before starting: what does not fit the host and which setting fixes it, one line each.
-- ---------------------------------------------------------------------------------------------

-- The fixes for a plan p whose host memory per node exceeds `avail` bytes, each with what it
-- saves: `plan_with(changes)` re-plans with some settings changed.
local function fixes(p, avail, plan_with)
  local s, out = p.settings, {}
  local need = p.host_per_node
  local function try(text, changes)
    local q = plan_with(changes)
    if q.host_per_node < need then
      out[#out + 1] = fmt("%s: host %s per node%s", text, human(q.host_per_node),
        q.host_per_node <= avail and " (fits)" or "")
    end
  end
  if s.offload_grads == "host" and s.device ~= "cpu" then
    try("keep the gradients on the GPU (ZRUN_OFFLOAD_GRADS=device; GPU " .. human(plan_with { offload_grads = "device" }
      .device.total) .. " per rank)", { offload_grads = "device" })
  end
  -- the largest share of the optimizer states the host holds within `avail` (a tenth at a time;
  -- stage 3 only, as in DeepSpeed)
  if s.offload_ratio > 0 and s.stage == 3 then
    local best
    for r = floor(s.offload_ratio * 10 - 1e-9), 0, -1 do
      local q = plan_with { offload_ratio = r / 10, offload_grads = "device" } -- the engine keeps them there below 1
      if q.host_per_node <= avail then best = { r / 10, q }; break end
    end
    if best then
      out[#out + 1] = fmt("offload_optimizer.ratio %.1f (the rest of the optimizer states on the GPU): host %s per node " ..
        "(fits), GPU %s per rank", best[1], human(best[2].host_per_node), human(best[2].device.total))
    end
  end
  if s.offload_param then try("offload_param off (the 16-bit shard on the GPU)", { offload_param = false }) end
  out[#out + 1] = "more nodes or GPUs per node: the partitions shrink with the world size"
  return out
end

-- Lines saying that plan p does not fit `avail` host bytes (MemAvailable) or the locked-memory
-- limit `memlock` (nil: unlimited), each with its fixes; {} when it fits.
function M.check_lines(p, avail, memlock, plan_with, avail_note)
  local s, lines = p.settings, {}
  if avail and p.host_per_node > avail then
    local parts = {}
    for _, c in ipairs { "optimizer", "grads", "params", "comm" } do
      if p.host[c] > 0 then
        parts[#parts + 1] = fmt("%s %s", ({ optimizer = "fp32 master + optimizer states", grads = "gradients",
          params = "16-bit parameter shards", comm = s.offload_grads == "device" and "the step's ring" or
          M.uploads(env(s, 0, 0)) and "staging bucket and upload ring" or "staging bucket" })[c], human(p.host[c]))
      end
    end
    lines[#lines + 1] = fmt("CPU offload needs %s of host memory on this node (%s per rank x %d rank%s: %s) but %s is " ..
      "available; any of these fixes it:", human(p.host_per_node), human(p.host.total), s.gpus_per_node,
      s.gpus_per_node == 1 and "" or "s", table.concat(parts, ", "),
      human(avail) .. (avail_note or ""))
    for _, f in ipairs(fixes(p, avail, plan_with)) do lines[#lines + 1] = "  - " .. f end
  end
  if memlock and p.pinned > memlock then
    local who = {}
    if s.offload_optimizer and s.pin_memory then who[#who + 1] = "offload_optimizer.pin_memory" end
    if s.offload_param and s.param_pin_memory then who[#who + 1] = "offload_param.pin_memory" end
    lines[#lines + 1] = fmt("%s page-locks %s per rank but the locked-memory limit (ulimit -l) is %s: " ..
      "raise it (`ulimit -l unlimited`; Docker `--ulimit memlock=-1`; memlock in /etc/security/limits.conf) or set " ..
      "\"pin_memory\": false there (slower copies)", #who > 0 and table.concat(who, " with ") or "pin_memory", human(p.pinned),
      human(memlock))
  end
  return lines
end

return M
