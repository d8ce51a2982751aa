-- zrun.argparse: the command line of recipes and benchmarks, one way everywhere: key=value (or
-- --key=value, --key value), --config FILE, positional values where a script names them, --help
-- listing every option with its default; unknown keys refused with "did you mean". A recipe that
-- trains through zr.Trainer may also take any TrainingArguments key (they go into a separate table).
-- Not here: what the values mean (the script's, and zrun.trainer_args's for TrainingArguments).
--   local p = require("zrun.argparse").new("recipes/train_mlp.lua", "Trains an MLP with AdamW.")
--   p:option("epochs", 3, "passes over the data")
--   p:positional("epochs", "batch_size")        -- `zrun train_mlp.lua 5 8` as well as epochs=5
--   local opt, given = p:parse(arg)             -- given.epochs: true when the command line set it
local M = {}
local P = {}
P.__index = P
local fmt, concat = string.format, table.concat

-- A parser for `script` (its path, shown in the usage; errors name it by its file name without
-- ".lua") and `description` (a line under the usage in --help, optional). Returns the parser:
-- add options with p:option, then p:parse(arg).
function M.new(script, description)
  -- errors name the script without ".lua:" (which zrun's error printer takes for a code position)
  return setmetatable({ script = script, name = script:match("([^/]+)%.lua$") or script, description = description, list = {}, by = {}, aliases = {},
    pos = {}, targs = nil }, P)
end

-- An option with its default (its type decides how a value is read: a number default takes only
-- numbers, a boolean one true/false/1/0; nil or false means "unset" and takes anything) and one line
-- of help.
function P:option(name, default, help)
  local o = { name = name, default = default, help = help or "" }
  self.list[#self.list + 1] = o
  self.by[name] = o
  return self
end

-- A boolean option whose default may be false (`use_peft`): its value is read as HF's
-- string_to_bool reads it (true/false, yes/no, 1/0, t/f, y/n in any case), a bare --name is true and
-- --no_name false, as HfArgumentParser takes a bool field.
function P:flag(name, default, help)
  self:option(name, default or false, help)
  self.by[name].bool = true
  return self
end

-- Another name for an option (`deepspeed` for `config`); `--name VALUE` works for both. bare: the
-- alias may also stand alone (`--deepspeed --deepspeed_config ds.json`, DeepSpeed's own switch that
-- turns it on, with nothing to do here), leaving the option as it is.
function P:alias(name, target, bare)
  self.aliases[name] = target
  if bare then self.bare = self.bare or {}; self.bare[name] = true end
  return self
end

-- Names that bare values fill in order (`zrun train_mlp.lua 5 8`).
function P:positional(...) self.pos = { ... }; return self end

-- Accepts any TrainingArguments key zrun's Trainer knows, into `args` (whose entries are the
-- script's defaults for them); parse then returns it third.
function P:training_arguments(args) self.targs = args; return self end

local function show(v)
  if v == nil then return "unset" end
  if type(v) == "string" then return v == "" and '""' or v end
  return tostring(v)
end

-- HfArgumentParser's string_to_bool: the words a bool field takes (else nil).
local BOOL = { ["true"] = true, yes = true, t = true, y = true, ["1"] = true,
  ["false"] = false, no = false, f = false, n = false, ["0"] = false }
local function to_bool(v) return BOOL[v:lower()] end
M.to_bool = to_bool

-- A value without a known type: true/false in any case (Python's True/False too) are booleans, a
-- number is a number, anything else text.
local function generic(v)
  local l = v:lower()
  if l == "true" then return true elseif l == "false" then return false end
  return tonumber(v) or v
end

-- Whether option o (or, o nil, the TrainingArguments key name) is a boolean: a flag, an option whose
-- default is true, or a key transformers declares bool.
local function is_bool(self, name, o)
  if o then return o.bool or o.default == true end
  local ta = self.targs and require "zrun.trainer_args"
  return ta and (ta.BOOLEAN[name] ~= nil or ta.DEFAULTS[name] == true) or false
end

-- Reads one value for option o (or a TrainingArguments key when o is nil).
local function convert(self, name, o, v)
  local d = o and o.default
  if is_bool(self, name, o) then
    local b = to_bool(v)
    if b == nil then error(fmt("%s: %s must be true or false, got '%s'", self.name, name, v), 0) end
    return b
  elseif type(d) == "number" then
    local n = tonumber(v)
    if not n then error(fmt("%s: %s must be a number, got '%s'", self.name, name, v), 0) end
    return n
  elseif type(d) == "string" then
    return v
  end
  return generic(v)
end

-- Appends words to lines, two spaces in, at most 100 columns a line.
local function wrap(lines, words)
  local cur = " "
  for _, w in ipairs(words) do
    if #cur + 1 + #w > 100 and cur ~= " " then lines[#lines + 1] = cur; cur = " " end
    cur = cur .. " " .. w
  end
  if cur ~= " " then lines[#lines + 1] = cur end
end

function P:help_text()
  local lines = {}
  local usage = { "usage: zrun " .. self.script }
  for _, n in ipairs(self.pos) do usage[#usage + 1] = "[" .. n:upper() .. "]" end
  if self.by.config then usage[#usage + 1] = "[--config FILE]" end
  usage[#usage + 1] = "[key=value ...]"
  lines[1] = concat(usage, " ")
  if self.description then lines[#lines + 1] = self.description end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "options (key=value, --key=value or --key value; default in brackets):"
  local w = 0
  for _, o in ipairs(self.list) do w = math.max(w, #o.name) end
  for _, o in ipairs(self.list) do
    local al = {}
    for a, t in pairs(self.aliases) do if t == o.name then al[#al + 1] = a end end
    table.sort(al)
    lines[#lines + 1] = fmt("  %-" .. w .. "s  %s%s [%s]", o.name, o.help, #al > 0 and (" (also " .. concat(al, ", ") .. ")")
      or "", show(o.default))
  end
  if self.targs then
    local ta = require "zrun.trainer_args"
    local mine, rest = {}, {}
    for k, v in pairs(self.targs) do mine[#mine + 1] = k .. "=" .. show(v) end
    for k, v in pairs(ta.DEFAULTS) do
      if self.targs[k] == nil and not self.by[k] then rest[#rest + 1] = k .. "=" .. show(v) end
    end
    table.sort(mine)
    table.sort(rest)
    lines[#lines + 1] = ""
    lines[#lines + 1] = "TrainingArguments (Hugging Face's names), this script's defaults:"
    wrap(lines, mine)
    lines[#lines + 1] = "and the Trainer's for the others:"
    wrap(lines, rest)
  end
  return concat(lines, "\n")
end

local function all_names(self)
  local names = {}
  for n in pairs(self.by) do names[#names + 1] = n end
  for n in pairs(self.aliases) do names[#names + 1] = n end
  if self.targs then
    for n in pairs(require("zrun.trainer_args").DEFAULTS) do names[#names + 1] = n end
  end
  return names
end

local function unknown(self, k)
  local s = require("zrun.config").suggest(k, all_names(self))
  local own = {}
  for _, o in ipairs(self.list) do own[#own + 1] = o.name end
  return fmt("%s: unknown option '%s'%s: it takes %s%s (--help lists them with their defaults)", self.name, k,
    s and (" (did you mean '" .. s .. "'?)") or "", concat(own, ", "),
    self.targs and ", or any TrainingArguments key the Trainer implements" or "")
end

-- DeepSpeed's launcher appends --local_rank=N to each process's command line (as torch.distributed.launch
-- did, spelt --local-rank): the rank it also puts in LOCAL_RANK, where zrun takes the process's GPU
-- from. Taken when the two agree (transformers' TrainingArguments.local_rank, which the environment
-- overrides there too); without a launcher only 0 or -1 (one process, as zrun runs it).
local function launcher_local_rank(self, v)
  local n, env = tonumber(v), require("zrun.dist").env_local_rank()
  if n and (n == (env or 0) or (n == -1 and not env)) then return end
  error(fmt("%s: --local_rank=%s %s; zrun takes each process's GPU from the launcher's LOCAL_RANK (run under " ..
    "deepspeed, torchrun or mpirun, or pick the GPU with CUDA_VISIBLE_DEVICES)", self.name, v,
    env and fmt("disagrees with the launcher's LOCAL_RANK=%d", env) or "without a launcher"), 0)
end

-- Parses argv (the script's `arg`): returns opt (every option, defaults filled in), given (the
-- names the command line set) and, with training_arguments, the args table updated in place.
-- --help / -h prints help_text() and exits.
function P:parse(argv)
  argv = argv or {}
  local opt, given = {}, {}
  for _, o in ipairs(self.list) do opt[o.name] = o.default end
  local ta = self.targs and require "zrun.trainer_args"
  local function set(k, v, raw)
    k = self.aliases[k] or k
    local o = self.by[k]
    if o then
      if raw then opt[k] = v else opt[k] = convert(self, k, o, v) end
    elseif ta and (ta.DEFAULTS[k] ~= nil or ta.NO_EFFECT[k] or ta.RENAMED[k]) then
      if raw then self.targs[k] = v else self.targs[k] = convert(self, k, nil, v) end -- zrun.trainer_args checks it (and names a renamed key)
    else
      error(unknown(self, k), 0)
    end
    given[k] = true
  end
  local function known(k)
    k = self.aliases[k] or k
    return self.by[k] or (ta and (ta.DEFAULTS[k] ~= nil or ta.NO_EFFECT[k]))
  end
  local npos, i = 0, 1
  while i <= #argv do
    local a = argv[i]
    if a == "--help" or a == "-h" then -- (under mpirun, rank 0 prints it)
      local r = tonumber(os.getenv("OMPI_COMM_WORLD_RANK") or os.getenv("PMIX_RANK") or os.getenv("PMI_RANK") or
        os.getenv("SLURM_PROCID") or "0")
      if r == 0 then print(self:help_text()) end
      os.exit(0)
    end
    local k, v = a:match("^%-%-([%w_%-]+)=(.*)$")
    if not k then k, v = a:match("^([%w_]+)=(.*)$") end
    if k and k:gsub("-", "_") == "local_rank" and not known("local_rank") then
      launcher_local_rank(self, v)
    elseif k then
      set((k:gsub("-", "_")), v)
    elseif a:match("^%-%-[%w_%-]+$") then
      k = (a:sub(3):gsub("-", "_"))
      if k == "local_rank" and not known(k) and argv[i + 1] then
        launcher_local_rank(self, argv[i + 1])
        i = i + 2
        goto next
      end
      local nxt = argv[i + 1]
      local alone = nxt == nil or nxt:match("^%-%-") or nxt:find("=", 1, true)
      local neg = not known(k) and k:match("^no_(.+)$")
      if neg and known(neg) and is_bool(self, self.aliases[neg] or neg, self.by[self.aliases[neg] or neg]) then
        set(neg, false, true) -- HfArgumentParser's --no_<flag> for a boolean
        goto continue
      end
      if not known(k) then error(unknown(self, k), 0) end
      local o = self.by[self.aliases[k] or k]
      -- (an option whose default is false for "unset", --tokenizer or --save_total_limit, is not a boolean: alone it
      -- needs a value, as argparse's nargs=None field says)
      local kv = nxt and nxt:match("^([%w_]+)=") -- (a key=value after it: `--tokenizer max_steps=1` has no value)
      if self.bare and self.bare[k] and alone then -- (DeepSpeed's switch on: the option stays as it is)
      elseif (is_bool(self, self.aliases[k] or k, o) or (not o and ta.BARE_TRUE[k])) and alone then
        set(k, true, true) -- a bare --flag is true, as in HF's scripts
      elseif nxt == nil or nxt:match("^%-%-") or (kv and known(kv)) then -- (never an option's name taken for a value)
        error(fmt("%s: %s needs a value (%s VALUE or %s=VALUE)", self.name, a, a, a), 0)
      else
        set(k, nxt)
        i = i + 1
      end
    elseif a:sub(1, 1) ~= "-" and npos < #self.pos then
      npos = npos + 1
      set(self.pos[npos], a)
    else
      -- a second value after `--name VALUE` for a list option (HfArgumentParser's space-separated lists): say how
      -- zrun takes a list
      local prev, pv = argv[i - 2], argv[i - 1]
      local pk = prev and pv and a:sub(1, 1) ~= "-" and not pv:find("=", 1, true) and prev:match("^%-%-([%w_%-]+)$")
      local po = pk and self.by[self.aliases[pk] or pk]
      if po and po.help:find("comma%-separated") then
        error(fmt("%s: unknown argument '%s' after --%s %s: zrun takes a list as one comma-separated value " ..
          "(--%s %s,%s)", self.name, a, pk, pv, pk, pv, a), 0)
      end
      if a:match("^[%w_]+$") and known(a) then -- (`max_steps 10` or `max_steps = 10`: the shell split one word)
        error(fmt("%s: %s needs its value in the same word: %s=VALUE, with no spaces around the =", self.name, a, a), 0)
      end
      error(fmt("%s: unknown argument '%s' (use key=value%s; --help lists the options)", self.name, a,
        self.by.config and " or --config FILE" or ""), 0)
    end
    ::continue::
    i = i + 1
    ::next::
  end
  return opt, given, self.targs
end

return M
