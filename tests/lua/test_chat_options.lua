-- apply_chat_template's options against transformers 5.17 (the values below are its outputs, written
-- here): continue_final_message as transformers 5 cuts the text (the final field's trailing whitespace
-- kept unless the template trims it; a field name; a list of content blocks). Needs no test data;
-- TinyLlama's ids are checked too when ../shared/data (or ZRUN_TEST_DATA) has its tokenizer.
local zr = require "zrun"
local T = zr.testing

-- TinyLlama-1.1B-Chat-v1.0's template; the byte tokenizer's eos_token is TinyLlama's "</s>"
local TINYLLAMA = "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n" ..
  "{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n" ..
  "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n" ..
  "{% endif %}\n{% endfor %}"
local TRIM = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content | trim }}{{ eos_token }}\n{% endfor %}"
local REASON = "{% for m in messages %}<|{{ m.role }}|>\n{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>\n{% endif %}" ..
  "{{ m.content }}{{ eos_token }}\n{% endfor %}"
local BLOCKS = "{% for m in messages %}<|{{ m.role }}|>\n{% if m.content is string %}{{ m.content }}{% else %}{% for b in m.content %}" ..
  "{% if b.type == 'text' %}{{ b.text }}{% else %}<img>{% endif %}{% endfor %}{% endif %}{{ eos_token }}\n{% endfor %}"
local user = { role = "user", content = "Hi" }
local function text(tok, msgs, o)
  o.tokenize = false
  return tok:apply_chat_template(msgs, o)
end

T.test("continue_final_message cuts the text as transformers 5 does", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  local function cont(content, o)
    o = o or {}
    o.chat_template, o.continue_final_message = o.chat_template or TINYLLAMA, o.continue_final_message or true
    return text(tok, { user, { role = "assistant", content = content } }, o)
  end
  T.eq(cont("The answer is"), "<|user|>\nHi</s>\n<|assistant|>\nThe answer is")
  T.eq(cont("The answer is "), "<|user|>\nHi</s>\n<|assistant|>\nThe answer is ", "a trailing space kept")
  T.eq(cont("List:\n"), "<|user|>\nHi</s>\n<|assistant|>\nList:\n", "a trailing newline kept")
  T.eq(cont("The answer is ", { chat_template = TRIM }), "<|user|>\nHi</s>\n<|assistant|>\nThe answer is",
    "a template that trims the message: the text rstripped")
  T.eq(cont({ { type = "text", text = "Look " }, { type = "image" }, { type = "text", text = "at this " } }, { chat_template = BLOCKS }),
    "<|user|>\nHi</s>\n<|assistant|>\nLook <img>at this ", "content blocks: the last text block continued")
  local thinking = { user, { role = "assistant", content = "", reasoning_content = "Let me think " } }
  T.eq(text(tok, thinking, { chat_template = REASON, continue_final_message = "reasoning_content" }),
    "<|user|>\nHi</s>\n<|assistant|>\n<think>Let me think ", "a field name: that field continued")
  thinking[2].content = "Sure"
  T.eq(text(tok, thinking, { chat_template = REASON, continue_final_message = true }),
    "<|user|>\nHi</s>\n<|assistant|>\n<think>Let me think </think>\nSure", "true: the content")
  T.eq(thinking[2].content, "Sure", "the caller's message is not changed")
  T.raises(function() text(tok, { user, { role = "assistant", content = "x" } }, { chat_template = REASON, continue_final_message = "reasoning_content" }) end,
    'the final message has no "reasoning_content" to continue')
  T.raises(function() text(tok, { user, { role = "assistant", content = "x", other = "y" } }, { chat_template = REASON, continue_final_message = "other" }) end,
    'continue_final_message is set to "other" but the chat template does not use that field')
end)

local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local dir = data .. "/tokenizers/tinyllama-1.1b-chat-v1.0"
if not io.open(dir .. "/tokenizer.json") then
  T.skip("TinyLlama's ids with continue_final_message", "tokenizer not found at " .. dir)
else
  T.test("TinyLlama's ids with continue_final_message", function()
    local tok = zr.tokenizers.load(dir)
    -- transformers 5.17: apply_chat_template(..., continue_final_message=True, return_dict=False)
    T.eq_list(tok:apply_chat_template({ user, { role = "assistant", content = "The answer is " } }, { continue_final_message = true }),
      { 529, 29989, 1792, 29989, 29958, 13, 18567, 2, 13, 29966, 29989, 465, 22137, 29989, 29958, 13, 1576, 1234, 338, 29871 })
  end)
end

T.done()
