-- `accelerate launch` with a DeepSpeed accelerate config: the DeepSpeed config each process gets, as
-- accelerate's DeepSpeedPlugin builds it from the launcher's environment (accelerate/utils/dataclasses.py,
-- launch.py prepare_deepspeed_cmd_env), and the recipe and the Trainer taking it where no config is named.
local zr = require "zrun"
local T = zr.testing
local A = require "zrun.accelerate_env"
local cjson = require "cjson"

local function env(t) return function(k) return t[k] end end
local tmp = T.tmpdir()
local z = os.getenv("ZRUN_BIN") or "./zrun"
local function write(name, t)
  local p = tmp .. "/" .. name
  local f = assert(io.open(p, "wb")); f:write(type(t) == "string" and t or cjson.encode(t)); f:close()
  return p
end

T.test("no accelerate DeepSpeed launch: nothing", function()
  T.eq(A.deepspeed_config(nil, env {}), nil)
  T.eq(A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "false", ACCELERATE_DEEPSPEED_ZERO_STAGE = "3" }), nil)
  T.raises(function() A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "maybe" }) end,
    "ACCELERATE_USE_DEEPSPEED=maybe is not a truth value")
end)

T.test("the accelerate config's fields (TRL's deepspeed_zero3.yaml): the plugin's config", function()
  -- zero_stage 3, no offload, zero3_save_16bit_model true, mixed_precision bf16, as accelerate's launcher exports them
  local cfg, what = A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true", ACCELERATE_DEEPSPEED_ZERO_STAGE = "3",
    ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE = "none", ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE = "none",
    ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL = "true", ACCELERATE_DEEPSPEED_ZERO3_INIT = "true",
    ACCELERATE_MIXED_PRECISION = "bf16", ACCELERATE_CONFIG_DS_FIELDS = "zero_stage,offload_optimizer_device" })
  T.same(cfg, { train_batch_size = "auto", train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto",
    gradient_clipping = "auto", steps_per_print = 1e9, bf16 = { enabled = true }, fp16 = { enabled = false },
    zero_optimization = { stage = 3, offload_optimizer = { device = "none" }, offload_param = { device = "none" },
      stage3_gather_16bit_weights_on_model_save = true } })
  T.eq(what, "accelerate's deepspeed_config (ZeRO stage 3, offload optimizer none, param none)")
  -- defaults: stage 2; numbers for accumulation and clipping; fp16; the arguments' precision wins
  cfg = A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "1", ACCELERATE_GRADIENT_ACCUMULATION_STEPS = "4",
    ACCELERATE_GRADIENT_CLIPPING = "0.5", ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE = "cpu", ACCELERATE_MIXED_PRECISION = "fp16" })
  T.eq(cfg.zero_optimization.stage, 2); T.eq(cfg.gradient_accumulation_steps, 4); T.eq(cfg.gradient_clipping, 0.5)
  T.eq(cfg.zero_optimization.offload_optimizer.device, "cpu")
  T.same(cfg.fp16, { enabled = true }); T.same(cfg.bf16, { enabled = false })
  cfg = A.deepspeed_config({ bf16 = true }, env { ACCELERATE_USE_DEEPSPEED = "true", ACCELERATE_MIXED_PRECISION = "no" })
  T.same(cfg.bf16, { enabled = true }, "TrainingArguments' bf16 replaces the launcher's mixed precision, as in transformers")
  T.same(A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true" }).bf16, { enabled = false })
  T.raises(function() A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true", ACCELERATE_MIXED_PRECISION = "fp8" }) end,
    "ACCELERATE_MIXED_PRECISION=fp8: zrun trains in bf16, fp16 or fp32")
  T.raises(function() A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true", ACCELERATE_DEEPSPEED_ZERO_STAGE = "three" }) end,
    "ACCELERATE_DEEPSPEED_ZERO_STAGE=three is not 0, 1, 2 or 3")
end)

