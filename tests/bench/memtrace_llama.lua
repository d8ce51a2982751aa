-- The memory timeline of one training step, measured and simulated side by side: every forward
-- op / backward node with activations now and the peak inside it (MiB), first as zrun allocates
-- (zr.memory.trace, "[memtrace]" lines) then as zr.memory.plan simulates it ("[memplan]" lines).
-- Used to find where the plan and the device disagree (issue 6).
--   zrun tests/bench/memtrace_llama.lua [device=cuda] [dtype=bf16] [layers=1] [batch=4] [seq=512]
--     [stage=0] [ckpt=0] [prefetch=N] [persist=N] [offload=0|1] [model=meta-llama/Llama-3.2-1B]
local zr = require "zrun"
local C = zr._C
local P = require "zrun.memory_plan"
local cli = require("zrun.argparse").new("tests/bench/memtrace_llama.lua",
  "One training step's memory timeline, measured (zr.memory.trace) and simulated (zr.memory.plan).")
cli:option("device", "cuda", "cuda | cpu"):option("dtype", "bf16", "parameter dtype")
cli:option("batch", 4, "micro-batch size"):option("seq", 512, "sequence length")
cli:option("layers", 1, "decoder layers"):option("stage", 0, "ZeRO stage"):option("ckpt", 0, "1: gradient checkpointing")
cli:option("prefetch", nil, "stage3_prefetch_bucket_size"):option("persist", nil, "stage3_param_persistence_threshold")
cli:option("offload", 0, "1: optimizer states on the CPU"):option("model", "meta-llama/Llama-3.2-1B", "a model config")
cli:option("hidden", nil, "hidden_size (intermediate 4x)"):option("vocab", nil, "vocab_size")
cli:option("head_dim", nil, "head_dim"):option("model_type", nil, "model_type (llama, mistral, qwen2, qwen3)")
local opt = cli:parse(arg)
local dev = opt.device == "cpu" and "cpu" or "cuda:0"
local cfg = zr.models.llama.config(opt.model)
cfg.num_hidden_layers, cfg.dtype, cfg.device = opt.layers, opt.dtype, opt.device
if opt.vocab then cfg.vocab_size = opt.vocab end
if opt.hidden then cfg.hidden_size, cfg.intermediate_size = opt.hidden, 4 * opt.hidden end
if opt.head_dim then cfg.head_dim = opt.head_dim end
if opt.model_type then cfg.model_type = opt.model_type end
zr.manual_seed(0)
local model = zr.models.llama.CLASS_OF[cfg.model_type or "llama"](cfg)
if opt.ckpt == 1 then model:gradient_checkpointing_enable() end
local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = opt.batch,
  steps_per_print = 1e9, bf16 = { enabled = opt.dtype == "bf16" }, optimizer = { type = "AdamW", params = { lr = 1e-4 } },
  zero_optimization = { stage = opt.stage, stage3_prefetch_bucket_size = opt.prefetch,
    stage3_param_persistence_threshold = opt.persist,
    offload_optimizer = opt.offload == 1 and { device = "cpu", pin_memory = true } or nil } } })
local ids = (zr.rand({ opt.batch, opt.seq }) * (cfg.vocab_size - 1)):to("i64"):to(opt.device)
local base = zr.memory.stats(dev).activations.current
for step = 1, 2 do
  if step == 2 then
    io.stderr:write(("[memtrace] step 2 starts, activations %.2f MiB\n"):format(zr.memory.stats(dev).activations.current / 2 ^ 20))
    zr.memory.reset_peak(dev)
    zr.memory.trace(true)
  end
  local out = engine(ids, ids)
  engine:backward(out.loss)
  engine:step()
end
zr.memory.trace(false)
local st = zr.memory.stats(dev)
io.stderr:write(("[memtrace] measured peak activations %.2f MiB (base %.2f)\n"):format(st.activations.peak / 2 ^ 20, base / 2 ^ 20))
local plan = P.plan { model = cfg, micro_batch = opt.batch, seq_len = opt.seq, stage = opt.stage, world_size = 1,
  prefetch_bucket_size = opt.prefetch, persistence_threshold = opt.persist, offload_optimizer = opt.offload == 1,
  gradient_checkpointing = opt.ckpt == 1, device = opt.device == "cpu" and "cpu" or "cuda", dtype = opt.dtype, trace = true }
io.stderr:write(("[memplan]  planned peak activations %.2f MiB\n"):format(plan.device.activations / 2 ^ 20))
