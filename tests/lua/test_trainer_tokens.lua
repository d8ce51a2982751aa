-- The Trainer's loss over padded rows of different lengths, as transformers 5 computes it: each
-- step's loss is the mean over every counted token of the step (num_items_in_batch), so gradient
-- accumulation gives the gradient of one big batch; label_smoothing_factor (HF's LabelSmoother);
-- train_sampling_strategy (sequential, group_by_length). Two ranks: tests/mpi/test_trainer.sh.
local zr = require "zrun"
local T = zr.testing

local tmp = T.tmpdir()
local tok = zr.tokenizers.ByteTokenizer.new()
-- the sample text cut into 24 rows of 5..60 tokens: padding in every micro-batch
local ds = T.varied_rows(tok, 24, function(i) return 5 + (i * 37) % 56 end)
local rows = ds.rows
local collator = zr.datasets.causal_lm_collator { pad_token_id = 0 }
local cfg = zr.models.llama.config("zrun/tiny-llama")
local function model()
  zr.manual_seed(3)
  return zr.models.llama.LlamaForCausalLM(cfg)
end
local function trainer(args, m)
  local a = { output_dir = tmp .. "/t", save_strategy = "no", logging_steps = 1, train_sampling_strategy = "sequential",
    optim = "sgd", learning_rate = 0.5, max_grad_norm = 0, weight_decay = 0, lr_scheduler_type = "constant" }
  for k, v in pairs(args) do a[k] = v end
  return zr.Trainer { model = m or model(), train_dataset = ds, eval_dataset = ds, data_collator = collator, args = a }
end
local function params(t)
  local out = {}
  for name, p in t.model:named_parameters() do out[name] = p:to("f64"):flat_table() end
  return out
end
local function first_loss(t)
  for _, r in ipairs(t.state.log_history) do if r.loss then return r.loss end end
end

-- The loss of `rows` in one process, in double, from the model's logits: HF's LabelSmoother over the
-- tokens that count after the shift (eps 0: the plain cross-entropy); also the mean of the rows' means.
local function reference(m, batch_rows, eps)
  local b = collator(batch_rows)
  local logits = zr.no_grad(function() return m(b.input_ids).logits end):to("f64")
  local V, T_ = logits:size(3), logits:size(2)
  local lg, lab = logits:flat_table(), b.labels:flat_table()
  local tot, cnt = 0, 0
  for r = 1, #batch_rows do
    for t = 1, T_ - 1 do
      local y = lab[(r - 1) * T_ + t + 1]
      if y ~= -100 then
        local base, mx, s, sz = ((r - 1) * T_ + t - 1) * V, -math.huge, 0, 0
        for j = 1, V do mx = math.max(mx, lg[base + j]) end
        for j = 1, V do s, sz = s + math.exp(lg[base + j] - mx), sz + lg[base + j] end
        local lse = mx + math.log(s)
        tot, cnt = tot + lse - (1 - eps) * lg[base + y + 1] - eps / V * sz, cnt + 1
      end
    end
  end
  return tot / cnt, cnt
end

T.test("gradient accumulation over padded rows = one batch of all of them (transformers' num_items_in_batch)", function()
  -- 4 rows of 4 lengths: accumulation 4 of 1 row against 1 micro-batch of 4, one SGD step each
  local a = trainer { per_device_train_batch_size = 1, gradient_accumulation_steps = 4, max_steps = 1 }
  local b = trainer { per_device_train_batch_size = 4, gradient_accumulation_steps = 1, max_steps = 1 }
  a:train(); b:train()
  local pa, pb = params(a), params(b)
  local worst, moved = 0, 0
  local p0 = params({ model = model() })
  for name, va in pairs(pa) do
    for i = 1, #va do
      worst = math.max(worst, math.abs(va[i] - pb[name][i]))
      moved = math.max(moved, math.abs(va[i] - p0[name][i]))
    end
  end
  assert(moved > 1e-3, "the step moved the weights: " .. moved)
  assert(worst < 1e-5 * moved * 100, ("accumulated vs one batch: weights differ by %.3g (moved %.3g)"):format(worst, moved))
  T.near(first_loss(a), first_loss(b), 1e-6, 1e-6, "logged loss, accumulated vs one batch")
  -- the test can fail: the mean of the 4 rows' means (what weighting each micro-batch alike gives) is
  -- another number for these rows
  local m = model()
  local tok_mean = reference(m, { rows[1], rows[2], rows[3], rows[4] }, 0)
  local mean_of_means = 0
  for i = 1, 4 do mean_of_means = mean_of_means + reference(m, { rows[i] }, 0) / 4 end
  T.near(first_loss(a), tok_mean, 1e-5, 1e-5, "logged loss = the token mean over the step")
  assert(math.abs(tok_mean - mean_of_means) > 1e-3, ("rows too alike to tell: %.6f vs %.6f"):format(tok_mean, mean_of_means))
  assert(a.engine.last_grad_norm > 0, "grad_norm > 0")
  T.near(a.engine.last_grad_norm, b.engine.last_grad_norm, 1e-5, 1e-5, "grad_norm, accumulated vs one batch")
end)

T.test("padded rows, group_by_length and label smoothing resume bit for bit from a checkpoint", function()
  local function run(out, extra, resume)
    local a = { output_dir = out, per_device_train_batch_size = 2, gradient_accumulation_steps = 2, max_steps = 5,
      save_strategy = "steps", save_steps = 2, train_sampling_strategy = "group_by_length", label_smoothing_factor = 0.1,
      optim = "adamw_torch", learning_rate = 3e-3 }
    for k, v in pairs(extra or {}) do a[k] = v end
    local t = trainer(a)
    t:train(resume)
    local l = {}
    for _, r in ipairs(t.state.log_history) do if r.loss then l[r.step] = r.loss end end
    return l
  end
  local straight = run(tmp .. "/straight")
  local resumed = run(tmp .. "/straight", { save_strategy = "no" },
    { resume_from_checkpoint = tmp .. "/straight/checkpoint-2" })
  for s = 3, 5 do T.eq(resumed[s], straight[s], "loss at step " .. s) end
  assert(straight[5] ~= straight[3], "the steps differ")
end)

T.test("label_smoothing_factor: HF's LabelSmoother loss in training and evaluation; perplexity unsmoothed", function()
  local eps = 0.1
  local m = model()
  local want = reference(m, { rows[1], rows[2], rows[3], rows[4] }, eps)
  local plain = reference(m, { rows[1], rows[2], rows[3], rows[4] }, 0)
  local t = trainer({ per_device_train_batch_size = 2, gradient_accumulation_steps = 2, max_steps = 1,
    label_smoothing_factor = eps }, m)
  -- evaluation first (the same weights): every row of the 4-row dataset
  local t_ev = trainer({ label_smoothing_factor = eps, per_device_eval_batch_size = 3 }, model())
  local ev_ds = zr.datasets.Dataset.from_rows { rows[1], rows[2], rows[3], rows[4] }
  local met = t_ev:evaluate(ev_ds)
  T.near(met.eval_loss, want, 1e-5, 1e-5, "eval_loss is the smoothed loss")
  T.near(met.eval_perplexity, math.exp(plain), 1e-4, 1e-5, "eval_perplexity is exp of the unsmoothed loss")
  t:train()
  T.near(first_loss(t), want, 1e-5, 1e-5, "the logged training loss is the smoothed token mean")
  assert(math.abs(want - plain) > 1e-4, ("smoothing changes the loss: %.6f vs %.6f"):format(want, plain))
  assert(t.engine.last_grad_norm > 0, "grad_norm > 0")
  -- and the smoothed loss falls when training goes on (it learns)
  local l = trainer({ per_device_train_batch_size = 4, max_steps = 12, label_smoothing_factor = eps,
    optim = "adamw_torch", learning_rate = 3e-3 })
  l:train()
  local first, last
  for _, r in ipairs(l.state.log_history) do if r.loss then first = first or r.loss; last = r.loss end end
  assert(last < first - 0.5, ("smoothed loss %.4f -> %.4f"):format(first, last))
  local after = l:evaluate(ev_ds) -- a trained model: the smoothing term is large
  assert(after.eval_loss > math.log(after.eval_perplexity) + 0.05,
    ("smoothed %.4f vs unsmoothed %.4f"):format(after.eval_loss, math.log(after.eval_perplexity)))
end)

T.test("train_sampling_strategy: sequential keeps the rows' order; group_by_length is transformers' grouping", function()
  local t = trainer { per_device_train_batch_size = 2, gradient_accumulation_steps = 2 }
  local o = t:epoch_order(0)
  T.eq(#o, 24)
  for i = 1, 24 do T.eq(o[i], i) end
  -- get_length_grouped_indices by hand: 10 rows, batch 2 -> mega-batches of 2 (10 // 8 = 1), each sorted
  -- by length (descending, ties in order), then the longest row (9, length 90) swapped to the front
  local len = { 5, 7, 7, 1, 3, 50, 2, 2, 90, 4 }
  local got = zr.datasets.length_grouped_indices(len, 2, { 3, 1, 2, 5, 4, 6, 8, 7, 10, 9 })
  T.eq(table.concat(got, ","), "9,1,2,5,6,4,8,7,3,10")
  -- the Trainer's order: each micro-batch x accumulation window of similar lengths, a permutation
  local g = trainer { per_device_train_batch_size = 2, gradient_accumulation_steps = 2,
    train_sampling_strategy = "group_by_length" }
  local go, seen, pad_g, pad_r = g:epoch_order(0), {}, 0, 0
  T.eq(#go, 24)
  for _, i in ipairs(go) do assert(not seen[i], "row twice"); seen[i] = true end
  local longest = 1
  for i = 2, 24 do if #rows[i].input_ids > #rows[longest].input_ids then longest = i end end
  assert(go[1] == longest, "the longest row comes first")
  local r = trainer { per_device_train_batch_size = 2, gradient_accumulation_steps = 2 }:epoch_order(0)
  for k = 1, 24, 2 do
    local function pad(o) return math.abs(#rows[o[k]].input_ids - #rows[o[k + 1]].input_ids) end
    pad_g, pad_r = pad_g + pad(go), pad_r + pad(r)
  end
  assert(pad_g < pad_r, ("padding: grouped %d, random %d"):format(pad_g, pad_r))
  for k = 1, 24, 4 do -- mega-batches of 4 (24 rows < 4 x 4 x 4): sorted by length after their first row
    for j = k + 1, k + 2 do
      assert(#rows[go[j]].input_ids >= #rows[go[j + 1]].input_ids, "mega-batch sorted by descending length")
    end
  end
  assert(table.concat(g:epoch_order(1), ",") ~= table.concat(go, ","), "another epoch, another order")
  -- length_column_name: the rows' own lengths win
  local byc = {}
  for i, row in ipairs(rows) do byc[i] = { input_ids = row.input_ids, n = 25 - i } end
  local c = zr.Trainer { model = model(), train_dataset = zr.datasets.Dataset.from_rows(byc), data_collator = collator,
    args = { output_dir = tmp .. "/c", train_sampling_strategy = "group_by_length", length_column_name = "n",
      per_device_train_batch_size = 2, gradient_accumulation_steps = 2 } }
  T.eq(c:epoch_order(0)[1], 1, "the row with the largest length column first")
end)

T.test("the default collator for a model on a GPU pads rows of different lengths to a multiple of 64", function()
  local Gpu = zr.nn.Module:extend("OnGpu") -- a stand-in whose parameters say they are on a GPU
  function Gpu:parameters() return { { device = function() return "cuda:0" end } } end
  local tokz = { pad_id = function() return 0 end }
  local g = zr.Trainer { model = Gpu(), processing_class = tokz, args = { output_dir = tmp .. "/g" } }
  local b = g.collator { rows[1], rows[2] }
  T.eq(b.input_ids:size(2), 64, "rows of 42 and 23 tokens padded to 64")
  T.eq(b.labels:narrow(2, 43, 22):eq(-100):to("f64"):sum():item(), 44, "positions 43-64 of both rows are -100")
  -- transformers' collator pads to the longest row: num_input_tokens_seen and total_flos count 2 x 42, not 2 x 64
  T.eq(b.counted_numel, 2 * #rows[1].input_ids, "counted as transformers' batch")
  T.eq(g.collator({ rows[1], rows[1] }).input_ids:size(2), #rows[1].input_ids, "rows of one length stay")
  local r64 = zr.Trainer.counted_unrounded(zr.datasets.causal_lm_collator { pad_token_id = 0, pad_to_multiple_of = 64 })
  local t = zr.Trainer { model = model(), train_dataset = ds, data_collator = r64, args = { output_dir = tmp .. "/r64",
    save_strategy = "no", max_steps = 2, per_device_train_batch_size = 4, train_sampling_strategy = "sequential",
    include_num_input_tokens_seen = "all", logging_steps = 1 } }
  t:train()
  local want = 0
  for s = 0, 1 do
    local longest = 0
    for i = 4 * s + 1, 4 * s + 4 do longest = math.max(longest, #rows[i].input_ids) end
    want = want + 4 * longest
  end
  T.eq(t.state.num_input_tokens_seen, want, "the inputs seen: each batch's rows x its longest row")
  local c = zr.Trainer { model = model(), processing_class = tokz, args = { output_dir = tmp .. "/c" } }
  T.eq(c.collator({ rows[1], rows[2] }).input_ids:size(2), #rows[1].input_ids, "on the CPU: the longest row")
end)

T.test("the new arguments refuse what they cannot do, in one line", function()
  local function new(a, m) return zr.Trainer { model = m or model(), train_dataset = ds, data_collator = collator, args = a } end
  T.raises(function() new { group_by_length = true } end,
    "'group_by_length' was removed in transformers 5; use train_sampling_strategy = \"group_by_length\"")
  T.raises(function() new { train_sampling_strategy = "batch_rebalance" } end, "use \"group_by_length\"")
  T.raises(function() new { train_sampling_strategy = "shuffled" } end,
    'train_sampling_strategy must be "random", "sequential" or "group_by_length", got "shuffled"')
  T.raises(function() new { label_smoothing_factor = 1.5 } end, "label_smoothing_factor must be a number in [0, 1)")
  T.raises(function() new { length_column_name = "n" } end,
    'length_column_name is read by train_sampling_strategy = "group_by_length" only; got "random"')
  T.raises(function() new { average_tokens_across_devices = "yes" } end, "average_tokens_across_devices must be true or false")
  local p = io.popen((os.getenv("ZRUN_BIN") or "./zrun") .. " recipes/finetune_llama.lua pad_to_multiple_of=8 max_steps=1 2>&1")
  local out = p:read("*a")
  p:close()
  assert(out:find("pad_to_multiple_of pads the rows of packing=false; packed blocks have no padding", 1, true), out)
  -- a model whose loss cannot be smoothed
  local Mod = zr.nn.Module:extend("MyLM")
  function Mod:__init() self.w = zr.nn.Parameter(zr.zeros({ 4 })) end
  function Mod:forward() return { loss = self.w:sum() } end
  T.raises(function() new({ label_smoothing_factor = 0.1 }, Mod()):train() end,
    "label_smoothing_factor = 0.1 needs a model whose forward(ids, labels, {label_smoothing=}) smooths its loss")
end)

T.test("auto_find_batch_size: accelerate's x0.9 steps down to the largest micro-batch whose memory plan fits", function()
  local plan, usable = require "zrun.memory_plan", require("zrun.memory_offload").usable
  local cfg1b = zr.models.llama.config("meta-llama/Llama-3.2-1B")
  local ds_cfg = require("zrun.config").load({ train_micro_batch_size_per_gpu = 16, zero_optimization = { stage = 2 },
    bf16 = { enabled = true } }, { world_size = 1 })
  local function need(bs) return plan.plan { model = cfg1b, config = ds_cfg, micro_batch = bs, seq_len = 2048,
    world_size = 1 }.device.total end
  local function gpu_for(bytes) return math.ceil((bytes + 2 ^ 30) / 0.95) + 1 end -- usable(gpu) >= bytes
  assert(need(12) > need(10) + 2 ^ 20, "the plan grows with the micro-batch")
  local pick = zr.Trainer.pick_batch_size
  local function run(gpu)
    return (pick { model = cfg1b, config = ds_cfg, seq_len = 2048, world_size = 1, start = 16, gpu_memory = gpu })
  end
  T.eq(run(gpu_for(need(16))), 16, "fits as given")
  T.eq(run(gpu_for(need(10))), 10, "16 -> 14 -> 12 -> 10 (int(x 0.9) each time, as accelerate)")
  T.eq(run(gpu_for(need(10)) - 2 ^ 21), 9, "just below 10's plan: 9")
  assert(usable(gpu_for(need(10))) >= need(10) and usable(gpu_for(need(10)) - 2 ^ 21) < need(10))
  T.eq(run(gpu_for(need(1)) - 2 ^ 21), 0, "not even 1 row")
  -- TRL's dft loss and packed sequences (padding-free batches) where the attention runs them over groups of
  -- sequences (head_dim 100: not the flash kernels' segments, which take 64, 128 and the multiples of 8 between) need
  -- more: the search plans with them
  local function with_head_dim(hd)
    local c = {}
    for k, v in pairs(cfg1b) do c[k] = v end
    c.num_attention_heads, c.num_key_value_heads, c.head_dim = 16, 4, hd
    return c
  end
  local cfg100, cfg128 = with_head_dim(100), with_head_dim(128)
  local function need_with(bs, o) return plan.plan { model = o.model or cfg1b, config = ds_cfg, micro_batch = bs,
    seq_len = 2048, world_size = 1, loss_type = o.loss_type, packed = o.packed }.device.total end
  for _, o in ipairs { { loss_type = "dft" }, { packed = true, model = cfg100 } } do
    local plain = need_with(10, { model = o.model })
    assert(need_with(10, o) > plain + 2 ^ 28, "more than 256 MiB more at 10 x 2048")
    local got = pick { model = o.model or cfg1b, config = ds_cfg, seq_len = 2048, world_size = 1, start = 16,
      gpu_memory = gpu_for(plain), loss_type = o.loss_type, packed = o.packed }
    T.eq(got < 10 and got > 0, true, "10 rows fit plainly, not with " .. (o.loss_type or "packed") .. ": got " .. got)
    T.eq((pick { model = o.model or cfg1b, config = ds_cfg, seq_len = 2048, world_size = 1, start = 16,
      gpu_memory = gpu_for(need_with(10, o)), loss_type = o.loss_type, packed = o.packed }), 10)
  end
  -- on the segments (head_dim 64, 16 bits: one attention over the rows joined) packed sequences add only the
  -- per-token cos / sin rows (f32) and the segments (i32 lo, hi) to the plain plan
  T.eq(need_with(10, { packed = true }) - need(10), 10 * 2048 * (2 * 64 * 4 + 2 * 4), "packed on the segments")
  -- (head_dim 128: the mma.sync kernels' segments, the same)
  T.eq(need_with(10, { packed = true, model = cfg128 }) - need_with(10, { model = cfg128 }),
    10 * 2048 * (2 * 128 * 4 + 2 * 4), "packed on the segments, head_dim 128")
  -- (head_dim 96: the 128 kernels over zero-padded copies, on the segments too)
  local cfg96 = with_head_dim(96)
  T.eq(need_with(10, { packed = true, model = cfg96 }) - need_with(10, { model = cfg96 }),
    10 * 2048 * (2 * 96 * 4 + 2 * 4), "packed on the segments, head_dim 96")
  -- LoRA (zr.peft): the frozen base has no gradient, master or optimizer state, so the GPU that takes 10 rows of a
  -- full fine-tune takes 16 with r 16 on q_proj / v_proj (24 -> 21 -> 18 -> 16); the plan is given the model's peft_config
  local lcfg = zr.peft.LoraConfig { r = 16, lora_alpha = 32 }
  local function need_lora(bs) return plan.plan { model = cfg1b, config = ds_cfg, micro_batch = bs, seq_len = 2048,
    world_size = 1, lora = lcfg }.device.total end
  assert(need_lora(10) < need(10) - 2 ^ 33, "LoRA plans more than 8 GiB less at 10 x 2048")
  T.eq((pick { model = cfg1b, config = ds_cfg, seq_len = 2048, world_size = 1, start = 24,
    gpu_memory = gpu_for(need(10)), lora = lcfg }), 16, "LoRA: a larger micro-batch on the same GPU")
  -- Trainer:find_batch_size hands a PEFT model's peft_config to the search (a GPU of that size, faked; the search
  -- stubbed to see what it is given)
  local seen
  local pick0, cuda0 = zr.Trainer.pick_batch_size, zr._C.cuda
  zr.Trainer.pick_batch_size = function(o) seen = o; return o.start, { device = { total = 0 } }, 0 end
  zr._C.cuda = { memory_summary = function() return { device_total = gpu_for(need(10)) } end }
  local on_gpu = { { device = function() return "cuda:0" end } }
  local fake = setmetatable({ args = { per_device_train_batch_size = 16, gradient_checkpointing = false },
    train_dataset = { rows = { { input_ids = { 1, 2 } } } },
    model = { config = cfg1b, peft_config = lcfg, parameters = function() return on_gpu end } },
    { __index = zr.Trainer })
  local ok, err = pcall(fake.find_batch_size, fake, { source = function() return "default" end }, {}, {}, 1)
  zr.Trainer.pick_batch_size, zr._C.cuda = pick0, cuda0
  T.eq(ok, true, tostring(err))
  T.eq(seen and seen.lora, lcfg, "the model's peft_config")
  -- an adapter the plan does not model (lm_head among the targets): planned as a full fine-tune, and said so
  local head_cfg = zr.peft.LoraConfig { r = 8, target_modules = { "q_proj", "lm_head" } }
  local untied = {}
  for k, v in pairs(cfg1b) do untied[k] = v end
  untied.tie_word_embeddings = false -- (an lm_head of its own)
  local tried = {}
  zr.Trainer.pick_batch_size = function(o)
    tried[#tried + 1] = o.lora or false
    if o.lora then plan.plan { model = untied, config = ds_cfg, micro_batch = 1, seq_len = 8, lora = o.lora } end
    return o.start, { device = { total = 0 } }, 0
  end
  zr._C.cuda = { memory_summary = function() return { device_total = gpu_for(need(10)) } end }
  fake.model.peft_config = head_cfg
  local said = T.printed(function()
    ok, err = pcall(fake.find_batch_size, fake, { source = function() return "default" end }, {}, {}, 1)
  end)
  zr.Trainer.pick_batch_size, zr._C.cuda = pick0, cuda0
  fake.model.peft_config = lcfg
  T.eq(ok, true, tostring(err))
  T.eq(#tried == 2 and tried[1] == head_cfg and tried[2] == false, true, "with the adapter, then as a full fine-tune")
  T.eq(said:find("lora target lm_head is not planned", 1, true) ~= nil and
    said:find("planning this LoRA model as a full fine-tune", 1, true) ~= nil, true, said)
  -- and so does the out-of-memory report's fit advice (plan.fit stubbed the same way)
  local mp = require "zrun.memory_plan"
  local fit0 = mp.fit
  mp.fit = function(o) seen = o; return { text = "advice" } end
  fake.engine = { config = ds_cfg, world_size = 1, device = "cpu" }
  local msg = fake:explain_oom("CUDA out of memory", zr.zeros({ 2, 8 }))
  mp.fit = fit0
  T.eq(msg:find("advice", 1, true) ~= nil, true, msg)
  T.eq(seen.lora, lcfg, "explain_oom: the model's peft_config")
  -- on the CPU nothing is searched; a config that fixes the micro-batch is refused
  local t = trainer { per_device_train_batch_size = 3, auto_find_batch_size = true, max_steps = 1 }
  t:setup()
  T.eq(t.args.per_device_train_batch_size, 3)
  T.raises(function() trainer { auto_find_batch_size = true, deepspeed = { train_micro_batch_size_per_gpu = 2 } }:setup() end,
    "auto_find_batch_size sets the micro-batch, but the DeepSpeed config fixes train_micro_batch_size_per_gpu = 2")
end)

T.done()

T.test("group_by_length evaluates in transformers 5.17's order: LengthGroupedSampler of eval batches, seeded data_seed", function()
  -- 30 rows, row i of 3 + (i-1)*7 % 11 tokens, all equal to i; per_device_eval_batch_size 2, data_seed 5. Expected:
  -- list(LengthGroupedSampler(2, lengths, generator=torch.Generator().manual_seed(5))) (transformers 5.17's
  -- _get_eval_sampler), 1-based
  local expected = "26,29,7,16,3,12,21,13,19,30,14,23,18,2,8,11,25,28,4,24,5,22,17,1,15,10,27,6,20,9"
  local ev = {}
  for i = 1, 30 do
    local ids = {}
    for t = 1, 3 + ((i - 1) * 7) % 11 do ids[t] = i end
    ev[i] = { input_ids = ids }
  end
  local seen = {}
  local t = zr.Trainer { model = model(), train_dataset = ds, eval_dataset = ev,
    data_collator = function(b)
      for _, r in ipairs(b) do seen[#seen + 1] = r.input_ids[1] end
      return collator(b)
    end,
    args = { output_dir = tmp .. "/evgl", save_strategy = "no", per_device_eval_batch_size = 2, data_seed = 5,
      train_sampling_strategy = "group_by_length" } }
  t:evaluate()
  T.eq(table.concat(seen, ","), expected)
  seen = {}
  t.args.train_sampling_strategy = "sequential"
  t:evaluate()
  T.eq(seen[1] .. "," .. seen[30], "1,30", "sequential: the rows in order")
end)
