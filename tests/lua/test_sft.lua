-- zr.sft / zr.SFTTrainer (TRL's SFT on chat and instruction rows) with the byte tokenizer: the rows'
-- labels by hand for each dataset type, the loss over the completion tokens only (in double by hand),
-- a tiny Llama that learns its answers, and the refusals. Against transformers and the real TinyLlama
-- chat tokenizer: tests/lua/test_sft_golden.lua.
local zr = require "zrun"
local T = zr.testing

local tmp = T.tmpdir()
local tok = zr.tokenizers.ByteTokenizer.new()
local TPL = "{% for m in messages %}{% if m.role == 'assistant' %}{{ 'A: ' }}{% generation %}{{ m.content + eos_token }}" ..
  "{% endgeneration %}{% else %}{{ 'U: ' + m.content + '\\n' }}{% endif %}{% endfor %}" ..
  "{% if add_generation_prompt %}{{ 'A: ' }}{% endif %}"
local function bytes(s, first) -- the byte tokenizer's ids of s
  local out = first and { first } or {}
  for i = 1, #s do out[#out + 1] = s:byte(i) + 3 end
  return out
end
local function cat(...)
  local out = {}
  for _, t in ipairs { ... } do for _, v in ipairs(t) do out[#out + 1] = v end end
  return out
end
local function masked(n) local out = {}; for i = 1, n do out[i] = -100 end; return out end

T.test("the byte tokenizer: its special strings are its special ids; chat template with generation masks", function()
  T.eq_list(tok:encode("a</s>", false), { 100, 2 })
  local conv = { { role = "user", content = "hi" }, { role = "assistant", content = "hello" } }
  T.eq(tok:apply_chat_template(conv, { chat_template = TPL, tokenize = false }), "U: hi\nA: hello</s>")
  local out = tok:apply_chat_template(conv, { chat_template = TPL, return_dict = true, return_assistant_tokens_mask = true })
  T.eq_list(out.input_ids, cat(bytes("U: hi\nA: hello"), { 2 }))
  T.eq_list(out.assistant_masks, { 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1 })
  T.eq_list(tok:apply_chat_template({ conv[1] }, { chat_template = TPL, add_generation_prompt = true }), bytes("U: hi\nA: "))
  T.raises(function() tok:apply_chat_template(conv) end, "has no chat template")
  T.raises(function() tok:apply_chat_template(conv, { chat_template = "x", return_assistant_tokens_mask = true }) end,
    "needs return_dict = true")
end)

T.test("chat templates from a tokenizer's files: chat_template.jinja, named ones, save_pretrained keeps them", function()
  local d = tmp .. "/tokdir"
  local b = zr.tokenizers.ByteTokenizer.new()
  b:set_chat_template(TPL)
  b:save_pretrained(d) -- the byte tokenizer in Hugging Face's format, with chat_template.jinja
  local conv = { { role = "user", content = "hi" }, { role = "assistant", content = "hello" } }
  local t = zr.tokenizers.load(d)
  T.eq(t:apply_chat_template(conv, { tokenize = false }), "U: hi\nA: hello</s>")
  T.eq_list(t:apply_chat_template(conv), b:apply_chat_template(conv), "the same ids as the byte tokenizer's")
  zr._C.makedirs(d .. "/additional_chat_templates")
  local f = assert(io.open(d .. "/additional_chat_templates/short.jinja", "w"))
  f:write("{{ messages[0].content }}")
  f:close()
  local t2 = zr.tokenizers.load(d)
  T.eq(t2:apply_chat_template(conv, { chat_template = "short", tokenize = false }), "hi", "a named template")
  T.eq(t2:apply_chat_template(conv, { chat_template = "{{ 'x' }}", tokenize = false }), "x", "a template given inline")
  local saved = t2:save_pretrained(d .. "2")
  T.eq(table.concat(saved, " "), "tokenizer.json tokenizer_config.json chat_template.jinja additional_chat_templates/short.jinja")
  T.eq(zr.tokenizers.load(d .. "2"):apply_chat_template(conv, { chat_template = "short", tokenize = false }), "hi")
  -- tokenizer_config.json's list form; "tool_use" when tools are given
  local cfgp = d .. "/tokenizer_config.json"
  local cfg = require("cjson").decode(T.read_file(cfgp))
  cfg.chat_template = { { name = "default", template = "D" }, { name = "tool_use", template = "T{{ tools | length }}" } }
  f = assert(io.open(cfgp, "w")); f:write(require("cjson").encode(cfg)); f:close()
  os.remove(d .. "/chat_template.jinja")
  local t3 = zr.tokenizers.load(d)
  T.eq(t3:apply_chat_template(conv, { tokenize = false }), "D")
  T.eq(t3:apply_chat_template(conv, { tokenize = false, tools = { { name = "f" } } }), "T1")
  -- a tokenizer.json alone: the special tokens the tokenizer finds itself (post-processor, known names)
  os.remove(cfgp)
  T.eq(zr.tokenizers.load(d):apply_chat_template(conv, { chat_template = "{{ bos_token }}-{{ eos_token }}", tokenize = false }),
    "<s>-</s>")
end)

T.test("TRL's rows: text (+eos), prompt-completion (the completion learned), messages, assistant_only_loss, ShareGPT", function()
  local S = zr.sft
  local r = S.prepare({ { text = "ab" } }, tok)[1]
  T.eq_list(r.input_ids, { 1, 100, 101, 2 }, "text: bos, bytes, eos appended")
  T.eq_list(r.labels, r.input_ids)
  r = S.prepare({ { prompt = "Q?", completion = "ok" } }, tok)[1]
  T.eq_list(r.input_ids, cat(bytes("Q?", 1), bytes("ok"), { 2 }))
  T.eq_list(r.labels, cat(masked(3), bytes("ok"), { 2 }), "prompt-completion: only the completion and its eos")
  r = S.prepare({ { prompt = "Q?", completion = "ok" } }, tok, { completion_only_loss = false })[1]
  T.eq_list(r.labels, r.input_ids, "completion_only_loss = false: every token")
  local conv = { { role = "user", content = "hi" }, { role = "assistant", content = "yo" },
    { role = "user", content = "bye" }, { role = "assistant", content = "ciao" } }
  r = S.prepare({ { messages = conv } }, tok, { chat_template = TPL })[1]
  local ids = cat(bytes("U: hi\nA: yo"), { 2 }, bytes("U: bye\nA: ciao"), { 2 })
  T.eq_list(r.input_ids, ids)
  T.eq_list(r.labels, ids, "messages: every token by default (TRL's assistant_only_loss = false)")
  r = S.prepare({ { messages = conv } }, tok, { chat_template = TPL, assistant_only_loss = true })[1]
  T.eq_list(r.labels, cat(masked(9), bytes("yo"), { 2 }, masked(10), bytes("ciao"), { 2 }), "assistant_only_loss: both assistant turns")
  r = S.prepare({ { prompt = { conv[1] }, completion = { conv[2] } } }, tok, { chat_template = TPL })[1]
  T.eq_list(r.labels, cat(masked(9), bytes("yo"), { 2 }), "conversational prompt-completion: after the generation prompt")
  r = S.prepare({ { messages = conv } }, tok, { chat_template = TPL, eos_token = "<pad>" })[1]
  T.eq_list(r.input_ids, cat(bytes("U: hi\nA: yo"), { 0 }, bytes("U: bye\nA: ciao"), { 0 }),
    "eos_token given: the template's eos_token (TRL sets the tokenizer's)")
  local sg = S.prepare({ { conversations = { { from = "human", value = "hi" }, { from = "gpt", value = "yo" } } } }, tok,
    { chat_template = TPL })[1]
  T.eq_list(sg.input_ids, cat(bytes("U: hi\nA: yo"), { 2 }), "ShareGPT rows become messages")
  local long = S.prepare({ { prompt = "Q?", completion = "abcdef" } }, tok, { max_length = 5 })[1]
  T.eq_list(long.input_ids, cat(bytes("Q?", 1), bytes("ab")), "keep_start")
  long = S.prepare({ { prompt = "Q?", completion = "abcdef" } }, tok, { max_length = 5, truncation_mode = "keep_end" })[1]
  T.eq_list(long.labels, cat(bytes("cdef"), { 2 }), "keep_end")
  local ds = S.prepare({ { prompt = "a long prompt", completion = "x" }, { prompt = "Q", completion = "y" } }, tok, { max_length = 4 })
  T.eq(#ds, 1, "a row truncation left with no label is dropped (TRL)")
  T.eq(ds.sft.dropped, 1)
  T.eq_list(S.prepare({ { input_ids = { 5, 6 }, labels = { -100, 6 } } }, tok)[1].labels, { -100, 6 }, "tokenized rows kept")
  local pr = S.prepare({ { input_ids = { 5, 6, 7, 8 }, labels = { -100, 6, 7, 8 } } }, tok, { max_length = 3 })[1]
  T.eq_list(pr.labels, { -100, 6, 7 }, "tokenized rows are truncated too")
  T.eq_list(S.prepare({ { input_ids = { 5, 6, 7 }, completion_mask = { 0, 1, 1 }, assistant_masks = { 1, 1, 0 } } }, tok,
    { completion_only_loss = true })[1].labels, { -100, 6, -100 }, "tokenized rows' masks (TRL's columns)")
  -- TRL's "wrapped" packing: the rows joined and cut into max_length blocks, the last one shorter
  local pk = S.prepare({ { prompt = "Q?", completion = "ab" }, { prompt = "R", completion = "cde" } }, tok,
    { packing = true, packing_strategy = "wrapped", max_length = 4 })
  local all_ids = cat(bytes("Q?", 1), bytes("ab"), { 2 }, bytes("R", 1), bytes("cde"), { 2 })
  local all_labels = cat(masked(3), bytes("ab"), { 2 }, masked(2), bytes("cde"), { 2 })
  T.eq(#all_ids, 12)
  T.eq(#pk, 3, "12 tokens in blocks of 4")
  for b = 1, 3 do
    local lo = (b - 1) * 4
    T.eq_list(pk[b].input_ids, { unpack(all_ids, lo + 1, lo + 4) }, "block " .. b)
    T.eq_list(pk[b].labels, { unpack(all_labels, lo + 1, lo + 4) }, "block " .. b .. " labels")
  end
  T.eq(#S.prepare({ { text = "abcdefg" } }, tok, { packing = true, packing_strategy = "wrapped", max_length = 4 })[2].input_ids,
    4, "9 tokens: blocks of 4, 4 and 1 (the last one shorter)")
  local sg2 = S.prepare({ { conversations = { { from = "human", value = "hi" }, { from = "tool", value = "x" } } } }, tok,
    { chat_template = "{% for m in messages %}{{ m.role }};{% endfor %}" })[1]
  T.eq_list(sg2.input_ids, bytes("user;tool;"), "ShareGPT: human -> user, other speakers kept")
  -- formatting_func (TRL): each row's text from a function, then language modeling
  local ff = S.prepare({ { q = "a", a = "b" } }, tok, { formatting_func = function(r) return r.q .. "=" .. r.a end })[1]
  T.eq_list(ff.labels, cat(bytes("a=b", 1), { 2 }), "formatting_func: text + eos, every token learned")
  T.raises(function() S.prepare({ { prompt = "a", completion = "b" } }, tok, { formatting_func = function(r) return r.prompt end }) end,
    "set completion_only_loss = false")
  -- (TRL keeps reading prompt-completion rows from their fields: the formatted text unused, and the eos it
  -- appends to that text, not to the completion)
  T.eq_list(T.printed(S.prepare, { { prompt = "a", completion = "b" } }, tok,
    { formatting_func = function(r) return r.prompt end, completion_only_loss = false }) and
    S.prepare({ { prompt = "a", completion = "b" } }, tok, { formatting_func = function(r) return r.prompt end,
      completion_only_loss = false })[1].input_ids, bytes("ab", 1), "formatting_func on prompt-completion rows")
end)

T.test("packing_strategy bfd-requeue: TRL 1.10's deprecated name of bfd_split, said once", function()
  local S = zr.sft
  local rows = { { text = "abcdefghij" }, { text = "abc" }, { text = "abcdef" } }
  local want = S.prepare(rows, tok, { packing = true, packing_strategy = "bfd_split", max_length = 5 })
  local got
  T.printed(function() got = S.prepare(rows, tok, { packing = true, packing_strategy = "bfd-requeue", max_length = 5 }) end,
    'renamed "bfd_split"')
  T.eq(#got, #want)
  for i = 1, #want do T.eq(table.concat(got[i].input_ids, ","), table.concat(want[i].input_ids, ","), "block " .. i) end
end)

T.test("refusals: one line each, naming the fix", function()
  local S = zr.sft
  T.raises(function() S.prepare({ { text = "a" } }, tok, { packing = true, packing_strategy = "ffd" }) end,
    'packing_strategy ffd is not one of "bfd"')
  T.raises(function() S.prepare({ { text = "a" } }, tok, { padding_free = true }) end, "padding_free is the collator's")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { packing = true, packing_strategy = "wrapped", max_length = false }) end,
    "packing = true needs max_length")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { loss_type = "dft" }) end,
    "loss_type dft is SFTTrainer's (the model's loss), not a row preparation option")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { loss_type = "focal" }) end,
    "loss_type focal is not one of \"nll\", \"chunked_nll\" or \"dft\"")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { activation_offloading = true }) end,
    "activation_offloading = true (TRL moves the saved activations to the CPU) is not implemented")
  -- TRL's default when left unset: the same loss as "nll"
  T.eq(#S.prepare({ { text = "a" } }, tok, { loss_type = "chunked_nll" }).rows, 1)
  -- a row the template refuses is named, by its file's row where the dataset says which file
  local chat = { { role = "user", content = "hi" }, { role = "assistant", content = "hello" } }
  local bare = zr.tokenizers.ByteTokenizer.new() -- (no template)
  T.raises(function() S.prepare({ { messages = chat } }, bare, {}) end, "sft: the rows are conversational but the " ..
    "tokenizer has no chat template (no \"chat_template\" in its tokenizer_config.json and no chat_template.jinja): " ..
    "set chat_template_path to a .jinja file")
  local ds = zr.datasets.Dataset.from_rows({ { messages = chat }, { messages = "oops" } })
  T.raises(function() S.prepare(ds, tok, { chat_template = "{{ messages[0].content }}" }) end,
    "sft: row 2: apply_chat_template: messages must be a non-empty list")
  ds.source, ds.row_offset = "rows.jsonl", 10
  T.raises(function() S.prepare(ds, tok, { chat_template = "{{ messages[0].content }}" }) end,
    "sft: row 12 of rows.jsonl: apply_chat_template: messages must be a non-empty list")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { max_lenght = 3 }) end, "unknown option 'max_lenght'")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { completion_only_loss = true }) end, "needs prompt + completion rows")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { assistant_only_loss = true }) end, "needs conversational rows")
  T.raises(function() S.prepare({ { foo = 1 } }, tok) end, "cannot tell this dataset's type from its first row's fields (foo)")
  -- vision rows (TRL's test: an image or images field) are refused, not trained on their text alone; by
  -- SFTTrainer also under skip_prepare_dataset (TRL checks before reading it)
  T.raises(function() S.prepare({ { text = "a", image = "x.png" } }, tok) end, "sft: the rows have an image field")
  T.raises(function() zr.SFTTrainer { model = {}, processing_class = tok, args = { output_dir = tmp .. "/v",
    dataset_kwargs = { skip_prepare_dataset = true } }, train_dataset = { { input_ids = { 1, 2 }, images = { "x.png" } } } }
  end, "SFTTrainer: the rows have an images field, so they are a vision dataset")
  T.raises(function() S.prepare({ { text = "a" }, { prompt = "b", completion = "c" } }, tok) end, "row 2 is prompt_completion")
  T.raises(function()
    S.prepare({ { messages = { { role = "user", content = "a" } } } }, tok,
      { assistant_only_loss = true, chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}" })
  end, "{% generation %}")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { max_length = 0 }) end, "max_length must be a positive integer")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { pad_token = "<pad>" }) end, "pad_token is the collator's")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { chat_template = TPL }) end, "a chat template is used by conversational rows only")
  T.raises(function() S.prepare({ { prompt = "a", completion = "b" } }, tok, { dataset_text_field = "body" }) end,
    "dataset_text_field names the text of language-modeling rows")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { packing_strategy = "wrapped" }) end, "packing_strategy is read with packing = true only")
  T.raises(function() S.prepare({ { text = "a" } }, tok, { truncation_mode = "keep_end", max_length = false }) end,
    "truncation_mode is read when rows are truncated")
