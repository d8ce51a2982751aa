-- "auto" in a DeepSpeed config, resolved as transformers' HfTrainerDeepSpeedConfig does
-- (trainer_config_process/_finalize) from a table shaped like TrainingArguments (missing arguments take
-- TrainingArguments' defaults), and the Trainer's step arithmetic it uses. config.lua calls it.
local U = require "zrun.config_util"
local M = {}
local floor, ceil, abs = math.floor, math.ceil, math.abs
local fmt = string.format
local type, ipairs = type, ipairs
local show, fmtnum, get, set = U.show, U.fmtnum, U.get, U.set

local ARG_DEFAULTS = {
  per_device_train_batch_size = 8, gradient_accumulation_steps = 1, learning_rate = 5e-5,
  adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8, weight_decay = 0.0,
  warmup_steps = 0, warmup_ratio = 0.0, max_grad_norm = 1.0, bf16 = false, fp16 = false,
  bf16_full_eval = false, fp16_full_eval = false,
  max_steps = -1, num_train_epochs = 3.0,
}
M.ARG_DEFAULTS = ARG_DEFAULTS

-- Micro-batches of mb rows each rank reads in an epoch of n rows, as transformers' Trainer over
-- accelerate reads them: the rows cut into micro-batches (a last shorter one kept, or dropped with
-- dataloader_drop_last), dealt to the ranks in turn, the last round completed (even_batches) or, with
-- drop_last, dropped. (The same count as torch's DistributedSampler, which shards the rows first.)
function M.micro_batches_per_epoch(n, world, mb, drop_last)
  local cut = drop_last and floor or ceil
  return cut(cut(n / mb) / world)
end

-- Optimizer steps per epoch as transformers 5's Trainer runs them: every ga micro-batches, and once
-- more for the epoch's last ga - 1 or fewer (a shorter last accumulation window).
function M.steps_per_epoch(n, world, mb, ga, drop_last)
  return ceil(M.micro_batches_per_epoch(n, world, mb, drop_last) / ga)
end

-- Warmup steps as TrainingArguments.get_warmup_steps: warmup_steps when >= 1 (its integer part);
-- below 1 a fraction of the total steps (transformers 5: ceil(warmup_steps × total)); 0: the
-- older warmup_ratio's ceil(warmup_ratio × total steps).
function M.warmup_steps(warmup_steps, warmup_ratio, total)
  if warmup_steps and warmup_steps >= 1 then return floor(warmup_steps) end
  if warmup_steps and warmup_steps > 0 then return ceil(warmup_steps * total) end
  return ceil((warmup_ratio or 0) * total)
end

local function arg(ctx, name)
  local v = ctx.args[name]
  if v ~= nil then return v, "args." .. name, true end
  return ARG_DEFAULTS[name], fmt("TrainingArguments default %s=%s", name, show(ARG_DEFAULTS[name])), false
end

-- "bf16.enabled" / "fp16.enabled": the argument, or its *_full_eval one (transformers fills the section
-- from args.bf16 or args.bf16_full_eval: under DeepSpeed the engine that trains also evaluates).
local function precision_arg(ctx, name)
  local v, note, explicit = arg(ctx, name)
  if v ~= true and ctx.args[name .. "_full_eval"] == true then return true, "args." .. name .. "_full_eval", true end
  return v, note, explicit
end

-- args.bf16 / args.fp16 true and the file has no such section: the Hugging Face Trainer turns the
-- argument into accelerate's mixed_precision, whose DeepSpeed plugin adds the section as enabled
-- (set_mixed_precision); here it is added as "auto", resolved from the argument with the others. A
-- file that enables the other precision is refused, as accelerate refuses it. Returns an error or nil.
function M.precision_sections(raw, args)
  for _, p in ipairs { { "bf16", "fp16" }, { "fp16", "bf16" } } do
    local want, other = p[1], p[2]
    if args[want] == true then
      local o = raw[other]
      if type(o) == "table" and o.enabled == true then
        return fmt("args.%s = true but the config enables %s (%s.enabled = true): set %s.enabled to \"auto\" " ..
          "or false, or train in %s", want, other, other, other, other)
      end
      if raw[want] == nil then raw[want] = { enabled = "auto" } end
    end
  end
end

-- TrainingArguments.optim values zrun runs, as the DeepSpeed optimizer section the Trainer stands
-- for: the arguments' lr, betas, eps and weight_decay ("auto", as transformers passes them), and the
-- optim_args keys transformers reads for each (its weight_decay there loses to the parameter groups').
local OPTIMS = {
  adamw_torch = { type = "AdamW", auto = { "lr", "betas", "eps", "weight_decay" }, args = {} },
  sgd = { type = "SGD", auto = { "lr", "weight_decay" }, args = { momentum = "number", dampening = "number",
    nesterov = "boolean" } },
  adagrad = { type = "Adagrad", auto = { "lr", "weight_decay" }, args = { lr_decay = "number", eps = "number" } },
}
OPTIMS.adamw_torch_fused = OPTIMS.adamw_torch -- torch's fused kernel: the same update
OPTIMS.adamw_apex_fused = OPTIMS.adamw_torch -- apex's FusedAdam in AdamW mode: the same update
OPTIMS.paged_adamw_32bit = OPTIMS.adamw_torch -- bitsandbytes' 32-bit AdamW (its paging moves memory, not the math)
M.OPTIMS = OPTIMS

-- optim_args as transformers parses it ("momentum=0.9,nesterov=True"): a table of the keys optim
-- takes, or nil and an error.
local function optim_args(name, text, takes)
  local out = {}
  if text == nil or text == false then return out end
  if type(text) ~= "string" then return nil, fmt("optim_args must be a string like \"momentum=0.9,nesterov=True\", got %s", show(text)) end
  for item in text:gsub("%s", ""):gmatch("[^,]+") do
    local k, v = item:match("^([^=]+)=(.*)$")
    if not k then return nil, fmt("optim_args: %s is not key=value", show(item)) end
    if k == "weight_decay" then
      return nil, "optim_args: weight_decay has no effect in transformers (its parameter groups set it): use weight_decay"
    end
    local want = takes[k]
    if not want then
      local names = {}
      for n in pairs(takes) do names[#names + 1] = n end
      table.sort(names)
      return nil, fmt("optim_args: %s takes %s, not %s", name, #names > 0 and table.concat(names, ", ") or "none", show(k))
    end
    if want == "boolean" then out[k] = ({ ["true"] = true, ["1"] = true, yes = true })[v:lower()] == true
    else
      out[k] = tonumber(v)
      if not out[k] then return nil, fmt("optim_args: %s must be a number, got %s", k, show(v)) end
    end
  end
  return out
end

-- The optimizer section the Hugging Face Trainer stands for when args.optim is set (the Trainer
-- always sets it) and the file has none: transformers builds its own optimizer then, from optim,
-- optim_args and the arguments. Returns the section, or nil and an error naming what zrun runs.
function M.optimizer_from_args(args)
  local name = args.optim
  local o = OPTIMS[name]
  if not o then
    return nil, fmt("optim = %s is not an optimizer zrun runs: adamw_torch, adamw_torch_fused, adamw_apex_fused, " ..
      "paged_adamw_32bit, sgd, adagrad (8-bit optimizers change the update; or " ..
      "DeepSpeed's Lion and Lamb through the config's \"optimizer\" section)", show(name))
  end
  local params, err = optim_args(name, args.optim_args, o.args)
  if not params then return nil, err end
  for _, k in ipairs(o.auto) do params[k] = "auto" end
  return { type = o.type, params = params }
end

-- config.load: adds that section to a file without one (raw, changed in place); returns an error,
-- or nil and whether it added the section.
function M.optimizer_section(raw, args)
  if args.optim == nil or raw.optimizer ~= nil then return nil, false end
  local sec, err = M.optimizer_from_args(args)
  if not sec then return err end
  raw.optimizer = sec
  -- transformers' deepspeed_optim_sched voids ZeRO's optimizer check for the optimizer it builds
  if raw.zero_allow_untested_optimizer == nil then raw.zero_allow_untested_optimizer = true end
  return nil, true
end

-- Optimizer steps of the whole run: explicit, args.max_steps, or epochs × updates per epoch
-- (M.steps_per_epoch, the Trainer's arithmetic, at least 1).
local function num_training_steps(ctx, vals)
  if ctx.num_training_steps then return ctx.num_training_steps, "num_training_steps", true end
  local ms, _, explicit = arg(ctx, "max_steps")
  if ms and ms > 0 then return ms, "args.max_steps", explicit end
  local n = ctx.args.train_dataset_size
  local mb, ga = vals.train_micro_batch_size_per_gpu, vals.gradient_accumulation_steps
  if n and type(mb) == "number" and type(ga) == "number" then
    local per_epoch = math.max(M.steps_per_epoch(n, ctx.world_size, mb, ga, ctx.args.dataloader_drop_last), 1)
    local epochs = arg(ctx, "num_train_epochs")
    return ceil(epochs * per_epoch), fmt("%s epochs × %d updates per epoch", fmtnum(epochs), per_epoch), true
  end
  return nil, "needs the number of training steps (args.max_steps, args.train_dataset_size, or config.finalize)"
end

local function hidden_size(ctx)
  if ctx.hidden_size then return ctx.hidden_size end
  return nil, "needs the model's hidden_size (args.hidden_size or config.finalize)"
end

-- The schedule's peak: args.learning_rate, or, where the caller gave none, the lr the config file
-- (or an override) writes (transformers would refuse that file for not matching the argument's
-- default); never optimizer.params.lr's own default (DeepSpeed's 1e-3 when the file has no lr: the
-- Hugging Face integration fills args.learning_rate, 5e-5, and the schedule overrides the group's lr).
local function learning_rate(ctx, vals)
  local v, note, explicit = arg(ctx, "learning_rate")
  local src = ctx.src and ctx.src["optimizer.params.lr"]
  if not explicit and src and (src.kind == "file" or src.kind == "override") then
    local lr = get(vals, "optimizer.params.lr")
    if type(lr) == "number" then return lr, "optimizer.params.lr", false end
  end
  return v, note, explicit
end

-- Each returns value, note, explicit (whether it came from an argument the caller gave), or nil and
-- why it is still pending. The order matters: later ones read earlier results.
local AUTO = {
  { "train_micro_batch_size_per_gpu", function(ctx) return arg(ctx, "per_device_train_batch_size") end },
  { "gradient_accumulation_steps", function(ctx) return arg(ctx, "gradient_accumulation_steps") end },
  { "train_batch_size", function(ctx, vals)
    local mb, n1, e1 = vals.train_micro_batch_size_per_gpu, "train_micro_batch_size_per_gpu", true
    if type(mb) ~= "number" then mb, n1, e1 = arg(ctx, "per_device_train_batch_size") end
    local ga, n2, e2 = vals.gradient_accumulation_steps, "gradient_accumulation_steps", true
    if type(ga) ~= "number" then ga, n2, e2 = arg(ctx, "gradient_accumulation_steps") end
    return mb * ga * ctx.world_size, fmt("%s %d × %s %d × world size %d", n1, mb, n2, ga, ctx.world_size),
      e1 and e2
  end },
  { "gradient_clipping", function(ctx) return arg(ctx, "max_grad_norm") end },
  { "fp16.enabled", function(ctx) return precision_arg(ctx, "fp16") end },
  { "bf16.enabled", function(ctx) return precision_arg(ctx, "bf16") end },
  { "optimizer.params.lr", function(ctx) return arg(ctx, "learning_rate") end },
  { "optimizer.params.betas", function(ctx)
    local b1, _, e1 = arg(ctx, "adam_beta1")
    local b2, _, e2 = arg(ctx, "adam_beta2")
    return { b1, b2 }, (e1 or e2) and "args.adam_beta1, args.adam_beta2" or "TrainingArguments defaults adam_beta1/2",
      e1 or e2
  end },
  { "optimizer.params.eps", function(ctx) return arg(ctx, "adam_epsilon") end },
  { "optimizer.params.weight_decay", function(ctx) return arg(ctx, "weight_decay") end },
  { "scheduler.params.warmup_min_lr", function() return 0, "0, as the Hugging Face integration sets it", false end },
  { "scheduler.params.warmup_max_lr", learning_rate },
  { "scheduler.params.total_num_steps", num_training_steps },
  { "scheduler.params.warmup_num_steps", function(ctx, vals)
    local ws, note, explicit = arg(ctx, "warmup_steps")
    if ws >= 1 then return floor(ws), note, explicit end
    local ratio, rnote, rexp = arg(ctx, "warmup_ratio")
    if ws > 0 then ratio, rnote, rexp = ws, note .. " (a fraction of the steps, as transformers 5 reads it)", explicit end
    if ratio == 0 then return 0, "no warmup (args.warmup_steps and warmup_ratio are 0)", explicit or rexp end
    local total, why, texp = num_training_steps(ctx, vals)
    if not total then return nil, why end
    return M.warmup_steps(0, ratio, total), fmt("ceil(%s × %s steps)", rnote, fmtnum(total)), rexp and texp
  end },
  { "zero_optimization.reduce_bucket_size", function(ctx)
    local h, why = hidden_size(ctx)
    if not h then return nil, why end
    return h * h, fmt("hidden_size² = %d²", h), false
  end },
  { "zero_optimization.stage3_prefetch_bucket_size", function(ctx, vals)
    if vals.zero_optimization.stage ~= 3 then return 5e7, "stage < 3 (unused): DeepSpeed default", false end
    local h, why = hidden_size(ctx)
    if not h then return nil, why end
    return floor(0.9 * h * h), fmt("0.9 × hidden_size² (hidden_size %d)", h), false
  end },
  { "zero_optimization.stage3_param_persistence_threshold", function(ctx, vals)
    if vals.zero_optimization.stage ~= 3 then return 1e5, "stage < 3 (unused): DeepSpeed default", false end
    local h, why = hidden_size(ctx)
    if not h then return nil, why end
    return 10 * h, fmt("10 × hidden_size (%d)", h), false
  end },
}

-- Values the Hugging Face integration compares with the arguments when the file gives a number:
-- a disagreement is an error there, and here. (train_batch_size is left to the batch rule.)
local MATCHED = {
  train_micro_batch_size_per_gpu = true, gradient_accumulation_steps = true, gradient_clipping = true, ["fp16.enabled"] = true, ["bf16.enabled"] = true,
  ["optimizer.params.lr"] = true, ["optimizer.params.betas"] = true, ["optimizer.params.eps"] = true,
  ["optimizer.params.weight_decay"] = true, ["scheduler.params.warmup_max_lr"] = true,
  ["scheduler.params.total_num_steps"] = true, ["scheduler.params.warmup_num_steps"] = true,
}

local function same(a, b)
  if type(a) == "number" and type(b) == "number" then return abs(a - b) <= 1e-12 * math.max(abs(a), abs(b)) end
  if type(a) == "table" and type(b) == "table" then
    if #a ~= #b then return false end
    for i = 1, #a do if not same(a[i], b[i]) then return false end end
    return true
  end
  return a == b
end

-- Resolves the "auto" values of vals at the paths in `which` (nil: all of them) in AUTO's order, and
-- records each one's source in meta.src (or what it waits for in meta.pending). A number the file
-- gives where the Hugging Face integration matches it against an argument the caller gave is
-- compared: returns the disagreements, one line each.
local function resolve_autos(vals, meta, which)
  local ctx = meta.ctx
  ctx.src = meta.src -- (where each value came from: learning_rate reads it)
  local mism = {}
  for _, e in ipairs(AUTO) do
    local path, fn = e[1], e[2]
    if which == nil or which[path] then
      local cur = get(vals, path)
      local src = meta.src[path]
      if cur == "auto" then
        local v, note, explicit = fn(ctx, vals)
        if v == nil then
          meta.src[path] = { kind = "auto", note = "pending: " .. note }
          meta.pending[path] = note
        else
          set(vals, path, v)
          meta.src[path] = { kind = "auto", note = note }
          meta.pending[path] = nil
        end
      elseif cur ~= nil and MATCHED[path] and src and (src.kind == "file" or src.kind == "override") then
        local v, note, explicit = fn(ctx, vals)
        if explicit and v ~= nil and not same(cur, v) then
          mism[#mism + 1] = fmt("%s = %s (%s) but %s = %s", path, show(cur), src.kind, note, show(v))
        end
      end
    end
  end
  return mism
end

-- The TrainingArguments that AUTO's entries above read for a key of the user's config, by that key (the
-- Trainer says which ones a config leaves out: neither set nor "auto")
M.ARG_KEYS = {
  { "max_grad_norm", "gradient_clipping" }, { "learning_rate", "optimizer.params.lr" },
  { "adam_beta1", "optimizer.params.betas" }, { "adam_beta2", "optimizer.params.betas" },
  { "adam_epsilon", "optimizer.params.eps" }, { "weight_decay", "optimizer.params.weight_decay" },
}
M.AUTO, M.resolve_autos = AUTO, resolve_autos
return M
