-- model:generate on a GPU: greedy ids on CUDA in f32 equal the CPU's and transformers' (tests/golden/generate.json,
-- the tiny Llama, Qwen2, Qwen3 and GPT-2, one prompt and a left-padded batch), with the cache and without it; a LoRA
-- model's too; bf16 generates the asked number of tokens, in the vocabulary, reproducibly under one seed.
-- `./zrun tests/cuda/test_generate_cuda.lua`; prints SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../ops/cuda_common.lua")
if C.skip_without_gpu("generate on CUDA") then return end
local zr, T = C.zr, C.T
local cjson = require "cjson"
local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/golden_parity.lua")

local GOLDEN = "tests/golden/"
local G = cjson.decode(T.read_file(GOLDEN .. "generate.json"))
local tmp = T.tmpdir()
local SKIP = { input_ids = 1, labels = 1, logits = 1, loss = 1, adamw_losses = 1, adamw_grad_norms = 1 }

-- NAME's golden model (2-D weights scaled as the golden script scales them) from a folder, on device in dtype.
local dirs = {}
local function load(name, device, dtype)
  if not dirs[name] then
    local g, sd = zr.load_safetensors(GOLDEN .. name .. ".safetensors"), {}
    for k, t in pairs(g) do
      if not k:match("^grad%.") and not SKIP[k] then sd[k] = t:dim() == 2 and t * G.weight_scale or t end
    end
    dirs[name] = GP.model_dir(tmp, name, T.read_file(GOLDEN .. name .. ".config.json"), sd)
  end
  local mod = name == "gpt2_tiny" and zr.models.gpt2 or zr.models.llama
  return mod.from_pretrained(dirs[name], { device = device, dtype = dtype or "f32" })
end

local function options(c, extra)
  local o = { max_new_tokens = c.max_new_tokens, attention_mask = c.attention_mask, eos_token_id = c.eos_token_id,
    pad_token_id = c.pad_token_id, repetition_penalty = c.repetition_penalty }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end
local function ids(t) return cjson.encode(t:to("cpu"):tolist()) end

for _, name in ipairs { "llama_tiny", "qwen2_tiny", "qwen3_tiny", "gpt2_tiny" } do
  T.test(name .. ": greedy on CUDA f32 equals the CPU's and transformers' ids", function()
    local gpu, cpu = load(name, "cuda"), load(name, "cpu")
    for _, case in ipairs { "long", "batch", "penalty" } do
      local c = G[name][case]
      local g = gpu:generate(c.input_ids, options(c))
      T.eq(g:device():match("^cuda") ~= nil, true, case .. ": on the model's device")
      T.eq(ids(g), ids(cpu:generate(c.input_ids, options(c))), case .. ": CPU")
      T.eq(ids(g), cjson.encode(c.output), case .. ": transformers")
      if case == "long" then
        T.eq(ids(gpu:generate(c.input_ids, options(c, { use_cache = false }))), ids(g), case .. ": without the cache")
      end
    end
  end)
end

T.test("a LoRA model on CUDA generates as on the CPU", function()
  local out = {}
  for _, dev in ipairs { "cpu", "cuda" } do
    local m = load("llama_tiny", dev)
    zr.peft.get_peft_model(m, zr.peft.LoraConfig { r = 4, lora_alpha = 8, target_modules = "all-linear" })
    -- both adapters' matrices drawn on the CPU under one seed (get_peft_model's own draw of lora_A
    -- follows the generator's state, which differs between the two passes)
    zr.manual_seed(5)
    zr.no_grad(function()
      for n, p in m:named_parameters() do if n:match("lora_[AB]") then p:copy_((zr.randn(p:shape()) * 0.5):to(dev)) end end
    end)
    local c = G.llama_tiny.long
    out[dev] = ids(m:generate(c.input_ids, options(c)))
  end
  T.eq(out.cuda, out.cpu, "ids")
end)

T.test("bf16 on CUDA: the tokens asked for, in the vocabulary, the same under one seed", function()
  local m = load("llama_tiny", "cuda", "bf16")
  local c = G.llama_tiny.batch
  local function run()
    zr.manual_seed(11)
    return m:generate(c.input_ids, options(c, { do_sample = true, top_k = 20, eos_token_id = false }))
  end
  local a = run()
  T.eq(a:size(2), #c.input_ids[1] + c.max_new_tokens, "length")
  for _, row in ipairs(a:to("cpu"):tolist()) do
    for _, id in ipairs(row) do T.eq(id >= 0 and id < 259, true, "id " .. id) end
  end
  T.eq(ids(run()), ids(a), "reproducible")
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
