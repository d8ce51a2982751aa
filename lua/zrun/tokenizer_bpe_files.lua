-- A tokenizer folder without tokenizer.json but with GPT-2's vocab.json + merges.txt (older models,
-- most of them shipped as pytorch_model.bin): the tokenizer.json transformers builds from them
-- (convert_slow_tokenizer.GPT2Converter: byte-level BPE, the ByteLevel pre-tokenizer, decoder and
-- post-processor, the special tokens of tokenizer_config.json / special_tokens_map.json /
-- added_tokens.json), as JSON text for the C tokenizer to load. Other slow tokenizer classes
-- (RoBERTa's template, SentencePiece's tokenizer.model) are refused in one line.
local cjson = require "cjson"

local M = {}
local fmt = string.format

local read = require("zrun.checkpoint_store").read_all -- (a file's bytes, or nil)
local function decode(path)
  local s = read(path)
  if not s then return nil end
  local ok, v = pcall(cjson.decode, s)
  if not ok or type(v) ~= "table" then error(fmt("%s: invalid JSON", path), 0) end
  return v
end

local CLASSES = { GPT2Tokenizer = true, GPT2TokenizerFast = true }

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() end
  return f ~= nil
end

-- Whether dir holds vocab.json and merges.txt (and no tokenizer.json).
function M.applies(dir)
  return type(dir) == "string" and not exists(dir .. "/tokenizer.json") and exists(dir .. "/vocab.json")
    and exists(dir .. "/merges.txt")
end

-- The tokenizer.json text for dir's vocab.json + merges.txt.
function M.tokenizer_json(dir)
  local cfg = decode(dir .. "/tokenizer_config.json") or {}
  local cls = cfg.tokenizer_class
  if cls ~= nil and not CLASSES[cls] then
    error(fmt("%s: a %s's vocab.json + merges.txt and no tokenizer.json; zrun builds one for GPT-2's byte-level BPE "
      .. "only: write tokenizer.json with transformers (AutoTokenizer.from_pretrained(dir).save_pretrained(dir))",
      dir, tostring(cls)), 0)
  end
  if cfg.add_bos_token == true then
    error(fmt("%s: tokenizer_config.json sets add_bos_token, which zrun does not build from vocab.json + merges.txt; "
      .. "write tokenizer.json with transformers", dir), 0)
  end
  local vocab = decode(dir .. "/vocab.json")
  local merges = {}
  local n = 0
  for line in (read(dir .. "/merges.txt") or ""):gmatch("[^\r\n]+") do
    n = n + 1
    if not (n == 1 and line:match("^#version")) and line ~= "" then
      if not line:match("^[^ ]+ [^ ]+$") then
        error(fmt("%s/merges.txt: line %d is not two tokens separated by a space: %q", dir, n, line:sub(1, 60)), 0)
      end
      merges[#merges + 1] = line
    end
  end
  -- special tokens: transformers' added_tokens_decoder, the special-tokens map, added_tokens.json
  local added, seen = {}, {}
  local function add(content, id, special)
    if type(content) == "table" then content = content.content end
    if type(content) ~= "string" or seen[content] then return end
    id = id or vocab[content]
    if type(id) ~= "number" then return end
    seen[content] = true
    added[#added + 1] = { id = id, content = content, single_word = false, lstrip = false, rstrip = false,
      normalized = not special, special = special }
  end
  local ids = {}
  for k in pairs(type(cfg.added_tokens_decoder) == "table" and cfg.added_tokens_decoder or {}) do ids[#ids + 1] = k end
  table.sort(ids, function(a, b) return tonumber(a) < tonumber(b) end)
  for _, k in ipairs(ids) do
    local e = cfg.added_tokens_decoder[k]
    add(e.content, tonumber(k), e.special ~= false)
  end
  local map = decode(dir .. "/special_tokens_map.json") or {}
  for _, key in ipairs({ "bos_token", "eos_token", "unk_token", "pad_token" }) do add(cfg[key] or map[key], nil, true) end
  local extra = decode(dir .. "/added_tokens.json") or {}
  local names = {}
  for k in pairs(extra) do names[#names + 1] = k end
  table.sort(names, function(a, b) return extra[a] < extra[b] end)
  for _, k in ipairs(names) do add(k, extra[k], false) end
  table.sort(added, function(a, b) return a.id < b.id end)
  local prefix = cfg.add_prefix_space == true
  local tj = {
    version = "1.0", truncation = cjson.null, padding = cjson.null, added_tokens = added, normalizer = cjson.null,
    pre_tokenizer = { type = "ByteLevel", add_prefix_space = prefix, trim_offsets = true, use_regex = true },
    post_processor = { type = "ByteLevel", add_prefix_space = true, trim_offsets = false, use_regex = true },
    decoder = { type = "ByteLevel", add_prefix_space = true, trim_offsets = true, use_regex = true },
    model = { type = "BPE", dropout = cjson.null, unk_token = cjson.null, continuing_subword_prefix = "",
      end_of_word_suffix = "", fuse_unk = false, byte_fallback = false, vocab = vocab, merges = merges },
  }
  if #added == 0 then tj.added_tokens = nil end -- (an empty Lua table would be written as an object)
  return cjson.encode(tj)
end

return M
