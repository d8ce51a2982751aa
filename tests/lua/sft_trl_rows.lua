-- What the SFT golden tests of TRL's training templates share (test_sft_qwen3.lua, test_sft_llama3_phi3.lua): each
-- golden case's rows as zr.SFTTrainer prepares them against TRL's SFTTrainer's (input_ids and labels, row by row), or
-- zrun's refusal where TRL raised "not training-compatible" (check_rows: how many were refused); and one render of a
-- training copy against TRL's (check_render: the text and the assistant mask, or the error TRL raised).
--   local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "sft_trl_rows.lua")
local zr = require "zrun"
local T = zr.testing

local M = {}

function M.check_rows(cases, trainer_for)
  local refused = 0
  for _, c in ipairs(cases) do
    if c.error then
      T.eq(c.error:match("^ValueError: The chat template is not training%-compatible") ~= nil, true, c.name .. ": TRL's error")
      T.raises(function() T.printed(trainer_for, c) end,
        "the chat template has no {% generation %} blocks and is not one whose training copy TRL 1.10 swaps in")
      refused = refused + 1
    else
      local tr
      T.printed(function() tr = trainer_for(c) end)
      local got = tr.train_dataset
      T.eq(#got, #c.train_rows, c.name .. ": rows")
      for i, want in ipairs(c.train_rows) do
        T.eq_list(got[i].input_ids, want.input_ids, ("%s: row %d input_ids"):format(c.name, i))
        T.eq_list(got[i].labels, want.labels, ("%s: row %d labels"):format(c.name, i))
      end
    end
  end
  return refused
end

-- tok renders messages with options o (chat_template = zrun's training copy, ...) as TRL's copy rendered r
-- ({text =, assistant_masks =} or {error =}); true when it raised as r did.
function M.check_render(tok, messages, o, r, what)
  o.tokenize = false
  if r.error then
    T.eq(pcall(tok.apply_chat_template, tok, messages, o), false, what .. ": raises, as TRL's copy does")
    return true
  end
  T.eq(tok:apply_chat_template(messages, o), r.text, what .. ": text")
  o.tokenize, o.return_dict, o.return_assistant_tokens_mask = nil, true, true
  local got = tok:apply_chat_template(messages, o)
  T.eq(table.concat(got.assistant_masks), r.assistant_masks, what .. ": assistant mask")
  return false
end

return M
