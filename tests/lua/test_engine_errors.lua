-- The engine stops before training, with a message naming the problem, on requests it cannot
-- honour: offload beyond the host's memory, a batch rule that does
-- not add up, 16-bit gradient accumulation with the optimizer on the host, an optimizer it does
-- not run, Lamb where DeepSpeed refuses it, and a hand-called optimizer:zero_grad().
local zr = require "zrun"
local T = zr.testing
local engine_mod = require "zrun.engine"

local function model() zr.manual_seed(1); return zr.models.llama.LlamaForCausalLM("zrun/tiny-llama") end
local function init(cfg) return zr.initialize({ model = model(), config = cfg }) end
local base = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000, optimizer = { type = "AdamW", params = { lr = 1e-3 } } }
local function with(extra)
  local c = {}
  for k, v in pairs(base) do c[k] = v end
  for k, v in pairs(extra) do c[k] = v end
  return c
end

T.test("offload larger than host memory stops with the numbers", function()
  local huge = { numel = function() return 2e12 end }
  T.raises(function() engine_mod.check_host_memory({ huge }, 1, 2, false) end, "CPU offload needs")
  T.raises(function() engine_mod.check_host_memory({ huge }, 1, 3, true) end, "16-bit parameter shards")
end)

T.test("pinned offload above the locked-memory limit stops with the fix", function()
  local path = os.tmpname()
  local f = io.open(path, "w")
  f:write("Limit                     Soft Limit           Hard Limit           Units\n",
    "Max locked memory         8388608              8388608              bytes\n")
  f:close()
  T.eq(engine_mod.memlock_limit(path), 8388608)
  engine_mod.limits_file = path
  -- bf16 on a GPU (the default here with pin_memory), gradients on the host (the default): pinned
  -- is what DMA touches, fp32 gradients 4 B, the staging bucket 4 B (the bucket is the whole
  -- partition here) and the ring's out-slots 3 x 2 B per element: 14 B (the master and the
  -- states, 12 B, stay pageable)
  local p = { numel = function() return 1e6 end } -- 14 MB pinned > 8 MiB
  local err = T.raises(function() engine_mod.check_host_memory({ p }, 1, 2, false, true) end, "ulimit -l")
  T.eq(err:find("8.00 MiB", 1, true) ~= nil, true, err)
  engine_mod.check_host_memory({ p }, 1, 2, false, false) -- without pin_memory the limit does not apply
  local small = { numel = function() return 1e5 end }
  engine_mod.check_host_memory({ small }, 1, 2, false, true) -- 1.4 MB fit
  -- the last argument names where the engine keeps the gradients. 5e5 elements: on the host 14 B
  -- each, 7e6 B = 6.68 MiB, fit; on the GPU the host pins the ring 3 x (4 + 2) B each: 9e6 B =
  -- 8.58 MiB, more than 8 MiB
  local mid = { numel = function() return 5e5 end }
  engine_mod.check_host_memory({ mid }, 1, 2, false, true, 2, { device = "cuda", offload_grads = "host" })
  err = T.raises(function() engine_mod.check_host_memory({ mid }, 1, 2, false, true, 2,
    { device = "cuda", offload_grads = "device" }) end, "ulimit -l")
  T.eq(err:find("page-locks 8.58 MiB per rank", 1, true) ~= nil, true, err)
  f = io.open(path, "w")
  f:write("Max locked memory         unlimited            unlimited            bytes\n")
  f:close()
  T.eq(engine_mod.memlock_limit(path), nil)
  engine_mod.check_host_memory({ p }, 1, 2, false, true)
  engine_mod.limits_file = nil
  os.remove(path)
end)

T.test("ZRUN_OFFLOAD_GRADS picks where offloaded gradients accumulate, and refuses other values", function()
  T.eq(engine_mod.offload_grads_place(1000, 4, "cpu"), "host") -- a CPU run: host gradients unless told
  local getenv = os.getenv
  local val
  os.getenv = function(k) if k == "ZRUN_OFFLOAD_GRADS" then return val end return getenv(k) end
  val = "device"
  T.eq(engine_mod.offload_grads_place(1000, 4, "cpu"), "device")
  val = "gpu"
  local ok, err = pcall(engine_mod.offload_grads_place, 1000, 4, "cpu")
  os.getenv = getenv
  T.eq(ok, false)
  T.eq(err:find('ZRUN_OFFLOAD_GRADS must be "device"', 1, true) ~= nil, true, err)
end)

