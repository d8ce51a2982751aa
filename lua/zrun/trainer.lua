-- zr.Trainer: the Hugging Face Trainer loop on top of zr.initialize. Arguments follow
-- TrainingArguments (output_dir, per_device_train_batch_size, gradient_accumulation_steps,
-- learning_rate, weight_decay, num_train_epochs, max_steps, warmup_steps/warmup_ratio,
-- lr_scheduler_type, logging_steps, bf16/fp16, max_grad_norm, gradient_checkpointing, seed,
-- deepspeed = config path or table). Rank 0 prints progress and writes metrics as JSONL.
local zr = require "zrun"
local C = zr._C
local dist = require "zrun.dist"
local datasets = require "zrun.datasets"
local cjson = require "cjson"

local Trainer = {}
Trainer.__index = Trainer

local fmt = string.format
local DEFAULTS = { output_dir = "output", per_device_train_batch_size = 8, per_device_eval_batch_size = 8,
  gradient_accumulation_steps = 1, learning_rate = 5e-5, weight_decay = 0.0, adam_beta1 = 0.9,
  adam_beta2 = 0.999, adam_epsilon = 1e-8, max_grad_norm = 1.0, num_train_epochs = 3, max_steps = -1,
  warmup_steps = 0, warmup_ratio = 0.0, logging_steps = 10, seed = 42, bf16 = false, fp16 = false,
  gradient_checkpointing = false }

local function hms(s)
  s = math.max(0, math.floor(s + 0.5))
  return fmt("%02d:%02d:%02d", math.floor(s / 3600), math.floor(s / 60) % 60, s % 60)
end

function Trainer.new(opts)
  local self = setmetatable({}, Trainer)
  self.model = assert(opts.model, "Trainer: model is required")
  local a = {}
  for k, v in pairs(DEFAULTS) do a[k] = v end
  for k, v in pairs(opts.args or {}) do a[k] = v end
  self.args = a
  self.user_args = opts.args or {}
  self.train_dataset, self.eval_dataset = opts.train_dataset, opts.eval_dataset
  self.collator = opts.data_collator or datasets.causal_lm_collator()
  return self
end
setmetatable(Trainer, { __call = function(_, opts) return Trainer.new(opts) end })

