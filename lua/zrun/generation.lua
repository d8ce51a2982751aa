-- Text generation: transformers' model.generate(...) for zrun's causal LMs (zr.models.llama's Llama,
-- Mistral and Qwen2 classes, zr.models.gpt2), greedy or sampled, a LoRA model (zr.peft) as it stands.
--   local out = model:generate(input_ids, { max_new_tokens = 64, do_sample = true, top_p = 0.9 })
--   print(tok:decode(out:tolist()[1], true))
-- The models compute one step through generation_step(ids, cache): the new tokens' forward, their keys
-- and values appended to the cache per layer, and their attention over every cached key, composed of
-- matmul and softmax (zr.scaled_dot_product_attention takes equal query and key lengths and no padding
-- mask). The logits processors run on the host over each row's scores (one (B, V) copy a step), in
-- transformers' order: repetition penalty, then (sampling) temperature, top-k, top-p.
local zr = require "zrun"
local kwargs = require "zrun.kwargs"

local M = {}
local NEG_INF = -math.huge
local huge = math.huge

-- A copy of the array a (unpack stops at LuaJIT's limit of a few thousand values: a vocabulary is more).
local function copy(a)
  local out = {}
  for i = 1, #a do out[i] = a[i] end
  return out
end
-- what a masked score becomes: torch.finfo(float32).min, as transformers' masks
local MASKED = -3.4028234663852886e38

-- Logits processors ------------------------------------------------------------------------------
-- Each takes scores, a Lua array over the vocabulary (scores[id + 1]), and returns a new one, as
-- transformers' LogitsProcessor of the same name does for one row; a filtered entry is -math.huge.

-- RepetitionPenaltyLogitsProcessor: the score of every id in ids (the row so far, prompt and padding
-- included, as transformers' input_ids) divided by penalty where positive, multiplied where negative.
function M.repetition_penalty(scores, ids, penalty)
  local out, seen = copy(scores), {}
  for _, id in ipairs(ids) do
    if not seen[id] then
      seen[id] = true
      local s = scores[id + 1]
      if s then out[id + 1] = s < 0 and s * penalty or s / penalty end
    end
  end
  return out
end

-- TemperatureLogitsWarper: scores / temperature.
function M.temperature(scores, t)
  local out = {}
  for i = 1, #scores do out[i] = scores[i] / t end
  return out
end

-- TopKLogitsWarper: scores below the k-th largest filtered (ties with it kept); k at least min_keep
-- (default 1), at most the vocabulary.
function M.top_k(scores, k, min_keep)
  k = math.min(math.max(k, min_keep or 1), #scores)
  local sorted = copy(scores)
  table.sort(sorted, function(a, b) return a > b end)
  local kth, out = sorted[k], {}
  for i = 1, #scores do out[i] = scores[i] < kth and NEG_INF or scores[i] end
  return out
end

-- The ids of scores in ascending order of score (ties by id), and the softmax of the sorted scores.
local function sorted_probs(scores)
  local order = {}
  for i = 1, #scores do order[i] = i end
  table.sort(order, function(a, b)
    if scores[a] ~= scores[b] then return scores[a] < scores[b] end
    return a < b
  end)
  local top, p, sum = scores[order[#order]], {}, 0
  for j, i in ipairs(order) do
    local e = scores[i] == NEG_INF and 0 or math.exp(scores[i] - top)
    p[j], sum = e, sum + e
  end
  for j = 1, #p do p[j] = p[j] / sum end
  return order, p
end

-- TopPLogitsWarper: keeps the smallest set of highest-probability ids whose probabilities sum to at
-- least p (over the ascending sort, ids whose cumulative probability is <= 1 - p are filtered), and
-- at least min_keep (default 1) of them.
function M.top_p(scores, p, min_keep)
  local order, probs = sorted_probs(scores)
  local out, cum, n = copy(scores), 0, #order
  for j = 1, n - (min_keep or 1) do
    cum = cum + probs[j]
    if cum <= 1 - p then out[order[j]] = NEG_INF end
  end
  return out
end

-- Token selection ---------------------------------------------------------------------------------

-- The id (0-based) of the largest score, the first of equal ones (torch.argmax's).
function M.argmax(scores)
  local best, at = -huge, 1
  for i = 1, #scores do
    if scores[i] > best then best, at = scores[i], i end
  end
  return at - 1
end

-- An id (0-based) drawn from softmax(scores) (torch.multinomial(probs, 1)'s distribution), with u
-- uniform in [0, 1) from zrun's generator (zr.manual_seed makes it reproducible).
function M.sample(scores, u)
  local top = -huge
  for i = 1, #scores do if scores[i] > top then top = scores[i] end end
  local w, sum = {}, 0
  for i = 1, #scores do
    local e = scores[i] == NEG_INF and 0 or math.exp(scores[i] - top)
    w[i], sum = e, sum + e
  end
  local target, acc, last = u * sum, 0, 1
  for i = 1, #w do
    if w[i] > 0 then
      acc, last = acc + w[i], i
      if acc > target then return i - 1 end
    end
  end
  return last - 1 -- (rounding: the last id with any weight)
end

-- Settings ----------------------------------------------------------------------------------------

M.OPTIONS = { "max_new_tokens", "max_length", "do_sample", "temperature", "top_k", "top_p", "repetition_penalty",
  "eos_token_id", "pad_token_id", "attention_mask", "use_cache", "generation_config" }
-- the sampling options: refused with do_sample false (transformers warns and ignores them)
local SAMPLING = { "temperature", "top_k", "top_p" }
-- transformers' defaults (GenerationConfig._get_default_generation_params) for what zrun implements
local DEFAULTS = { max_length = 20, do_sample = false, temperature = 1.0, top_k = 50, top_p = 1.0,
  repetition_penalty = 1.0, use_cache = true }
-- generation_config.json fields that change nothing here at these values (transformers' defaults), or
-- at any value (true: metadata, or what the model config gives too)
local NEUTRAL = { transformers_version = true, _from_model_config = true, bos_token_id = true,
  decoder_start_token_id = true, min_length = 0, num_beams = 1, num_return_sequences = 1, num_beam_groups = 1,
  early_stopping = false, typical_p = 1.0, length_penalty = 1.0, no_repeat_ngram_size = 0,
  encoder_no_repeat_ngram_size = 0, encoder_repetition_penalty = 1.0, epsilon_cutoff = 0.0, eta_cutoff = 0.0,
  diversity_penalty = 0.0, remove_invalid_values = false, renormalize_logits = false, output_scores = false,
  output_logits = false, output_attentions = false, output_hidden_states = false, return_dict_in_generate = false,
  cache_implementation = true, num_assistant_tokens = true, num_assistant_tokens_schedule = true,
  assistant_confidence_threshold = true, assistant_lookbehind = true, target_lookbehind = true }

local function is_null(v) return v == nil or v == require("cjson").null end

-- The model's generation_config (what from_pretrained read from generation_config.json) checked: a field
-- zrun does not implement, at a value that would change transformers' output, is refused.
local function model_settings(model, given)
  local g = given
  if g == nil then g = rawget(model, "generation_config") end
  if not g then return {} end
  local out = {}
  for k, v in pairs(g) do
    if not is_null(v) then
      local n = NEUTRAL[k]
      if DEFAULTS[k] ~= nil or k == "max_new_tokens" or k == "eos_token_id" or k == "pad_token_id" then
        out[k] = v
      elseif n == nil or (n ~= true and n ~= v) then
        error(("generate: the model's generation_config has %s = %s, which zrun's generate does not implement; pass " ..
          "generation_config = {} (or a table without it) to generate without it"):format(k, tostring(v)), 0)
      end
    end
  end
  return out
end

-- A token id list from a number, a list, or nil / false (none).
local function id_list(v, what)
  if v == nil or v == false or is_null(v) then return nil end
  if type(v) == "number" then v = { v } end
  if type(v) ~= "table" then error(("generate: %s must be a token id or a list of them, got %s"):format(what, type(v)), 0) end
  local out = {}
  for i, id in ipairs(v) do
    if type(id) ~= "number" or id < 0 or id % 1 ~= 0 then
      error(("generate: %s[%d] must be a non-negative integer, got %s"):format(what, i, tostring(id)), 0)
    end
    out[i] = id
  end
  return #out > 0 and out or nil
end

-- The settings of one generate call: opts over the model's generation_config over transformers'
-- defaults; eos and pad ids default to the model config's (pad: else the first eos id, as transformers).
function M.settings(model, opts)
  kwargs.check("generate", opts, M.OPTIONS)
  local gc = opts.generation_config
  if gc ~= nil and gc ~= false and type(gc) ~= "table" then
    error("generate: generation_config must be a table (generation_config.json's fields) or false (none)", 0)
  end
  local s = {}
  for k, v in pairs(DEFAULTS) do s[k] = v end
  local from_model = model_settings(model, gc == false and {} or gc)
  for k, v in pairs(from_model) do s[k] = v end
  -- (transformers' has_default_max_length: neither the call nor the generation config set max_length)
  s.max_length_given = opts.max_length ~= nil or from_model.max_length ~= nil
  for _, k in ipairs(M.OPTIONS) do if opts[k] ~= nil and k ~= "generation_config" then s[k] = opts[k] end end
  if opts.max_new_tokens ~= nil and opts.max_length ~= nil then
    error("generate: give max_new_tokens or max_length, not both (transformers takes max_new_tokens and warns)", 0)
  end
  if opts.max_length ~= nil then s.max_new_tokens = nil end -- (the user's total length over the config's new tokens)
  if not s.do_sample then
    for _, k in ipairs(SAMPLING) do
      if opts[k] ~= nil then
        error(("generate: %s applies to sampling only; pass do_sample = true with it (greedy ignores it)"):format(k), 0)
      end
    end
  end
  local cfg = model.config
  s.eos = id_list(s.eos_token_id == nil and cfg.eos_token_id or s.eos_token_id, "eos_token_id")
  local pad = s.pad_token_id
  if pad == nil or is_null(pad) then pad = cfg.pad_token_id end
  if is_null(pad) or pad == false then pad = nil end
  s.pad = pad or (s.eos and s.eos[1])
  M.check_numbers(s)
  return s
end

-- The numeric settings in range (transformers' own checks, as one line each).
function M.check_numbers(s)
  local function int(k, lo)
    local v = s[k]
    if v ~= nil and (type(v) ~= "number" or v % 1 ~= 0 or v < lo) then
      error(("generate: %s must be an integer >= %d, got %s"):format(k, lo, tostring(v)), 0)
    end
  end
  int("max_new_tokens", 1)
  int("max_length", 1)
  int("top_k", 0)
  if type(s.temperature) ~= "number" or s.temperature <= 0 then
    error(("generate: temperature must be > 0, got %s (for greedy decoding pass do_sample = false)"):format(tostring(s.temperature)), 0)
  end
  if type(s.top_p) ~= "number" or s.top_p <= 0 or s.top_p > 1 then
    error(("generate: top_p must be in (0, 1], got %s"):format(tostring(s.top_p)), 0)
  end
  if type(s.repetition_penalty) ~= "number" or s.repetition_penalty <= 0 then
    error(("generate: repetition_penalty must be > 0, got %s"):format(tostring(s.repetition_penalty)), 0)
  end
  if s.pad ~= nil and (type(s.pad) ~= "number" or s.pad < 0 or s.pad % 1 ~= 0) then
    error(("generate: pad_token_id must be a non-negative integer, got %s"):format(tostring(s.pad)), 0)
  end
end

-- Inputs ------------------------------------------------------------------------------------------

-- Rows of ids (Lua arrays) from a (B, T) or (T) tensor, an array of ids or an array of arrays.
local function rows_of(x, what)
  if zr.is_tensor(x) then
    if x:dim() == 1 then x = x:view(1, x:size(1)) end
    if x:dim() ~= 2 then error(("generate: %s must be (batch, length), got %d dimensions"):format(what, x:dim()), 0) end
    return x:to("cpu", "f64"):tolist()
  end
  if type(x) ~= "table" or #x == 0 then error(("generate: %s must be a tensor or a non-empty list of ids"):format(what), 0) end
  if type(x[1]) == "number" then x = { x } end
  local rows = {} -- (copies: generate appends to them)
  for b, r in ipairs(x) do
    if type(r) ~= "table" then error(("generate: %s row %d is not a list of ids"):format(what, b), 0) end
    rows[b] = copy(r)
  end
  return rows
end

-- The prompt rows and their attention mask rows (all ones when none is given), checked: equal
-- lengths, 0/1 masks, padding on the left only, at least one token a row.
function M.prompts(input_ids, attention_mask)
  local ids = rows_of(input_ids, "input_ids")
  local T = #ids[1]
  local mask = attention_mask ~= nil and rows_of(attention_mask, "attention_mask") or nil
  if mask and #mask ~= #ids then
    error(("generate: attention_mask has %d rows, input_ids %d"):format(#mask, #ids), 0)
  end
  local masks = {}
  for b, row in ipairs(ids) do
    if #row ~= T then error(("generate: input_ids row %d has %d ids, row 1 %d (pad them, with an attention_mask)"):format(b, #row, T), 0) end
    if T == 0 then error("generate: input_ids has no tokens", 0) end
    local given, m, seen = mask and mask[b], {}, false
    if given and #given ~= T then error(("generate: attention_mask row %d has %d entries, input_ids %d"):format(b, #given, T), 0) end
    for t = 1, T do
      local v = given and given[t] or 1
      if v ~= 0 and v ~= 1 then error(("generate: attention_mask[%d][%d] is %s, not 0 or 1"):format(b, t, tostring(v)), 0) end
      if v == 1 then seen = true
      elseif seen then
        error(("generate: attention_mask row %d has padding on the right; generate takes left-padded prompts " ..
          "(the tokenizer's padding_side = \"left\"), as transformers does"):format(b), 0)
      end
      m[t] = v
    end
    if not seen then error(("generate: attention_mask row %d masks every token"):format(b), 0) end
    masks[b] = m
  end
  return ids, masks
end

-- The cache ---------------------------------------------------------------------------------------
-- Per layer the keys and values so far, (B, heads, L, D), and for the step being computed: the new
-- tokens' positions (B, Tq) (per row: the count of real tokens before them, transformers' cumsum of the
-- attention mask), and the masks of their attention over the L keys.
local Cache = {}
Cache.__index = Cache

-- A new cache for rows on device whose attention mask rows are masks (Lua arrays of 0/1, extended by
-- generate as tokens are added).
function M.new_cache(device, masks)
  return setmetatable({ device = device, layers = {}, keymask = masks, len = 0, masks = {} }, Cache)
end

-- Prepares the step of the Tq tokens at pos (rows of positions, Lua arrays): their positions as a
-- tensor, the key count after them. The key mask rows (keymask) already hold the new tokens' entries.
function Cache:begin(pos)
  local Tq = #pos[1]
  self.pos_rows, self.Tq = pos, Tq
  self.len = self.len + Tq
  self.positions = zr.tensor(pos, { dtype = "i64" }):to(self.device)
  self.masks = {}
  local first, same = pos[1], true
  for b = 2, #pos do
    for t = 1, Tq do if pos[b][t] ~= first[t] then same = false end end
  end
  self.same_positions = same
  local top = 0
  for _, row in ipairs(pos) do for _, p in ipairs(row) do if p > top then top = p end end end
  self.max_position = top
end

-- The (B, 1, Tq, L) u8 mask of this step's attention, 1 where masked: keys the attention mask zeroes,
-- keys after the query (causal, aligned bottom-right: query t of Tq sits at column L - Tq + t) and,
-- with window, keys window or more columns before it (transformers' sliding_window_overlay). A query
-- always sees its own key: a left pad's (whose output no real token reads) would else have none.
function Cache:mask(window)
  local key = window or 0
  local m = self.masks[key]
  if m then return m end
  local L, Tq, rows = self.len, self.Tq, {}
  for b, km in ipairs(self.keymask) do
    local plane = {}
    for t = 1, Tq do
      local col, r = L - Tq + t, {}
      for j = 1, L do
        -- (a left pad's query sees itself: no row masked whole, whose softmax would be NaN)
        r[j] = (j ~= col and (km[j] == 0 or j > col or (window and col - j >= window))) and 1 or 0
      end
      plane[t] = r
    end
    rows[b] = { plane }
  end
  m = zr.tensor(rows, { dtype = "u8" }):to(self.device)
  self.masks[key] = m
  return m
end

-- zr.rope of x (B, heads, Tq, D) at this step's positions: cos, sin tables (P, D) cover them.
function Cache:rope(x, cos, sin)
  local function at(b)
    local p = self.positions:narrow(1, b, 1):view(self.Tq)
    return zr.embedding(cos, p), zr.embedding(sin, p)
  end
  if self.same_positions then
    local c, s = at(1)
    return zr.rope(x, c, s)
  end
  local parts = {}
  for b = 1, x:size(1) do
    local c, s = at(b)
    parts[b] = zr.rope(x:narrow(1, b, 1), c, s)
  end
  return zr.cat(parts, 1)
end

-- Layer i's attention of q (B, H, Tq, D) over its cached keys and values with k, v (B, KV, Tq, D)
-- appended: softmax(q k^T scale + mask) v in f32 (transformers' eager attention: its softmax in f32),
-- kv heads repeated for grouped-query attention. Returns (B, H, Tq, D) in q's dtype.
function Cache:attend(i, q, k, v, scale, window)
  local kv = self.layers[i]
  if kv then
    k, v = zr.cat({ kv[1], k }, 3), zr.cat({ kv[2], v }, 3)
  else
    k, v = k:contiguous(), v:contiguous()
  end
  self.layers[i] = { k, v }
  local B, H, KV, L, D = q:size(1), q:size(2), k:size(2), k:size(3), q:size(4)
  if H ~= KV then
    local g = H / KV
    k = k:view(B, KV, 1, L, D):expand(B, KV, g, L, D):reshape(B, H, L, D)
    v = v:view(B, KV, 1, L, D):expand(B, KV, g, L, D):reshape(B, H, L, D)
  end
  local scores = (zr.matmul(q, k:transpose(3, 4)) * scale):to("f32"):masked_fill(self:mask(window), MASKED)
  return zr.matmul(zr.softmax(scores, -1):to(q:dtype()), v)
end

-- The loop ----------------------------------------------------------------------------------------

-- max_length, the total row length at which generation stops: prompt + max_new_tokens; else the given
-- (or the model's generation_config's) max_length; else transformers 5's default, 20 new tokens, capped
-- at max_position_embeddings.
local function total_length(model, s, T)
  if s.max_new_tokens then return T + s.max_new_tokens end
  if s.max_length_given then
    if s.max_length <= T then
      error(("generate: max_length %d leaves no room after the prompt's %d tokens; pass max_new_tokens"):format(s.max_length, T), 0)
    end
    return s.max_length
  end
  local cap = model.config.max_position_embeddings or model.config.n_positions
  return cap and math.min(T + DEFAULTS.max_length, cap) or T + DEFAULTS.max_length
end

-- Each row's next id from its scores (a Lua array over the vocabulary) and its ids so far.
local function choose(s, scores, row)
  if s.repetition_penalty ~= 1 then scores = M.repetition_penalty(scores, row, s.repetition_penalty) end
  if not s.do_sample then return M.argmax(scores) end
  if s.temperature ~= 1 then scores = M.temperature(scores, s.temperature) end
  if s.top_k ~= 0 then scores = M.top_k(scores, s.top_k) end
  if s.top_p < 1 then scores = M.top_p(scores, s.top_p) end
  return M.sample(scores, zr.rand({ 1 }):item())
end

-- The last position's logits (B, V) as Lua arrays, one a row, in f32 on the host.
local function last_scores(logits)
  local B, T, V = logits:size(1), logits:size(2), logits:size(3)
  local flat = logits:narrow(2, T, 1):to("cpu", "f32"):contiguous():flat_table()
  local rows = {}
  for b = 1, B do
    local r = {}
    for v = 1, V do r[v] = flat[(b - 1) * V + v] end
    rows[b] = r
  end
  return rows
end

-- The model's device, where every step's tensors go.
local function device_of(model) return model:parameters()[1]:device() end

-- One step's logits (B, 1, V): with the cache, the new tokens' forward; without it, the whole rows'.
local function step_logits(model, s, cache, rows, new)
  if not s.use_cache then
    return zr.no_grad(function() return model(zr.tensor(rows, { dtype = "i64" }):to(cache.device)).logits end)
  end
  return model:generation_step(zr.tensor(new, { dtype = "i64" }):to(cache.device), cache)
end

local function run(model, input_ids, s)
  local rows, masks = M.prompts(input_ids, s.attention_mask)
  local B, T = #rows, #rows[1]
  local limit = total_length(model, s, T)
  local padded = false
  for _, m in ipairs(masks) do if m[1] == 0 then padded = true end end
  if padded and not s.use_cache then
    error("generate: use_cache = false runs the model's own forward, which takes no padding mask: generate " ..
      "left-padded prompts with the cache (the default), or one prompt at a time", 0)
  end
  if s.eos and s.pad == nil then error("generate: eos_token_id is set but there is no pad_token_id for finished rows", 0) end
  local eos = {}
  for _, id in ipairs(s.eos or {}) do eos[id] = true end
  -- positions: transformers' attention_mask.cumsum(-1) - 1, 0 at the padding
  local pos, nextpos = {}, {}
  for b, m in ipairs(masks) do
    local p, c = {}, 0
    for t = 1, T do
      c = c + m[t]
      p[t] = m[t] == 1 and c - 1 or 0
    end
    pos[b], nextpos[b] = p, c
  end
  local cache = M.new_cache(device_of(model), masks)
  local unfinished, new = {}, rows
  for b = 1, B do unfinished[b] = true end
  local len = T
  while true do
    cache:begin(pos)
    local scores = last_scores(step_logits(model, s, cache, rows, new))
    local left = false
    new, pos = {}, {}
    for b = 1, B do
      local id = unfinished[b] and choose(s, scores[b], rows[b]) or s.pad
      rows[b][len + 1] = id
      new[b], pos[b] = { id }, { nextpos[b] }
      nextpos[b] = nextpos[b] + 1
      masks[b][len + 1] = 1 -- (transformers extends the mask with ones, finished rows too)
      if eos[id] then unfinished[b] = false end
      left = left or unfinished[b]
    end
    len = len + 1
    if not left or len >= limit then break end
  end
  return zr.tensor(rows, { dtype = "i64" }):to(cache.device)
end

-- model:generate(input_ids [, opts]) -> (B, T + n) i64 ids on the model's device: the prompts and
-- their continuations, rows finished at an eos id padded with pad_token_id (transformers' generate).
-- input_ids: a (B, T) or (T) tensor, a list of ids or a list of equal-length lists. opts (each
-- over the model's generation_config.json, over transformers' defaults):
--   max_new_tokens; or max_length (prompt included); neither: transformers 5's 20 new tokens
--   do_sample (false: greedy), temperature (1), top_k (50; 0 none), top_p (1), repetition_penalty (1)
--   eos_token_id (a number or a list; false: none; default the config's), pad_token_id (default the
--   config's, else the first eos id), attention_mask (left-padded prompts: 0 at the padding)
--   use_cache (true; false: the whole rows' forward every step, O(n^2)), generation_config (a table
--   in place of the model's generation_config.json fields; false: none)
-- Runs in eval mode without gradients and restores the training flag. Sampling draws from zrun's
-- generator (zr.manual_seed), not torch's: reproducible, not torch's numbers.
function M.generate(model, input_ids, opts)
  local s = M.settings(model, opts or {})
  if require("zrun.nn.module").fetch then
    error("generate: the model is partitioned by a ZeRO-3 engine; save it (trainer:save_model()) and generate from " ..
      "the saved folder", 0)
  end
  local was = model.training
  model:eval()
  local ok, out = pcall(zr.no_grad, run, model, input_ids, s)
  model:train(was)
  if not ok then error(out, 0) end
  return out
end

return M
