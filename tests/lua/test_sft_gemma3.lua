-- zr.SFTTrainer's rows against TRL 1.10's SFTTrainer with Gemma 3's chat template (tests/golden/sft_gemma3.json and
-- the tokenizer tests/golden/gemma3_chat/tok_gemma3, written by tests/golden/make_sft_gemma3_golden.py; the template
-- tests/golden/gemma3_chat/gemma3.jinja, google/gemma-3-*-it's): assistant_only_loss, for which TRL renders every row
-- with its training copy of the template (zrun.sft_templates makes its own), and that copy's renders and assistant
-- masks over many conversations (system messages as text and as blocks, image blocks, whitespace trimmed, roles that
-- do not alternate), against TRL's. Needs only committed files.
local zr = require "zrun"
local T = zr.testing
local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "sft_trl_rows.lua")

local home = (ZRUN_HOME or ".") .. "/"
local J = require "zrun.jinja"
local DIR = home .. "tests/golden/gemma3_chat/"
local golden = J.json_decode(T.read_file(home .. "tests/golden/sft_gemma3.json"), true)
local TOK = DIR .. "tok_gemma3"
local ORIGINAL = T.read_file(DIR .. "gemma3.jinja")
local tmp = T.tmpdir()

local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
local function trainer_for(c)
  local args = { output_dir = tmp .. "/out", report_to = "none", bf16 = false, save_strategy = "no" }
  for k, v in pairs(c.options) do args[k] = v end
  return zr.SFTTrainer { model = model, processing_class = zr.tokenizers.load(TOK), args = args,
    train_dataset = zr.datasets.Dataset.from_rows(c.train) }
end

T.test("zr.SFTTrainer prepares the rows TRL's SFTTrainer prepares with Gemma 3's template", function()
  T.eq(#golden.cases, 5, "cases in the golden file")
  T.eq(R.check_rows(golden.cases, trainer_for), 0, "cases refused")
end)

T.test("zrun.sft_templates' copy of Gemma 3's template renders what TRL's renders: text and masks", function()
  local ST = require "zrun.sft_templates"
  local copy, which = ST.training(ORIGINAL)
  T.eq(which, "gemma3", "recognised")
  T.eq(ST.has_generation_markers(ORIGINAL), false, "the original has no generation blocks")
  T.eq(ST.has_generation_markers(copy), true, "the copy has them")
  local tok = zr.tokenizers.load(TOK)
  T.eq(#golden.renders, 42, "renders in the golden file")
  local errors = 0
  for i, r in ipairs(golden.renders) do
    local conv = golden.conversations[r.conversation + 1]
    local what = ("conversation %d, add_generation_prompt %s (render %d)"):format(r.conversation,
      tostring(r.add_generation_prompt), i)
    if R.check_render(tok, conv.messages, { chat_template = copy, add_generation_prompt = r.add_generation_prompt }, r,
      what) then
      errors = errors + 1
    end
  end
  T.eq(errors, 6, "renders TRL's copy refuses (roles that do not alternate, content neither text nor blocks)")
end)

T.test("zrun.sft_templates knows Gemma 3's template byte for byte", function()
  local ST = require "zrun.sft_templates"
  T.eq(ST.training(ORIGINAL .. "\n"), nil, "with one more byte")
  T.eq(ST.training(ORIGINAL:sub(1, -2)), nil, "less its last byte")
  for _, at in ipairs { 1, math.floor(#ORIGINAL / 2), #ORIGINAL } do
    local c = ORIGINAL:byte(at) == 32 and "\t" or " "
    T.eq(ST.training(ORIGINAL:sub(1, at - 1) .. c .. ORIGINAL:sub(at + 1)), nil, ("byte %d changed"):format(at))
  end
end)

T.done()
