-- DeepSpeed-compatible training configuration: loads a ds_config JSON file (or a Lua table), checks every
-- key against DeepSpeed's documented schema, fills DeepSpeed's defaults, resolves "auto" from training
-- arguments as the Hugging Face integration does, applies key=value overrides and remembers where each
-- value came from. It runs nothing: the engine and the Trainer read the resolved table.
-- (The schema itself, DeepSpeed's keys and defaults, is config_schema.lua.)
--
--   local cfg = config.load("configs/zero3.json", { world_size = 4, args = { learning_rate = 2e-5 },
--                                                  overrides = { "zero_optimization.stage=2" } })
--   cfg.zero_optimization.stage, cfg:source("zero_optimization.stage")  --> 2, "override"
local cjson = require "cjson"

local M = {}
local NULL = cjson.null
local floor, abs, huge = math.floor, math.abs, math.huge
local fmt, concat, sort = string.format, table.concat, table.sort
local type, pairs, ipairs, tostring, tonumber = type, pairs, ipairs, tostring, tonumber

-- Values, dotted paths and message lists (config_util.lua); "auto" and the Trainer's step arithmetic
-- (config_auto.lua: its steps_per_epoch, micro_batches_per_epoch, warmup_steps and ARG_DEFAULTS are config.* too); the checks
-- across keys (config_check.lua).
local U = require "zrun.config_util"
local A = require "zrun.config_auto"
local C = require "zrun.config_check"
local fmtnum, is_array, is_object, show, deepcopy = U.fmtnum, U.is_array, U.is_object, U.show, U.deepcopy
local join, split, get, set, add_error, add_warning = U.join, U.split, U.get, U.set, U.add_error, U.add_warning
local AUTO, resolve_autos, batch_rule, cross_checks = A.AUTO, A.resolve_autos, C.batch_rule, C.cross_checks
M.show, M.ARG_DEFAULTS = show, A.ARG_DEFAULTS
M.steps_per_epoch, M.micro_batches_per_epoch, M.warmup_steps = A.steps_per_epoch, A.micro_batches_per_epoch, A.warmup_steps

-- "Did you mean" -------------------------------------------------------------------------------------

-- Optimal-string-alignment distance (Levenshtein plus adjacent transpositions), case-insensitive.
local function distance(a, b)
  a, b = a:lower(), b:lower()
  local la, lb = #a, #b
  local d = {}
  for i = 0, la do d[i] = { [0] = i } end
  for j = 0, lb do d[0][j] = j end
  for i = 1, la do
    for j = 1, lb do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      local v = math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost)
      if i > 1 and j > 1 and a:byte(i) == b:byte(j - 1) and a:byte(i - 1) == b:byte(j) then
        v = math.min(v, d[i - 2][j - 2] + 1)
      end
      d[i][j] = v
    end
  end
  return d[la][lb]
end
M.distance = distance

-- Whether the letters of a appear in b in order ("warmup_steps" in "warmup_num_steps").
local function subsequence(a, b)
  local j = 1
  for i = 1, #b do
    if j <= #a and a:byte(j) == b:byte(i) then j = j + 1 end
  end
  return j > #a
end

