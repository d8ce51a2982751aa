-- Chat templates, as transformers applies them: the Jinja template of a tokenizer's
-- tokenizer_config.json ("chat_template", a string or a list of named templates) or of a
-- chat_template.jinja beside it, rendered by zrun.jinja with the tokenizer's special tokens
-- (bos_token, eos_token, ...) and the caller's variables, then tokenized without adding special
-- tokens (the template writes them). The tokenizers of zr.tokenizers get it as a method:
--   tok:apply_chat_template(messages, { add_generation_prompt = true })        --> ids
--   tok:apply_chat_template(messages, { tokenize = false })                    --> the text
--   tok:apply_chat_template(messages, { return_dict = true, return_assistant_tokens_mask = true })
--     --> { input_ids =, attention_mask =, assistant_masks = } (1 on the tokens of {% generation %} blocks)
local cjson = require "cjson"
local M = {}

local fmt = string.format
local read = require("zrun.checkpoint_store").read_all -- (a file's contents, or nil)
local function exists(p) return read(p) ~= nil end

M.SPECIAL = { "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token" }

-- The chat settings beside a tokenizer.json: { templates = {name = source} (nil when none),
-- special = {bos_token = "<s>", ...} (tokenizer_config.json's; special_tokens_map.json's win where the config
-- has no added_tokens_decoder, as transformers 5 reads them) }. A chat_template.jinja file (transformers >= 4.43 writes it)
-- wins over tokenizer_config.json's "chat_template"; named templates come from its list form or from
-- additional_chat_templates/<name>.jinja.
function M.read_config(dir)
  local cfg, special = {}, {}
  local p = dir .. "/tokenizer_config.json"
  if exists(p) then
    local ok, v = pcall(cjson.decode, read(p))
    if not ok then error(fmt("%s: invalid JSON (%s)", p, tostring(v)), 0) end
    cfg = v
  end
  -- special_tokens_map.json: read (after the config: its keys win) only where tokenizer_config.json has no
  -- "added_tokens_decoder" (saved before transformers 4.34), as transformers 5 reads them
  local okm, map = pcall(function() return cjson.decode(read(dir .. "/special_tokens_map.json") or "{}") end)
  local legacy = cfg.added_tokens_decoder == nil and okm and map or {}
  for _, m in ipairs { cfg, legacy } do
    if type(m) == "table" then
      for _, k in ipairs(M.SPECIAL) do
        local v = m[k]
        if type(v) == "table" then v = v.content end
        if type(v) == "string" then special[k] = v end
      end
    end
  end
  local templates
  local t = cfg.chat_template
  if type(t) == "string" then templates = { default = t }
  elseif type(t) == "table" then
    templates = {}
    for i, e in ipairs(t) do
      if type(e) ~= "table" or type(e.name) ~= "string" or type(e.template) ~= "string" then
        error(fmt("%s: chat_template[%d] must be {\"name\": ..., \"template\": ...}", p, i), 0)
      end
      templates[e.name] = e.template
    end
  end
  if exists(dir .. "/chat_template.jinja") then
    templates = templates or {}
    templates.default = read(dir .. "/chat_template.jinja")
  end
  local extra = dir .. "/additional_chat_templates"
  local okd, names = pcall(require("zrun._C").listdir, extra)
  if okd and type(names) == "table" then
    for _, n in ipairs(names) do
      local name = n:match("^(.+)%.jinja$")
      if name then templates = templates or {}; templates[name] = read(extra .. "/" .. n) end
    end
  end
  -- (what truncation = true without max_length cuts to, as transformers: model_max_length under 1e20; and the side)
  local mml = type(cfg.model_max_length) == "number" and cfg.model_max_length < 1e20 and cfg.model_max_length or nil
  return { templates = templates, special = special, model_max_length = mml, truncation_side = cfg.truncation_side }
end

-- Raises (at the caller's level) unless source is a non-empty template that compiles: set_chat_template
-- shows a syntax error there rather than at the first row it renders.
function M.check_template(source)
  if type(source) ~= "string" or source == "" then error("set_chat_template(source): source must be a Jinja template string", 3) end
  require("zrun.jinja").compile(source)
end

-- The template source to use (transformers' get_chat_template): opts.chat_template as a template name
-- or the template itself; else "tool_use" when tools are given and it exists; else "default".
function M.pick(settings, chat_template, tools)
  local ts = settings and settings.templates
  if chat_template ~= nil then
    if type(chat_template) ~= "string" then error("apply_chat_template: chat_template must be a string (a template or its name)", 0) end
    return ts and ts[chat_template] or chat_template
  end
  if not ts then
    error("apply_chat_template: this tokenizer has no chat template (no \"chat_template\" in its tokenizer_config.json " ..
      "and no chat_template.jinja); pass chat_template = \"...\" (a Jinja template)", 0)
  end
  if tools and ts.tool_use then return ts.tool_use end
  if ts.default then return ts.default end
  local names = {}
  for k in pairs(ts) do names[#names + 1] = k end
  table.sort(names)
  error(fmt("apply_chat_template: this tokenizer has named templates (%s) but no \"default\"; pass chat_template = one of them",
    table.concat(names, ", ")), 0)
end

local KNOWN = { tokenize = true, add_generation_prompt = true, return_dict = true, return_assistant_tokens_mask = true,
  chat_template = true, tools = true, documents = true, continue_final_message = true, max_length = true, truncation = true,
  padding = true, return_tensors = true, tokenizer_kwargs = true }
-- transformers' options for the tokenizer call that zrun does not take (else they would be template variables)
local REFUSED = {
  padding = "zrun pads in its data collators (zr.datasets.causal_lm_collator), not here",
  return_tensors = "the ids are a Lua table; zr.tensor(ids, { dtype = \"i64\" }) makes a tensor",
  tokenizer_kwargs = "tok:encode takes add_special_tokens and max_length only",
}
local TRUNCATE = { [true] = true, longest_first = true, only_first = true, [false] = false, do_not_truncate = false }

-- transformers' continue_final_message (5.x): the final message's field (opts.continue_final_message, a
-- field name or true for "content"; in a list of blocks, the last one with text) gets this tag appended,
-- and the rendered text is cut where the tag is, keeping the field's trailing whitespace unless the
-- template trimmed it.
local CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

-- messages with the tag appended to the final message's field (copies; the caller's tables are kept), and
-- the field's text before it.
local function tag_final(messages, key, source)
  local last = messages[#messages]
  local final = type(last) == "table" and last[key] or nil
  if final == nil then error(fmt('apply_chat_template: continue_final_message is set but the final message has no "%s" to continue', key), 0) end
  if not source:find(key, 1, true) then
    error(fmt('apply_chat_template: continue_final_message is set to "%s" but the chat template does not use that field', key), 0)
  end
  local function copy(t) local c = {} for k, v in pairs(t) do c[k] = v end return setmetatable(c, getmetatable(t)) end
  local msg = copy(last)
  if type(final) == "table" then
    local blocks, found = copy(final), nil
    for i = #blocks, 1, -1 do
      if type(blocks[i]) == "table" and type(blocks[i].text) == "string" then
        found, blocks[i] = blocks[i].text, copy(blocks[i])
        blocks[i].text = found .. CONTINUE_TAG
        break
      end
    end
    if not found then error("apply_chat_template: continue_final_message is set but the final message has no text block to continue", 0) end
    msg[key], final = blocks, found
  elseif type(final) == "string" then
    msg[key] = final .. CONTINUE_TAG
  else
    error(fmt('apply_chat_template: continue_final_message: the final message\'s "%s" must be a string or a list of blocks', key), 0)
  end
  local out = {}
  for i = 1, #messages - 1 do out[i] = messages[i] end
  out[#messages] = msg
  return setmetatable(out, getmetatable(messages)), final
end

-- Rendered text of messages (and the {% generation %} spans, 0-based byte offsets [s, e)).
function M.render(settings, messages, o)
  if type(messages) ~= "table" or #messages == 0 then
    error("apply_chat_template: messages must be a non-empty list of {role =, content =} tables", 0)
  end
  if o.continue_final_message and o.add_generation_prompt then
    error("apply_chat_template: continue_final_message and add_generation_prompt cannot both be true", 0)
  end
  local source = M.pick(settings, o.chat_template, o.tools)
  local ctx = {}
  for k, v in pairs(settings and settings.special or {}) do ctx[k] = v end
  for k, v in pairs(o) do if not KNOWN[k] then ctx[k] = v end end -- extra template variables
  local final
  if o.continue_final_message then
    local key = type(o.continue_final_message) == "string" and o.continue_final_message or "content"
    messages, final = tag_final(messages, key, source)
  end
  -- (transformers passes tools = None and documents = None when not given: defined, and none)
  ctx.messages, ctx.tools, ctx.documents = messages, o.tools or cjson.null, o.documents or cjson.null
  ctx.add_generation_prompt = o.add_generation_prompt and true or false
  local text, spans = require("zrun.jinja").render(source, ctx)
  if final then -- cut where the tag is
    local tag = CONTINUE_TAG:sub(1, -2)
    local at, s = nil, 0
    while true do
      s = text:find(tag, s + 1, true)
      if not s then break end
      at = s
    end
    if not at or not text:find(final:match("^%s*(.-)%s*$"), 1, true) then
      error("apply_chat_template: continue_final_message: the final message is not in the text the chat template renders", 0)
    end
    if text:sub(at, at + #CONTINUE_TAG - 1) == CONTINUE_TAG then text = text:sub(1, at - 1)
    else text = text:sub(1, at - 1):match("^(.-)%s*$") end -- (the template trimmed the message)
  end
  return text, spans or {}
end

-- The number of leading ids a and b have in common (TRL's common_prefix_length).
function M.common_prefix(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do if a[i] ~= b[i] then return i - 1 end end
  return n
end
local common_prefix = M.common_prefix

-- 0/1 per token of ids (the encoding of text): 1 on the tokens holding a byte of a span, as
-- transformers marks them (char_to_token of each span's first and last character). The tokens at a
-- span's edges are found by encoding the text up to each edge: the ids agree with the full encoding up
-- to the edge when it is a token boundary (a template's blocks end on special tokens and newlines), and
-- otherwise the first token that differs is the one across the edge. An added token that strips the
-- whitespace after it (rstrip: Phi-3's <|assistant|>, <|end|>) holds a span's first bytes when they are that
-- whitespace: then it is the span's first token, as its offsets hold them in transformers' encoding; it shows
-- as the encoding up to the edge unchanged by the span's first character.
function M.spans_to_mask(tok, text, ids, spans)
  local mask = {}
  for i = 1, #ids do mask[i] = 0 end
  for _, sp in ipairs(spans) do
    local s, e = sp[1], sp[2]
    if e > s then
      local first = 0
      if s > 0 then
        local pre = tok:encode(text:sub(1, s), false)
        first = common_prefix(pre, ids)
        local c = text:byte(s + 1)
        local n = c < 0x80 and 1 or c < 0xE0 and 2 or c < 0xF0 and 3 or 4 -- (the UTF-8 character at the edge)
        if first > 0 and first == #pre then
          local more = tok:encode(text:sub(1, s + n), false)
          if #more == #pre and common_prefix(more, pre) == #pre then first = first - 1 end
        end
      end
      local upto = tok:encode(text:sub(1, e), false)
      local last = common_prefix(upto, ids) -- tokens wholly before e
      if last < #upto then last = last + 1 end -- the token across e holds byte e - 1
      if first >= #ids then break end -- (cut off: transformers stops here too)
      for i = first + 1, math.min(last, #ids) do mask[i] = 1 end
    end
  end
  return mask
end

-- tok:apply_chat_template(messages [, opts]), transformers' signature as a table of options. A list of
-- conversations gives a list of results (a table of lists with return_dict), as transformers' batch.
function M.apply(tok, settings, messages, opts)
  local o = opts or {}
  if type(o) ~= "table" then error("apply_chat_template(messages [, opts]): opts must be a table", 2) end
  for k, why in pairs(REFUSED) do
    if o[k] ~= nil and o[k] ~= false and o[k] ~= "do_not_pad" then error(fmt("apply_chat_template: %s is not supported (%s)", k, why), 0) end
  end
  if o.truncation ~= nil and TRUNCATE[o.truncation] == nil then
    error(fmt("apply_chat_template: truncation must be true, false, \"longest_first\", \"only_first\" or \"do_not_truncate\", got %s",
      tostring(o.truncation)), 0)
  end
  local first = type(messages) == "table" and messages[1]
  if type(first) == "table" and first.role == nil and type(first[1]) == "table" then -- a batch of conversations
    local outs = {}
    for i, conv in ipairs(messages) do outs[i] = M.apply(tok, settings, conv, o) end
    if type(outs[1]) ~= "table" or outs[1].input_ids == nil then return outs end
    local out = {}
    for i, r in ipairs(outs) do for k, v in pairs(r) do out[k] = out[k] or {}; out[k][i] = v end end
    return out
  end
  local tokenize = o.tokenize ~= false
  if o.return_assistant_tokens_mask and not (tokenize and o.return_dict) then
    error("apply_chat_template: return_assistant_tokens_mask = true needs return_dict = true and tokenize = true", 0)
  end
  if o.return_assistant_tokens_mask and o.continue_final_message then
    error("apply_chat_template: continue_final_message cannot be used with return_assistant_tokens_mask", 0)
  end
  local text, spans = M.render(settings, messages, o)
  if not tokenize then return text end
  -- truncation without max_length: to the tokenizer's model_max_length (transformers), from the side it names
  local limit = TRUNCATE[o.truncation or false] and (o.max_length or settings and settings.model_max_length) or nil
  if limit and o.return_assistant_tokens_mask and settings and settings.truncation_side == "left" then
    error("apply_chat_template: return_assistant_tokens_mask with truncation from the left (the tokenizer's truncation_side) is not supported", 0)
  end
  local ids = tok:encode(text, false, limit)
  if not o.return_dict then return ids end
  local out = { input_ids = ids, attention_mask = {} }
  for i = 1, #ids do out.attention_mask[i] = 1 end
  if o.return_assistant_tokens_mask then
    if #spans == 0 and not M.pick(settings, o.chat_template, o.tools):find("{%%%-?%s*generation%s*%-?%%}") then
      error("apply_chat_template: return_assistant_tokens_mask = true but the chat template has no {% generation %} block", 0)
    end
    out.assistant_masks = M.spans_to_mask(tok, text, ids, spans)
  end
  return out
end

return M
