-- Option tables at the public API's doors: a key the function does not read is refused in one line
-- naming the function, the key and the nearest known one (a misspelt `dtyp` once loaded f32 silently,
-- transformers' `device_map` left the model on the CPU), and the keys it does read still work.
local zr = require "zrun"
local T = zr.testing

local tmp = T.tmpdir()
local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
model:save_pretrained(tmp .. "/m")
local sample = (ZRUN_HOME or ".") .. "/recipes/data/sample.txt"

T.test("zrun.kwargs.check: the function, the key, the nearest known one, the list", function()
  local kw = require "zrun.kwargs"
  T.raises(function() kw.check("f", { dtyp = 1 }, { "dtype", "device" }) end,
    "f: unknown option 'dtyp' (did you mean 'dtype'?); it takes device, dtype")
  T.raises(function() kw.check("f", { zzz = 1 }, { "dtype" }) end, "f: unknown option 'zzz'; it takes dtype")
  T.raises(function() kw.check("f", "bf16", { "dtype" }) end, "f: options must be a table {name = value}, got string")
  T.same(kw.check("f", nil, { "a" }), {})
  T.same(kw.pick({ a = 1, b = 2 }, { "a", "c" }), { a = 1 })
end)

T.test("loading and saving models: from_pretrained, hf.*, save_pretrained, save_16bit_model", function()
  T.raises(function() zr.models.llama.from_pretrained(tmp .. "/m", { dtyp = "bf16" }) end,
    "from_pretrained: unknown option 'dtyp' (did you mean 'dtype'?)")
  T.raises(function() zr.models.llama.from_pretrained(tmp .. "/m", { device_map = "cuda" }) end,
    "from_pretrained: unknown option 'device_map' (did you mean 'device'?)")
  T.raises(function() zr.models.llama.from_pretrained(tmp .. "/m", { torch_dtype = "bf16" }) end,
    "(did you mean 'dtype'?)")
  T.raises(function() zr.models.gpt2.from_pretrained(tmp .. "/m", { revison = "main" }) end,
    "from_pretrained: unknown option 'revison' (did you mean 'revision'?)")
  T.eq(zr.models.llama.from_pretrained(tmp .. "/m", { dtype = "bf16", threads = 2 }):parameters()[1]:dtype(), "bf16")
  -- transformers' dtype = "auto": config.json's dtype, else the files' (here a bf16 copy whose config has none)
  T.eq(zr.models.llama.from_pretrained(tmp .. "/m", { dtype = "auto" }):parameters()[1]:dtype(), "f32")
  zr.models.llama.from_pretrained(tmp .. "/m", { dtype = "bfloat16" }):save_pretrained(tmp .. "/mb")
  T.eq(zr.models.llama.from_pretrained(tmp .. "/mb", { dtype = "auto" }):parameters()[1]:dtype(), "bf16")
  local c = require("cjson").decode(T.read_file(tmp .. "/mb/config.json"))
  c.dtype, c.torch_dtype = nil, nil
  local f = io.open(tmp .. "/mb/config.json", "w"); f:write(require("cjson").encode(c)); f:close()
  T.eq(zr.models.llama.from_pretrained(tmp .. "/mb", { dtype = "auto" }):parameters()[1]:dtype(), "bf16", "the files' dtype")
  T.raises(function() zr.models.llama.from_pretrained(tmp .. "/mb", { dtype = "bfloat" }) end,
    "from_pretrained: unknown dtype bfloat (f32, bf16")
  T.raises(function() zr.hf.load_state_dict(tmp .. "/m", { devic = "cpu" }) end, "hf.load_state_dict: unknown option 'devic'")
  T.raises(function() zr.hf.load_pretrained(tmp .. "/m", { nmes = {} }) end, "hf.load_pretrained: unknown option 'nmes'")
  T.raises(function() zr.hf.resolve(tmp .. "/m", { dtype = "f32" }) end, "hf.resolve: unknown option 'dtype'; it takes cache_dir, revision")
  T.raises(function() zr.hf.read_config(tmp .. "/m", { cachedir = "x" }) end, "hf.read_config: unknown option 'cachedir'")
  local sd = zr.hf.load_state_dict(tmp .. "/m", { dtype = "bf16", names = { "model.norm.weight" } })
  T.eq(sd["model.norm.weight"]:dtype(), "bf16")
  T.raises(function() model:save_pretrained(tmp .. "/m2", { max_shard = "1GB" }) end,
    "save_pretrained: unknown option 'max_shard' (did you mean 'max_shard_size'?)")
  T.raises(function() model:save_pretrained(tmp .. "/m2", { safe_serialization = false }) end,
    "save_pretrained: safe_serialization = false (pickle files): zrun writes safetensors only")
  model:save_pretrained(tmp .. "/m2", { safe_serialization = true, max_shard_size = "1GB" })
  local engine = zr.initialize { model = model, config = { train_micro_batch_size_per_gpu = 1 } }
  T.raises(function() engine:save_16bit_model(tmp .. "/m3", { exclude_frozen = true }) end,
    "save_16bit_model: unknown option 'exclude_frozen'; it takes exclude_frozen_parameters")
  T.raises(function() zr.initialize { model = model, config = {}, modle_parameters = {} } end,
    "zr.initialize: unknown option 'modle_parameters' (did you mean 'model_parameters'?)")
end)

T.test("tokenizers, datasets, the collator and the sampler", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  T.raises(function() tok:encode("hi", { add_special_tokens = false }) end,
    "add_special_tokens must be true or false, got a table (the arguments are positional)")
  T.eq(#tok:encode("hi", false), 2)
  T.raises(function() zr.tokenizers.load(tmp .. "/none", { pipline = "x" }) end,
    "tokenizers.load: unknown option 'pipline' (did you mean 'pipeline'?)")
  T.raises(function() zr.datasets.load_dataset(sample, { spilt = "train" }) end,
    "load_dataset: unknown option 'spilt' (did you mean 'split'?)")
  local ds = zr.datasets.load_dataset(sample, { split = "train[:4]" })
  T.eq(#ds, 4)
  T.raises(function() ds:map(function(r) return r end, { num_proc = 4 }) end, "Dataset:map: unknown option 'num_proc'")
  T.eq(#ds:map(function(r) return { n = #r.text } end, { keep = true, desc = "Count" }), 4)
  T.raises(function() zr.datasets.causal_lm_collator { pad_token_ids = 0 } end,
    "causal_lm_collator: unknown option 'pad_token_ids' (did you mean 'pad_token_id'?)")
  T.raises(function() zr.datasets.DistributedSampler.new(8, { num_replicas = 2 }) end,
    "DistributedSampler.new: unknown option 'num_replicas'")
end)

T.test("tensors, layers, schedules, progress bars and collectives", function()
  T.raises(function() zr.zeros({ 2 }, { dtyp = "f32" }) end, "zr.zeros: unknown option 'dtyp'; it takes dtype, device, requires_grad")
  T.raises(function() zr.tensor({ 1 }, { devices = "cpu" }) end, "zr.tensor: unknown option 'devices'")
  T.raises(function() zr.full({ 2 }, 1, { dtpye = "f32" }) end, "zr.full: unknown option 'dtpye'")
  T.raises(function() zr.arange(4, { requires_grad = true }) end, "zr.arange: unknown option 'requires_grad'")
  T.raises(function() zr.ones({ 2 }):to { dtype = "bf16", non_blocking = true } end, "t:to: unknown option 'non_blocking'")
  T.eq(zr.randn({ 2 }, { dtype = "f64", requires_grad = true }).requires_grad, true)
  local ids = zr.tensor({ { 5, 6, 7 } }, { dtype = "i64" })
  T.raises(function() model(ids, ids, { label_smoothin = 0.1 }) end,
    "LlamaForCausalLM:forward: unknown option 'label_smoothin' (did you mean 'label_smoothing'?)")
  T.eq(model(ids, ids, { label_smoothing = 0.1 }).loss:numel(), 1)
  T.raises(function() zr.cross_entropy(zr.zeros({ 2, 4 }), zr.tensor({ 1, 2 }, { dtype = "i64" }), { ignore_idx = -1 }) end,
    "cross_entropy: unknown option 'ignore_idx'; it takes ignore_index, reduction, label_smoothing, inplace")
  T.raises(function() zr.rope_tables(4, 8, { base = 10000 }) end, "rope_tables: unknown option 'base'")
  T.raises(function() local q = zr.zeros({ 1, 1, 2, 4 }); zr.scaled_dot_product_attention(q, q, q, { causal = true }) end,
    "scaled_dot_product_attention: unknown option 'causal'")
  zr.save_safetensors(tmp .. "/t.safetensors", { x = zr.ones({ 2 }) })
  T.raises(function() zr.load_safetensors(tmp .. "/t.safetensors", { name = { "x" } }) end,
    "load_safetensors: unknown option 'name'; it takes dtype, device, names")
  T.raises(function() zr.nn.Linear(2, 3, { bais = false }) end, "Linear: unknown option 'bais' (did you mean 'bias'?)")
  T.eq(zr.nn.Linear(2, 3, { bias = false }).bias, nil)
  T.raises(function() zr.nn.Embedding(4, 2, { max_norm = 1 }) end, "Embedding: unknown option 'max_norm'")
  T.raises(function() zr.nn.RMSNorm(4, { epsilon = 1e-5 }) end, "RMSNorm: unknown option 'epsilon'")
  T.raises(function() zr.nn.LayerNorm(4, { elementwise = false }) end, "LayerNorm: unknown option 'elementwise'")
  T.raises(function() zr.nn.CrossEntropyLoss { ignore_idx = 0 } end, "CrossEntropyLoss: unknown option 'ignore_idx'")
  T.raises(function() zr.schedulers.hf("linear", nil, { warmup_steps = 2, num_training_steps = 4, lr = 1 }) end,
    "schedulers.hf: unknown option 'warmup_steps'")
  T.raises(function() zr.memory.describe(model, { quite = true }) end, "memory.describe: unknown option 'quite'")
  T.raises(function() require("zrun.plot").show({ records = {} }, { svgs = "x.svg" }) end, "plot: unknown option 'svgs'")
  T.raises(function() zr.progress.new { totl = 3 } end, "progress: unknown option 'totl' (did you mean 'total'?)")
  T.raises(function() zr.dist.all_reduce(zr.ones({ 2 }), { async = true }) end,
    "dist collective: unknown option 'async' (did you mean 'async_op'?)")
  local t = zr.ones({ 2 })
  zr.dist.all_reduce(t, { async_op = true }):wait()
end)

T.done()