-- The candidate closest to word, when close enough to be a plausible typo; nil otherwise. A key with
-- letters left out or added ("warmup_steps", "betas1") prefers the key it shortens or extends.
function M.suggest(word, candidates)
  local best, bd, bsub = nil, huge, false
  local lw = word:lower()
  for _, c in ipairs(candidates) do
    local d = distance(word, c)
    local lc = c:lower()
    local sub = abs(#lc - #lw) <= 6 and (subsequence(lw, lc) or subsequence(lc, lw)) and #lw >= 3
    if (sub and not bsub) or (sub == bsub and (d < bd or (d == bd and best and c < best))) then
      best, bd, bsub = c, d, sub
    end
  end
  if best and (bsub or bd <= math.max(2, floor(#word * 0.4))) then return best end
  return nil
end

-- Schema: DeepSpeed's keys and defaults, and what zrun does with each (config_schema.lua) ----------

local S = require "zrun.config_schema"
local SCHEMA, OPTIMIZER = S.SCHEMA, S.OPTIMIZER
local unimplemented_optimizer = S.unimplemented_optimizer
M.unimplemented_optimizer_message = S.unimplemented_optimizer_message
M.schema = SCHEMA

-- Every leaf path, for "did you mean" across sections (a top-level "stage" → zero_optimization.stage).
local ALL_PATHS = {}
local function collect(node, path)
  for _, name in ipairs(node.keys) do
    local child, p = node.map[name], join(path, name)
    ALL_PATHS[#ALL_PATHS + 1] = p
    if child.kind == "section" then collect(child, p)
    elseif child.kind == "variant" then
      ALL_PATHS[#ALL_PATHS + 1] = p .. ".type"
      for _, t in ipairs(child.names) do collect(child.types[t], p .. ".params") end
    end
  end
end
collect(SCHEMA, "")

-- Leaf checks ---------------------------------------------------------------------------------------

local function one_of(values)
  local parts = {}
  for i, v in ipairs(values) do parts[i] = show(v) end
  if #parts == 1 then return parts[1] end
  return concat(parts, ", ", 1, #parts - 1) .. " or " .. parts[#parts]
end

local function range_text(node, what)
  if node.min and node.max then return fmt("%s between %s and %s", what, fmtnum(node.min), fmtnum(node.max)) end
  if node.min == 1 and what == "an integer" then return "a positive integer" end
  if node.min == 0 and node.open_min then return what .. " > 0" end
  if node.min == 0 then return "a non-negative " .. what:gsub("^an? ", "") end
  if node.min then return fmt("%s >= %s", what, fmtnum(node.min)) end
  return what
end

-- Returns the checked (possibly canonicalised) value, or nil and "what is allowed".
local function check_leaf(node, v)
  local t = node.type
  if t == "int" or t == "number" then
    local what = t == "int" and "an integer" or "a number"
    if node.values then
      for _, x in ipairs(node.values) do if x == v then return v end end
      return nil, one_of(node.values)
    end
    -- (JSON's 1e400 decodes to infinity: no count or size is infinite, and floor(inf) == inf)
    if type(v) ~= "number" or v ~= v or v == huge or v == -huge or (t == "int" and floor(v) ~= v) then
      return nil, range_text(node, what)
    end
    if (node.min and (v < node.min or (node.open_min and v == node.min))) or (node.max and v > node.max) then
      return nil, range_text(node, what)
    end
    return v
  elseif t == "bool" then
    if type(v) ~= "boolean" then return nil, "true or false" end
    return v
  elseif t == "string" then
    if type(v) ~= "string" then return nil, "a string" end
    return v
  elseif t == "enum" then
    if type(v) == "string" then
      for _, x in ipairs(node.values) do
        if x == v or (node.ci and x:lower() == v:lower()) then return x end
      end
      local s = M.suggest(v, node.values)
      return nil, one_of(node.values), s
    end
    return nil, one_of(node.values)
  elseif t == "names" then -- "auto" or a list of strings (data_types.keep_in_fp32_modules)
    local what = '"auto" or a list of name patterns'
    if v == "auto" then return v end
    if type(v) ~= "table" or (next(v) ~= nil and not is_array(v)) then return nil, what end
    for _, x in ipairs(v) do if type(x) ~= "string" then return nil, what end end
    return deepcopy(v)
  elseif t == "list" or t == "numlist" then
    local low = node.min and fmt(" (each >= %s)", node.min) or "" -- (numlist: cycle_min_lr's min 0)
    if t == "numlist" and type(v) == "number" and not (node.min and v < node.min) then return v end
    local what = t == "numlist" and "a number or a list of numbers" .. low or
      (node.len and fmt("a list of %d numbers", node.len) or "a list of numbers")
    if type(v) ~= "table" or not is_array(v) then return nil, what end
    if node.len and #v ~= node.len then return nil, what end
    for _, x in ipairs(v) do
      if type(x) ~= "number" or (node.min and x < node.min) then return nil, what end
    end
    return deepcopy(v)
  end
  return v
end

-- Walk: raw tree → values tree, with sources ---------------------------------------------------------

local function set_source(ctx, p, kind, note) ctx.src[p] = { kind = kind, note = note } end

-- "file" unless p (or a section above it) was set on the command line.
local function given_kind(ctx, p)
  local q = p
  while q do
    if ctx.ov[q] then return "override" end
    q = q:match("^(.*)%.[^.]+$")
  end
  return ctx.origin
end

-- The candidate at the smallest edit distance (for "the nearest known key").
local function nearest(word, candidates)
  local best, bd = nil, huge
  for _, c in ipairs(candidates) do
    local d = distance(word, c)
    if d < bd or (d == bd and c < best) then best, bd = c, d end
  end
  return best
end

-- An unknown key: an error in a strict section (DeepSpeed's pydantic models forbid extras, and
-- optimizer/scheduler params are constructor arguments), a warning where DeepSpeed reads the section
-- with dict.get and ignores what it does not know. `takes`: what the section accepts, for the message.
local function unknown_key(ctx, candidates, path, key, strict, takes)
  local full = join(path, tostring(key))
  local s = M.suggest(tostring(key), candidates)
  if s then s = join(path, s)
  else -- the same name elsewhere in the schema: a key placed in the wrong section
    for _, p in ipairs(ALL_PATHS) do
      if p:match("[^.]+$") == key and p ~= full then s = p; break end
    end
  end
  local hint = s and fmt('; did you mean "%s"?', s) or ""
  if takes then hint = hint .. "; " .. takes end
  if strict then
    add_error(ctx, 'unknown key "%s"%s%s', full, path == "" and " at the top level" or "", hint)
    return
  end
  ctx.warned = ctx.warned or {}
  if ctx.warned[full] then return end
  ctx.warned[full] = true
  if type(key) == "string" and key:sub(1, 1) == "_" then
    hint = "" -- "_comment" and the like: a note in the file, not a misspelt key
  elseif not s and path == "" then
    local n = type(key) == "string" and nearest(key, candidates)
    hint = n and fmt(' (the nearest known key is "%s")', n) or ""
  end
  add_warning(ctx, 'unknown key "%s"%s is ignored, as DeepSpeed ignores it%s', full,
    path == "" and " at the top level" or "", hint)
end

local take

-- raw with every alias renamed to its canonical key (both given: an error, as one must win).
local function canonical_keys(node, raw, path, ctx)
  if next(node.aliases or {}) == nil then return raw end
  local out = {}
  for k, v in pairs(raw) do
    local c = node.aliases[k]
    if c then
      if raw[c] ~= nil then
        add_error(ctx, '%s and %s are the same setting (DeepSpeed\'s name and its alias); give only one', join(path, k),
          join(path, c))
      else
        out[c] = v
        ctx.alias_of[join(path, c)] = k
      end
    elseif out[k] == nil then
      out[k] = v
    end
  end
  return out
end

local function walk(node, raw, path, ctx)
  local vals = {}
  raw = canonical_keys(node, raw, path, ctx)
  if not node.open then
    for k in pairs(raw) do
      if type(k) ~= "string" or not node.map[k] then unknown_key(ctx, node.keys, path, k, node.strict) end
    end
  else
    for k, v in pairs(raw) do if not node.map[k] then vals[k] = deepcopy(v) end end
  end
  for _, name in ipairs(node.keys) do
    vals[name] = take(node.map[name], raw[name], join(path, name), ctx, vals, name)
  end
  return vals
end

local function take_variant(node, v, p, ctx)
  local kind = given_kind(ctx, p)
  local extra = node.extra
  local allowed = { "type", "params" }
  for _, k in ipairs(extra and extra.keys or {}) do allowed[#allowed + 1] = k end
  for k in pairs(v) do -- DeepSpeed reads type, params (and legacy_fusion) with dict.get
    if k ~= "type" and k ~= "params" and not (extra and extra.map[k]) then unknown_key(ctx, allowed, p, k, false) end
  end
  local ty = v.type
  if ty == nil or ty == NULL then
    add_error(ctx, "%s.type is required: one of %s", p, one_of(node.names))
    return nil
  end
  local canonical
  if type(ty) == "string" then
    for _, n in ipairs(node.names) do
      if n == ty or (node.ci and not (node.exact and node.exact[n]) and n:lower() == ty:lower()) then canonical = n end
    end
  end
  if not canonical then
    if node == OPTIMIZER and unimplemented_optimizer(ty) then
      add_error(ctx, "%s", M.unimplemented_optimizer_message(ty))
      return nil
    end
    local s = type(ty) == "string" and M.suggest(ty, node.names)
    add_error(ctx, "%s.type must be %s, got %s%s", p, one_of(node.names), show(ty),
      s and fmt('; did you mean "%s"?', s) or "")
    return nil
  end
  set_source(ctx, p .. ".type", given_kind(ctx, p .. ".type"))
  local params = v.params
  if params == nil or params == NULL then params = {}
  elseif not is_object(params) then
    add_error(ctx, "%s.params must be an object {...}, got %s", p, show(params))
    params = {}
  end
  local schema = node.types[canonical]
  if node == OPTIMIZER and params.max_grad_norm ~= nil then -- refused before the type (engine.py)
    add_error(ctx, "%s.params.max_grad_norm: DeepSpeed does not take max_grad_norm as an optimizer parameter " ..
      "(deepspeed.initialize raises a ValueError); use the top-level gradient_clipping", p)
  end
  for k in pairs(params) do -- constructor keyword arguments: an unknown one is a TypeError in DeepSpeed
    if k == "max_grad_norm" and node == OPTIMIZER then -- refused above
    elseif type(k) ~= "string" or not schema.map[k] then
      unknown_key(ctx, schema.keys, p .. ".params", k, true, fmt("%s takes %s", canonical, concat(schema.keys, ", ")))
    end
  end
  local known = {}
  for k, x in pairs(params) do if schema.map[k] then known[k] = x end end
  local out = { type = canonical, params = walk(schema, known, p .. ".params", ctx) }
  if extra then
    for _, name in ipairs(extra.keys) do out[name] = take(extra.map[name], v[name], join(p, name), ctx, out, name) end
  end
  ctx.src[p] = { kind = kind }
  return out
end

-- A feature zrun does not implement, set to something other than its `off` value.
local function unimplemented(ctx, node, p, v)
  local allowed = node.off == nil and "unset (null)" or show(node.off)
  if node.effect == "error" then
    add_error(ctx, "%s = %s: zrun does not implement this and the results would differ from DeepSpeed's; " ..
      "allowed: %s%s", p, show(v), allowed, node.hint and "; " .. node.hint or "")
  else
    add_warning(ctx, "%s = %s: zrun does not implement this (DeepSpeed would train the same); it has no " ..
      "effect here", p, show(v))
  end
end

take = function(node, v, p, ctx, parent, name)
  if node.kind == "section" then
    if v == nil or v == NULL then
      if node.optional then return nil end
      return walk(node, {}, p, ctx)
    end
    if not is_object(v) then
      add_error(ctx, "%s must be an object {...}, got %s", p, show(v))
      return node.optional and nil or walk(node, {}, p, ctx)
    end
    return walk(node, v, p, ctx)
  elseif node.kind == "variant" then
    if v == nil or v == NULL then return nil end
    if not is_object(v) then
      add_error(ctx, "%s must be an object {...}, got %s", p, show(v))
      return nil
    end
    return take_variant(node, v, p, ctx)
  elseif node.kind == "opaque" then
    if v == nil or v == NULL then return nil end
    set_source(ctx, p, given_kind(ctx, p))
    if node.effect then
      local active
      if node.active then active = node.active(v) else active = not (type(v) == "table" and v.enabled == false) end
      if active then
        if node.effect == "error" then
          add_error(ctx, '"%s" is set: zrun does not implement it and the results would differ from DeepSpeed\'s; ' ..
            '%s', p, node.active and "remove the section" or 'remove the section (or set "enabled": false)')
        else
          add_warning(ctx, '"%s" is accepted for compatibility with DeepSpeed, but zrun does not implement it ' ..
            "(DeepSpeed would train the same)", p)
        end
      end
    end
    return deepcopy(v)
  end
  -- leaf
  local alias = ctx.alias_of[p]
  local function default() -- a computed default waits until the values it reads are known
    if type(node.default) == "function" then
      ctx.deferred[#ctx.deferred + 1] = { parent = parent, name = name, fn = node.default }
      return nil
    end
    return deepcopy(node.default)
  end
  if v == nil then
    if node.required then
      add_error(ctx, '%s is required%s', p, node.auto and ' (a value, or "auto")' or "")
      return nil
    end
    set_source(ctx, p, "default")
    return default()
  end
  local kind = given_kind(ctx, p)
  if v == NULL then
    if node.nullable then set_source(ctx, p, kind, "null"); return nil end
    local _, what = check_leaf(node, {})
    add_error(ctx, "%s must be %s, got null", p, what or node.type)
    return nil
  end
  if v == "auto" and (node.auto or node.drop_auto or (node.type ~= "string" and node.type ~= "enum" and
    node.type ~= "names")) then
    if node.auto then
      set_source(ctx, p, "auto", "unresolved")
      return "auto"
    end
    if node.drop_auto then -- DeepSpeedConfigModel drops "auto" fields: the default applies
      local d = default()
      -- a default that is "auto" itself is the field's own mode (ZenFlow's adaptive intervals), not HF's
      set_source(ctx, p, d == "auto" and kind or "auto", d == "auto" and "DeepSpeed's own \"auto\" (its default)"
        or "DeepSpeed's default (DeepSpeed drops \"auto\" here)")
      return d
    end
    local _, what = check_leaf(node, {})
    add_error(ctx, '%s does not accept "auto"; it must be %s', p, what)
    return nil
  end
  local ok, what, sugg = check_leaf(node, v)
  if ok == nil then
    add_error(ctx, "%s must be %s, got %s%s", p, what, show(v), sugg and fmt('; did you mean "%s"?', sugg) or "")
    return nil
  end
  if node.effect and ok ~= node.off then unimplemented(ctx, node, p, ok) end
  set_source(ctx, p, kind, alias and fmt("given as %s", alias) or nil)
  return ok
end

-- Overrides ("key.sub=value") ---------------------------------------------------------------------

-- The schema node at a dotted path; the raw tree tells an optimizer/scheduler its params schema.
local function lookup(path, raw, parts)
  local node, r, done = SCHEMA, raw, ""
  parts = parts or split(path)
  local i = 1
  while i <= #parts do
    local name = parts[i]
    if node.kind == "section" then
      local child = node.map[name]
      if not child and node.aliases[name] then -- DeepSpeed's other name: set the canonical key
        parts.alias = name
        name = node.aliases[name]
        parts[i], child = name, node.map[name]
      end
      if not child then
        if node.open then return { kind = "leaf", type = "any" } end
        local s = M.suggest(name, node.keys)
        return nil, fmt('unknown key "%s"%s', join(done, name), s and fmt('; did you mean "%s"?', join(done, s)) or "")
      end
      parts.other = child.alias -- a file may spell the same setting by its other name
      node, r = child, type(r) == "table" and r[name] or nil
    elseif node.kind == "variant" then
      if name == "type" then return { kind = "leaf", type = "string" } end
      if name ~= "params" then
        if node.extra and node.extra.map[name] then
          node, r = node.extra.map[name], nil
        else
          local s = M.suggest(name, { "type", "params" })
          return nil, fmt('unknown key "%s"%s', join(done, name), s and fmt('; did you mean "%s"?', join(done, s)) or "")
        end
      else
        local ty = type(r) == "table" and r.type
        local canonical
        for _, n in ipairs(node.names) do
          if type(ty) == "string" and (n == ty or (node.ci and not (node.exact and node.exact[n]) and n:lower() == ty:lower())) then canonical = n end
        end
        if not canonical then
          return nil, fmt("%s: set %s.type first (one of %s)", path, done, one_of(node.names))
        end
        node, r = node.types[canonical], type(r) == "table" and r.params or nil
      end
    elseif node.kind == "opaque" then
      return { kind = "leaf", type = "any" }
    else
      return nil, fmt('%s: "%s" is a value, not a section', path, done)
    end
    done = join(done, name)
    i = i + 1
  end
  return node
end

local BOOL_WORDS = { ["true"] = true, yes = true, on = true, ["1"] = true,
  ["false"] = false, no = false, off = false, ["0"] = false }

-- Turns the text after "=" into a value of the type the schema expects.
local function coerce(node, s, key)
  if type(s) ~= "string" then return s end
  s = s:match("^%s*(.-)%s*$")
  if s == "null" then return NULL end
  if s == "auto" then return "auto" end
  local t = node.kind == "leaf" and node.type or "table"
  if t == "bool" then
    local b = BOOL_WORDS[s:lower()]
    if b == nil then error(fmt("%s=%s: expected true or false", key, s), 0) end
    return b
  elseif t == "int" or t == "number" then
    local n = tonumber(s)
    if n == nil then error(fmt("%s=%s: expected a number", key, s), 0) end
    return n
  elseif t == "string" or t == "enum" then
    return (s:match('^"(.*)"$') or s)
  elseif t == "list" or t == "numlist" then
    local n = tonumber(s)
    if n and t == "numlist" then return n end
    local body = s:match("^%[(.*)%]$") or s
    local out = {}
    for item in body:gmatch("[^,]+") do
      local x = tonumber(item)
      if x == nil then error(fmt("%s=%s: expected a list of numbers like [0.9,0.999]", key, s), 0) end
      out[#out + 1] = x
    end
    return out
  end
  local ok, v = pcall(cjson.decode, s)
  if ok then return v end
  if t == "table" then error(fmt("%s=%s: expected a JSON object", key, s), 0) end
  return s
end

-- Parses overrides ({"a.b=1", ...} or {["a.b"]=1}) into the raw tree; returns the set paths.
local function apply_overrides(raw, overrides)
  local set = {}
  local items = {}
  for k, v in pairs(overrides or {}) do
    if type(k) == "number" then
      local key, val = tostring(v):match("^%s*([^=%s]+)%s*=(.*)$")
      if not key then error(fmt('override "%s" must look like key.sub=value', tostring(v)), 0) end
      items[#items + 1] = { k, key, val }
    else
      items[#items + 1] = { -1, k, v }
    end
  end
  sort(items, function(a, b) return a[1] < b[1] end)
  for _, it in ipairs(items) do
    local key, val = it[2], it[3]
    local parts = split(key)
    local node, err = lookup(key, raw, parts)
    if not node then error("override " .. err, 0) end
    local v = coerce(node, val, key)
    key = concat(parts, ".")
    local t = raw
    for i = 1, #parts - 1 do
      if type(t[parts[i]]) ~= "table" then t[parts[i]] = {} end
      t = t[parts[i]]
    end
    t[parts[#parts]] = v
    for _, other in ipairs { parts.alias or false, parts.other or false } do -- the file's spelling of it
      if other then t[other] = nil end
    end
    set[key] = true
  end
  return set
end



-- Loading -----------------------------------------------------------------------------------------

local function read_json(path)
  local f, err = io.open(path, "rb")
  if not f then error(fmt("config: cannot open %s: name a DeepSpeed JSON config file", err), 0) end
  local text, rerr = f:read("*a") -- (a folder opens on Linux; reading it is what fails)
  f:close()
  if not text then error(fmt("%s: cannot read it (%s): name a DeepSpeed JSON config file", path, tostring(rerr)), 0) end
  local ok, v = pcall(cjson.decode, text)
  if not ok then error(fmt("%s: not valid JSON%s: %s", path, U.json_where(text, v), tostring(v)), 0) end
  if not is_object(v) then error(fmt("%s: the top level must be a JSON object {...}", path), 0) end
  return v
end
M.read_json = read_json -- (a JSON object from a file, or one line naming the file, the line and the column)

local Config = {}
Config.__index = Config
local META = setmetatable({}, { __mode = "k" })

local function raise(name, errors)
  if #errors == 1 then error(name .. ": " .. errors[1], 0) end
  error(fmt("%s: %d problems:\n  - %s", name, #errors, concat(errors, "\n  - ")), 0)
end

-- Loads and resolves a DeepSpeed config. source: a path to a JSON file or a Lua table.
-- opts: world_size (default: launcher environment, else 1), args (TrainingArguments-like table:
-- per_device_train_batch_size, gradient_accumulation_steps, learning_rate, adam_beta1/2, adam_epsilon,
-- weight_decay, warmup_steps, warmup_ratio, max_steps, num_train_epochs, train_dataset_size, bf16,
-- fp16, max_grad_norm, hidden_size), overrides ({"a.b=v", ...} or {["a.b"]=v}), num_training_steps,
-- hidden_size. Raises one error naming every problem.
function M.load(source, opts)
  opts = opts or {}
  local raw, name, origin
  if type(source) == "string" then
    raw, name, origin = read_json(source), source, "file"
  elseif type(source) == "table" then
    if getmetatable(source) == Config then source = source:to_table() end
    if not is_object(source) then error("config: a config table must have string keys", 0) end
    raw, name, origin = deepcopy(source), "config", "file"
  else
    error("config.load: expected a JSON file path or a table, got " .. type(source), 0)
  end
  if raw.bfloat16 ~= nil and raw.bf16 == nil then raw.bf16, raw.bfloat16 = raw.bfloat16, nil end -- old name
  local world = opts.world_size or tonumber(os.getenv("OMPI_COMM_WORLD_SIZE") or os.getenv("WORLD_SIZE") or "")
    or 1
  if type(world) ~= "number" or world < 1 or floor(world) ~= world then
    error(fmt("%s: world_size must be a positive integer, got %s", name, show(world)), 0)
  end
  local args = opts.args or {}
  local ctx = {
    errors = {}, warnings = {}, src = {}, deferred = {}, alias_of = {}, origin = origin, world_size = world, args = args,
    num_training_steps = opts.num_training_steps or args.num_training_steps,
    hidden_size = opts.hidden_size or args.hidden_size,
  }
  -- DeepSpeed's deprecated "zero_optimization": true / false (read_zero_config_deprecated): stage 1 with
  -- the top-level allgather_size (default 5e8) as its allgather bucket, or stage 0; with its warning
  if type(raw.zero_optimization) == "boolean" then
    local on = raw.zero_optimization
    raw.zero_optimization = { stage = on and 1 or 0, allgather_bucket_size = on and (raw.allgather_size or 5e8) or nil }
    raw.allgather_size = nil
    add_warning(ctx, '"zero_optimization": %s is DeepSpeed\'s deprecated form, read as {"stage": %d} (write the ' ..
      "section as an object)", tostring(on), on and 1 or 0)
  end
  local okov, ov = pcall(apply_overrides, raw, opts.overrides)
  if not okov then error(name .. ": " .. ov, 0) end
  ctx.ov = ov
  local perr, added_opt = A.precision_sections(raw, args)
  if not perr then perr, added_opt = A.optimizer_section(raw, args) end
  if perr then error(name .. ": " .. perr, 0) end
  local vals = walk(SCHEMA, raw, "", ctx)
  if added_opt then -- cfg:source("optimizer") says the section is the Trainer's own (args.optim)
    local s = { kind = "args", note = fmt("args.optim = %s (the file has no optimizer section)", args.optim) }
    ctx.src.optimizer, ctx.src["optimizer.type"] = s, s
  end
  for _, d in ipairs(ctx.deferred) do d.parent[d.name] = d.fn(vals) end
  local meta = { src = ctx.src, warnings = ctx.warnings, pending = {}, ctx = ctx, name = name }
  if #ctx.errors == 0 then
    -- batch sizes first: the rule needs them, and other "auto" values (steps per epoch) read them
    local batch = { train_micro_batch_size_per_gpu = true, gradient_accumulation_steps = true, train_batch_size = true }
    local mism = resolve_autos(vals, meta, batch)
    batch_rule(vals, ctx, meta)
    local rest = {}
    for _, e in ipairs(AUTO) do if not batch[e[1]] then rest[e[1]] = true end end
    for _, m in ipairs(resolve_autos(vals, meta, rest)) do mism[#mism + 1] = m end
    if #mism == 1 then -- (one line; several are listed one a line, as transformers lists them)
      add_error(ctx, 'the config disagrees with the training arguments: %s; set them equal, or set the config value to "auto"',
        mism[1])
    elseif #mism > 1 then
      add_error(ctx, "the config disagrees with the training arguments (set them equal, or set the " ..
        'config value to "auto"):\n      %s', concat(mism, "\n      "))
    end
    cross_checks(vals, ctx, take)
  end
  if #ctx.errors > 0 then raise(name, ctx.errors) end
  ctx.errors = nil
  META[vals] = meta
  return setmetatable(vals, Config)
end

-- Resolves "auto" values that were pending: info.num_training_steps, info.hidden_size (or
-- info.model with model.config.hidden_size). Returns cfg.
-- At engine start: an "auto" still pending in a section DeepSpeed reads with pydantic (the ZeRO
-- bucket sizes when the model has no hidden_size) takes DeepSpeed's default, as DeepSpeed drops
-- "auto" there. Other pending values stay (the scheduler's step counts). Returns cfg.
function M.settle(cfg)
  local meta = META[cfg]
  assert(meta, "config.settle: not a loaded config")
  for path, why in pairs(meta.pending) do
    local node = lookup(path, cfg)
    if node and node.drop_auto then
      local v = node.default
      if type(v) == "function" then v = v(cfg) end
      set(cfg, path, v)
      meta.src[path] = { kind = "auto", note = "DeepSpeed's default (" .. why .. ")" }
      meta.pending[path] = nil
    end
  end
  return cfg
end

-- DeepSpeed's default for a dotted path ("zero_optimization.stage3_max_live_parameters"), for code
-- that plans from a partial table (memory_plan); stage-dependent defaults take `vals` (a resolved
-- config or a table with zero_optimization.stage).
function M.default(path, vals)
  local node = lookup(path, vals or {})
  assert(node and node.kind == "leaf", "config.default: not a setting: " .. path)
  local d = node.default
  if type(d) == "function" then d = d(vals) end
  return deepcopy(d)
end

-- The optimizer DeepSpeed's defaults describe when a config has none: AdamW with FusedAdam's values.
function M.default_optimizer()
  local s, params = OPTIMIZER.types.AdamW, {}
  for _, k in ipairs(s.keys) do params[k] = deepcopy(s.map[k].default) end
  return { type = "AdamW", params = params }
end

-- Resolves the "auto" values that waited for the run (info.num_training_steps, info.hidden_size or
-- info.model) and checks them against the training arguments; raises one error naming every problem.
function M.finalize(cfg, info)
  local meta = META[cfg]
  assert(meta, "config.finalize: not a loaded config")
  info = info or {}
  local ctx = meta.ctx
  ctx.num_training_steps = info.num_training_steps or ctx.num_training_steps
  local h = info.hidden_size or (info.model and info.model.config and info.model.config.hidden_size)
  ctx.hidden_size = h or ctx.hidden_size
  ctx.errors = {}
  local mism = resolve_autos(cfg, meta, nil)
  if #mism > 0 then
    add_error(ctx, "the config disagrees with the training arguments:\n      %s", concat(mism, "\n      "))
  end
  local errs = ctx.errors
  ctx.errors = nil
  if #errs > 0 then raise(meta.name, errs) end
  return cfg
end

-- Methods on a loaded config ----------------------------------------------------------------------

-- The value at a dotted path ("zero_optimization.offload_optimizer.device"), or default when absent.
function Config:get(path, default)
  local v = get(self, path)
  if v == nil then return default end
  return v
end

-- Where a value came from: "default", "file", "auto", "override" or "derived" (batch rule), and a note.
function Config:source(path)
  local s = META[self].src[path]
  if not s then return nil end
  return s.kind, s.note
end

function Config:warnings() return META[self].warnings end

-- Dotted paths whose "auto" could not be resolved yet, with what each needs.
function Config:pending()
  local out = {}
  for p, why in pairs(META[self].pending) do out[#out + 1] = p .. ": " .. why end
  sort(out)
  return out
end

-- A plain copy of the resolved values (no metatable), e.g. for checkpoint metadata.
function Config:to_table()
  local out = {}
  for k, v in pairs(self) do out[k] = deepcopy(v) end
  return out
end

-- JSON with keys sorted and numbers in their shortest exact form (cjson keeps only 14 digits).
local function encode(v)
  local t = type(v)
  if t == "number" then
    if v ~= v or v == huge or v == -huge then error("config.to_json: cannot encode " .. tostring(v), 0) end
    return fmtnum(v)
  elseif t == "table" then
    if next(v) == nil then return "{}" end
    local parts = {}
    if is_array(v) then
      for i, x in ipairs(v) do parts[i] = encode(x) end
      return "[" .. concat(parts, ",") .. "]"
    end
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = tostring(k) end
    sort(keys)
    for i, k in ipairs(keys) do parts[i] = cjson.encode(k) .. ":" .. encode(v[k]) end
    return "{" .. concat(parts, ",") .. "}"
  end
  return cjson.encode(v)
end

function Config:to_json() return encode(self:to_table()) end

-- Describe ----------------------------------------------------------------------------------------

local function rows_of(node, vals, path, meta, rows)
  for _, name in ipairs(node.keys) do
    local child, p = node.map[name], join(path, name)
    local v = vals and vals[name]
    if child.kind == "section" then
      if v ~= nil then rows_of(child, v, p, meta, rows) end
    elseif child.kind == "variant" then
      if v ~= nil then
        local s = meta.src[p .. ".type"] or {}
        rows[#rows + 1] = { p .. ".type", show(v.type), s.kind or "", s.note }
        rows_of(child.types[v.type], v.params, p .. ".params", meta, rows)
        if child.extra then rows_of(child.extra, v, p, meta, rows) end
      end
    else
      local s = meta.src[p]
      if child.kind == "leaf" and child.deprecated and v == nil then s = nil end
      if s and not (child.kind == "opaque" and v == nil) then
        rows[#rows + 1] = { p, show(v), s.kind, s.note }
      end
    end
  end
end

-- The resolved configuration as text: one row per key, with its value and where it came from.
function M.format(cfg)
  local meta = META[cfg]
  assert(meta, "config.describe: not a loaded config")
  local rows = {}
  rows_of(SCHEMA, cfg, "", meta, rows)
  local w1, w2, w3 = #"key", #"value", #"source"
  for _, r in ipairs(rows) do
    w1, w2, w3 = math.max(w1, #r[1]), math.max(w2, #r[2]), math.max(w3, #r[3])
  end
  w2 = math.min(w2, 40)
  local out = { fmt("zrun config: %s (world size %d)", meta.name, meta.ctx.world_size) }
  local line = "%-" .. w1 .. "s  %-" .. w2 .. "s  %-" .. w3 .. "s  %s"
  out[#out + 1] = (fmt(line, "key", "value", "source", "note"):gsub("%s+$", ""))
  out[#out + 1] = string.rep("-", w1 + w2 + w3 + 10)
  for _, r in ipairs(rows) do
    out[#out + 1] = (fmt(line, r[1], r[2], r[3], r[4] or ""):gsub("%s+$", ""))
  end
  for _, p in ipairs(cfg:pending()) do out[#out + 1] = "pending auto: " .. p end
  for _, w in ipairs(meta.warnings) do out[#out + 1] = "warning: " .. w end
  return concat(out, "\n") .. "\n"
end

-- Prints the resolved configuration table; returns the text.
function M.describe(cfg)
  local s = M.format(cfg)
  io.write(s)
  return s
end
Config.describe = M.describe

-- `zrun check CONFIG [key=value ...] [--world-size N] [args.NAME=VALUE ...]`: prints the resolved
-- config; on an invalid one prints the message to stderr. Returns the exit status (0 or 1; 2 for
-- bad usage): the caller does os.exit(config.check_main(argv)).
function M.check_main(argv)
  local usage = "usage: zrun check CONFIG.json [key.sub=value ...] [--world-size N] [args.NAME=VALUE ...]\n"
  local path, overrides, args, world = nil, {}, {}, nil
  local i = 1
  while argv[i] do
    local a = argv[i]
    if a == "-h" or a == "--help" then io.write(usage); return 0 end
    local ws = a:match("^%-%-world[-_]size=(.*)$")
    if (a == "--world-size" or a == "--world_size") then ws = argv[i + 1]; i = i + 1 end
    if ws then
      world = tonumber(ws)
      if not world then io.stderr:write("zrun check: --world-size needs a number\n", usage); return 2 end
    elseif a:match("^args%.") then
      local k, v = a:match("^args%.([%w_]+)=(.*)$")
      if not k then io.stderr:write("zrun check: expected args.NAME=VALUE, got ", a, "\n"); return 2 end
      if tonumber(v) then v = tonumber(v) elseif BOOL_WORDS[v:lower()] ~= nil and not v:match("^%d$") then
        v = BOOL_WORDS[v:lower()]
      end
      args[k] = v
    elseif a:find("=", 1, true) then
      overrides[#overrides + 1] = a
    elseif not path then
      path = a
    else
      io.stderr:write("zrun check: unexpected argument ", a, "\n", usage)
      return 2
    end
    i = i + 1
  end
  if not path then io.stderr:write(usage); return 2 end
  -- (the Trainer's own check of args.NAME=VALUE: a misspelt name or a value of the wrong type is said, not resolved into
  -- the config as it came)
  local aok, aerr = pcall(require("zrun.trainer_args").resolve, args, true)
  if not aok then io.stderr:write("zrun check: ", tostring(aerr), "\n"); return 2 end
  local ok, cfg = pcall(M.load, path, { world_size = world, args = args, overrides = overrides })
  if not ok then
    io.stderr:write("zrun check: ", tostring(cfg), "\n")
    return 1
  end
  M.describe(cfg)
  return 0
end

return M
