-- The Trainer's checkpoint folders, as Hugging Face's Trainer lays them out:
--   output_dir/checkpoint-<step>/            one per save (save_strategy, save_steps)
--     latest, global_step<step>/...         the engine's DeepSpeed-style checkpoint (zrun.checkpoint)
--     config.json, model.safetensors, ...   the model as trainer:save_model writes it
--     trainer_state.json                    global_step, epoch, log_history, best_*; written last,
--                                           so a folder without it is an interrupted save
-- plus finding the latest one, resolving resume_from_checkpoint and rotating (save_total_limit).
-- Not here: what is saved inside (engine:save_checkpoint, trainer:save_model).
local C = require "zrun._C"
local cjson = require "cjson"

local M = {}
local fmt = string.format

M.PREFIX = "checkpoint-"
M.STATE_FILE = "trainer_state.json"

local function join(a, b) return a:sub(-1) == "/" and a .. b or a .. "/" .. b end
M.join = join

-- output_dir/checkpoint-<step>.
function M.dir_for(output_dir, step) return join(output_dir, M.PREFIX .. step) end

-- checkpoint-<step> folders in output_dir, oldest first: {step=, path=, complete=}.
function M.list(output_dir)
  local out = {}
  if C.path_type(output_dir) ~= "dir" then return out end
  for _, n in ipairs(C.listdir(output_dir) or {}) do
    local step = n:match("^checkpoint%-(%d+)$")
    local p = join(output_dir, n)
    if step and C.path_type(p) == "dir" then
      out[#out + 1] = { step = tonumber(step), path = p, complete = C.path_type(join(p, M.STATE_FILE)) == "file" }
    end
  end
  table.sort(out, function(a, b) return a.step < b.step end)
  return out
end

-- The newest complete checkpoint in output_dir, or nil.
function M.latest(output_dir)
  local l = M.list(output_dir)
  for i = #l, 1, -1 do if l[i].complete then return l[i].path end end
  return nil
end

-- A complete checkpoint without the engine's state (save_only_model) cannot be resumed: one line saying so.
local function check_resumable(p)
  if C.path_type(join(p, M.STATE_FILE)) == "file" and C.path_type(join(p, "latest")) ~= "file"
    and C.path_type(join(p, "optimizer.pt")) ~= "file" then -- (transformers' own, without DeepSpeed: zrun.checkpoint_hf)
    error(fmt("resume_from_checkpoint: %s holds the model but no optimizer state (saved with save_only_model = true), " ..
      "so training cannot go on from it; load the model with from_pretrained(\"%s\") and start a new run", p, p), 0)
  end
  return p
end

-- resume_from_checkpoint: true (the latest in output_dir) or a checkpoint folder -> its path.
function M.resolve(value, output_dir)
  if value == true then
    local p = M.latest(output_dir)
    if not p then
      error(fmt("resume_from_checkpoint=true: no complete %s<step> folder (with %s) in %s; train without it " ..
        "first, or pass the folder of a checkpoint", M.PREFIX, M.STATE_FILE, output_dir), 0)
    end
    return check_resumable(p)
  end
  if type(value) ~= "string" or value == "" then
    error(fmt("resume_from_checkpoint must be true or a checkpoint folder, got %s", tostring(value)), 0)
  end
  local p = value:gsub("(.)/+$", "%1")
  if C.path_type(p) ~= "dir" then
    error(fmt("resume_from_checkpoint: %s does not exist (pass a %s<step> folder written by the Trainer, or true " ..
      "for the latest in output_dir)", p, M.PREFIX), 0)
  end
  check_resumable(p)
  if C.path_type(join(p, M.STATE_FILE)) ~= "file" then
    local l = M.list(p)
    error(fmt("resume_from_checkpoint: %s has no %s, so it is not a Trainer checkpoint%s", p, M.STATE_FILE,
      #l > 0 and fmt(" (it holds %s: pass one of those, or true with output_dir=%s)", l[#l].path, p) or
      " (or an interrupted save)"), 0)
  end
  return p
end

-- trainer_state.json as a table (JSON nulls dropped).
function M.read_state(dir)
  local p = join(dir, M.STATE_FILE)
  local f = io.open(p, "rb")
  if not f then error(fmt("%s: missing", p), 0) end
  local s = f:read("*a")
  f:close()
  local ok, v = pcall(cjson.decode, s)
  if not ok or type(v) ~= "table" or type(v.global_step) ~= "number" then
    error(fmt("%s: not a trainer state (invalid JSON or no global_step)", p), 0)
  end
  return require("zrun.hf").strip_nulls(v)
end

local function nullable(v) if v == nil then return cjson.null end return v end

-- The keys whose values transformers holds as Python floats, written "2.0" where whole (Lua numbers do not say
-- which they are): the state's epoch (but its starting 0, an int, before any step: an evaluation before training),
-- total_flos and best_metric, the logs' losses, rates, runtimes and
-- metrics, EarlyStoppingCallback's threshold, TRL's num_tokens (a mean of its metric lists). Other counts (steps,
-- input tokens, batch sizes) stay integers.
local FLOAT_KEYS = { epoch = function(v) return v ~= 0 end, total_flos = true, best_metric = true, loss = true, grad_norm = true, learning_rate = true,
  entropy = true, mean_token_accuracy = true, num_tokens = true, early_stopping_threshold = true }
local FLOAT_SUFFIXES = { "_loss", "_runtime", "_per_second", "_perplexity", "_entropy", "_mean_token_accuracy",
  "_num_tokens", "_preparation_time" }
M.STATE_FLOATS = setmetatable({}, { __index = function(_, k)
  if type(k) ~= "string" then return nil end
  if FLOAT_KEYS[k] then return FLOAT_KEYS[k] end
  for _, suf in ipairs(FLOAT_SUFFIXES) do if k:sub(-#suf) == suf then return true end end
  return nil
end })

-- Writes trainer_state.json atomically with HF's fields (sorted keys, two-space indent, floats as Python's).
function M.write_state(dir, st)
  local out = {}
  for k, v in pairs(st) do out[k] = v end
  for _, k in ipairs { "best_metric", "best_model_checkpoint", "best_global_step", "trial_name", "trial_params" } do
    out[k] = nullable(st[k])
  end
  local hf = require "zrun.hf"
  if out.log_history and #out.log_history == 0 then out.log_history = setmetatable({}, hf.array_mt) end -- ([], not {})
  C.write_file_atomic(join(dir, M.STATE_FILE), hf.encode_json(out, M.STATE_FLOATS))
end

-- Removes a folder and everything inside it.
function M.rmtree(p)
  if C.path_type(p) == "dir" then
    for _, n in ipairs(C.listdir(p) or {}) do M.rmtree(join(p, n)) end
  end
  local ok, err = os.remove(p)
  if not ok and C.path_type(p) then error(fmt("cannot remove %s: %s", p, tostring(err)), 0) end
end

-- Deletes the oldest checkpoints beyond `limit`, keeping the best one (HF's _rotate_checkpoints:
-- with limit 1 and a best checkpoint that is not the newest, two are kept, except at_end: the end of
-- training, where transformers keeps the best alone). Returns the removed paths.
function M.rotate(output_dir, limit, best, at_end)
  if not limit then return {} end
  local l = M.list(output_dir)
  local order = {}
  for _, e in ipairs(l) do if e.path ~= best then order[#order + 1] = e end end
  for _, e in ipairs(l) do if e.path == best then order[#order + 1] = e end end -- the best sorts last: kept
  if best and limit == 1 and not at_end and l[#l] and l[#l].path ~= best then limit = 2 end
  local removed = {}
  for i = 1, #order - limit do
    M.rmtree(order[i].path)
    removed[#removed + 1] = order[i].path
  end
  return removed
end

return M
