-- What transformers' Trainer offers scripts after training (run_clm.py's tail): log_metrics,
-- save_metrics and save_state, as trainer_pt_utils.py and trainer.py write them, and the callback
-- list's add / pop / remove; installed on zr.Trainer (zrun.trainer).
--   local result = trainer:train()
--   trainer:log_metrics("train", result.metrics); trainer:save_metrics("train", result.metrics); trainer:save_state()
local C = require "zrun._C"
local dist = require "zrun.dist"
local M = {}
local fmt, floor, concat, sort = string.format, math.floor, table.concat, table.sort

-- Python's repr of a float (zrun.monitor.csv's) and its str(timedelta(seconds=s)).
local py_float = require("zrun.monitor.csv").py_float
local function timedelta(s)
  local d, r = floor(s / 86400), s % 86400
  local hms = fmt("%d:%02d:%02d", floor(r / 3600), floor(r % 3600 / 60), r % 60)
  return d > 0 and fmt("%d day%s, %s", d, d == 1 and "" or "s", hms) or hms
end

-- Keys whose values are counts (Python ints); every other number is a float, as Python would write it
-- (Lua numbers do not say which they are). TRL's num_tokens / eval_num_tokens are floats (means of its lists).
local function is_count(k)
  return k == "step" or k == "global_step" or k:match("_samples$") ~= nil or k:match("tokens") ~= nil and
    not k:match("per_second$") and not k:match("num_tokens$")
end

-- transformers' metrics_format: memory as MB, runtimes as h:mm:ss.cc, total_flos as GF, floats rounded
-- to 4 decimals. Returns key -> text.
function M.metrics_format(metrics)
  local out = {}
  for k, v in pairs(metrics) do
    if type(v) ~= "number" then out[k] = tostring(v)
    elseif k:find("_mem_", 1, true) then out[k] = fmt("%dMB", floor(v / 2 ^ 20))
    elseif k:find("_runtime", 1, true) then
      local s = floor(math.abs(v))
      out[k] = fmt("%s.%02d", timedelta(s), floor((math.abs(v) - s) * 100))
    elseif k == "total_flos" then out[k] = fmt("%dGF", floor(v / 2 ^ 30))
    elseif is_count(k) and v == floor(v) then out[k] = fmt("%d", v)
    else out[k] = py_float(floor(v * 1e4 + 0.5) / 1e4) end
  end
  return out
end

local function json_floats(metrics)
  local f = {}
  for k, v in pairs(metrics) do if type(v) == "number" and not is_count(k) then f[k] = true end end
  return f
end

local function read_json(path)
  local fh = io.open(path, "rb")
  if not fh then return nil end
  local ok, t = pcall(require("cjson").decode, fh:read("*a"))
  fh:close()
  return ok and type(t) == "table" and t or nil
end

local function check_split(who, split, metrics)
  if type(split) ~= "string" or split == "" then error(fmt("%s(split, metrics): split must be a name like \"train\"", who), 0) end
  if type(metrics) ~= "table" then error(fmt("%s(split, metrics): metrics must be a table of name -> value", who), 0) end
end

function M.install(Trainer)
  -- Whether this process is rank 0 of the job (transformers' is_world_process_zero).
  function Trainer:is_world_process_zero() return dist.rank() == 0 end
  -- Whether this process is the first on its node (transformers' is_local_process_zero).
  function Trainer:is_local_process_zero() return dist.local_rank() == 0 end

  -- Prints "***** <split> metrics *****" and each metric (sorted, aligned, as metrics_format writes it),
  -- on rank 0, as transformers' log_metrics.
  function Trainer:log_metrics(split, metrics)
    check_split("log_metrics", split, metrics)
    if dist.rank() ~= 0 then return end
    local f, keys, kw, vw = M.metrics_format(metrics), {}, 0, 0
    for k, v in pairs(f) do keys[#keys + 1] = k; kw = math.max(kw, #k); vw = math.max(vw, #v) end
    sort(keys)
    local lines = { fmt("***** %s metrics *****", split) }
    for _, k in ipairs(keys) do lines[#lines + 1] = fmt("  %-" .. kw .. "s = %" .. vw .. "s", k, f[k]) end
    dist.print0(concat(lines, "\n"))
  end

  -- Writes output_dir/<split>_results.json (sorted keys, 4-space indent) and, with combined (default
  -- true), merges the metrics into output_dir/all_results.json, on rank 0, as transformers' save_metrics.
  function Trainer:save_metrics(split, metrics, combined)
    check_split("save_metrics", split, metrics)
    if dist.rank() ~= 0 then return end
    local hf, dir = require "zrun.hf", self.args.output_dir
    C.makedirs(dir)
    local function write(name, t) C.write_file_atomic(dir .. "/" .. name, hf.encode_json(t, json_floats(t), 4):sub(1, -2)) end
    write(split .. "_results.json", metrics)
    if combined ~= false then
      local all = read_json(dir .. "/all_results.json") or {}
      for k, v in pairs(metrics) do all[k] = v end
      write("all_results.json", all)
    end
  end

  -- Writes output_dir/trainer_state.json (the state a checkpoint saves), on rank 0, as transformers'
  -- save_state.
  function Trainer:save_state()
    if dist.rank() ~= 0 then return end
    C.makedirs(self.args.output_dir)
    require("zrun.trainer_checkpoint").write_state(self.args.output_dir, self:state_json(self.state.global_step))
  end

  -- The callback list (zrun.trainer_callbacks), as transformers' add_callback / pop_callback /
  -- remove_callback: a callback table, or its name (a class's `name`) for pop and remove.
  function Trainer:add_callback(cb)
    local list = { cb }
    require("zrun.trainer_callbacks").check(list)
    local copy = {}
    for i, c in ipairs(self.callbacks) do copy[i] = c end
    copy[#copy + 1] = cb
    self.callbacks = copy
  end
  function Trainer:pop_callback(cb)
    for i, c in ipairs(self.callbacks) do
      if c == cb or (type(cb) == "string" and c.name == cb) then
        local copy = {}
        for j, x in ipairs(self.callbacks) do if j ~= i then copy[#copy + 1] = x end end
        self.callbacks = copy
        return c
      end
    end
    return nil
  end
  function Trainer:remove_callback(cb) self:pop_callback(cb) end
end

return M
