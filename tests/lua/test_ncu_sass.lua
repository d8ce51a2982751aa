-- tests/bench/ncu_sass.lua on a source page in ncu's CSV form (`--page source --csv --print-source
-- sass`: the profiled program's own output first, a "Kernel Name" line, the column names, a row per
-- SASS instruction with commas inside its text): the instructions by stall samples, the reasons
-- summed, the opcode mix a warp and step, the samples inside turn windows, and the refusals.
local zr = require "zrun"
local T = zr.testing
local fmt = string.format

local ZRUN = os.getenv("ZRUN_BIN") or arg[-1]
local tmp = os.tmpname()
local COLS = { "Address", "Source", "Warp Stall Sampling (All Samples)",
               "Warp Stall Sampling (Not-issued Samples)", "# Samples", "Instructions Executed",
               "stall_barrier", "stall_long_sb", "stall_wait", "stall_barrier (Not Issued)",
               "stall_wait (Not Issued)" }
-- sass, samples, executed, barrier, long_sb, wait
local ROWS = {
  { "BAR.SYNC.DEFER_BLOCKING R16, 0x100", 5, 100, 0, 0, 5 },
  { "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", 40, 100, 30, 0, 10 },
  { "R2UR UR10, R162", 15, 200, 0, 0, 15 },
  { "BAR.ARV R13, 0x100", 2, 100, 0, 0, 2 },
  { "MUFU.EX2 R25, R25", 20, 6400, 0, 0, 20 },
  { "MUFU.EX2 R26, R26", 10, 6400, 0, 0, 10 },
  { "@!P0  BRA 0x7ff24b7a8c20", 8, 300, 0, 8, 0 },
}
local function write_csv(rows, cols)
  local f = assert(io.open(tmp, "wb"))
  f:write("==PROF== Connected to process 579 (/tmp/bench_fused)\nB4 T2048 H32/8 Dh64  0.180  0.470\n")
  f:write('"Kernel Name","void attn_fwd_sm90_kernel<__nv_bfloat16>(unsigned short *, float *)",\n')
  local q = {}
  for i, c in ipairs(cols or COLS) do q[i] = '"' .. c .. '"' end
  f:write(table.concat(q, ","), "\n")
  for i, r in ipairs(rows) do
    local v = { fmt("0x7f%04x", 16 * i), "      " .. r[1], r[2], r[2], r[2], r[3], r[4], r[5], r[6], 0, 0 }
    for j, x in ipairs(v) do v[j] = '"' .. tostring(x) .. '"' end
    f:write(table.concat(v, ","), "\n")
  end
  f:close()
end
local function run(args) return T.run(fmt("'%s' tests/bench/ncu_sass.lua %s %s", ZRUN, tmp, args or "")) end

T.test("ncu_sass.lua: instructions by samples with their stall reasons, and the reasons summed", function()
  write_csv(ROWS)
  local out, rc = run("top=3")
  T.eq(rc, 0, out)
  assert(out:find("kernel: void attn_fwd_sm90_kernel<__nv_bfloat16>(unsigned short *, float *)", 1, true), out)
  assert(out:find("7 SASS instructions, 100 warp stall samples, 13600 warp-level instructions executed", 1, true), out)
  -- the three most sampled, in order, with their index, share and reasons; no fourth
  local row = "%6d %8d %5.1f%% %12d  %-56s %s"
  local want = {
    fmt(row, 1, 40, 40, 100, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT", "barrier=30 wait=10"),
    fmt(row, 4, 20, 20, 6400, "MUFU.EX2 R25, R25", "wait=20"),
    fmt(row, 2, 15, 15, 200, "R2UR UR10, R162", "wait=15"),
  }
  local at = 0
  for _, w in ipairs(want) do
    local s = out:find(w, 1, true)
    assert(s and s > at, "missing or out of order: " .. w .. "\n" .. out)
    at = s
  end
  T.eq(out:find("MUFU.EX2 R26, R26", 1, true), nil, "top=3 lists three")
  assert(out:find(fmt("  %-28s %10d %5.1f%%", "wait", 62, 62), 1, true), out)
  assert(out:find(fmt("  %-28s %10d %5.1f%%", "barrier", 30, 30), 1, true), out)
  assert(out:find(fmt("  %-28s %10d %5.1f%%", "long_sb", 8, 8), 1, true), out)
end)

T.test("ncu_sass.lua: the opcode mix a warp and step, and the samples between from and to", function()
  write_csv(ROWS)
  local out, rc = run("per=MUFU per_count=64 from=BAR.SYNC to=BAR.ARV")
  T.eq(rc, 0, out)
  -- 12800 MUFU executed / 64 a step = 200 warp-steps; 13600 instructions = 68 a step
  assert(out:find("(MUFU = 64: 200 warp-steps): 68 instructions a step", 1, true), out)
  local op = "  %-12s %14d %6.1f%% of executed %6.1f%% of samples  %7.1f a step"
  assert(out:find(fmt(op, "MUFU", 12800, 100 * 12800 / 13600, 30, 64), 1, true), out)
  assert(out:find(fmt(op, "BRA", 300, 100 * 300 / 13600, 8, 1.5), 1, true), out)
  -- inside: the HGMMA and the R2UR (the bar.sync and bar.arrive themselves left out)
  assert(out:find('between "BAR.SYNC" and "BAR.ARV" (1 windows): 55 samples, 55.0% of all; barrier=30 wait=25',
    1, true), out)
end)

T.test("ncu_sass.lua refuses what it cannot read, in one line", function()
  write_csv(ROWS)
  local out, rc = run("per=MUFU")
  assert(rc ~= 0 and out:find("per and per_count go together", 1, true), out)
  out, rc = run("from=BAR.SYNC")
  assert(rc ~= 0 and out:find("from and to go together", 1, true), out)
  out, rc = run("per=HMMA per_count=8")
  assert(rc ~= 0 and out:find("no HMMA instruction executed", 1, true), out)
  write_csv(ROWS, { "Address", "Source", "Instructions Executed" })
  out, rc = run()
  assert(rc ~= 0 and out:find('no column "Warp Stall Sampling (All Samples)"', 1, true), out)
  write_csv({})
  out, rc = run()
  assert(rc ~= 0 and out:find("no SASS rows in", 1, true), out)
  out, rc = T.run(fmt("'%s' tests/bench/ncu_sass.lua %s.missing", ZRUN, tmp))
  assert(rc ~= 0 and out:find("cannot open", 1, true), out)
end)

os.remove(tmp)
T.done()
