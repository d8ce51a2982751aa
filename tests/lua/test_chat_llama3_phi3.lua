-- The Llama 3.x and Phi-3 / Phi-3.5 chat templates through apply_chat_template against transformers 5.17
-- (tests/golden/llama3_phi3_chat.json, written by tests/golden/make_llama3_phi3_chat_golden.py from the templates in
-- tests/golden/llama3_phi3_chat/): Meta-Llama-3's, Llama 3.1's (date_string, builtin_tools), Llama 3.2's (the date from
-- strftime_now), Phi-3-mini's and Phi-3.5-mini's, over system messages, trimmed whitespace, tools in the user or the
-- system message, tool calls and responses (tojson); the text, and the ids with a tokenizer of each family (Phi-3's
-- added tokens strip the whitespace after them); and the conversations a template refuses. Needs only committed files.
local zr = require "zrun"
local T = zr.testing
local null = require("cjson").null

local home = (ZRUN_HOME or ".") .. "/"
local DIR = home .. "tests/golden/llama3_phi3_chat/"
-- (decoded as json.loads does: key order kept, 1.0 a float: tojson of the tools and arguments follows them)
local golden = require("zrun.jinja").json_decode(T.read_file(home .. "tests/golden/llama3_phi3_chat.json"), true)
local toks = { llama = zr.tokenizers.load(DIR .. "tok_llama3"), phi = zr.tokenizers.load(DIR .. "tok_phi3") }
local NAMES = { "llama3", "llama3_1", "llama3_2", "phi3", "phi3_5" }
local templates = {}
for _, n in ipairs(NAMES) do templates[n] = T.read_file(DIR .. n .. ".jinja") end
local function tok_of(name) return name:match("^phi") and toks.phi or toks.llama end

local function opts(r, conv)
  local o = { add_generation_prompt = r.add_generation_prompt, chat_template = templates[r.template] }
  for k, v in pairs(conv.kwargs) do o[k] = v end
  if r.date_string ~= "absent" then o.date_string = r.date_string end
  return o
end

T.test("Llama 3.x's and Phi-3's templates = transformers' apply_chat_template: text and ids (every branch)", function()
  T.eq(#golden.conversations, 25, "conversations in the golden file")
  T.eq(#golden.renders, 228, "renders in the golden file")
  local seen = {}
  for i, r in ipairs(golden.renders) do
    local conv = golden.conversations[r.conversation + 1]
    local what = ("%s, %s, add_generation_prompt %s, date_string %s (render %d)"):format(conv.name, r.template,
      tostring(r.add_generation_prompt), tostring(r.date_string), i)
    local tok, o = tok_of(r.template), opts(r, conv)
    o.tokenize = false
    T.eq(tok:apply_chat_template(conv.messages, o), r.text, what .. ": text")
    o.tokenize = nil
    T.eq_list(tok:apply_chat_template(conv.messages, o), r.input_ids, what .. ": ids")
    seen[r.template] = (seen[r.template] or 0) + 1
  end
  T.eq(seen.llama3, 28, "renders of Meta-Llama-3's")
  T.eq(seen.llama3_1, 98, "renders of Llama 3.1's")
  T.eq(seen.llama3_2, 46, "renders of Llama 3.2's")
  T.eq(seen.phi3, 28, "renders of Phi-3's")
  T.eq(seen.phi3_5, 28, "renders of Phi-3.5's")
end)

T.test("each tokenizer's own template is its family's (Meta-Llama-3's, Phi-3's)", function()
  T.eq(toks.llama:get_chat_template(), templates.llama3, "tok_llama3")
  T.eq(toks.phi:get_chat_template(), templates.phi3, "tok_phi3")
end)

T.test("Llama 3.2's template without date_string: today's date from strftime_now, as transformers gives it", function()
  local msgs = { { role = "user", content = "Today?" } }
  local text = toks.llama:apply_chat_template(msgs, { tokenize = false, chat_template = templates.llama3_2 })
  local want = toks.llama:apply_chat_template(msgs, { tokenize = false, chat_template = templates.llama3_2,
    date_string = os.date("%d %b %Y") })
  T.eq(text, want, "strftime_now('%d %b %Y')")
  T.eq(text:find("Today Date: " .. os.date("%d %b %Y") .. "\n", 1, true) ~= nil, true, "today's date")
end)

T.test("Llama 3.1's and 3.2's templates refuse what transformers refuses, with its message", function()
  T.eq(#golden.refused, 3, "refused conversations in the golden file")
  for _, r in ipairs(golden.refused) do
    local o = { tokenize = false, chat_template = templates[r.template] }
    for k, v in pairs(r.kwargs) do o[k] = v end
    local ok, err = pcall(toks.llama.apply_chat_template, toks.llama, r.messages, o)
    T.eq(ok, false, r.name .. ": refused")
    -- (raise_exception's TemplateError: its message, after "chat template: ")
    T.eq(err:match("^chat template: (.*)$"), r.message, r.name .. ": " .. r.error .. "'s message")
  end
end)

T.done()