end)

-- A small instruction set: each answer is a function of its question, so a tiny model can learn it.
local function qa_rows()
  local rows = {}
  for i, w in ipairs { "red", "blue", "green", "cyan", "pink", "gold", "gray", "teal" } do
    rows[i] = { messages = { { role = "user", content = "colour " .. i }, { role = "assistant", content = w } } }
  end
  return rows
end
local function trainer(extra, args)
  zr.manual_seed(7)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  local a = { output_dir = tmp .. "/sft", save_strategy = "no", logging_steps = 1, per_device_train_batch_size = 4,
    gradient_accumulation_steps = 1, learning_rate = 3e-3, lr_scheduler_type = "constant", max_steps = 60,
    assistant_only_loss = true, train_sampling_strategy = "sequential" }
  for k, v in pairs(args or {}) do a[k] = v end
  tok:set_chat_template(TPL)
  local o = { model = zr.models.llama.LlamaForCausalLM(cfg), train_dataset = zr.datasets.Dataset.from_rows(qa_rows()),
    processing_class = tok, args = a }
  for k, v in pairs(extra or {}) do o[k] = v end
  return zr.SFTTrainer(o)
end

T.test("SFTTrainer: the first loss is the mean over the assistant tokens only (double, by hand)", function()
  local t = trainer(nil, { max_steps = 1, optim = "sgd", learning_rate = 0, bf16 = false })
  local m = t.model
  local rows = t.train_dataset
  local b = zr.datasets.causal_lm_collator { pad_token_id = 0 } { rows[1], rows[2], rows[3], rows[4] }
  local logits = zr.no_grad(function() return m(b.input_ids).logits end):to("f64")
  local V, L = logits:size(3), logits:size(2)
  local lg, lab = logits:flat_table(), b.labels:flat_table()
  local tot, cnt, ent, hits = 0, 0, 0, 0
  for r = 1, 4 do
    for p = 1, L - 1 do
      local y = lab[(r - 1) * L + p + 1]
      if y ~= -100 then
        local base, mx, s, am, sx = ((r - 1) * L + p - 1) * V, -math.huge, 0, 0, 0
        for j = 1, V do if lg[base + j] > mx then mx, am = lg[base + j], j - 1 end end
        for j = 1, V do s = s + math.exp(lg[base + j] - mx) end
        for j = 1, V do sx = sx + math.exp(lg[base + j] - mx) / s * lg[base + j] end
        tot, cnt = tot + mx + math.log(s) - lg[base + y + 1], cnt + 1
        ent, hits = ent + mx + math.log(s) - sx, hits + (am == y and 1 or 0)
      end
    end
  end
  T.eq(cnt, 20, "counted: each answer's bytes + its eos (red, blue, green, cyan)")
  t:train()
  local rec = t.state.log_history[1]
  T.near(rec.loss, tot / cnt, 1e-5, 1e-5, "logged loss = the token mean over the assistant tokens")
  -- TRL's entropy and mean_token_accuracy: over the same tokens, of the softmax and argmax at the position before
  T.near(rec.entropy, ent / cnt, 1e-5, 1e-5, "logged entropy")
  T.near(rec.mean_token_accuracy, hits / cnt, 1e-12, 0, "logged mean_token_accuracy")
end)

