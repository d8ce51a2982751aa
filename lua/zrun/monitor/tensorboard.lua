-- TensorBoard event files written as torch.utils.tensorboard.SummaryWriter writes them for DeepSpeed's
-- TensorBoardMonitor: OUTPUT_PATH/JOB_NAME/events.out.tfevents.<time>.<host>.<pid>.<n>, a TFRecord
-- stream of tensorflow.Event protobufs, the first carrying file_version "brain.Event:2", then one
-- Event per add_scalar (wall_time, step, Summary{Value{tag, simple_value}}). The protobufs are
-- encoded by hand: the handful of fields below is all a scalar needs.
--   Event:   1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary (Summary)
--   Summary: 1 value (repeated Value);  Value: 1 tag (string), 2 simple_value (float)
local ffi = require "ffi"
local tfrecord = require "zrun.monitor.tfrecord"

local M = {}
local char, concat, fmt, floor = string.char, table.concat, string.format, math.floor

-- Protobuf pieces -----------------------------------------------------------------------------------

local function varint(n) -- n: a non-negative integer below 2^53
  local out = {}
  repeat
    local b = n % 128
    n = (n - b) / 128
    out[#out + 1] = char(n > 0 and b + 128 or b)
  until n == 0
  return concat(out)
end

local dbuf, fbuf = ffi.new("double[1]"), ffi.new("float[1]")
local function double_le(x) dbuf[0] = x; return ffi.string(dbuf, 8) end -- x86/ARM: little-endian
local function float_le(x) fbuf[0] = x; return ffi.string(fbuf, 4) end
assert(ffi.abi("le"), "tensorboard: event files are little-endian; this machine is not")

local function bytes_field(num, s) return varint(num * 8 + 2) .. varint(#s) .. s end -- wire type 2

-- The encoded tensorflow.Event for a scalar: wall_time (seconds), step, tag, value (kept as float32).
function M.scalar_event(wall_time, step, tag, value)
  if step < 0 or step ~= floor(step) then error(fmt("tensorboard: step must be a non-negative integer, got %s", step), 2) end
  local v = bytes_field(1, tag) .. char(2 * 8 + 5) .. float_le(value) -- simple_value: wire type 5
  local summary = bytes_field(1, v)
  return char(1 * 8 + 1) .. double_le(wall_time) .. char(2 * 8) .. varint(step) .. bytes_field(5, summary)
end

-- The first Event of every file.
function M.version_event(wall_time)
  return char(1 * 8 + 1) .. double_le(wall_time) .. bytes_field(3, "brain.Event:2")
end

M.varint = varint

-- Writer ----------------------------------------------------------------------------------------------

local Writer = {}
Writer.__index = Writer

local uid = 0

-- time.time(): seconds since the epoch, with microseconds.
ffi.cdef [[
typedef struct { long tv_sec; long tv_usec; } zr_tb_timeval;
int gettimeofday(zr_tb_timeval *tv, void *tz);
]]
local tv = ffi.new("zr_tb_timeval")
local function wall_time()
  ffi.C.gettimeofday(tv, nil)
  return tonumber(tv.tv_sec) + tonumber(tv.tv_usec) * 1e-6
end

local function first_line(path)
  local f = io.open(path)
  if not f then return nil end
  local s = f:read("*l")
  f:close()
  return s
end

-- This machine's name (as the event files and transformers' default logging_dir carry it).
function M.hostname() return first_line("/proc/sys/kernel/hostname") or os.getenv("HOSTNAME") or "localhost" end

-- A writer whose file lives in log_dir (created); opts.now: a clock (seconds) for tests.
function M.new(log_dir, opts)
  opts = opts or {}
  local C = require("zrun")._C
  C.makedirs(log_dir)
  local now = opts.now or wall_time
  local host = M.hostname()
  local pid = (first_line("/proc/self/stat") or "0"):match("^(%d+)")
  uid = uid + 1
  local path = fmt("%s/events.out.tfevents.%010d.%s.%s.%d", log_dir, floor(now()), host, pid, uid)
  local f, err = io.open(path, "wb")
  if not f then error("tensorboard: cannot create the event file: " .. tostring(err), 0) end
  local self = setmetatable({ path = path, file = f, now = now }, Writer)
  f:write(tfrecord.record(M.version_event(now())))
  f:flush()
  return self
end

-- SummaryWriter.add_scalar(tag, value, step).
function Writer:add_scalar(tag, value, step)
  self.file:write(tfrecord.record(M.scalar_event(self.now(), step, tag, value)))
end

function Writer:flush() self.file:flush() end
function Writer:close()
  if self.file then self.file:close(); self.file = nil end
end

return M