T.test("offload_optimizer.ratio < 1 keeps the gradients on the device and refuses ZRUN_OFFLOAD_GRADS=host", function()
  T.eq(engine_mod.offload_grads_place(1000, 4, "cpu", 0.3), "device")
  T.eq(engine_mod.offload_grads_place(1000, 4, "cpu", 1), "host")
  local getenv = os.getenv
  os.getenv = function(k) if k == "ZRUN_OFFLOAD_GRADS" then return "host" end return getenv(k) end
  local ok, err = pcall(engine_mod.offload_grads_place, 1000, 4, "cpu", 0)
  os.getenv = getenv
  T.eq(ok, false)
  T.eq(err:find("ZRUN_OFFLOAD_GRADS=host: offload_optimizer.ratio = 0 keeps part of the optimizer states on the GPU",
    1, true) ~= nil, true, err)
  -- the engine itself refuses a split without device gradients, and a ratio outside 0..1
  local e = init(with({ zero_optimization = { stage = 2, offload_optimizer = { device = "cpu", ratio = 0.5 } } }))
  T.eq(e.offload_grads, "device"); T.eq(e.offload_ratio, 0.5)
  T.eq(e.zero:split() > 0 and e.zero:split() < e.zero:partition_numel(), true, "a split")
  local zr_ = require "zrun"
  local m = zr_.nn.Linear(4, 3)
  T.raises(function() zr_._C.zero_new({ stage = 2, reduce_bucket_size = 100, allgather_bucket_size = 100,
    persistence_threshold = 0, max_live_parameters = 0, offload_optimizer = true, offload_ratio = 0.5 },
    m:parameters(), { 0, 0 }) end, "offload_optimizer.ratio = 0.5 keeps part of the optimizer on the device")
  T.raises(function() zr_._C.zero_new({ stage = 2, reduce_bucket_size = 100, allgather_bucket_size = 100,
    persistence_threshold = 0, max_live_parameters = 0, offload_optimizer = true, offload_ratio = 1.5,
    offload_grads_on_device = true }, m:parameters(), { 0, 0 }) end, "offload_optimizer.ratio must be between 0 and 1, got 1.5")
end)

T.test("offload_param below stage 3 offloads nothing, as in DeepSpeed (the config warns)", function()
  local e = init(with({ zero_optimization = { stage = 2, offload_param = { device = "cpu" } } }))
  T.eq(e.offload_param, false)
  T.eq(e.config:warnings()[1]:find("has no effect at stage 2", 1, true) ~= nil, true, e.config:warnings()[1])
end)

T.test("batch rule mismatch shows the numbers", function()
  local err = T.raises(function() init(with({ train_batch_size = 7, gradient_accumulation_steps = 2 })) end)
  assert(tostring(err):find("7", 1, true) and tostring(err):find("2", 1, true), tostring(err))
end)

T.test("16-bit grad_accum_dtype with the optimizer on the host says why and what to do", function()
  local err = T.raises(function() init(with({ data_types = { grad_accum_dtype = "bf16" } })) end,
    "grad_accum_dtype=bf16 needs the optimizer states on a GPU")
  T.eq(err:find("a CPU run", 1, true) ~= nil, true, err)
  init(with({ data_types = { grad_accum_dtype = "fp32" } })) -- fp32 is what the host path runs
end)

-- `zrun check` on cfg (written to a file): its output and whether it accepted the config.
local function zrun_check(cfg)
  local path = os.tmpname()
  local f = io.open(path, "w")
  f:write(require("cjson").encode(cfg))
  f:close()
  local p = io.popen((os.getenv("ZRUN_BIN") or "./zrun") .. " check --world-size 1 " .. path .. " 2>&1; echo \"@@rc $?\"")
  local out = p:read("*a")
  p:close()
  os.remove(path)
  return out, out:match("@@rc (%d+)") == "0"
end

T.test("an optimizer zrun does not implement: zr.initialize says what `zrun check` says", function()
  local msg = require("zrun.config").unimplemented_optimizer_message("OneBitAdam")
  local e = T.raises(function() init(with({ optimizer = { type = "OneBitAdam", params = { lr = 1e-3 } } })) end, msg)
  local out, ok = zrun_check(with({ optimizer = { type = "OneBitAdam", params = { lr = 1e-3 } } }))
  T.eq(not ok and out:find(msg, 1, true) ~= nil, true, "zrun check: " .. out .. "\nzr.initialize: " .. e)
end)

