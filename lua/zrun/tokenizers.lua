-- zr.tokenizers: Hugging Face tokenizer.json tokenizers (C, exact to the `tokenizers` library)
-- and a built-in byte-level tokenizer for runs with no tokenizer file.
--   local tok = zr.tokenizers.load("meta-llama/Llama-3.2-1B")   -- dir, tokenizer.json, or cached hub id
--   tok:encode("Hello world")  --> { 128000, 9906, 1917 }
local C = require "zrun._C"
local M = {}

local function exists(p) local f = io.open(p, "rb"); if f then f:close(); return true end return false end

-- Resolves a tokenizer.json from a file, a model directory or a hub id in the local cache.
function M.resolve(ref)
  if exists(ref) and ref:match("%.json$") then return ref end
  if exists(ref .. "/tokenizer.json") then return ref .. "/tokenizer.json" end
  local ok, hf = pcall(require, "zrun.hf")
  if ok and hf.resolve then
    local okr, dir = pcall(hf.resolve, ref)
    if okr and type(dir) == "string" and exists(dir .. "/tokenizer.json") then return dir .. "/tokenizer.json" end
  end
  error(("no tokenizer.json for '%s': looked for the file itself, %s/tokenizer.json and the Hugging Face cache"):format(ref, ref), 0)
end

function M.load(ref) return C.tokenizer_load(M.resolve(ref)) end

-- Byte-level tokenizer: ids 0 pad, 1 bos, 2 eos, 3..258 the bytes 0..255 (vocab 259, the size
-- of the built-in tiny Llama's vocabulary).
local Byte = {}
Byte.__index = Byte
M.ByteTokenizer = Byte
function Byte.new() return setmetatable({}, Byte) end
function Byte:encode(text, add_special, max_length)
  local ids = {}
  if add_special ~= false then ids[1] = 1 end
  for i = 1, #text do ids[#ids + 1] = text:byte(i) + 3 end
  if max_length and #ids > max_length then for i = #ids, max_length + 1, -1 do ids[i] = nil end end
  return ids
end
function Byte:decode(ids, skip_special)
  if C.is_tensor(ids) then ids = ids:flat_table() end
  local out = {}
  for i, id in ipairs(ids) do
    if type(id) ~= "number" or id ~= math.floor(id) then
      error(("decode: ids[%d] is %s; token ids are integers"):format(i, tostring(id)), 2)
    end
    if id >= 3 and id < 259 then out[#out + 1] = string.char(id - 3) end
  end
  return table.concat(out)
end
function Byte:vocab_size() return 259 end
function Byte:bos_id() return 1 end
function Byte:eos_id() return 2 end
function Byte:pad_id() return 0 end

return M
