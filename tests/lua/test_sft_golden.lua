-- Chat templates and SFT rows against transformers (tests/golden/chat_tinyllama.json, written by
-- tests/golden/make_chat_golden.py): the TinyLlama chat tokenizer's own template and one with
-- {% generation %} blocks (text, ids, assistant masks), TRL's {input_ids, labels} for every dataset
-- type, and AutoTokenizer's ids of WikiText lines (transformers 5 rebuilds LlamaTokenizer's pipeline). Needs the tokenizer from ../shared/data (or ZRUN_TEST_DATA); says SKIP without it.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"

local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local dir = data .. "/tokenizers/tinyllama-1.1b-chat-v1.0"
local home = (ZRUN_HOME or ".") .. "/"
local golden = cjson.decode(T.read_file(home .. "tests/golden/chat_tinyllama.json"))
if not io.open(dir .. "/tokenizer_config.json") then
  T.skip("chat templates against transformers", "tokenizer not found at " .. dir)
  return T.done()
end
local tok = zr.tokenizers.load(dir)

local function template_of(name) return name == "gen" and golden.gen_template or nil end

T.test("apply_chat_template = transformers: text, ids and assistant masks (own template, generation blocks)", function()
  local msgs = {}
  for _, s in ipairs(golden.sft) do if s.name:match("^messages %d$") then msgs[#msgs + 1] = s.row.messages end end
  T.eq(#msgs, 2, "two conversations in the golden file")
  for _, c in ipairs(golden.templates) do
    local conv = msgs[c.conv + 1]
    local m = {}
    for i = 1, #conv - (c.add_generation_prompt and 1 or 0) do m[i] = conv[i] end
    local what = ("conversation %d, %s template, add_generation_prompt %s"):format(c.conv, c.template, tostring(c.add_generation_prompt))
    local o = { chat_template = template_of(c.template), add_generation_prompt = c.add_generation_prompt }
    o.tokenize = false
    T.eq(tok:apply_chat_template(m, o), c.text, what .. ": text")
    o.tokenize, o.return_dict, o.return_assistant_tokens_mask = nil, true, c.template == "gen"
    local out = tok:apply_chat_template(m, o)
    T.eq_list(out.input_ids, c.input_ids, what .. ": ids")
    if c.assistant_masks ~= cjson.null then T.eq_list(out.assistant_masks, c.assistant_masks, what .. ": assistant masks") end
  end
end)

T.test("apply_chat_template continue_final_message = transformers (the text cut after the last content)", function()
  local msgs = {}
  for _, s in ipairs(golden.sft) do if s.name:match("^messages %d$") then msgs[#msgs + 1] = s.row.messages end end
  for _, c in ipairs(golden.continue_final) do
    local o = { chat_template = template_of(c.template), continue_final_message = true }
    local what = ("conversation %d, %s template"):format(c.conv, c.template)
    o.tokenize = false
    T.eq(tok:apply_chat_template(msgs[c.conv + 1], o), c.text, what .. ": text")
    o.tokenize = nil
    T.eq_list(tok:apply_chat_template(msgs[c.conv + 1], o), c.input_ids, what .. ": ids")
  end
end)

T.test("zr.sft.prepare = TRL's rows: messages, prompt-completion (chat and text), text, truncation", function()
  for _, s in ipairs(golden.sft) do
    local o = {}
    for k, v in pairs(s.options) do o[k] = v end
    if o.chat_template then o.chat_template = template_of(o.chat_template) end
    local all_masked = true
    for _, l in ipairs(s.labels) do all_masked = all_masked and l == -100 end
    if all_masked then -- TRL drops a row truncation left with nothing to learn
      T.raises(function() zr.sft.prepare({ s.row }, tok, o) end, "every row lost all its labels to truncation")
    else
      local r = zr.sft.prepare({ s.row }, tok, o)[1]
      T.eq_list(r.input_ids, s.input_ids, s.name .. ": input_ids")
      T.eq_list(r.labels, s.labels, s.name .. ": labels")
    end
  end
end)

T.test("zr.tokenizers.load = transformers 5's AutoTokenizer on WikiText lines (its LlamaTokenizer pipeline)", function()
  local lines = {}
  for l in io.lines(data .. "/wikitext-2-raw/wiki.valid.raw") do lines[#lines + 1] = l end
  for _, c in ipairs(golden.wiki_lines) do
    T.eq_list(tok:encode(lines[c.line]), c.ids, "line " .. c.line)
  end
  -- pipeline = "tokenizer.json": the file's own pipeline, the `tokenizers` library's ids (the refs file)
  local raw = zr.tokenizers.load(dir, { pipeline = "tokenizer.json" })
  local refs = cjson.decode(T.read_file(data .. "/refs/wiki.valid.tinyllama.ids.json")).per_line
  for k = 1, 40 do T.eq_list(raw:encode(lines[k]), refs[k], "tokenizer.json pipeline, line " .. k) end
  T.raises(function() zr.tokenizers.load(dir, { pipeline = "slow" }) end, 'pipeline must be "transformers" or "tokenizer.json"')
end)

T.done()
