-- Training throughput of a Llama-shaped model through zr.initialize (the full zrun path:
-- autograd, ZeRO engine, AdamW), random weights and random token ids.
--   zrun tests/bench/bench_llama.lua [model=meta-llama/Llama-3.2-1B] [batch=4] [seq=512]
--        [stage=0] [steps=10] [dtype=bf16] [device=cuda] [ckpt=0] [offload=0] [ratio=1] [overlap=0]
--        [gas=1] [grad_accum=fp32|bf16 (data_types.grad_accum_dtype)] [breakdown=0|1|2|3] [data=SHARD.bin]
--        [zenflow=0] [topk=0.05] [update_interval=gas|N|auto] [select_interval=0] [overlap_step=0] [pt_reserved=0.5]
--        [chunked_loss=0|1|N] [prompt=0]
-- Under mpirun -np N each rank runs on its local rank's GPU (zrun picks it); overlap=1 sets
-- overlap_comm; ratio (with offload=1) is offload_optimizer.ratio, the host's share of the optimizer
-- states (offload=1 ratio=0.5: half of them stay on the GPU). data= trains on an llm.c token shard
-- (tests/bench/llmc_data.lua) instead of one batch of random ids: its consecutive B*T windows in turn.
-- zenflow=1 (with offload=1, stage 1-2) adds zero_optimization.zenflow: the top `topk` columns of
-- each weight updated on the GPU every micro-batch, the host AdamW every update_interval micro-batches
-- (default gas: one host update per measured step; auto: DeepSpeed's adaptive rule, which also
-- measures each micro-batch's own gradient); select_interval 0 selects once (select_strategy
-- "auto" without a dataloader), N re-selects every N micro-batches (select_strategy "step").
-- overlap_step=1 runs each window's host AdamW on a background thread while the GPU computes the next
-- window (applied one window late, as DeepSpeed's), with (1 - pt_reserved) of the OpenMP threads.
-- Prints tokens/s (median over steps after 3 warm-ups) and peak memory by category.
local zr = require "zrun"
local C = zr._C
local cli = require("zrun.argparse").new("tests/bench/bench_llama.lua",
  "Training throughput of a Llama-shaped model through zr.initialize (random weights and tokens).")
cli:option("model", "meta-llama/Llama-3.2-1B", "a model config (hub id, directory or zrun/tiny-llama; Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3 or GPT-2)")
cli:option("batch", 4, "micro-batch size"):option("seq", 512, "sequence length")
cli:option("stage", 0, "ZeRO stage"):option("steps", 10, "measured steps"):option("warmup", 3, "steps not measured")
cli:option("dtype", "bf16", "parameter dtype"):option("device", "cuda", "cuda | cpu")
cli:option("ckpt", 0, "1: gradient checkpointing"):option("offload", 0, "1: optimizer states on the CPU")
cli:option("ratio", 1, "offload_optimizer.ratio (with offload=1): the host's share of the optimizer states")
cli:option("overlap", 0, "1: overlap_comm"):option("gas", 1, "micro-batches per step")
cli:option("grad_accum", "fp32", "data_types.grad_accum_dtype (fp32 | bf16)")
cli:option("breakdown", 0, "1: phases synced; 2: per-op profile; 3: the host's time to issue each phase and op (no syncs)")
cli:option("data", "", "an llm.c token shard: train on its B*T windows in turn (default: random ids)")
cli:option("zenflow", 0, "1: zero_optimization.zenflow (with offload=1)"):option("topk", 0.05, "zenflow topk_ratio")
cli:option("update_interval", "gas", "zenflow update_interval: gas, a number of micro-batches, or auto")
cli:option("select_interval", 0, "zenflow: re-select every N micro-batches (0: once)")
cli:option("overlap_step", 0, "zenflow: 1 runs the host update in the background, applied one window late")
cli:option("pt_reserved", 0.5, "zenflow pt_reserved_cores_perc: the cores' share left to training with overlap_step")
cli:option("chunked_loss", 0, "1: the LM head and loss by zr.linear_cross_entropy (default slices); N: slices of N columns")
cli:option("prompt", 0, "the share of each row's first labels set to -100 (an SFT prompt, not in the loss)")
cli:option("fuse_qk_norm", 1, "Qwen3: 1 runs q_norm / k_norm fused with the rope where zr.qkv_norm_rope_fused says so, 0 as modules")
local opt = cli:parse(arg)
if opt.device ~= "cpu" and not (C.cuda and C.cuda.device_count() > 0) then
  print("bench_llama: no GPU visible; pass device=cpu (slow) to run on the CPU")
  return
end
local cfg = zr.models.llama.config(opt.model)
if opt.fuse_qk_norm ~= 0 and opt.fuse_qk_norm ~= 1 then
  error(("bench_llama: fuse_qk_norm=%s: give 1 (the default) or 0"):format(tostring(opt.fuse_qk_norm)), 0)
elseif opt.fuse_qk_norm == 0 and cfg.model_type ~= "qwen3" then
  error(("bench_llama: fuse_qk_norm=0: only Qwen3 has q/k norms to run unfused (this config's model_type is %s)"):format(
    tostring(cfg.model_type or "llama")), 0)
elseif opt.fuse_qk_norm == 0 then
  zr.qkv_norm_rope_fused = function() return false end -- (llama.lua asks it each layer)
end
cfg.dtype, cfg.device = opt.dtype, opt.device
zr.manual_seed(0)
local model
if cfg.model_type == "gpt2" then model = zr.models.gpt2.GPT2LMHeadModel(cfg)
else -- the class of the config's model_type (Mistral, Qwen2, Qwen3, Phi-3: Llama's code)
  if cfg.model_type == "phi3" then require "zrun.models.phi3" end -- (registers its class)
  if cfg.model_type == "gemma3_text" then require "zrun.models.gemma3" end -- (registers its class)
  model = (zr.models.llama.CLASS_OF[cfg.model_type or "llama"] or zr.models.llama.LlamaForCausalLM)(cfg)
