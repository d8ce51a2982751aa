-- LoRA (zr.peft) on a GPU: the adapted tiny Llama's loss and the adapters' gradients as on the CPU (f32),
-- the base weights given no gradient; and zr.SFTTrainer{peft_config=} learning in bf16 on the GPU (loss falls
-- 50%, gradient norm > 0 every step, the frozen base unchanged). `./zrun tests/cuda/test_peft_cuda.lua`;
-- prints SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../ops/cuda_common.lua")
if C.skip_without_gpu("LoRA on CUDA") then return end
local zr, T = C.zr, C.T
local peft = zr.peft

local tmp = T.tmpdir()
local TARGETS = { "q_proj", "v_proj", "o_proj", "up_proj", "down_proj", "lm_head" }
local function adapted(dev, dtype)
  zr.manual_seed(7)
  local cfg = {}
  for k, v in pairs(zr.models.llama.config("zrun/tiny-llama")) do cfg[k] = v end
  cfg.device, cfg.dtype = dev, dtype or "f32"
  local m = peft.get_peft_model(zr.models.llama.LlamaForCausalLM(cfg), peft.LoraConfig { r = 8, lora_alpha = 16,
    target_modules = TARGETS })
  zr.manual_seed(3) -- every lora_B random (on the CPU, then moved), so the adapters are not a no-op
  zr.no_grad(function()
    for _, l in ipairs(peft.lora_layers(m)) do
      l[2].lora_B.weight:copy_((zr.randn(l[2].lora_B.weight:shape()) * 0.1):to(dev))
    end
  end)
  return m
end

T.test("LoRA on CUDA: the loss and every adapter's gradient as on the CPU (f32); the base gets none", function()
  local ids = zr.tensor({ { 1, 5, 9, 20, 30, 41, 7, 12 }, { 3, 8, 100, 101, 2, 60, 61, 9 } }):to("i64")
  local got = {}
  for _, dev in ipairs { "cpu", "cuda" } do
    local m = adapted(dev)
    local x = ids:to(dev)
    local out = m(x, x)
    out.loss:backward()
    local g = { loss = out.loss:item() }
    for n, p in m:named_parameters() do
      if n:match("lora_") then g[n] = p.grad:to("cpu")
      else assert(p.grad == nil, n .. " (frozen) has a gradient on " .. dev) end
    end
    got[dev] = g
  end
  T.near(got.cuda.loss, got.cpu.loss, 1e-5, 1e-5, "loss")
  local n = 0
  for k, g in pairs(got.cpu) do
    if k ~= "loss" then
      n = n + 1
      T.near(got.cuda[k], g, 1e-4, 1e-3, k)
    end
  end
  T.eq(n, 2 * 2 * 5 + 2, "lora_A and lora_B of 5 projections in 2 layers and of lm_head")
end)

T.test("SFTTrainer{peft_config=} learns in bf16 on the GPU: loss falls 50%, grad_norm > 0, the base unchanged", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  tok:set_chat_template("{% for m in messages %}{% if m.role == 'assistant' %}{{ 'A: ' }}{% generation %}" ..
    "{{ m.content + eos_token }}{% endgeneration %}{% else %}{{ 'U: ' + m.content + '\\n' }}{% endif %}{% endfor %}")
  local rows = {}
  for i, w in ipairs { "red", "blue", "green", "cyan", "pink", "gold", "gray", "teal" } do
    rows[i] = { messages = { { role = "user", content = "colour " .. i }, { role = "assistant", content = w } } }
  end
  zr.manual_seed(7)
  local cfg = {}
  for k, v in pairs(zr.models.llama.config("zrun/tiny-llama")) do cfg[k] = v end
  cfg.device = "cuda"
  local model = zr.models.llama.LlamaForCausalLM(cfg)
  local t = zr.SFTTrainer { model = model, train_dataset = zr.datasets.Dataset.from_rows(rows), processing_class = tok,
    peft_config = peft.LoraConfig { r = 8, lora_alpha = 16, target_modules = TARGETS },
    args = { output_dir = tmp .. "/sft", save_strategy = "no", logging_steps = 1, per_device_train_batch_size = 4,
      learning_rate = 2e-2, lr_scheduler_type = "constant", max_steps = 60, assistant_only_loss = true,
      train_sampling_strategy = "sequential", bf16 = true } }
  local base = {}
  -- (the engine casts the whole model to bf16 at setup, as DeepSpeed's bf16 does: the frozen base as rounded then)
  for n, p in model:named_parameters() do
    if not n:match("lora_") then base[n] = p:to("bf16"):to("f32"):to("cpu"):flat_table() end
  end
  t:train()
  local h = {}
  for _, r in ipairs(t.state.log_history) do if r.loss then h[#h + 1] = r end end
  assert(h[#h].loss < 0.5 * h[1].loss, ("loss %.4f -> %.4f: not 50%% lower"):format(h[1].loss, h[#h].loss))
  for _, r in ipairs(h) do assert(r.grad_norm > 0 and r.grad_norm == r.grad_norm, "grad_norm at step " .. r.step) end
  for n, p in model:named_parameters() do
    if base[n] then T.eq_list(p:to("f32"):to("cpu"):flat_table(), base[n], n .. " (frozen) changed") end
  end
  print(("[peft cuda] bf16 SFT loss %.4f -> %.4f in %d steps"):format(h[1].loss, h[#h].loss, #h))
end)

T.done()