T.test("loss_type dft (TRL's): the first loss is the probability-weighted token mean (double, by hand)", function()
  local t = trainer(nil, { max_steps = 1, optim = "sgd", learning_rate = 0, bf16 = false, loss_type = "dft" })
  T.eq(t.loss_type, "dft")
  local m = t.model
  local b = zr.datasets.causal_lm_collator { pad_token_id = 0 } { t.train_dataset[1], t.train_dataset[2],
    t.train_dataset[3], t.train_dataset[4] }
  local logits = zr.no_grad(function() return m(b.input_ids).logits end):to("f64")
  local V, L = logits:size(3), logits:size(2)
  local lg, lab = logits:flat_table(), b.labels:flat_table()
  local tot, plain, cnt = 0, 0, 0
  for r = 1, 4 do
    for p = 1, L - 1 do
      local y = lab[(r - 1) * L + p + 1]
      if y ~= -100 then
        local base, mx, s = ((r - 1) * L + p - 1) * V, -math.huge, 0
        for j = 1, V do mx = math.max(mx, lg[base + j]) end
        for j = 1, V do s = s + math.exp(lg[base + j] - mx) end
        local ce = mx + math.log(s) - lg[base + y + 1]
        tot, plain, cnt = tot + math.exp(-ce) * ce, plain + ce, cnt + 1
      end
    end
  end
  t:train()
  T.near(t.state.log_history[1].loss, tot / cnt, 1e-5, 1e-5, "logged loss = mean over the assistant tokens of p * ce")
  -- evaluation: eval_loss the dft loss, the perplexity that of the plain cross-entropy
  local ev = t:evaluate(zr.datasets.Dataset.from_rows { qa_rows()[1], qa_rows()[2], qa_rows()[3], qa_rows()[4] })
  T.near(ev.eval_loss, tot / cnt, 1e-5, 1e-5, "eval_loss")
  T.near(ev.eval_perplexity, math.exp(plain / cnt), 0, 1e-6, "eval_perplexity: of the plain cross-entropy")
end)

