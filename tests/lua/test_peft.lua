-- zr.peft (LoRA as Hugging Face PEFT makes it): the adapter's forward by hand in double, gradients only to
-- lora_A / lora_B, a tiny Llama that learns through zr.SFTTrainer{peft_config=} with and without gradient
-- checkpointing, the adapter files round trip, merge_and_unload, GPT-2's Conv1D, the Trainer's save_model,
-- checkpoints and resume, ZeRO stages 0-3, and the refusals. Against the real PEFT and TRL:
-- tests/golden/check_peft.py.
local zr = require "zrun"
local T = zr.testing
local peft = zr.peft
local nn = zr.nn

local tmp = T.tmpdir()
local cfg = zr.models.llama.config("zrun/tiny-llama")
local function llama(seed)
  zr.manual_seed(seed or 7)
  return zr.models.llama.LlamaForCausalLM(cfg)
end
local ids = zr.tensor({ { 1, 5, 9, 20, 30, 41, 7 }, { 3, 8, 100, 101, 2, 60, 61 } }):to("i64")
local function logits(m) return zr.no_grad(function() return m(ids).logits end) end
local function maxdiff(a, b) return (a:to("f64") - b:to("f64")):abs():max():item() end
-- every lora_B random, so the adapter is not a no-op
local function randomize_B(m, seed)
  zr.manual_seed(seed or 3)
  zr.no_grad(function()
    for _, l in ipairs(peft.lora_layers(m)) do l[2].lora_B.weight:copy_(zr.randn(l[2].lora_B.weight:shape()) * 0.1) end
  end)
end

T.test("PEFT's regex matching (re.fullmatch) for a string target_modules", function()
  assert(peft.fullmatch(".*\\.(q_proj|v_proj)", "model.layers.0.self_attn.q_proj"))
  assert(not peft.fullmatch(".*\\.(q_proj|v_proj)", "model.layers.0.self_attn.k_proj"))
  assert(not peft.fullmatch("q_proj", "model.layers.0.self_attn.q_proj"), "a full match, not a search")
  assert(peft.fullmatch("model\\.layers\\.[01]\\.mlp\\.(?:up|down)_proj", "model.layers.1.mlp.down_proj"))
  assert(not peft.fullmatch("model\\.layers\\.[01]\\.mlp\\.(?:up|down)_proj", "model.layers.2.mlp.down_proj"))
  assert(peft.fullmatch("model\\.layers\\.\\d+\\.self_attn\\.[^o]_proj", "model.layers.12.self_attn.k_proj"))
  assert(peft.fullmatch("a{2,3}b?", "aaa") and not peft.fullmatch("a{2,3}b?", "aaaa"))
  T.raises(function() peft.fullmatch("(?P<x>a)", "a") end, "the group form")
end)

T.test("LoraConfig: PEFT's defaults; unknown keys and unimplemented fields refused, one line each", function()
  local c = peft.LoraConfig {}
  T.eq(c.r, 8); T.eq(c.lora_alpha, 8); T.eq(c.lora_dropout, 0); T.eq(c.bias, "none"); T.eq(c.init_lora_weights, true)
  T.eq(c.task_type, nil, "PEFT's default task_type is None")
  local cj = require "cjson"
  T.eq(c:to_dict().init_lora_weights, true); T.eq(c:to_dict().task_type, cj.null, "None as null")
  T.eq(peft.LoraConfig({ init_lora_weights = false }):to_dict().init_lora_weights, false, "written false (PEFT's)")
  T.eq(peft.LoraConfig({ init_lora_weights = "gaussian" }):to_dict().init_lora_weights, "gaussian")
  T.raises(function() peft.LoraConfig { lora_alpa = 16 } end, "unknown field 'lora_alpa' (did you mean 'lora_alpha'?)")
  T.raises(function() peft.LoraConfig { use_dora = true } end, "use_dora (DoRA) is not implemented")
  T.raises(function() peft.LoraConfig { bias = "some" } end, "bias must be \"none\", \"all\" or \"lora_only\"")
  T.raises(function() peft.LoraConfig { modules_to_save = "lm_head" } end, "modules_to_save must be a list")
  T.raises(function() peft.LoraConfig { rank_pattern = { q_proj = 1.5 } } end,
    "rank_pattern[\"q_proj\"] must be an integer >= 1")
  T.raises(function() peft.LoraConfig { lora_bias = true } end, "lora_bias")
  T.raises(function() peft.LoraConfig { init_lora_weights = "pissa" } end, "init_lora_weights \"pissa\" is not implemented")
  T.raises(function() peft.LoraConfig { task_type = "SEQ_CLS" } end, "task_type \"SEQ_CLS\" is not implemented")
  T.raises(function() peft.LoraConfig { r = 0 } end, "r must be an integer number >= 1")
  T.raises(function() peft.LoraConfig { lora_dropout = 1 } end, "lora_dropout must be a number in [0, 1)")
  T.raises(function() peft.LoraConfig { layers_pattern = "layers" } end, "layers_pattern is read with layers_to_transform")
  T.raises(function() peft.LoraConfig { target_modules = ".*q_proj", layers_to_transform = { 0 } } end,
    "layers_to_transform does not apply to a regex")
  local out = T.printed(function() peft.LoraConfig { megatron_core = "x" } end)
  assert(out:find("megatron_core has no effect in zrun", 1, true), out)
  T.raises(function() peft.get_peft_model(llama(), peft.LoraConfig { target_modules = { "norm" } }) end,
    "target module model.norm is a RMSNorm: zrun's LoRA adapts nn.Linear, Conv1D and Embedding modules only")
  T.raises(function() peft.get_peft_model(llama(), peft.LoraConfig { target_modules = { "qproj" } }) end,
    "target modules {qproj} not found in the base model")
  T.raises(function() peft.get_peft_model(llama(), peft.LoraConfig { target_modules = "q_proj" }) end,
    "a string is a regex matched against the whole dotted name (PEFT's re.fullmatch); pass a list { \"q_proj\" }")
  local m = peft.get_peft_model(llama(), peft.LoraConfig {})
  T.raises(function() peft.get_peft_model(m, peft.LoraConfig {}) end, "already has a LoRA adapter")
end)

