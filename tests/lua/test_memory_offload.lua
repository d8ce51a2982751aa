-- The memory plan with optimizer offload (lua/zrun/memory_offload.lua): the host and GPU bytes of
-- each gradient placement, data_types.grad_accum_dtype and offload_optimizer.ratio, computed by
-- hand for Llama-3-8B (one rank, bf16); the automatic choice of the placement by GPU memory; a
-- configuration that fits one H200 (141 GB) with 128 GB of host memory; and the messages of the
-- host-memory and locked-memory checks (zr.initialize's, and `zrun plan --host-memory`).
local zr = require "zrun"
local T = zr.testing
local P = require "zrun.memory_plan"
local Off = require "zrun.memory_offload"
local engine_mod = require "zrun.engine"

-- Llama-3-8B on one rank, bf16 (b = 2 bytes a parameter), AdamW: the partition S is the model,
-- N = 8,030,261,248 elements. The gradient bucket: reduce_bucket_size 5e8 is below the largest
-- parameter (the 128,256 x 4,096 embedding, 525,336,576 elements), which sets it. The step's ring:
-- 3 slots of C = min(2^24, S) = 16,777,216 elements.
local N = 8030261248
local CAP = 128256 * 4096 -- 525,336,576
local C = 2 ^ 24
local GiB = 2 ^ 30
local function plan8b(o)
  local t = { model = "meta-llama/Meta-Llama-3-8B", stage = 2, dtype = "bf16", offload_optimizer = true,
    micro_batch = 4, seq_len = 512 }
  for k, v in pairs(o or {}) do t[k] = v end
  return P.plan(t)
end

T.test("Llama-3-8B, gradients on the host (hand-computed): 121.71 GiB, no host copy of the 16-bit weights", function()
  local p = plan8b { offload_grads = "host" }
  T.eq(p.host.optimizer, 12 * N, "fp32 master + exp_avg + exp_avg_sq: 96,363,134,976")
  T.eq(p.host.grads, 4 * N, "fp32 gradients: 32,121,044,992")
  T.eq(p.host.params, 0, "no host copy of the 16-bit weights")
  -- the pinned staging bucket (f32) 4 x 525,336,576 = 2,101,346,304, and the ring's out-slots the
  -- new weights go back through (one rank at stage 2): 3 x 2^24 x 2 = 100,663,296
  T.eq(p.host.comm, 4 * CAP + 3 * C * 2, "staging bucket + ring out-slots: 2,202,009,600")
  -- 16 x 8,030,261,248 + 2,202,009,600 = 130,686,189,568 bytes = 121.711 GiB
  T.eq(p.host.total, 16 * N + 4 * CAP + 3 * C * 2)
  T.eq(string.format("%.2f", p.host.total / GiB), "121.71")
  T.eq(p.device.optimizer, 0); T.eq(p.device.params, 2 * N)
  T.eq(p.device.comm, 4 * CAP, "the f32 bucket on the GPU (with host gradients one rank is not direct)")
  -- page-locked with pin_memory: what DMA touches (the gradient partition, the staging bucket and
  -- the ring), not the master and states: 4N + 4 CAP + 3 x 2^24 x 2 = 34,323,054,592
  T.eq(p.pinned, 4 * N + 4 * CAP + 3 * C * 2)
  -- 16-bit gradients on the host (data_types.grad_accum_dtype bf16): a bf16 host partition, 2N;
  -- the staging bucket stays f32-sized: 14N + 4 CAP + 3 x 2^24 x 2 = 114,625,667,072
  local pb = plan8b { offload_grads = "host", grad_accum_dtype = "bf16" }
  T.eq(pb.host.grads, 2 * N); T.eq(pb.host.total, 14 * N + 4 * CAP + 3 * C * 2)
  T.eq(pb.pinned, 2 * N + 4 * CAP + 3 * C * 2)
  pb = plan8b { offload_grads = "host", config = { train_micro_batch_size_per_gpu = 4, bf16 = { enabled = true },
    zero_optimization = { stage = 2, offload_optimizer = { device = "cpu" } }, data_types = { grad_accum_dtype = "bf16" } } }
  T.eq(pb.host.grads, 2 * N, "read from the DeepSpeed config")
end)

T.test("gradients on the GPU (hand-computed): the host holds master + states (12 B/param) and the ring", function()
  local p = plan8b { offload_grads = "device" }
  T.eq(p.host.optimizer, 12 * N); T.eq(p.host.grads, 0); T.eq(p.host.params, 0)
  -- each slot: an f32 in-slot for a chunk's gradients and a bf16 out-slot for its weights:
  -- 3 x 2^24 x (4 + 2) = 301,989,888 bytes (288 MiB)
  T.eq(p.host.comm, 3 * C * (4 + 2))
  -- 96,363,134,976 + 301,989,888 = 96,665,124,864 bytes = 90.03 GiB
  T.eq(p.host.total, 96665124864)
  T.eq(p.device.grads, 4 * N, "the fp32 gradient partition on the GPU, as without offload")
  T.eq(p.device.comm, 0, "one rank at stage 2: direct mode, no buckets")
  -- setup: the model as built (2N) and its copy into the flat parameter buffer (2N) before the
  -- originals are freed; the gradient partition (4N) only after: max(4N, 2N + 4N) = 6N
  T.eq(p.setup.params, 4 * N); T.eq(p.setup.total, 6 * N)
  T.eq(p.device.total > 6 * N, true, "training (6N + activations), not the setup, is the GPU's peak")
  -- only the ring is page-locked (engine.c pin(): no host gradient partition here; the master and
  -- the states stay pageable)
  T.eq(p.pinned, 3 * C * 6)
  -- bf16 gradients: half the GPU partition; the ring's in-slots stay f32-sized
  local pb = plan8b { offload_grads = "device", grad_accum_dtype = "bf16" }
  T.eq(pb.device.grads, 2 * N); T.eq(pb.host.total, 12 * N + 3 * C * 6)
  -- two ranks: buckets again. cap = max(5e8 / 2, ceil(525,336,576 / 2) = 262,668,288); bf16
  -- send 2 cap and its compaction 2 cap and receive cap elements (2 bytes): 10 cap bytes; the
  -- step's all-gather of the new weights, send cap and receive 2 cap: 6 cap bytes
  local p2 = plan8b { offload_grads = "device", gpus_per_node = 2 }
  T.eq(p2.device.comm, 16 * 262668288)
  -- allgather_bucket_size sizes that all-gather alone: 2e9 elements, 1e9 a rank: send 1e9 and receive 2e9 (2 bytes)
  p2 = plan8b { offload_grads = "device", gpus_per_node = 2, config = { train_micro_batch_size_per_gpu = 4,
    bf16 = { enabled = true }, zero_optimization = { stage = 2, offload_optimizer = { device = "cpu" },
      allgather_bucket_size = 2e9 } } }
  T.eq(p2.device.comm, 10 * 262668288 + 6 * 1e9)
  T.eq(p2.host.comm, 3 * C * 4, "the ring's in-slots: the weights come back by all-gather, not through out-slots")
end)

T.test("offload_optimizer.ratio keeps the rest of the optimizer states on the GPU (stage 3)", function()
  local h = math.ceil(0.75 * N)
  -- below ratio 1 the gradients stay on the GPU (the device part reads them there), as the engine
  -- keeps them: host = the host share's master + states and the ring 3 x 2^24 x (4 + 2)
  local p = plan8b { stage = 3, offload_ratio = 0.75 }
  T.eq(p.settings.offload_grads, "device")
  T.eq(p.host.optimizer, 12 * h); T.eq(p.device.optimizer, 12 * (N - h))
  T.eq(p.host.grads, 0); T.eq(p.device.grads >= 4 * N, true)
  T.eq(p.host.params, 0)
  T.eq(p.host.comm, 3 * C * 6, "the ring (the shard is on the GPU)")
  p = plan8b { stage = 3, config = { train_micro_batch_size_per_gpu = 4, bf16 = { enabled = true },
    zero_optimization = { stage = 3, offload_optimizer = { device = "cpu", ratio = 0.75 } } } }
  T.eq(p.host.optimizer, 12 * h, "offload_optimizer.ratio from the config")
  T.eq(tostring(p):find("optimizer offloaded (ratio 0.75)", 1, true) ~= nil, true, tostring(p))
  local p0 = plan8b { stage = 3, offload_grads = "device", offload_ratio = 0 }
  T.eq(p0.host.optimizer, 0); T.eq(p0.device.optimizer, 12 * N)
  T.raises(function() plan8b { stage = 3, offload_ratio = 1.5 } end, "offload_optimizer.ratio must be between 0 and 1, got 1.5")
  -- below stage 3 too (zrun's config check warns there, where DeepSpeed refuses): the gradients
  -- stay on the device, and forcing them to the host is refused as the engine refuses it
  local p2 = plan8b { offload_ratio = 0.5 }
  T.eq(p2.settings.offload_grads, "device"); T.eq(p2.host.optimizer, 12 * math.ceil(0.5 * N))
  T.raises(function() plan8b { offload_ratio = 0.5, offload_grads = "host" } end, "offload_grads host needs ratio 1")
end)

T.test("auto: the engine's rule, the gradient partition on the GPU when it takes at most half of the free memory", function()
  -- free at zr.initialize: the usable memory (95% less 1 GiB) less the 16-bit weights (2N =
  -- 14.96 GiB). 141 GB: 132.95 - 14.96 = 117.99 GiB free, the fp32 partition 4N = 29.92 GiB <= half
  local p = plan8b { gpu_memory = "141GB" }
  T.eq(p.settings.offload_grads, "device")
  T.eq(p.device.total <= Off.usable(141 * GiB), true)
  T.eq(tostring(p):find("gradients on the GPU, as the engine chooses: the partition, 29.92 GiB, takes at most half " ..
    "of the 117.99 GiB free after the weights (of 132.95 GiB usable); ZRUN_OFFLOAD_GRADS=host fits too", 1, true) ~= nil,
    true, tostring(p))
  -- 80 GB: 76 - 1 = 75.00 usable, 60.04 free, half 30.02 >= 29.92: the GPU; 72 GB: 67.40 usable,
  -- 52.44 free, half 26.22 < 29.92: the host, though the device plan (55.18 GiB: 6N and the forward's activations) would fit
  T.eq(plan8b { gpu_memory = "80GB" }.settings.offload_grads, "device")
  p = plan8b { gpu_memory = "72GB" }
  T.eq(p.settings.offload_grads, "host")
  T.eq(tostring(p):find("takes more than half of the 52.44 GiB free after the weights (of 67.40 GiB usable); " ..
    "ZRUN_OFFLOAD_GRADS=device fits too: GPU 55.18 GiB, host 90.03 GiB per rank", 1, true) ~= nil, true, tostring(p))
  -- the rule is the engine's own function
  T.eq(Off.device_grads_fit(10, 4, 80), true); T.eq(Off.device_grads_fit(10, 4, 79), false)
  p = plan8b { gpu_memory = "40GB" } -- 37.00 usable, 22.04 free
  T.eq(p.settings.offload_grads, "host")
  T.eq(tostring(p):find("of 37.00 GiB usable); ZRUN_OFFLOAD_GRADS=device would need GPU 55.18 GiB per rank", 1, true)
    ~= nil, true, tostring(p))
  -- bf16 gradients (2N = 14.96 GiB): 50 GB, 46.50 usable, 31.54 free: the GPU; on the host
  -- they would take 14N + 4 CAP + 3 x 2^24 x 2 = 114,625,667,072 B = 106.75 GiB there
  p = plan8b { gpu_memory = "50GB", grad_accum_dtype = "bf16" }
  T.eq(p.settings.offload_grads, "device")
  T.eq(tostring(p):find("ZRUN_OFFLOAD_GRADS=host fits too: GPU [%d.]+ GiB, host 106.75 GiB per rank") ~= nil, true,
    tostring(p))
  -- an explicit setting wins over the GPU size
  T.eq(plan8b { gpu_memory = "141GB", offload_grads = "host" }.settings.offload_grads, "host")
  T.raises(function() plan8b { offload_grads = "gpu" } end, "must be device, host or auto, got 'gpu'")
end)

T.test("Llama-3-8B full fine-tuning fits one H200 (141 GB) with 128 GB of host memory", function()
  for _, gad in ipairs { "fp32", "bf16" } do
    local p = plan8b { gpu_memory = "141GB", grad_accum_dtype = gad }
    print(p)
    T.eq(p.settings.offload_grads, "device", gad)
    T.eq(p.device.total <= Off.usable(141 * GiB), true, gad .. " GPU")
    T.eq(p.host_per_node <= 128e9, true, gad .. " host")
    T.eq(#P.host_check(p, { model = "meta-llama/Meta-Llama-3-8B", stage = 2, dtype = "bf16", offload_optimizer = true,
      micro_batch = 4, seq_len = 512, grad_accum_dtype = gad }, 128 * GiB), 0)
  end
end)

T.test("tests/bench/llama3_8b_h200.json (the 8B run's DeepSpeed config) plans to fit an H200 + 128 GB", function()
  local o = { model = "meta-llama/Meta-Llama-3-8B", config = "tests/bench/llama3_8b_h200.json", seq_len = 512,
    gpu_memory = "141GB" }
  local p = P.plan(o)
  T.eq(p.settings.stage, 2); T.eq(p.settings.offload_optimizer, true); T.eq(p.settings.micro_batch, 4)
  T.eq(p.settings.dtype, "bf16"); T.eq(p.settings.offload_grads, "device")
  T.eq(p.host.total, 12 * N + 3 * C * 6)
  T.eq(p.device.total <= Off.usable(141 * GiB), true)
  T.eq(#P.host_check(p, o, 128 * GiB), 0)
end)

T.test("the host check says what does not fit and each setting that fixes it, one line each", function()
  local o = { model = "meta-llama/Meta-Llama-3-8B", stage = 2, dtype = "bf16", offload_optimizer = true, micro_batch = 4,
    seq_len = 512, offload_grads = "host" }
  -- host gradients need 121.71 GiB (above): more than a node with 112 GiB free
  local lines = P.host_check(P.plan(o), o, 112 * GiB)
  local text = table.concat(lines, "\n")
  print(text)
  -- the parts: 12N = 89.75 GiB, 4N = 29.92 GiB, 4 CAP + 3 x 2^24 x 2 = 2,202,009,600 = 2.05 GiB
  T.eq(lines[1], "CPU offload needs 121.71 GiB of host memory on this node (121.71 GiB per rank x 1 rank: fp32 master + " ..
    "optimizer states 89.75 GiB, gradients 29.92 GiB, staging bucket and upload ring 2.05 GiB) but " ..
    "112.00 GiB is available; any of these fixes it:")
  T.eq(lines[2]:find("^  %- keep the gradients on the GPU %(ZRUN_OFFLOAD_GRADS=device; GPU [%d.]+ GiB per rank%): host 90.03 GiB " ..
    "per node %(fits%)$") ~= nil, true, lines[2])
  T.eq(lines[3], "  - more nodes or GPUs per node: the partitions shrink with the world size")
  T.eq(#lines, 3)
  -- stage 3 (one rank, the shard on the GPU: the same host bytes) can also keep a share of the
  -- states on the GPU, the gradients then on the GPU too: ratio 0.9 -> h = ceil(0.9 N) =
  -- 7,227,235,124 host elements x 12 B + the ring 3 x 2^24 x 6 = 87,028,811,376 B = 81.05 GiB
  o.stage = 3
  lines = P.host_check(P.plan(o), o, 112 * GiB)
  T.eq(lines[1]:find("CPU offload needs 121.71 GiB", 1, true) ~= nil, true, lines[1])
  local h9 = 12 * math.ceil(0.9 * N) + 3 * C * 6
  T.eq(h9, 87028811376); T.eq(h9 < 112 * GiB, true)
  T.eq(lines[3]:find("^  %- offload_optimizer.ratio 0.9 %(the rest of the optimizer states on the GPU%): host 81.05 GiB " ..
    "per node %(fits%), GPU [%d.]+ GiB per rank$") ~= nil, true, table.concat(lines, "\n"))
  T.eq(#lines, 4)
  o.stage = 2
  -- fits: nothing to say
  T.eq(#P.host_check(P.plan(o), o, 122 * GiB), 0)
  -- the locked-memory limit, with its fix: the engine page-locks the ring (3 x 2^24 x 6):
  -- 301,989,888 B = 288 MiB
  local pd = P.plan { model = "meta-llama/Meta-Llama-3-8B", stage = 2, dtype = "bf16", offload_optimizer = true,
    micro_batch = 4, seq_len = 512, offload_grads = "device" }
  lines = P.host_check(pd, {}, 128 * GiB, 64 * 2 ^ 20)
  T.eq(#lines, 1)
  T.eq(lines[1], "offload_optimizer.pin_memory page-locks 288.00 MiB per rank but the locked-memory limit (ulimit -l) is " ..
    "64.00 MiB: raise it (`ulimit -l unlimited`; Docker `--ulimit memlock=-1`; memlock in /etc/security/limits.conf) or " ..
    "set \"pin_memory\": false there (slower copies)")
  T.eq(#P.host_check(pd, {}, 128 * GiB, 301989888), 0, "a limit of exactly what is pinned")
  T.eq(#P.host_check(pd, {}, 128 * GiB, 301989888 - 1), 1, "a byte less")
  local nopin = P.plan { model = "meta-llama/Meta-Llama-3-8B", stage = 2, dtype = "bf16", offload_optimizer = true,
    offload_grads = "device", pin_memory = false }
  T.eq(nopin.pinned, 0); T.eq(#P.host_check(nopin, {}, 128 * GiB, 64 * 2 ^ 20), 0, "pin_memory false: no limit")
end)

-- A limits file (/proc/self/limits' format) with a locked-memory limit of `bytes`; with_memlock runs fn
-- with zr.initialize's check reading it.
local function memlock_file(bytes)
  local path = os.tmpname()
  local f = io.open(path, "w")
  f:write(("Max locked memory         %d              %d              bytes\n"):format(bytes, bytes))
  f:close()
  return path
end
local function with_memlock(bytes, fn)
  local path = memlock_file(bytes)
  engine_mod.limits_file = path
  local ok, err = pcall(fn)
  engine_mod.limits_file = nil
  os.remove(path)
  if not ok then error(err, 0) end
end

T.test("offload_param.pin_memory page-locks the host parameter shard (stage 3), and says so at the limit", function()
  -- stage 3, optimizer and parameters offloaded, gradients on the GPU: the ring's in-slots 3 x 2^24 x 4 (the new
  -- weights are written into the host shard in place: no out-slots) and the bf16 shard 2N, DeepSpeed's default
  -- offload_param.pin_memory true
  local o = { stage = 3, offload_param = true, offload_grads = "device" }
  local p = plan8b(o)
  T.eq(p.host.params, 2 * N, "the 16-bit shard on the host")
  T.eq(p.pinned, 3 * C * 4 + 2 * N)
  o.param_pin_memory = false
  T.eq(plan8b(o).pinned, 3 * C * 4, "offload_param.pin_memory false: the shard stays pageable")
  local cfg = { train_micro_batch_size_per_gpu = 4, bf16 = { enabled = true }, zero_optimization = { stage = 3,
    offload_optimizer = { device = "cpu" }, offload_param = { device = "cpu", pin_memory = false } } }
  T.eq(plan8b({ stage = 3, offload_grads = "device", config = cfg }).pinned, 3 * C * 4,
    "read from the DeepSpeed config")
  cfg.zero_optimization.offload_param.pin_memory = nil
  T.eq(plan8b({ stage = 3, offload_grads = "device", config = cfg }).pinned, 3 * C * 4 + 2 * N, "default true")
  T.eq(plan8b({ stage = 3, offload_param = true, offload_grads = "device", device = "cpu" }).pinned, 0,
    "a CPU run pins nothing")
  -- 3 x 2^24 x 4 + 2N = 16,261,849,088 B = 15.15 GiB, against a limit of 2N
  local lines = P.host_check(p, {}, 1024 * GiB, 2 * N)
  T.eq(#lines, 1)
  local want = "^offload_optimizer.pin_memory with offload_param.pin_memory page%-locks 15.15 GiB per rank"
  T.eq(lines[1]:find(want) ~= nil, true, lines[1])
  -- the engine's check: 1e6 parameters at stage 3 with only the parameters offloaded: the shard, 2e6 B, against 1 MiB
  with_memlock(1048576, function()
    local one = { numel = function() return 1e6 end }
    local err = T.raises(function() engine_mod.check_host_memory({ one }, 1, 3, true, false, 2, { device = "cuda",
      offload_optimizer = false, param_pin_memory = true }) end, "ulimit -l")
    T.eq(err:find("^offload_param.pin_memory page%-locks 1.91 MiB per rank") ~= nil, true, err)
    engine_mod.check_host_memory({ one }, 1, 3, true, false, 2, { device = "cuda", offload_optimizer = false })
  end)
end)

T.test("zr.initialize's check: the plan's host column for the engine's parameters", function()
  local path = memlock_file(8388608)
  engine_mod.limits_file = path
  -- 1e6 parameters, bf16 on a GPU, gradients on the host: pinned are the gradients 4 MB, the
  -- staging bucket 4 MB (the bucket is the whole partition here) and the ring's out-slots
  -- 3 x 1e6 x 2 = 6 MB (not the master and states): 14e6 B = 13.35 MiB > 8 MiB
  local p = { numel = function() return 1e6 end }
  local err = T.raises(function() engine_mod.check_host_memory({ p }, 1, 2, false, true, 2, { device = "cuda" }) end,
    "ulimit -l")
  T.eq(err:find("page-locks 13.35 MiB per rank", 1, true) ~= nil, true, err)
  -- 16-bit gradients on the host: a bf16 partition, 2 MB: 12e6 B = 11.44 MiB
  err = T.raises(function() engine_mod.check_host_memory({ p }, 1, 2, false, true, 2,
    { device = "cuda", grad_accum_dtype = "bf16" }) end, "ulimit -l")
  T.eq(err:find("page-locks 11.44 MiB per rank", 1, true) ~= nil, true, err)
  -- gradients on the GPU: the ring 3 x 1e6 x (4 + 2) = 18e6 B = 17.17 MiB
  err = T.raises(function() engine_mod.check_host_memory({ p }, 1, 2, false, true, 2,
    { device = "cuda", offload_grads = "device" }) end, "ulimit -l")
  T.eq(err:find("page-locks 17.17 MiB per rank", 1, true) ~= nil, true, err)
  -- 18 x 466,033 = 8,388,594 B fits 8 MiB (8,388,608 B); 18 x 466,034 = 8,388,612 does not
  engine_mod.check_host_memory({ { numel = function() return 466033 end } }, 1, 2, false, true, 2,
    { device = "cuda", offload_grads = "device" })
  T.raises(function() engine_mod.check_host_memory({ { numel = function() return 466034 end } }, 1, 2, false, true, 2,
    { device = "cuda", offload_grads = "device" }) end, "page-locks 8.00 MiB per rank")
  engine_mod.limits_file = nil
  os.remove(path)
  local huge = { numel = function() return 2e12 end }
  err = T.raises(function() engine_mod.check_host_memory({ huge }, 1, 3, true, false, 2, { device = "cuda" }) end,
    "CPU offload needs")
  T.eq(err:find("16-bit parameter shards", 1, true) ~= nil, true, err)
  T.eq(err:find("\n  - more nodes or GPUs per node", 1, true) ~= nil, true, err)
  T.eq(err:find("of MemAvailable", 1, true) ~= nil, true, err)
end)

T.test("zrun plan: offload options and their errors", function()
  local function plan(...) return P.main_plan({ "zrun/tiny-llama", ... }) end
  T.raises(function() plan("--offload-optimizer", "--stage", "2", "--offload-ratio", "2") end,
    "zrun plan: --offload-ratio must be a number from 0 to 1, got '2'")
  T.raises(function() plan("--stage", "2", "--offload-grads", "device") end, "need --offload-optimizer")
  T.raises(function() plan("--grad-accum-dtype", "int8") end, "--grad-accum-dtype must be fp32, bf16 or fp16, got 'int8'")
  local z = os.getenv("ZRUN_BIN") or "./zrun"
  local out = T.run("ZRUN_OFFLOAD_GRADS=device " .. z .. " plan meta-llama/Meta-Llama-3-8B --stage 2 --offload-optimizer " ..
    "--host-memory 128GB")
  T.eq(out:find("gradients on the GPU, as asked", 1, true) ~= nil, true, out)
  T.eq(out:find("host memory: 90.03 GiB per node fits 128.00 GiB", 1, true) ~= nil, true, out)
  out = T.run("ZRUN_OFFLOAD_GRADS=host " .. z .. " plan meta-llama/Meta-Llama-3-8B --stage 2 --offload-optimizer " ..
    "--host-memory 128GB")
  T.eq(out:find("host memory: 121.71 GiB per node fits 128.00 GiB", 1, true) ~= nil, true, out)
  out = T.run("ZRUN_OFFLOAD_GRADS=host " .. z .. " plan meta-llama/Meta-Llama-3-8B --stage 2 --offload-optimizer " ..
    "--host-memory 112GB")
  T.eq(out:find("CPU offload needs 121.71 GiB", 1, true) ~= nil, true, out)
end)

T.done()
