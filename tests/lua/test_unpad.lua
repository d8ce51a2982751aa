-- Padded batches run without their padding: the Trainer hands a right-padded batch (the default collator's,
-- TRL's SFT collator without packing) to the model as the padding-free batch of its rows (zrun.models.packed's
-- unpad: one row, position_ids from 0 in each, each row's first label -100), where the model runs packed
-- sequences as one row (packs_flat). The reference is the padded batch itself, run as transformers runs it
-- (the padding computed, its labels -100): the same loss and gradients per model, the same logged losses,
-- gradient norms, evaluation loss and TRL's token statistics per Trainer; and the unpadded runs must learn.
local zr = require "zrun"
local T = zr.testing
local packed = require "zrun.models.packed"
local LM = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "loss_models_common.lua")

local function i64(rows) return zr.tensor(rows, { dtype = "i64" }) end

T.test("packed.unpad: a right-padded batch as one row of its rows' tokens; nil where it must run padded", function()
  local batch = {
    input_ids = i64 { { 5, 6, 7, 0, 0 }, { 8, 9, 10, 11, 12 }, { 13, 0, 0, 0, 0 } },
    labels = i64 { { 5, 6, 7, -100, -100 }, { 8, -100, 10, 11, 12 }, { 13, -100, -100, -100, -100 } },
    attention_mask = i64 { { 1, 1, 1, 0, 0 }, { 1, 1, 1, 1, 1 }, { 1, 0, 0, 0, 0 } },
  }
  local fb, map = packed.unpad(batch)
  T.eq_list(fb.input_ids:flat_table(), { 5, 6, 7, 8, 9, 10, 11, 12, 13 })
  T.eq_list(fb.position_ids:flat_table(), { 0, 1, 2, 0, 1, 2, 3, 4, 0 })
  T.eq_list(fb.labels:flat_table(), { -100, 6, 7, -100, -100, 10, 11, 12, -100 })
  T.eq(table.concat(fb.input_ids:shape(), ","), "1,9")
  T.eq_list(map(i64 { { 1, 2, 3, 4, 5 }, { 6, 7, 8, 9, 10 }, { 11, 12, 13, 14, 15 } }):flat_table(),
    { -100, 2, 3, -100, 7, 8, 9, 10, -100 }, "another labels tensor, mapped alike")
  local function with(k, v)
    local b = {}
    for key, x in pairs(batch) do b[key] = x end
    b[k] = v
    return packed.unpad(b)
  end
  T.eq(with("attention_mask", i64 { { 1, 1, 1, 1, 1 }, { 1, 1, 1, 1, 1 }, { 1, 1, 1, 1, 1 } }), nil, "no padding")
  T.eq(with("attention_mask", i64 { { 1, 1, 1, 0, 0 }, { 1, 1, 1, 1, 1 }, { 0, 0, 0, 0, 0 } }), nil, "a row of padding")
  T.eq(with("labels", i64 { { 5, 6, 7, 0, -100 }, { 8, 9, 10, 11, 12 }, { 13, -100, -100, -100, -100 } }), nil,
    "a padded position whose label counts (the padded batch scores it)")
  T.eq(with("position_ids", i64 { { 0, 1, 2, 3, 4 }, { 0, 1, 2, 3, 4 }, { 0, 1, 2, 3, 4 } }), nil, "the collator's positions")
  T.eq(with("attention_mask", nil), nil, "no attention_mask")
end)

-- A padded batch of 3 rows (11, 6 and 3 tokens) over V tokens, one label -100 besides the padding's.
local function padded(V)
  local ids, labels = LM.batch(V, 1)
  return LM.padded(ids, labels, { 11, 6, 3 })
end

-- The f64 model m's loss and gradients over the padded batch b against its unpadded batch's (1e-12, 1e-10); returns
-- the unpadded batch's token count.
local function same_as_padded(m, b, name)
  local ref = m(b.input_ids, b.labels)
  ref.loss:backward()
  local g0 = LM.grads(m)
  local fb = packed.unpad(b)
  local out = m(fb.input_ids, fb.labels, { position_ids = fb.position_ids })
  out.loss:backward()
  local g1 = LM.grads(m)
  T.near(out.loss:item(), ref.loss:item(), 1e-12, 1e-12, name .. ": loss")
  for n, g in pairs(g0) do T.near(g1[n], g, 1e-10, 1e-10, name .. ": grad " .. n) end
  return fb.input_ids:size(2)
end

