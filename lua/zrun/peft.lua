-- LoRA adapters as Hugging Face PEFT (0.17+) makes them: LoraConfig with PEFT's fields and defaults,
-- get_peft_model (frozen base, LoRA modules in place of the targeted Linear / Conv1D / Embedding modules), the
-- adapter files PEFT writes and reads (adapter_model.safetensors, adapter_config.json), merge_and_unload.
-- Not here: other PEFT methods (prefix tuning, IA3, ...), DoRA, quantized bases, several adapters.
local zr = require "zrun"
local nn = require "zrun.nn"
local Module = require "zrun.nn.module"
local init = require "zrun.nn.init_fns"
local cjson = require "cjson"

local M = {}
local fmt, concat, sort = string.format, table.concat, table.sort
local PEFT_VERSION = "0.21.2" -- (written in adapter_config.json: the PEFT release whose format this follows)

-- ---------- a small regex engine (PEFT matches a string target_modules with re.fullmatch) ----------
-- Python's syntax for what module-name patterns use: literals, ., \d \w \s (and upper-case), \. and other
-- escapes, [...] classes with ranges and ^, groups ( ) and (?: ), |, * + ? {m} {m,} {m,n} (lazy forms
-- too: a full match is the same either way), ^ and $. Anything else is refused by name.
local INF = math.huge
local function class_of(e)
  if e == "d" then return function(c) return c:match("%d") ~= nil end end
  if e == "w" then return function(c) return c:match("[%w_]") ~= nil end end
  if e == "s" then return function(c) return c:match("%s") ~= nil end end
  if e == "D" or e == "W" or e == "S" then
    local low = class_of(e:lower())
    return function(c) return not low(c) end
  end
end

