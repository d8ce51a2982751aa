-- Where a kernel's warps wait, instruction by instruction, from ncu's source page (GPU machine):
--   ncu --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
--       --kernel-name regex:K --launch-skip S --launch-count 1 APP ARGS > F.csv
--   zrun tests/bench/ncu_sass.lua F.csv [top=30] [per=MUFU] [per_count=64] [from=BAR.SYNC] [to=BAR.ARV]
-- Prints the instructions with the most warp stall samples (their share of all samples, how many
-- times a warp executed them, their three largest stall reasons), the stall reasons summed, and the
-- executed instructions by opcode; with per (an opcode) and per_count (how many of it a warp runs a
-- step) the opcode counts are scaled to one warp and step (the Hopper attention forward: MUFU 64,
-- its exponentials a thread and key tile). With from and to (substrings of the SASS text), the
-- samples of the instructions after each one matching from up to the next one matching to, both
-- left out (the Hopper attention forward's ping-pong turn was BAR.SYNC .. BAR.ARV: session 18 found
-- a fifth of its samples there).
local cli = require("zrun.argparse").new("tests/bench/ncu_sass.lua",
  "Warp stall samples and instruction mix by SASS instruction, from ncu's source page CSV.")
cli:option("csv", "", "ncu --page source --csv --print-source sass output"):positional("csv")
cli:option("top", 30, "instructions listed"):option("per", "", "opcode that counts steps (e.g. MUFU)")
cli:option("per_count", 0, "how many of `per` a warp runs a step")
cli:option("from", "", "window start: SASS text substring"):option("to", "", "window end")
local a = cli:parse(arg)
if a.csv == "" then io.stderr:write(cli:help_text()); os.exit(2) end
if (a.per == "") ~= (a.per_count <= 0) then
  io.stderr:write("ncu_sass: per and per_count go together (e.g. per=MUFU per_count=64)\n"); os.exit(2)
end
if (a.from == "") ~= (a.to == "") then
  io.stderr:write("ncu_sass: from and to go together (e.g. from=BAR.SYNC to=BAR.ARV)\n"); os.exit(2)
end

