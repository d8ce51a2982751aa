-- Supervised fine-tuning on chat and instruction data, as TRL's SFTTrainer prepares it: each row
-- becomes {input_ids, labels}, the labels -100 where the loss must not look (the prompt of a
-- prompt-completion row; with assistant_only_loss everything outside the chat template's
-- {% generation %} blocks), then zr.Trainer trains on them (padded rows, transformers' token-mean
-- loss). The dataset types, detected from the first row:
--   {text = "..."}                                      language modeling (eos appended if missing, to a field named text only)
--   {messages = {{role =, content =}, ...}}             conversational: the tokenizer's chat template
--   {prompt = "...", completion = "..."}                prompt-completion: the loss after the prompt's tokens only
--   {prompt = {messages...}, completion = {messages...}} conversational prompt-completion
--   {conversations = {{from =, value =}, ...}}          ShareGPT: converted to messages (human -> user, gpt -> assistant)
--   {input_ids = {...} [, labels = {...}]}             already tokenized: kept
--   local ds = zr.sft.prepare(raw, tok, { max_length = 1024, assistant_only_loss = false })
--   local trainer = zr.SFTTrainer { model = m, train_dataset = raw, processing_class = tok, args = { max_length = 512, ... } }
local M = {}
local fmt = string.format

-- SFTConfig's own arguments (TRL), with their defaults; the rest are zr.Trainer's.
M.DEFAULTS = { max_length = 1024, completion_only_loss = "auto", assistant_only_loss = false, dataset_text_field = "text",
  truncation_mode = "keep_start", eos_token = false, pad_token = false, chat_template_path = false, packing = false,
  packing_strategy = "bfd", padding_free = false, pad_to_multiple_of = false, loss_type = false, dataset_num_proc = false,
  dataset_kwargs = false, eval_packing = "auto", shuffle_dataset = false, activation_offloading = false }
-- SFTConfig arguments that change nothing in zrun: said, then dropped.
M.NO_EFFECT = {
  trust_remote_code = "zrun runs its own Llama and GPT-2 code, never a checkpoint's",
  dataset_batch_size = "a tokenization batch size, which TRL removed; rows are prepared in-process",
  model_init_kwargs = "TRL applies it to a model it loads by name and ignores it for a model object, which " ..
    "zr.SFTTrainer always takes: pass dtype / device to zr.models.llama.from_pretrained",
  router_aux_loss_coef = "the router loss of mixture-of-experts models; zrun's Llama and GPT-2 have no router",
}
-- SFTConfig arguments TRL renamed: refused naming the new one.
M.RENAMED = { max_seq_length = "max_length" }

-- TRL 1.10's deprecated packing_strategy "bfd-requeue": what it is now called, said once (TRL: a warning,
-- then bfd_split)
local said_requeue = false
local function packing_strategy(v)
  if v ~= "bfd-requeue" then return v end
  if not said_requeue then
    said_requeue = true
    require("zrun.dist").print0("[zrun] sft: packing_strategy \"bfd-requeue\" was renamed \"bfd_split\" in TRL " ..
      "(deprecated there, to be removed in TRL 2): packing with bfd_split")
  end
  return "bfd_split"
end
-- SFTConfig arguments zrun does not implement: refused with what to do instead, never ignored.
M.REFUSED = {
  activation_offloading = "activation_offloading = true (TRL moves the saved activations to the CPU) is not " ..
    "implemented; gradient_checkpointing = true (TRL's default) keeps one tensor a layer, and ZeRO's offload_optimizer / " ..
    "offload_param move the largest states",
}
-- TRL's loss_type values: "chunked_nll" (TRL's default, but with use_liger_kernel) is "nll" without the full logits
-- (the models' chunked_loss: the LM head over the counted tokens only, a slice of the vocabulary at a time); "dft"
-- weights each token's loss by its probability (zrun.models.llama.causal_lm_loss).
M.LOSS_TYPES = { nll = "nll", chunked_nll = "chunked_nll", dft = "dft" }

-- A special token SFTConfig names (eos_token, pad_token): one token of the tokenizer's vocabulary, as TRL checks.
function M.check_token(tok, what, s)
  if type(s) ~= "string" or not (tok.token_to_id and tok:token_to_id(s)) then
    error(fmt("sft: %s %s is not in the tokenizer's vocabulary (TRL refuses it too): name one of its tokens, or add " ..
      "it to the tokenizer's added tokens first", what, type(s) == "string" and ("'" .. s .. "'") or tostring(s)), 0)
  end
end

local function is_messages(v) return type(v) == "table" and type(v[1]) == "table" and v[1].role ~= nil end

-- TRL's vision datasets: a first row with an image or images field (TRL's test, whatever the rest of the
-- row). TRL refuses them for a model that is not a vision-language one, as all of zrun's are: refused, never
-- trained on their text alone.
function M.check_not_vision(row, where)
  if type(row) == "table" and (row.image ~= nil or row.images ~= nil) then
    error(fmt("%s: the rows have %s field, so they are a vision dataset (TRL's test): zrun's Llama and GPT-2 are " ..
      "text-only, and TRL refuses a vision dataset for a text-only model too; drop the field to train on the text alone",
      where, row.image ~= nil and "an image" or "an images"), 0)
  end
end

-- The dataset type of a row: "text", "messages", "prompt_completion", "processed" (and whether
-- prompt-completion rows are conversational).
function M.row_type(row, text_field)
  if type(row) ~= "table" then error("sft: a row must be a table", 0) end
  if row.input_ids then return "processed" end
  if row.prompt ~= nil and row.completion ~= nil then return "prompt_completion", is_messages(row.prompt) end
  if row.messages ~= nil then return "messages", true end
  if row.conversations ~= nil then return "conversations", true end
  if row[text_field] ~= nil then return "text" end
  local keys = {}
  for k in pairs(row) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  error(fmt("sft: cannot tell this dataset's type from its first row's fields (%s): rows need %s, messages, " ..
    "prompt + completion, conversations or input_ids", table.concat(keys, ", "), text_field), 0)
end