end
if opt.ckpt == 1 then model:gradient_checkpointing_enable() end
local n = model:num_parameters() -- before zr.initialize: ZeRO-3 releases the parameters
local offload = opt.offload == 1 and { device = "cpu", pin_memory = true, ratio = opt.ratio } or nil
local ui = opt.update_interval == "gas" and opt.gas or opt.update_interval == "auto" and "auto" or
  tonumber(opt.update_interval)
if not ui then error("bench_llama: update_interval must be gas, auto or a number, got " .. opt.update_interval, 0) end
local zenflow = opt.zenflow == 1 and { topk_ratio = opt.topk, update_interval = ui, select_strategy = opt.select_interval > 0 and "step" or "auto",
  select_interval = opt.select_interval > 0 and opt.select_interval or "auto", overlap_step = opt.overlap_step == 1,
  pt_reserved_cores_perc = opt.pt_reserved } or nil
local engine = zr.initialize({ model = model, config = {
  train_micro_batch_size_per_gpu = opt.batch, gradient_accumulation_steps = opt.gas, gradient_clipping = 1.0,
  data_types = { grad_accum_dtype = opt.grad_accum },
  steps_per_print = 1000000, bf16 = { enabled = opt.dtype == "bf16" },
  optimizer = { type = "AdamW", params = { lr = 1e-4, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
  zero_optimization = { stage = opt.stage, overlap_comm = opt.overlap == 1, offload_optimizer = offload, zenflow = zenflow },
} })
local batches = {}
if opt.data == "" then
  batches[1] = (zr.rand({ opt.batch, opt.seq }) * (cfg.vocab_size - 1)):to("i64"):to(opt.device)
else -- llm.c's loader: floor((n-1)/(B*T)) windows per shard, rows of T consecutive tokens
  local tokens = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/llmc_shard.lua").read(opt.data)
  local bt = opt.batch * opt.seq
  if #tokens - 1 < bt then
    error(("bench_llama: %s holds %d tokens, fewer than B*T+1 = %d; write it with min_tokens=%d"):format(opt.data,
      #tokens, bt + 1, bt + 1), 0)
  end
  for b = 0, math.floor((#tokens - 1) / bt) - 1 do
    local rows = {}
    for r = 0, opt.batch - 1 do
      local row, o = {}, b * bt + r * opt.seq
      for j = 1, opt.seq do row[j] = tokens[o + j] end
      rows[r + 1] = row
    end
    batches[b + 1] = zr.tensor(rows, { dtype = "i64" }):to(opt.device)
  end
end
-- labels: the ids, or with each row's first prompt * seq labels -100; the forward's options
local labels_of, fwd_opts = {}, opt.chunked_loss ~= 0 and { chunked_loss = opt.chunked_loss == 1 or opt.chunked_loss } or nil
if opt.prompt > 0 then
  local P = math.floor(opt.prompt * opt.seq)
  local mask = zr.cat({ zr.zeros({ opt.batch, P }), zr.ones({ opt.batch, opt.seq - P }) }, 2):to(opt.device)
  for _, ids in ipairs(batches) do
    labels_of[ids] = (ids:to("f32") * mask + (mask - 1) * 100):to("i64")
  end
end
local times = {}
local sync = (C.cuda and function() C.cuda.synchronize() end) or function() end
local phases = { fwd = {}, bwd = {}, step = {} }
for i = 1, opt.warmup + opt.steps do
  if opt.breakdown >= 2 and i == opt.warmup + 1 then C.autograd_profile(opt.breakdown == 2 and 1 or 2) end -- after warm-ups
  sync()
  local t0 = C.now()
  local out, l
  for g = 1, opt.gas do -- one optimizer step = gas micro-batches
    local ids = batches[((i - 1) * opt.gas + g - 1) % #batches + 1]
    local a = C.now()
    out = engine(ids, labels_of[ids] or ids, fwd_opts)
    if opt.breakdown == 1 then sync() end
    local b = C.now()
    engine:backward(out.loss)
    if opt.breakdown == 1 then sync() end
    local c = C.now()
    engine:step()
    if opt.breakdown == 1 then sync() end
    if i > opt.warmup then
      phases.fwd[#phases.fwd + 1], phases.bwd[#phases.bwd + 1] = b - a, c - b
      phases.step[#phases.step + 1] = C.now() - c
    end
  end
  l = out.loss:item() -- waits for the GPU
  sync()
  local dt = C.now() - t0
  if i > opt.warmup then times[#times + 1] = dt end
  if i == 1 or i == opt.warmup + opt.steps then io.write(("step %d loss %.4f (%.1f ms)\n"):format(i, l, dt * 1e3)) end
  out = nil
  collectgarbage("step", 100)
end
if opt.breakdown >= 2 then
  C.autograd_profile(false)
  print(("profile over %d steps (forward ops and backward nodes; %s):"):format(opt.steps, opt.breakdown == 2 and
    "CUDA events, synchronised per op" or "the host's time to issue each, nothing synchronised"))
  io.write(C.autograd_profile_report())
end
table.sort(times)
local med = times[math.ceil(#times / 2)]
local toks = opt.batch * opt.seq * opt.gas / med
print(("%-40s %s"):format("model", opt.model))
print(("%-40s %.4f B"):format("parameters", n / 1e9))
local setting = (opt.ckpt == 1 and " +checkpointing" or "") ..
  (opt.offload == 1 and (" +offload" .. (opt.ratio < 1 and (" ratio " .. opt.ratio) or "")) or "") ..
  (zenflow and (" +zenflow topk %g update_interval %s%s"):format(zenflow.topk_ratio, zenflow.update_interval,
    zenflow.overlap_step and (" overlap_step (pt_reserved %g)"):format(zenflow.pt_reserved_cores_perc) or "") or "")
print(("%-40s B=%d T=%d %s stage %d%s"):format("setting", opt.batch, opt.seq, opt.dtype, opt.stage, setting))
print(("%-40s %.1f ms (%d micro-batch%s)"):format("optimizer step time (median)", med * 1e3, opt.gas,
  opt.gas > 1 and "es" or ""))
if opt.breakdown == 1 then
  local function m(t) table.sort(t); return t[math.ceil(#t / 2)] * 1e3 end
  local st = phases.step
  table.sort(st)
  print(("%-40s fwd %.1f | bwd %.1f | engine.step max %.1f ms"):format("phases, synced (median)", m(phases.fwd),
    m(phases.bwd), st[#st] * 1e3))
elseif opt.breakdown == 3 then -- nothing synced: when issuing nears the step's time, the GPU waits for the host
  local f, b, st = 0, 0, 0
  for i = 1, #phases.fwd do f, b, st = f + phases.fwd[i], b + phases.bwd[i], st + phases.step[i] end
  local k = #phases.fwd
  print(("%-40s fwd %.2f | bwd %.2f | engine.step %.2f ms (mean per micro-batch; step %.2f)"):format(
    "host time to issue, unsynced", f / k * 1e3, b / k * 1e3, st / k * 1e3, med / opt.gas * 1e3))
end
print(("%-40s %.0f"):format("tokens/s", toks))
local flops = 6 * n * toks -- (a CPU's rate in GFLOP/s: it would print as 0 TFLOP/s)
print(flops >= 1e12 and ("%-40s %.0f TFLOP/s"):format("model FLOPs (6·N·tokens/s)", flops / 1e12)
  or ("%-40s %.1f GFLOP/s"):format("model FLOPs (6·N·tokens/s)", flops / 1e9))
local s = zr.memory.stats(opt.device)
for _, c in ipairs(zr.memory.categories) do
  print(("peak %-35s %s"):format(c, zr.memory.human(s[c].peak)))
end
print(("peak %-35s %s"):format("total", zr.memory.human(s.total_peak)))
