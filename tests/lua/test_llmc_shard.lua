-- The llm.c token shards of tests/bench/vs_llmc.sh: tests/bench/llmc_data.lua writes the header
-- llm.c's loader checks (read here byte by byte) and the GPT-2 tokenizer's ids; llmc_shard.read
-- refuses a wrong magic, version or token count, and write refuses ids that do not fit uint16.
local zr = require "zrun"
local T = zr.testing
local shard = dofile("tests/bench/llmc_shard.lua")
local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local zrun = os.getenv("ZRUN_BIN") or arg[-1]
local tmp = os.tmpname()

local function u32(s, i) local a, b, c, d = s:byte(i, i + 3); return a + 256 * b + 65536 * c + 16777216 * d end
local function u16s(s, from) -- every little-endian uint16 from byte `from` on
  local t = {}
  for i = from, #s - 1, 2 do t[#t + 1] = s:byte(i) + 256 * s:byte(i + 1) end
  return t
end
local function put(path, s) local f = assert(io.open(path, "wb")); f:write(s); f:close() end

local tokjson = data .. "/tokenizers/gpt2/tokenizer.json"
if not io.open(tokjson, "rb") then
  T.skip("llmc_data.lua writes GPT-2's ids under llm.c's header", "GPT-2 tokenizer not found at " .. tokjson)
else
  T.test("llmc_data.lua writes GPT-2's ids under llm.c's header, repeated up to min_tokens", function()
    local text = " = Valkyria Chronicles III = \n\n Senjō no Valkyria 3 : 1,234 ünïcode\n"
    put(tmp .. ".txt", text)
    local out, rc = T.run(("%s tests/bench/llmc_data.lua tokenizer=%s text=%s.txt out=%s.bin min_tokens=50")
      :format(zrun, tokjson, tmp, tmp))
    assert(rc == 0, out)
    local ids = zr.tokenizers.load(tokjson):encode(text, false)
    local want = { 50256 } -- <|endoftext|> opens the document, as in llm.c's data scripts
    for _, id in ipairs(ids) do want[#want + 1] = id end
    local one = #want
    while #want < 50 do for i = 1, one do want[#want + 1] = want[i] end end
    local s = T.read_file(tmp .. ".bin")
    T.eq(u32(s, 1), 20240520, "magic")
    T.eq(u32(s, 5), 1, "version")
    T.eq(u32(s, 9), #want, "token count")
    for i = 13, 1024 do assert(s:byte(i) == 0, "header byte " .. i .. " is not zero") end
    local got = u16s(s, 1025)
    T.eq(table.concat(got, ","), table.concat(want, ","), "tokens")
    T.eq(table.concat(shard.read(tmp .. ".bin"), ","), table.concat(want, ","), "llmc_shard.read")
  end)
end

T.test("llmc_shard.read refuses a wrong magic, version or token count", function()
  shard.write(tmp .. ".ok", { 1, 2, 65535 })
  local s = T.read_file(tmp .. ".ok")
  T.eq(#s, 1024 + 6, "file size")
  T.eq(table.concat(shard.read(tmp .. ".ok"), ","), "1,2,65535", "round trip")
  put(tmp .. ".bad", "\0" .. s:sub(2))
  T.raises(function() shard.read(tmp .. ".bad") end, "expected 20240520; not an llm.c token shard")
  put(tmp .. ".bad", s:sub(1, 4) .. "\7" .. s:sub(6))
  T.raises(function() shard.read(tmp .. ".bad") end, "version 7, expected 1")
  put(tmp .. ".bad", s:sub(1, 8) .. "\4" .. s:sub(10))
  T.raises(function() shard.read(tmp .. ".bad") end, "the header says 4 tokens but 6 bytes of tokens follow (expected 8)")
  put(tmp .. ".bad", s:sub(1, -2))
  T.raises(function() shard.read(tmp .. ".bad") end, "the header says 3 tokens but 5 bytes")
  put(tmp .. ".bad", s:sub(1, 100))
  T.raises(function() shard.read(tmp .. ".bad") end, "shorter than the 1024-byte header")
  T.raises(function() shard.write(tmp .. ".bad", { 1, 65536 }) end, "token 65536 at position 2 is not an id in [0, 65535]")
  T.raises(function() shard.write(tmp .. ".bad", {}) end, "0 tokens")
end)

for _, e in ipairs { ".txt", ".bin", ".ok", ".bad" } do os.remove(tmp .. e) end
os.remove(tmp)
T.done()
