-- model:generate (zrun.generation) against transformers' generate, from tests/golden/generate.json
-- (tests/golden/make_generate_golden.py, transformers 5.17, f32): greedy ids equal, token for token, on
-- the tiny Llama, Mistral, Qwen2, Qwen3 and GPT-2 (their golden weights, every 2-D weight times the file's
-- weight_scale) for one prompt (the config's eos; transformers 5's default of 20 new tokens; 30 tokens
-- with no eos, past Mistral's sliding window; repetition_penalty) and a left-padded batch with an
-- attention_mask whose first row stops at eos and is padded. The logits processors against
-- transformers' warpers on one row; the cache against the whole rows' forward (use_cache = false), a
-- LoRA model's too; sampling reproducible under zr.manual_seed, top_k = 1 greedy; the training flag
-- restored; generation_config.json's settings taken; the options zrun refuses, refused in one line.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local GP = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "golden_parity.lua")
local gen = require "zrun.generation"

local GOLDEN = "tests/golden/"
local G = cjson.decode(T.read_file(GOLDEN .. "generate.json"))
local tmp = T.tmpdir()
local NAMES = { "llama_tiny", "mistral_tiny", "qwen2_tiny", "qwen3_tiny", "gpt2_tiny" }
local CASES = { "single", "default", "long", "batch", "penalty" }

-- NAME's model loaded with from_pretrained from a folder of its config.json (transformers') and its
-- golden weights, the 2-D ones scaled as the golden script scales them.
local function load(name)
  local g = zr.load_safetensors(GOLDEN .. name .. ".safetensors")
  local sd = {}
  for k, t in pairs(g) do
    if not k:match("^grad%.") and not ({ input_ids = 1, labels = 1, logits = 1, loss = 1, adamw_losses = 1,
      adamw_grad_norms = 1 })[k] then
      sd[k] = t:dim() == 2 and t * G.weight_scale or t
    end
  end
  local dir = GP.model_dir(tmp, name, T.read_file(GOLDEN .. name .. ".config.json"), sd)
  return (name == "gpt2_tiny" and zr.models.gpt2 or zr.models.llama).from_pretrained(dir), dir
end

-- A golden case's options for model:generate.
local function options(c)
  return { max_new_tokens = c.max_new_tokens, attention_mask = c.attention_mask, eos_token_id = c.eos_token_id,
    pad_token_id = c.pad_token_id, repetition_penalty = c.repetition_penalty }
end

local models = {}
for _, name in ipairs(NAMES) do
  models[name] = load(name)
  for _, case in ipairs(CASES) do
    local c = G[name][case]
    T.test(name .. " greedy (" .. case .. ") equals transformers' generate", function()
      local got = models[name]:generate(c.input_ids, options(c)):tolist()
      local same, total = 0, 0
      for b, row in ipairs(c.output) do
        for t = #c.input_ids[1] + 1, #row do
          total = total + 1
          if got[b] and got[b][t] == row[t] then same = same + 1 end
        end
      end
      print(("  %s %s: %d of %d new tokens equal"):format(name, case, same, total))
      T.eq(cjson.encode(got), cjson.encode(c.output), "ids")
    end)
  end
end

