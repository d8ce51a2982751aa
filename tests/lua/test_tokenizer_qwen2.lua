-- A Qwen2.5-style tokenizer against the `tokenizers` library and transformers 5.17 (tests/golden/qwen2_tok/ and
-- tests/golden/qwen2_tok.json, written by tests/golden/make_qwen2_tok_golden.py): the NFC, NFD, NFKC, NFKD,
-- Lowercase, Strip and StripAccents normalizers on strings with combining characters, decomposed letters, Hangul
-- jamo and full-width digits (committed, nothing else needed), and the ids of WikiText-2 lines (read from
-- ../shared/data or ZRUN_TEST_DATA; that test says SKIP without them).
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"

local home = (ZRUN_HOME or ".") .. "/"
local gdir = home .. "tests/golden/qwen2_tok"
local golden = cjson.decode(T.read_file(home .. "tests/golden/qwen2_tok.json"))
local TOKENIZER_JSON = T.read_file(gdir .. "/tokenizer.json")
local CONFIG_JSON = T.read_file(gdir .. "/tokenizer_config.json")

if zr._C.build_info().utf8proc == false then -- (built without it; a zrun without the normalizers at all fails below)
  T.test("without utf8proc, a tokenizer.json with the NFC normalizer is refused, naming the package", function()
    T.raises(function() zr.tokenizers.load(gdir) end,
      'normalizer type "NFC" needs utf8proc, which this zrun was built without (install libutf8proc-dev')
  end)
  T.skip("normalizers, Qwen2Tokenizer and its chat template", "zrun was built without utf8proc (libutf8proc-dev)")
  return T.done()
end

-- tokenizer.json's text with one top-level field's value (the JSON text up to the next field) replaced.
local function with_field(text, field, value_json)
  local a, b = text:find('\n  "' .. field .. '": ', 1, true)
  assert(a, field .. " not in tokenizer.json")
  local c = text:find(',\n  "', b + 1, true)
  return text:sub(1, b) .. value_json .. text:sub(c)
end

-- A tokenizer loaded from a temporary directory holding these files (name -> text).
local function load_files(files, opts)
  local dir = os.tmpname()
  os.remove(dir)
  zr.makedirs(dir)
  for name, text in pairs(files) do
    local f = assert(io.open(dir .. "/" .. name, "wb"))
    f:write(text)
    f:close()
  end
  local ok, tok = pcall(zr.tokenizers.load, dir, opts)
  for name in pairs(files) do os.remove(dir .. "/" .. name) end
  os.remove(dir)
  if not ok then error(tok, 0) end
  return tok
end

