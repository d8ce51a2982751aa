-- zr.SFTTrainer's rows against TRL 1.10's SFTTrainer with Llama 3.x's and Phi-3's chat templates
-- (tests/golden/sft_llama3_phi3.json, written by tests/golden/make_sft_llama3_phi3_golden.py, with the tokenizers and
-- templates of tests/golden/llama3_phi3_chat/): assistant_only_loss, for which TRL renders every row with its training
-- copy of a template it knows (Meta-Llama-3's, Phi-3-mini's, Phi-3.5-mini's: zrun.sft_templates makes its own) and
-- refuses Llama 3.1's and 3.2's; and those copies' renders and assistant masks over many conversations, against TRL's.
-- Needs only committed files.
local zr = require "zrun"
local T = zr.testing
local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "sft_trl_rows.lua")

local home = (ZRUN_HOME or ".") .. "/"
local J = require "zrun.jinja"
local DIR = home .. "tests/golden/llama3_phi3_chat/"
-- (decoded as json.loads does: key order kept, 1.0 a float, null none)
local golden = J.json_decode(T.read_file(home .. "tests/golden/sft_llama3_phi3.json"), true)
local TOKS = { llama = DIR .. "tok_llama3", phi = DIR .. "tok_phi3" }
local TRAINED = { llama3 = "llama", phi3 = "phi", phi3_5 = "phi" } -- the templates TRL patches, and their tokenizer
local tmp = T.tmpdir()

local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
local function trainer_for(c)
  local args = { output_dir = tmp .. "/out", report_to = "none", bf16 = false, save_strategy = "no" }
  for k, v in pairs(c.options) do args[k] = v end
  if args.chat_template_path then args.chat_template_path = DIR .. args.chat_template_path .. ".jinja" end
  return zr.SFTTrainer { model = model, processing_class = zr.tokenizers.load(TOKS[c.tokenizer]), args = args,
    train_dataset = zr.datasets.Dataset.from_rows(c.train) }
end

T.test("zr.SFTTrainer prepares the rows TRL's SFTTrainer prepares with Llama 3.x's and Phi-3's templates (or refuses where TRL raises)", function()
  T.eq(#golden.cases, 13, "cases in the golden file")
  local refused = R.check_rows(golden.cases, trainer_for)
  T.eq(refused, 2, "cases TRL refuses (Llama 3.1's, 3.2's)")
end)

-- the templates zrun.sft_templates knows here, as their publishers ship them
local ORIGINALS = {}
for name in pairs(TRAINED) do ORIGINALS[name] = T.read_file(DIR .. name .. ".jinja") end

T.test("zrun.sft_templates' copies of Llama 3's and Phi-3's templates render what TRL's render: text and masks", function()
  local ST = require "zrun.sft_templates"
  local toks, copies = { llama = zr.tokenizers.load(TOKS.llama), phi = zr.tokenizers.load(TOKS.phi) }, {}
  for name, src in pairs(ORIGINALS) do
    local which
    copies[name], which = ST.training(src)
    T.eq(which, name, name .. ": recognised")
    T.eq(ST.has_generation_markers(src), false, name .. ": the original has no generation blocks")
    T.eq(ST.has_generation_markers(copies[name]), true, name .. ": the copy has them")
  end
  T.eq(#golden.training_renders, 138, "renders in the golden file")
  local seen, errors = {}, 0
  for i, r in ipairs(golden.training_renders) do
    local conv = golden.training_conversations[r.conversation + 1]
    local what = ("conversation %d, %s, add_generation_prompt %s (render %d)"):format(
      r.conversation, r.template, tostring(r.add_generation_prompt), i)
    local tok = toks[TRAINED[r.template]]
    local o = { chat_template = copies[r.template], add_generation_prompt = r.add_generation_prompt }
    if R.check_render(tok, conv.messages, o, r, what) then errors = errors + 1 end
    seen[r.template] = (seen[r.template] or 0) + 1
  end
  T.eq(seen.llama3, 46, "renders of Meta-Llama-3's")
  T.eq(seen.phi3, 46, "renders of Phi-3's")
  T.eq(seen.phi3_5, 46, "renders of Phi-3.5's")
  T.eq(errors, 12, "renders TRL's copies refuse (Phi's + on content that is not a string)")
end)

T.test("zrun.sft_templates knows Llama 3's and Phi-3's templates byte for byte, and not Llama 3.1's or 3.2's", function()
  local ST = require "zrun.sft_templates"
  for name, src in pairs(ORIGINALS) do
    T.eq(select(2, ST.training(src)), name, name .. ": recognised")
    T.eq(ST.training(src .. "\n"), nil, name .. " with one more byte")
    T.eq(ST.training(src:sub(1, -2)), nil, name .. " less its last byte")
    for _, at in ipairs { 1, math.floor(#src / 2), #src } do
      local c = src:byte(at) == 32 and "\t" or " "
      T.eq(ST.training(src:sub(1, at - 1) .. c .. src:sub(at + 1)), nil, ("%s with byte %d changed"):format(name, at))
    end
  end
  for _, n in ipairs { "llama3_1", "llama3_2" } do
    T.eq(ST.training(T.read_file(DIR .. n .. ".jinja")), nil, n .. ": TRL has no training copy of it")
  end
  for _, n in ipairs { "qwen2_5", "qwen3", "qwen3_instruct_2507", "llama3", "phi3", "phi3_5" } do
    local found = false
    for _, k in ipairs(ST.NAMES) do found = found or k == n end
    T.eq(found, true, n .. " in zrun.sft_templates.NAMES")
  end
end)

T.done()
