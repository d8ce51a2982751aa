-- apply_chat_template's options against transformers 5.17 (the values below are its outputs, written
-- here): continue_final_message as transformers 5 cuts the text (the final field's trailing whitespace
-- kept unless the template trims it; a field name; a list of content blocks), batches of conversations,
-- truncation without max_length (the tokenizer's model_max_length, from its truncation_side), and the
-- tokenizer-call options zrun does not take refused rather than passed to the template. Needs no test data;
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

T.test("a list of conversations gives a list of results", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  local m = { { role = "user", content = "Hi there" }, { role = "assistant", content = "Hello!" } }
  T.eq_list(text(tok, { m, { m[1] } }, { chat_template = TINYLLAMA }),
    { "<|user|>\nHi there</s>\n<|assistant|>\nHello!</s>\n", "<|user|>\nHi there</s>\n" })
  local out = tok:apply_chat_template({ m, { m[1] } }, { chat_template = TINYLLAMA, return_dict = true })
  T.eq(#out.input_ids, 2, "input_ids: one list per conversation")
  T.eq_list(out.input_ids[2], tok:apply_chat_template({ m[1] }, { chat_template = TINYLLAMA }))
  T.eq(#out.attention_mask[1], #out.input_ids[1], "attention_mask: one list per conversation")
end)

T.test("truncation: model_max_length when max_length is not given, from the tokenizer's truncation_side", function()
  local TJ = [[{"added_tokens":[],"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}]]
  local m = { { role = "user", content = "abababa" } }
  -- transformers 5.17: AutoTokenizer of a folder with this tokenizer.json and tokenizer_config.json
  local want = { right = { { 2, 2, 2 }, { 2, 2 }, { { 2, 2, 2 }, { 1, 0 } } }, left = { { 2, 2, 0 }, { 2, 0 }, { { 2, 2, 0 }, { 1, 0 } } } }
  for side, w in pairs(want) do
    local d = T.tmpdir()
    T.write_file(d .. "/tokenizer.json", TJ)
    T.write_file(d .. "/tokenizer_config.json", '{"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 3, "truncation_side": "' .. side ..
      '", "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}')
    local tok = zr.tokenizers.load(d)
    T.eq_list(tok:apply_chat_template(m), { 2, 2, 2, 0 }, side .. ": no truncation")
    T.eq_list(tok:apply_chat_template(m, { truncation = true }), w[1], side .. ": truncation = true")
    T.eq_list(tok:apply_chat_template(m, { truncation = true, max_length = 2 }), w[2], side .. ": max_length = 2")
    T.eq_list(tok:apply_chat_template(m, { truncation = "do_not_truncate", max_length = 2 }), { 2, 2, 2, 0 }, side .. ": do_not_truncate")
    local b = tok:apply_chat_template({ m, { { role = "user", content = "ba" } } }, { truncation = true, return_dict = true })
    T.eq_list(b.input_ids[1], w[3][1], side .. ": a batch")
    T.eq_list(b.input_ids[2], w[3][2], side .. ": a batch")
  end
end)

T.test("tokenizer-call options zrun does not take are refused, not passed to the template", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  local m = { user }
  T.raises(function() tok:apply_chat_template(m, { chat_template = TINYLLAMA, padding = "max_length", max_length = 30 }) end, "padding is not supported")
  T.raises(function() tok:apply_chat_template(m, { chat_template = TINYLLAMA, return_tensors = "pt" }) end, "return_tensors is not supported")
  T.raises(function() tok:apply_chat_template(m, { chat_template = TINYLLAMA, tokenizer_kwargs = {} }) end, "tokenizer_kwargs is not supported")
  T.raises(function() tok:apply_chat_template(m, { chat_template = TINYLLAMA, truncation = "yes" }) end, "truncation must be true, false")
  T.eq(#tok:apply_chat_template(m, { chat_template = TINYLLAMA, padding = false }), #tok:apply_chat_template(m, { chat_template = TINYLLAMA }),
    "padding = false: nothing to do")
end)

local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local dir = data .. "/tokenizers/tinyllama-1.1b-chat-v1.0"
if not io.open(dir .. "/tokenizer.json") then
  T.skip("TinyLlama's ids with continue_final_message and truncation", "tokenizer not found at " .. dir)
else
  T.test("TinyLlama's ids with continue_final_message and truncation", function()
    local tok = zr.tokenizers.load(dir)
    -- transformers 5.17: apply_chat_template(..., continue_final_message=True, return_dict=False)
    T.eq_list(tok:apply_chat_template({ user, { role = "assistant", content = "The answer is " } }, { continue_final_message = true }),
      { 529, 29989, 1792, 29989, 29958, 13, 18567, 2, 13, 29966, 29989, 465, 22137, 29989, 29958, 13, 1576, 1234, 338, 29871 })
    -- truncation=True: model_max_length 2048 of its tokenizer_config.json (3009 tokens without)
    T.eq(#tok:apply_chat_template({ { role = "user", content = ("word "):rep(3000) } }, { truncation = true }), 2048)
  end)
end

T.done()
