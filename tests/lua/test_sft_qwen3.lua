-- zr.SFTTrainer's rows against TRL 1.10's SFTTrainer on Qwen3 conversations with Qwen3's chat template
-- (tests/golden/sft_qwen3.json, written by tests/golden/make_sft_qwen3_golden.py): thinking blocks, reasoning_content,
-- tool calls and a tools column, conversational prompt-completion rows with chat_template_kwargs (enable_thinking), and
-- assistant_only_loss, for which TRL renders every row with its training copy of a template it knows (Qwen3's,
-- Qwen3-Instruct-2507's, Qwen2.5's: zrun.sft_templates) and refuses a template it does not. Needs only committed files.
local zr = require "zrun"
local T = zr.testing
local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "sft_trl_rows.lua")

local home = (ZRUN_HOME or ".") .. "/"
if zr._C.build_info().utf8proc == false then -- (the tokenizer's NFC normalizer)
  T.skip("SFT of Qwen3 conversations", "zrun was built without utf8proc (libutf8proc-dev), which tests/golden/qwen3_chat/tok needs")
  return T.done()
end
local J = require "zrun.jinja"
-- (decoded as json.loads does: key order kept, 1.0 a float, null none)
local golden = J.json_decode(T.read_file(home .. "tests/golden/sft_qwen3.json"), true)
local TOK = home .. "tests/golden/qwen3_chat/tok"
local tmp = T.tmpdir()
local templates = { qwen2_5 = tmp .. "/qwen2_5.jinja" }
-- (Qwen2.5-Instruct's template: tests/golden/qwen2_tok's, = TRL's qwen2_5.jinja)
T.write_file(templates.qwen2_5, zr.tokenizers.load(home .. "tests/golden/qwen2_tok"):get_chat_template())
for _, n in ipairs { "qwen3_2504", "qwen3_instruct_2507", "qwen3_thinking_2507" } do
  templates[n] = home .. "tests/golden/qwen3_chat/" .. n .. ".jinja"
end

local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
local function trainer_for(c)
  local args = { output_dir = tmp .. "/out", report_to = "none", bf16 = false, save_strategy = "no" }
  for k, v in pairs(c.options) do args[k] = v end
  if args.chat_template_path then args.chat_template_path = templates[args.chat_template_path] end
  return zr.SFTTrainer { model = model, processing_class = zr.tokenizers.load(TOK), args = args,
    train_dataset = zr.datasets.Dataset.from_rows(c.train) }
end

T.test("zr.SFTTrainer prepares the rows TRL's SFTTrainer prepares from Qwen3 conversations (or refuses where TRL raises)", function()
  T.eq(#golden.cases, 15, "cases in the golden file")
  R.check_rows(golden.cases, trainer_for)
end)

-- the templates zrun.sft_templates knows, as their publishers ship them
local ORIGINALS = { qwen3 = zr.tokenizers.load(TOK):get_chat_template(), qwen2_5 = T.read_file(templates.qwen2_5),
  qwen3_instruct_2507 = T.read_file(templates.qwen3_instruct_2507) }

T.test("zrun.sft_templates' training copies render what TRL's render: text and assistant masks, every conversation", function()
  local ST = require "zrun.sft_templates"
  local null = require("cjson").null
  local tok, copies = zr.tokenizers.load(TOK), {}
  for name, src in pairs(ORIGINALS) do
    local which
    copies[name], which = ST.training(src)
    T.eq(which, name, name .. ": recognised")
    T.eq(ST.has_generation_markers(src), false, name .. ": the original has no generation blocks")
    T.eq(ST.has_generation_markers(copies[name]), true, name .. ": the copy has them")
  end
  T.eq(#golden.training_renders, 344, "renders in the golden file")
  local seen = {}
  for i, r in ipairs(golden.training_renders) do
    local conv = golden.training_conversations[r.conversation + 1]
    local what = ("conversation %d, %s, add_generation_prompt %s, enable_thinking %s (render %d)"):format(
      r.conversation, r.template, tostring(r.add_generation_prompt), tostring(r.enable_thinking), i)
    local o = { chat_template = copies[r.template], add_generation_prompt = r.add_generation_prompt,
      tools = conv.tools ~= null and conv.tools or nil }
    if r.enable_thinking ~= "absent" then o.enable_thinking = r.enable_thinking end
    R.check_render(tok, conv.messages, o, r, what)
    seen[r.template] = (seen[r.template] or 0) + 1
  end
  T.eq(seen.qwen3, 172, "renders of Qwen3's")
  T.eq(seen.qwen3_instruct_2507, 86, "renders of Qwen3-Instruct-2507's")
  T.eq(seen.qwen2_5, 86, "renders of Qwen2.5's")
end)

T.test("zrun.sft_templates knows its templates byte for byte (length and FNV-1a 64), and no other", function()
  local ST = require "zrun.sft_templates"
  -- FNV-1a 64's published test vectors
  T.eq(ST.digest(""), "cbf29ce484222325", "FNV-1a 64 of the empty string")
  T.eq(ST.digest("a"), "af63dc4c8601ec8c", "of a")
  T.eq(ST.digest("foobar"), "85944171f73967e8", "of foobar")
  local n = 0
  for name, src in pairs(ORIGINALS) do
    T.eq(select(2, ST.training(src)), name, name .. ": recognised")
    -- one byte more, one less, one changed (at the start, the middle, the end), two swapped: not recognised, as
    -- TRL compares with ==
    T.eq(ST.training(src .. "\n"), nil, name .. " with one more byte")
    T.eq(ST.training(src:sub(1, -2)), nil, name .. " less its last byte")
    for _, at in ipairs { 1, math.floor(#src / 2), #src } do
      local c = src:byte(at) == 32 and "\t" or " "
      T.eq(ST.training(src:sub(1, at - 1) .. c .. src:sub(at + 1)), nil, ("%s with byte %d changed"):format(name, at))
    end
    local m = math.floor(#src / 2)
    while src:byte(m) == src:byte(m + 1) do m = m + 1 end
    T.eq(ST.training(src:sub(1, m - 1) .. src:sub(m + 1, m + 1) .. src:sub(m, m) .. src:sub(m + 2)), nil,
      name .. " with two bytes swapped")
    n = n + 1
  end
  T.eq(n, 3, "templates")
  T.eq(ST.training(nil), nil, "no template")
  -- TRL's has_generation_markers: \{%-?\s*generation\s*-?%\}
  for _, s in ipairs { "{% generation %}", "{%- generation -%}", "{%generation%}", "{%-  generation\n%}" } do
    T.eq(ST.has_generation_markers("a" .. s .. "b"), true, s)
  end
  for _, s in ipairs { "{% generations %}", "{{ generation }}", "{%+ generation %}", "{% endgeneration %}" } do
    T.eq(ST.has_generation_markers("a" .. s .. "b"), false, s)
  end
end)

T.test("tok:get_chat_template: the template apply_chat_template renders with (transformers' method)", function()
  local tok = zr.tokenizers.load(TOK)
  local own = T.read_file(TOK .. "/chat_template.jinja")
  T.eq(tok:get_chat_template(), own, "the tokenizer's own")
  T.eq(tok:get_chat_template("{{ 1 }}"), "{{ 1 }}", "a template given")
  tok:set_chat_template("{{ 2 }}")
  T.eq(tok:get_chat_template(), "{{ 2 }}", "after set_chat_template")
  T.write_file(tmp .. "/tokenizer.json", T.read_file(TOK .. "/tokenizer.json")) -- (a tokenizer.json alone: no template)
  T.raises(function() zr.tokenizers.load(tmp .. "/tokenizer.json"):get_chat_template() end,
    "this tokenizer has no chat template")
end)

T.done()
