-- `accelerate launch` with a DeepSpeed accelerate config (distributed_type: DEEPSPEED, as TRL's
-- examples/accelerate_configs/deepspeed_zero3.yaml) hands each process its DeepSpeed settings in the
-- environment, and transformers' Trainer takes its DeepSpeed config from there when
-- TrainingArguments.deepspeed is unset. This builds that config as accelerate's DeepSpeedPlugin does
-- (accelerate/utils/dataclasses.py): ACCELERATE_DEEPSPEED_CONFIG_FILE's JSON, its "auto"s for the
-- plugin's fields filled from the environment; else a config of the environment's fields (ZeRO stage,
-- default 2; offload devices; accumulation and clipping, default "auto"; the 16-bit save at stage 3);
-- then ACCELERATE_MIXED_PRECISION's bf16 / fp16 section where the config has none.
--   local cfg, what = require("zrun.accelerate_env").deepspeed_config()  -- nil: not such a launch
local cjson = require "cjson"
local M = {}
local fmt = string.format

local function bad(msg, ...) error("accelerate launch: " .. fmt(msg, ...), 0) end

-- accelerate's str_to_bool
local TRUE = { y = true, yes = true, t = true, ["true"] = true, on = true, ["1"] = true }
local FALSE = { n = true, no = true, f = true, ["false"] = true, off = true, ["0"] = true }
local function flag(getenv, k, default)
  local v = getenv(k)
  if v == nil or v == "" then return default end
  if TRUE[v:lower()] then return true elseif FALSE[v:lower()] then return false end
  bad("%s=%s is not a truth value (true / false)", k, v)
end

-- The plugin's fields, each with its DeepSpeed key (dotted)
local MAP = {
  { "gradient_accumulation_steps", "gradient_accumulation_steps" },
  { "gradient_clipping", "gradient_clipping" },
  { "zero_stage", "zero_optimization.stage" },
  { "offload_optimizer_device", "zero_optimization.offload_optimizer.device" },
  { "offload_param_device", "zero_optimization.offload_param.device" },
  { "offload_param_nvme_path", "zero_optimization.offload_param.nvme_path" },
  { "offload_optimizer_nvme_path", "zero_optimization.offload_optimizer.nvme_path" },
  { "zero3_save_16bit_model", "zero_optimization.stage3_gather_16bit_weights_on_model_save" },
}

local function plugin_fields(getenv)
  local gas = getenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS") or "auto"
  local clip = getenv("ACCELERATE_GRADIENT_CLIPPING") or "auto"
  local f = {
    gradient_accumulation_steps = gas:match("^%d+$") and tonumber(gas) or gas,
    gradient_clipping = clip == "auto" and clip or tonumber(clip),
    zero_stage = tonumber(getenv("ACCELERATE_DEEPSPEED_ZERO_STAGE") or "2"),
    offload_optimizer_device = getenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE") or "none",
    offload_param_device = getenv("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE") or "none",
    offload_optimizer_nvme_path = getenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH") or "none",
    offload_param_nvme_path = getenv("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH") or "none",
    zero3_save_16bit_model = (getenv("ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL") or "false"):lower() == "true",
  }
  if f.gradient_clipping == nil then bad("ACCELERATE_GRADIENT_CLIPPING=%s is not a number", clip) end
  if f.zero_stage == nil then bad("ACCELERATE_DEEPSPEED_ZERO_STAGE=%s is not 0, 1, 2 or 3", getenv("ACCELERATE_DEEPSPEED_ZERO_STAGE")) end
  return f
end

