-- One training step's kernels, summed by kernel, from an ncu CSV log (`ncu --csv --print-units base
-- --clock-control none --metrics gpu__time_duration.sum --launch-skip S --launch-count C --log-file F`
-- over a window longer than one step): finds the step's period as the shortest shift under which the
-- kernel names repeat (97%), then prints the last period's kernels by total time, GEMMs marked.
--   zrun tests/bench/ncu_step.lua F.csv [TOP=40]
local path, top = arg[1], tonumber(arg[2] or 40)
if not path then io.stderr:write("usage: zrun tests/bench/ncu_step.lua NCU.csv [TOP]\n"); os.exit(2) end
local f = assert(io.open(path), "ncu_step: cannot open " .. path)

local function fields(line) -- a CSV line of quoted fields
  local out = {}
  for v in line:gmatch('"(.-)"') do out[#out + 1] = v end
  return out
end
local names, ms, head = {}, {}, nil
for line in f:lines() do
  if not head then
    if line:sub(1, 4) == '"ID"' then
      head = {}
      for i, k in ipairs(fields(line)) do head[k] = i end
    end
  else
    local r = fields(line)
    if #r >= head["Metric Value"] then
      names[#names + 1] = r[head["Kernel Name"]]
      ms[#ms + 1] = tonumber((r[head["Metric Value"]]:gsub(",", ""))) / 1e6
    end
  end
end
f:close()
local n = #names
if n == 0 then io.stderr:write("ncu_step: no kernels in " .. path .. "\n"); os.exit(1) end
local period
for p = 50, n - 20 do
  local same = 0
  for j = 1, n - p do if names[j] == names[j + p] then same = same + 1 end end
  if same >= 0.97 * (n - p) then period = p; break end
end
if not period then io.stderr:write(("ncu_step: no repeating step in %d kernels; widen the window\n"):format(n)); os.exit(1) end

local function class(name)
  local l = name:lower()
  if l:find("gemm") or l:find("nvjet") or l:find("xmma") or l:find("cutlass") then return "GEMM " .. name:sub(1, 60) end
  return (name:gsub("%(.*", "")):sub(1, 90)
end
local sum, order, total, gemm = {}, {}, 0, 0
for k = n - period + 1, n do
  local c = class(names[k])
  if not sum[c] then sum[c] = { 0, 0 }; order[#order + 1] = c end
  sum[c][1], sum[c][2] = sum[c][1] + 1, sum[c][2] + ms[k]
  total = total + ms[k]
  if c:sub(1, 5) == "GEMM " then gemm = gemm + ms[k] end
end
table.sort(order, function(a, b) return sum[a][2] > sum[b][2] end)
print(("one step: %d kernels, %.2f ms of kernel time, GEMMs %.2f ms (%.0f%%)"):format(period, total, gemm, 100 * gemm / total))
print(("%9s %6s %6s  %s"):format("ms", "calls", "share", "kernel"))
for i = 1, math.min(top, #order) do
  local c = order[i]
  print(("%9.3f %6d %5.1f%%  %s"):format(sum[c][2], sum[c][1], 100 * sum[c][2] / total, c))
end
