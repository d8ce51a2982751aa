-- Tokenizes a raw text file with a Hugging Face tokenizer.json (GPT-2's) into one llm.c token shard
-- (tests/bench/llmc_shard.lua), as llm.c's dev/data scripts do: <|endoftext|>, then the text's ids;
-- the tokens are repeated until there are at least min_tokens (llm.c's loader needs B*T+1 per shard).
--   zrun tests/bench/llmc_data.lua tokenizer=gpt2/tokenizer.json text=wiki.valid.raw out=wiki.bin [min_tokens=0]
local zr = require "zrun"
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local shard = dofile(here .. "/llmc_shard.lua")
local cli = require("zrun.argparse").new("tests/bench/llmc_data.lua",
  "Writes an llm.c token shard (.bin) of a text file, tokenized with a tokenizer.json.")
cli:option("tokenizer", "", "the tokenizer.json (GPT-2's: ids must fit uint16)")
cli:option("text", "", "the raw text file (e.g. WikiText-2's wiki.valid.raw)")
cli:option("out", "", "the shard to write")
cli:option("min_tokens", 0, "repeat the tokens until the shard holds at least this many")
local opt = cli:parse(arg)
for _, k in ipairs { "tokenizer", "text", "out" } do
  if opt[k] == "" then error(("llmc_data.lua: %s= is required (see --help)"):format(k), 0) end
end
local tok = zr.tokenizers.load(opt.tokenizer)
local eot = tok:token_to_id("<|endoftext|>")
if not eot then error(("llmc_data.lua: %s has no <|endoftext|> token; pass GPT-2's tokenizer.json"):format(opt.tokenizer), 0) end
local f, err = io.open(opt.text, "rb")
if not f then error(("llmc_data.lua: cannot open text=%s (%s)"):format(opt.text, err), 0) end
local text = f:read("*a")
f:close()
local ids = tok:encode(text, false)
local one = #ids + 1
local tokens = { eot }
for i = 1, #ids do tokens[i + 1] = ids[i] end
while #tokens < opt.min_tokens do
  for i = 1, one do tokens[#tokens + 1] = tokens[i] end
end
shard.write(opt.out, tokens)
print(("llmc_data: %s: %d tokens (%d from %s, %d bytes)"):format(opt.out, #tokens, one, opt.text, #text))