local function from_file(path, f, getenv)
  -- (accelerate refuses the accelerate config's own DeepSpeed fields beside a config file)
  local IGNORED = { gradient_accumulation_steps = true, gradient_clipping = true, zero_stage = true,
    offload_optimizer_device = true, offload_param_device = true, offload_param_nvme_path = true,
    offload_optimizer_nvme_path = true, zero3_save_16bit_model = true, mixed_precision = true }
  for name in (getenv("ACCELERATE_CONFIG_DS_FIELDS") or ""):gmatch("[^,]+") do
    if IGNORED[name] then
      bad("the accelerate config sets %s beside deepspeed_config_file %s; set it in the DeepSpeed config file and " ..
        "remove it from the accelerate config (accelerate refuses the two together)", name, path)
    end
  end
  local fh = io.open(path, "rb")
  if not fh then bad("ACCELERATE_DEEPSPEED_CONFIG_FILE=%s: no such file", path) end
  local ok, cfg = pcall(cjson.decode, fh:read("*a"))
  fh:close()
  if not ok or type(cfg) ~= "table" then bad("ACCELERATE_DEEPSPEED_CONFIG_FILE=%s is not a JSON object", path) end
  if cfg.gradient_accumulation_steps == nil then cfg.gradient_accumulation_steps = 1 end -- (accelerate's rule)
  if type(cfg.zero_optimization) ~= "table" then
    bad("%s has no zero_optimization section (accelerate requires one); add \"zero_optimization\": {\"stage\": N}", path)
  end
  local U = require "zrun.config_util"
  for _, m in ipairs(MAP) do -- the plugin's values go where the file says "auto" (fill_match, must_match=False)
    if U.get(cfg, m[2]) == "auto" then U.set(cfg, m[2], f[m[1]]) end
  end
  return cfg
end

local function from_fields(f)
  local z = { stage = f.zero_stage, offload_optimizer = { device = f.offload_optimizer_device },
    offload_param = { device = f.offload_param_device }, stage3_gather_16bit_weights_on_model_save = f.zero3_save_16bit_model }
  if f.offload_optimizer_device == "nvme" then z.offload_optimizer.nvme_path = f.offload_optimizer_nvme_path end
  if f.offload_param_device == "nvme" then z.offload_param.nvme_path = f.offload_param_nvme_path end
  return { train_batch_size = "auto", train_micro_batch_size_per_gpu = "auto",
    gradient_accumulation_steps = f.gradient_accumulation_steps, gradient_clipping = f.gradient_clipping or nil,
    zero_optimization = z }
end

-- DeepSpeedPlugin.set_mixed_precision: the precision's section where the config has none, a config that
-- enables the other one refused, absent sections disabled
local function mixed_precision(cfg, mp, where)
  if mp == nil or mp == "" or mp == "no" then mp = "no"
  elseif mp == "fp8" then
    bad("ACCELERATE_MIXED_PRECISION=fp8: zrun trains in bf16, fp16 or fp32; set mixed_precision: bf16 in the accelerate config")
  elseif mp ~= "bf16" and mp ~= "fp16" then
    bad("ACCELERATE_MIXED_PRECISION=%s is not no, fp16 or bf16", mp)
  end
  -- (accelerate's fp16 section also has auto_cast = true, DeepSpeed's cast of floating inputs to fp16: a
  -- language model's inputs are token ids, and zrun would only warn that it has no effect)
  if mp == "fp16" and cfg.fp16 == nil then cfg.fp16 = { enabled = true } end
  if mp == "bf16" and cfg.bf16 == nil then cfg.bf16 = { enabled = true } end
  if mp ~= "no" then
    local other = mp == "fp16" and "bf16" or "fp16"
    local on = type(cfg[other]) == "table" and tostring(cfg[other].enabled):lower() == "true"
    if on then bad("mixed_precision %s, but %s enables %s; make the two agree", mp, where, other) end
  end
  for _, d in ipairs { "fp16", "bf16" } do
    if cfg[d] == nil then cfg[d] = { enabled = false } end
    if type(cfg[d]) == "table" and cfg[d].enabled == "auto" then cfg[d].enabled = d == mp end
  end
end

-- The DeepSpeed config of an `accelerate launch` that uses DeepSpeed (ACCELERATE_USE_DEEPSPEED true), as
-- a table, and a phrase naming where it came from; nil when the launch is not one. args: the
-- TrainingArguments, whose fp16 / bf16 replace ACCELERATE_MIXED_PRECISION as transformers' do; getenv: a
-- function name -> value (default os.getenv), for tests. Raises "accelerate launch: ..." on what
-- accelerate refuses.
-- Whether this process was started by `accelerate launch` with DeepSpeed (ACCELERATE_USE_DEEPSPEED true).
function M.active(getenv) return flag(getenv or os.getenv, "ACCELERATE_USE_DEEPSPEED", false) end

function M.deepspeed_config(args, getenv)
  getenv, args = getenv or os.getenv, args or {}
  if not M.active(getenv) then return nil end
  local f = plugin_fields(getenv)
  local file = getenv("ACCELERATE_DEEPSPEED_CONFIG_FILE")
  local cfg, what
  if file and file ~= "" and file ~= "none" then
    cfg, what = from_file(file, f, getenv), fmt("accelerate's deepspeed_config_file (%s)", file)
  else
    cfg, what = from_fields(f), fmt("accelerate's deepspeed_config (ZeRO stage %s, offload optimizer %s, param %s)",
      tostring(f.zero_stage), f.offload_optimizer_device, f.offload_param_device)
  end
  mixed_precision(cfg, args.fp16 and "fp16" or args.bf16 and "bf16" or getenv("ACCELERATE_MIXED_PRECISION"), what)
  cfg.steps_per_print = 1e9 -- (accelerate silences DeepSpeed's own step lines: the Trainer logs)
  return cfg, what
end

-- Whether accelerate's zero3_init_flag asks for the model to be built partitioned (deepspeed.zero.Init)
function M.zero3_init(getenv)
  getenv = getenv or os.getenv
  return M.active(getenv) and flag(getenv, "ACCELERATE_DEEPSPEED_ZERO3_INIT", false)
end

-- Without DeepSpeed: accelerate's mixed_precision ("bf16" or "fp16") where the arguments set neither bf16
-- nor fp16 (TrainingArguments keeps ACCELERATE_MIXED_PRECISION then), else nil.
function M.mixed_precision(args, getenv)
  local mp = (getenv or os.getenv)("ACCELERATE_MIXED_PRECISION")
  if not args.bf16 and not args.fp16 and (mp == "bf16" or mp == "fp16") then return mp end
end

return M