T.test("deepspeed_config_file: its \"auto\"s for the plugin's fields filled, accumulation 1 when absent", function()
  local p = write("ds.json", { train_micro_batch_size_per_gpu = "auto", gradient_clipping = "auto",
    bf16 = { enabled = "auto" }, zero_optimization = { stage = "auto", offload_optimizer = { device = "auto" },
      stage3_gather_16bit_weights_on_model_save = "auto" } })
  local cfg, what = A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true", ACCELERATE_DEEPSPEED_CONFIG_FILE = p,
    ACCELERATE_DEEPSPEED_ZERO_STAGE = "3", ACCELERATE_MIXED_PRECISION = "bf16" })
  T.eq(what, "accelerate's deepspeed_config_file (" .. p .. ")")
  T.eq(cfg.gradient_accumulation_steps, 1, "accelerate's rule for a file without it")
  T.eq(cfg.gradient_clipping, "auto", "the plugin's own \"auto\": the Trainer fills it (max_grad_norm)")
  T.eq(cfg.zero_optimization.stage, 3); T.eq(cfg.zero_optimization.offload_optimizer.device, "none")
  T.eq(cfg.zero_optimization.stage3_gather_16bit_weights_on_model_save, false)
  T.eq(cfg.bf16.enabled, true); T.same(cfg.fp16, { enabled = false })
  -- what accelerate refuses
  T.raises(function() A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true", ACCELERATE_DEEPSPEED_CONFIG_FILE = p,
    ACCELERATE_CONFIG_DS_FIELDS = "deepspeed_config_file,zero_stage" }) end,
    "the accelerate config sets zero_stage beside deepspeed_config_file " .. p)
  T.raises(function() A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true",
    ACCELERATE_DEEPSPEED_CONFIG_FILE = write("noz.json", { train_micro_batch_size_per_gpu = 2 }) }) end,
    "has no zero_optimization section (accelerate requires one)")
  T.raises(function() A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true", ACCELERATE_MIXED_PRECISION = "bf16",
    ACCELERATE_DEEPSPEED_CONFIG_FILE = write("fp16.json", { fp16 = { enabled = true }, zero_optimization = { stage = 1 } }) }) end,
    "mixed_precision bf16, but accelerate's deepspeed_config_file")
  T.raises(function() A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true", ACCELERATE_DEEPSPEED_CONFIG_FILE =
    tmp .. "/none.json" }) end, "ACCELERATE_DEEPSPEED_CONFIG_FILE=" .. tmp .. "/none.json: no such file")
  T.raises(function() A.deepspeed_config(nil, env { ACCELERATE_USE_DEEPSPEED = "true", ACCELERATE_DEEPSPEED_CONFIG_FILE =
    write("bad.json", "{") }) end, "is not a JSON object")
end)

-- The recipe under accelerate's environment (one process): its config, its ZeRO stage and precision
local function recipe(vars, extra)
  local p = io.popen(vars .. " " .. z .. " recipes/finetune_llama.lua max_steps=2 logging_steps=1 save_strategy=no " ..
    "eval_strategy=no output_dir=" .. tmp .. "/out " .. (extra or "") .. " 2>&1; echo rc=$?")
  local out = p:read("*a"); p:close()
  return out
end

T.test("the recipe under accelerate launch takes accelerate's DeepSpeed config unless --config names one", function()
  local acc = "ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_ZERO_STAGE=3 ACCELERATE_MIXED_PRECISION=bf16 " ..
    "ACCELERATE_DEEPSPEED_ZERO3_INIT=true"
  local out = recipe(acc)
  assert(out:find("[zrun] Trainer: DeepSpeed config from accelerate launch: deepspeed_config (ZeRO stage 3, offload " ..
    "optimizer none, param none)", 1, true), out)
  assert(out:find("ZeRO stage 3, bf16", 1, true) and out:find("rc=0", 1, true), out)
  assert(out:find("zero3_init_flag: zrun builds each rank's model whole", 1, true), out)
  out = recipe(acc, "--config configs/zero1.json")
  assert(out:find("accelerate's deepspeed_config (ZeRO stage 3, offload optimizer none, param none) not used: " ..
    "TrainingArguments' deepspeed config is (as in transformers)", 1, true), out)
  assert(out:find("ZeRO stage 1", 1, true) and out:find("rc=0", 1, true), out)
  out = recipe("ACCELERATE_USE_DEEPSPEED=true ACCELERATE_MIXED_PRECISION=fp8")
  assert(out:find("accelerate launch: ACCELERATE_MIXED_PRECISION=fp8", 1, true) and out:find("rc=1", 1, true), out)
end)

T.test("accelerate launch without DeepSpeed: its mixed_precision where the arguments set neither bf16 nor fp16", function()
  local code = "local zr = require 'zrun'; zr.manual_seed(1); local tok = zr.tokenizers.ByteTokenizer.new(); " ..
    "local ds = zr.testing.sample_rows(tok):group_texts(32):select(1, 16); zr.Trainer { model = " ..
    "zr.models.llama.LlamaForCausalLM(zr.models.llama.config('zrun/tiny-llama')), train_dataset = ds, args = { " ..
    "max_steps = 1, save_strategy = 'no', output_dir = '" .. tmp .. "/mp', fp16 = FP16 } }:train()"
  local function run(vars, fp16)
    local f = write("mp.lua", (code:gsub("FP16", tostring(fp16))))
    local p = io.popen(vars .. " " .. z .. " " .. f .. " 2>&1; echo rc=$?")
    local out = p:read("*a"); p:close()
    return out
  end
  local out = run("ACCELERATE_MIXED_PRECISION=bf16", false)
  assert(out:find("[zrun] Trainer: bf16 from accelerate launch's mixed_precision (ACCELERATE_MIXED_PRECISION=bf16)", 1, true), out)
  assert(out:find("ZeRO stage 0, bf16", 1, true) and out:find("rc=0", 1, true), out)
  out = run("ACCELERATE_MIXED_PRECISION=bf16", true)
  assert(out:find("ZeRO stage 0, f16", 1, true) and not out:find("mixed_precision", 1, true), "the arguments' fp16 wins: " .. out)
  out = run("ACCELERATE_MIXED_PRECISION=no", false)
  assert(out:find("ZeRO stage 0, f32", 1, true), out)
end)

T.done()