T.test("SGD under ZeRO: DeepSpeed stops without zero_allow_untested_optimizer; zrun runs it and says so", function()
  local sgd = { type = "SGD", params = { lr = 1e-2 } }
  local warn = 'optimizer.type "SGD" at zero_optimization.stage 2: DeepSpeed stops here ("You are using an untested ' ..
    'ZeRO Optimizer") unless "zero_allow_untested_optimizer": true; zrun runs it'
  local cfg = with({ optimizer = sgd, zero_optimization = { stage = 2 } })
  local e = init(cfg)
  T.eq(table.concat(e.config:warnings(), "\n"):find(warn, 1, true) ~= nil, true, "the engine's warnings")
  local out, ok = zrun_check(cfg)
  T.eq(ok and out:find("warning: " .. warn, 1, true) ~= nil, true, "zrun check: " .. out)
  for _, c in ipairs { with({ optimizer = sgd, zero_optimization = { stage = 2 }, zero_allow_untested_optimizer = true }),
    with({ optimizer = sgd, zero_optimization = { stage = 0 } }) } do
    T.eq(table.concat(init(c).config:warnings(), "\n"):find("SGD", 1, true), nil, "no SGD warning")
  end
end)

T.test("Lamb: zr.initialize and `zrun check` give DeepSpeed's verdict, in the same words", function()
  local lamb = { type = "Lamb", params = { lr = 1e-3 } }
  -- refused as DeepSpeed refuses: ZeRO without zero_allow_untested_optimizer, a static fp16 loss scale
  for _, c in ipairs {
    { with({ optimizer = lamb, zero_optimization = { stage = 2 } }),
      'optimizer.type "Lamb" at zero_optimization.stage 2: DeepSpeed stops here ("You are using an untested ZeRO ' ..
      'Optimizer"); add "zero_allow_untested_optimizer": true to run it' },
    { with({ optimizer = lamb, fp16 = { enabled = true, loss_scale = 128 } }),
      'optimizer.type "Lamb" requires dynamic loss scaling, as DeepSpeed asserts: fp16.loss_scale must be 0, got 128' },
  } do
    local e = T.raises(function() init(c[1]) end, c[2])
    T.eq(select(2, e:gsub("\n", "")), 0, "one line: " .. e)
    local out, ok = zrun_check(c[1])
    T.eq(not ok and out:find(c[2], 1, true) ~= nil, true, "zrun check: " .. out)
  end
  -- with the flag both run it and warn that DeepSpeed's ZeRO would compute other ratios
  local cfg = with({ optimizer = lamb, zero_optimization = { stage = 2 }, zero_allow_untested_optimizer = true })
  local warn = 'optimizer.type "Lamb" at zero_optimization.stage 2: zrun computes each trust ratio over the whole ' ..
    "parameter tensor, as at stage 0"
  local e = init(cfg)
  T.eq(e.optimizer_type, "lamb")
  T.eq(table.concat(e.config:warnings(), "\n"):find(warn, 1, true) ~= nil, true, "the engine's warnings")
  local out, ok = zrun_check(cfg)
  T.eq(ok and out:find("warning: " .. warn, 1, true) ~= nil, true, "zrun check: " .. out)
  -- at stage 0 DeepSpeed runs FusedLamb without the flag: no error, no Lamb warning
  out, ok = zrun_check(with({ optimizer = lamb }))
  T.eq(ok and not out:find('warning: optimizer.type "Lamb"', 1, true), true, out)
end)

T.test("calling optimizer:zero_grad() by hand explains why not", function()
  local _, opt = init(base)
  T.raises(function() opt:zero_grad() end, "engine:step() zeroes gradients")
end)


T.test("more processes on a node than GPUs stops before NCCL, with the fix", function()
  local err = T.raises(function() engine_mod.check_gpus_per_node(4, 2, "cuda:0") end, "4 processes on this node but 2 GPUs")
  assert(err:find("one GPU per process") and err:find("mpirun %-np 2"), err)
  T.raises(function() engine_mod.check_gpus_per_node(2, 1, "cuda:0") end, "but 1 GPU:")
  engine_mod.check_gpus_per_node(2, 2, "cuda:1") -- one GPU each: fine
  engine_mod.check_gpus_per_node(1, 8, "cuda:0")
end)

T.done()
