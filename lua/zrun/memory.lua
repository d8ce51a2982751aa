-- zr.memory: live memory by category and device, from the allocator's accounting.
--   zr.memory.stats("cpu")   -> { params = {current=, peak=, at_peak=}, grads = ..., total_current=, total_peak= }
--   zr.memory.summary()      prints a table of every device in use (in a script as in the REPL)
--   zr.memory.summary_text() -> that table as a string
local C = require "zrun._C"
local M = {}

M.categories = { "params", "grads", "optimizer", "activations", "comm", "workspace", "other" }

M.human = require("zrun.format").human -- bytes as "1.50 GiB"

-- Bytes now and at the peak per category on a device (default "cpu"), with total_current,
-- total_peak and n_allocs; each category's at_peak is its bytes at the moment of total_peak.
-- collections: full Lua collections the allocators ran to free unreached tensors (for "cpu": host
-- tensors past the soft limit; for a GPU: failed allocations, on any of them). host_kept ("cpu" only):
-- freed host blocks of 32 MiB or more kept for the next request of their size (no category's bytes).
-- reset_peak starts the peaks again from the current values.
function M.stats(device) return C.memory_stats(device or "cpu") end
function M.reset_peak(device) C.memory_reset_peak(device or "cpu") end
-- A line on stderr per forward op / backward node: activations now and peak inside the op (MiB).
function M.trace(on) C.memory_trace(on ~= false) end

-- Devices with any allocation so far.
local function devices()
  local out = { "cpu" }
  local ok, n = pcall(function() return C.cuda and C.cuda.device_count() or 0 end)
  for i = 0, (ok and n or 0) - 1 do out[#out + 1] = "cuda:" .. i end
  return out
end

-- A table like torch.cuda.memory_summary: current and peak bytes per category per device.
function M.summary_text(device)
  local lines = {}
  local list = device and { device } or devices()
  for _, dev in ipairs(list) do
    local s = C.memory_stats(dev)
    if dev == "cpu" or s.n_allocs > 0 then
      lines[#lines + 1] = ("%-14s %14s %14s"):format(dev, "current", "peak")
      for _, c in ipairs(M.categories) do
        lines[#lines + 1] = ("  %-12s %14s %14s"):format(c, M.human(s[c].current), M.human(s[c].peak))
      end
      lines[#lines + 1] = ("  %-12s %14s %14s"):format("total", M.human(s.total_current), M.human(s.total_peak))
      if C.cuda_memory_info and dev ~= "cpu" then
        local ok, info = pcall(C.cuda_memory_info, dev)
        if ok and info then
          lines[#lines + 1] = ("  %-12s %14s"):format("reserved", M.human(info.reserved or 0))
        end
      end
    end
  end
  return table.concat(lines, "\n")
end

-- Prints summary_text to stdout: a statement in a script shows it, as in the REPL (which would
-- otherwise be the only place a returned string appears).
function M.summary(device)
  io.write(M.summary_text(device), "\n")
  io.flush()
end

-- Runs fn with newly created tensors tagged as `category`.
function M.with_category(category, fn, ...)
  local prev = C.set_default_category(category)
  local res = { pcall(fn, ...) }
  C.set_default_category(prev)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2)
end

-- Estimators, plans and model descriptions (memory_estimate.lua, memory_plan.lua, memory_describe.lua).
function M.estimate_zero2(...) return require("zrun.memory_estimate").estimate_zero2(...) end
function M.estimate_zero3(...) return require("zrun.memory_estimate").estimate_zero3(...) end
function M.plan(...) return require("zrun.memory_plan").plan(...) end
function M.fit(...) return require("zrun.memory_plan").fit(...) end
function M.describe(...) return require("zrun.memory_describe").describe(...) end

return M