-- HF's default grouping: no weight decay for biases and normalisation weights.
local function param_groups(model, wd)
  local decay, no_decay = {}, {}
  for name, p in model:named_parameters() do
    if name:match("bias$") or name:match("norm") or name:match("ln_") then no_decay[#no_decay + 1] = p
    else decay[#decay + 1] = p end
  end
  return { { params = decay, weight_decay = wd }, { params = no_decay, weight_decay = 0.0 } }
end

function Trainer:setup()
  if self.engine then return end
  local a = self.args
  local W = dist.world_size()
  local ds_cfg = a.deepspeed or { zero_optimization = { stage = 0 }, optimizer = { type = "AdamW", params = {} },
    scheduler = { type = "WarmupDecayLR", params = {} } }
  local n = self.train_dataset and #self.train_dataset.rows or 0
  local per_epoch = math.floor(math.floor(n / (a.per_device_train_batch_size * W)) / a.gradient_accumulation_steps)
  if self.train_dataset and per_epoch < 1 then
    error(fmt("Trainer: %d training rows are too few for one step (%d per device x %d ranks x %d accumulation)",
      n, a.per_device_train_batch_size, W, a.gradient_accumulation_steps), 0)
  end
  self.steps_per_epoch = per_epoch
  self.total_steps = a.max_steps > 0 and a.max_steps or per_epoch * math.ceil(a.num_train_epochs)
  -- only what the caller set is compared with the config (defaults never conflict), as in HF
  local hf_args = {}
  for k, v in pairs(self.user_args) do hf_args[k] = v end
  hf_args.max_steps = self.total_steps
  if a.gradient_checkpointing and self.model.gradient_checkpointing_enable then self.model:gradient_checkpointing_enable() end
  self.engine = zr.initialize({ model = self.model, config = ds_cfg, args = hf_args,
    num_training_steps = self.total_steps,
    model_parameters = param_groups(self.model, a.weight_decay) })
  self.is_main = dist.rank() == 0
  if self.is_main and a.output_dir then
    C.makedirs(a.output_dir)
    self.metrics = io.open(a.output_dir .. "/metrics.jsonl", "a")
  end
end

function Trainer:log(rec)
  if not self.is_main then return end
  if self.metrics then
    self.metrics:write(cjson.encode(rec), "\n")
    self.metrics:flush()
  end
end

-- Trains for max_steps (or num_train_epochs); returns {global_step=, train_loss=, ...}.
function Trainer:train()
  self:setup()
  local a, e = self.args, self.engine
  local W = dist.world_size()
  local loader = require("zrun.engine").dataloader(self.train_dataset, { batch_size = a.per_device_train_batch_size,
    rank = dist.rank(), world_size = W, collate_fn = self.collator, seed = a.seed })
  e:train()
  local t_start, t_log, tokens, loss_sum, loss_n = C.now(), C.now(), 0, 0, 0
  local epoch, first_loss, last_loss = 0, nil, nil
  dist.print0(fmt("[zrun] training: %d steps (%d per epoch), %d ranks, micro-batch %d, accumulation %d, ZeRO stage %d, %s",
    self.total_steps, self.steps_per_epoch, W, a.per_device_train_batch_size, a.gradient_accumulation_steps,
    e.stage, e.precision))
  while e.global_steps < self.total_steps do
    loader:set_epoch(epoch)
    for batch in loader:iter() do
      local ids = batch.input_ids
      if e.device ~= "cpu" then ids, batch.labels = ids:to(e.device), batch.labels:to(e.device) end
      local okstep, out = pcall(function()
        local o = e(ids, batch.labels)
        e:backward(o.loss)
        return o
      end)
      if not okstep then error(self:explain_oom(out, ids), 0) end
      local l = out.loss:item()
      loss_sum, loss_n = loss_sum + l, loss_n + 1
      tokens = tokens + ids:numel() * W
      local stepped = e:step()
      if stepped then
        local s = e.global_steps
        if s % a.logging_steps == 0 or s == self.total_steps then
          local t = zr.tensor({ loss_sum / math.max(loss_n, 1) }, { dtype = "f64" })
          dist.all_reduce(t, "avg")
          local avg = t:item()
          first_loss = first_loss or avg
          last_loss = avg
          local now = C.now()
          local tps = tokens / (now - t_log)
          local mem = zr.memory.stats(e.device)
          local eta = (now - t_start) / s * (self.total_steps - s)
          local rec = { step = s, epoch = epoch + 1, loss = avg, lr = e:get_lr()[1], tokens_per_s = tps,
            grad_norm = e.last_grad_norm, memory = mem.total_current, peak_memory = mem.total_peak }
          dist.print0(fmt("step %d/%d | loss %.4f | lr %.3e | %.0f tok/s | mem %s | ETA %s", s, self.total_steps,
            avg, rec.lr, tps, zr.memory.human(mem.total_current), hms(eta)))
          self:log(rec)
          t_log, tokens, loss_sum, loss_n = now, 0, 0, 0
        end
        if s >= self.total_steps then break end
      end
    end
    epoch = epoch + 1
  end
  local res = { global_step = e.global_steps, train_runtime = C.now() - t_start, first_loss = first_loss,
    train_loss = last_loss }
  self:log({ event = "train_end", global_step = res.global_step, train_runtime = res.train_runtime })
  return res
end

-- An out-of-memory error gets the predicted plan and the cheapest settings that fit beside the
-- allocator's per-category breakdown (which the error already carries).
function Trainer:explain_oom(err, ids)
  err = tostring(err)
  if not err:find("out of memory", 1, true) then return err end
  local e = self.engine
  local ok, res = pcall(function()
    local gpu
    if e.device ~= "cpu" and zr._C.cuda then
      local sm = zr._C.cuda.memory_summary(0)
      gpu = sm and sm.device_total
    end
    local plan = require "zrun.memory_plan"
    local cfg = self.model.config
    return plan.fit({ model = cfg, config = e.config, micro_batch = ids:size(1), seq_len = ids:size(2),
      world_size = e.world_size, gpu_memory = gpu or 0, gradient_checkpointing = self.args.gradient_checkpointing })
  end)
  if ok and res and res.text then return err .. "\n\nzrun plan for this run, and settings that fit:\n" .. res.text end
  return err .. "\n\n(run `zrun plan MODEL --fit --gpu-memory SIZE` for settings that fit: " .. tostring(res) .. ")"
end

-- Mean loss over the evaluation set (all ranks) and its perplexity.
function Trainer:evaluate(ds)
  self:setup()
  ds = ds or self.eval_dataset
  if not ds then error("Trainer:evaluate: no eval_dataset", 0) end
  local e = self.engine
  e:eval()
  local W = dist.world_size()
  local sampler = datasets.DistributedSampler.new(#ds.rows, { rank = dist.rank(), world_size = W, shuffle = false })
  local sum, count = 0, 0
  zr.no_grad(function()
    for batch in datasets.batches(ds, sampler, self.args.per_device_eval_batch_size, self.collator) do
      local ids, labels = batch.input_ids, batch.labels
      if e.device ~= "cpu" then ids, labels = ids:to(e.device), labels:to(e.device) end
      local out = e(ids, labels)
      local n = labels:narrow(2, 2, labels:size(2) - 1):ne(-100):to("f64"):sum():item()
      sum, count = sum + out.loss:item() * n, count + n
    end
  end)
  e:train()
  local t = zr.tensor({ sum, count }, { dtype = "f64" })
  dist.all_reduce(t, "sum")
  local tot, cnt = t[1], t[2]
  local loss = cnt > 0 and tot / cnt or 0 / 0
  local res = { eval_loss = loss, perplexity = math.exp(loss), eval_tokens = cnt }
  dist.print0(fmt("[zrun] eval: loss %.4f, perplexity %.2f over %d tokens", loss, res.perplexity, cnt))
  self:log({ event = "eval", eval_loss = loss, perplexity = res.perplexity })
  return res
end

return Trainer