local function fields(line) -- a CSV line of quoted fields (SASS text holds commas, never quotes)
  local out = {}
  for v in line:gmatch('"(.-)"') do out[#out + 1] = v end
  return out
end
local function num(s) return tonumber((s or ""):gsub(",", ""), 10) or 0 end

local f = io.open(a.csv)
if not f then io.stderr:write("ncu_sass: cannot open " .. a.csv .. "\n"); os.exit(2) end
local col, reasons, rows, kernel = nil, {}, {}, nil
for line in f:lines() do
  if line:sub(1, 14) == '"Kernel Name",' then
    kernel = fields(line)[2]
  elseif line:sub(1, 10) == '"Address",' then
    if col then break end -- a second kernel's table: the first one only
    col = {}
    for i, k in ipairs(fields(line)) do
      col[k] = i
      if k:match("^stall_") and not k:find("Not Issued", 1, true) then reasons[#reasons + 1] = { k, i } end
    end
    for _, k in ipairs { "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed" } do
      if not col[k] then
        io.stderr:write(("ncu_sass: no column %q in %s: collect --section SourceCounters --section "
          .. "WarpStateStats\n"):format(k, a.csv))
        os.exit(1)
      end
    end
  elseif col then
    local r = fields(line)
    if #r >= col["Instructions Executed"] then
      local st = {}
      for _, rk in ipairs(reasons) do st[rk[1]] = num(r[rk[2]]) end
      rows[#rows + 1] = { sass = (r[col["Source"]]:gsub("^%s+", "")), stall = st,
                          samples = num(r[col["Warp Stall Sampling (All Samples)"]]),
                          exec = num(r[col["Instructions Executed"]]) }
    end
  end
end
f:close()
if #rows == 0 then
  io.stderr:write("ncu_sass: no SASS rows in " .. a.csv .. " (ncu --page source --csv --print-source sass)\n")
  os.exit(1)
end

local total, exec_total = 0, 0
for _, r in ipairs(rows) do total, exec_total = total + r.samples, exec_total + r.exec end
local function top3(st)
  local t = {}
  for k, v in pairs(st) do if v > 0 then t[#t + 1] = { k:sub(7), v } end end
  table.sort(t, function(p, q) return p[2] > q[2] or (p[2] == q[2] and p[1] < q[1]) end)
  local s = {}
  for i = 1, math.min(3, #t) do s[#s + 1] = t[i][1] .. "=" .. t[i][2] end
  return table.concat(s, " ")
end
-- "@!P0 BRA 0x7f.." -> "BRA"; "HGMMA.64x128x16.F32.BF16 R24, .." -> "HGMMA"
local function opcode(sass)
  return (sass:gsub("^@!?U?P%w+%s+", ""):match("^([%w_]+)") or "?")
end

if kernel then print("kernel: " .. kernel) end
print(("%d SASS instructions, %d warp stall samples, %d warp-level instructions executed"):format(
  #rows, total, exec_total))
local order = {}
for i = 1, #rows do order[i] = i end
table.sort(order, function(p, q)
  return rows[p].samples > rows[q].samples or (rows[p].samples == rows[q].samples and p < q)
end)
print(("\n%6s %8s %6s %12s  %-56s %s"):format("#", "samples", "share", "executed", "instruction", "largest stall reasons"))
for k = 1, math.min(a.top, #order) do
  local i = order[k]
  local r = rows[i]
  if r.samples == 0 then break end
  print(("%6d %8d %5.1f%% %12d  %-56s %s"):format(i - 1, r.samples, 100 * r.samples / total, r.exec,
    r.sass:sub(1, 56), top3(r.stall)))
end

local sum = {}
for _, r in ipairs(rows) do for k, v in pairs(r.stall) do sum[k] = (sum[k] or 0) + v end end
print("\nstall reasons, all instructions")
local rs = {}
for k, v in pairs(sum) do if v > 0 then rs[#rs + 1] = { k, v } end end
table.sort(rs, function(p, q) return p[2] > q[2] or (p[2] == q[2] and p[1] < q[1]) end)
for _, p in ipairs(rs) do print(("  %-28s %10d %5.1f%%"):format(p[1]:sub(7), p[2], 100 * p[2] / total)) end

local ops, opl = {}, {}
for _, r in ipairs(rows) do
  local o = opcode(r.sass)
  if not ops[o] then ops[o] = { 0, 0 }; opl[#opl + 1] = o end
  ops[o][1], ops[o][2] = ops[o][1] + r.exec, ops[o][2] + r.samples
end
table.sort(opl, function(p, q) return ops[p][1] > ops[q][1] or (ops[p][1] == ops[q][1] and p < q) end)
local steps
if a.per ~= "" then
  if not ops[a.per] or ops[a.per][1] == 0 then
    io.stderr:write(("ncu_sass: no %s instruction executed: pick another per\n"):format(a.per)); os.exit(1)
  end
  steps = ops[a.per][1] / a.per_count
  print(("\nexecuted by opcode, a warp and step (%s = %d: %.0f warp-steps): %.0f instructions a step"):format(
    a.per, a.per_count, steps, exec_total / steps))
else
  print("\nexecuted by opcode")
end
for _, o in ipairs(opl) do
  local e, s = ops[o][1], ops[o][2]
  if e > 0 then
    print(("  %-12s %14d %6.1f%% of executed %6.1f%% of samples%s"):format(o, e, 100 * e / exec_total,
      100 * s / total, steps and ("  %7.1f a step"):format(e / steps) or ""))
  end
end

if a.from ~= "" then
  local inside, windows, open, wst = 0, 0, false, {}
  for _, r in ipairs(rows) do
    if open and r.sass:find(a.to, 1, true) then
      open = false
    elseif open then
      inside = inside + r.samples
      for k, v in pairs(r.stall) do wst[k] = (wst[k] or 0) + v end
    end
    if not open and r.sass:find(a.from, 1, true) then open, windows = true, windows + 1 end
  end
  print(("\nbetween %q and %q (%d windows): %d samples, %.1f%% of all; %s"):format(a.from, a.to, windows,
    inside, 100 * inside / total, top3(wst)))
end