T.test("get_peft_model: targets as PEFT matches them; base names kept, frozen; PEFT's trainable-parameter line", function()
  local m = peft.get_peft_model(llama(), peft.LoraConfig { r = 4, lora_alpha = 8 })
  local names = {}
  for _, l in ipairs(peft.lora_layers(m)) do names[#names + 1] = l[1] end
  T.eq(table.concat(names, " "), "model.layers.0.self_attn.q_proj model.layers.0.self_attn.v_proj " ..
    "model.layers.1.self_attn.q_proj model.layers.1.self_attn.v_proj", "PEFT's Llama default: q_proj, v_proj")
  local trainable = {}
  for n, p in m:named_parameters() do if p.requires_grad then trainable[#trainable + 1] = n end end
  T.eq(#trainable, 8)
  for _, n in ipairs(trainable) do assert(n:match("%.lora_[AB]%.weight$"), n) end
  local has = {}
  for n in m:named_parameters() do has[n] = true end
  assert(has["model.layers.0.self_attn.q_proj.weight"], "the base weight keeps its name")
  T.eq(m.model.layers[1].self_attn.q_proj.lora_A.weight:shape()[1], 4)
  T.eq(m.model.layers[1].self_attn.q_proj.lora_B.weight:shape()[1], 64)
  -- lora_B(4x(64+64) + ... ): 2 layers x (q: 4*64 + 64*4, v: 4*64 + 32*4)
  local n = 2 * ((4 * 64 + 64 * 4) + (4 * 64 + 32 * 4))
  local line = T.printed(function() m:print_trainable_parameters() end)
  local all = m:num_parameters()
  T.eq(line, ("trainable params: %s || all params: %s || trainable%%: %.4f"):format(
    tostring(n):reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", ""),
    tostring(all):reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", ""), 100 * n / all))
  -- "all-linear": every Linear but the output layer; a list, a regex, exclude_modules, layers_to_transform
  local al = peft.get_peft_model(llama(), peft.LoraConfig { target_modules = "all-linear" })
  T.eq(#peft.lora_layers(al), 14)
  T.eq(table.concat(al.peft_config.target_modules, ","), "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj")
  local rx = peft.get_peft_model(llama(), peft.LoraConfig { target_modules = "model\\.layers\\.1\\.mlp\\.(up|down)_proj" })
  T.eq(#peft.lora_layers(rx), 2)
  local ex = peft.get_peft_model(llama(), peft.LoraConfig { target_modules = { "q_proj", "k_proj" },
    exclude_modules = { "layers.1.self_attn.k_proj" } })
  T.eq(#peft.lora_layers(ex), 3)
  local lt = peft.get_peft_model(llama(), peft.LoraConfig { target_modules = { "o_proj" }, layers_to_transform = 1 })
  T.eq(peft.lora_layers(lt)[1][1], "model.layers.1.self_attn.o_proj")
  T.eq(#peft.lora_layers(lt), 1)
  local lp = peft.get_peft_model(llama(), peft.LoraConfig { target_modules = { "o_proj" }, layers_to_transform = { 0 },
    layers_pattern = "layers" })
  T.eq(peft.lora_layers(lp)[1][1], "model.layers.0.self_attn.o_proj")
  -- a full name in the list is adapted whatever layers_to_transform says (PEFT 0.21's check_target_module_exists)
  local full = peft.get_peft_model(llama(), peft.LoraConfig { target_modules = { "model.layers.0.self_attn.o_proj",
    "q_proj" }, layers_to_transform = { 1 } })
  local fl = {}
  for _, l in ipairs(peft.lora_layers(full)) do fl[#fl + 1] = l[1] end
  T.eq(table.concat(fl, " "), "model.layers.0.self_attn.o_proj model.layers.1.self_attn.q_proj")
  T.raises(function() peft.LoraConfig { layers_to_transform = 0, layers_pattern = "lay.*" } end, "not a regex")
end)

T.test("forward: = the base at init (B zero) exactly; with B random = base + scaling x A^T B^T (by hand, f64)", function()
  zr.manual_seed(5)
  local host = nn.Module()
  host.proj = nn.Linear(6, 5)
  local x = zr.randn({ 3, 6 })
  local base = zr.no_grad(function() return host.proj(x) end)
  peft.get_peft_model(host, peft.LoraConfig { r = 2, lora_alpha = 3, target_modules = { "proj" } })
  local l = host.proj
  T.eq(maxdiff(zr.no_grad(function() return host.proj(x) end), base), 0, "B = 0: exactly the base output")
  zr.no_grad(function() l.lora_B.weight:copy_(zr.randn({ 5, 2 })) end)
  local y = zr.no_grad(function() return host.proj(x) end)
  local X, W, b, A, B = x:flat_table(), l.weight:flat_table(), l.bias:flat_table(), l.lora_A.weight:flat_table(),
    l.lora_B.weight:flat_table()
  local want = {}
  for i = 0, 2 do
    for o = 0, 4 do
      local s = b[o + 1]
      for k = 0, 5 do s = s + X[i * 6 + k + 1] * W[o * 6 + k + 1] end
      for r = 0, 1 do
        local a = 0
        for k = 0, 5 do a = a + X[i * 6 + k + 1] * A[r * 6 + k + 1] end
        s = s + 1.5 * a * B[o * 2 + r + 1]
      end
      want[#want + 1] = s
    end
  end
  local got = y:flat_table()
  for i = 1, #want do T.near(got[i], want[i], 1e-5, 1e-5, "output " .. i) end
  -- use_rslora: lora_alpha / sqrt(r)
  T.near(peft.get_peft_model(llama(), peft.LoraConfig { r = 4, lora_alpha = 8, use_rslora = true })
    .model.layers[1].self_attn.q_proj.scaling, 4, 0, 0)
  -- the Llama: the adapted model at init gives the base model's logits exactly (the unfused path for the
  -- adapted projections); with B random they differ (the adapter is not bypassed by a fused path)
  local m = llama()
  local ref = logits(m)
  peft.get_peft_model(m, peft.LoraConfig { target_modules = "all-linear" })
  T.eq(maxdiff(logits(m), ref), 0, "adapter at init: the base logits")
  randomize_B(m)
  assert(maxdiff(logits(m), ref) > 1e-3, "random B changes the logits")
end)

T.test("gradients reach lora_A and lora_B only (base grads nil), with and without gradient checkpointing", function()
  local grads = {}
  for _, gc in ipairs { false, true } do
    local base = llama()
    -- (the PEFT recipe's calls: enable_input_require_grads is transformers', a no-op in zrun)
    if gc then T.eq(base:gradient_checkpointing_enable():enable_input_require_grads(), base) end
    local m = peft.get_peft_model(base, peft.LoraConfig { target_modules = "all-linear" })
    randomize_B(m)
    m:train()
    local out = m(ids, ids)
    zr.backward(out.loss)
    local g = {}
    for n, p in m:named_parameters() do
      if n:match("lora_[AB]") then
        assert(p.grad, n .. " has no gradient" .. (gc and " (gradient checkpointing)" or ""))
        assert(p.grad:abs():max():item() > 0, n .. ": gradient zero")
        g[n] = p.grad:flat_table()
      else
        assert(p.grad == nil, n .. " (frozen) got a gradient")
      end
    end
    grads[#grads + 1] = g
  end
  for n, g in pairs(grads[1]) do
    for i = 1, #g do T.near(grads[2][n][i], g[i], 1e-6, 1e-5, n .. " with checkpointing") end
  end
end)

-- The SFT set of test_sft.lua: each answer a function of its question.
local tok = zr.tokenizers.ByteTokenizer.new()
tok:set_chat_template("{% for m in messages %}{% if m.role == 'assistant' %}{{ 'A: ' }}{% generation %}" ..
  "{{ m.content + eos_token }}{% endgeneration %}{% else %}{{ 'U: ' + m.content + '\\n' }}{% endif %}{% endfor %}")
local function qa_rows()
  local rows = {}
  for i, w in ipairs { "red", "blue", "green", "cyan", "pink", "gold", "gray", "teal" } do
    rows[i] = { messages = { { role = "user", content = "colour " .. i }, { role = "assistant", content = w } } }
  end
  return zr.datasets.Dataset.from_rows(rows)
end
-- (lm_head adapted too: a random base's frozen head (std 0.02) cannot make logits large enough to learn)
local TARGETS = { "q_proj", "v_proj", "o_proj", "up_proj", "down_proj", "lm_head" }
local function sft(args, model)
  local a = { output_dir = tmp .. "/sft", save_strategy = "no", logging_steps = 1, per_device_train_batch_size = 4,
    learning_rate = 2e-2, lr_scheduler_type = "constant", max_steps = 60, assistant_only_loss = true,
    train_sampling_strategy = "sequential", bf16 = false }
  for k, v in pairs(args or {}) do a[k] = v end
  return zr.SFTTrainer { model = model or llama(), train_dataset = qa_rows(), processing_class = tok, args = a,
    peft_config = peft.LoraConfig { r = 8, lora_alpha = 16, target_modules = TARGETS } }
end
local function hist(t)
  local h = {}
  for _, r in ipairs(t.state.log_history) do if r.loss then h[#h + 1] = r end end
  return h
end

for _, gc in ipairs { true, false } do
  T.test("SFTTrainer{peft_config=} learns: loss falls 60%, grad_norm > 0 every step (gradient_checkpointing " ..
    tostring(gc) .. ")", function()
    local t = sft { gradient_checkpointing = gc }
    local base = {}
    for n, p in t.model:named_parameters() do if not n:match("lora_") then base[n] = p:flat_table() end end
    t:train()
    local h = hist(t)
    assert(h[#h].loss < 0.4 * h[1].loss, ("loss %.4f -> %.4f: not 60%% lower"):format(h[1].loss, h[#h].loss))
    for _, r in ipairs(h) do assert(r.grad_norm > 0, "grad_norm 0 at step " .. r.step) end
    for n, p in t.model:named_parameters() do
      if base[n] then T.eq_list(p:flat_table(), base[n], n .. " (frozen) changed") end
    end
  end)
end

T.test("SFTTrainer refuses a model that already has an adapter, and a peft_config that is not a LoraConfig", function()
  local m = peft.get_peft_model(llama(), peft.LoraConfig {})
  T.raises(function() sft({}, m) end, "the model already has a LoRA adapter and a peft_config was passed too")
  T.raises(function()
    zr.SFTTrainer { model = llama(), train_dataset = qa_rows(), processing_class = tok, peft_config = { r = 8 },
      args = { output_dir = tmp .. "/x" } }
  end, "peft_config must be a zr.peft.LoraConfig")
end)

T.test("save_pretrained -> from_pretrained: PEFT's files, bit for bit; wrong adapters refused", function()
  local m = peft.get_peft_model(llama(), peft.LoraConfig { r = 4, lora_alpha = 8, target_modules = "all-linear" })
  randomize_B(m)
  local want = logits(m)
  local d = tmp .. "/adapter"
  m:save_pretrained(d)
  local f = zr._C.safetensors_open(d .. "/adapter_model.safetensors")
  local keys = f:keys()
  f:close()
  T.eq(#keys, 28)
  local found = false
  for _, k in ipairs(keys) do found = found or k == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" end
  assert(found, "PEFT's key names")
  local c = require("cjson").decode(T.read_file(d .. "/adapter_config.json"))
  T.eq(c.peft_type, "LORA"); T.eq(c.r, 4); T.eq(c.lora_alpha, 8); T.eq(c.inference_mode, true)
  T.eq(table.concat(c.target_modules, ","), "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj")
  T.eq(c.auto_mapping.base_model_class, "LlamaForCausalLM", "no task_type: PEFT's auto_mapping")
  local back = peft.from_pretrained(llama(), d)
  T.eq(maxdiff(logits(back), want), 0, "the same logits, bit for bit")
  for n, p in back:named_parameters() do assert(not p.requires_grad, n .. ": is_trainable false freezes the adapter") end
  local tr = peft.from_pretrained(llama(), d, { is_trainable = true })
  assert(tr.model.layers[1].self_attn.q_proj.lora_A.weight.requires_grad, "is_trainable = true")
  -- another r, another target set, another method
  local m8 = peft.get_peft_model(llama(), peft.LoraConfig { r = 8, target_modules = "all-linear" })
  m8:save_pretrained(tmp .. "/r8")
  local cj = T.read_file(tmp .. "/r8/adapter_config.json")
  T.write_file(tmp .. "/r8/adapter_config.json", (cj:gsub('"r": 8', '"r": 4')))
  T.raises(function() peft.from_pretrained(llama(), tmp .. "/r8") end, "the adapter was made with another r")
  local mq = peft.get_peft_model(llama(), peft.LoraConfig { target_modules = { "q_proj" } })
  mq:save_pretrained(tmp .. "/q")
  T.write_file(tmp .. "/q/adapter_config.json", (T.read_file(tmp .. "/q/adapter_config.json")
    :gsub('"q_proj"', '"k_proj"')))
  T.raises(function() peft.from_pretrained(llama(), tmp .. "/q") end, "does not match the model's adapter: missing")
  T.write_file(tmp .. "/q/adapter_config.json", (T.read_file(tmp .. "/q/adapter_config.json"):gsub('"LORA"', '"IA3"')))
  T.raises(function() peft.from_pretrained(llama(), tmp .. "/q") end, "zrun loads LoRA adapters only")
  T.raises(function() peft.from_pretrained(llama(), tmp .. "/nothing") end, "no adapter_config.json")
end)

T.test("merge_and_unload: the adapted logits (1e-5), plain modules back (fused paths), a normal HF directory", function()
  local m = peft.get_peft_model(llama(), peft.LoraConfig { r = 4, lora_alpha = 8, target_modules = "all-linear",
    use_rslora = true })
  randomize_B(m)
  local want = logits(m)
  local q = m.model.layers[1].self_attn.q_proj
  local A, B, W = q.lora_A.weight:to("f64"), q.lora_B.weight:to("f64"), q.weight:to("f64")
  m:merge_and_unload()
  local merged = logits(m)
  assert(maxdiff(merged, want) < 1e-5, "merged logits differ by " .. maxdiff(merged, want))
  local mq = m.model.layers[1].self_attn.q_proj
  assert(mq.forward == nn.Linear.forward, "a plain nn.Linear again")
  assert(maxdiff(mq.weight, W + zr.matmul(B, A) * (8 / 2)) < 1e-6, "W + scaling B A")
  assert(not peft.is_peft_model(m) and #peft.lora_layers(m) == 0)
  m:save_pretrained(tmp .. "/merged")
  local back = zr.models.llama.from_pretrained(tmp .. "/merged")
  T.eq(maxdiff(logits(back), merged), 0, "the merged model's HF directory")
end)

T.test("GPT-2's Conv1D (fan_in_fan_out): forward by hand, merge, round trip", function()
  local gpt2 = zr.models.gpt2
  zr.manual_seed(9)
  local g = gpt2.GPT2LMHeadModel { n_embd = 12, n_layer = 2, n_head = 2, vocab_size = 29, n_positions = 16,
    resid_pdrop = 0, embd_pdrop = 0, attn_pdrop = 0 }
  local gids = zr.tensor({ { 1, 2, 3, 4, 5 } }):to("i64")
  local ref = zr.no_grad(function() return g(gids).logits end)
  local out = T.printed(function() peft.get_peft_model(g, peft.LoraConfig { r = 2, lora_alpha = 4 }) end)
  assert(out:find("fan_in_fan_out set to true for Conv1D", 1, true), out)
  T.eq(g.peft_config.fan_in_fan_out, true)
  T.eq(#peft.lora_layers(g), 2, "PEFT's GPT-2 default: c_attn")
  T.eq(maxdiff(zr.no_grad(function() return g(gids).logits end), ref), 0)
  randomize_B(g)
  local l = g.transformer.h[1].attn.c_attn
  local x = zr.randn({ 2, 12 })
  local y = zr.no_grad(function() return l(x) end)
  local want = zr.no_grad(function()
    local xa = zr.matmul(x, l.lora_A.weight:transpose(1, 2))
    return zr.matmul(x, l.weight) + l.bias + zr.matmul(xa, l.lora_B.weight:transpose(1, 2)) * 2
  end)
  assert(maxdiff(y, want) < 1e-5, "Conv1D LoRA forward")
  local adapted = zr.no_grad(function() return g(gids).logits end)
  g:save_pretrained(tmp .. "/gpt2a")
  zr.manual_seed(9)
  local g2 = gpt2.GPT2LMHeadModel { n_embd = 12, n_layer = 2, n_head = 2, vocab_size = 29, n_positions = 16,
    resid_pdrop = 0, embd_pdrop = 0, attn_pdrop = 0 }
  peft.from_pretrained(g2, tmp .. "/gpt2a")
  T.eq(maxdiff(zr.no_grad(function() return g2(gids).logits end), adapted), 0, "round trip")
  g:merge_and_unload()
  assert(maxdiff(zr.no_grad(function() return g(gids).logits end), adapted) < 1e-5, "merged Conv1D")
end)

T.test("adapter_config.json's base_model_name_or_path: what from_pretrained read the base from, as PEFT", function()
  -- (PEFT writes the base's name_or_path; AutoPeftModelForCausalLM.from_pretrained(adapter_dir) loads the base from it)
  local base, gbase = tmp .. "/named_llama", tmp .. "/named_gpt2"
  llama():save_pretrained(base)
  zr.models.gpt2.GPT2LMHeadModel { n_embd = 12, n_layer = 1, n_head = 2, vocab_size = 29, n_positions = 16 }
    :save_pretrained(gbase)
  for dir, family in pairs { [base] = zr.models.llama, [gbase] = zr.models.gpt2 } do
    local m = peft.get_peft_model(family.from_pretrained(dir), peft.LoraConfig { r = 2, target_modules = "all-linear" })
    m:save_pretrained(tmp .. "/named")
    T.eq(require("cjson").decode(T.read_file(tmp .. "/named/adapter_config.json")).base_model_name_or_path, dir)
  end
  local m = peft.get_peft_model(llama(), peft.LoraConfig { r = 2 })
  m:save_pretrained(tmp .. "/unnamed")
  T.eq(require("cjson").decode(T.read_file(tmp .. "/unnamed/adapter_config.json")).base_model_name_or_path,
    require("cjson").null, "a model built from a config has no name: null, as PEFT")
end)

T.test("save_pretrained / merge_and_unload: PEFT's keyword arguments honoured or refused, none dropped", function()
  local m = peft.get_peft_model(llama(), peft.LoraConfig { r = 2, target_modules = { "q_proj", "v_proj" } })
  randomize_B(m)
  local want = logits(m)
  T.eq(#m:save_pretrained(tmp .. "/kw", { safe_serialization = true, selected_adapters = { "default" } }), 2)
  T.eq(#m:save_pretrained(tmp .. "/kw_other_rank", { is_main_process = false }), 0)
  T.eq(zr._C.path_type(tmp .. "/kw_other_rank"), nil, "is_main_process = false: nothing written")
  T.raises(function() m:save_pretrained(tmp .. "/kw", { safe_serialization = false }) end, "safetensors only")
  T.raises(function() m:save_pretrained(tmp .. "/kw", { selected_adapters = { "other" } }) end, "one adapter")
  T.raises(function() m:save_pretrained(tmp .. "/kw", { save_embedding_layers = "yes" }) end,
    "save_embedding_layers must be \"auto\", true or false")
  T.raises(function() m:save_pretrained(tmp .. "/kw", { max_shard_size = "1GB" }) end, "unknown option")
  local said, back = T.printed(peft.from_pretrained, llama(), tmp .. "/kw", { adapter_name = "default", low_cpu_mem_usage = true })
  assert(said:find("low_cpu_mem_usage has no effect in zrun", 1, true), said) -- (said, not taken in silence)
  T.eq(maxdiff(logits(back), want), 0, "from_pretrained's adapter_name / low_cpu_mem_usage")
  T.raises(function() peft.from_pretrained(llama(), tmp .. "/kw", { adapter_name = "sql" }) end,
    "adapter_name \"sql\": zrun holds one adapter")
  -- save_embedding_layers = true with no embedding targeted: the embeddings' weights as named (PEFT's keys)
  m:save_pretrained(tmp .. "/kw_emb", { save_embedding_layers = true })
  local fh = zr._C.safetensors_open(tmp .. "/kw_emb/adapter_model.safetensors")
  local info = fh:info()
  fh:close()
  assert(info["base_model.model.model.embed_tokens.weight"] and info["base_model.model.lm_head.weight"], "both saved")
  T.raises(function() m:merge_and_unload { adapter_names = { "other" } } end, "one adapter")
  T.raises(function() m:merge_and_unload { safe_mrege = true } end, "did you mean 'safe_merge'")
  -- safe_merge: an adapter holding a NaN is refused, nothing merged; a finite one merges as without it
  local q = m.model.layers[1].self_attn.q_proj
  local keep = q.lora_B.weight:clone()
  zr.no_grad(function() q.lora_B.weight:fill_(0 / 0) end)
  local w0 = m.model.layers[2].self_attn.v_proj.weight:clone()
  T.raises(function() m:merge_and_unload { safe_merge = true } end, "safe_merge: NaNs or infinities in " ..
    "model.layers.0.self_attn.q_proj")
  assert(peft.is_peft_model(m), "still adapted")
  T.eq(maxdiff(m.model.layers[2].self_attn.v_proj.weight, w0), 0, "nothing merged")
  zr.no_grad(function() q.lora_B.weight:copy_(keep) end)
  m:merge_and_unload { safe_merge = true, adapter_names = { "default" }, progressbar = true }
  assert(not peft.is_peft_model(m))
  assert(maxdiff(logits(m), want) < 1e-5, "merged")
end)

T.test("from_pretrained reads the base weights PEFT saves beside the adapter (save_embedding_layers)", function()
  -- (PEFT writes them when lm_head / embed_tokens is a target, "<module>.base_layer.weight", or with
  -- save_embedding_layers = true, "model.embed_tokens.weight", and PeftModel.from_pretrained reads them into the base)
  local m = peft.get_peft_model(llama(), peft.LoraConfig { r = 2, target_modules = { "q_proj" } })
  randomize_B(m)
  local d = tmp .. "/with_base"
  m:save_pretrained(d)
  local sd = peft.adapter_state_dict(m)
  local q = m.model.layers[1].self_attn.q_proj
  zr.manual_seed(5)
  local qw, ew = q.weight + zr.randn(q.weight:shape()) * 0.1, m.model.embed_tokens.weight * 2
  sd["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"] = qw
  sd["base_model.model.model.embed_tokens.weight"] = ew
  zr._C.save_safetensors(d .. "/adapter_model.safetensors", sd, { format = "pt" })
  local back = peft.from_pretrained(llama(), d)
  T.eq(maxdiff(back.model.layers[1].self_attn.q_proj.weight, qw), 0, "the targeted module's base weight")
  T.eq(maxdiff(back.model.embed_tokens.weight, ew), 0, "a module that is not a target")
  zr.no_grad(function() q.weight:copy_(qw); m.model.embed_tokens.weight:copy_(ew) end)
  T.eq(maxdiff(logits(back), logits(m)), 0)
  sd["base_model.model.model.no_such.weight"] = ew
  zr._C.save_safetensors(d .. "/adapter_model.safetensors", sd, { format = "pt" })
  T.raises(function() peft.from_pretrained(llama(), d) end, "unexpected base_model.model.model.no_such.weight")
end)

-- (the numbers below are PEFT 0.21.2's, printed by get_peft_model on transformers 5.17's LlamaForCausalLM /
-- GPT2LMHeadModel of the same shapes; tests/golden/check_peft.py compares the rest with PEFT itself)
T.test("rank_pattern / alpha_pattern: PEFT's r and scaling per module (its get_pattern_key)", function()
  local m = peft.get_peft_model(llama(), peft.LoraConfig { r = 4, lora_alpha = 8, target_modules = { "q_proj", "v_proj",
    "o_proj" }, rank_pattern = { q_proj = 2, ["layers.1.self_attn.v_proj"] = 6 },
    alpha_pattern = { o_proj = 3, ["model\\.layers\\.0.*q_proj"] = 5 }, modules_to_save = { "lm_head", "embed_tokens" } })
  local got = {}
  for _, l in ipairs(peft.lora_layers(m)) do got[#got + 1] = ("%s %d %.6g"):format(l[1]:gsub("^model%.", ""), l[2].r, l[2].scaling) end
  T.eq(table.concat(got, "; "), "layers.0.self_attn.q_proj 2 2.5; layers.0.self_attn.v_proj 4 2; " ..
    "layers.0.self_attn.o_proj 4 0.75; layers.1.self_attn.q_proj 2 4; layers.1.self_attn.v_proj 6 1.33333; " ..
    "layers.1.self_attn.o_proj 4 0.75")
  -- (PEFT's all params count the frozen originals of modules_to_save beside their trained copies)
  T.eq(T.printed(function() m:print_trainable_parameters() end),
    "trainable params: 35,648 || all params: 161,280 || trainable%: 22.1032")
  T.raises(function() peft.get_peft_model(llama(), peft.LoraConfig { target_modules = { "q_proj" },
    rank_pattern = { q_proj = 2, ["self_attn.q_proj"] = 3 } }) end, "both match model.layers.0.self_attn.q_proj")
end)

T.test("the memory plan refuses what it does not model (the Trainer then plans a full fine-tune)", function()
  local P = require "zrun.memory_plan"
  for _, c in ipairs { { { modules_to_save = { "lm_head" } }, "lora.modules_to_save is not planned" },
    { { rank_pattern = { q_proj = 16 } }, "lora.rank_pattern is not planned" },
    { { bias = "all" }, "lora.bias = \"all\" is not planned" } } do
    T.raises(function() P.plan { model = "zrun/tiny-llama", lora = peft.LoraConfig(c[1]) } end, c[2])
  end
end)

T.test("modules_to_save: trained whole, saved under PEFT's names, read back, kept by merge_and_unload", function()
  local m = peft.get_peft_model(llama(), peft.LoraConfig { r = 4, target_modules = { "q_proj", "lm_head" },
    modules_to_save = { "lm_head" } })
  T.eq(#peft.lora_layers(m), 2, "a module of modules_to_save is not adapted (PEFT excludes it)")
  T.eq(m.lm_head.weight.requires_grad, true)
  T.eq(m.model.embed_tokens.weight.requires_grad, false)
  local out = m(ids, ids)
  out.loss:backward()
  assert(m.lm_head.weight.grad and m.lm_head.weight.grad:abs():sum():item() > 0, "lm_head gets a gradient")
  randomize_B(m)
  zr.no_grad(function() m.lm_head.weight:add_(zr.randn(m.lm_head.weight:shape()) * 0.1) end)
  local sd = peft.adapter_state_dict(m)
  assert(sd["base_model.model.lm_head.weight"], "PEFT's key for the trained copy")
  m:save_pretrained(tmp .. "/mts")
  local back = peft.from_pretrained(llama(), tmp .. "/mts")
  T.eq(maxdiff(logits(back), logits(m)), 0, "the trained lm_head read back")
  T.eq(back.lm_head.weight.requires_grad, false, "is_trainable false: frozen, as PEFT")
  local want = logits(m)
  m:merge_and_unload()
  T.near(maxdiff(logits(m), want), 0, 1e-5, 0, "merged: the trained lm_head stays")
  T.raises(function() peft.get_peft_model(llama(), peft.LoraConfig { modules_to_save = { "self_attn" } }) end,
    "and modules_to_save (PEFT adapts no module inside one of them)")
  T.raises(function() peft.get_peft_model(llama(), peft.LoraConfig { modules_to_save = { "no_such" } }) end,
    "modules_to_save \"no_such\" matches no module")
  local tcfg = zr.models.llama.config("zrun/tiny-llama")
  tcfg.tie_word_embeddings = true
  local tied = zr.models.llama.LlamaForCausalLM(tcfg)
  T.raises(function() peft.get_peft_model(tied, peft.LoraConfig { modules_to_save = { "lm_head" } }) end,
    "its output head is the tied embedding: zrun has no lm_head module; set ensure_weight_tying = true")
  T.raises(function() peft.get_peft_model(tied, peft.LoraConfig { modules_to_save = { "embed_tokens" } }) end,
    "the embedding is tied to the output head; PEFT would train an untied copy")
  T.raises(function() peft.get_peft_model(tied, peft.LoraConfig { target_modules = { "embed_tokens" },
    ensure_weight_tying = true }) end, "ensure_weight_tying with a LoRA on the tied embedding model.embed_tokens")
end)

T.test("a tied embedding in modules_to_save with ensure_weight_tying: embedding and head trained as one, as PEFT", function()
  local tcfg = zr.models.llama.config("zrun/tiny-llama")
  tcfg.tie_word_embeddings = true
  -- (PEFT 0.21.2's numbers, keys and rewritten modules_to_save for these shapes; check_peft.py compares the logits)
  for _, c in ipairs { { { "embed_tokens" }, "embed_tokens,model.embed_tokens" }, { { "lm_head" }, "model.embed_tokens" } } do
    zr.manual_seed(7)
    local m = peft.get_peft_model(zr.models.llama.LlamaForCausalLM(tcfg), peft.LoraConfig { r = 4,
      target_modules = { "q_proj" }, modules_to_save = c[1], ensure_weight_tying = true })
    T.eq(T.printed(function() m:print_trainable_parameters() end),
      "trainable params: 17,600 || all params: 126,656 || trainable%: 13.8959")
    T.eq(table.concat(m.peft_config.modules_to_save, ","), c[2], "PEFT's modules_to_save after tying")
    local keys = {}
    for k in pairs(peft.adapter_state_dict(m)) do if not k:find("lora_") then keys[#keys + 1] = k end end
    table.sort(keys)
    T.eq(table.concat(keys, " "), "base_model.model.lm_head.weight base_model.model.model.embed_tokens.weight")
    m(ids, ids).loss:backward()
    assert(m.model.embed_tokens.weight.grad, "the embedding (and with it the head) trains")
    zr.no_grad(function() m.model.embed_tokens.weight:add_(0.1) end) -- (so that the read-back shows it)
    m:save_pretrained(tmp .. "/tied_mts")
    zr.manual_seed(7)
    local back = peft.from_pretrained(zr.models.llama.LlamaForCausalLM(tcfg), tmp .. "/tied_mts")
    T.eq(maxdiff(logits(back), logits(m)), 0, "read back")
  end
  -- GPT-2 (tied wte): lm_head in modules_to_save ties to wte; a LoRA on wte is not tied (PEFT does not know the name)
  local function gpt2() return zr.models.gpt2.GPT2LMHeadModel { n_embd = 12, n_layer = 2, n_head = 2, vocab_size = 29,
    n_positions = 16 } end
  local g = peft.get_peft_model(gpt2(), peft.LoraConfig { r = 4, modules_to_save = { "lm_head" }, ensure_weight_tying = true })
  T.eq(T.printed(function() g:print_trainable_parameters() end),
    "trainable params: 732 || all params: 5,064 || trainable%: 14.4550")
  T.eq(table.concat(g.peft_config.modules_to_save, ","), "transformer.wte")
  local gl = peft.get_peft_model(gpt2(), peft.LoraConfig { r = 4, target_modules = { "wte", "c_attn" },
    ensure_weight_tying = true })
  T.eq(T.printed(function() gl:print_trainable_parameters() end),
    "trainable params: 548 || all params: 4,880 || trainable%: 11.2295")
end)

T.test("bias \"all\" / \"lora_only\": PEFT's trained biases, counts and adapter keys (GPT-2)", function()
  local want = { all = "trainable params: 660 || all params: 4,716 || trainable%: 13.9949",
    lora_only = "trainable params: 456 || all params: 4,716 || trainable%: 9.6692" }
  for _, b in ipairs { "all", "lora_only" } do
    local g = zr.models.gpt2.GPT2LMHeadModel { n_embd = 12, n_layer = 2, n_head = 2, vocab_size = 29, n_positions = 16 }
    peft.get_peft_model(g, peft.LoraConfig { r = 4, bias = b })
    T.eq(T.printed(function() g:print_trainable_parameters() end), want[b], b)
    local keys = {}
    for k in pairs(peft.adapter_state_dict(g)) do if not k:find("lora_") then keys[#keys + 1] = k end end
    table.sort(keys)
    T.eq(#keys, b == "all" and 13 or 2, b)
    T.eq(keys[1], "base_model.model.transformer.h.0.attn.c_attn.base_layer.bias", b .. ": PEFT's name")
    zr.no_grad(function() g.transformer.h[1].attn.c_attn.bias:add_(1) end)
    g:save_pretrained(tmp .. "/bias_" .. b)
    local g2 = zr.models.gpt2.GPT2LMHeadModel { n_embd = 12, n_layer = 2, n_head = 2, vocab_size = 29, n_positions = 16 }
    peft.from_pretrained(g2, tmp .. "/bias_" .. b)
    T.eq(maxdiff(g2.transformer.h[1].attn.c_attn.bias, g.transformer.h[1].attn.c_attn.bias), 0, b .. ": read back")
  end
end)

T.test("PEFT's model methods: disable_adapter (the base's logits), unload, get_base_model, peft_config.default",
  function()
  local base = llama()
  local m = peft.get_peft_model(llama(), peft.LoraConfig { target_modules = "all-linear" })
  randomize_B(m)
  local adapted = logits(m)
  local off, extra = m:disable_adapter(function() return logits(m), 5 end)
  T.eq(maxdiff(off, logits(base)), 0, "adapter off: the base's logits")
  T.eq(extra, 5, "fn's results returned")
  T.eq(maxdiff(logits(m), adapted), 0, "on again after")
  T.raises(function() m:disable_adapter(function() error("inside") end) end, "inside")
  T.eq(maxdiff(logits(m), adapted), 0, "on again after an error")
  T.eq(m.peft_config.default.r, 8, "PEFT's peft_config[\"default\"]")
  T.eq(m:get_base_model(), m)
  local saved = peft.get_peft_model(llama(), peft.LoraConfig { modules_to_save = { "lm_head" } })
  T.raises(function() saved:disable_adapter(function() end) end, "disable_adapter: the model has modules_to_save")
  m:unload()
  T.eq(maxdiff(logits(m), logits(base)), 0, "unload: the base back, the adapter dropped")
  T.eq(m.disable_adapter, nil)
end)

T.test("LoRA on embed_tokens: PEFT's init, forward by hand, gradients, PEFT's file (base weight beside), merge", function()
  local m = peft.get_peft_model(llama(), peft.LoraConfig { r = 4, lora_alpha = 8, target_modules = { "embed_tokens",
    "q_proj" } })
  T.eq(T.printed(function() m:print_trainable_parameters() end), -- (PEFT 0.21.2's line for these shapes)
    "trainable params: 2,316 || all params: 127,948 || trainable%: 1.8101")
  local e = m.model.embed_tokens
  T.eq(e.lora_embedding_A:abs():max():item(), 0, "PEFT's init: A zero")
  assert(e.lora_embedding_B:abs():max():item() > 0.5, "PEFT's init: B N(0, 1)")
  zr.manual_seed(5)
  zr.no_grad(function() e.lora_embedding_A:copy_(zr.randn(e.lora_embedding_A:shape())) end)
  local x = zr.tensor({ { 3, 0, 258 } }):to("i64")
  local got = zr.no_grad(function() return e(x) end)
  local W, A, B = e.weight:to("f64"), e.lora_embedding_A:to("f64"), e.lora_embedding_B:to("f64")
  for j, id in ipairs { 3, 0, 258 } do
    local want = W:narrow(1, id + 1, 1) + zr.matmul(A:narrow(2, id + 1, 1):transpose(1, 2), B:transpose(1, 2)) * 2
    T.near(maxdiff(got:narrow(2, j, 1):reshape(want:shape()), want), 0, 1e-5, 0, "row of id " .. id)
  end
  m(ids, ids).loss:backward()
  assert(e.lora_embedding_A.grad and e.lora_embedding_B.grad, "gradients reach A and B")
  T.eq(e.weight.grad, nil, "the base embedding stays frozen")
  m:save_pretrained(tmp .. "/emb_lora")
  local fh = zr._C.safetensors_open(tmp .. "/emb_lora/adapter_model.safetensors")
  local keys = fh:keys()
  fh:close()
  table.sort(keys)
  T.eq(table.concat(keys, " "):gsub("base_model%.model%.", ""), "model.embed_tokens.base_layer.weight " ..
    "model.embed_tokens.lora_embedding_A model.embed_tokens.lora_embedding_B " ..
    "model.layers.0.self_attn.q_proj.lora_A.weight model.layers.0.self_attn.q_proj.lora_B.weight " ..
    "model.layers.1.self_attn.q_proj.lora_A.weight model.layers.1.self_attn.q_proj.lora_B.weight",
    "PEFT's keys, the base embedding beside (save_embedding_layers \"auto\")")
  local back = peft.from_pretrained(llama(), tmp .. "/emb_lora")
  T.eq(maxdiff(logits(back), logits(m)), 0, "read back")
  local want = logits(m)
  m:merge_and_unload()
  T.near(maxdiff(logits(m), want), 0, 1e-5, 0, "merged")
  T.eq(m.model.embed_tokens.__name, "Embedding", "the plain embedding back")
end)

T.test("Trainer: save_model writes the adapter (not the base); checkpoints resume bit for bit", function()
  local out = tmp .. "/resume"
  local a = { output_dir = out .. "/full", save_strategy = "steps", save_steps = 3, max_steps = 6 }
  local full = sft(a)
  full:train()
  full:save_model(out .. "/final")
  local C = zr._C
  T.eq(C.path_type(out .. "/final/adapter_model.safetensors"), "file")
  T.eq(C.path_type(out .. "/final/adapter_config.json"), "file")
  T.eq(C.path_type(out .. "/final/tokenizer.json"), "file")
  T.eq(C.path_type(out .. "/final/model.safetensors"), nil, "no full model for a PEFT model")
  T.eq(C.path_type(out .. "/full/checkpoint-3/adapter_model.safetensors"), "file", "checkpoints hold the adapter")
  local back = peft.from_pretrained(llama(), out .. "/final")
  T.eq(maxdiff(logits(back), logits(full.model)), 0, "the saved adapter is the trained one")
  local ref = hist(full)
  local resumed = sft { output_dir = out .. "/full", save_strategy = "no", max_steps = 6 }
  resumed:train { resume_from_checkpoint = out .. "/full/checkpoint-3" }
  local got = hist(resumed)
  for s = 4, 6 do T.near(got[s].loss, ref[s].loss, 0, 0, "loss at step " .. s .. " after resuming") end
end)

T.test("ZeRO stages 0-3 (one process): only the adapter in the optimizer, the same losses", function()
  local ref
  for stage = 0, 3 do
    local t = sft { max_steps = 4, deepspeed = { train_micro_batch_size_per_gpu = "auto", gradient_accumulation_steps = "auto",
      zero_optimization = { stage = stage }, optimizer = { type = "AdamW", params = { lr = "auto" } } } }
    t:train()
    local n = 0
    for _, p in ipairs(t.engine.params) do n = n + p:numel() end
    T.eq(n, t.model:num_parameters(true), "stage " .. stage .. ": the engine holds the adapter only")
    local h = hist(t)
    ref = ref or h
    for s = 1, 4 do T.near(h[s].loss, ref[s].loss, 1e-6, 1e-6, ("stage %d step %d"):format(stage, s)) end
  end
end)

T.done()