-- ShareGPT's speakers as chat templates name them, as TRL's maintainers describe the format (human is
-- user, gpt is assistant: TRL issue #2083); TRL 1.10 renames the keys only and keeps "human" / "gpt", which
-- templates checking role == "user" / "assistant" do not recognise (said once). Other speakers stay.
local SHAREGPT = { human = "user", gpt = "assistant" }
local function from_sharegpt(conv, i, warned)
  local out = {}
  for k, m in ipairs(conv) do
    if type(m) ~= "table" or m.from == nil or m.value == nil then
      error(fmt("sft: row %d, conversations[%d]: a ShareGPT turn is {from = ..., value = ...}", i, k), 0)
    end
    out[k] = { role = SHAREGPT[m.from] or m.from, content = m.value }
    if SHAREGPT[m.from] and not warned.sharegpt then
      warned.sharegpt = true
      require("zrun.dist").print0("[zrun] sft: ShareGPT's speakers human / gpt are rendered as the roles user / " ..
        "assistant (TRL 1.10 keeps \"human\" / \"gpt\" as roles, which most chat templates do not recognise; " ..
        "rename them in the rows to keep them)")
    end
  end
  return out
end

local function ends_with(s, e) return #e > 0 and s:sub(-#e) == e end

local function concat(a, b)
  local out = {}
  for i = 1, #a do out[i] = a[i] end
  for i = 1, #b do out[#a + i] = b[i] end
  return out
end

local common_prefix = require("zrun.chat").common_prefix

-- One row -> { input_ids, labels } (nil when truncation left nothing to learn). o: the resolved options.
local function tokenize_row(row, i, kind, tok, o, warned)
  local ids, masks = nil, {}
  local tools = row.tools
  if type(tools) == "string" then -- (TRL: a JSON string column, json.loads'd: key order, {} and 1.0 kept)
    local ok, v = pcall(require("zrun.jinja").json_decode, tools, true)
    if not ok then error(fmt("sft: row %d: tools is a string but not JSON (%s)", i, tostring(v)), 0) end
    tools = v
  end
  local chat = { chat_template = o.chat_template, tools = tools }
  for k, v in pairs(type(row.chat_template_kwargs) == "table" and row.chat_template_kwargs or {}) do chat[k] = v end
  local function template(msgs, extra)
    local c = {}
    for k, v in pairs(chat) do c[k] = v end
    for k, v in pairs(extra) do c[k] = v end
    c.return_dict = true
    if o.template_eos then c.eos_token = o.template_eos end
    return tok:apply_chat_template(msgs, c)
  end
  -- TRL's add_eos on rows that are not conversational: the eos ends a field named "text" (whatever
  -- dataset_text_field says), else a string completion
  local text, completion = row.text, row.completion
  if o.eos_token and not o.chatty then
    if type(text) == "string" and not ends_with(text, o.eos_token) then text = text .. o.eos_token
    elseif type(completion) == "string" and not ends_with(completion, o.eos_token) then completion = completion .. o.eos_token end
  end
  if kind == "text" then
    if o.dataset_text_field ~= "text" then text = row[o.dataset_text_field] end
    if type(text) ~= "string" then error(fmt("sft: row %d: %s must be a string", i, o.dataset_text_field), 0) end
    ids = tok:encode(text)
  elseif kind == "messages" or kind == "conversations" then
    local msgs = kind == "messages" and row.messages or from_sharegpt(row.conversations, i, warned)
    local out = template(msgs, { return_assistant_tokens_mask = o.assistant_only_loss })
    ids = out.input_ids
    if o.assistant_only_loss then masks[#masks + 1] = out.assistant_masks end
  elseif kind == "prompt_completion" then
    local prompt_ids
    if is_messages(row.prompt) then
      prompt_ids = template(row.prompt, { add_generation_prompt = true }).input_ids
      local out = template(concat(row.prompt, row.completion), { return_assistant_tokens_mask = o.assistant_only_loss })
      ids = out.input_ids
      if o.assistant_only_loss then masks[#masks + 1] = out.assistant_masks end
    else
      if type(row.prompt) ~= "string" or type(completion) ~= "string" then
        error(fmt("sft: row %d: prompt and completion must both be strings or both lists of messages", i), 0)
      end
      prompt_ids, ids = tok:encode(row.prompt), tok:encode(row.prompt .. completion)
    end
    -- the completion's labels start after as many tokens as the prompt has alone (TRL's completion_mask),
    -- even where the two encodings part earlier: then the first tokens of the completion are not learned
    local n = #prompt_ids
    local same = common_prefix(prompt_ids, ids)
    if same < n and not warned.prefix then
      warned.prefix = true
      io.stderr:write(fmt("[zrun] sft: row %d: the tokenized prompt is not a prefix of the tokenized prompt + completion " ..
        "(the template renders the prompt differently alone, or tokens merge across the boundary, as a prompt ending " ..
        "in a space does); as in TRL the labels start after the prompt's %d tokens, so %d token(s) of the completion " ..
        "are not learned (shown once)\n", i, n, math.min(n, #ids) - same))
    end
    if o.completion_only_loss then
      local m = {}
      for k = 1, #ids do m[k] = k > n and 1 or 0 end
      masks[#masks + 1] = m
    end
  else -- processed (TRL): its labels kept as given, else built from its masks (completion_mask where
    -- completion_only_loss, assistant_masks always), else input_ids; then truncated as any row
    ids = row.input_ids
    if row.labels and #row.labels ~= #ids then
      error(fmt("sft: row %d: %d labels for %d input_ids", i, #row.labels, #ids), 0)
    end
    if row.completion_mask and o.completion_only_loss then masks[#masks + 1] = row.completion_mask end
    if row.assistant_masks then masks[#masks + 1] = row.assistant_masks end
  end
  if o.assistant_only_loss and masks[1] then
    local any = false
    for _, b in ipairs(masks[1]) do any = any or b == 1 end
    if not any then
      error(fmt("sft: row %d has no assistant tokens with assistant_only_loss = true: the chat template needs " ..
        "{%% generation %%} ... {%% endgeneration %%} around the assistant's turns (pass chat_template_path = a " ..
        "template that has them)", i), 0)
    end
  end
  local labels = {}
  if kind == "processed" and row.labels then
    for k = 1, #ids do labels[k] = row.labels[k] end
  else
    for k, id in ipairs(ids) do
      local keep = true
      for _, m in ipairs(masks) do keep = keep and m[k] == 1 end
      labels[k] = keep and id or -100
    end
  end
  local L = not o.packing and o.max_length -- (packing cuts the joined rows instead)
  if L and #ids > L then -- truncation_mode: keep_start or keep_end
    local first = o.truncation_mode == "keep_end" and #ids - L + 1 or 1
    local ti, tl = {}, {}
    for k = first, first + L - 1 do ti[#ti + 1], tl[#tl + 1] = ids[k], labels[k] end
    ids, labels = ti, tl
  end
  return { input_ids = ids, labels = labels }
end

-- The template in chat_template_path: a .jinja (or .j2) file, as TRL takes it. Anything else TRL takes
-- for a tokenizer to clone (clone_chat_template: its template, added tokens and eos, the model's
-- embeddings resized), which zrun does not do: refused, pointing to the template file.
function M.read_template(p)
  local kind = require("zrun._C").path_type(p)
  if kind == "dir" or not (p:match("%.jinja$") or p:match("%.j2$")) then
    error(fmt("sft: chat_template_path %s is not a .jinja / .j2 file: TRL takes it for a tokenizer to clone (its " ..
      "template, its added tokens and eos, the model's embeddings resized), which zrun does not do; pass the template " ..
      "file alone (e.g. %s/chat_template.jinja)", p, kind == "dir" and p or "<tokenizer folder>"), 0)
  end
  local f = io.open(p, "rb")
  local src = f and f:read("*a")
  if f then f:close() end
  if not src then error(fmt("sft: chat_template_path %s: no such file", p), 0) end
  return src
end

-- assistant_only_loss's template, as SFTTrainer picks it: the template (chat_template_path's, else the
-- tokenizer's own) when it has {% generation %} blocks; else, where TRL 1.10 swaps in a training copy of it and
-- zrun knows the template (zrun.sft_templates: Qwen2.5's, Qwen3's, Qwen3-Instruct-2507's, Meta-Llama-3's,
-- Phi-3's, Phi-3.5's, Gemma 3's, recognised byte for byte), zrun's training copy, which renders as TRL's does and then
-- renders every row (its thinking blocks and masks); else refused, as TRL refuses a template it cannot patch
-- (Llama 3.1's and 3.2's among them).
function M.training_template(source, tok)
  local own = source == nil
  if own then
    local ok, t = pcall(function() return tok:get_chat_template() end)
    if not ok then return nil end -- (no template: the rows' own error says so)
    source = t
  end
  local ST = require "zrun.sft_templates"
  if ST.has_generation_markers(source) then return not own and source or nil end
  local patched = ST.training(source)
  if patched then return patched end
  error("sft: assistant_only_loss = true: the chat template has no {% generation %} blocks and is not one whose " ..
    "training copy TRL 1.10 swaps in that zrun makes (Qwen2.5's, Qwen3's, Qwen3-Instruct-2507's, Meta-Llama-3's, " ..
    "Phi-3's, Phi-3.5's, Gemma 3's, byte for byte); TRL raises \"not training-compatible\" for it (Llama 3.1's and 3.2's " ..
    "among them; or patches its Gemma 1 / 2, GLM, ... ones, models zrun does not load): pass chat_template_path = a template with " ..
    "{% generation %} ... {% endgeneration %} around the assistant's turns (trl/chat_templates/*_training.jinja are such)", 0)
end

-- SFTConfig's keys that shape the trainer, not the rows: SFTTrainer reads them, prepare refuses them.
local TRAINER_ONLY = { pad_token = "the collator's", pad_to_multiple_of = "the collator's", padding_free = "the collator's",
  dataset_kwargs = "SFTTrainer's", eval_packing = "SFTTrainer's" }

-- Options SFTTrainer hands prepare beside SFTConfig's: the template itself, completion_only_loss taken
-- from the training set (inherited), the seed of shuffle_dataset.
local PRIVATE = { chat_template = true, inherited = true, seed = true }

-- Checks SFTConfig-style options and fills their defaults. first: the dataset's first row.
function M.options(opts, tok, first)
  local o = {}
  for k, v in pairs(M.DEFAULTS) do o[k] = v end
  for k, v in pairs(opts or {}) do
    if M.DEFAULTS[k] == nil and not PRIVATE[k] then error(fmt("sft: unknown option '%s'", tostring(k)), 0) end
    if TRAINER_ONLY[k] and v ~= M.DEFAULTS[k] then
      error(fmt("sft: %s is %s (an SFTTrainer argument), not a row preparation option", k, TRAINER_ONLY[k]), 0)
    end
    o[k] = v
  end
  -- (the rows are the same for every loss: SFTTrainer hands loss_type to the model, prepare takes the plain one)
  if o.loss_type ~= nil and o.loss_type ~= false and M.LOSS_TYPES[o.loss_type] ~= "nll" and o.loss_type ~= "chunked_nll" then
    error(fmt("sft: loss_type %s is %s", tostring(o.loss_type), M.LOSS_TYPES[o.loss_type] and "SFTTrainer's (the " ..
      "model's loss), not a row preparation option: pass it in SFTTrainer's args" or "not one of \"nll\", " ..
      "\"chunked_nll\" or \"dft\""), 0)
  end
  o.loss_type = nil
  for k, why in pairs(M.REFUSED) do
    if o[k] ~= M.DEFAULTS[k] then error("sft: " .. why, 0) end
  end
  if o.max_length ~= false and (type(o.max_length) ~= "number" or o.max_length < 1 or o.max_length % 1 ~= 0) then
    error(fmt("sft: max_length must be a positive integer or false (no truncation), got %s", tostring(o.max_length)), 0)
  end
  o.packing_strategy = packing_strategy(o.packing_strategy)
  if o.packing and not M.PACKERS[o.packing_strategy] then
    error(fmt("sft: packing_strategy %s is not one of \"bfd\" (TRL's default: rows kept whole in blocks of max_length, " ..
      "cut there), \"bfd_split\" (longer rows split into pieces) or \"wrapped\"", tostring(o.packing_strategy)), 0)
  end
  if o.packing and not o.max_length then error("sft: packing = true needs max_length (the packed block's length)", 0) end
  local np = o.dataset_num_proc
  if np ~= false and (type(np) ~= "number" or np < 1 or np % 1 ~= 0) then
    error(fmt("sft: dataset_num_proc must be a positive integer, got %s", tostring(np)), 0)
  end
  if type(o.shuffle_dataset) ~= "boolean" then error("sft: shuffle_dataset must be true or false", 0) end
  if o.truncation_mode ~= "keep_start" and o.truncation_mode ~= "keep_end" then
    error(fmt("sft: truncation_mode must be \"keep_start\" or \"keep_end\", got %s", tostring(o.truncation_mode)), 0)
  end
  M.check_not_vision(first, "sft")
  local kind = M.row_type(first, o.dataset_text_field)
  -- "auto": rows with prompt and completion fields (tokenized ones too, whose completion_mask then counts),
  -- TRL's rule on the training set's first row, which SFTTrainer keeps for its evaluation sets (inherited)
  if o.completion_only_loss == "auto" then o.completion_only_loss = first.prompt ~= nil and first.completion ~= nil
  elseif type(o.completion_only_loss) ~= "boolean" then
    error("sft: completion_only_loss must be true, false or \"auto\" (true for prompt-completion rows)", 0)
  elseif o.completion_only_loss and kind ~= "prompt_completion" and kind ~= "processed" and not o.inherited then
    error(fmt("sft: completion_only_loss = true needs prompt + completion rows; this dataset's rows are %s " ..
      "(for chat rows use assistant_only_loss = true)", kind), 0)
  end
  if o.assistant_only_loss and kind ~= "messages" and kind ~= "conversations" and not (kind == "prompt_completion" and is_messages(first.prompt)) then
    error(fmt("sft: assistant_only_loss = true needs conversational rows (messages); this dataset's rows are %s", kind), 0)
  end
  -- options that would change nothing for these rows are refused, not ignored
  local chatty = kind == "messages" or kind == "conversations" or (kind == "prompt_completion" and is_messages(first.prompt))
  o.chatty = chatty
  if (o.chat_template or o.chat_template_path) and not chatty then
    error(fmt("sft: a chat template is used by conversational rows only; this dataset's rows are %s", kind), 0)
  end
  if o.dataset_text_field ~= M.DEFAULTS.dataset_text_field and kind ~= "text" then
    error(fmt("sft: dataset_text_field names the text of language-modeling rows; this dataset's rows are %s", kind), 0)
  end
  if o.packing_strategy ~= M.DEFAULTS.packing_strategy and not o.packing then
    error("sft: packing_strategy is read with packing = true only", 0)
  end
  if o.truncation_mode ~= M.DEFAULTS.truncation_mode and (not o.max_length or o.packing) then
    error("sft: truncation_mode is read when rows are truncated to max_length (without packing, which cuts blocks instead)", 0)
  end
  if o.chat_template_path then o.chat_template = M.read_template(o.chat_template_path) end
  if o.assistant_only_loss then o.chat_template = M.training_template(o.chat_template, tok) end
  -- an eos_token given: the token text / completions end with, and the template's eos_token (TRL sets the
  -- tokenizer's eos_token to it, which must be one token of its vocabulary)
  if o.eos_token ~= false then M.check_token(tok, "eos_token", o.eos_token) end
  o.template_eos = o.eos_token or nil
  if kind == "text" and o.dataset_text_field ~= "text" then
    require("zrun.dist").print0(fmt("[zrun] sft: no eos is appended to the rows' %s (TRL appends it to a field named " ..
      "text only; end the rows with it to learn where they stop)", o.dataset_text_field))
  end
  if o.eos_token == false then -- the tokenizer's eos token string
    local id = tok.eos_id and tok:eos_id()
    o.eos_token = id and id >= 0 and (tok.id_to_token and tok:id_to_token(id) or (id == 2 and "</s>")) or nil
  end
  return o, kind
end

M.PACK_BATCH = 1000 -- (datasets.map's default batch size)
-- n rows in TRL's contiguous dataset_num_proc shards (datasets' shard rule), each in batches of
-- M.PACK_BATCH rows as a batched datasets.map hands them: pack(first, last) per batch.
local function per_map_batch(n, num_proc, pack)
  local P = math.min(num_proc or 1, n)
  local div, mod = math.floor(n / P), n % P
  for s = 0, P - 1 do
    local first = div * s + math.min(s, mod) + 1
    local last = first + div + (s < mod and 1 or 0) - 1
    for b = first, last, M.PACK_BATCH do pack(b, math.min(b + M.PACK_BATCH - 1, last)) end
  end
end

-- TRL's "wrapped" packing: the rows' input_ids and labels joined end to end and cut into blocks of L
-- tokens, attention running across the rows' boundaries. As TRL runs it (a batched datasets.map), each
-- batch of 1000 rows is joined and cut on its own, its last block shorter; with num_proc (SFTConfig's
-- dataset_num_proc) the rows are first split into that many contiguous shards (datasets' shard rule),
-- each cut in its own batches (M.PACK_BATCH rows).
function M.pack_wrapped(rows, L, num_proc)
  local out = {}
  local function pack(first, last)
    local ids, labels = {}, {}
    for i = first, last do
      local r = rows[i]
      for k = 1, #r.input_ids do
        ids[#ids + 1], labels[#labels + 1] = r.input_ids[k], r.labels[k]
        if #ids == L then out[#out + 1], ids, labels = { input_ids = ids, labels = labels }, {}, {} end
      end
    end
    if #ids > 0 then out[#out + 1] = { input_ids = ids, labels = labels } end
  end
  per_map_batch(#rows, num_proc, pack)
  return out
end

-- TRL's "bfd" packing (Best Fit Decreasing, data_utils._pack_bfd), per map batch as pack_wrapped: rows
-- with no tokens dropped, each row cut to its first L tokens ("bfd") or split into pieces of L, the last
-- shorter ("bfd_split"); then, longest first (ties in row order), each goes into the open block with the
-- least room that fits it (of those, the one that reached that room first), else into a new block. A block
-- is its rows joined in the order they went in, with seq_lengths = their lengths: the padding-free
-- collator restarts position_ids there, and the model keeps each row's attention to itself.
function M.pack_bfd(rows, L, num_proc, split)
  local out = {}
  local function pack(first, last)
    local seqs = {}
    for i = first, last do
      local r = rows[i]
      local n = #r.input_ids
      local from = 1
      while from <= n do
        local len = math.min(L, n - from + 1)
        seqs[#seqs + 1] = { r = r, from = from, len = len, id = #seqs }
        from = from + len
        if not split then break end
      end
    end
    table.sort(seqs, function(a, b) if a.len ~= b.len then return a.len > b.len end return a.id < b.id end)
    -- spaces[s]: the open blocks with s tokens of room, first come first; room: the sorted list of
    -- the s < L that have one (a block of room L is always available: a new one)
    local spaces, room, blocks = {}, {}, {}
    local function find(len) -- the least room >= len (binary search over the sorted room list)
      local lo, hi = 1, #room
      while lo <= hi do
        local mid = math.floor((lo + hi) / 2)
        if room[mid] >= len then hi = mid - 1 else lo = mid + 1 end
      end
      return room[lo] or L, lo
    end
    for _, q in ipairs(seqs) do
      local space, at = find(q.len)
      local blk
      if space < L then
        local fifo = spaces[space]
        blk = table.remove(fifo, 1)
        if #fifo == 0 then table.remove(room, at) end
      else
        blk = { parts = {} }
        blocks[#blocks + 1] = blk
      end
      blk.parts[#blk.parts + 1] = q
      space = space - q.len
      if space > 0 then
        local fifo = spaces[space]
        if not fifo or #fifo == 0 then
          spaces[space] = { blk }
          local _, pos = find(space)
          table.insert(room, pos, space)
        else fifo[#fifo + 1] = blk end
      end
    end
    for _, blk in ipairs(blocks) do
      local ids, labels, lens = {}, {}, {}
      for k, q in ipairs(blk.parts) do
        for t = q.from, q.from + q.len - 1 do ids[#ids + 1], labels[#labels + 1] = q.r.input_ids[t], q.r.labels[t] end
        lens[k] = q.len
      end
      out[#out + 1] = { input_ids = ids, labels = labels, seq_lengths = lens }
    end
  end
  per_map_batch(#rows, num_proc, pack)
  return out
end

-- packing_strategy -> packer(rows, max_length, dataset_num_proc)
M.PACKERS = { wrapped = M.pack_wrapped, bfd = M.pack_bfd,
  bfd_split = function(rows, L, np) return M.pack_bfd(rows, L, np, true) end }

-- shuffle_dataset: the rows in TRL's order, dataset.shuffle(seed=args.seed) (numpy's default_rng(seed).permutation,
-- as Dataset:shuffle)
local function shuffled(rows, seed)
  local out = {}
  for i, k in ipairs(require("zrun._C").randperm_numpy(#rows, seed):flat_table()) do out[i] = rows[k] end
  return out
end

-- A row that the chat template or the tokenizer refuses: the error with the row it came from (the file's
-- row when ds says which file and where its rows start: ds.source, ds.row_offset, as recipes/sft_llama.lua sets).
local function raise_for_row(ds, i, err)
  err = tostring(err)
  if err:find("row %d") then error(err, 0) end -- (tokenize_row's own errors name it already)
  if err:find("this tokenizer has no chat template", 1, true) then -- (the fix is SFTConfig's option, not the API's)
    error("sft: the rows are conversational but the tokenizer has no chat template (no \"chat_template\" in its " ..
      "tokenizer_config.json and no chat_template.jinja): set chat_template_path to a .jinja file, or use a tokenizer " ..
      "that has one", 0)
  end
  -- (row_offset says the rows are the file's in order, from that row on: a sliced or filtered set is not)
  local where = ds.source and ds.row_offset and fmt("row %d of %s", i + ds.row_offset, ds.source) or fmt("row %d", i)
  error(fmt("sft: %s: %s", where, err:gsub("^sft: ", "")), 0)
end

-- TRL's dataset preparation: a Dataset of {input_ids, labels} from rows of any of the types above;
-- rows that truncation leaves with no label to learn are dropped (as TRL does).
function M.prepare(ds, tok, opts)
  local rows = ds.rows or ds
  if #rows == 0 then error("sft: the dataset is empty", 0) end
  local f = opts and opts.formatting_func
  if f ~= nil then
    if type(f) ~= "function" then error("sft: formatting_func must be a function(row) returning the row's text", 0) end
    local o2 = {}
    for k, v in pairs(opts) do if k ~= "formatting_func" then o2[k] = v end end
    opts = o2
  end
  local field = opts and opts.dataset_text_field or M.DEFAULTS.dataset_text_field
  if f ~= nil and rows[1].input_ids then -- (TRL: a warning, and the function is not called)
    require("zrun.dist").print0("[zrun] sft: formatting_func not used: the rows are already tokenized (input_ids)")
  elseif f ~= nil then -- TRL's formatting_func(row) -> text: a field "text" beside the row's own
    local col = opts and opts.completion_only_loss
    if col == nil or col == "auto" then col = rows[1].prompt ~= nil and rows[1].completion ~= nil end
    if col == true then
      error("sft: formatting_func turns the rows into plain text, which has no completion to learn alone: set " ..
        "completion_only_loss = false, or format the rows before (as TRL refuses the two together)", 0)
    end
    local texts = {}
    for i, r in ipairs(rows) do
      local t = f(r)
      if type(t) ~= "string" then error(fmt("sft: formatting_func returned %s for row %d, not a string", type(t), i), 0) end
      local c = {}
      for k, v in pairs(r) do c[k] = v end
      c.text, texts[i] = t, c
    end
    rows = texts
    -- rows of another type keep being read from their own fields, as TRL reads them: the text is then unused
    local kind = M.row_type(rows[1], field)
    if kind ~= "text" or field ~= "text" then
      require("zrun.dist").print0(fmt("[zrun] sft: formatting_func's text is not used: %s, which TRL reads from the " ..
        "rows' own fields (format them into a text field before, to train on the formatted text)", kind ~= "text" and
        ("these are " .. kind .. " rows") or ("dataset_text_field is " .. field)))
    end
  end
  local o, kind = M.options(opts, tok, rows[1])
  local out, warned, dropped = {}, {}, 0
  for i, row in ipairs(rows) do
    local k = M.row_type(row, o.dataset_text_field)
    if k ~= kind then error(fmt("sft: row %d is %s but the first row is %s: one dataset holds one type of row", i, k, kind), 0) end
    local ok, r = pcall(tokenize_row, row, i, kind, tok, o, warned)
    if not ok then raise_for_row(ds, i, r) end
    local any = false
    for _, l in ipairs(r.labels) do any = any or l ~= -100 end
    if any or not o.max_length or o.packing then out[#out + 1] = r else dropped = dropped + 1 end
  end
  if #out == 0 then error(fmt("sft: every row lost all its labels to truncation at max_length = %s", tostring(o.max_length)), 0) end
  local seed = o.seed or 42 -- (TrainingArguments' seed)
  if o.packing then -- (TRL shuffles before packing too, so that a block's rows are not neighbours)
    if o.shuffle_dataset then out = shuffled(out, seed) end
    out = M.PACKERS[o.packing_strategy](out, o.max_length, o.dataset_num_proc or nil)
  end
  if o.shuffle_dataset then out = shuffled(out, seed) end
  local res = require("zrun.datasets").Dataset.from_rows(out)
  res.sft = { kind = kind, dropped = dropped, options = o }
  return res
end

-- TRL's SFTConfig defaults where they differ from TrainingArguments' (bf16 = not fp16 besides), its
-- gradient_checkpointing = true included: each layer recomputed in backward, ~1.25x a step's time on the
-- chat rows of RESULTS.md session 27 for a fraction of the activations; gradient_checkpointing = false when
-- memory allows.
M.TRAINER_DEFAULTS = { learning_rate = 2e-5, logging_steps = 10, gradient_checkpointing = true }

-- Fills TRL's defaults into args where unset, except what a DeepSpeed config (args.deepspeed) fixes
-- itself: a numeric optimizer lr, or bf16 / fp16 sections with "enabled" true or false.
local function trl_defaults(args)
  local ds, fixed = args.deepspeed, {}
  if type(ds) == "string" then
    local text = require("zrun.checkpoint_store").read_all(ds)
    local ok, c = pcall(require("cjson").decode, text or "")
    ds = ok and c or nil -- (an unreadable file: the Trainer names the problem)
  end
  if type(ds) == "table" then
    local op = type(ds.optimizer) == "table" and type(ds.optimizer.params) == "table" and ds.optimizer.params or {}
    fixed.learning_rate = type(op.lr) == "number"
    for _, sec in ipairs { "bf16", "fp16" } do
      if type(ds[sec]) == "table" and type(ds[sec].enabled) == "boolean" then fixed.precision = true end
    end
  end
  for k, v in pairs(M.TRAINER_DEFAULTS) do if args[k] == nil and not fixed[k] then args[k] = v end end
  if args.bf16 == nil and not args.fp16 and not fixed.precision then args.bf16 = true end
end

-- Under skip_prepare_dataset the rows go to the collator as given, and it reads labels (else input_ids):
-- a row with completion_mask or assistant_masks but no labels would be trained on every token.
local function no_masks_without_labels(name, ds)
  for i, row in ipairs(ds and ds.rows or ds or {}) do
    if row.labels == nil and (row.completion_mask ~= nil or row.assistant_masks ~= nil) then
      error(fmt("SFTTrainer: %s row %d has %s but no labels, and dataset_kwargs.skip_prepare_dataset skips building " ..
        "labels from it, so it would train on every token; add labels (-100 on the tokens not learned) or drop " ..
        "skip_prepare_dataset", name, i, row.completion_mask ~= nil and "completion_mask" or "assistant_masks"), 0)
    end
  end
end

-- TRL's peft_config: get_peft_model on the model before the Trainer sees it (TRL refuses a model that
-- already has an adapter, and a config that is not a PEFT config).
local function apply_peft(model, cfg)
  local peft = require "zrun.peft"
  if not peft.is_config(cfg) then
    error(fmt("SFTTrainer: peft_config must be a zr.peft.LoraConfig{...} (PEFT's LoraConfig), got %s", type(cfg)), 3)
  end
  if type(model) ~= "table" then error("SFTTrainer: peft_config needs a model (a zrun causal LM) to adapt", 3) end
  if peft.is_peft_model(model) then
    error("SFTTrainer: the model already has a LoRA adapter and a peft_config was passed too (TRL refuses it too): " ..
      "merge_and_unload the adapter, then pass that model with the new peft_config", 3)
  end
  peft.get_peft_model(model, cfg)
end

-- TRL's SFTTrainer: zr.Trainer on datasets prepared by M.prepare. opts as zr.Trainer's; args takes
-- TRL's defaults (learning_rate 2e-5, logging_steps 10, bf16 unless fp16, gradient_checkpointing) and
-- SFTConfig's own keys (max_length, completion_only_loss, assistant_only_loss, dataset_text_field,
-- truncation_mode, eos_token, pad_token, chat_template_path, pad_to_multiple_of, packing, packing_strategy
-- (bfd, bfd_split, wrapped), padding_free, dataset_kwargs = {skip_prepare_dataset = true}, eval_packing,
-- shuffle_dataset, dataset_num_proc, formatting_func as opts.formatting_func) beside the Trainer's;
-- M.NO_EFFECT's are said and dropped. With padding_free, or packing "bfd" / "bfd_split" (as TRL), the
-- collator joins a micro-batch into one row, position_ids telling its sequences apart (the model attends
-- within each). trainer:evaluate(rows) prepares rows given to it as the eval sets were. opts.peft_config
-- (TRL's): a zr.peft.LoraConfig applied to the model first (zr.peft.get_peft_model); only the adapter trains
-- and save_model writes it (adapter_model.safetensors, adapter_config.json).
function M.SFTTrainer(opts)
  if type(opts) ~= "table" then error("SFTTrainer{...}: pass a table (model, train_dataset, processing_class, args)", 2) end
  local train = opts.train_dataset -- (TRL: before anything else is read, skip_prepare_dataset included)
  M.check_not_vision(type(train) == "table" and (train.rows or train)[1], "SFTTrainer")
  local args, sargs = {}, {}
  local targs = require "zrun.trainer_args"
  for k, v in pairs(opts.args or {}) do
    if k == "packing_strategy" then v = packing_strategy(v) end
    if M.RENAMED[k] then error(fmt("SFTTrainer: '%s' was renamed '%s' in TRL; use %s", k, M.RENAMED[k], M.RENAMED[k]), 2) end
    if M.DEFAULTS[k] == nil and not M.NO_EFFECT[k] and targs.DEFAULTS[k] == nil and not targs.NO_EFFECT[k]
      and not targs.RENAMED[k] and not targs.REPLACED[k] then -- (neither SFTConfig's nor TrainingArguments')
      local names = {}
      for n in pairs(M.DEFAULTS) do names[#names + 1] = n end
      for n in pairs(targs.DEFAULTS) do names[#names + 1] = n end
      local sug = type(k) == "string" and require("zrun.config").suggest(k, names)
      error(fmt("SFTTrainer: '%s' is neither an SFTConfig nor a TrainingArguments key zrun implements%s", tostring(k),
        sug and fmt(" (did you mean '%s'?)", sug) or ""), 2)
    end
    if M.NO_EFFECT[k] then
      require("zrun.dist").print0(fmt("[zrun] SFTTrainer: %s has no effect (%s)", k, M.NO_EFFECT[k]))
    elseif M.DEFAULTS[k] ~= nil then sargs[k] = v else args[k] = v end
  end
  if sargs.eval_packing ~= nil and sargs.eval_packing ~= "auto" and type(sargs.eval_packing) ~= "boolean" then
    error(fmt("SFTTrainer: eval_packing must be true, false or \"auto\" (as packing), got %s", tostring(sargs.eval_packing)), 2)
  end
  trl_defaults(args)
  -- loss_type (TRL's): the model's forward takes it (zrun's Llama and GPT-2); "dft" replaces the label smoother
  -- (unset: TRL's default, chunked_nll, or nll with use_liger_kernel, whose fused linear cross-entropy is the same)
  local liger = args.use_liger_kernel
  local unset = sargs.loss_type == nil or sargs.loss_type == false
  local loss_type = unset and (liger and "nll" or "chunked_nll") or M.LOSS_TYPES[sargs.loss_type]
  if not loss_type then
    error(fmt("SFTTrainer: loss_type %s is not one of \"nll\", \"chunked_nll\" (TRL's default: the same loss " ..
      "without the full logits) or \"dft\" (each token's loss weighted by its probability)", type(sargs.loss_type) ==
      "string" and ("\"" .. sargs.loss_type .. "\"") or tostring(sargs.loss_type)), 2)
  end
  if loss_type == "chunked_nll" and liger then
    error("SFTTrainer: loss_type \"chunked_nll\" is not compatible with use_liger_kernel = true (TRL refuses it " ..
      "too; Liger's fused linear cross-entropy is the same loss): leave loss_type unset or set \"nll\"", 2)
  end
  sargs.loss_type = nil
  if loss_type == "dft" then
    local m = opts.model
    if m and not (m.supports_loss_type and m.supports_loss_type.dft) then
      error("SFTTrainer: loss_type \"dft\" needs a model whose forward takes {loss_type = \"dft\"} (zrun's Llama and " ..
        "GPT-2 do; this model does not declare supports_loss_type.dft)", 2)
    end
    if (args.label_smoothing_factor or 0) ~= 0 then -- (TRL's compute_loss_func comes before the label smoother)
      require("zrun.dist").print0(fmt("[zrun] SFTTrainer: label_smoothing_factor = %g has no effect with loss_type = " ..
        "\"dft\" (TRL's dft loss replaces the label smoother)", args.label_smoothing_factor))
      args.label_smoothing_factor = 0
    end
  end
  local dk = sargs.dataset_kwargs
  if dk and (type(dk) ~= "table" or next(dk) == nil or (next(dk) ~= "skip_prepare_dataset" or next(dk, "skip_prepare_dataset"))) then
    error("SFTTrainer: dataset_kwargs takes {skip_prepare_dataset = true} only (rows already {input_ids, labels})", 2)
  end
  local skip = dk and dk.skip_prepare_dataset
  if skip then -- (TRL takes the rows as given too: the preparation options do nothing then; say so)
    for k, why in pairs(M.REFUSED) do -- (refused whatever the rows: they are the batches' and the loss's)
      if sargs[k] ~= nil and sargs[k] ~= M.DEFAULTS[k] then error("SFTTrainer: " .. why, 2) end
    end
    local PREP = { max_length = true, completion_only_loss = true, assistant_only_loss = true, dataset_text_field = true,
      truncation_mode = true, packing = true, packing_strategy = true, eval_packing = true, shuffle_dataset = true,
      dataset_num_proc = true }
    local names = {}
    for k, v in pairs(sargs) do if PREP[k] and v ~= M.DEFAULTS[k] then names[#names + 1] = k end end
    table.sort(names)
    for _, k in ipairs(names) do
      require("zrun.dist").print0(fmt("[zrun] SFTTrainer: %s not used: dataset_kwargs.skip_prepare_dataset takes the rows " ..
        "as given", k))
    end
  end
  sargs.dataset_kwargs = nil
  if sargs.dataset_num_proc and not skip and not sargs.packing and sargs.eval_packing ~= true then
    -- (a speed knob in TRL that changes only where wrapped packing cuts its blocks: say so rather than ignore it)
    require("zrun.dist").print0("[zrun] SFTTrainer: dataset_num_proc has no effect without packing: rows are prepared " ..
      "in-process (with packing it decides where wrapped packing cuts its blocks, as in TRL)")
  end
  local multiple, pad_token = sargs.pad_to_multiple_of, sargs.pad_token
  sargs.pad_to_multiple_of, sargs.pad_token = nil, nil
  if opts.data_collator and (multiple or pad_token) then
    error("SFTTrainer: pad_token and pad_to_multiple_of shape the default collator; with data_collator given, set them there", 2)
  end
  -- padding-free batches (TRL): asked for, or what bfd packing needs (its blocks' rows told apart by position_ids);
  -- also when only the evaluation rows are bfd-packed (eval_packing = true): TRL then pads them and their rows
  -- attend to each other; zrun keeps them apart (the training rows, unpacked, train the same either way)
  local pstrat = sargs.packing_strategy or M.DEFAULTS.packing_strategy
  local asked = sargs.padding_free == true
  local padding_free = asked or ((sargs.packing == true or sargs.eval_packing == true) and pstrat ~= "wrapped")
  if sargs.padding_free ~= nil and type(sargs.padding_free) ~= "boolean" then
    error("SFTTrainer: padding_free must be true or false", 2)
  end
  sargs.padding_free = nil
  if padding_free then
    if opts.data_collator then
      error("SFTTrainer: a data_collator of your own cannot be padding-free (padding_free = true, or rows packed with " ..
        "packing_strategy \"" .. pstrat .. "\", which needs it); TRL refuses it too: drop the collator, or pack \"wrapped\"", 2)
    end
    if sargs.packing and pstrat == "wrapped" then
      require("zrun.dist").print0("[zrun] SFTTrainer: padding_free = true with wrapped packing is not recommended (TRL " ..
        "says so too): a wrapped block's rows are cut anywhere, so each block is one sequence and nothing changes")
    end
    if asked and not sargs.packing and sargs.max_length ~= false and not skip then
      error("SFTTrainer: padding_free = true without packing does not enforce max_length (TRL refuses it too): pack " ..
        "(packing = true, packing_strategy = \"bfd\"), or set max_length = false with rows already short enough", 2)
    end
    if asked and not sargs.packing and (args.per_device_train_batch_size or 8) == 1 then
      require("zrun.dist").print0("[zrun] SFTTrainer: padding_free = true with per_device_train_batch_size 1 joins " ..
        "nothing (one row a batch): use 2 or more")
    end
  end
  local tok = opts.processing_class or opts.tokenizer
  if sargs.chat_template_path and tok then -- (TRL: the tokenizer's template from then on; save_model writes it)
    tok:set_chat_template(M.read_template(sargs.chat_template_path))
    sargs.chat_template_path = nil
  end
  -- eos_token (TRL: the tokenizer's eos from then on, in the collator's pad fallback and the saved files)
  local eos_token = sargs.eos_token
  if eos_token and eos_token ~= false and tok then
    M.check_token(tok, "eos_token", eos_token)
    require("zrun.tokenizers").set_special_tokens(tok, { eos_token = eos_token })
  end
  -- completion_only_loss "auto" is decided once, from the training set's first row, for every set (TRL)
  local col = sargs.completion_only_loss
  local first = opts.train_dataset and (opts.train_dataset.rows or opts.train_dataset)[1]
  if (col == nil or col == "auto") and type(first) == "table" then col = first.prompt ~= nil and first.completion ~= nil end
  local function prep(ds, eval)
    if not ds or skip then return ds end
    if not tok then error("SFTTrainer: processing_class (the tokenizer) is required to prepare the datasets", 2) end
    local o = { formatting_func = opts.formatting_func, seed = args.seed }
    for k, v in pairs(sargs) do o[k] = v end
    if eval and type(col) == "boolean" then o.completion_only_loss, o.inherited = col, true end
    local ep = sargs.eval_packing
    o.eval_packing = nil
    if eval and ep ~= nil and ep ~= "auto" then o.packing = ep end -- (TRL: eval_packing, else packing)
    -- packing_strategy is read by whichever of the two packs
    if not o.packing and (sargs.packing or ep == true) then o.packing_strategy = nil end
    return M.prepare(ds, tok, o)
  end
  local t = {}
  for k, v in pairs(opts) do t[k] = v end
  t.formatting_func, t.peft_config = nil, nil
  if opts.peft_config ~= nil then apply_peft(opts.model, opts.peft_config) end
  local ev = opts.eval_dataset
  local named = require("zrun.datasets").is_named
  if named(ev) then -- named eval datasets, each prepared
    local prepared = {}
    for name, d in pairs(ev) do prepared[name] = prep(d, true) end
    ev = prepared
  else ev = prep(ev, true) end
  t.args, t.train_dataset, t.eval_dataset = args, prep(opts.train_dataset), ev
  if not t.data_collator and not tok and (multiple or pad_token) then
    error("SFTTrainer: pad_token and pad_to_multiple_of shape the default collator, which needs processing_class (the " ..
      "tokenizer); pass it, or a data_collator of your own", 2)
  end
  if not t.data_collator and tok then
    -- TRL's pad token: pad_token, else the tokenizer's, else its eos (the rows' own labels keep a real eos
    -- learned); on a GPU rows are padded to a multiple of 64 tokens as the Trainer's default collator does
    local pad = pad_token and tok:token_to_id(pad_token)
    if pad_token and not pad then error(fmt("SFTTrainer: pad_token '%s' is not in the tokenizer's vocabulary", pad_token), 2) end
    pad = pad or tok:pad_id() or (eos_token and tok:token_to_id(eos_token)) or tok:eos_id()
    if pad ~= tok:pad_id() then -- (TRL sets the tokenizer's pad token: the saved tokenizer has it)
      require("zrun.tokenizers").set_special_tokens(tok, { pad_token = tok:id_to_token(pad) })
    end
    local p1 = opts.model and opts.model.parameters and opts.model:parameters()[1]
    -- (not padding-free: its padding, position 0 each, would be as many one-token sequences as pads)
    local auto = not multiple and p1 and p1:device() ~= "cpu" and not padding_free
    if auto then multiple = 64 end
    -- (TRL's collator: labels are the row's, else its input_ids; only the padding is -100, so a token equal to
    -- the pad, an eos that pads, is still learned)
    t.data_collator = require("zrun.datasets").causal_lm_collator { pad_token_id = pad, pad_to_multiple_of = multiple or nil,
      mask_pad_token = false, padding_free = padding_free or nil }
    -- (zrun's own rounding is not counted in num_input_tokens_seen / total_flos: TRL pads to the longest row)
    if auto then t.data_collator = require("zrun.trainer").counted_unrounded(t.data_collator) end
  end
  local trainer = require("zrun.trainer")(t)
  -- (the model's forward options, training and evaluation: loss_type "dft"; chunked_nll's chunked_loss where the
  -- model takes it, else the same loss with the logits, said)
  if loss_type == "dft" then trainer.loss_type = loss_type end
  if loss_type == "chunked_nll" then
    local m = trainer.model
    if require("zrun.models.llama").adapted_head(type(m) == "table" and m.lm_head or nil) then
      if not unset then
        error("SFTTrainer: loss_type \"chunked_nll\" is not supported when lm_head has a LoRA adapter (TRL refuses " ..
          "it too): leave lm_head out of target_modules, or set loss_type \"nll\"", 2)
      end
      require("zrun.dist").print0("[zrun] SFTTrainer: the loss runs with the full logits (loss_type \"nll\"; TRL's " ..
        "default chunked_nll refuses a LoRA adapter on lm_head)")
    elseif m.supports_chunked_loss then trainer.chunked_loss = true
    elseif not unset then
      require("zrun.dist").print0("[zrun] SFTTrainer: loss_type \"chunked_nll\" runs as \"nll\" (the same loss, " ..
        "with the full logits): this model's forward has no chunked_loss (zrun's Llama family and GPT-2 have)")
    end
  end
  trainer.packed_batches = padding_free or nil -- (auto_find_batch_size's memory plan: packed sequences' attention)
  trainer.token_accuracy = true -- (TRL's eval_mean_token_accuracy)
  trainer.log_num_tokens = true -- (TRL's num_tokens in the training logs, eval_num_tokens beside the evaluation's)
  if not skip then -- evaluate(rows) prepares rows given to it as the eval sets were (TRL); prepared sets pass
    local evaluate = trainer.evaluate
    trainer.evaluate = function(self, ds, ...)
      if type(ds) == "table" and not ds.sft then
        if named(ds) then
          local prepared = {}
          for name, d in pairs(ds) do prepared[name] = d.sft and d or prep(d, true) end
          ds = prepared
        else ds = prep(ds, true) end
      end
      return evaluate(self, ds, ...)
    end
  end
  if skip and not opts.data_collator then -- (the default collator reads labels only: masks without them would
    -- train on every token; TRL refuses such rows too, at init and in evaluate)
    no_masks_without_labels("train", t.train_dataset)
    if named(t.eval_dataset) then
      for name, d in pairs(t.eval_dataset) do no_masks_without_labels("eval " .. tostring(name), d) end
    else no_masks_without_labels("eval", t.eval_dataset) end
    local evaluate = trainer.evaluate
    trainer.evaluate = function(self, ds, ...)
      no_masks_without_labels("eval", ds)
      return evaluate(self, ds, ...)
    end
  end
  return trainer
end

return M
