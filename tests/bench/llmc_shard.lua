-- llm.c's GPT-2 token shard (.bin): 256 little-endian int32 (magic 20240520, version 1, the token
-- count, zeros), then the tokens as little-endian uint16 (llm.c's dev/data/data_common.py writes it,
-- llmc/dataloader.h reads it). write and read, each checking what llm.c's loader checks.
local floor = math.floor
local char, byte = string.char, string.byte

local M = { MAGIC = 20240520, VERSION = 1, HEADER_BYTES = 256 * 4 }

local function i32(v) return char(v % 256, floor(v / 256) % 256, floor(v / 65536) % 256, floor(v / 16777216) % 256) end
local function u32_at(s, i) local a, b, c, d = byte(s, i, i + 3); return a + b * 256 + c * 65536 + d * 16777216 end

-- write(path, tokens): tokens a Lua array of ids (0-based, as a tokenizer gives them), each < 65536.
function M.write(path, tokens)
  local n = #tokens
  if n == 0 or n >= 2 ^ 31 then error(("llmc shard %s: %d tokens; a shard holds 1 to 2^31-1"):format(path, n), 0) end
  local parts = { i32(M.MAGIC), i32(M.VERSION), i32(n), ("\0"):rep(M.HEADER_BYTES - 12) }
  for i = 1, n do
    local t = tokens[i]
    if type(t) ~= "number" or t < 0 or t >= 65536 or t ~= floor(t) then
      error(("llmc shard %s: token %s at position %d is not an id in [0, 65535] (version-1 shards hold uint16 GPT-2 ids)")
        :format(path, tostring(t), i), 0)
    end
    parts[#parts + 1] = char(t % 256, floor(t / 256))
  end
  local f, err = io.open(path, "wb")
  if not f then error(("llmc shard: cannot write %s (%s); check the folder exists and is writable"):format(path, err), 0) end
  local ok, werr = f:write(table.concat(parts))
  f:close()
  if not ok then error(("llmc shard: writing %s failed (%s)"):format(path, werr), 0) end
end

-- read(path) -> tokens (a Lua array of ids); errors name the file and what is wrong with it.
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then error(("llmc shard: cannot open %s (%s); write one with tests/bench/llmc_data.lua"):format(path, err), 0) end
  local s = f:read("*a")
  f:close()
  if #s < M.HEADER_BYTES then
    error(("llmc shard %s: %d bytes, shorter than the %d-byte header; not an llm.c token shard"):format(path, #s, M.HEADER_BYTES), 0)
  end
  local magic, version, n = u32_at(s, 1), u32_at(s, 5), u32_at(s, 9)
  if magic ~= M.MAGIC then
    error(("llmc shard %s: magic %d, expected %d; not an llm.c token shard"):format(path, magic, M.MAGIC), 0)
  end
  if version ~= M.VERSION then
    error(("llmc shard %s: version %d, expected %d (uint16 GPT-2 tokens)"):format(path, version, M.VERSION), 0)
  end
  local body = #s - M.HEADER_BYTES
  if n == 0 or n >= 2 ^ 31 or body ~= 2 * n then
    error(("llmc shard %s: the header says %d tokens but %d bytes of tokens follow (expected %d); the file is cut short or not a shard")
      :format(path, n, body, 2 * n), 0)
  end
  local tokens, o = {}, M.HEADER_BYTES
  for i = 1, n do
    local lo, hi = byte(s, o + 2 * i - 1, o + 2 * i)
    tokens[i] = lo + hi * 256
  end
  return tokens
end

return M