T.test("loss_type dft: the gradient is each counted row's softmax - onehot times its probability, over the count (by hand)", function()
  zr.manual_seed(3)
  local B, L, V = 2, 5, 7
  local x = zr.randn({ B, L, V }, { dtype = "f64" }):requires_grad_()
  local labels = zr.tensor({ { 1, 2, 3, -100, 4 }, { 0, 6, 5, 2, 1 } }, { dtype = "i64" })
  local loss = zr.models.llama.causal_lm_loss(x, labels, false, nil, "dft")
  loss:backward()
  local lg, lab, g = x:detach():flat_table(), labels:flat_table(), x.grad:flat_table()
  local want, tot, cnt = {}, 0, 0
  for i = 1, B * L * V do want[i] = 0 end
  for r = 1, B do
    for p = 1, L - 1 do
      local y = lab[(r - 1) * L + p + 1]
      if y ~= -100 then
        cnt = cnt + 1
        local base, s = ((r - 1) * L + p - 1) * V, 0
        for j = 1, V do s = s + math.exp(lg[base + j]) end
        local py = math.exp(lg[base + y + 1]) / s
        tot = tot - py * math.log(py)
        for j = 1, V do want[base + j] = py * (math.exp(lg[base + j]) / s - (j - 1 == y and 1 or 0)) end
      end
    end
  end
  T.eq(cnt, 7)
  T.near(loss:item(), tot / cnt, 1e-12, 1e-12, "loss")
  for i = 1, B * L * V do T.near(g[i], want[i] / cnt, 1e-12, 1e-12, "gradient element " .. i) end
  T.raises(function() zr.models.llama.causal_lm_loss(x, labels, false, 0.1, "dft") end, "takes no label smoothing")
  T.raises(function() zr.models.llama.causal_lm_loss(x, labels, false, nil, "focal") end, "not one of")
end)

