-- Qwen3's chat templates through apply_chat_template against transformers 5.17 (tests/golden/qwen3_chat.json,
-- written by tests/golden/make_qwen3_chat_golden.py from the templates in tests/golden/qwen3_chat/): thinking blocks
-- and reasoning_content, earlier turns' thinking dropped, multi-step tool calls and responses, tools, system messages,
-- enable_thinking; the text, and the ids of the tokenizer saved there with Qwen3's added tokens and template; and the
-- conversations a template refuses. Needs only committed files.
local zr = require "zrun"
local T = zr.testing
local null = require("cjson").null

local home = (ZRUN_HOME or ".") .. "/"
if zr._C.build_info().utf8proc == false then -- (the tokenizer's NFC normalizer)
  T.skip("Qwen3's chat template", "zrun was built without utf8proc (libutf8proc-dev), which tests/golden/qwen3_chat/tok needs")
  return T.done()
end
-- (decoded as json.loads does: key order kept, 1.0 a float: tojson of the tools and arguments follows them)
local golden = require("zrun.jinja").json_decode(T.read_file(home .. "tests/golden/qwen3_chat.json"), true)
local tok = zr.tokenizers.load(home .. "tests/golden/qwen3_chat/tok")
local NAMES = { "qwen3", "qwen3_2504", "qwen3_instruct_2507", "qwen3_thinking_2507" }
local templates = {}
for _, n in ipairs(NAMES) do templates[n] = T.read_file(home .. "tests/golden/qwen3_chat/" .. n .. ".jinja") end

local function opts(r, conv)
  local o = { add_generation_prompt = r.add_generation_prompt, tools = conv.tools ~= null and conv.tools or nil }
  if r.enable_thinking ~= "absent" then o.enable_thinking = r.enable_thinking end
  if r.template ~= "qwen3" then o.chat_template = templates[r.template] end -- (qwen3: the tokenizer's own)
  return o
end

T.test("Qwen3's templates = transformers' apply_chat_template: text and ids (every branch)", function()
  T.eq(#golden.conversations, 31, "conversations in the golden file")
  T.eq(#golden.renders, 459, "renders in the golden file")
  local seen = {}
  for i, r in ipairs(golden.renders) do
    local conv = golden.conversations[r.conversation + 1]
    local what = ("%s, %s, add_generation_prompt %s, enable_thinking %s (render %d)"):format(conv.name, r.template,
      tostring(r.add_generation_prompt), tostring(r.enable_thinking), i)
    local o = opts(r, conv)
    o.tokenize = false
    T.eq(tok:apply_chat_template(conv.messages, o), r.text, what .. ": text")
    if r.input_ids then
      o.tokenize = nil
      T.eq_list(tok:apply_chat_template(conv.messages, o), r.input_ids, what .. ": ids")
    end
    seen[r.template] = (seen[r.template] or 0) + 1
  end
  T.eq(seen.qwen3, 186, "renders of qwen3.jinja (the tokenizer's own template)")
end)

T.test("Qwen3's templates refuse what transformers refuses, with its message", function()
  T.eq(#golden.refused, 3, "refused conversations in the golden file")
  for _, r in ipairs(golden.refused) do
    local ok, err = pcall(tok.apply_chat_template, tok, r.messages, { tokenize = false, chat_template = templates[r.template] })
    T.eq(ok, false, r.name .. ": refused")
    if r.error == "ValueError" then -- (apply_chat_template's own check: an empty conversation)
      T.eq(err, "apply_chat_template: messages must be a non-empty list of {role =, content =} tables", r.name)
    else -- the template's TypeError / UndefinedError: Jinja's message, after the template's line
      T.eq(err:match("^chat template line %d+: (.*)$"), r.message, r.name .. ": " .. r.error .. "'s message")
    end
  end
end)

T.done()