local function compile(re)
  local pos = 1
  local function bad(why)
    error(fmt("target_modules regex '%s': %s at position %d (zrun's matcher takes literals, ., " ..
      "\\d \\w \\s, [...], ( ), (?: ), |, * + ? {m,n}, ^ and $); list module names instead", re, why, pos), 0)
  end
  local function peek(n) return re:sub(pos, pos + (n or 1) - 1) end
  local parse_alt
  local function set(test) return { t = "set", test = test } end
  local function escape()
    local e = re:sub(pos + 1, pos + 1)
    if e == "" then bad("a trailing backslash") end
    pos = pos + 2
    if class_of(e) then return class_of(e) end
    if e:match("%w") then bad("the escape \\" .. e) end
    return function(c) return c == e end
  end
  local function bracket()
    pos = pos + 1
    local neg = peek() == "^"
    if neg then pos = pos + 1 end
    local tests, first = {}, true
    while first or peek() ~= "]" do
      first = false
      if pos > #re then bad("an unclosed [") end
      if peek() == "\\" then tests[#tests + 1] = escape()
      else
        local a = peek()
        pos = pos + 1
        if peek() == "-" and re:sub(pos + 1, pos + 1) ~= "]" and pos + 1 <= #re then
          local b = re:sub(pos + 1, pos + 1)
          pos = pos + 2
          tests[#tests + 1] = function(c) return c >= a and c <= b end
        else tests[#tests + 1] = function(c) return c == a end end
      end
    end
    pos = pos + 1
    return set(function(c)
      for _, t in ipairs(tests) do if t(c) then return not neg end end
      return neg
    end)
  end
  local function atom()
    local c = peek()
    if c == "(" then
      pos = pos + 1
      if peek(2) == "?:" then pos = pos + 2
      elseif peek() == "?" then bad("the group form (?" .. re:sub(pos + 1, pos + 1)) end
      local n = parse_alt()
      if peek() ~= ")" then bad("an unclosed (") end
      pos = pos + 1
      return n
    elseif c == "[" then return bracket()
    elseif c == "." then pos = pos + 1; return set(function(ch) return ch ~= "\n" end)
    elseif c == "\\" then return set(escape())
    elseif c == "^" then pos = pos + 1; return { t = "bol" }
    elseif c == "$" then pos = pos + 1; return { t = "eol" }
    elseif c:match("[*+?{]") then bad("a quantifier with nothing before it")
    end
    pos = pos + 1
    return set(function(ch) return ch == c end)
  end
  local function seq()
    local items = {}
    while pos <= #re and peek() ~= "|" and peek() ~= ")" do
      local a, mn, mx = atom(), nil, nil
      local q = peek()
      if q == "*" then mn, mx = 0, INF elseif q == "+" then mn, mx = 1, INF elseif q == "?" then mn, mx = 0, 1 end
      if mn then pos = pos + 1
      elseif q == "{" then
        local a1, comma, b1 = re:match("^{(%d*)(,?)(%d*)}", pos)
        if a1 and (a1 ~= "" or b1 ~= "") then
          mn = tonumber(a1) or 0
          mx = comma == "" and mn or tonumber(b1) or INF
          pos = pos + #a1 + #comma + #b1 + 2
        end
      end
      if mn then
        if peek() == "?" then pos = pos + 1 end
        a = { t = "rep", node = a, min = mn, max = mx }
      end
      items[#items + 1] = a
    end
    return { t = "seq", items = items }
  end
  parse_alt = function()
    local opts = { seq() }
    while peek() == "|" do
      pos = pos + 1
      opts[#opts + 1] = seq()
    end
    return #opts == 1 and opts[1] or { t = "alt", opts = opts }
  end
  local root = parse_alt()
  if pos <= #re then bad("an unmatched )") end
  return root
end

-- Backtracking match of node against s at i; k(i') continues with the rest.
local function run(node, s, i, k)
  local t = node.t
  if t == "set" then
    if i <= #s and node.test(s:sub(i, i)) then return k(i + 1) end
    return false
  elseif t == "seq" then
    local items = node.items
    local function step(j, at)
      if j > #items then return k(at) end
      return run(items[j], s, at, function(nx) return step(j + 1, nx) end)
    end
    return step(1, i)
  elseif t == "alt" then
    for _, o in ipairs(node.opts) do if run(o, s, i, k) then return true end end
    return false
  elseif t == "rep" then
    local function try(count, at)
      if count < node.max and run(node.node, s, at, function(nx)
        return nx ~= at and try(count + 1, nx) -- (an empty repeat ends the loop)
      end) then return true end
      return count >= node.min and k(at)
    end
    return try(0, i)
  elseif t == "bol" then return i == 1 and k(i)
  else return i == #s + 1 and k(i) end
end

local compiled = {}
-- Whether s matches the Python regex re as a whole (re.fullmatch).
function M.fullmatch(re, s)
  local root = compiled[re] or compile(re)
  compiled[re] = root
  return run(root, s, 1, function(i) return i == #s + 1 end) and true or false
end

-- ---------- LoraConfig ----------

-- PEFT 0.21's LoraConfig fields and defaults (PeftConfig's besides), as adapter_config.json holds them.
M.DEFAULTS = {
  r = 8, lora_alpha = 8, lora_dropout = 0.0, target_modules = false, exclude_modules = false, fan_in_fan_out = false,
  bias = "none", use_rslora = false, modules_to_save = false, init_lora_weights = true, layers_to_transform = false,
  layers_pattern = false, rank_pattern = {}, alpha_pattern = {}, megatron_config = false,
  megatron_core = "megatron.core",
  trainable_token_indices = false, loftq_config = {}, eva_config = false, corda_config = false, lora_ga_config = false,
  use_dora = false, velora_config = false, alora_invocation_tokens = false, use_qalora = false, qalora_group_size = 16,
  monteclora_config = false, layer_replication = false, runtime_config = false, lora_bias = false,
  target_parameters = false, use_bdlora = false, arrow_config = false, kasa_config = false, ensure_weight_tying = false,
  -- PeftConfig's
  task_type = false, peft_type = "LORA", inference_mode = false, base_model_name_or_path = false, revision = false,
  auto_mapping = false, peft_version = PEFT_VERSION,
}
-- (false above: Python's None, written as null, except for the boolean fields below.)
local BOOLEAN = { fan_in_fan_out = true, use_rslora = true, use_dora = true, use_qalora = true, lora_bias = true,
  ensure_weight_tying = true, inference_mode = true, init_lora_weights = true }

-- Fields zrun refuses when set to anything but their default: what to do instead.
M.REFUSED = {
  use_dora = "use_dora (DoRA) is not implemented in zrun; train plain LoRA (use_dora = false)",
  trainable_token_indices = "trainable_token_indices is not implemented in zrun; leave it unset",
  megatron_config = "megatron_config (Megatron parallel layers) does not apply to zrun's models; leave it unset",
  loftq_config = "loftq_config (LoftQ initialisation of quantized bases) is not implemented in zrun; leave it empty",
  eva_config = "eva_config (EVA initialisation) is not implemented in zrun; use init_lora_weights = true or " ..
    "\"gaussian\"",
  corda_config = "corda_config (CorDA initialisation) is not implemented in zrun; use init_lora_weights = true",
  lora_ga_config = "lora_ga_config (LoRA-GA initialisation) is not implemented in zrun; use init_lora_weights = true",
  velora_config = "velora_config is not implemented in zrun; leave it unset",
  alora_invocation_tokens = "alora_invocation_tokens (activated LoRA) is not implemented in zrun; leave it unset",
  use_qalora = "use_qalora (quantization-aware LoRA) is not implemented in zrun: zrun has no quantized bases",
  monteclora_config = "monteclora_config is not implemented in zrun; leave it unset",
  layer_replication = "layer_replication is not implemented in zrun; leave it unset",
  lora_bias = "lora_bias = true (a bias on lora_B) is not implemented in zrun; leave it false",
  target_parameters = "target_parameters (LoRA on bare nn.Parameters) is not implemented in zrun; use target_modules",
  use_bdlora = "use_bdlora (block-diagonal LoRA) is not implemented in zrun; leave it unset",
  arrow_config = "arrow_config (Arrow routing over several adapters) is not implemented in zrun; leave it unset",
  kasa_config = "kasa_config is not implemented in zrun; leave it unset",
}
-- Fields that change nothing in zrun when set: said once, then kept (and written back as given).
M.NO_EFFECT = {
  megatron_core = "read only with megatron_config",
  qalora_group_size = "read only with use_qalora",
  runtime_config = "its ephemeral_gpu_offload moves adapters of offloaded layers, which zrun does not make",
  revision = "zrun reads the base model you pass; revision is only written to adapter_config.json",
}
local TASK_TYPES = { CAUSAL_LM = true }

local Config = {}
-- (PEFT's model.peft_config is a dict by adapter name: model.peft_config["default"] is the one config zrun holds)
Config.__index = function(c, k) if k == "default" then return c end return Config[k] end
M.LoraConfig_mt = Config

-- Prints "[zrun] LoraConfig: <key> has no effect in zrun (<why>)", or line when given, once a process.
local function said_once(key, why, line)
  M._said = M._said or {}
  if M._said[key] then return end
  M._said[key] = true
  require("zrun.dist").print0(line or fmt("[zrun] LoraConfig: %s has no effect in zrun (%s)", key, why))
end

local function is_default(k, v)
  local d = M.DEFAULTS[k]
  if v == nil or v == false and d == false then return true end
  if type(d) == "table" then return type(v) == "table" and next(v) == nil end
  return v == d
end

local function check_number(k, v, int, lo)
  if type(v) ~= "number" or (int and v % 1 ~= 0) or v < lo then
    error(fmt("LoraConfig: %s must be a%s number >= %s, got %s", k, int and "n integer" or "", lo, tostring(v)), 3)
  end
end

local function is_name_list(v)
  if type(v) ~= "table" then return false end
  for k, n in pairs(v) do if type(k) ~= "number" or type(n) ~= "string" then return false end end
  return true
end

-- rank_pattern / alpha_pattern: {<regex> = number}, PEFT's per-module r and lora_alpha.
local function check_patterns(c)
  for _, k in ipairs { "rank_pattern", "alpha_pattern" } do
    local v = c[k]
    if v ~= nil and type(v) ~= "table" then
      error(fmt("LoraConfig: %s must be a table { [\"<module name regex>\"] = number }, got %s", k, type(v)), 3)
    end
    for key, n in pairs(v or {}) do
      if type(key) ~= "string" then error(fmt("LoraConfig: %s's keys must be module name regexes (strings)", k), 3) end
      M.fullmatch(key, "") -- (a regex zrun's matcher refuses, refused here)
      if type(n) ~= "number" or k == "rank_pattern" and (n % 1 ~= 0 or n < 1) or n < 0 then
        error(fmt("LoraConfig: %s[\"%s\"] must be %s, got %s", k, key,
          k == "rank_pattern" and "an integer >= 1" or "a number >= 0", tostring(n)), 3)
      end
    end
  end
end

-- zr.peft.LoraConfig{r =, lora_alpha =, lora_dropout =, target_modules =, ...}: PEFT's LoraConfig, its
-- defaults (r 8, lora_alpha 8, dropout 0, bias "none", init_lora_weights true, task_type nil) and meaning.
-- target_modules: a list of module names (matched against the end of each module's dotted name), a Python
-- regex string (matched whole), "all-linear" (every Linear / Conv1D except the output layer), or nil (the
-- model's PEFT default: q_proj, v_proj for Llama, Mistral and Qwen2, c_attn for GPT-2). Also implemented:
-- exclude_modules, use_rslora (scaling lora_alpha / sqrt(r)), init_lora_weights (true, false or "gaussian"),
-- layers_to_transform / layers_pattern, fan_in_fan_out (set for Conv1D, as PEFT), inference_mode,
-- task_type (nil or "CAUSAL_LM"), rank_pattern / alpha_pattern ({<regex> = r or alpha}: PEFT's per-module
-- values), modules_to_save (modules trained whole and saved in the adapter file, e.g. {"lm_head"}) and bias
-- ("all" / "lora_only": those biases trained and saved). Fields zrun does not implement (use_dora,
-- trainable_token_indices, lora_bias, ...) are refused with what to do instead; unknown keys are refused.
function M.LoraConfig(o)
  if o ~= nil and type(o) ~= "table" then error("LoraConfig{...}: pass a table of PEFT's LoraConfig fields", 2) end
  local c = setmetatable({}, Config)
  for k, v in pairs(o or {}) do
    if M.DEFAULTS[k] == nil then
      local names = {}
      for n in pairs(M.DEFAULTS) do names[#names + 1] = n end
      local s = type(k) == "string" and require("zrun.config").suggest(k, names)
      error(fmt("LoraConfig: unknown field '%s'%s (PEFT's LoraConfig fields only)", tostring(k),
        s and fmt(" (did you mean '%s'?)", s) or ""), 2)
    end
    if v == cjson.null then v = nil end
    c[k] = v
  end
  for k, why in pairs(M.REFUSED) do
    if not is_default(k, c[k]) then error("LoraConfig: " .. why, 2) end
  end
  for k, why in pairs(M.NO_EFFECT) do
    if not is_default(k, c[k]) then said_once(k, why) end
  end
  if c.peft_type ~= nil and c.peft_type ~= "LORA" then
    error(fmt("LoraConfig: peft_type %s: zrun implements LoRA only (peft_type \"LORA\")", tostring(c.peft_type)), 2)
  end
  if c.bias ~= nil and c.bias ~= "none" and c.bias ~= "all" and c.bias ~= "lora_only" then
    error(fmt("LoraConfig: bias must be \"none\", \"all\" or \"lora_only\" (PEFT's), got %s", tostring(c.bias)), 2)
  end
  if c.task_type and not TASK_TYPES[c.task_type] then
    error(fmt("LoraConfig: task_type \"%s\" is not implemented in zrun (causal LMs only): use task_type = \"CAUSAL_LM\" " ..
      "or leave it unset", tostring(c.task_type)), 2)
  end
  for k, v in pairs(M.DEFAULTS) do if c[k] == nil and type(v) ~= "table" and v ~= false then c[k] = v end end
  check_number("r", c.r, true, 1)
  check_number("lora_alpha", c.lora_alpha, false, 0)
  if type(c.lora_dropout) ~= "number" or c.lora_dropout < 0 or c.lora_dropout >= 1 then
    error(fmt("LoraConfig: lora_dropout must be a number in [0, 1), got %s", tostring(c.lora_dropout)), 2)
  end
  local ilw = c.init_lora_weights
  if ilw ~= true and ilw ~= false and ilw ~= "gaussian" then
    error(fmt("LoraConfig: init_lora_weights %s is not implemented in zrun: use true (PEFT's default: A as nn.Linear, " ..
      "B zero), \"gaussian\" or false", type(ilw) == "string" and ("\"" .. ilw .. "\"") or tostring(ilw)), 2)
  end
  local tm = c.target_modules
  if tm ~= nil and type(tm) ~= "string" and type(tm) ~= "table" then
    error("LoraConfig: target_modules must be a list of module names, a regex string or \"all-linear\"", 2)
  end
  check_patterns(c)
  if c.modules_to_save and not is_name_list(c.modules_to_save) then
    error("LoraConfig: modules_to_save must be a list of module names (e.g. { \"lm_head\" })", 2)
  end
  if c.layers_pattern and not c.layers_to_transform then
    error("LoraConfig: layers_pattern is read with layers_to_transform only (PEFT refuses it too): set both", 2)
  end
  for _, lp in ipairs(type(c.layers_pattern) == "table" and c.layers_pattern or { c.layers_pattern or nil }) do
    if type(lp) ~= "string" or lp:find("[^%w_%.]") then
      error(fmt("LoraConfig: layers_pattern %s: zrun takes the name of the layer list as it is (\"layers\", \"h\"), " ..
        "not a regex; give that name", tostring(lp)), 2)
    end
  end
  if c.layers_to_transform and type(tm) == "string" then
    error("LoraConfig: layers_to_transform does not apply to a regex target_modules (PEFT refuses it too): put the " ..
      "layer numbers in the regex, or list module names", 2)
  end
  return c
end

-- Whether v is a LoraConfig (zr.peft.LoraConfig's result).
function M.is_config(v) return getmetatable(v) == Config end

-- The config as adapter_config.json holds it (PEFT's to_dict: every field, None as null, sets as lists).
function Config:to_dict()
  local out = {}
  for k, d in pairs(M.DEFAULTS) do
    local v = self[k]
    if v == nil then v = d end
    if v == false and not BOOLEAN[k] then v = cjson.null end
    out[k] = v
  end
  out.runtime_config = nil -- (PEFT leaves it out of the file)
  if type(out.target_modules) == "table" then
    local l = {}
    for _, n in ipairs(out.target_modules) do l[#l + 1] = n end
    sort(l)
    out.target_modules = l
  end
  return out
end

-- ---------- the LoRA module ----------

-- LoraLayer: a Linear (W (out, in)) or Conv1D (W (in, out): PEFT's fan_in_fan_out) whose weight and bias
-- stay its own parameters under their names (frozen), plus trainable lora_A (r, in) and lora_B (out, r):
-- forward(x) = base(x) + lora_B(lora_A(dropout(x))) * scaling. The module it replaced is kept to put back.
local Lora = Module:extend("LoraLayer")
M.LoraLayer = Lora

-- A LoRA layer's plain fields (not parameters): the module it wraps, its shape, rank, alpha, PEFT's scaling
-- (lora_alpha / r, or / sqrt(r) with use_rslora) and dropout.
local function set_fields(self, base, conv1d, nin, nout, r, alpha, cfg, dropout)
  rawset(self, "base_layer", base)
  rawset(self, "conv1d", conv1d)
  rawset(self, "in_features", nin)
  rawset(self, "out_features", nout)
  rawset(self, "r", r)
  rawset(self, "lora_alpha", alpha)
  rawset(self, "scaling", cfg.use_rslora and alpha / math.sqrt(r) or alpha / r)
  rawset(self, "lora_dropout", dropout)
end

-- LoraLayer(base, conv1d, cfg [, r, alpha]): the adapter around base (an nn.Linear, or a Conv1D when conv1d) with
-- rank r and lora_alpha alpha (default cfg's: rank_pattern / alpha_pattern give others), cfg's use_rslora,
-- lora_dropout and init_lora_weights; lora_A / lora_B in the base weight's dtype and device.
function Lora:__init(base, conv1d, cfg, r, alpha)
  r, alpha = r or cfg.r, alpha or cfg.lora_alpha
  local w = base.weight
  local nin, nout = w:size(conv1d and 1 or 2), w:size(conv1d and 2 or 1)
  self.weight = w
  if base.bias then self.bias = base.bias end
  local td = { bias = false, dtype = w:dtype(), device = w:device() }
  self.lora_A = nn.Linear(nin, r, td)
  self.lora_B = nn.Linear(r, nout, td)
  zr.no_grad(function()
    if cfg.init_lora_weights == true then init.kaiming_uniform_(self.lora_A.weight, math.sqrt(5))
    elseif cfg.init_lora_weights == "gaussian" then init.normal_(self.lora_A.weight, 0, 1 / r) end
    if cfg.init_lora_weights ~= false then init.zeros_(self.lora_B.weight) end
  end)
  set_fields(self, base, conv1d, nin, nout, r, alpha, cfg, cfg.lora_dropout)
end

-- base(x) + lora_B(lora_A(dropout(x))) * scaling: x (..., in) -> (..., out). With the base frozen (as
-- get_peft_model leaves it) and one dtype throughout, one zr.lora_multi: the base product, the adapter's two
-- written into its output in place, the dropout mask made where it is applied (M.project). Otherwise PEFT's
-- composition: the adapter's input cast to its dtype (as PEFT's _cast_input_dtype), and its temporaries (the
-- base's output, lora_B's, the scaled copy) freed when it returns (what backward needs, the nodes keep): held
-- until the model's forward returned, they made a LoRA forward's activations larger than a full fine-tune's
-- (Llama-3-8B 4 x 1024: 25.4 against 21.6 GiB planned).
local project
function Lora:forward(x)
  if rawget(self, "disabled") then -- (M.disable_adapter: the base alone)
    if self.conv1d then return zr.conv1d(x, self.weight, self.bias) end
    return zr.linear(x, self.weight, self.bias)
  end
  local y = project(x, { self }, true)
  if y then return y end
  local scope = self:temporaries_scope()
  if self.conv1d then y = zr.conv1d(x, self.weight, self.bias) else y = zr.linear(x, self.weight, self.bias) end
  local a = x
  if self.lora_dropout > 0 and self.training then a = zr.dropout(a, self.lora_dropout, true) end
  if a:dtype() ~= self.lora_A.weight:dtype() then a = a:to(self.lora_A.weight:dtype()) end
  return (Module.end_scope(scope, y + self.lora_B(self.lora_A(a)) * self.scaling))
end

local linear_forward = nn.Linear.forward
-- Whether m (a LoraLayer, or a plain nn.Linear beside them) can run inside zr.lora_multi reading x: its base
-- frozen, its adapter's modules plain Linears without a bias, no hooks of their own, one dtype throughout.
local function fusable_part(m, x)
  local w, b, dt = m.weight, m.bias, x:dtype()
  if not w or w.requires_grad or (b and b.requires_grad) or w:dtype() ~= dt or not m:groupable() then return false end
  if not Module.isinstance(m, Lora) then return Module.isinstance(m, nn.Linear) and m.forward == linear_forward end
  local A, B = m.lora_A, m.lora_B
  return not rawget(m, "disabled") and m.forward == Lora.forward and A.forward == linear_forward and
    B.forward == linear_forward and A.bias == nil and B.bias == nil and A:groupable() and B:groupable() and
    A.weight:dtype() == dt and B.weight:dtype() == dt
end

-- mods (LoraLayers, and plain frozen Linears among them: k_proj beside adapted q_proj and v_proj) over x as
-- ONE zr.lora_multi, their outputs side by side (..., Σ out): the frozen bases one product when their weights
-- sit back to back, each adapter's products into its column block; ZeRO-3's hooks run for every module
-- around it (Module.call_group). nil when they cannot (a base trained, hooks of their own, dtypes that
-- differ, adapters with other dropout rates or training modes, no adapter at all, more than 3 modules).
-- (called: the modules' own forward hooks have run already, as from Lora:forward; only their adapters' run here)
function project(x, mods, called)
  if #mods > 3 then return nil end
  local ws, bs, As, Bs, ss, group = {}, {}, {}, {}, {}, {}
  local p, training
  for i, m in ipairs(mods) do
    if not fusable_part(m, x) or (m.bias == nil) ~= (mods[1].bias == nil) then return nil end
    ws[i], bs[i] = m.conv1d and m.weight:transpose(1, 2) or m.weight, m.bias
    if not called then group[#group + 1] = m end
    if Module.isinstance(m, Lora) then
      local pi, ti = m.training and m.lora_dropout or 0, m.training
      if p and (pi ~= p or ti ~= training) then return nil end
      p, training = pi, ti
      As[i], Bs[i], ss[i] = m.lora_A.weight, m.lora_B.weight, m.scaling
      group[#group + 1], group[#group + 2] = m.lora_A, m.lora_B
    else
      As[i], Bs[i], ss[i] = false, false, 0
    end
  end
  if p == nil then return nil end
  return Module.call_group(group, function(y)
    return zr.lora_multi(y, ws, mods[1].bias and bs or nil, As, Bs, ss, p, training)
  end, x)
end
function M.project(x, mods) return project(x, mods, false) end

-- "in_features=..., out_features=..., r=..., scaling=..."
function Lora:extra_repr()
  return fmt("in_features=%d, out_features=%d, r=%d, scaling=%g%s", self.in_features, self.out_features, self.r,
    self.scaling, self.conv1d and ", fan_in_fan_out=true" or "")
end

-- scaling * B @ A in f32, as the base weight lays it out ((out, in), or (in, out) for Conv1D).
function Lora:delta_weight()
  return zr.no_grad(function()
    local d = zr.matmul(self.lora_B.weight:to("f32"), self.lora_A.weight:to("f32")) * self.scaling
    if self.conv1d then d = d:transpose(1, 2):contiguous() end
    return d
  end)
end

-- ---------- LoRA on an embedding (PEFT's lora.Embedding) ----------

-- LoraEmbedding: an nn.Embedding (weight (V, d), frozen, kept under its name) plus trainable lora_embedding_A
-- (r, V) and lora_embedding_B (d, r), PEFT's layout and names: forward(ids) = base(ids) + A^T[ids] B^T * scaling,
-- without dropout (PEFT applies none to embeddings). A tied output head keeps reading the base weight, as in PEFT.
local LoraEmbedding = Lora:extend("LoraEmbedding")
M.LoraEmbedding = LoraEmbedding

-- LoraEmbedding(base, cfg [, r, alpha]): PEFT's init: A zero, B N(0, 1) (init_lora_weights true or "gaussian":
-- PEFT's embeddings have one init), both N(0, 1) for false.
function LoraEmbedding:__init(base, cfg, r, alpha)
  r, alpha = r or cfg.r, alpha or cfg.lora_alpha
  local w = base.weight
  local V, d = w:size(1), w:size(2)
  self.weight = w
  local td = { dtype = w:dtype(), device = w:device() }
  self.lora_embedding_A = Module.Parameter(zr.empty({ r, V }, td))
  self.lora_embedding_B = Module.Parameter(zr.empty({ d, r }, td))
  zr.no_grad(function()
    if cfg.init_lora_weights == false then init.normal_(self.lora_embedding_A, 0, 1)
    else init.zeros_(self.lora_embedding_A) end
    init.normal_(self.lora_embedding_B, 0, 1)
  end)
  set_fields(self, base, false, V, d, r, alpha, cfg, 0)
end

function LoraEmbedding:forward(ids)
  local y = zr.embedding(self.weight, ids)
  if rawget(self, "disabled") then return y end -- (M.disable_adapter)
  local a = zr.embedding(self.lora_embedding_A:transpose(1, 2):contiguous(), ids)
  local pad = rawget(self.base_layer, "padding_idx")
  -- (PEFT looks A^T up with the base's padding_idx: that row gets no gradient)
  if pad and a.requires_grad then a = zr.where(ids:eq(pad):unsqueeze(-1), a:detach(), a) end
  return y + zr.linear(a, self.lora_embedding_B) * self.scaling
end

-- "num_embeddings=..., embedding_dim=..., r=..., scaling=..."
function LoraEmbedding:extra_repr()
  return fmt("num_embeddings=%d, embedding_dim=%d, r=%d, scaling=%g", self.in_features, self.out_features, self.r,
    self.scaling)
end

-- scaling * (B @ A)^T in f32: (V, d), as the embedding's weight.
function LoraEmbedding:delta_weight()
  return zr.no_grad(function()
    return (zr.matmul(self.lora_embedding_B:to("f32"), self.lora_embedding_A:to("f32")) * self.scaling)
      :transpose(1, 2):contiguous()
  end)
end

-- ---------- get_peft_model ----------

local DEFAULT_TARGETS = { llama = { "q_proj", "v_proj" }, mistral = { "q_proj", "v_proj" },
  qwen2 = { "q_proj", "v_proj" }, qwen3 = { "q_proj", "v_proj" }, gemma3_text = { "q_proj", "v_proj" }, gpt2 = { "c_attn" } } -- (PEFT's mapping; phi3 has none in PEFT 0.21, which asks for target_modules)

local function is_conv1d(m) return m.__name == "Conv1D" and m.weight ~= nil and #m.weight:shape() == 2 end
local function is_linear(m) return Module.isinstance(m, nn.Linear) end

-- The output layer "all-linear" leaves out (transformers' get_output_embeddings): lm_head.
local function output_layer_name(model)
  for name, m in model:named_modules() do
    if m == rawget(model._modules, "lm_head") then return name end
  end
end

local function literal_pattern(s) return (s:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0")) end

-- PEFT's check_target_module_exists for one module name: exclusion, then the targets, then the layer
-- numbers (layers_to_transform: the first number in the name after a component, or after layers_pattern).
local function matches(cfg, key)
  local ex = cfg.exclude_modules
  if type(ex) == "string" then
    if M.fullmatch(ex, key) then return false end
  elseif type(ex) == "table" then
    for _, e in ipairs(ex) do if key == e or key:sub(-#e - 1) == "." .. e then return false end end
  end
  -- (PEFT never adapts a module of modules_to_save, nor one inside it)
  for _, m in ipairs(cfg.modules_to_save or {}) do
    if M.fullmatch("(^|.*\\.)" .. m .. "($|\\..*)", key) then return false end
  end
  local tm = cfg.target_modules
  if type(tm) == "string" then return M.fullmatch(tm, key) end
  local found = false
  for _, t in ipairs(tm) do
    if key == t then return true end -- (a full name: PEFT adapts it whatever layers_to_transform says)
    if key:sub(-#t - 1) == "." .. t then found = true end
  end
  local lt = cfg.layers_to_transform
  if not found or not lt or (type(lt) == "table" and #lt == 0) then return found end
  local idx
  local lp = cfg.layers_pattern
  if not lp or lp == "" or (type(lp) == "table" and #lp == 0) then
    idx = key:match("^.-%.[^.]*%.(%d+)%.")
  else
    for _, p in ipairs(type(lp) == "string" and { lp } or lp) do
      local q = literal_pattern(p)
      idx = key:match("^" .. q .. "%.(%d+)%.") or key:match("^.-%." .. q .. "%.(%d+)%.")
      if idx then break end
    end
  end
  if not idx then return false end
  idx = tonumber(idx)
  if type(lt) == "number" then return idx == lt end
  for _, v in ipairs(lt) do if v == idx then return true end end
  return false
end

-- PEFT's get_pattern_key for module name: the value of the key of cfg[field] (rank_pattern or alpha_pattern) that
-- re.match(rf"(.*\.)?({key})$", name) accepts, or nil (the config's r / lora_alpha). PEFT takes the first such key
-- in the dict's order, which a Lua table does not keep: two keys giving one module different values are refused.
local function pattern_value(cfg, field, name)
  local value, by
  for key, v in pairs(cfg[field] or {}) do
    if M.fullmatch("(.*\\.)?(" .. key .. ")", name) then
      if value ~= nil and value ~= v then
        error(fmt("get_peft_model: %s keys \"%s\" and \"%s\" both match %s with different values (PEFT takes the " ..
          "first in its dict's order); make the keys match apart", field, by, key, name), 3)
      end
      value, by = v, key
    end
  end
  return value
end

-- Whether model's output head is its input embedding (zrun's tied models have no lm_head module); and the embedding.
local function tied_embedding(model)
  local emb = model.get_input_embeddings and model:get_input_embeddings()
  return emb and not rawget(model._modules, "lm_head") and true or false, emb
end

-- PEFT's _add_modules_to_save_to_tie, for ensure_weight_tying on a tied model whose modules_to_save names an
-- embedding layer (last component embed_tokens or lm_head, PEFT's EMBEDDING_LAYER_NAMES): the embedding's full
-- name added, the names matching the tied head ("lm_head") taken out, in cfg itself as PEFT changes its config
-- (adapter_config.json shows it). The embedding then trains in place, the head with it. Returns whether it applied.
local function tie_saved(model, cfg, emb)
  local is_emb = false
  for _, n in ipairs(cfg.modules_to_save) do
    local last = n:match("[^.]+$")
    if last == "embed_tokens" or last == "lm_head" then is_emb = true end
  end
  if not is_emb then return false end
  local l, ename, has = {}, nil, false
  for name, m in model:named_modules() do if m == emb then ename = name; break end end
  for _, n in ipairs(cfg.modules_to_save) do l[#l + 1] = n; has = has or n == ename end
  if not has then l[#l + 1] = ename end
  for i, n in ipairs(l) do -- (PEFT removes the first name matching each tied key)
    if M.fullmatch("(^|.*\\.)" .. n .. "($|\\..*)", "lm_head") then table.remove(l, i); break end
  end
  cfg.modules_to_save = l
  return true
end

-- PEFT's _set_trainable for modules_to_save: {name, module} of every module whose dotted name ends with one of the
-- names (a plain suffix, as PEFT's key.endswith), trained whole and saved in the adapter file, and whether a tied
-- head trains with the embedding (tie_saved). PEFT trains a copy beside the frozen original, which
-- merge_and_unload and unload put in its place; zrun trains the module itself, which ends the same. A name that
-- matches nothing is refused (PEFT skips it). A tied embedding without ensure_weight_tying is refused: PEFT unties
-- it (a trained copy on one side), which zrun's tied models cannot hold.
local function saved_modules(model, cfg)
  local out = {}
  if #(cfg.modules_to_save or {}) == 0 then return out, false end
  local tied, emb = tied_embedding(model)
  local tied_head = tied and cfg.ensure_weight_tying and tie_saved(model, cfg, emb)
  local found = {}
  for name, m in model:named_modules() do
    local hit = false
    for _, n in ipairs(cfg.modules_to_save) do
      if name ~= "" and name:sub(-#n) == n then found[n], hit = true, true end
    end
    if hit then out[#out + 1] = { name, m } end
  end
  for _, n in ipairs(cfg.modules_to_save) do
    if not found[n] then
      error(fmt("get_peft_model: modules_to_save \"%s\" matches no module of the model%s", n, tied and
        n:match("lm_head$") and " (its output head is the tied embedding: zrun has no lm_head module; set " ..
        "ensure_weight_tying = true to train the embedding and the head as one, or leave lm_head out)" or
        "; check the name"), 3)
    end
  end
  for _, sm in ipairs(out) do
    if tied and sm[2] == emb and not tied_head then
      error(fmt("get_peft_model: modules_to_save %s: the embedding is tied to the output head; PEFT would train an " ..
        "untied copy of one side, which zrun does not make: set ensure_weight_tying = true (PEFT's option: the " ..
        "embedding and the head trained as one) or train without modules_to_save", sm[1]), 3)
    end
  end
  return out, tied_head
end

-- ensure_weight_tying where it does not apply: a LoRA on a tied embedding named as PEFT recognises embeddings
-- (embed_tokens; PEFT then adapts the tied head with the same adapter, which zrun does not) refused; nothing
-- tied to keep, said (PEFT warns; GPT-2's wte is not such a name, so PEFT ties nothing for it either).
local function check_weight_tying(model, cfg, targets, tied_head)
  if not cfg.ensure_weight_tying or tied_head then return end
  local tied, emb = tied_embedding(model)
  for _, t in ipairs(targets) do
    local last = t[1]:match("[^.]+$")
    if tied and t[2] == emb and (last == "embed_tokens" or last == "lm_head") then
      error(fmt("get_peft_model: ensure_weight_tying with a LoRA on the tied embedding %s (PEFT adapts the output head " ..
        "with the same adapter) is not implemented in zrun; leave ensure_weight_tying false (the head keeps the base " ..
        "weight) or target the embedding through modules_to_save", t[1]), 3)
    end
  end
  said_once("ensure_weight_tying", nil, "[zrun] get_peft_model: ensure_weight_tying has no effect here: no tied " ..
    "embedding in modules_to_save (PEFT warns the same)")
end

-- {name, parameter} of the biases bias = "all" / "lora_only" trains (PEFT's _mark_only_adapters_as_trainable:
-- every parameter whose name holds "bias", or the LoRA layers' base biases), in module order.
local function trained_biases(model, cfg)
  local out = {}
  if cfg.bias == "all" then
    for name, p in model:named_parameters() do if name:find("bias", 1, true) then out[#out + 1] = { name, p } end end
  elseif cfg.bias == "lora_only" then
    for _, l in ipairs(M.lora_layers(model)) do
      if l[2].bias then out[#out + 1] = { l[1] .. ".bias", l[2].bias } end
    end
  end
  return out
end

-- Puts module m in place of the child at dotted name (its parent's field, or a ModuleList entry).
local function replace(model, name, m)
  local parent, leaf = model, name
  local dot = name:match("^.*()%.")
  if dot then
    local pname = name:sub(1, dot - 1)
    leaf = name:sub(dot + 1)
    for n, mod in model:named_modules() do if n == pname then parent = mod; break end end
  end
  parent:add_module(leaf, m)
  local i = tonumber(leaf)
  if i and rawget(parent, i + 1) then rawset(parent, i + 1, m) end
end

-- Whether model carries a LoRA adapter (get_peft_model's or from_pretrained's result).
function M.is_peft_model(model) return type(model) == "table" and rawget(model, "peft_config") ~= nil end

-- Copies a config (the model keeps its own: target_modules becomes the names matched, as PEFT's does).
local function copy_config(cfg)
  local c = setmetatable({}, Config)
  for k, v in pairs(cfg) do
    if type(v) == "table" then
      local t = {}
      for kk, vv in pairs(v) do t[kk] = vv end
      v = t
    end
    c[k] = v
  end
  return c
end

-- zr.peft.get_peft_model(model, config): PEFT's get_peft_model on a zrun causal LM. Freezes every
-- parameter, then puts a LoraLayer in place of each module config.target_modules names (nn.Linear, or
-- GPT-2's Conv1D; a LoraEmbedding for an nn.Embedding); the base weights keep their names
-- ("model.layers.0.self_attn.q_proj.weight") and each LoraLayer adds lora_A and lora_B (trainable unless
-- config.inference_mode). Returns the same model, with
-- model.peft_config (the config, target_modules resolved to the matched names' last components when
-- "all-linear"), model:print_trainable_parameters(), model:get_nb_trainable_parameters(),
-- model:save_pretrained(dir) (the adapter, as PEFT), model:merge_and_unload(), model:unload(),
-- model:disable_adapter(fn) and model:get_base_model().
function M.get_peft_model(model, config, adapter_name)
  if not (type(model) == "table" and Module.is_module(model)) then
    error("get_peft_model: model must be an nn.Module (a zrun causal LM)", 2)
  end
  if not M.is_config(config) then error("get_peft_model: config must be a zr.peft.LoraConfig{...}", 2) end
  if adapter_name ~= nil and adapter_name ~= "default" then
    error(fmt("get_peft_model: adapter \"%s\": zrun holds one adapter, named \"default\"; leave adapter_name unset",
      tostring(adapter_name)), 2)
  end
  if M.is_peft_model(model) then
    error("get_peft_model: this model already has a LoRA adapter; merge_and_unload it first (or train that adapter)", 2)
  end
  local cfg = copy_config(config)
  local tm = cfg.target_modules
  local mtype = model.config and model.config.model_type
  if tm == nil then
    tm = DEFAULT_TARGETS[mtype]
    if not tm then
      error(fmt("get_peft_model: no default target_modules for model_type %s: set LoraConfig's target_modules",
        tostring(mtype)), 2)
    end
    cfg.target_modules = { unpack(tm) }
  elseif type(tm) == "string" and tm:lower() == "all-linear" then
    local head, set, names = output_layer_name(model), {}, {}
    for name, m in model:named_modules() do
      if name ~= head and name ~= "" and (is_linear(m) or is_conv1d(m)) then set[name] = true end
    end
    for n in pairs(set) do names[#names + 1] = n:match("[^.]+$") end
    -- (PEFT keeps the full names and matches them by suffix; their last components match the same modules
    -- unless the head shares a last component with another module, which zrun's models never do)
    local uniq, seen = {}, {}
    for _, n in ipairs(names) do if not seen[n] then seen[n] = true; uniq[#uniq + 1] = n end end
    sort(uniq)
    cfg.target_modules = uniq
    if #uniq == 0 then
      error("get_peft_model: target_modules \"all-linear\": this model has no Linear or Conv1D module", 2)
    end
    if head and seen[head:match("[^.]+$")] then
      error("get_peft_model: \"all-linear\" cannot leave out the output layer here (another module shares its name); " ..
        "list target_modules", 2)
    end
  end
  local saved, tied_head = saved_modules(model, cfg) -- (first: ensure_weight_tying may add to modules_to_save)
  local targets = {}
  for name, m in model:named_modules() do
    if name ~= "" and matches(cfg, name) then
      if not (is_linear(m) or is_conv1d(m) or Module.isinstance(m, nn.Embedding)) then
        error(fmt("get_peft_model: target module %s is a %s: zrun's LoRA adapts nn.Linear, Conv1D and Embedding " ..
          "modules only (not norms); leave it out of target_modules", name, tostring(m.__name)), 2)
      end
      targets[#targets + 1] = { name, m }
    end
  end
  if #targets == 0 and type(cfg.target_modules) == "string" then
    error(fmt("get_peft_model: target_modules \"%s\" matches no module: a string is a regex matched against the whole " ..
      "dotted name (PEFT's re.fullmatch); pass a list { \"%s\" } to match names by their end, or a regex like \".*%s\"",
      cfg.target_modules, cfg.target_modules, cfg.target_modules), 2)
  end
  if #targets == 0 then
    local shown = type(cfg.target_modules) == "table" and concat(cfg.target_modules, ", ") or cfg.target_modules
    error(fmt("get_peft_model: target modules {%s} not found in the base model; check the names (e.g. " ..
      "model.layers.0.self_attn.q_proj matches \"q_proj\")%s", tostring(shown), cfg.modules_to_save and
      " and modules_to_save (PEFT adapts no module inside one of them)" or ""), 2)
  end
  check_weight_tying(model, cfg, targets, tied_head)
  model:requires_grad_(false)
  for _, t in ipairs(targets) do
    local r, alpha = pattern_value(cfg, "rank_pattern", t[1]), pattern_value(cfg, "alpha_pattern", t[1])
    if Module.isinstance(t[2], nn.Embedding) then replace(model, t[1], LoraEmbedding(t[2], cfg, r, alpha))
    else
      -- (PEFT sets fan_in_fan_out for each target as its weight lies, Conv1D's (in, out), with a warning when it
      -- changes it; the config keeps the last one's)
      local conv = is_conv1d(t[2])
      if (cfg.fan_in_fan_out and true or false) ~= conv then
        said_once("fan_in_fan_out=" .. tostring(conv), nil, fmt("[zrun] get_peft_model: fan_in_fan_out set to %s " ..
          "for %s modules (as PEFT does: their weight is stored %s)", tostring(conv), conv and "Conv1D" or "Linear",
          conv and "(in, out)" or "(out, in)"))
        cfg.fan_in_fan_out = conv
      end
      replace(model, t[1], Lora(t[2], conv, cfg, r, alpha))
    end
  end
  if cfg.inference_mode then
    for _, l in ipairs(M.lora_layers(model)) do l[2]:requires_grad_(false) end
  else
    for _, sm in ipairs(saved) do sm[2]:requires_grad_(true) end
  end
  -- (PEFT's _mark_only_adapters_as_trainable; inference_mode does not freeze these biases in PEFT either)
  for _, b in ipairs(trained_biases(model, cfg)) do b[2].requires_grad = true end
  rawset(model, "peft_config", cfg)
  rawset(model, "peft_modules_to_save", saved)
  rawset(model, "peft_tied_head", tied_head or nil)
  rawset(model, "print_trainable_parameters", M.print_trainable_parameters)
  rawset(model, "get_nb_trainable_parameters", M.get_nb_trainable_parameters)
  rawset(model, "save_pretrained", M.save_pretrained)
  rawset(model, "merge_and_unload", M.merge_and_unload)
  rawset(model, "unload", M.unload)
  rawset(model, "disable_adapter", M.disable_adapter)
  rawset(model, "get_base_model", M.get_base_model)
  return model
end

-- List of {name, LoraLayer} of model, in module order.
function M.lora_layers(model)
  local out = {}
  for name, m in model:named_modules() do if Module.isinstance(m, Lora) then out[#out + 1] = { name, m } end end
  return out
end

-- trainable, all: the parameter element counts (tied weights once), as PEFT's get_nb_trainable_parameters.
-- modules_to_save count twice in all, as in PEFT, which keeps each frozen original beside its trained copy.
function M.get_nb_trainable_parameters(model)
  local originals = 0
  for _, sm in ipairs(rawget(model, "peft_modules_to_save") or {}) do originals = originals + sm[2]:num_parameters() end
  return model:num_parameters(true), model:num_parameters() + originals
end

local commas = require("zrun.memory_describe").commas -- (1234567 -> "1,234,567")
-- PEFT's print_trainable_parameters line: "trainable params: N || all params: M || trainable%: P"; also returns it.
function M.print_trainable_parameters(model)
  local t, a = M.get_nb_trainable_parameters(model)
  local line = fmt("trainable params: %s || all params: %s || trainable%%: %.4f", commas(t), commas(a), 100 * t / a)
  require("zrun.dist").print0(line)
  return line
end

-- ---------- files ----------

local function join(a, b) return (a:gsub("/+$", "")) .. "/" .. b end

-- name -> tensor of the adapter as PEFT saves it: "base_model.model.<module>.lora_A.weight" (the adapter
-- name "default" left out), detached, in the parameters' dtype; the modules of modules_to_save under their
-- own names ("base_model.model.lm_head.weight") and the biases bias = "all" / "lora_only" trains (a LoRA
-- layer's as "<module>.base_layer.bias", PEFT's name for it).
function M.adapter_state_dict(model)
  local sd = {}
  local lora = {}
  for _, l in ipairs(M.lora_layers(model)) do
    local pre = "base_model.model." .. l[1]
    if Module.isinstance(l[2], LoraEmbedding) then -- (PEFT's names: bare parameters, no ".weight")
      sd[pre .. ".lora_embedding_A"] = l[2].lora_embedding_A:detach()
      sd[pre .. ".lora_embedding_B"] = l[2].lora_embedding_B:detach()
    else
      sd[pre .. ".lora_A.weight"] = l[2].lora_A.weight:detach()
      sd[pre .. ".lora_B.weight"] = l[2].lora_B.weight:detach()
    end
    lora[l[1] .. ".bias"] = l[1] .. ".base_layer.bias"
  end
  for _, sm in ipairs(rawget(model, "peft_modules_to_save") or {}) do
    for n, p in sm[2]:named_parameters() do sd["base_model.model." .. sm[1] .. "." .. n] = p:detach() end
  end
  if rawget(model, "peft_tied_head") then -- (PEFT saves the tied head's copy too: the same tensor)
    sd["base_model.model.lm_head.weight"] = model:get_input_embeddings().weight:detach()
  end
  for _, b in ipairs(trained_biases(model, model.peft_config)) do
    sd["base_model.model." .. (lora[b[1]] or b[1])] = b[2]:detach()
  end
  return sd
end

local PARENT_LIBRARY = { llama = "transformers.models.llama.modeling_llama",
  mistral = "transformers.models.mistral.modeling_mistral", qwen2 = "transformers.models.qwen2.modeling_qwen2",
  phi3 = "transformers.models.phi3.modeling_phi3",
  qwen3 = "transformers.models.qwen3.modeling_qwen3",
  gemma3_text = "transformers.models.gemma3.modeling_gemma3",
  gpt2 = "transformers.models.gpt2.modeling_gpt2" }

-- PEFT's list of adapter names (selected_adapters, adapter_names): unset or {"default"}, the one zrun holds.
local function only_default(what, names)
  if names ~= nil and not (type(names) == "table" and #names == 1 and names[1] == "default" and next(names, 1) == nil) then
    error(what .. ': zrun holds one adapter, named "default"; pass {"default"} or leave it unset', 3)
  end
end

local EMBEDDING_NAMES = { "embed_tokens", "lm_head" } -- (PEFT's EMBEDDING_LAYER_NAMES)

-- Whether the config targets an embedding layer as PEFT's get_peft_model_state_dict decides it: a list naming
-- "embed_tokens" or "lm_head", or a regex matching a module so named.
local function embedding_targeted(model, cfg)
  local tm = cfg.target_modules
  if type(tm) == "table" then
    for _, t in ipairs(tm) do for _, e in ipairs(EMBEDDING_NAMES) do if t == e then return true end end end
    return false
  end
  for name in model:named_modules() do
    for _, e in ipairs(EMBEDDING_NAMES) do
      if (name == e or name:sub(-#e - 1) == "." .. e) and M.fullmatch(tm, name) then return true end
    end
  end
  return false
end

-- The base weights PEFT's save_embedding_layers adds to the adapter file (true, or "auto" when an embedding layer
-- is targeted; zrun never resizes the vocabulary, PEFT's other "auto" case): of the input and output embeddings,
-- the LoRA-adapted ones' "<name>.base_layer.weight" when an embedding is targeted, else their weights as named.
local function embedding_layers(model, sd, mode)
  local targeted = embedding_targeted(model, model.peft_config)
  if mode == "auto" then mode = targeted end
  if not mode then return end
  local emb = model.get_input_embeddings and model:get_input_embeddings()
  local layers = { [emb or false] = true, [rawget(model._modules, "lm_head") or false] = true }
  for name, m in model:named_modules() do
    if layers[m] then
      if Module.isinstance(m, Lora) then sd["base_model.model." .. name .. ".base_layer.weight"] = m.weight:detach()
      elseif not targeted then
        for n, p in m:named_parameters() do sd["base_model.model." .. name .. "." .. n] = p:detach() end
      end
    end
  end
end

-- zr.peft.save_pretrained(model, dir [, opts]): PEFT's PeftModel.save_pretrained: dir/adapter_model.safetensors (the
-- adapter's tensors, adapter_state_dict's names and dtype) and dir/adapter_config.json (every LoraConfig
-- field, inference_mode true, base_model_name_or_path: the path or hub id from_pretrained read the base from,
-- as PEFT, auto_mapping without a task_type). Returns the list of files written. opts (PEFT's keyword
-- arguments): is_main_process (false: nothing written, {} returned), selected_adapters (only {"default"}),
-- safe_serialization (only true: zrun writes safetensors), save_embedding_layers ("auto", PEFT's default: the
-- base weights of the embedding layers LoRA adapts written too, as PEFT; true; false); any other key is refused.
function M.save_pretrained(model, dir, opts)
  opts = require("zrun.kwargs").check("peft.save_pretrained", opts,
    { "is_main_process", "selected_adapters", "safe_serialization", "save_embedding_layers" })
  local sel = opts.save_embedding_layers
  if sel == nil then sel = "auto" end
  if sel ~= "auto" and type(sel) ~= "boolean" then
    error("peft.save_pretrained: save_embedding_layers must be \"auto\", true or false (PEFT's)", 2)
  end
  if not M.is_peft_model(model) then
    error("peft.save_pretrained: the model has no LoRA adapter (get_peft_model first)", 2)
  end
  if type(dir) ~= "string" or dir == "" then error("peft.save_pretrained: expected a directory path", 2) end
  if opts.safe_serialization == false then
    error("peft.save_pretrained: safe_serialization = false (adapter_model.bin): zrun writes safetensors only", 2)
  end
  only_default("peft.save_pretrained: selected_adapters", opts.selected_adapters)
  if opts.is_main_process == false then return {} end
  local C = zr._C
  C.makedirs(dir)
  local sd = M.adapter_state_dict(model)
  embedding_layers(model, sd, sel)
  C.save_safetensors(join(dir, "adapter_model.safetensors"), sd, { format = "pt" })
  local cfg = model.peft_config
  local d = cfg:to_dict()
  d.inference_mode = true
  local mc = model.config or {}
  if d.base_model_name_or_path == cjson.null then
    -- (PEFT's: the base's name_or_path, the string from_pretrained was given; AutoPeftModelForCausalLM loads it)
    local nop = rawget(model, "name_or_path")
    d.base_model_name_or_path = type(nop) == "string" and nop or mc._name_or_path or mc.name_or_path or cjson.null
  end
  if not cfg.task_type then
    d.auto_mapping = { base_model_class = model.__name,
      parent_library = PARENT_LIBRARY[mc.model_type] or "transformers" }
  end
  C.write_file_atomic(join(dir, "adapter_config.json"), require("zrun.hf").encode_json(d, { lora_dropout = true }, 2))
  return { "adapter_model.safetensors", "adapter_config.json" }
end

-- zr.peft.from_pretrained(model, dir [, {is_trainable = false}]): PEFT's PeftModel.from_pretrained: reads
-- dir/adapter_config.json (peft_type "LORA" only), applies get_peft_model with it and reads
-- dir/adapter_model.safetensors into the adapter (every key must match a LoRA weight of the model, with its
-- shape, or a base weight PEFT saved beside it, "lm_head.base_layer.weight" or "model.embed_tokens.weight",
-- which is read into the base as PEFT does). is_trainable false (PEFT's default): the adapter is frozen too
-- (inference_mode). Also PEFT's adapter_name (only "default") and low_cpu_mem_usage (no effect: zrun reads the
-- file into the adapter made for it either way). Returns the model.
function M.from_pretrained(model, dir, opts)
  opts = require("zrun.kwargs").check("peft.from_pretrained", opts, { "is_trainable", "adapter_name", "low_cpu_mem_usage" })
  if opts.adapter_name ~= nil and opts.adapter_name ~= "default" then
    error(fmt("peft.from_pretrained: adapter_name \"%s\": zrun holds one adapter, named \"default\"; leave it unset",
      tostring(opts.adapter_name)), 2)
  end
  if opts.low_cpu_mem_usage then -- (said, not taken in silence)
    require("zrun.dist").print0("[zrun] peft.from_pretrained: low_cpu_mem_usage has no effect in zrun (the file is read " ..
      "into the adapter made for it, without a second copy)")
  end
  local C = zr._C
  local cpath, wpath = join(dir, "adapter_config.json"), join(dir, "adapter_model.safetensors")
  if C.path_type(cpath) ~= "file" then
    error(fmt("peft.from_pretrained: no adapter_config.json in %s (a PEFT adapter directory holds it)", dir), 2)
  end
  local f = assert(io.open(cpath, "rb"))
  local ok, d = pcall(require("cjson").decode, f:read("*a"))
  f:close()
  if not ok or type(d) ~= "table" then error(fmt("peft.from_pretrained: %s is not valid JSON", cpath), 2) end
  if d.peft_type ~= "LORA" then
    error(fmt("peft.from_pretrained: %s has peft_type %s; zrun loads LoRA adapters only (peft_type \"LORA\")", cpath,
      tostring(d.peft_type)), 2)
  end
  local o, dropped = {}, {}
  for k, v in pairs(d) do
    if M.DEFAULTS[k] == nil then dropped[#dropped + 1] = k
    elseif v ~= cjson.null then o[k] = v end
  end
  if #dropped > 0 then -- (PEFT too drops the fields its version does not know, with a warning)
    sort(dropped)
    require("zrun.dist").print0(fmt("[zrun] peft.from_pretrained: %s: fields zrun's LoraConfig does not know, " ..
      "not used: %s", cpath, concat(dropped, ", ")))
  end
  o.peft_version, o.auto_mapping = nil, nil
  o.inference_mode = not opts.is_trainable
  local cfg = M.LoraConfig(o)
  if type(d.target_modules) == "table" and #d.target_modules == 0 then
    error(fmt("peft.from_pretrained: %s names no target_modules", cpath), 2)
  end
  M.get_peft_model(model, cfg)
  if C.path_type(wpath) ~= "file" then
    error(fmt("peft.from_pretrained: no adapter_model.safetensors in %s (zrun reads the safetensors file PEFT writes; " ..
      "convert an adapter_model.bin with PEFT first)", dir), 2)
  end
  local own = M.adapter_state_dict(model)
  -- base weights PEFT saves beside the adapter (save_embedding_layers, "auto" when lm_head / embed_tokens is a
  -- target: "base_model.model.lm_head.base_layer.weight"): read into the model's own, as PEFT reads them
  local base = {}
  for name, p in model:named_parameters() do base["base_model.model." .. name] = p end
  local fh = C.safetensors_open(wpath)
  local info = fh:info()
  local missing, unexpected, items = {}, {}, {}
  for k in pairs(own) do if not info[k] then missing[#missing + 1] = k end end
  for k, i in pairs(info) do
    local key = k:gsub("%.default%.weight$", ".weight")
    local t = own[key] or base[(k:gsub("%.base_layer%.", "."))]
    if not t then unexpected[#unexpected + 1] = k
    elseif concat(i.shape, ",") ~= concat(t:shape(), ",") then
      fh:close()
      error(fmt("peft.from_pretrained: %s has shape (%s) in %s, the model's is (%s): the adapter was made with " ..
        "another r or base model", k, concat(i.shape, ","), wpath, concat(t:shape(), ",")), 2)
    else items[#items + 1] = { fh, k, t } end
  end
  if #missing > 0 or #unexpected > 0 then
    fh:close()
    sort(missing)
    sort(unexpected)
    error(fmt("peft.from_pretrained: %s does not match the model's adapter: missing %s; unexpected %s (an adapter of " ..
      "another model or target_modules)", wpath, #missing > 0 and concat(missing, ", ") or "none",
      #unexpected > 0 and concat(unexpected, ", ") or "none"), 2)
  end
  local lok, lerr = pcall(C.safetensors_load_into, items)
  fh:close()
  if not lok then error(lerr, 2) end
  return model
end

-- zr.peft.merge_and_unload(model [, opts]): folds each adapter into its base weight (W += scaling * B @ A, computed
-- in f32 and cast back to W's dtype) and puts the plain modules back (the fused paths of zrun's models
-- then run again, and model:save_pretrained writes a normal Hugging Face directory). The base parameters
-- stay frozen, as PEFT leaves them. Returns the model. opts (PEFT's keyword arguments): safe_merge (true:
-- PEFT's check, an error when a merged weight holds NaN or inf; zrun checks them all before merging any),
-- adapter_names (only {"default"}), progressbar (no effect: no progress bar); any other key is refused.
function M.merge_and_unload(model, opts)
  opts = require("zrun.kwargs").check("merge_and_unload", opts, { "safe_merge", "adapter_names", "progressbar" })
  if not M.is_peft_model(model) then error("merge_and_unload: the model has no LoRA adapter", 2) end
  only_default("merge_and_unload: adapter_names", opts.adapter_names)
  local layers = M.lora_layers(model)
  local function merged(m)
    return zr.no_grad(function() return (m.weight:to("f32") + m:delta_weight()):to(m.weight:dtype()) end)
  end
  if opts.safe_merge then -- (each checked before any is merged; x - x: 0 where x is finite, NaN where not)
    for _, l in ipairs(layers) do
      local w = merged(l[2])
      if not zr.no_grad(function() return (w - w):sum():item() == 0 end) then
        error(fmt("merge_and_unload: safe_merge: NaNs or infinities in %s's merged weight; the adapter seems to be " ..
          "broken (nothing merged)", l[1]), 2)
      end
    end
  end
  for _, l in ipairs(layers) do
    local m = l[2]
    zr.no_grad(function() m.weight:copy_(merged(m)) end)
    replace(model, l[1], m.base_layer)
  end
  M.unload(model)
  return model
end

local function pack(...) return { n = select("#", ...), ... } end

-- zr.peft.disable_adapter(model, fn) (model:disable_adapter(fn)): PEFT's `with model.disable_adapter():` block:
-- fn() runs with every LoRA layer computing its base alone (the base model's outputs), the adapter on again
-- after it returns or raises; returns fn's results. Refused with modules_to_save: zrun trains those modules in
-- place, where PEFT switches back to the frozen originals. With bias "all" / "lora_only" the trained biases stay
-- (PEFT warns so too).
function M.disable_adapter(model, fn)
  if not M.is_peft_model(model) then error("disable_adapter: the model has no LoRA adapter", 2) end
  if type(fn) ~= "function" then
    error("disable_adapter(model, fn): pass the block as a function (PEFT's `with model.disable_adapter():`)", 2)
  end
  if #(rawget(model, "peft_modules_to_save") or {}) > 0 then
    error("disable_adapter: the model has modules_to_save, which zrun trains in place (PEFT keeps the originals): " ..
      "no base model to switch back to; load the base again for its outputs", 2)
  end
  if model.peft_config.bias ~= "none" then
    said_once("disable_adapter_bias", nil, fmt("[zrun] disable_adapter: bias = \"%s\": the trained biases stay, so " ..
      "the outputs are not the base model's (PEFT warns the same)", model.peft_config.bias))
  end
  local layers = M.lora_layers(model)
  for _, l in ipairs(layers) do rawset(l[2], "disabled", true) end
  local r = pack(pcall(fn))
  for _, l in ipairs(layers) do rawset(l[2], "disabled", nil) end
  if not r[1] then error(r[2], 0) end
  return unpack(r, 2, r.n)
end

-- zr.peft.get_base_model(model): PEFT's get_base_model; zrun's adapted model is the base itself (its LoRA layers in
-- place), so it returns model.
function M.get_base_model(model) return model end

-- zr.peft.unload(model): the plain modules back without merging (the adapter dropped). Returns the model.
function M.unload(model)
  for _, l in ipairs(M.lora_layers(model)) do replace(model, l[1], l[2].base_layer) end
  for _, k in ipairs { "peft_config", "peft_modules_to_save", "peft_tied_head", "print_trainable_parameters", "get_nb_trainable_parameters",
    "save_pretrained", "merge_and_unload", "unload", "disable_adapter", "get_base_model" } do rawset(model, k, nil) end
  return model
end

return M
