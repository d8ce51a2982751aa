-- Memory plan vs measured peaks by category, on this machine's device, for Llama-3.2-1B-shaped
-- models with a few depths and stages (the check of issue 6 on the GPU).
--   zrun tests/bench/plan_vs_measured.lua [device=cuda] [dtype=bf16] [batch=4] [seq=512]
local zr = require "zrun"
local C = zr._C
local P = require "zrun.memory_plan"
local Module = require "zrun.nn.module"
local cli = require("zrun.argparse").new("tests/bench/plan_vs_measured.lua",
  "Memory plan vs measured peaks by category, for a few depths and stages.")
cli:option("device", "cuda", "cuda | cpu"):option("dtype", "bf16", "parameter dtype")
cli:option("batch", 4, "micro-batch size"):option("seq", 512, "sequence length")
cli:option("model", "meta-llama/Llama-3.2-1B", "a model config")
local opt = cli:parse(arg)
local dev = opt.device == "cpu" and "cpu" or "cuda:0"
local cats = { "params", "grads", "optimizer", "activations", "comm", "workspace" }
print(("%-26s %-12s %10s %10s %7s"):format("case", "category", "measured", "planned", "ratio"))
for _, c in ipairs { { layers = 1, stage = 0 }, { layers = 4, stage = 0 }, { layers = 16, stage = 0 },
                     { layers = 16, stage = 1 }, { layers = 16, stage = 2 }, { layers = 16, stage = 3 },
                     { layers = 16, stage = 0, ckpt = true }, { layers = 16, stage = 2, offload = true } } do
  local cfg = zr.models.llama.config(opt.model)
  cfg.num_hidden_layers, cfg.dtype, cfg.device = c.layers, opt.dtype, opt.device
  if jit and jit.flush then jit.flush() end -- compiled traces may still reach the last case's engine
  collectgarbage(); collectgarbage()
  if C.cuda and opt.device ~= "cpu" then C.cuda.synchronize() end
  local base, hbase = zr.memory.stats(dev), zr.memory.stats("cpu")
  zr.manual_seed(0)
  local model = zr.models.llama.LlamaForCausalLM(cfg)
  if c.ckpt then model:gradient_checkpointing_enable() end
  local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = opt.batch,
    steps_per_print = 1e9, bf16 = { enabled = opt.dtype == "bf16" }, optimizer = { type = "AdamW", params = { lr = 1e-4 } },
    zero_optimization = { stage = c.stage, offload_optimizer = c.offload and { device = "cpu", pin_memory = true } or nil } } })
  zr.memory.reset_peak(dev)
  if dev ~= "cpu" then zr.memory.reset_peak("cpu") end
  local ids = (zr.rand({ opt.batch, opt.seq }) * (cfg.vocab_size - 1)):to("i64"):to(opt.device)
  for _ = 1, 2 do
    local out = engine(ids, ids)
    engine:backward(out.loss)
    engine:step()
  end
  local st, hst = zr.memory.stats(dev), zr.memory.stats("cpu")
  local plan = P.plan { model = cfg, micro_batch = opt.batch, seq_len = opt.seq, stage = c.stage, world_size = 1,
    gradient_checkpointing = c.ckpt, device = opt.device == "cpu" and "cpu" or "cuda", dtype = opt.dtype,
    offload_optimizer = c.offload or false }
  local name = ("L=%d stage %d%s%s"):format(c.layers, c.stage, c.ckpt and " ckpt" or "", c.offload and " offload" or "")
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
  for _, h in ipairs(engine.hook_handles or {}) do h.remove() end
  Module.fetch = nil
  engine, model, ids = nil, nil, nil
  collectgarbage(); collectgarbage()
end
print("(MiB; ratio = planned / measured)")
