-- Memory plan vs measured peaks by category, and the plan's peak total (the time-line maximum)
-- vs the allocator's peak of the sum, device and host, on this machine's device, for
-- Llama-3.2-1B-shaped models with a few depths and stages (issues 6 and 17). Under mpirun each
-- rank measures its own; rank 0 prints.
--   zrun tests/bench/plan_vs_measured.lua [device=cuda] [dtype=bf16] [batch=4] [seq=512] [only=offload]
--   mpirun -np 2 zrun tests/bench/plan_vs_measured.lua only=multi
local zr = require "zrun"
local C = zr._C
local P = require "zrun.memory_plan"
local Module = require "zrun.nn.module"
local cli = require("zrun.argparse").new("tests/bench/plan_vs_measured.lua",
  "Memory plan vs measured peaks by category, for a few depths and stages.")
cli:option("device", "cuda", "cuda | cpu"):option("dtype", "bf16", "parameter dtype")
cli:option("batch", 4, "micro-batch size"):option("seq", 512, "sequence length")
cli:option("model", "meta-llama/Llama-3.2-1B", "a model config")
cli:option("only", "", "run only the cases whose name contains this (e.g. stage 2, offload, multi)")
local opt = cli:parse(arg)
local W, rank = zr.dist.world_size(), zr.dist.rank()
local dev = opt.device == "cpu" and "cpu" or ("cuda:" .. C.cuda.current_device())
local function say(...) if rank == 0 then print(...) end end
local cats = { "params", "grads", "optimizer", "activations", "comm", "workspace" }
say(("%-26s %-12s %10s %10s %7s"):format("case", "category", "measured", "planned", "ratio"))
for _, c in ipairs { { layers = 1, stage = 0 }, { layers = 4, stage = 0 }, { layers = 16, stage = 0 },
                     { layers = 16, stage = 1, multi = true }, { layers = 16, stage = 2, multi = true },
                     { layers = 16, stage = 3, multi = true }, { layers = 16, stage = 0, ckpt = true },
                     { layers = 16, stage = 2, offload = true, multi = true },
                     { layers = 16, stage = 2, gas = 4, multi = true } } do
  local name = ("L=%d stage %d%s%s%s%s"):format(c.layers, c.stage, c.ckpt and " ckpt" or "", c.offload and " offload" or "",
    c.gas and (" gas " .. c.gas) or "", c.multi and " multi" or "")
  if name:find(opt.only, 1, true) then
    local cfg = zr.models.llama.config(opt.model)
    cfg.num_hidden_layers, cfg.dtype, cfg.device = c.layers, opt.dtype, opt.device
    if jit and jit.flush then jit.flush() end -- compiled traces may still reach the last case's engine
    collectgarbage(); collectgarbage()
    if C.cuda and opt.device ~= "cpu" then C.cuda.synchronize() end
    local base, hbase = zr.memory.stats(dev), zr.memory.stats("cpu")
    zr.manual_seed(0)
    local model = zr.models.llama.LlamaForCausalLM(cfg)
    if c.ckpt then model:gradient_checkpointing_enable() end
    local ds = { train_micro_batch_size_per_gpu = opt.batch, gradient_accumulation_steps = c.gas or 1,
      steps_per_print = 1e9, bf16 = { enabled = opt.dtype == "bf16" }, optimizer = { type = "AdamW", params = { lr = 1e-4 } },
      zero_optimization = { stage = c.stage, offload_optimizer = c.offload and { device = "cpu", pin_memory = true } or nil } }
    local engine = zr.initialize({ model = model, config = ds })
    zr.memory.reset_peak(dev)
    if dev ~= "cpu" then zr.memory.reset_peak("cpu") end
    local ids = (zr.rand({ opt.batch, opt.seq }) * (cfg.vocab_size - 1)):to("i64"):to(opt.device)
    for _ = 1, 2 * (c.gas or 1) do
      local out = engine(ids, ids)
      engine:backward(out.loss)
      engine:step()
    end
    local st, hst = zr.memory.stats(dev), zr.memory.stats("cpu")
    -- where the engine keeps offloaded gradients: its own report when it gives one, else
    -- ZRUN_OFFLOAD_GRADS, else the host (the engine before device gradients)
    local plan = P.plan { model = cfg, config = ds, seq_len = opt.seq, world_size = W,
      gradient_checkpointing = c.ckpt, device = opt.device == "cpu" and "cpu" or "cuda", dtype = opt.dtype,
      offload_grads = c.offload and (engine.offload_grads or os.getenv("ZRUN_OFFLOAD_GRADS") or "host") or nil }
    local print = say
    for _, k in ipairs(cats) do
      if dev == "cpu" then -- one device: the plan's device and host parts land in the same accounting
        local m, p = st[k].peak - base[k].current, plan.device[k] + plan.host[k]
        print(("%-26s %-12s %10.1f %10.1f %7.3f"):format(name, k, m / 2 ^ 20, p / 2 ^ 20, m > 0 and p / m or 0))
      else
        local m, p = st[k].peak - base[k].current, plan.device[k]
        print(("%-26s %-12s %10.1f %10.1f %7.3f"):format(name, k, m / 2 ^ 20, p / 2 ^ 20, m > 0 and p / m or 0))
        local hm, hp = hst[k].peak - hbase[k].current, plan.host[k]
        if hm > 2 ^ 20 or hp > 0 then
          print(("%-26s %-12s %10.1f %10.1f %7.3f"):format(name, "host " .. k, hm / 2 ^ 20, hp / 2 ^ 20, hm > 0 and hp / hm or 0))
        end
      end
    end
    -- the time-line: the training peak of the sum of every category (setup excluded: the peaks were
    -- reset after zr.initialize) against the plan's forward/backward and step phases
    local m, p = st.total_peak - base.total_current, plan.training_total
    if dev == "cpu" then p = p + plan.host.total end
    print(("%-26s %-12s %10.1f %10.1f %7.3f   (sum of category peaks %.1f)"):format(name, "peak total", m / 2 ^ 20,
      p / 2 ^ 20, m > 0 and p / m or 0, (plan.device.sum + (dev == "cpu" and plan.host.sum or 0)) / 2 ^ 20))
    if dev ~= "cpu" then
      local hm = hst.total_peak - hbase.total_current
      print(("%-26s %-12s %10.1f %10.1f %7.3f"):format(name, "host total", hm / 2 ^ 20, plan.host.total / 2 ^ 20,
        hm > 0 and plan.host.total / hm or 0))
    end
    for _, h in ipairs(engine.hook_handles or {}) do h.remove() end
    Module.fetch = nil
    engine, model, ids = nil, nil, nil
    collectgarbage(); collectgarbage()
  end
end
say(("(MiB; ratio = planned / measured; %d rank%s)"):format(W, W > 1 and "s" or ""))
