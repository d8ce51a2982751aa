-- tok:save_pretrained(dir) writes the files transformers' AutoTokenizer reads, and
-- zr.tokenizers.load(dir) reads them back to the same ids: the Hugging Face tokenizer (its files
-- copied) and the built-in byte tokenizer (written in HF's format).
local zr = require "zrun"
local T = zr.testing
local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local tmp = os.tmpname()
os.remove(tmp)
local text = "Hello world, zrun saves its tokenizer: 1234 ünïcode"

local function exists(p) local f = io.open(p, "rb"); if f then f:close(); return true end return false end

T.test("the byte tokenizer: tok:save_pretrained(dir) then load(dir) gives the same ids", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  local files = tok:save_pretrained(tmp .. "/byte/nested")
  assert(exists(tmp .. "/byte/nested/tokenizer.json") and exists(tmp .. "/byte/nested/tokenizer_config.json"))
  assert(type(files) == "table")
  local back = zr.tokenizers.load(tmp .. "/byte/nested")
  T.eq(table.concat(back:encode(text), ","), table.concat(tok:encode(text), ","))
end)

local tokdir = data .. "/tokenizers/tinyllama-1.1b-chat-v1.0"
if not exists(tokdir .. "/tokenizer.json") then
  T.skip("a Hugging Face tokenizer saves with the model", "data not found at " .. data)
else
  T.test("a Hugging Face tokenizer: tok:save_pretrained copies its files; the copy encodes the same", function()
    local tok = zr.tokenizers.load(tokdir)
    local files = tok:save_pretrained(tmp .. "/hf")
    local names = table.concat(files, " ")
    assert(names:find("tokenizer.json", 1, true) and names:find("tokenizer_config.json", 1, true), names)
    local back = zr.tokenizers.load(tmp .. "/hf")
    T.eq(table.concat(back:encode(text), ","), table.concat(tok:encode(text), ","))
    -- the model and its tokenizer in one directory, as transformers expects
    local cfg = zr.models.llama.config("zrun/tiny-llama")
    cfg.vocab_size = tok:vocab_size()
    local m = zr.models.llama.LlamaForCausalLM(cfg)
    m:save_pretrained(tmp .. "/model")
    tok:save_pretrained(tmp .. "/model")
    assert(exists(tmp .. "/model/config.json") and exists(tmp .. "/model/tokenizer.json"))
    T.eq(zr.tokenizers.load(tmp .. "/model"):vocab_size(), tok:vocab_size())
  end)
end

local gpt2dir = data .. "/tokenizers/gpt2"
if not exists(gpt2dir .. "/tokenizer.json") then
  T.skip("GPT-2's tokenizer saved alone keeps its class", "data not found at " .. data)
else
  T.test("GPT-2's tokenizer saved alone keeps the class config.json gave it (transformers' AutoTokenizer lookup)", function()
    -- openai-community/gpt2's tokenizer_config.json names no class: transformers takes GPT2Tokenizer (and its
    -- <|endoftext|> bos / eos / unk) from config.json's model_type, which a tokenizer-only folder lacks
    local tok = zr.tokenizers.load(gpt2dir)
    tok:save_pretrained(tmp .. "/gpt2")
    local c = require("cjson").decode(T.read_file(tmp .. "/gpt2/tokenizer_config.json"))
    T.eq(c.tokenizer_class, "GPT2Tokenizer")
    T.eq(c.model_max_length, 1024, "the source's keys kept")
    T.eq(table.concat(zr.tokenizers.load(tmp .. "/gpt2"):encode(text), ","), table.concat(tok:encode(text), ","))
    -- a tokenizer_config.json that names its class is copied as it is
    local tl = zr.tokenizers.load(tokdir)
    tl:save_pretrained(tmp .. "/tl")
    T.eq(T.read_file(tmp .. "/tl/tokenizer_config.json") == T.read_file(tokdir .. "/tokenizer_config.json"), true,
      "TinyLlama's tokenizer_config.json unchanged")
  end)
end

os.execute("rm -rf " .. tmp)
T.done()
