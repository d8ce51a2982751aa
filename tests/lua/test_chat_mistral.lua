-- Mistral-7B-Instruct-v0.3's chat template ([INST] ... [/INST], tools, tool calls) through apply_chat_template against
-- transformers 5.17 (tests/golden/mistral_v3_chat.json, written by tests/golden/make_mistral_chat_golden.py, with the
-- tokenizer of tests/golden/qwen2_tok and bos_token / eos_token given as template variables): the text and ids, and
-- raise_exception's message as one line for the conversations the template refuses. Needs only committed files.
local zr = require "zrun"
local T = zr.testing

local home = (ZRUN_HOME or ".") .. "/"
if zr._C.build_info().utf8proc == false then -- (the tokenizer's NFC normalizer)
  T.skip("Mistral v0.3's chat template", "zrun was built without utf8proc (libutf8proc-dev), which tests/golden/qwen2_tok needs")
  return T.done()
end
-- (decoded keeping each object's key order, as json.loads: tool.items() and tojson follow it)
local golden = require("zrun.jinja").json_decode(T.read_file(home .. "tests/golden/mistral_v3_chat.json"))
local tok = zr.tokenizers.load(home .. "tests/golden/qwen2_tok")
local function opts(extra)
  local o = { chat_template = golden.template, bos_token = "<s>", eos_token = "</s>" }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

T.test("Mistral v0.3's template = transformers' apply_chat_template: text and ids (system message, tools, tool calls)", function()
  T.eq(#golden.renders, 6, "renders in the golden file")
  for i, r in ipairs(golden.renders) do
    local what = ("%s (render %d)"):format(r.name, i)
    local o = opts({ tools = r.tools ~= require("cjson").null and r.tools or nil, add_generation_prompt = r.add_generation_prompt })
    o.tokenize = false
    T.eq(tok:apply_chat_template(r.messages, o), r.text, what .. ": text")
    o.tokenize = nil
    T.eq_list(tok:apply_chat_template(r.messages, o), r.input_ids, what .. ": ids")
  end
end)

T.test("Mistral v0.3's raise_exception: transformers' TemplateError message, as one line", function()
  T.eq(#golden.refused, 3, "refused conversations in the golden file")
  for _, r in ipairs(golden.refused) do
    T.eq(r.error, "TemplateError", r.name .. ": transformers' exception")
    local ok, err = pcall(tok.apply_chat_template, tok, r.messages, opts({ tokenize = false }))
    T.eq(ok, false, r.name .. ": refused")
    T.eq(err, "chat template: " .. r.message, r.name .. ": the message, without a position or traceback")
  end
  -- a recipe that does not catch it: zrun prints the one line and exits 1
  local script = os.tmpname()
  local f = assert(io.open(script, "wb"))
  f:write(([[
local zr = require "zrun"
local g = require("zrun.jinja").json_decode(zr.testing.read_file(%q))
local tok = zr.tokenizers.load(%q)
tok:apply_chat_template(g.refused[1].messages, { chat_template = g.template, bos_token = "<s>", eos_token = "</s>" })
]]):format(home .. "tests/golden/mistral_v3_chat.json", home .. "tests/golden/qwen2_tok"))
  f:close()
  local out, rc = T.run(("%s %s"):format(os.getenv("ZRUN_BIN") or arg[-1], script))
  os.remove(script)
  T.eq(rc, 1, "exit status")
  T.eq(out, "zrun: chat template: " .. golden.refused[1].message .. "\n", "the output")
end)

T.done()
