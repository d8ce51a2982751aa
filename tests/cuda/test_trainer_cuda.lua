-- The Trainer on a GPU over padded rows of different lengths, with its default collator (which pads
-- a GPU micro-batch to a multiple of 64 tokens): the same losses as the CPU run (which pads to the
-- longest row), and bf16 learns (loss falls, gradient norm not zero, close to the f32 curve); SFTTrainer's
-- evaluation (mean token accuracy through the CUDA argmax) as on the CPU.
-- `./zrun tests/cuda/test_trainer_cuda.lua`; prints SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../ops/cuda_common.lua")
if C.skip_without_gpu("cuda") then return end
local zr, T = C.zr, C.T

local tmp = T.tmpdir()
local tok = zr.tokenizers.ByteTokenizer.new()
local ds = T.varied_rows(tok, 32, function(i) return 5 + (i * 37) % 56 end) -- 5..60 tokens
local tokz = { pad_id = function() return 0 end }

local function run(dev, extra)
  zr.manual_seed(3)
  local cfg = {}
  for k, v in pairs(zr.models.llama.config("zrun/tiny-llama")) do cfg[k] = v end
  cfg.device = dev
  local args = { output_dir = tmp .. "/" .. dev, save_strategy = "no", logging_steps = 1, train_sampling_strategy = "sequential",
    per_device_train_batch_size = 4, gradient_accumulation_steps = 2, learning_rate = 3e-3, lr_scheduler_type = "constant",
    max_grad_norm = 1.0, max_steps = 12 }
  for k, v in pairs(extra or {}) do args[k] = v end
  local t = zr.Trainer { model = zr.models.llama.LlamaForCausalLM(cfg), train_dataset = ds, processing_class = tokz, args = args }
  local widths = {}
  local collate = t.collator
  t.collator = function(rows) local b = collate(rows); widths[#widths + 1] = b.input_ids:size(2); return b end
  t:train()
  local loss, norm = {}, {}
  for _, r in ipairs(t.state.log_history) do
    if r.loss then loss[#loss + 1], norm[#norm + 1] = r.loss, r.grad_norm end
  end
  return loss, norm, widths
end

T.test("the default collator on a GPU pads to a multiple of 64 and trains as the CPU does (f32, 12 steps)", function()
  local lc, nc, wc = run("cpu")
  local lg, ng, wg = run("cuda")
  T.eq(#lg, 12, "12 logged steps")
  for k, w in ipairs(wg) do T.eq(w % 64, 0, ("GPU micro-batch %d is %d tokens wide"):format(k, w)) end
  local narrower = 0
  for k, w in ipairs(wc) do if w < wg[k] then narrower = narrower + 1 end end
  assert(narrower > 0, "the CPU's micro-batches are the longest row (narrower than the GPU's)")
  T.near(lg, lc, 2e-4, 2e-4, "per-step losses, GPU (x64 padding) against CPU (longest row)")
  T.near(ng, nc, 2e-3, 2e-3, "gradient norms")
  assert(lg[12] < 0.8 * lg[1], ("the loss falls by 20%%: %.4f -> %.4f"):format(lg[1], lg[12]))
end)

T.test("bf16 on a GPU learns over padded rows: loss falls, gradient norm > 0, within 3% of the f32 curve", function()
  local lf = run("cuda")
  local lb, nb = run("cuda", { bf16 = true })
  for k, n in ipairs(nb) do assert(n > 0 and n == n, ("step %d gradient norm %s"):format(k, tostring(n))) end
  assert(lb[12] < 0.8 * lb[1], ("the bf16 loss falls by 20%%: %.4f -> %.4f"):format(lb[1], lb[12]))
  for k = 1, #lf do
    assert(math.abs(lb[k] - lf[k]) <= 0.03 * lf[k], ("step %d: bf16 %.4f vs f32 %.4f"):format(k, lb[k], lf[k]))
  end
end)

T.test("torch_empty_cache_steps = 4: the cache emptied after steps 4, 8 and 12, the losses unchanged", function()
  local plain = run("cuda")
  local empty, calls = zr.cuda.empty_cache, {}
  zr.cuda.empty_cache = function(...) calls[#calls + 1] = true; return empty(...) end
  local ok, l = pcall(run, "cuda", { torch_empty_cache_steps = 4 })
  zr.cuda.empty_cache = empty
  assert(ok, l)
  T.eq(#calls, 3, "three times in 12 steps")
  T.near(l, plain, 0, 0, "the same losses")
end)

T.test("SFTTrainer's evaluation on a GPU: loss and mean token accuracy (the CUDA argmax) as on the CPU", function()
  local TPL = "{% for m in messages %}{{ m.role + ': ' }}{% if m.role == 'assistant' %}{% generation %}" ..
    "{{ m.content + eos_token }}{% endgeneration %}{% else %}{{ m.content + '\\n' }}{% endif %}{% endfor %}"
  local rows = {}
  for i = 1, 12 do
    rows[i] = { messages = { { role = "user", content = "say " .. i }, { role = "assistant", content = ("ab"):rep(i) } } }
  end
  local function eval_on(dev)
    zr.manual_seed(5)
    local cfg = {}
    for k, v in pairs(zr.models.llama.config("zrun/tiny-llama")) do cfg[k] = v end
    cfg.device = dev
    local b = zr.tokenizers.ByteTokenizer.new()
    b:set_chat_template(TPL)
    local t = zr.SFTTrainer { model = zr.models.llama.LlamaForCausalLM(cfg), processing_class = b,
      train_dataset = zr.datasets.Dataset.from_rows(rows), eval_dataset = zr.datasets.Dataset.from_rows(rows),
      args = { output_dir = tmp .. "/sft" .. dev, bf16 = false, assistant_only_loss = true, max_steps = 8,
        per_device_train_batch_size = 4, learning_rate = 3e-3, save_strategy = "no", train_sampling_strategy = "sequential" } }
    t:train()
    return t:evaluate()
  end
  local c, g = eval_on("cpu"), eval_on("cuda")
  T.near(g.eval_loss, c.eval_loss, 2e-4, 2e-4, "eval loss")
  -- (two tokens may flip where two logits are within the devices' rounding of each other)
  T.near(g.eval_mean_token_accuracy, c.eval_mean_token_accuracy, 2 / c.eval_tokens, 0, "mean token accuracy")
  assert(c.eval_mean_token_accuracy > 0, "the model predicts some of its answers")
end)

T.done()
