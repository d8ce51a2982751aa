-- Where the GPU idles, from a tests/bench/gpu_timeline.c recording: over a window of the run, the
-- time the GPU ran something (kernels, copies, memsets: their union), the idle gaps by size, the
-- gaps the host caused (the next piece of work was launched only after the GPU had gone idle) by what
-- the host was doing, and the API calls by time.
--   zrun tests/bench/timeline_gaps.lua T.csv [from=0.4] [to=0.95] [top=15] [min_us=2]
-- from/to: the window as fractions of the span from the first to the last GPU record.
local cli = require("zrun.argparse").new("tests/bench/timeline_gaps.lua",
  "GPU idle time and its causes, from a gpu_timeline.c recording.")
cli:option("csv", "", "the recording (GPU_TIMELINE_OUT)"):positional("csv")
cli:option("from", 0.4, "window start, fraction of the span"):option("to", 0.95, "window end")
cli:option("top", 15, "gaps and API calls listed"):option("min_us", 2, "smaller gaps are not counted as gaps")
local a = cli:parse(arg)
if a.csv == "" then io.stderr:write(cli:help_text()); os.exit(2) end

local f = io.open(a.csv)
if not f then io.stderr:write("timeline_gaps: cannot open " .. a.csv .. "\n"); os.exit(2) end
local gpu, api = {}, {}
for line in f:lines() do
  local kind, s, e, x, corr, rest = line:match("^(%a),(%d+),(%d+),(%d+),(%d+),(.*)$")
  if kind then
    s, e = tonumber(s), tonumber(e)
    if e >= s and s > 0 then
      local r = { s = s, e = e, corr = tonumber(corr), name = rest }
      if kind == "A" then api[#api + 1] = r
      else r.copy = kind == "M"; gpu[#gpu + 1] = r end
    end
  end
end
f:close()
if #gpu == 0 then io.stderr:write("timeline_gaps: no GPU records in " .. a.csv .. "\n"); os.exit(1) end
table.sort(gpu, function(p, q) return p.s < q.s end)
table.sort(api, function(p, q) return p.s < q.s end)

local short = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/kernel_name.lua")

local t_first, t_last = gpu[1].s, gpu[1].e
for _, r in ipairs(gpu) do if r.e > t_last then t_last = r.e end end
local w0 = t_first + a.from * (t_last - t_first)
local w1 = t_first + a.to * (t_last - t_first)

-- the API call that launched each piece of GPU work: the earliest record with its correlation id
local launch = {}
for _, r in ipairs(api) do
  local l = launch[r.corr]
  if not l or r.s < l.s then launch[r.corr] = r end
end

-- union of GPU intervals in the window, and the gaps between them
local busy, n_gpu, gaps = 0, 0, {}
local cur_s, cur_e, prev
for _, r in ipairs(gpu) do
  if r.e > w0 and r.s < w1 then
    local s, e = math.max(r.s, w0), math.min(r.e, w1)
    n_gpu = n_gpu + 1
    if not cur_e then cur_s, cur_e = s, e
    elseif s > cur_e then
      busy = busy + (cur_e - cur_s)
      gaps[#gaps + 1] = { s = cur_e, e = s, before = prev, after = r }
      cur_s, cur_e = s, e
    elseif e > cur_e then cur_e = e end
    if not prev or r.e >= prev.e then prev = r end
  end
end
if cur_e then busy = busy + (cur_e - cur_s) end
local span = w1 - w0
local ms = function(ns) return ns / 1e6 end
print(("window %.1f-%.1f ms of %.1f ms recorded: %d GPU records, busy %.2f ms, idle %.2f ms (%.1f%%)"):format(
  ms(w0 - t_first), ms(w1 - t_first), ms(t_last - t_first), n_gpu, ms(busy), ms(span - busy), 100 * (span - busy) / span))

-- what the host was doing during a gap: the longest API call overlapping it on any thread
local function host_during(g)
  if #api == 0 then return nil end -- a recording of the GPU side only (its A rows left out)
  local best, lo = nil, 1
  local hi = #api
  while lo < hi do -- first call starting after g.e
    local mid = math.floor((lo + hi) / 2)
    if api[mid].s <= g.e then lo = mid + 1 else hi = mid end
  end
  for i = lo, math.max(1, lo - 400), -1 do
    local r = api[i]
    if r.s <= g.e and r.e >= g.s then
      local ov = math.min(r.e, g.e) - math.max(r.s, g.s)
      if not best or ov > best.ov then best = { name = r.name, ov = ov } end
    end
  end
  return best
end

local buckets = { { 5e3, "<5 us" }, { 20e3, "5-20 us" }, { 100e3, "20-100 us" }, { 1e6, "0.1-1 ms" }, { math.huge, ">1 ms" } }
local bn, bt = {}, {}
local host_late, host_late_n, by_host = 0, 0, {}
local counted = {}
for _, g in ipairs(gaps) do
  local d = g.e - g.s
  if d >= a.min_us * 1e3 then
    counted[#counted + 1] = g
    for i, b in ipairs(buckets) do
      if d < b[1] then bn[i] = (bn[i] or 0) + 1; bt[i] = (bt[i] or 0) + d; break end
    end
    local l = launch[g.after.corr]
    g.late = l and l.s > g.s
    local h = host_during(g)
    g.host = h and h.name or "-"
    if g.late then
      host_late, host_late_n = host_late + d, host_late_n + 1
      by_host[g.host] = (by_host[g.host] or 0) + d
    end
  end
end
print(("gaps >= %g us: %d, %.2f ms; launched only after the GPU went idle (host-bound): %d, %.2f ms"):format(
  a.min_us, #counted, ms(span - busy), host_late_n, ms(host_late)))
for i, b in ipairs(buckets) do
  if bn[i] then print(("  %-10s %6d gaps %8.3f ms"):format(b[2], bn[i], ms(bt[i]))) end
end

local function sorted_pairs(t)
  local list = {}
  for k, v in pairs(t) do list[#list + 1] = { k, v } end
  table.sort(list, function(p, q) return p[2] > q[2] end)
  return list
end
if host_late_n > 0 then
  print("host-bound gap time by the longest host call during it:")
  for i, kv in ipairs(sorted_pairs(by_host)) do
    if i > a.top then break end
    print(("  %8.3f ms  %s"):format(ms(kv[2]), kv[1]))
  end
end

table.sort(counted, function(p, q) return p.e - p.s > q.e - q.s end)
print(("largest gaps (us, at ms into the window, host-bound?, host call, GPU work before -> after):"))
for i, g in ipairs(counted) do
  if i > a.top then break end
  print(("  %8.1f  @%8.2f  %-4s %-28s %s -> %s"):format((g.e - g.s) / 1e3, ms(g.s - w0), g.late and "host" or "-",
    g.host:sub(1, 28), g.before.copy and "copy" or short(g.before.name), g.after.copy and "copy" or short(g.after.name)))
end

local calls = {}
for _, r in ipairs(api) do
  if r.s >= w0 and r.s < w1 then
    local c = calls[r.name] or { n = 0, t = 0 }
    c.n, c.t = c.n + 1, c.t + (r.e - r.s)
    calls[r.name] = c
  end
end
local list = {}
for k, c in pairs(calls) do list[#list + 1] = { k, c.t, c.n } end
table.sort(list, function(p, q) return p[2] > q[2] end)
print("host API calls in the window (runtime and driver, nested calls counted in both):")
for i, c in ipairs(list) do
  if i > a.top then break end
  print(("  %8.3f ms %7d  %s"):format(ms(c[2]), c[3], c[1]))
end