T.test("normalizers (NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Sequence) = the tokenizers library", function()
  T.eq(#golden.normalizers, 10, "normalizers in the golden file")
  for _, n in ipairs(golden.normalizers) do
    local tok = load_files({ ["tokenizer.json"] = with_field(TOKENIZER_JSON, "normalizer", n.normalizer) },
      { pipeline = "tokenizer.json" })
    for i, s in ipairs(golden.unicode) do
      local what = ("%s, string %d (%q)"):format(n.name, i, s)
      T.eq_list(tok:encode(s), n.ids[i], what .. ": ids")
      T.eq(tok:decode(n.ids[i], true), n.decoded[i], what .. ": decode (the tokenizers library skips special tokens)")
    end
  end
end)

T.test("the shipped tokenizer (NFC) on Unicode strings: ids, and decode gives the normalized text back", function()
  local tok = zr.tokenizers.load(gdir)
  local nfc = golden.normalizers[1]
  T.eq(nfc.name, "NFC")
  for i, s in ipairs(golden.unicode) do
    T.eq_list(tok:encode(s), nfc.ids[i], ("string %d (%q)"):format(i, s))
    T.eq(tok:decode(tok:encode(s)), nfc.normalized[i], ("string %d: decode"):format(i))
  end
  local d = golden.decode
  T.eq(tok:decode(d.ids), d.text, "decode with a special token")
  T.eq(tok:decode(d.ids, true), d.skip_special, "decode skipping special tokens")
end)

T.test("the NFC normalizer is what makes decomposed and precomposed text the same ids", function()
  local tok = zr.tokenizers.load(gdir)
  T.eq_list(tok:encode("cafe\204\129 A\204\138"), tok:encode("caf\195\169 \195\133"), "e + U+0301, A + U+030A")
  T.eq_list(tok:encode("\225\132\146\225\133\161\225\134\171"), tok:encode("\237\149\156"), "Hangul jamo = 한")
end)

T.test("Qwen2Tokenizer: transformers 5 rebuilds the pipeline from the class, whatever tokenizer.json says", function()
  T.eq(#golden.auto, 5, "variants in the golden file")
  local shipped = golden.auto[1]
  for _, a in ipairs(golden.auto) do
    T.eq(a.class, "Qwen2Tokenizer", a.name .. ": AutoTokenizer's class")
    local cfg = cjson.decode(CONFIG_JSON)
    for k, v in pairs(a.config) do cfg[k] = v end
    local text = with_field(with_field(TOKENIZER_JSON, "normalizer", a.normalizer), "pre_tokenizer", a.pre_tokenizer)
    local files = { ["tokenizer.json"] = text, ["tokenizer_config.json"] = cjson.encode(cfg) }
    local tok, raw = load_files(files), load_files(files, { pipeline = "tokenizer.json" })
    local differ = 0
    for i, s in ipairs(golden.unicode) do
      local what = ("%s, string %d (%q)"):format(a.name, i, s)
      T.eq_list(tok:encode(s), a.ids[i], what .. ": AutoTokenizer's ids")
      T.eq_list(raw:encode(s), a.tokenizer_json_ids[i], what .. ": tokenizer.json's ids")
      if table.concat(a.ids[i], ",") ~= table.concat(a.tokenizer_json_ids[i], ",") then differ = differ + 1 end
    end
    if a ~= shipped then T.eq(differ > 0, true, a.name .. ": some strings where the two pipelines differ") end
  end
end)

T.test("tok:set_pipeline: parts replaced, absent keys kept, a refused part leaves the tokenizer as it was", function()
  local tok = zr.tokenizers.load(gdir, { pipeline = "tokenizer.json" })
  local s, nfc = golden.unicode[1], golden.normalizers[1].ids[1]
  T.raises(function() tok:set_pipeline('{"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Whitespace"}}') end,
    'pre_tokenizer type "Whitespace" is not supported')
  T.raises(function() tok:set_pipeline("[1]") end, "a pipeline must be a JSON object")
  T.raises(function() tok:set_pipeline("{") end, "tokenizer pipeline")
  T.eq_list(tok:encode(s), nfc, "unchanged after the refusals")
  tok:set_pipeline('{"normalizer": {"type": "NFD"}}')
  T.eq_list(tok:encode(s), golden.normalizers[2].ids[1], "NFD in place of NFC, the rest kept")
  tok:set_pipeline('{"normalizer": null, "decoder": null}')
  local ids = tok:encode("zq zq")
  local toks = {}
  for i, id in ipairs(ids) do toks[i] = tok:id_to_token(id) end
  T.eq(#ids > 1, true, "several tokens")
  T.eq(tok:decode(ids), table.concat(toks, " "), "no decoder: the tokens joined by spaces")
end)

T.test("Qwen2.5's chat template = transformers' apply_chat_template (system message or the default one, tools, add_generation_prompt)", function()
  local tok = zr.tokenizers.load(gdir)
  -- (decoded keeping each object's key order, as json.loads: the tool schema's tojson prints in that order)
  local chat = require("zrun.jinja").json_decode(T.read_file(home .. "tests/golden/qwen2_tok.json")).chat
  T.eq(#chat, 6, "renders in the golden file")
  for i, c in ipairs(chat) do
    local what = ("render %d (%d messages, add_generation_prompt %s%s)"):format(i, #c.messages,
      tostring(c.add_generation_prompt), c.tools and ", tools" or "")
    local o = { add_generation_prompt = c.add_generation_prompt, tokenize = false, tools = c.tools }
    T.eq(tok:apply_chat_template(c.messages, o), c.text, what .. ": text")
    o.tokenize = nil
    T.eq_list(tok:apply_chat_template(c.messages, o), c.input_ids, what .. ": ids")
  end
  T.eq(golden.chat[1].text:find("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.", 1, true), 1,
    "the default system message")
  T.eq(tok:eos_id(), tok:token_to_id("<|im_end|>"), "eos from tokenizer_config.json")
  T.eq(tok:pad_id(), tok:token_to_id("<|endoftext|>"), "pad from tokenizer_config.json")
end)

local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local wiki = data .. "/wikitext-2-raw/wiki.valid.raw"
local wf = io.open(wiki, "rb")
if not wf then
  T.skip("WikiText-2 lines = the tokenizers library and AutoTokenizer", "WikiText-2 not found at " .. wiki)
else
  local lines, i = {}, 0
  for l in wf:lines() do
    lines[i] = l
    i = i + 1
  end
  wf:close()
  T.test("WikiText-2 lines = the tokenizers library and AutoTokenizer (" .. #golden.wikitext .. " lines)", function()
    local tok = zr.tokenizers.load(gdir)
    local raw = zr.tokenizers.load(gdir, { pipeline = "tokenizer.json" })
    local n = 0
    for _, w in ipairs(golden.wikitext) do
      local s = lines[w.line]
      T.eq_list(raw:encode(s), w.ids, "tokenizer.json pipeline, line " .. w.line)
      T.eq_list(tok:encode(s), w.auto_ids or w.ids, "AutoTokenizer, line " .. w.line)
      T.eq(tok:decode(w.ids), s, "decode, line " .. w.line)
      n = n + #w.ids
    end
    T.eq(n > 5000, true, "over 5000 ids compared")
  end)
end

T.done()
