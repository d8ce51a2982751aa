-- zr.SFTTrainer against TRL's own SFTTrainer (tests/golden/sft_trl.json, written by
-- tests/golden/make_sft_trl_golden.py with TRL 1.10 and transformers 5.17 on the CPU): the train and eval
-- rows it prepares, case by case (where a completion's labels start, formatting_func on each row type, the
-- eos of a "text" field, completion_only_loss from the training set, wrapped packing per 1000-row batch and
-- dataset_num_proc shard, eos_token), and its collator on skip_prepare_dataset rows. ShareGPT rows are
-- compared with TRL's rows for the same turns as user / assistant (zrun renames the speakers; TRL 1.10 keeps
-- human / gpt). Needs the tokenizers from ../shared/data (or ZRUN_TEST_DATA); says SKIP without them.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"

local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local dirs = { tinyllama = data .. "/tokenizers/tinyllama-1.1b-chat-v1.0", gpt2 = data .. "/tokenizers/gpt2" }
if not io.open(dirs.tinyllama .. "/tokenizer_config.json") or not io.open(dirs.gpt2 .. "/tokenizer.json") then
  T.skip("zr.SFTTrainer against TRL's SFTTrainer", "tokenizers not found under " .. data .. "/tokenizers")
  return T.done()
end
local golden = cjson.decode(T.read_file((ZRUN_HOME or ".") .. "/tests/golden/sft_trl.json"))
local tmp = T.tmpdir()
local templates = {}
for name, src in pairs(golden.templates) do
  templates[name] = tmp .. "/" .. name .. ".jinja"
  T.write_file(templates[name], src)
end

