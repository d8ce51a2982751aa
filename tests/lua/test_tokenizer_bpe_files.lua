-- Tokenizer folders without tokenizer.json but with GPT-2's vocab.json + merges.txt (zrun.tokenizer_bpe_files,
-- what transformers' GPT2Converter builds): a hand-made vocabulary merges as BPE does, the byte-level
-- mapping, special tokens from tokenizer_config.json; other tokenizer classes refused in one line; and,
-- with the test data, GPT-2's own vocab.json + merges.txt (cut out of its tokenizer.json) encode every
-- WikiText-2 validation line to the ids of GPT-2's tokenizer.json, decode back, and save_pretrained
-- writes a tokenizer.json that loads to the same ids.
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local tmp = T.tmpdir()

local write = T.write_file

T.test("a hand-made vocab.json + merges.txt: byte-level BPE with its merges and special tokens", function()
  local d = tmp .. "/tiny"
  zr.makedirs(d)
  -- byte-level symbols: "Ġ" is the space byte (0x20 -> U+0120)
  write(d .. "/vocab.json", cjson.encode({ a = 0, b = 1, c = 2, ["\196\160"] = 3, ab = 4, abc = 5, ["\196\160a"] = 6,
    ["<|end|>"] = 7 }))
  write(d .. "/merges.txt", "#version: 0.2\na b\nab c\n\196\160 a\n")
  write(d .. "/tokenizer_config.json", cjson.encode({ tokenizer_class = "GPT2Tokenizer", eos_token = "<|end|>" }))
  local tok = zr.tokenizers.load(d)
  T.eq_list(tok:encode("abc"), { 5 }, "two merges")
  T.eq_list(tok:encode("ab ab"), { 4, 3, 4 }, "'a b' ranks before 'Ġ a': the space stays alone")
  T.eq_list(tok:encode(" ac"), { 6, 2 }, "'Ġ a' where 'a b' does not apply")
  T.eq_list(tok:encode("cab<|end|>"), { 2, 4, 7 }, "a special token from tokenizer_config.json")
  T.eq(tok:decode({ 5, 6, 1 }), "abc ab", "decoded through the byte-level mapping")
  -- another class: refused, saying what to do
  write(d .. "/tokenizer_config.json", cjson.encode({ tokenizer_class = "RobertaTokenizer" }))
  T.raises(function() zr.tokenizers.load(d) end, "zrun builds one for GPT-2's byte-level BPE only")
  write(d .. "/tokenizer_config.json", cjson.encode({ tokenizer_class = "GPT2Tokenizer", add_bos_token = true }))
  T.raises(function() zr.tokenizers.load(d) end, "add_bos_token")
  write(d .. "/merges.txt", "#version: 0.2\na b c\n")
  write(d .. "/tokenizer_config.json", "{}")
  T.raises(function() zr.tokenizers.load(d) end, "merges.txt: line 2 is not two tokens")
end)

local gpt2 = data .. "/tokenizers/gpt2/tokenizer.json"
local f = io.open(gpt2, "rb")
local wiki = io.open(data .. "/wikitext-2-raw/wiki.valid.raw", "rb")
if f and wiki then
  local tj = cjson.decode(f:read("*a"))
  f:close()
  local text = wiki:read("*a")
  wiki:close()
  T.test("GPT-2's vocab.json + merges.txt tokenize WikiText-2 as its tokenizer.json does", function()
    local d = tmp .. "/gpt2"
    zr.makedirs(d)
    write(d .. "/vocab.json", cjson.encode(tj.model.vocab))
    write(d .. "/merges.txt", "#version: 0.2\n" .. table.concat(tj.model.merges, "\n") .. "\n")
    write(d .. "/tokenizer_config.json", cjson.encode({ tokenizer_class = "GPT2Tokenizer", bos_token = "<|endoftext|>",
      eos_token = "<|endoftext|>", unk_token = "<|endoftext|>", model_max_length = 1024 }))
    local a, b = zr.tokenizers.load(d), zr.tokenizers.load(gpt2)
    local lines, tokens = 0, 0
    for line in text:gmatch("[^\n]+") do
      local x, y = a:encode(line), b:encode(line)
      lines, tokens = lines + 1, tokens + #x
      if table.concat(x, ",") ~= table.concat(y, ",") then error("line " .. lines .. " differs: " .. line:sub(1, 80)) end
    end
    assert(lines > 3000 and tokens > 200000, ("%d lines, %d tokens"):format(lines, tokens))
    local s = "Hello<|endoftext|> wörld\n  x"
    T.eq_list(a:encode(s), b:encode(s), "a special token and unicode")
    T.eq(a:decode(a:encode(s)), s, "decode")
    T.eq(a:vocab_size(), b:vocab_size(), "vocab size")
    T.eq(a:eos_id(), b:eos_id(), "eos")
    local out = tmp .. "/gpt2_saved"
    a:save_pretrained(out)
    local c = zr.tokenizers.load(out)
    T.eq_list(c:encode(s), b:encode(s), "the tokenizer.json save_pretrained wrote")
  end)
else
  T.skip("GPT-2's vocab.json + merges.txt tokenize WikiText-2 as its tokenizer.json does", "test data not found at " .. data)
end

T.done()
