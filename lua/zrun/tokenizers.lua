-- zr.tokenizers: Hugging Face tokenizer.json tokenizers (C, exact to the `tokenizers` library)
-- and a built-in byte-level tokenizer for runs with no tokenizer file.
--   local tok = zr.tokenizers.load("meta-llama/Llama-3.2-1B")   -- dir, tokenizer.json, or cached hub id
--   tok:encode("Hello world")  --> { 128000, 9906, 1917 }
--   tok:save_pretrained("out/model")      -- the files transformers' AutoTokenizer reads (also
--                                         -- zr.tokenizers.save_pretrained(tok, dir)); load() reads them back
local C = require "zrun._C"
local M = {}

local function exists(p) local f = io.open(p, "rb"); if f then f:close(); return true end return false end

-- Resolves a tokenizer.json from a file, a model directory or a hub id in the local cache. A folder
-- with GPT-2's vocab.json + merges.txt instead: its tokenizer.json path (not there) and the folder,
-- for zrun.tokenizer_bpe_files to build the file's text.
function M.resolve(ref)
  if type(ref) ~= "string" or ref == "" then
    error(("tokenizers.load: expected a tokenizer.json path, a model folder or a hub id in the local cache, got %s")
      :format(ref == "" and "an empty string" or tostring(ref)), 0)
  end
  if exists(ref) and ref:match("%.json$") then return ref end
  local bpe = require "zrun.tokenizer_bpe_files"
  local function in_dir(dir)
    if exists(dir .. "/tokenizer.json") then return dir .. "/tokenizer.json" end
    if bpe.applies(dir) then return dir .. "/tokenizer.json", dir end
  end
  local path, bdir = in_dir(ref)
  if path then return path, bdir end
  local ok, hf = pcall(require, "zrun.hf")
  if ok and hf.resolve then
    local okr, dir = pcall(hf.resolve, ref)
    if okr and type(dir) == "string" then
      path, bdir = in_dir(dir)
      if path then return path, bdir end
    end
  end
  error(("no tokenizer.json for '%s': looked for the file itself, %s/tokenizer.json (or GPT-2's vocab.json + merges.txt) "
    .. "and the Hugging Face cache"):format(ref, ref), 0)
end

-- Where each loaded tokenizer came from (weak keys), so save_pretrained can copy its files; and its
-- chat settings (zrun.chat: the templates and special token strings of tokenizer_config.json).
local sources = setmetatable({}, { __mode = "k" })
local converted = setmetatable({}, { __mode = "k" }) -- tokenizer.json text built from vocab.json + merges.txt
local chats = setmetatable({}, { __mode = "k" })
local specials = setmetatable({}, { __mode = "k" }) -- special tokens set after loading: {eos_token =, pad_token =}
local chat = require "zrun.chat"

-- The chat settings of tok (its templates and special tokens), read from its files once.
local function chat_settings(tok)
  local s = chats[tok]
  if not s then
    local src = sources[tok]
    s = src and chat.read_config(src:match("^(.*)/[^/]*$") or ".") or { special = {} }
    -- a special token no config file names: the one the tokenizer itself found (its post-processor's
    -- bos / eos, or a well-known name), so that a template's bos_token / eos_token still render
    for k, id in pairs { bos_token = tok:bos_id(), eos_token = tok:eos_id(), pad_token = tok:pad_id() } do
      if not s.special[k] and id then s.special[k] = tok:id_to_token(id) end
    end
    for k, v in pairs(specials[tok] or {}) do s.special[k] = v end -- (set_special_tokens: they win)
    chats[tok] = s
  end
  return s
end

