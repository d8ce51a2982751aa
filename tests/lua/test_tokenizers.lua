-- zr.tokenizers from Lua: a tiny tokenizer.json written here (no test data needed), encode and
-- decode through the bindings, and the arguments they refuse (issue 16: {0.5} decoded as id 0).
local zr = require "zrun"
local T = zr.testing

local dir = os.tmpname()
os.remove(dir)
zr.makedirs(dir)
local path = dir .. "/tokenizer.json"
local f = assert(io.open(path, "wb"))
f:write([[{"added_tokens":[{"id":3,"content":"<s>","special":true}],
  "model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}]])
f:close()
local tok = zr.tokenizers.load(path)
os.remove(path)
os.remove(dir)

T.test("encode and decode through the bindings", function()
  T.eq(table.concat(tok:encode("abab"), ","), "2,2", "encode")
  T.eq(table.concat(tok:encode("ab<s>ba", true, 3), ","), "2,3,1", "encode with max_length")
  T.eq(#tok:encode("abab", true, 0), 0, "max_length 0")
  T.eq(tok:decode({ 2, 3, 0 }), "ab <s> a", "decode (no decoder: tokens joined by spaces, as HF)")
  T.eq(tok:decode({ 2, 3, 0 }, true), "ab a", "decode skipping special tokens")
  T.eq(tok:decode({ 2, -1, 99, 0 }), "ab a", "ids outside the vocabulary are skipped")
  T.eq(tok:decode(zr.tensor({ 2, 0 }, { dtype = "i64" })), "ab a", "decode an i64 tensor")
  T.eq(tok:decode({}), "", "decode nothing")
end)

T.test("decode of a batch (a 2-D tensor, a table of tables) gives a string a row; one id its text", function()
  -- transformers 5.17 (PreTrainedTokenizerFast of this tokenizer.json): decode(torch.tensor([[2, 3, 0], [2, 0, 0]]))
  -- is ['ab <s> a', 'ab a a']; decode([[2, 3, 0], [1]], skip_special_tokens=True) ['ab a', 'b']; decode(2) 'ab'
  T.eq_list(tok:decode(zr.tensor({ { 2, 3, 0 }, { 2, 0, 0 } }, { dtype = "i64" })), { "ab <s> a", "ab a a" })
  T.eq_list(tok:decode({ { 2, 3, 0 }, { 1 } }, true), { "ab a", "b" })
  T.eq_list(tok:decode({ { 2, 3 }, {} }), { "ab <s>", "" })
  T.eq(tok:decode(2), "ab")
  T.raises(function() tok:decode({ { 2 }, 3 }) end, "a batch's rows must be tables of ids, row 2 is a number")
  T.raises(function() tok:decode(zr.tensor({ { { 2 } } }, { dtype = "i64" })) end, "ids must be a 1-D tensor (or 2-D: a batch), got 3 dimensions")
  local byte = zr.tokenizers.ByteTokenizer.new()
  T.eq_list(byte:decode(zr.tensor({ { 107, 108 }, { 1, 107 } }, { dtype = "i64" })), { "hi", "h" }, "the byte tokenizer")
  T.eq(byte:decode(107), "h", "the byte tokenizer: one id")
end)

T.test("decode refuses ids that are not integers", function()
  T.raises(function() tok:decode({ 0.5 }) end, "tok:decode(ids [, skip_special_tokens]): ids[1] must be an integer from -2^31 to 2^31-1, got 0.5")
  T.raises(function() tok:decode({ 2, 2 ^ 32 }) end, "ids[2] must be an integer from -2^31 to 2^31-1, got 4294967296")
  T.raises(function() tok:decode({ 2, 0 / 0 }) end, "ids[2] must be an integer from -2^31 to 2^31-1, got nan")
  T.raises(function() tok:decode({ "2" }) end, "ids[1] must be an integer from -2^31 to 2^31-1, got string")
  T.raises(function() tok:decode({ 2, true }) end, "ids[2] must be an integer from -2^31 to 2^31-1, got boolean")
  T.raises(function() tok:decode(zr.tensor({ 2, 1.5 })) end, "tok:decode(ids [, skip_special_tokens]): element 2 of the ids tensor must be an integer from -2^31 to 2^31-1, got 1.5")
  T.raises(function() tok:decode("ab") end, "tok:decode(ids [, skip_special_tokens]): ids must be a table of integers, an integer tensor or an id, got string")
  T.raises(function() tok:encode("ab", true, 0.5) end, "tok:encode(text [, add_special_tokens [, max_length]]): max_length must be a non-negative integer, got 0.5")
  T.raises(function() tok:encode("ab", true, 1 / 0) end, "max_length must be a non-negative integer, got inf")
  T.raises(function() tok:encode("ab", true, -1) end, "max_length must be a non-negative integer, got -1")
  T.raises(function() tok:encode("ab", true, "3") end, "max_length must be a non-negative integer, got string")
  T.raises(function() tok:id_to_token(0.5) end, "tok:id_to_token(id): id must be an integer, got 0.5")
  T.eq(tok:id_to_token(2), "ab", "id_to_token")
  local byte = zr.tokenizers.ByteTokenizer.new()
  T.eq(byte:decode({ 1, 3 + 104, 3 + 105 }), "hi", "byte tokenizer")
  T.raises(function() byte:decode({ 3.5 }) end, "tok:decode(ids [, skip_special_tokens]): ids[1] must be an integer, got 3.5")
end)

-- a post-processor that writes <s> before the text and </s> after it (a Llama with add_eos_token)
local TEMPLATED = [[{"added_tokens":[{"id":3,"content":"<s>","special":true},
    {"id":4,"content":"</s>","special":true}],
    "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},
      {"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}],
      "pair":[{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],
      "special_tokens":{"<s>":{"id":"<s>","ids":[3],"tokens":["<s>"]},"</s>":{"id":"</s>","ids":[4],"tokens":["</s>"]}}},
    "model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}]]

T.test("encode's max_length cuts the text, keeping the special tokens the post-processor adds around it", function()
  local d = T.tmpdir()
  T.write_file(d .. "/tokenizer.json", TEMPLATED)
  local t = zr.tokenizers.load(d .. "/tokenizer.json")
  -- transformers 5.17 (PreTrainedTokenizerFast(tokenizer_file=...)): tok("ababa", truncation=True, max_length=m)
  T.eq_list(t:encode("ababa"), { 3, 2, 2, 0, 4 })
  T.eq_list(t:encode("ababa", true, 4), { 3, 2, 2, 4 }, "max_length 4")
  T.eq_list(t:encode("ababa", true, 3), { 3, 2, 4 }, "max_length 3")
  T.eq_list(t:encode("ababa", true, 2), { 3, 4 }, "max_length 2: the special tokens alone")
  T.eq_list(t:encode("ababa", false, 2), { 2, 2 }, "add_special_tokens=False")
  T.eq_list(t:encode("abab", true, 5), { 3, 2, 2, 4 }, "short enough: kept")
  -- transformers returns the whole sequence (logging an error) when max_length cannot hold the special tokens
  T.raises(function() t:encode("ababa", true, 1) end, "max_length 1 is less than the 2 special tokens the tokenizer adds")
  -- the byte tokenizer's saved form (<s> $A) in transformers 5.17: max_length 1 -> [1]; 2 -> [1, 107]; 0 the whole
  local byte = zr.tokenizers.ByteTokenizer.new()
  T.eq_list(byte:encode("hi", true, 1), { 1 })
  T.eq_list(byte:encode("hi", true, 2), { 1, 107 })
  T.raises(function() byte:encode("hi", true, 0) end, "max_length 0 is less than the 1 special tokens the tokenizer adds")
end)

T.test("encode's max_length cuts from the start with tokenizer_config.json's truncation_side = \"left\"", function()
  local d = T.tmpdir()
  T.write_file(d .. "/tokenizer.json", TEMPLATED)
  T.write_file(d .. "/tokenizer_config.json", '{"tokenizer_class": "PreTrainedTokenizerFast", "truncation_side": "left"}')
  local t = zr.tokenizers.load(d)
  -- transformers 5.17 (AutoTokenizer of this folder): tok(s, truncation=True, max_length=m)
  T.eq_list(t:encode("babab"), { 3, 1, 2, 2, 4 })
  T.eq_list(t:encode("babab", true, 4), { 3, 2, 2, 4 }, "max_length 4")
  T.eq_list(t:encode("aab", true, 3), { 3, 2, 4 }, "max_length 3")
  T.eq_list(t:encode("aab", false, 2), { 0, 2 }, "add_special_tokens=False")
  -- tokenizer.json's own truncation direction "Left" is the default side; the config's truncation_side wins
  local left = '{"truncation":{"direction":"Left","max_length":512,"strategy":"LongestFirst","stride":0},' .. TEMPLATED:sub(2)
  T.write_file(d .. "/tokenizer.json", left)
  T.write_file(d .. "/tokenizer_config.json", '{"tokenizer_class": "PreTrainedTokenizerFast"}')
  T.eq_list(zr.tokenizers.load(d):encode("babab", true, 4), { 3, 2, 2, 4 }, "tokenizer.json's direction Left")
  T.write_file(d .. "/tokenizer_config.json", '{"tokenizer_class": "PreTrainedTokenizerFast", "truncation_side": "right"}')
  T.eq_list(zr.tokenizers.load(d):encode("babab", true, 4), { 3, 1, 2, 4 }, "the config's truncation_side right wins")
end)

T.test("LlamaTokenizer with add_prefix_space = false: transformers 5's decoder keeps the leading space", function()
  -- a SentencePiece-style BPE (Prepend / Replace normalizers, a decoder that strips the first space)
  local d = T.tmpdir()
  T.write_file(d .. "/tokenizer.json", [[{"version":"1.0","truncation":null,"padding":null,
 "added_tokens":[{"id":0,"content":"<unk>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
  {"id":1,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
 "normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]},
 "pre_tokenizer":null,
 "post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
   "pair":[{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}},
 "decoder":{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]},
 "model":{"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":false,
   "vocab":{"<unk>":0,"<s>":1,"▁":2,"a":3,"b":4,"▁a":5,"ab":6,"▁ab":7},"merges":["▁ a","a b","▁a b"]}}]])
  T.write_file(d .. "/tokenizer_config.json", '{"tokenizer_class": "LlamaTokenizer", "add_prefix_space": false, "bos_token": "<s>", "unk_token": "<unk>"}')
  local t = zr.tokenizers.load(d)
  -- transformers 5.17 (AutoTokenizer of this folder): ids, decode(ids), decode(ids, skip_special_tokens=True)
  T.eq_list(t:encode(" ab a"), { 1, 7, 5 })
  T.eq(t:decode({ 1, 7, 5 }), "<s> ab a")
  T.eq(t:decode({ 1, 7, 5 }, true), " ab a")
  T.eq(t:decode({ 1, 2 }, true), " ")
  T.eq_list(t:encode("ab  b"), { 1, 6, 2, 2, 4 })
  T.eq(t:decode({ 1, 6, 2, 2, 4 }, true), "ab  b")
end)

T.test("set_special_tokens is tok.eos_token = ...: eos_id / pad_id and the chat template's tokens follow", function()
  local d = T.tmpdir()
  T.write_file(d .. "/tokenizer.json", TEMPLATED)
  T.write_file(d .. "/tokenizer_config.json", '{"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"}')
  local tmpl = "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{{ pad_token }}"
  local m = { { role = "user", content = "ab" } }
  -- transformers 5.17 (AutoTokenizer of this folder): before, eos/pad ids 4 4, the template 'ab</s></s>' = [2, 4, 4];
  -- after tok.eos_token = "<s>"; tok.pad_token = "a": 3 0, 'ab<s>a' = [2, 3, 0]
  for _, first_chat in ipairs { true, false } do -- (the chat settings read before or after)
    local t = zr.tokenizers.load(d)
    if first_chat then
      T.eq(t:eos_id(), 4)
      T.eq(t:pad_id(), 4)
      T.eq(t:apply_chat_template(m, { chat_template = tmpl, tokenize = false }), "ab</s></s>")
    end
    zr.tokenizers.set_special_tokens(t, { eos_token = "<s>", pad_token = "a" })
    T.eq(t:eos_id(), 3, "eos_id")
    T.eq(t:pad_id(), 0, "pad_id")
    T.eq(t:apply_chat_template(m, { chat_template = tmpl, tokenize = false }), "ab<s>a", "the template's eos_token and pad_token")
    T.eq_list(t:apply_chat_template(m, { chat_template = tmpl }), { 2, 3, 0 })
  end
  local byte = zr.tokenizers.ByteTokenizer.new()
  zr.tokenizers.set_special_tokens(byte, { eos_token = "<s>", pad_token = "a" })
  T.eq(byte:eos_id(), 1, "the byte tokenizer's eos_id")
  T.eq(byte:pad_id(), 97 + 3, "the byte tokenizer's pad_id")
  T.eq(byte:apply_chat_template(m, { chat_template = tmpl, tokenize = false }), "ab<s>a", "the byte tokenizer's template")
end)

T.test("GPT2Tokenizer: tokenizer_config.json's add_prefix_space, as transformers 5 builds its ByteLevel pre-tokenizer", function()
  -- a byte-level BPE whose tokenizer.json adds no prefix space ("Ġ" is the space byte)
  local d = T.tmpdir()
  T.write_file(d .. "/tokenizer.json", [[{"version":"1.0","truncation":null,"padding":null,"normalizer":null,
 "added_tokens":[{"id":7,"content":"<|end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
 "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
 "post_processor":null,
 "decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
 "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,
   "vocab":{"a":0,"b":1,"c":2,"Ġ":3,"ab":4,"abc":5,"Ġa":6,"<|end|>":7},"merges":["a b","ab c","Ġ a"]}}]])
  T.write_file(d .. "/tokenizer_config.json", '{"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": true, "eos_token": "<|end|>"}')
  local t = zr.tokenizers.load(d)
  -- transformers 5.17 (AutoTokenizer of this folder): ids and decode
  T.eq_list(t:encode("abc"), { 3, 5 })
  T.eq_list(t:encode(" ac"), { 6, 2 }, "a leading space: none added")
  T.eq_list(t:encode("c<|end|>ab"), { 3, 2, 7, 3, 4 }, "after a special token too")
  T.eq(t:decode({ 3, 2, 7, 3, 4 }), " c<|end|> ab")
  T.eq_list(zr.tokenizers.load(d, { pipeline = "tokenizer.json" }):encode("abc"), { 5 }, "the file's pipeline: the tokenizers library")
  -- the class from config.json's model_type (openai-community/gpt2's tokenizer_config.json names none)
  T.write_file(d .. "/tokenizer_config.json", '{"add_prefix_space": true}')
  T.write_file(d .. "/config.json", '{"model_type": "gpt2"}')
  T.eq_list(zr.tokenizers.load(d):encode("abc ab"), { 3, 5, 3, 4 }, "GPT2Tokenizer from config.json")
end)

T.test("special tokens as transformers 5 reads them: special_tokens_map.json's win without added_tokens_decoder; no pad guessed", function()
  local tj = TEMPLATED:gsub('"special":true}],', '"special":true},{"id":5,"content":"<pad>","special":true}],', 1)
  local PTF = '{"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>"'
  local MAP = '{"pad_token": "</s>", "eos_token": "<s>"}'
  -- transformers 5.17 (AutoTokenizer of each folder): eos_token_id, pad_token_id, '{{ eos_token }}|{{ pad_token }}'
  local cases = {
    { "no pad_token anywhere: none (a <pad> in the vocabulary is not taken)", PTF .. "}", nil, 4, nil, "</s>|" },
    { "a config without added_tokens_decoder: special_tokens_map.json wins", PTF .. ', "pad_token": "<s>"}', MAP, 3, 4, "<s>|</s>" },
    { "a config with added_tokens_decoder: special_tokens_map.json is not read", PTF .. ', "pad_token": "<s>", "added_tokens_decoder": {}}', MAP, 4, 3, "</s>|<s>" },
    { "the pad token in special_tokens_map.json only", PTF .. "}", '{"pad_token": {"content": "<s>", "lstrip": false, "normalized": false}}', 4, 3, "</s>|<s>" },
  }
  for _, c in ipairs(cases) do
    local d = T.tmpdir()
    T.write_file(d .. "/tokenizer.json", tj)
    T.write_file(d .. "/tokenizer_config.json", c[2])
    if c[3] then T.write_file(d .. "/special_tokens_map.json", c[3]) end
    local t = zr.tokenizers.load(d)
    T.eq(t:eos_id(), c[4], c[1] .. ": eos_id")
    T.eq(t:pad_id(), c[5], c[1] .. ": pad_id")
    T.eq(t:apply_chat_template({ { role = "user", content = "a" } }, { chat_template = "{{ eos_token }}|{{ pad_token }}", tokenize = false }), c[6],
      c[1] .. ": the chat template's")
  end
end)

T.test("transformers' tokenizer names zrun lacks say what to write instead, in one line", function()
  for _, t in ipairs { tok, zr.tokenizers.ByteTokenizer.new() } do
    T.raises(function() t:add_special_tokens { pad_token = "<pad>" } end,
      "tokenizer: no add_special_tokens here (transformers' name); zrun's: adding tokens to the vocabulary is not supported")
    T.raises(function() return t.pad_token_id end, "tokenizer: no pad_token_id here (transformers' name); zrun's: tok:pad_id()")
    T.raises(function() t:batch_decode { { 3 } } end, "zrun's: tok:decode(batch [, skip_special_tokens])")
    T.eq(t.no_such_field, nil, "other missing fields stay nil (a field test is no error)")
  end
end)

T.done()