-- the golden file's formatting functions (make_sft_trl_golden.py's FORMATS)
local FORMATS = {
  last_content = function(r) return "F:" .. r.messages[#r.messages].content end,
  q_text = function(r) return "Q: " .. r.text end,
  joined = function(r) return r.prompt .. "|" .. r.completion end,
  upper_content = function(r) return r.content:upper() end,
}
local function packing_rows() -- (make_sft_trl_golden.py's packing_rows)
  local rows = {}
  for i = 0, 2099 do
    local w = {}
    for k = 1, 1 + i % 3 do w[k] = "w" .. (i % 7) end
    rows[i + 1] = { text = table.concat(w, " ") }
  end
  return rows
end

local function bfd_rows() -- (make_sft_trl_golden.py's bfd_rows)
  local rows = {}
  for i = 0, 2099 do
    local w = {}
    for k = 0, (i * 13) % 30 do w[#w + 1] = "w" .. ((i * 7 + k) % 11) end
    rows[i + 1] = { text = table.concat(w, " ") }
  end
  return rows
end

local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
local function trainer_for(c, tok)
  local args = { output_dir = tmp .. "/out", report_to = "none", bf16 = false, save_strategy = "no" }
  for k, v in pairs(c.options) do args[k] = v ~= cjson.null and v or false end -- (None: false)
  if args.chat_template_path then args.chat_template_path = templates[args.chat_template_path] end
  local train = c.train == "packing_rows" and packing_rows() or c.train == "bfd_rows" and bfd_rows() or c.train
  return zr.SFTTrainer { model = model, processing_class = tok, args = args,
    train_dataset = zr.datasets.Dataset.from_rows(train),
    eval_dataset = c.eval ~= cjson.null and c.eval and zr.datasets.Dataset.from_rows(c.eval) or nil,
    formatting_func = c.formatting_func ~= cjson.null and FORMATS[c.formatting_func] or nil }
end

local function same_rows(got, want, what)
  T.eq(#got, #want, what .. ": rows")
  for i = 1, #want do
    T.eq_list(got[i].input_ids, want[i].input_ids, ("%s: row %d input_ids"):format(what, i))
    T.eq_list(got[i].labels, want[i].labels, ("%s: row %d labels"):format(what, i))
    T.eq_list(got[i].seq_lengths or {}, want[i].seq_lengths or {}, ("%s: row %d seq_lengths"):format(what, i))
  end
end

T.test("zr.SFTTrainer prepares the rows TRL's SFTTrainer prepares, case by case (or refuses where TRL raises)", function()
  local n = 0
  for _, c in ipairs(golden.cases) do
    local tok = zr.tokenizers.load(dirs[c.tokenizer]) -- (a fresh one: eos_token changes it)
    if c.error then
      -- TRL's refusals: zrun refuses the same configurations
      T.raises(function() T.printed(trainer_for, c, tok) end, c.name:match("formatting_func") and "formatting_func"
        or c.name:match("eos_token") and "not in the tokenizer's vocabulary"
        or c.name:match("padding_free") and "does not enforce max_length"
        or c.name:match("^vision rows") and "so they are a vision dataset" or ".")
    else
      local tr
      T.printed(function() tr = trainer_for(c, tok) end)
      same_rows(tr.train_dataset, c.train_rows, c.name .. ", train")
      if c.eval_rows then same_rows(tr.eval_dataset, c.eval_rows, c.name .. ", eval") end
    end
    n = n + 1
  end
  T.eq(n, 33, "cases")
end)

T.test("the notices where zrun's rows follow TRL's code: the prompt no prefix, formatting_func unused, no eos, ShareGPT", function()
  local tok = zr.tokenizers.load(dirs.tinyllama)
  local by = {}
  for _, c in ipairs(golden.cases) do by[c.name] = c end
  local s = T.printed(trainer_for, by["formatting_func on messages rows"], tok)
  assert(s:find("formatting_func's text is not used: these are messages rows", 1, true), s)
  s = T.printed(trainer_for, by["formatting_func with dataset_text_field content"], tok)
  assert(s:find("formatting_func's text is not used: dataset_text_field is content", 1, true), s)
  assert(s:find("no eos is appended to the rows' content", 1, true), s)
  s = T.printed(trainer_for, by["sharegpt as user / assistant"], tok)
  assert(s:find("ShareGPT's speakers human / gpt are rendered as the roles user / assistant", 1, true), s)
  -- (the prompt's notice goes to stderr: the rows above carry its effect)
end)

T.test("skip_prepare_dataset rows without labels: the collator learns a token equal to the pad (TRL's collator)", function()
  local g = golden.skip_prepare_collator
  local tok = zr.tokenizers.load(dirs.tinyllama)
  local tr = zr.SFTTrainer { model = model, processing_class = tok, train_dataset = zr.datasets.Dataset.from_rows(g.rows),
    args = { output_dir = tmp .. "/out", bf16 = false, save_strategy = "no", dataset_kwargs = { skip_prepare_dataset = true } } }
  local b = tr.collator(g.rows)
  T.eq(tok:id_to_token(tok:pad_id()), g.pad_token, "the pad token")
  local ids, labels = b.input_ids:tolist(), b.labels:tolist()
  for i = 1, #g.labels do
    T.eq_list(ids[i], g.input_ids[i], "input_ids row " .. i)
    T.eq_list(labels[i], g.labels[i], "labels row " .. i)
  end
  -- transformers' DataCollatorForLanguageModeling (the Trainer's) masks every token equal to the pad
  local hf = zr.datasets.causal_lm_collator { pad_token_id = tok:pad_id() }(g.rows)
  T.eq_list(hf.labels:tolist()[1], { 1, 100, 101, -100 }, "transformers' collator")
end)

T.test("bfd packing's batches: TRL's padding-free collator (one row, position_ids restarting, no attention_mask)", function()
  local g = golden.padding_free_collator
  local tok = zr.tokenizers.load(dirs.tinyllama)
  local tr
  T.printed(function()
    tr = zr.SFTTrainer { model = model, processing_class = tok, train_dataset = zr.datasets.Dataset.from_rows(bfd_rows()),
      args = { output_dir = tmp .. "/out", bf16 = false, save_strategy = "no", packing = true, max_length = 24,
        pad_to_multiple_of = 8 } }
  end)
  T.eq_list(g.keys, { "input_ids", "labels", "position_ids" }, "TRL's keys")
  local b = tr.collator(g.rows)
  T.eq(b.attention_mask, nil, "no attention_mask")
  T.eq_list(b.input_ids:tolist()[1], g.input_ids[1], "input_ids")
  T.eq_list(b.labels:tolist()[1], g.labels[1], "labels")
  T.eq_list(b.position_ids:tolist()[1], g.position_ids[1], "position_ids")
end)

T.test("eos_token: saved into the tokenizer's files with the pad token TRL sets; evaluate(rows) prepares them", function()
  local tok = zr.tokenizers.load(dirs.gpt2) -- (no pad token: TRL pads with the eos, and saves it as the pad)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.vocab_size = tok:vocab_size()
  local tr
  T.printed(function()
    tr = zr.SFTTrainer { model = zr.models.llama.LlamaForCausalLM(cfg), processing_class = tok, train_dataset = { { text = "a b" } },
      args = { output_dir = tmp .. "/out2", bf16 = false, save_strategy = "no", max_steps = 1, eos_token = "!" } }
  end)
  local d = tmp .. "/saved_tok"
  tok:save_pretrained(d)
  local cfg = cjson.decode(T.read_file(d .. "/tokenizer_config.json"))
  T.eq(cfg.eos_token, "!", "eos_token saved")
  T.eq(cfg.pad_token, "!", "pad_token saved (the eos, as TRL sets it)")
  local src = cjson.decode(T.read_file(dirs.gpt2 .. "/tokenizer_config.json"))
  for k, v in pairs(src) do
    if k ~= "eos_token" and k ~= "pad_token" then T.eq(cjson.encode(cfg[k]), cjson.encode(v), "kept: " .. k) end
  end
  T.eq(tr.train_dataset[1].input_ids[#tr.train_dataset[1].input_ids], tok:token_to_id("!"), "the text ends with it")
  -- evaluate(raw rows): prepared as the eval sets are (TRL), not handed raw to the collator
  local m
  T.printed(function() m = tr:evaluate({ { prompt = "a", completion = "b" } }) end)
  assert(m.eval_loss == m.eval_loss and m.eval_loss > 0, "an eval loss")
end)

T.test("chat_template_path: a .jinja file, else refused (TRL clones a tokenizer there)", function()
  local tok = zr.tokenizers.load(dirs.tinyllama)
  T.raises(function()
    zr.SFTTrainer { model = model, processing_class = tok, train_dataset = { { messages = { { role = "user", content = "x" } } } },
      args = { output_dir = tmp .. "/out", bf16 = false, chat_template_path = dirs.tinyllama } }
  end, "is not a .jinja / .j2 file: TRL takes it for a tokenizer to clone")
end)

T.done()