T.test("Llama (tied and not) and GPT-2: the unpadded batch's loss and gradients are the padded batch's", function()
  for _, c in ipairs { { "llama", function() return LM.llama_model(false, "f64") end },
    { "llama tied", function() return LM.llama_model(true, "f64") end }, { "gpt2", function() return LM.gpt2_model("f64") end } } do
    local name, m = c[1], c[2]()
    local b = padded(LM.vocab(m))
    if name == "gpt2" then m.config.attn_pdrop = 0 end
    assert(m:packs_flat(), name .. ": packed sequences run as one row on the CPU")
    T.eq(same_as_padded(m, b, name), 20, name .. ": the 20 tokens of the 3 rows")
  end
  -- the check can fail: the same rows left-shifted by a token give another loss
  local m = LM.llama_model(false, "f64")
  local b = padded(LM.vocab(m))
  local fb = packed.unpad(b)
  local sh = {}
  for i, v in ipairs(fb.position_ids:flat_table()) do sh[i] = v + 3 end
  local shifted = i64 { sh }
  local l0, l1 = m(fb.input_ids, fb.labels, { position_ids = fb.position_ids }).loss:item(),
    m(fb.input_ids, fb.labels, { position_ids = shifted }).loss:item()
  T.near(l0, m(b.input_ids, b.labels).loss:item(), 1e-12, 1e-12, "positions from 0")
  -- (rope is relative: shifting every position keeps the loss; joining the rows as one sequence does not)
  local joined = zr.arange(20, { dtype = "i64" }):view(1, 20)
  assert(math.abs(m(fb.input_ids, fb.labels, { position_ids = joined }).loss:item() - l0) > 1e-4, "rows joined: another loss")
  T.near(l1, l0, 1e-9, 1e-9, "rope: a shift of every position")
end)

