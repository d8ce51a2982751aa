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

os.execute("rm -rf " .. tmp)
T.done()
