-- tests/bench/ab_attention.sh with stand-ins for bench_fused: shell scripts printing rows in
-- bench_fused's format (attention_rows' printf), a different set each call. Checks the alternating
-- order, the medians, the ratios to the first build, that the "tile/block" rows are left out, and
-- the refusals; and tests/bench/ab_fwd_variants.sh's five builds of one stand-in through its knobs.
local zr = require "zrun"
local T = zr.testing
local dir = os.tmpname()
os.remove(dir)
local made = os.execute("mkdir -p " .. dir)
assert(made == 0 or made == true, "cannot make " .. dir)

local function put(path, s) local f = assert(io.open(path, "wb")); f:write(s); f:close() end
local function read(path) local f = io.open(path, "rb"); if not f then return "" end local s = f:read("*a"); f:close(); return s end
local ROW = "%-34s %10.3f %10.3f %10.3f %8.1f %8.1f %8.1f\n"
-- a stand-in that prints, on its k-th call, shape rows with bwd = bwds[k] (fwd 0.18, f+b = fwd + bwd)
-- and a tile/block row that must not count; it logs its name to dir/order
local function stand_in(name, bwds)
  local t = { "#!/bin/sh\n", ("echo %s >> %s/order\n"):format(name, dir), ('echo "$*" >> %s/args\n'):format(dir),
    ("n=$(cat %s/%s.n 2>/dev/null || echo 0); n=$((n + 1)); echo $n > %s/%s.n\n"):format(dir, name, dir, name),
    "echo 'device: stand-in'\n", "printf '\\n%-34s %10s\\n' 'attention (causal, bf16)' 'fwd ms'\n", "case $n in\n" }
  for k, b in ipairs(bwds) do
    local rows = ROW:format("B4 T2048 H32/8 Dh64", 0.18, b, 0.18 + b, 380, 360, 365)
      .. ROW:format("B64 T1024 H12/12 Dh64", 0.32, 2 * b, 0.32 + 2 * b, 320, 250, 270)
      .. ROW:format("B4 T2048 H32/8 Dh64 tile/block", 9, 9, 18, 1, 1, 1)
    t[#t + 1] = ("%d) cat <<'EOF'\n%sEOF\n;;\n"):format(k, rows)
  end
  t[#t + 1] = "esac\n"
  local p = dir .. "/" .. name
  put(p, table.concat(t))
  os.execute("chmod +x " .. p)
  return p
end
local function ab(args) return T.run("sh tests/bench/ab_attention.sh " .. args) end

T.test("ab_attention.sh: alternating rounds, medians per build and shape, ratios to the first", function()
  local a = stand_in("a", { 0.47, 0.50, 0.46 })
  local b = stand_in("b", { 0.44, 0.45, 0.43 })
  local out, rc = ab(("3 main=%s try=%s"):format(a, b))
  assert(rc == 0, out)
  T.eq(read(dir .. "/order"), "a\nb\na\nb\na\nb\n", "alternating order")
  local function row(shape, build)
    return out:match("\n" .. shape:gsub("[/%-]", "%%%0") .. " +" .. build .. " +([^\n]+)")
  end
  local m = row("B4 T2048 H32/8 Dh64", "main")
  local t = row("B4 T2048 H32/8 Dh64", "try")
  assert(m and t, out)
  T.eq(m, ("%8.3f %8.3f %8.3f %9.3f %9.3f"):format(0.18, 0.47, 0.65, 1, 1):gsub("^ +", ""), "main's medians")
  T.eq(t, ("%8.3f %8.3f %8.3f %9.3f %9.3f"):format(0.18, 0.44, 0.62, 0.62 / 0.65, 0.44 / 0.47):gsub("^ +", ""),
    "try's medians and ratios")
  local g = row("B64 T1024 H12/12 Dh64", "try")
  T.eq(g, ("%8.3f %8.3f %8.3f %9.3f %9.3f"):format(0.32, 0.88, 1.2, 1.2 / 1.26, 0.88 / 0.94):gsub("^ +", ""), "GPT-2's row")
  assert(not out:find("tile/block", 1, true), "the tile/block rows are left out:\n" .. out)
  assert(out:find("median of 3 alternating rounds; vs: against main", 1, true), out)
  -- each run's rows as they came, before the table (a call cut off keeps them)
  local first = out:find("# round 1: main\tB4 T2048 H32/8 Dh64\t0.180\t0.470\t0.650", 1, true)
  local last = out:find("# round 3: try\tB64 T1024 H12/12 Dh64\t0.320\t0.860\t1.180", 1, true)
  assert(first and last and last < out:find("median of 3", 1, true), "the rounds' rows as they came:\n" .. out)
end)

T.test("ab_attention.sh --sustained: the flag to every build, named in the header", function()
  os.remove(dir .. "/args")
  local a = stand_in("s1", { 0.47 })
  local b = stand_in("s2", { 0.44 })
  local out, rc = ab(("--sustained 1 main=%s try=%s"):format(a, b))
  assert(rc == 0, out)
  T.eq(read(dir .. "/args"), "attention --sustained\nattention --sustained\n", "each build ran sustained")
  assert(out:find("attention --sustained (ms, median of 1 alternating rounds", 1, true), out)
  os.remove(dir .. "/args")
  out, rc = ab(("1 main=%s try=%s"):format(stand_in("s3", { 0.47 }), stand_in("s4", { 0.44 })))
  assert(rc == 0, out)
  T.eq(read(dir .. "/args"), "attention\nattention\n", "bursts without the flag")
end)

T.test("ab_attention.sh refuses a bad count, one build, a missing binary, a repeated name, no rows", function()
  local a = stand_in("c", { 0.5 })
  local function refused(args, msg)
    local out, rc = ab(args)
    assert(rc ~= 0 and out:find(msg, 1, true), args .. " -> " .. out)
  end
  refused("0 x=" .. a .. " y=" .. a, "ROUNDS='0': give a count of 1 or more")
  refused("1 x=" .. a, "give two or more builds")
  refused("1 x=" .. a .. " y=/nonexistent/bench_fused", "y: no executable at /nonexistent/bench_fused")
  refused("1 x=" .. a .. " x=" .. a, "the name 'x' is given twice")
  refused("1 x=" .. a .. " " .. a, "is not NAME=BENCH_FUSED")
  local e = dir .. "/empty"
  put(e, "#!/bin/sh\necho 'SKIP bench_fused: no CUDA device visible'\n")
  os.execute("chmod +x " .. e)
  refused("1 x=" .. e .. " y=" .. a, "x: no attention rows in its output (round 1): SKIP bench_fused")
end)

T.test("ab_fwd_variants.sh: one bench_fused as three builds through its BENCH_ATTN_FWD_* knobs", function()
  -- the stand-in's bwd tells which knobs it got: 0.40 + 0.01 ROWS=128 + 0.02 TAIL=0
  local v = dir .. "/variants"
  put(v, table.concat {
    "#!/bin/sh\n", ('echo "${BENCH_ATTN_DH:-}:${BENCH_ATTN_FWD_ROWS:-}/${BENCH_ATTN_FWD_TAIL:-} $*" >> %s/venv\n'):format(dir),
    "b=$(awk -v r=\"${BENCH_ATTN_FWD_ROWS:-0}\" -v t=\"${BENCH_ATTN_FWD_TAIL:-1}\" ",
    "'BEGIN { printf \"%.3f\", 0.40 + (r == 128 ? 0.01 : 0) + 0.02 * (1 - t) }')\n",
    "echo 'device: stand-in'\n",
    "printf '%-34s %10.3f %10.3f %10.3f %8.1f %8.1f %8.1f\\n' 'B4 T2048 H32/8 Dh64' 0.18 $b 0.5 1 1 1\n",
  })
  os.execute("chmod +x " .. v)
  local out, rc = T.run("sh tests/bench/ab_fwd_variants.sh 1 " .. v)
  assert(rc == 0, out)
  T.eq(read(dir .. "/venv"), "64:0/ attention\n64:128/ attention\n64:/0 attention\n",
    "each variant's knobs, in order, the head_dim-64 rows alone")
  for name, bwd in pairs { base = 0.40, r128 = 0.41, head = 0.42 } do
    local got = out:match("\nB4 T2048 H32/8 Dh64 +" .. name .. " +[%d.]+ +([%d.]+)")
    T.eq(got, ("%.3f"):format(bwd), name .. "'s row")
  end
  assert(out:find("vs: against base", 1, true), out)
  out, rc = T.run("sh tests/bench/ab_fwd_variants.sh 1")
  assert(rc ~= 0 and out:find("give ROUNDS and one BENCH_FUSED", 1, true), out)
  out, rc = T.run("sh tests/bench/ab_fwd_variants.sh 1 /nonexistent/bench_fused")
  assert(rc ~= 0 and out:find("no executable at /nonexistent/bench_fused", 1, true), out)
end)

os.execute("rm -rf " .. dir)
T.done()