-- The processors --------------------------------------------------------------------------------
local P = G.processors
local function close(got, want, what)
  T.eq(#got, #want, what .. " length")
  for i = 1, #want do
    if want[i] == cjson.null then
      T.eq(got[i], -math.huge, what .. " filtered at " .. i)
    else
      T.near(got[i], want[i], 1e-5, 1e-5, what .. " at " .. i)
    end
  end
end
T.test("logits processors equal transformers' warpers on one row", function()
  close(gen.temperature(P.scores, 0.7), P["temperature_0.7"], "temperature 0.7")
  close(gen.top_k(P.scores, 5), P.top_k_5, "top_k 5")
  close(gen.top_p(P.scores, 0.8), P["top_p_0.8"], "top_p 0.8")
  close(gen.top_p(P.scores, 0.3), P["top_p_0.3"], "top_p 0.3")
  close(gen.repetition_penalty(P.scores, P.input_ids, 1.5), P["repetition_penalty_1.5"], "repetition_penalty 1.5")
end)
T.test("top_p keeps the smallest set of ids whose probability reaches top_p", function()
  local s = { math.log(0.5), math.log(0.3), math.log(0.15), math.log(0.05) }
  local function kept(p)
    local n = 0
    for _, v in ipairs(gen.top_p(s, p)) do if v > -math.huge then n = n + 1 end end
    return n
  end
  T.eq(kept(0.5), 1, "0.5: the 0.5 id alone")
  T.eq(kept(0.6), 2, "0.6: 0.5 + 0.3")
  T.eq(kept(0.75), 2, "0.75: 0.5 + 0.3 passes it")
  T.eq(kept(0.81), 3, "0.81")
  T.eq(kept(0.99), 4, "0.99")
end)

-- The cache ---------------------------------------------------------------------------------------
-- (qwen3_tiny: the cached step's own q_norm / k_norm calls against the training forward's)
local CACHE_NAMES = { "llama_tiny", "qwen3_tiny", "gpt2_tiny" }
T.test("the cache gives the whole rows' forward's ids (use_cache = false), and the speed-up", function()
  for _, name in ipairs(CACHE_NAMES) do
    local c = G[name].long
    local t0 = os.clock()
    local a = models[name]:generate(c.input_ids, options(c))
    local t1 = os.clock()
    local o = options(c)
    o.use_cache = false
    local b = models[name]:generate(c.input_ids, o)
    local t2 = os.clock()
    T.eq(cjson.encode(a:tolist()), cjson.encode(b:tolist()), name)
    print(("  %s, 30 new tokens: cache %.3fs, none %.3fs"):format(name, t1 - t0, t2 - t1))
  end
end)

T.test("a LoRA model generates through its adapters: the cache equals its forward and the merged model", function()
  local peft = zr.peft
  for _, name in ipairs(CACHE_NAMES) do
    local m = load(name)
    peft.get_peft_model(m, peft.LoraConfig { r = 4, lora_alpha = 8, target_modules = "all-linear" })
    zr.manual_seed(5)
    zr.no_grad(function()
      for n, p in m:named_parameters() do if n:match("lora_B") then p:copy_(zr.randn(p:shape()) * 0.5) end end
    end)
    local c = G[name].long
    local a = m:generate(c.input_ids, options(c)):tolist()
    T.eq(cjson.encode(a) ~= cjson.encode(c.output), true, name .. ": the adapters change the output")
    local o = options(c)
    o.use_cache = false
    T.eq(cjson.encode(m:generate(c.input_ids, o):tolist()), cjson.encode(a), name .. " without the cache")
    peft.merge_and_unload(m)
    T.eq(cjson.encode(m:generate(c.input_ids, options(c)):tolist()), cjson.encode(a), name .. " merged")
  end
end)

-- Sampling ----------------------------------------------------------------------------------------
T.test("sampling: reproducible under zr.manual_seed, top_k = 1 greedy, seeds differ", function()
  local m, c = models.llama_tiny, G.llama_tiny.long
  local function sample(seed, o)
    zr.manual_seed(seed)
    o.do_sample, o.max_new_tokens, o.eos_token_id = true, 30, false
    return cjson.encode(m:generate(c.input_ids, o):tolist())
  end
  T.eq(sample(1, { top_p = 0.9 }), sample(1, { top_p = 0.9 }), "same seed")
  T.eq(sample(1, { temperature = 2.0 }) ~= sample(2, { temperature = 2.0 }), true, "seeds differ")
  T.eq(sample(3, { top_k = 1, temperature = 0.5 }), cjson.encode(c.output), "top_k 1")
  T.eq(sample(3, { top_p = 1e-6 }), cjson.encode(c.output), "top_p 1e-6")
end)

T.test("generate runs in eval mode without gradients and restores the training flag", function()
  local m = models.gpt2_tiny
  m:train()
  local out = m:generate({ 5, 6, 7 }, { max_new_tokens = 3 })
  T.eq(m.training, true, "training again")
  T.eq(out.requires_grad, false, "no graph")
  T.eq(out:size(2), 6, "3 new tokens")
  for _, p in ipairs(m:parameters()) do T.eq(p.grad, nil, "no gradient") end
  m:eval()
  m:generate({ 5, 6, 7 }, { max_new_tokens = 2 })
  T.eq(m.training, false, "eval stays eval")
end)

T.test("generation_config.json's settings are taken, and the options override them", function()
  local _, dir = load("llama_tiny")
  local c = G.llama_tiny.single
  local stop = c.output[1][12] -- (the 5th new token)
  T.write_file(dir .. "/generation_config.json", cjson.encode { eos_token_id = { 999, stop }, max_length = 20,
    pad_token_id = 0, transformers_version = "5.17.0", num_beams = 1 })
  local m = zr.models.llama.from_pretrained(dir)
  local out = m:generate(c.input_ids):tolist()[1]
  T.eq(#out, 12, "stops at the file's eos")
  T.eq(out[12], stop, "its last token")
  T.eq(#m:generate(c.input_ids, { eos_token_id = false }):tolist()[1], 20, "max_length 20 (prompt included)")
  T.eq(#m:generate(c.input_ids, { eos_token_id = false, max_new_tokens = 3 }):tolist()[1], 10, "max_new_tokens")
  T.write_file(dir .. "/generation_config.json", cjson.encode { num_beams = 4 })
  local beams = zr.models.llama.from_pretrained(dir)
  T.raises(function() beams:generate(c.input_ids) end, "num_beams = 4")
  T.eq(beams:generate(c.input_ids, { generation_config = false, max_new_tokens = 2 }):size(2), 9, "generation_config = false")
end)

T.test("refused in one line: unknown options, sampling options with greedy, right padding, ...", function()
  local m = models.llama_tiny
  T.raises(function() m:generate({ 1, 2 }, { max_new_token = 2 }) end, "did you mean 'max_new_tokens'")
  T.raises(function() m:generate({ 1, 2 }, { num_beams = 2 }) end, "unknown option 'num_beams'")
  T.raises(function() m:generate({ 1, 2 }, { temperature = 0.7 }) end, "do_sample = true")
  T.raises(function() m:generate({ 1, 2 }, { do_sample = true, temperature = 0 }) end, "temperature must be > 0")
  T.raises(function() m:generate({ 1, 2 }, { max_new_tokens = 2, max_length = 9 }) end, "not both")
  T.raises(function() m:generate({ 1, 2, 3 }, { max_length = 3 }) end, "leaves no room")
  T.raises(function() m:generate({ { 1, 2, 0 } }, { attention_mask = { { 1, 1, 0 } } }) end, "padding on the right")
  T.raises(function() m:generate({ { 0, 2, 3 } }, { attention_mask = { { 0, 1, 1 } }, use_cache = false }) end,
    "use_cache = false")
  T.raises(function() m:generate({ { 1, 2 }, { 3 } }) end, "row 2 has 1 ids")
  T.raises(function() models.gpt2_tiny:generate({ 1, 2 }, { max_new_tokens = 70, eos_token_id = false }) end,
    "n_positions 64")
end)

-- The recipe: a model folder with TinyLlama's tokenizer and chat template, a LoRA adapter, chat=true; the
-- text printed is the decoded continuation of the same generate call made here.
local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local tokdir = data .. "/tokenizers/tinyllama-1.1b-chat-v1.0"
T.test("recipes/generate.lua: model, adapter, chat template; prints the continuation", function()
  if not io.open(tokdir .. "/tokenizer.json") then return T.skip("generate recipe", "no " .. tokdir) end
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.vocab_size = 32000
  zr.manual_seed(2)
  local m = zr.models.llama.LlamaForCausalLM(cfg)
  m:save_pretrained(tmp .. "/rmodel")
  assert(os.execute(("cp %s/tokenizer.json %s/tokenizer_config.json %s/special_tokens_map.json %s/rmodel/"):format(
    tokdir, tokdir, tokdir, tmp)) == 0)
  zr.peft.get_peft_model(m, zr.peft.LoraConfig { r = 4, target_modules = "all-linear" })
  zr.no_grad(function()
    for n, p in m:named_parameters() do if n:match("lora_B") then p:copy_(zr.randn(p:shape()) * 0.5) end end
  end)
  zr.peft.save_pretrained(m, tmp .. "/radapter")
  local tok = zr.tokenizers.load(tmp .. "/rmodel")
  local ids = tok:apply_chat_template({ { role = "user", content = "Hi there" } }, { add_generation_prompt = true })
  local out = m:generate(ids, { max_new_tokens = 6, eos_token_id = false }):tolist()[1]
  local want = tok:decode({ unpack(out, #ids + 1) }, true)
  local p = io.popen(("%s recipes/generate.lua model=%s/rmodel adapter=%s/radapter chat=true prompt='Hi there' " ..
    "max_new_tokens=6 2>&1"):format(os.getenv("ZRUN_BIN") or "./zrun", tmp, tmp))
  local printed = p:read("*a")
  p:close()
  assert(printed:find(want, 1, true), ("expected %q in:\n%s"):format(want, printed))
  assert(printed:find(("%d prompt tokens, 6 new"):format(#ids), 1, true), printed)
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