T.test("loss_type dft learns the answers too; label smoothing is said to do nothing beside it; bad values refused", function()
  local t = trainer(nil, { loss_type = "dft", label_smoothing_factor = 0.1 })
  T.eq(t.args.label_smoothing_factor, 0, "TRL's dft loss replaces the label smoother")
  local before = t:evaluate(t.train_dataset)
  t:train()
  local after = t:evaluate(t.train_dataset)
  for _, r in ipairs(t.state.log_history) do if r.loss then assert(r.grad_norm > 0, "gradient norm 0 at step " .. r.step) end end
  assert(after.eval_perplexity < 0.2 * before.eval_perplexity, ("plain perplexity %.3f -> %.3f: not 80%% lower"):format(
    before.eval_perplexity, after.eval_perplexity))
  -- (fewer than nll's 100% in as many steps: each token's gradient is scaled by its probability, ~1/V at first, so
  -- the tokens the model already favours learn first; chance is 1/259)
  assert(after.eval_mean_token_accuracy >= 0.5, "teacher-forced answer tokens right: " .. after.eval_mean_token_accuracy)
  T.raises(function() trainer(nil, { loss_type = "focal" }) end, "SFTTrainer: loss_type \"focal\" is not one of")
  T.eq(trainer(nil, { loss_type = "chunked_nll" }).loss_type, nil, "chunked_nll: the plain loss")
end)