-- tok:apply_chat_template(messages [, opts]) (zrun.chat.apply, transformers' method): the ids of the
-- conversation rendered with the tokenizer's chat template; opts.tokenize = false gives the text;
-- opts.return_dict (+ return_assistant_tokens_mask) a table with input_ids, attention_mask, assistant_masks.
function M.apply_chat_template(tok, messages, opts) return chat.apply(tok, chat_settings(tok), messages, opts) end

-- tok:get_chat_template([chat_template [, tools]]) (transformers' method): the template source apply_chat_template
-- would render with: chat_template (a name of the tokenizer's templates, or a template), else "tool_use" when tools
-- are given and the tokenizer has it, else its default template; raises when it has none.
function M.get_chat_template(tok, chat_template, tools) return chat.pick(chat_settings(tok), chat_template, tools) end

-- tok:set_chat_template(source): use this Jinja chat template (as `tokenizer.chat_template = ...` in
-- transformers); save_pretrained writes it to chat_template.jinja.
function M.set_chat_template(tok, source)
  chat.check_template(source)
  local s = chat_settings(tok)
  s.templates = s.templates or {}
  s.templates.default, s.set = source, true
end

-- transformers 5 rebuilds the pipeline of some tokenizer classes instead of running tokenizer.json's:
-- LlamaTokenizer (Llama-2, TinyLlama, Mistral v0.1, ...) gets no normalizer and a Metaspace
-- pre-tokenizer that prepends "▁" to the text's first piece only (legacy = false, its default; "always"
-- with legacy = true, none with add_prefix_space = false), where the file's Prepend normalizer also
-- prepends after every special token (a chat template's "</s>\n" becomes </s> ▁ \n) and before a leading
-- space; its decoder strips the first space unless add_prefix_space = false. The class comes from
-- tokenizer_config.json beside the file.
local METASPACE_CLASSES = { LlamaTokenizer = true, LlamaTokenizerFast = true }
-- A JSON object read from an optional file (a table, or nil when it is absent or not a JSON object).
local function optional_json(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local ok, v = pcall(require("cjson").decode, f:read("*a"))
  f:close()
  return ok and type(v) == "table" and v or nil
end

local SET_IDS = { "eos", "pad" } -- (the special tokens set_special_tokens sets)

-- transformers tokenizer names zrun's tokenizers lack, and what to write instead: reading one (tok:add_tokens(...),
-- tok.pad_token_id) raises this one line at the caller's, not "attempt to call a nil value".
local NEW_TOKENS = "adding tokens to the vocabulary is not supported (the embedding would need new rows); a token " ..
  "already in it becomes eos or pad with zr.tokenizers.set_special_tokens(tok, { pad_token = \"...\" })"
local HF_NAMES = {
  add_tokens = NEW_TOKENS, add_special_tokens = NEW_TOKENS,
  encode_plus = "tok:encode(text [, add_special_tokens [, max_length]]), one text a call; the collators pad batches",
  batch_encode_plus = "tok:encode(text [, add_special_tokens [, max_length]]) for each text; the collators pad batches",
  batch_decode = "tok:decode(batch [, skip_special_tokens]): a table of id lists or a 2-D tensor gives a string a row",
  convert_ids_to_tokens = "tok:id_to_token(id)", convert_tokens_to_ids = "tok:token_to_id(token)",
  tokenize = "tok:encode(text, false), then tok:id_to_token(id) for each id",
  get_vocab = "tok:vocab_size(), tok:token_to_id(token) and tok:id_to_token(id)",
  pad = "zr.datasets.causal_lm_collator{ pad_token_id = tok:pad_id() }",
  eos_token_id = "tok:eos_id()", pad_token_id = "tok:pad_id()", bos_token_id = "tok:bos_id()",
  resize_token_embeddings = NEW_TOKENS,
}
local function hf_name(_, k)
  local instead = HF_NAMES[k]
  if instead then error(("tokenizer: no %s here (transformers' name); zrun's: %s"):format(k, instead), 2) end
end
-- transformers' AutoTokenizer class of a model type (TOKENIZER_MAPPING_NAMES), for a tokenizer_config.json that
-- names none: transformers then takes the class from config.json beside it (openai-community/gpt2's
-- tokenizer_config.json is {"model_max_length": 1024}; GPT2Tokenizer gives it its <|endoftext|> tokens).
local CLASS_OF_MODEL_TYPE = { gpt2 = "GPT2Tokenizer", qwen2 = "Qwen2Tokenizer", qwen2_moe = "Qwen2Tokenizer",
  qwen3 = "Qwen2Tokenizer" }
-- GPT2Tokenizer's ByteLevel pre-tokenizer adds a prefix space only when tokenizer_config.json's
-- add_prefix_space is true, whatever tokenizer.json says.
local BYTELEVEL_CLASSES = { GPT2Tokenizer = true, GPT2TokenizerFast = true }
-- Qwen2Tokenizer (Qwen2, Qwen2.5, QwQ, ...: transformers 5's tokenization_qwen2.py) gets its own pipeline, whatever
-- tokenizer.json says: the NFC normalizer, a Split on Qwen2's regex (isolated), then ByteLevel without its regex
-- (a space before the text only with tokenizer_config.json's add_prefix_space true); the ByteLevel decoder. The
-- vocabulary, merges, added tokens and post-processor stay the file's.
local QWEN2_CLASSES = { Qwen2Tokenizer = true, Qwen2TokenizerFast = true }
local QWEN2_REGEX = [[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+]]
local function qwen2_pipeline(add_prefix_space)
  return require("cjson").encode({
    normalizer = { type = "NFC" },
    pre_tokenizer = { type = "Sequence", pretokenizers = {
      { type = "Split", pattern = { Regex = QWEN2_REGEX }, behavior = "Isolated", invert = false },
      { type = "ByteLevel", add_prefix_space = add_prefix_space, trim_offsets = true, use_regex = false } } },
    decoder = { type = "ByteLevel", add_prefix_space = true, trim_offsets = true, use_regex = true },
  })
end
local function transformers_pipeline(tok, dir)
  local cfg = optional_json(dir .. "/tokenizer_config.json") or {}
  local cls = cfg.tokenizer_class
  if type(cls) ~= "string" then
    local mc = optional_json(dir .. "/config.json")
    cls = mc and CLASS_OF_MODEL_TYPE[mc.model_type]
  end
  if METASPACE_CLASSES[cls] then
    tok:use_metaspace(cfg.add_prefix_space == false and "never" or cfg.legacy == true and "always" or "first")
  elseif BYTELEVEL_CLASSES[cls] then
    tok:set_add_prefix_space(cfg.add_prefix_space == true)
  elseif QWEN2_CLASSES[cls] then
    tok:set_pipeline(qwen2_pipeline(cfg.add_prefix_space == true))
  end
end

-- Loads a Hugging Face tokenizer (ref: its tokenizer.json, a model directory or a hub id in the local
-- cache, as resolve finds it) as transformers 5's AutoTokenizer does: the C tokenizer runs the file's
-- pipeline (the `tokenizers` library's ids) except where transformers rebuilds it for the class named in
-- tokenizer_config.json or implied by config.json (above: LlamaTokenizer's Metaspace, GPT2Tokenizer's
-- add_prefix_space, Qwen2Tokenizer's NFC + Split + ByteLevel); opts.pipeline = "tokenizer.json" keeps the file's
-- pipeline regardless. tok:save_pretrained(dir) writes the files back.
function M.load(ref, opts)
  local pipeline = require("zrun.kwargs").check("tokenizers.load", opts, { "pipeline" }).pipeline or "transformers"
  local path, bpe_dir = M.resolve(ref)
  local tok
  if bpe_dir then -- GPT-2's vocab.json + merges.txt: transformers' conversion, loaded from a temporary file
    local text = require("zrun.tokenizer_bpe_files").tokenizer_json(bpe_dir)
    local tmp = os.tmpname()
    C.write_file_atomic(tmp, text)
    local ok, t = pcall(C.tokenizer_load, tmp)
    os.remove(tmp)
    if not ok then error(bpe_dir .. ": vocab.json + merges.txt: " .. tostring(t), 0) end
    tok = t
    converted[tok] = text
  else
    tok = C.tokenizer_load(path)
  end
  sources[tok] = path
  if pipeline ~= "transformers" and pipeline ~= "tokenizer.json" then
    error(('tokenizers.load: pipeline must be "transformers" or "tokenizer.json", got %s'):format(tostring(pipeline)), 2)
  end
  if pipeline == "transformers" then transformers_pipeline(tok, path:match("^(.*)/[^/]*$") or ".") end
  -- tok:save_pretrained(dir), as on a transformers tokenizer (the C class's methods table, once)
  local methods = getmetatable(tok).__index
  if type(methods) == "table" and not methods.save_pretrained then
    setmetatable(methods, { __index = hf_name })
    methods.save_pretrained = function(self, dir) return M.save_pretrained(self, dir) end
    methods.apply_chat_template = M.apply_chat_template
    methods.set_chat_template = M.set_chat_template
    methods.get_chat_template = M.get_chat_template
    -- eos_id / pad_id: those set_special_tokens set, as tok.eos_token_id follows tok.eos_token in transformers
    for _, k in ipairs(SET_IDS) do
      local c_id, key = methods[k .. "_id"], k .. "_token"
      methods[k .. "_id"] = function(self)
        local v = specials[self] and specials[self][key]
        if v then return self:token_to_id(v) end
        return c_id(self)
      end
    end
  end
  return tok
end

-- The files of a Hugging Face tokenizer that transformers' AutoTokenizer reads, beside tokenizer.json.
M.FILES = { "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
  "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja" }

local function copy(src, dst)
  local f = assert(io.open(src, "rb"))
  local data = f:read("*a")
  f:close()
  C.write_file_atomic(dst, data)
end

-- Special tokens given to a loaded tokenizer, as a transformers tokenizer's tok.eos_token = "..." (what TRL's
-- SFTTrainer does with eos_token and its pad token): tok:eos_id() / tok:pad_id() and the chat template's
-- eos_token / pad_token follow them; save_pretrained writes them into tokenizer_config.json
-- (and special_tokens_map.json when there is one). t: {eos_token =, pad_token =} strings of its vocabulary.
function M.set_special_tokens(tok, t)
  local s = specials[tok] or {}
  for k, v in pairs(t) do
    if k ~= "eos_token" and k ~= "pad_token" then error("set_special_tokens: eos_token and pad_token only, got " .. tostring(k), 2) end
    if type(v) ~= "string" or not tok:token_to_id(v) then
      error(("set_special_tokens: %s %s is not a token of the vocabulary"):format(k, tostring(v)), 2)
    end
    s[k] = v
    local chat_special = type(tok) == "table" and tok.chat and tok.chat.special or chats[tok] and chats[tok].special
    if chat_special then chat_special[k] = v end -- (a chat template renders it from then on)
  end
  specials[tok] = s
end
-- The special tokens set on tok with set_special_tokens ({} when none).
function M.special_tokens(tok) return specials[tok] or {} end

-- A config file's text with its top-level special token keys set to the strings in set: a string value
-- (or an AddedToken mapping, written as a string then) replaced in place, an absent or null one added;
-- the rest of the text is kept byte for byte.
local function with_specials(text, set)
  local cjson = require "cjson"
  local ok, cfg = pcall(cjson.decode, text)
  if not ok or type(cfg) ~= "table" then return text end
  local enc = require("zrun.hf").encode_json_line
  for _, k in ipairs { "eos_token", "pad_token" } do
    local v = set[k]
    local old = cfg[k]
    local key = '"' .. k .. '"%s*:%s*'
    if v == nil then -- (not set)
    elseif type(old) == "string" then
      local a, b = text:find(key .. enc(old):gsub("%p", "%%%0"))
      if a then text = text:sub(1, a - 1) .. '"' .. k .. '": ' .. enc(v) .. text:sub(b + 1) end
    elseif type(old) == "table" then -- {"content": ..., ...}: no braces nest inside
      local a, e = text:find(key .. "{")
      local b = e and text:find("}", e + 1, true)
      if a and b then text = text:sub(1, a - 1) .. '"' .. k .. '": ' .. enc(v) .. text:sub(b + 1) end
    elseif old == cjson.null then
      local a, b = text:find(key .. "null")
      if a then text = text:sub(1, a - 1) .. '"' .. k .. '": ' .. enc(v) .. text:sub(b + 1) end
    else
      local a = text:find("{", 1, true)
      if a then text = text:sub(1, a) .. '\n  "' .. k .. '": ' .. enc(v) .. "," .. text:sub(a + 1) end
    end
  end
  return text
end

-- The class to write into a saved tokenizer_config.json (text) whose source dir `from` relied on config.json
-- for it, or nil: a folder holding the tokenizer alone has no config.json to say it.
local function implied_class(text, from)
  local cjson = require "cjson"
  local ok, cfg = pcall(cjson.decode, text)
  if not ok or type(cfg) ~= "table" or (cfg.tokenizer_class ~= nil and cfg.tokenizer_class ~= cjson.null) then return nil end
  local mc = optional_json(from .. "/config.json")
  return mc and CLASS_OF_MODEL_TYPE[mc.model_type] or nil
end

-- Writes the tokenizer's files into dir (tokenizer.json and the config files found beside the one
-- it was loaded from, or the byte tokenizer's own); returns the names written. A tokenizer_config.json
-- without tokenizer_class gets the class config.json beside it implied (transformers' lookup), so that
-- the saved folder loads alone as the source did.
function M.save_pretrained(tok, dir)
  C.makedirs(dir)
  if type(tok) == "table" and tok.save_pretrained then return tok:save_pretrained(dir) end
  local src = sources[tok]
  if not src then error("tokenizer save_pretrained: this tokenizer was not loaded with zr.tokenizers.load, so its files are unknown", 0) end
  local from = src:match("^(.*)/[^/]*$") or "."
  local out = {}
  local set = chats[tok] and chats[tok].set
  for _, n in ipairs(M.FILES) do
    local p = n == "tokenizer.json" and src or (from .. "/" .. n)
    if n == "tokenizer.json" and converted[tok] then -- (built from vocab.json + merges.txt: written out)
      C.write_file_atomic(dir .. "/" .. n, converted[tok])
      out[#out + 1] = n
    elseif n == "chat_template.jinja" and set then
      C.write_file_atomic(dir .. "/" .. n, chats[tok].templates.default)
      out[#out + 1] = n
    elseif (specials[tok] and n == "special_tokens_map.json" or n == "tokenizer_config.json") and exists(p) then
      local f = assert(io.open(p, "rb"))
      local text = f:read("*a")
      f:close()
      local cls = n == "tokenizer_config.json" and implied_class(text, from)
      if cls then -- (added first, the rest of the text kept byte for byte)
        local a = text:find("{", 1, true)
        local rest = text:sub(a + 1)
        text = text:sub(1, a) .. '"tokenizer_class": "' .. cls .. '"' .. (rest:find("^%s*}") and "" or ", ") .. rest
      end
      C.write_file_atomic(dir .. "/" .. n, specials[tok] and with_specials(text, specials[tok]) or text)
      out[#out + 1] = n
    elseif exists(p) then copy(p, dir .. "/" .. n); out[#out + 1] = n end
  end
  local names = C.listdir(from .. "/additional_chat_templates") -- (transformers' named chat templates)
  for _, n in ipairs(type(names) == "table" and names or {}) do
    if n:match("%.jinja$") then
      C.makedirs(dir .. "/additional_chat_templates")
      copy(from .. "/additional_chat_templates/" .. n, dir .. "/additional_chat_templates/" .. n)
      out[#out + 1] = "additional_chat_templates/" .. n
    end
  end
  return out
end

-- Byte-level tokenizer: ids 0 pad, 1 bos, 2 eos, 3..258 the bytes 0..255 (vocab 259, the size
-- of the built-in tiny Llama's vocabulary).
local Byte = setmetatable({}, { __index = hf_name })
Byte.__index = Byte
M.ByteTokenizer = Byte
-- A byte tokenizer (no state).
function Byte.new() return setmetatable({}, Byte) end
local BYTE_SPECIAL = { ["<pad>"] = 0, ["<s>"] = 1, ["</s>"] = 2 }
-- The ids of text's bytes, after bos unless add_special is false, cut to max_length ids when given.
-- The special tokens' strings "<pad>", "<s>" and "</s>" written in the text are their ids (as in the
-- Hugging Face tokenizer save_pretrained writes, where they are added tokens): a chat template's
-- eos_token ends a turn with id 2.
function Byte:encode(text, add_special, max_length)
  if add_special ~= nil and type(add_special) ~= "boolean" then
    error(("tok:encode(text [, add_special_tokens [, max_length]]): add_special_tokens must be true or false, got a %s " ..
      "(the arguments are positional)"):format(type(add_special)), 2)
  end
  local ids = {}
  if add_special ~= false then ids[1] = 1 end
  local i, n = 1, #text
  while i <= n do
    local b = text:byte(i)
    local sp -- ("<": one of the special strings may start here; they are 3 to 5 bytes)
    if b == 60 then for len = 3, 5 do if BYTE_SPECIAL[text:sub(i, i + len - 1)] then sp = text:sub(i, i + len - 1) end end end
    if sp then ids[#ids + 1], i = BYTE_SPECIAL[sp], i + #sp
    else ids[#ids + 1], i = b + 3, i + 1 end
  end
  if max_length and #ids > max_length then
    if max_length < 1 and add_special ~= false then -- (as the C tokenizers: the text is cut, never bos)
      error("tok:encode(text [, add_special_tokens [, max_length]]): max_length 0 is less than the 1 special tokens the tokenizer adds", 2)
    end
    for i = #ids, max_length + 1, -1 do ids[i] = nil end
  end
  return ids
end
-- The bytes of ids (a table, a tensor or one id) as a string; the special ids decode to nothing (skip_special
-- or not: they have no text). A batch (a table of tables, a 2-D tensor): a table of strings, one a row.
function Byte:decode(ids, skip_special)
  if C.is_tensor(ids) then ids = ids:dim() == 2 and ids:tolist() or ids:flat_table() end
  if type(ids) == "number" then ids = { ids } end
  if type(ids) == "table" and type(ids[1]) == "table" then
    local out = {}
    for i, row in ipairs(ids) do out[i] = self:decode(row, skip_special) end
    return out
  end
  local out = {}
  for i, id in ipairs(ids) do
    if type(id) ~= "number" or id ~= math.floor(id) then
      error(("tok:decode(ids [, skip_special_tokens]): ids[%d] must be an integer, got %s"):format(i, tostring(id)), 2)
    end
    if id >= 3 and id < 259 then out[#out + 1] = string.char(id - 3) end
  end
  return table.concat(out)
end
-- The id of a special token's string ("<pad>", "<s>", "</s>") or of a one-byte string; nil otherwise.
function Byte:token_to_id(token)
  if BYTE_SPECIAL[token] then return BYTE_SPECIAL[token] end
  if type(token) == "string" and #token == 1 then return token:byte() + 3 end
  return nil
end
-- The string of an id: the special tokens' names, a byte's one-byte string; nil when out of range.
function Byte:id_to_token(id)
  if id == 0 then return "<pad>" elseif id == 1 then return "<s>" elseif id == 2 then return "</s>" end
  if type(id) == "number" and id >= 3 and id < 259 then return string.char(id - 3) end
  return nil
end
-- 259: 3 special ids and 256 bytes.
function Byte:vocab_size() return 259 end
-- The special ids: bos 1, eos 2, pad 0.
function Byte:bos_id() return 1 end
-- (see bos_id; a token set_special_tokens set wins)
function Byte:eos_id() local v = specials[self] and specials[self].eos_token return v and self:token_to_id(v) or 2 end
-- (see eos_id)
function Byte:pad_id() local v = specials[self] and specials[self].pad_token return v and self:token_to_id(v) or 0 end

-- The byte tokenizer's chat settings (its special tokens, those set_special_tokens set winning).
local function byte_chat(self)
  if not self.chat then
    self.chat = { special = { bos_token = "<s>", eos_token = "</s>", pad_token = "<pad>" } }
    for k, v in pairs(specials[self] or {}) do self.chat.special[k] = v end
  end
  return self.chat
end

-- tok:apply_chat_template(messages [, opts]) (zrun.chat.apply): the byte tokenizer has no template of
-- its own; pass opts.chat_template or set one with tok:set_chat_template(source). Its bos_token,
-- eos_token and pad_token are "<s>", "</s>" and "<pad>".
function Byte:apply_chat_template(messages, opts)
  byte_chat(self)
  return chat.apply(self, self.chat, messages, opts)
end
-- (see apply_chat_template)
function Byte:set_chat_template(source)
  chat.check_template(source)
  byte_chat(self).templates = { default = source }
end

-- The same tokenizer in Hugging Face's format: a BPE with no merges whose vocabulary is the special
-- tokens and the 256 byte tokens <0x00>..<0xFF> (byte_fallback turns every character into its
-- UTF-8 bytes), <s> prepended; transformers loads it as a PreTrainedTokenizerFast.
function Byte:save_pretrained(dir)
  local hf = require "zrun.hf"
  C.makedirs(dir)
  local vocab = { ["<pad>"] = 0, ["<s>"] = 1, ["</s>"] = 2 }
  for b = 0, 255 do vocab[("<0x%02X>"):format(b)] = b + 3 end
  local added = {}
  for i, t in ipairs { "<pad>", "<s>", "</s>" } do
    added[i] = { id = i - 1, content = t, single_word = false, lstrip = false, rstrip = false, normalized = false, special = true }
  end
  local null = require("cjson").null
  local tj = { version = "1.0", truncation = null, padding = null, added_tokens = added, normalizer = null,
    pre_tokenizer = null,
    post_processor = { type = "TemplateProcessing",
      single = { { SpecialToken = { id = "<s>", type_id = 0 } }, { Sequence = { id = "A", type_id = 0 } } },
      pair = { { SpecialToken = { id = "<s>", type_id = 0 } }, { Sequence = { id = "A", type_id = 0 } },
        { SpecialToken = { id = "<s>", type_id = 1 } }, { Sequence = { id = "B", type_id = 1 } } },
      special_tokens = { ["<s>"] = { id = "<s>", ids = { 1 }, tokens = { "<s>" } } } },
    decoder = { type = "Sequence", decoders = { { type = "ByteFallback" }, { type = "Fuse" } } },
    model = { type = "BPE", dropout = null, unk_token = null, continuing_subword_prefix = null,
      end_of_word_suffix = null, fuse_unk = false, byte_fallback = true, vocab = vocab, merges = "\0merges" } }
  -- (encode_json writes an empty table as {}; merges is an empty list)
  C.write_file_atomic(dir .. "/tokenizer.json", (hf.encode_json(tj):gsub('"\\u0000merges"', "[]")))
  local sp = specials[self] or {}
  C.write_file_atomic(dir .. "/tokenizer_config.json", hf.encode_json({ tokenizer_class = "PreTrainedTokenizerFast",
    bos_token = "<s>", eos_token = sp.eos_token or "</s>", pad_token = sp.pad_token or "<pad>", add_bos_token = true,
    model_max_length = 1e9 }))
  local files = { "tokenizer.json", "tokenizer_config.json" }
  if self.chat and self.chat.templates then
    C.write_file_atomic(dir .. "/chat_template.jinja", self.chat.templates.default)
    files[3] = "chat_template.jinja"
  end
  return files
end

return M
