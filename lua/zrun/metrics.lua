-- A run's metrics file, output_dir/metrics.jsonl: one JSON record per line, the first a header
-- ({run_id, start_time, world_size, deepspeed_config, args, resumed_from, ...}). A new run renames
-- the file it finds to metrics.<its run id>.jsonl, so each file holds one run. Not the records'
-- content (the Trainer's log_history decides that) nor their drawing (zrun.plot).
local cjson = require "cjson"
local json_line = require("zrun.hf").encode_json_line
local M = {}

local fmt, type, pairs = string.format, type, pairs

local function join(dir, name) return (dir:gsub("/+$", "")) .. "/" .. name end
local function exists(p) local f = io.open(p, "rb"); if f then f:close(); return true end return false end

-- A run id that sorts by start time: UTC date-time plus the process id (two runs in one second differ).
function M.new_run_id(now)
  local pid = "0"
  local f = io.open("/proc/self/stat")
  if f then pid = (f:read("*l") or ""):match("^(%d+)") or pid; f:close() end
  return os.date("!%Y%m%d-%H%M%S", now or os.time()) .. "-" .. pid
end

-- v as JSON can hold it: NaN/inf as strings, functions/userdata by name, keys as strings.
local function jsonable(v, depth)
  local t = type(v)
  if t == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return tostring(v) end
    return v
  elseif t == "string" or t == "boolean" then return v
  elseif t == "table" and (depth or 0) < 12 then
    local out, n = {}, #v
    local array = n > 0
    for k in pairs(v) do if type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0 then array = false; break end end
    for k, x in pairs(v) do
      if type(x) ~= "function" then out[array and k or tostring(k)] = jsonable(x, (depth or 0) + 1) end
    end
    return out
  elseif v == nil or v == cjson.null then return cjson.null end
  return tostring(v)
end
M.jsonable = jsonable

-- The first record of a metrics file when it is a header (has run_id), else nil.
function M.read_header(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local line = f:read("*l")
  f:close()
  local ok, r = pcall(cjson.decode, line or "")
  if ok and type(r) == "table" and type(r.run_id) == "string" then return r end
  return nil
end

-- Renames dir/metrics.jsonl (when it holds anything) to metrics.<its run id>.jsonl and returns that
-- run id; a file from before headers existed becomes metrics.no-header.jsonl. Never overwrites:
-- a taken name gets .2, .3, ...
function M.rotate(dir)
  local cur = join(dir, "metrics.jsonl")
  local f = io.open(cur, "rb")
  if not f then return nil end
  local size = f:seek("end")
  f:close()
  if size == 0 then os.remove(cur); return nil end
  local h = M.read_header(cur)
  local id = h and h.run_id:gsub("[^%w%-_.]", "_") or "no-header"
  local dest, k = join(dir, "metrics." .. id .. ".jsonl"), 1
  while exists(dest) do
    k = k + 1
    dest = join(dir, fmt("metrics.%s.%d.jsonl", id, k))
  end
  local ok, err = os.rename(cur, dest)
  if not ok then error(fmt("metrics: cannot rename %s to %s (%s): check the permissions of %s", cur, dest, err, dir), 0) end
  return h and h.run_id or nil, dest
end

-- Opens a new dir/metrics.jsonl for this run (the previous one rotated away) and writes the header.
-- header: the fields to record (run_id and start_time are filled when absent). Returns the file,
-- the header written and the previous run's id (nil without one).
function M.open(dir, header)
  local prev = M.rotate(dir)
  local h = jsonable(header)
  h.run_id = h.run_id or M.new_run_id()
  h.start_time = h.start_time or os.date("!%Y-%m-%dT%H:%M:%SZ")
  h.previous_run_id = h.previous_run_id or prev
  if h.continues == true then h.continues = prev elseif h.continues == false then h.continues = nil end
  local path = join(dir, "metrics.jsonl")
  local f, err = io.open(path, "w")
  if not f then error(fmt("metrics: cannot write %s (%s): choose a writable output_dir", path, err), 0) end
  f:write(json_line(h), "\n")
  f:flush()
  return f, h, prev
end

-- Reads a metrics file: header (or nil) and the records after it, in order. Lines that are not
-- JSON objects (a run killed mid-write) are skipped.
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local header, recs = nil, {}
  for line in f:lines() do
    local ok, r = pcall(cjson.decode, line)
    if ok and type(r) == "table" then
      if not header and #recs == 0 and type(r.run_id) == "string" then header = r else recs[#recs + 1] = r end
    end
  end
  f:close()
  return header, recs
end

-- The records of the run in dir (or a metrics file) with the runs it resumed: a run resumed from
-- a checkpoint of the same output_dir (header.continues = the previous run's id) takes that run's
-- records up to resumed_from first, recursively. Returns {header=, records=, resumes={steps}, path=}.
function M.load(path)
  local dir = path
  if path:match("%.jsonl$") then dir = path:match("^(.*)/[^/]*$") or "."
  elseif require("zrun._C").path_type(path) == "file" then -- (not a folder: naming path/metrics.jsonl would mislead)
    error(fmt("zrun plot: %s is a file, not a run: pass the run's output_dir or its metrics.jsonl", path), 0)
  else path = join(path, "metrics.jsonl") end
  local header, recs = M.read(path)
  if type(recs) ~= "table" then
    error(fmt("zrun plot: no metrics file %s (a Trainer with output_dir writes it; pass the run's output_dir)", path), 0)
  end
  local run = { header = header, records = recs, resumes = {}, path = path }
  local h, seen = header, {}
  while h and h.continues and h.resumed_from and not seen[h.continues] do
    seen[h.continues] = true
    local ph, prev = M.read(join(dir, "metrics." .. h.continues .. ".jsonl"))
    if not prev then break end
    local keep = {}
    for _, r in ipairs(prev) do
      if type(r.step) == "number" and r.step <= h.resumed_from then keep[#keep + 1] = r end
    end
    for _, r in ipairs(run.records) do keep[#keep + 1] = r end
    run.records = keep
    table.insert(run.resumes, 1, h.resumed_from)
    h = ph
  end
  return run
end

return M