T.test("loss_type chunked_nll (TRL's default): the plain loss without the full logits; nll, Liger, LoRA on lm_head", function()
  T.eq(trainer(nil, {}).chunked_loss, true, "unset: TRL's default chunked_nll, the models' chunked_loss")
  T.eq(trainer(nil, { loss_type = "chunked_nll" }).chunked_loss, true, "chunked_nll")
  T.eq(trainer(nil, { loss_type = "nll" }).chunked_loss or nil, nil, "nll: the full logits")
  T.eq(trainer(nil, { use_liger_kernel = true }).chunked_loss, true, "use_liger_kernel: Liger's fused linear cross-entropy")
  T.raises(function() trainer(nil, { use_liger_kernel = true, loss_type = "chunked_nll" }) end,
    "loss_type \"chunked_nll\" is not compatible with use_liger_kernel = true")
  -- the same training: losses, gradient norms and TRL's token metrics as with nll, step for step
  local function run(lt)
    local t = trainer(nil, { loss_type = lt, max_steps = 8 })
    t:train()
    local ev = t:evaluate(t.train_dataset)
    local l = {}
    for _, r in ipairs(t.state.log_history) do if r.loss then l[#l + 1] = { r.loss, r.grad_norm, r.mean_token_accuracy, r.entropy } end end
    return l, ev
  end
  local a, ea = run("chunked_nll")
  local b, eb = run("nll")
  for i = 1, #b do
    for k = 1, 4 do T.near(a[i][k], b[i][k], 1e-6, 1e-4, ("step %d metric %d"):format(i, k)) end
  end
  assert(a[#a][1] < 0.7 * a[1][1], ("chunked_nll: loss %g -> %g did not fall 30%%"):format(a[1][1], a[#a][1]))
  for _, k in ipairs { "eval_loss", "eval_perplexity", "eval_mean_token_accuracy", "eval_entropy" } do
    T.near(ea[k], eb[k], 1e-6, 1e-4, k)
  end
  -- a LoRA adapter on lm_head: TRL's chunked_nll refuses it; unset, the full logits (said); asked for, refused
  local lora = zr.peft.LoraConfig { r = 2, target_modules = { "q_proj", "lm_head" } }
  local out, t = T.printed(trainer, { peft_config = lora }, {})
  T.eq(t.chunked_loss or nil, nil, "LoRA on lm_head, loss_type unset: the full logits")
  assert(out:find("the loss runs with the full logits", 1, true), out)
  T.raises(function() trainer({ peft_config = lora }, { loss_type = "chunked_nll" }) end,
    "loss_type \"chunked_nll\" is not supported when lm_head has a LoRA adapter")
end)

T.test("eval_num_tokens is TRL's count at the evaluation's step; trainer_state.json writes num_tokens as TRL (floats)", function()
  -- TRL 1.10 (logging_steps 4, eval_steps 3, max_steps 6): eval_num_tokens at step 3 is the tokens of steps 1-3
  -- (TRL counts every micro-batch; zrun had 0, the count of the last log), at step 6 those of steps 1-6 (zrun had
  -- steps 1-4's); TRL averages its metric lists, so num_tokens and eval_num_tokens are floats ("300.0")
  local t = trainer({ eval_dataset = zr.datasets.Dataset.from_rows(qa_rows()) }, { max_steps = 6, logging_steps = 4,
    eval_strategy = "steps", eval_steps = 3, save_strategy = "steps", save_steps = 6, output_dir = tmp .. "/sft_ntok" })
  t:train()
  local per = {}
  for i, r in ipairs(t.train_dataset) do per[i] = #r.input_ids end
  local function upto(steps) local n = 0; for k = 1, 4 * steps do n = n + per[(k - 1) % 8 + 1] end; return n end
  local evals = {}
  for _, r in ipairs(t.state.log_history) do if r.eval_num_tokens then evals[r.step] = r.eval_num_tokens end end
  T.eq(evals[3], upto(3), "eval_num_tokens at step 3"); T.eq(evals[6], upto(6), "eval_num_tokens at step 6")
  local f = assert(io.open(tmp .. "/sft_ntok/checkpoint-6/trainer_state.json")); local text = f:read("*a"); f:close()
  T.eq(text:find(('"eval_num_tokens": %d.0,'):format(upto(3)), 1, true) ~= nil, true, "eval_num_tokens a float")
  T.eq(text:find(('"num_tokens": %d.0,'):format(upto(4)), 1, true) ~= nil, true, "num_tokens a float")
end)

T.test("the final metrics carry TRL's training metrics of the steps after the last log", function()
  -- TRL 1.10 (logging_steps 4, max_steps 6, no evaluation): its log() in training mode adds entropy,
  -- mean_token_accuracy (means over steps 5-6's micro-batches) and num_tokens (the run's total) to the final
  -- metrics and their record; an evaluation at the last step (its model then in evaluation mode) or a log there adds none
  local function run(extra, a)
    local o = { max_steps = 6, logging_steps = 4, output_dir = tmp .. "/sft_final" }
    for k, v in pairs(a or {}) do o[k] = v end
    local t = trainer(extra, o)
    return t, t:train().metrics
  end
  local t, m = run()
  local per = {}
  for i, r in ipairs(t.train_dataset) do per[i] = #r.input_ids end
  local total = 0
  for k = 1, 24 do total = total + per[(k - 1) % 8 + 1] end
  T.eq(m.num_tokens, total, "num_tokens")
  T.eq(type(m.entropy) == "number" and m.mean_token_accuracy >= 0 and m.mean_token_accuracy <= 1, true)
  local last = t.state.log_history[#t.state.log_history]
  T.eq(last.train_loss ~= nil and last.num_tokens == total and last.entropy == m.entropy, true, "in the final record")
  _, m = run({ eval_dataset = zr.datasets.Dataset.from_rows(qa_rows()) }, { eval_strategy = "steps", eval_steps = 3 })
  T.eq(m.entropy == nil and m.num_tokens == nil and m.mean_token_accuracy == nil, true, "evaluated at the last step: none")
  _, m = run(nil, { logging_steps = 3 })
  T.eq(m.entropy == nil and m.num_tokens == nil, true, "logged at the last step: none")
end)

T.test("SFTTrainer learns the answers: loss falls 80%, gradient norm > 0, teacher-forced answers right", function()
  local t = trainer()
  t:train()
  local hist = {}
  for _, r in ipairs(t.state.log_history) do if r.loss then hist[#hist + 1] = r end end
  local first, last = hist[1].loss, hist[#hist].loss
  assert(last < 0.2 * first, ("loss %.4f -> %.4f: not 80%% lower"):format(first, last))
  for _, r in ipairs(hist) do assert(r.grad_norm > 0, "gradient norm 0 at step " .. r.step) end
  -- TRL's num_tokens: the non-padding tokens trained on so far (4 rows a step, in order, 8 rows an epoch)
  local per = {}
  for i, r in ipairs(t.train_dataset) do per[i] = #r.input_ids end
  local want = 0
  for k = 1, 4 do want = want + per[(k - 1) % 8 + 1] end
  T.eq(hist[1].num_tokens, want, "num_tokens after step 1")
  for k = 5, 8 do want = want + per[k] end
  T.eq(hist[2].num_tokens, want, "num_tokens after step 2")
  local rows, right, total = t.train_dataset, 0, 0
  local b = zr.datasets.causal_lm_collator { pad_token_id = 0 } (rows)
  local logits = zr.no_grad(function() return t.model(b.input_ids).logits end):to("f64")
  local lg, lab, L, V = logits:flat_table(), b.labels:flat_table(), b.labels:size(2), logits:size(3)
  for r = 1, #rows do
    for p = 1, L - 1 do
      local y = lab[(r - 1) * L + p + 1]
      if y ~= -100 then
        local base, best = ((r - 1) * L + p - 1) * V, 1
        for j = 2, V do if lg[base + j] > lg[base + best] then best = j end end
        total, right = total + 1, right + (best - 1 == y and 1 or 0)
      end
    end
  end
  assert(right >= 0.9 * total, ("teacher-forced answer tokens right: %d of %d"):format(right, total))
  local ev = t:evaluate(t.train_dataset)
  T.near(ev.eval_mean_token_accuracy, right / total, 1e-12, 0, "eval_mean_token_accuracy (TRL's) = the by-hand share")
end)

T.test("SFTTrainer saves and resumes bit for bit (random sampling, assistant_only_loss); the saved tokenizer keeps the template", function()
  local function run(extra, resume)
    local t = trainer(nil, { output_dir = tmp .. "/resume", max_steps = 5, save_strategy = "steps", save_steps = 2,
      train_sampling_strategy = "random", per_device_train_batch_size = 2, gradient_accumulation_steps = 2,
      optim = "adamw_torch" })
    for k, v in pairs(extra or {}) do t.args[k] = v end
    t:train(resume)
    local l = {}
    for _, r in ipairs(t.state.log_history) do if r.loss then l[r.step] = r.loss end end
    return l
  end
  local straight = run()
  local resumed = run({ save_strategy = "no" }, tmp .. "/resume/checkpoint-2")
  for s = 3, 5 do T.eq(resumed[s], straight[s], "loss at step " .. s) end
  assert(straight[5] ~= straight[3], "the steps differ")
  local back = zr.tokenizers.load(tmp .. "/resume/checkpoint-4")
  T.eq(back:apply_chat_template(qa_rows()[1].messages, { tokenize = false }), "U: colour 1\nA: red</s>",
    "the checkpoint's tokenizer renders with the SFT template")
end)

T.test("SFTTrainer takes TRL's defaults (lr 2e-5, logging 10, bf16, checkpointing) where the config leaves them", function()
  zr.manual_seed(7)
  local function args(a, extra)
    local o = { model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama")),
      train_dataset = zr.datasets.Dataset.from_rows(qa_rows()), processing_class = tok, args = a }
    for k, v in pairs(extra or {}) do o[k] = v end
    local t = zr.SFTTrainer(o)
    return t.args, t
  end
  local a = args { output_dir = tmp .. "/d" }
  T.eq(a.learning_rate, 2e-5); T.eq(a.logging_steps, 10); T.eq(a.bf16, true)
  T.eq(a.gradient_checkpointing, true, "TRL's gradient checkpointing")
  T.eq(args({ output_dir = tmp .. "/d", gradient_checkpointing = false }).gradient_checkpointing, false)
  T.eq(args({ output_dir = tmp .. "/d", fp16 = true }).bf16, false, "fp16 given: no bf16")
  local b = args { output_dir = tmp .. "/d", learning_rate = 1e-3, gradient_checkpointing = true }
  T.eq(b.learning_rate, 1e-3); T.eq(b.gradient_checkpointing, true)
  local c, ct = args { output_dir = tmp .. "/d", deepspeed = { train_micro_batch_size_per_gpu = "auto",
    gradient_accumulation_steps = "auto", optimizer = { type = "AdamW", params = { lr = 3e-4 } }, bf16 = { enabled = false },
    zero_optimization = { stage = 0 } } }
  ct:setup()
  T.eq(ct.engine:get_lr()[1], 3e-4, "the DeepSpeed file's lr wins over TRL's default")
  T.eq(ct.engine.precision, "f32", "and its precision")
end)

T.test("eval_packing: the evaluation rows packed as the training rows unless it says otherwise (TRL)", function()
  local ev = zr.datasets.Dataset.from_rows(qa_rows())
  local base = { packing = true, packing_strategy = "wrapped", max_length = 64, assistant_only_loss = false }
  local function with(extra)
    local a = {}
    for k, v in pairs(base) do a[k] = v end
    for k, v in pairs(extra) do a[k] = v end
    return trainer({ eval_dataset = ev }, a)
  end
  local packed, apart = with {}, with { eval_packing = false }
  for _, r in ipairs(packed.eval_dataset) do T.eq(#r.input_ids <= 64, true, "a packed block") end
  T.eq(#packed.eval_dataset < #ev, true, "packed: fewer rows than the 8 conversations")
  T.eq(#apart.eval_dataset, #ev, "eval_packing = false: one row per conversation")
  T.eq(#packed.train_dataset, #apart.train_dataset, "the training rows packed either way")
  T.eq(#with({ eval_packing = true }).eval_dataset, #packed.eval_dataset)
  -- bfd-packed evaluation rows beside unpacked training rows: the batches padding-free (TRL pads them, and its
  -- evaluation rows then attend to each other); the evaluation runs
  local bfd_eval = trainer({ eval_dataset = ev }, { eval_packing = true, max_length = 64, assistant_only_loss = false })
  T.eq(bfd_eval.eval_dataset[1].seq_lengths ~= nil and #bfd_eval.train_dataset == #qa_rows(), true, "bfd eval rows only")
  T.eq(bfd_eval.collator(bfd_eval.eval_dataset.rows).position_ids ~= nil, true, "padding-free batches")
  local m
  T.printed(function() m = bfd_eval:evaluate() end)
  T.eq(m.eval_loss == m.eval_loss and m.eval_loss > 0, true, "an evaluation over bfd blocks")
  local up = trainer({ eval_dataset = ev }, { eval_packing = true, packing_strategy = "wrapped", max_length = 64,
    assistant_only_loss = false })
  T.eq(#up.eval_dataset < #ev and #up.train_dataset == #qa_rows(), true, "eval_packing = true without packing: eval only")
  T.raises(function() with { eval_packing = "yes" } end, 'eval_packing must be true, false or "auto"')
  local named = trainer({ eval_dataset = { a = ev, b = ev } }, { eval_packing = false, assistant_only_loss = false })
  T.eq(#named.eval_dataset.a == #ev and named.eval_dataset.b[1].input_ids ~= nil, true, "named eval datasets, each prepared")
  local said = T.printed(with, { trust_remote_code = true })
  assert(said:find("[zrun] SFTTrainer: trust_remote_code has no effect", 1, true), said)
  said = T.printed(with, { model_init_kwargs = { dtype = "bfloat16" }, router_aux_loss_coef = 0.01 })
  assert(said:find("[zrun] SFTTrainer: model_init_kwargs has no effect (TRL applies it to a model it loads by name", 1, true), said)
  assert(said:find("[zrun] SFTTrainer: router_aux_loss_coef has no effect", 1, true), said)
  T.raises(function() with { activation_offloading = true } end, "activation_offloading = true")
  -- shuffle_dataset (TRL): the prepared rows in an order drawn from args.seed, before packing and after it
  local function order(a)
    local out = {}
    for i, r in ipairs(trainer(nil, a).train_dataset) do out[i] = #r.input_ids .. ":" .. r.input_ids[#r.input_ids - 1] end
    return table.concat(out, " ")
  end
  local plain = order { assistant_only_loss = false }
  local sh = order { assistant_only_loss = false, shuffle_dataset = true }
  T.eq(sh == plain, false, "shuffled")
  T.eq(order { assistant_only_loss = false, shuffle_dataset = true }, sh, "the same order again (args.seed)")
  T.eq(order { assistant_only_loss = false, shuffle_dataset = true, seed = 7 } == sh, false, "another seed, another order")
  local sorted = function(s) local t = {}; for w in s:gmatch("%S+") do t[#t + 1] = w end; table.sort(t); return table.concat(t, " ") end
  T.eq(sorted(sh), sorted(plain), "the same rows")
  -- TRL's dataset.shuffle(seed=42) of these 8 rows: numpy.random.default_rng(42).permutation(8) + 1
  local rows, want = {}, {}
  for w in plain:gmatch("%S+") do rows[#rows + 1] = w end
  for i, k in ipairs { 4, 5, 3, 8, 7, 2, 6, 1 } do want[i] = rows[k] end
  T.eq(sh, table.concat(want, " "), "HF datasets' shuffle(seed=42) order")
end)

T.test("SFTTrainer passes the Trainer's arguments on and refuses unknown ones", function()
  T.raises(function() trainer(nil, { learnig_rate = 1 }) end, "'learnig_rate' is neither an SFTConfig nor a TrainingArguments key zrun implements (did you mean 'learning_rate'?)")
  T.raises(function() trainer(nil, { dataset_text_feild = "text" }) end, "(did you mean 'dataset_text_field'?)")
  T.raises(function() trainer(nil, { max_seq_length = 64 }) end, "'max_seq_length' was renamed 'max_length' in TRL")
  T.raises(function() trainer(nil, { padding_free = true }) end, "padding_free = true without packing does not enforce max_length")
  T.raises(function() trainer({ data_collator = function() end }, { packing = true }) end,
    "a data_collator of your own cannot be padding-free")
  T.eq(trainer(nil, { padding_free = true, max_length = false }).collator({ { input_ids = { 5, 6 } }, { input_ids = { 7 } } })
    .position_ids:flat_table()[3], 0, "padding_free without packing: rows joined, positions restart")
  T.raises(function() trainer(nil, { dataset_kwargs = { add_special_tokens = false } }) end, "dataset_kwargs takes {skip_prepare_dataset = true} only")
  T.raises(function() trainer({ data_collator = function() end }, { pad_token = "<pad>" }) end, "with data_collator given, set them there")
  local pre = zr.sft.prepare(qa_rows(), tok, { chat_template = TPL })
  local said, sk = T.printed(trainer, { train_dataset = pre }, { dataset_kwargs = { skip_prepare_dataset = true },
    max_length = 20 })
  T.eq(sk.train_dataset, pre, "skip_prepare_dataset: the rows as given")
  -- the preparation options set do nothing then (as in TRL), each said; the refused ones stay refused
  for _, k in ipairs { "assistant_only_loss", "max_length" } do
    T.eq(said:find("[zrun] SFTTrainer: " .. k .. " not used: dataset_kwargs.skip_prepare_dataset takes the rows as given",
      1, true) ~= nil, true, k .. ": " .. said)
  end
  -- (padding_free under skip_prepare_dataset: the rows as given, joined by the collator, as TRL's)
  local _, pf = T.printed(trainer, { train_dataset = pre }, { dataset_kwargs = { skip_prepare_dataset = true }, padding_free = true })
  T.eq(pf.collator({ pre[1], pre[2] }).input_ids:size(2), #pre[1].input_ids + #pre[2].input_ids, "padding-free under skip")
  -- rows with a mask but no labels would train on every token under skip: refused (as TRL), at init and in evaluate
  local masked = { { input_ids = { 5, 6, 7 }, labels = { -100, 6, 7 } }, { input_ids = { 5, 6, 7 }, completion_mask = { 0, 1, 1 } } }
  local skip = { dataset_kwargs = { skip_prepare_dataset = true }, assistant_only_loss = false }
  T.raises(function() trainer({ train_dataset = masked }, skip) end,
    "train row 2 has completion_mask but no labels")
  masked[2] = { input_ids = { 5, 6, 7 }, assistant_masks = { 0, 1, 1 } }
  T.raises(function() trainer({ eval_dataset = masked }, skip) end, "eval row 2 has assistant_masks but no labels")
  local st = trainer({ train_dataset = pre }, skip)
  T.raises(function() st:evaluate(masked) end, "eval row 2 has assistant_masks but no labels")
  T.eq(trainer({ eval_dataset = masked, data_collator = function() end }, skip).eval_dataset[2], masked[2],
    "a collator of the user's own reads the masks itself: no refusal")
  masked[2].labels = { -100, 6, 7 }
  T.eq(trainer({ train_dataset = masked }, skip).train_dataset[2], masked[2], "rows with labels and masks: taken as given")
  T.raises(function() trainer({ train_dataset = pre, processing_class = false }, { dataset_kwargs = {
    skip_prepare_dataset = true }, pad_token = "<pad>" }) end, "needs processing_class")
  local t = trainer(nil, { max_length = 20, pad_token = "<pad>", pad_to_multiple_of = 8 })
  local b = t.collator { t.train_dataset[1], t.train_dataset[2] }
  T.eq(b.input_ids:size(2), 24, "pad_to_multiple_of = 8 (rows of 19 and 20 tokens)")
end)

T.test("the recipes: sft_llama.lua trains a .jsonl of prompt-completion rows; finetune_llama.lua sends chat rows there", function()
  local bin = os.getenv("ZRUN_BIN") or "./zrun"
  local data = tmp .. "/pc.jsonl"
  local f = assert(io.open(data, "w"))
  for i = 1, 40 do f:write(require("cjson").encode({ prompt = "Say " .. i .. ":", completion = " " .. i .. " " .. i }), "\n") end
  f:close()
  local p = io.popen(("%s recipes/sft_llama.lua data=%s max_steps=6 logging_steps=2 output_dir=%s/rec 2>&1"):format(bin, data, tmp))
  local out = p:read("*a")
  p:close()
  assert(out:find("38 training rows (prompt_completion", 1, true), out)
  local first, last = out:match("done: 6 steps in [%d.]+ s, loss ([%d.]+) %-> ([%d.]+)")
  assert(first and tonumber(last) < tonumber(first), "the loss falls: " .. out)
  p = io.popen(("%s recipes/finetune_llama.lua data=%s max_steps=1 2>&1"):format(bin, data))
  out = p:read("*a")
  p:close()
  assert(out:find("train them with recipes/sft_llama.lua", 1, true), out)
  -- TRL's `--use_peft`: a LoRA adapter trained and saved (PEFT's files), the base frozen; lora_* alone said unused
  p = io.popen(("%s recipes/sft_llama.lua use_peft=true lora_r=8 lora_target_modules=q_proj,v_proj,o_proj,lm_head " ..
    "learning_rate=2e-2 max_steps=20 logging_steps=5 save_strategy=no output_dir=%s/lora 2>&1"):format(bin, tmp))
  out = p:read("*a")
  p:close()
  assert(out:find("of them trained: the LoRA adapter", 1, true), out)
  first, last = out:match("done: 20 steps in [%d.]+ s, loss ([%d.]+) %-> ([%d.]+)")
  assert(first and tonumber(last) < 0.8 * tonumber(first), "the loss falls 20%: " .. out)
  for _, name in ipairs { "adapter_model.safetensors", "adapter_config.json" } do
    assert(io.open(tmp .. "/lora/" .. name), name .. " not written: " .. out)
  end
  T.eq(io.open(tmp .. "/lora/model.safetensors"), nil, "the frozen base is not saved")
  p = io.popen(("%s recipes/sft_llama.lua lora_r=8 max_steps=1 save_strategy=no output_dir=%s/nolora 2>&1"):format(bin, tmp))
  out = p:read("*a")
  p:close()
  assert(out:find("lora_r has no effect without use_peft=true", 1, true), out)
end)

T.done()