T.test("every family (Mistral, Qwen2, Qwen3, Phi-3 longrope, Gemma 3's sliding window): unpadded = padded, f64", function()
  local cjson = require "cjson"
  local CLASS = { llama = { "llama", "LlamaForCausalLM" }, mistral = { "llama", "MistralForCausalLM" },
    qwen2 = { "llama", "Qwen2ForCausalLM" }, qwen3 = { "llama", "Qwen3ForCausalLM" }, phi3 = { "phi3", "Phi3ForCausalLM" },
    gemma3_text = { "gemma3", "Gemma3ForCausalLM" } }
  for _, name in ipairs { "mistral_tiny", "qwen2_tiny", "qwen3_tiny", "phi3_longrope_short", "gemma3_a", "gemma3_b" } do
    local f = assert(io.open("tests/golden/" .. name .. ".config.json"))
    local cfg = cjson.decode(f:read("a"))
    f:close()
    cfg.dtype = "f64"
    zr.manual_seed(5)
    local c = CLASS[cfg.model_type]
    local m = zr.models[c[1]][c[2]](cfg)
    assert(m:packs_flat(), name .. ": packs flat")
    zr.manual_seed(9)
    local ids = (zr.rand({ 3, 20 }) * (m.config.vocab_size - 1)):to("i64")
    local b = LM.padded(ids, ids:clone(), { 20, 11, 4 }) -- (gemma3_a's window of 8 masks keys of the 20-token row)
    same_as_padded(m, b, name)
  end
end)

local tok = zr.tokenizers.ByteTokenizer.new()
local rows = T.varied_rows(tok, 24, function(i) return 5 + (i * 7) % 23 end)

-- The logged losses and gradient norms of 8 steps (batches of 4 padded rows, accumulation 2), the evaluation's
-- loss, and the token counts of the batches the model's forward received.
local function train(unpad, args)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  zr.manual_seed(3)
  local m = zr.models.llama.LlamaForCausalLM(cfg)
  local seen = {}
  local f = m.forward
  rawset(m, "forward", function(self, ids, labels, o)
    seen[#seen + 1] = ids:size(1) .. "x" .. ids:size(2)
    return f(self, ids, labels, o)
  end)
  local a = { output_dir = T.tmpdir(), per_device_train_batch_size = 4, gradient_accumulation_steps = 2, max_steps = 8,
    learning_rate = 3e-3, logging_steps = 1, save_strategy = "no", report_to = "none", per_device_eval_batch_size = 4 }
  for k, v in pairs(args or {}) do a[k] = v end
  local t
  T.printed(function()
    t = zr.Trainer { model = m, train_dataset = rows, eval_dataset = rows:select(1, 10), args = a,
      data_collator = zr.datasets.causal_lm_collator { pad_token_id = 0 } }
    t.unpad_batches = unpad
    t:train()
  end)
  local losses, norms = {}, {}
  for _, r in ipairs(t.state.log_history) do
    if r.loss then losses[#losses + 1], norms[#norms + 1] = r.loss, r.grad_norm end
  end
  local ev
  T.printed(function() ev = t:evaluate() end)
  return losses, norms, ev.eval_loss, seen
end

T.test("Trainer: padded batches trained without their padding; the padded run's losses, norms and eval loss; learning", function()
  local l0, n0, e0, s0 = train(false)
  local l1, n1, e1, s1 = train(nil)
  T.eq(s0[1], "4x" .. s0[1]:match("x(%d+)"), "unpad_batches = false: the padded batch")
  assert(s1[1]:match("^1x"), "the unpadded batch is one row: " .. s1[1])
  local padded_tokens = 4 * tonumber(s0[1]:match("x(%d+)"))
  assert(tonumber(s1[1]:match("x(%d+)")) < padded_tokens, ("fewer tokens than the padded %d: %s"):format(padded_tokens, s1[1]))
  T.eq(#l1, 8, "8 logged steps")
  for i = 1, #l0 do
    T.near(l1[i], l0[i], 1e-5, 1e-5, "step " .. i .. " loss")
    T.near(n1[i], n0[i], 1e-4, 1e-4, "step " .. i .. " grad_norm")
    assert(n1[i] > 0, "grad_norm > 0")
  end
  T.near(e1, e0, 1e-5, 1e-5, "eval_loss")
  assert(l1[#l1] < 0.8 * l1[1], ("loss %g -> %g did not fall by 20%%"):format(l1[1], l1[#l1]))
  -- the loss options ride along: label smoothing, Liger's fused linear cross-entropy (the chunked head)
  for _, extra in ipairs { { label_smoothing_factor = 0.1 }, { use_liger_kernel = true } } do
    local k = next(extra)
    local a0, b0, c0 = train(false, extra)
    local a1, b1, c1, s = train(nil, extra)
    assert(s[1]:match("^1x"), k .. ": unpadded")
    for i = 1, #a0 do
      T.near(a1[i], a0[i], 1e-5, 1e-5, k .. ": step " .. i .. " loss")
      T.near(b1[i], b0[i], 1e-4, 1e-4, k .. ": step " .. i .. " grad_norm")
    end
    T.near(c1, c0, 1e-5, 1e-5, k .. ": eval_loss")
    if extra.label_smoothing_factor then assert(math.abs(a1[1] - l1[1]) > 1e-3, "label smoothing: another loss") end
  end
end)

T.test("SFTTrainer without packing (TRL's default): padded batches unpadded; TRL's token statistics as padded", function()
  local texts = {}
  for line in T.read_file((ZRUN_HOME or ".") .. "/recipes/data/sample.txt"):gmatch("[^\n]+") do
    texts[#texts + 1] = { text = line:sub(1, 8 + (#texts * 13) % 40) }
    if #texts == 20 then break end
  end
  local function sft(unpad)
    zr.manual_seed(3)
    local m = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
    local n1 = T.count_one_row_forwards(m)
    local t
    T.printed(function()
      t = zr.SFTTrainer { model = m, processing_class = tok, train_dataset = zr.datasets.Dataset.from_rows(texts),
        eval_dataset = zr.datasets.Dataset.from_rows({ unpack(texts, 1, 6) }),
        args = { output_dir = T.tmpdir(), per_device_train_batch_size = 4, max_steps = 4, learning_rate = 3e-3,
          logging_steps = 1, save_strategy = "no", report_to = "none", per_device_eval_batch_size = 4 } }
      t.unpad_batches = unpad
      t:train()
    end)
    local ev
    T.printed(function() ev = t:evaluate() end)
    local last
    for _, r in ipairs(t.state.log_history) do if r.loss then last = r end end
    return last, ev, n1()
  end
  local a, ea, na = sft(false)
  local b, eb, nb = sft(nil)
  T.eq(na, 0, "unpad_batches = false: padded batches")
  assert(nb >= 5, "unpadded: training and evaluation batches as one row, " .. nb)
  -- the gradient norm within 1e-4 as in the test above: four steps at this learning rate carry the rounding of other
  -- GEMM shapes (on an AVX2 CPU 7e-5 apart; on AVX-512 within 1e-5)
  for _, k in ipairs { "loss", "grad_norm", "entropy", "mean_token_accuracy", "num_tokens" } do
    local tol = k == "grad_norm" and 1e-4 or 1e-5
    T.near(b[k], a[k], tol, tol, "step 4's " .. k)
  end
  for _, k in ipairs { "eval_loss", "eval_entropy", "eval_mean_token_accuracy" } do T.near(eb[k], ea[k], 1e-5, 1e-5, k) end
end)

T.done()
