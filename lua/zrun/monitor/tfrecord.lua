-- TFRecord framing, the container of TensorBoard event files: each record is
--   uint64 length (little-endian) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
-- with CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and TensorFlow's mask
-- ((crc >> 15) | (crc << 17)) + 0xa282ead8. Pure Lua over LuaJIT's bit library; records are small.
local bit = require "bit"

local M = {}
local band, bor, bxor, rshift, lshift, tobit = bit.band, bit.bor, bit.bxor, bit.rshift, bit.lshift, bit.tobit
local byte, char, concat = string.byte, string.char, table.concat

local TABLE = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if band(c, 1) ~= 0 then c = bxor(rshift(c, 1), tobit(0x82F63B78)) else c = rshift(c, 1) end
  end
  TABLE[i] = c
end

local function unsigned(x) return x < 0 and x + 2 ^ 32 or x end

-- CRC-32C of a string, as an unsigned 32-bit number.
function M.crc32c(s)
  local crc = tobit(0xFFFFFFFF)
  for i = 1, #s do crc = bxor(rshift(crc, 8), TABLE[band(bxor(crc, byte(s, i)), 0xFF)]) end
  return unsigned(bxor(crc, tobit(0xFFFFFFFF)))
end

-- TensorFlow's masked CRC (a CRC stored next to the data it covers is rotated and offset).
function M.mask(crc)
  local c = tobit(crc)
  return unsigned(tobit(bor(rshift(c, 15), lshift(c, 17)) + tobit(0xa282ead8)))
end

-- n (0 <= n < 2^53) as `bytes` little-endian bytes.
function M.le(n, bytes)
  local out = {}
  for i = 1, bytes do
    out[i] = char(n % 256)
    n = (n - n % 256) / 256
  end
  return concat(out)
end

-- One framed record around data.
function M.record(data)
  local len = M.le(#data, 8)
  return len .. M.le(M.mask(M.crc32c(len)), 4) .. data .. M.le(M.mask(M.crc32c(data)), 4)
end

-- Splits a string of records back into their data, checking both CRCs (for tests and readers).
function M.read(s)
  local out, pos = {}, 1
  local function u(at, bytes)
    local n = 0
    for i = bytes, 1, -1 do n = n * 256 + byte(s, at + i - 1) end
    return n
  end
  while pos <= #s do
    if pos + 12 > #s + 1 then error(("tfrecord: truncated header at byte %d"):format(pos - 1), 0) end
    local len = u(pos, 8)
    if M.mask(M.crc32c(s:sub(pos, pos + 7))) ~= u(pos + 8, 4) then
      error(("tfrecord: bad length CRC at byte %d"):format(pos - 1), 0)
    end
    local data = s:sub(pos + 12, pos + 11 + len)
    if #data ~= len or pos + 15 + len > #s then error(("tfrecord: truncated record at byte %d"):format(pos - 1), 0) end
    if M.mask(M.crc32c(data)) ~= u(pos + 12 + len, 4) then
      error(("tfrecord: bad data CRC in the record at byte %d"):format(pos - 1), 0)
    end
    out[#out + 1] = data
    pos = pos + 16 + len
  end
  return out
end

return M
