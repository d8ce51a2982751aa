-- tests/bench/vs_torch.sh's attention table without a GPU: stand-ins print what `bench_fused
-- attention` and tests/bench/bench_attention_torch.py print (their printf formats: the default grid's
-- rows, then the "tile/block" ones and head_dim 128's "mma.sync fwd" ones; per backend, with one "unavailable";
-- head_dim 128's with --dh 128, 96's with --dh 96), and the table must take zrun's f+b from the default grid,
-- PyTorch's best backend per shape (head_dim 64, 128 and 96), and their ratio; without
-- torch, zrun's column alone; VS_TORCH_SHAPES=none skips the training rows; bad settings refused.
local zr = require "zrun"
local T = zr.testing
local fmt = string.format

local dir = os.tmpname()
os.remove(dir)
os.execute("mkdir -p " .. dir)
local function write(name, text, exec)
  local f = assert(io.open(dir .. "/" .. name, "wb"))
  f:write(text)
  f:close()
  if exec then os.execute("chmod +x " .. dir .. "/" .. name) end
end

-- bench_fused's rows: "%-34s %10.3f %10.3f %10.3f %8.1f %8.1f %8.1f" (shape, fwd, bwd, f+b, TF/s x3)
local rows = {
  { "B4 T512 H32/8 Dh64", 0.030, 0.060, 0.090 }, { "B4 T2048 H32/8 Dh64", 0.180, 0.420, 0.600 },
  { "B4 T8192 H32/8 Dh64", 2.400, 5.600, 8.000 }, { "B64 T1024 H12/12 Dh64", 0.350, 0.900, 1.250 },
  { "B4 T512 H16/8 Dh128", 0.024, 0.118, 0.142 }, { "B4 T2048 H32/8 Dh128", 0.279, 1.837, 2.116 },
  { "B1 T8192 H32/8 Dh128", 0.909, 7.623, 8.532 }, { "B2 T4096 H32/32 Dh96", 0.650, 2.100, 2.750 },
}
local bench = { "#!/bin/sh", fmt('echo "bench_fused $*" >> %s/calls', dir), "cat <<'EOF'", "", fmt("%-34s %10s %10s %10s %8s %8s %8s", "attention (causal, bf16)",
  "fwd ms", "bwd ms", "f+b ms", "fwd TF/s", "bwd TF/s", "f+b TF/s") }
for pass = 1, 3 do -- the default grid, then a block per tile, then head_dim 128's mma.sync forward (slower: not taken)
  for _, r in ipairs(rows) do
    local k = pass == 1 and 1 or 2
    if pass < 3 or r[1]:find("Dh128", 1, true) then
      bench[#bench + 1] = fmt("%-34s %10.3f %10.3f %10.3f %8.1f %8.1f %8.1f", r[1] .. ({ "", " tile/block", " mma.sync fwd" })[pass],
        r[2] * k, r[3] * k, r[4] * k, 500, 500, 500)
    end
  end
end
bench[#bench + 1] = "EOF"
write("bench_fused", table.concat(bench, "\n") .. "\n", true)

-- bench_attention_torch.py's rows: "%-34s" of "SHAPE Dh64 BACKEND", then the same six numbers;
-- SHAPE is "B4 T512 H32/8" (GQA) or "B64 T1024 H12" (MHA)
local torch = { { "B4 T512 H32/8", { default = 0.25, flash = false, cudnn = 0.196, efficient = 0.4 } },
  { "B4 T2048 H32/8", { default = 0.85, flash = false, cudnn = 0.818, efficient = 1.9 } },
  { "B4 T8192 H32/8", { default = 9.9, flash = false, cudnn = 9.323, efficient = 20 } },
  { "B64 T1024 H12", { default = 1.4, flash = 1.5, cudnn = 1.357, efficient = 2.5 } } }
-- (with --dh 128)
local torch128 = { { "B4 T512 H16/8", { default = 0.238, flash = 0.3, cudnn = 0.220, efficient = false } },
  { "B4 T2048 H32/8", { default = 1.290, flash = 2.2, cudnn = 1.289, efficient = false } },
  { "B1 T8192 H32/8", { default = 4.031, flash = 6.8, cudnn = 3.949, efficient = false } } }
-- (with --dh 96: MHA, so no "/Hkv")
local torch96 = { { "B2 T4096 H32", { default = 3.1, flash = 3.6, cudnn = 3.025, efficient = 6.0 } } }
local py = { "#!/bin/sh", 'case "$1" in -c) exit 0 ;; tests/bench/bench_attention_torch.py) ;; *) exit 3 ;; esac',
  fmt('echo "python $*" >> %s/calls', dir), 'case "$*" in *"--dh 128"*) dh=128 ;; *"--dh 96"*) dh=96 ;; *) dh=64 ;; esac',
  "echo 'torch 2.11 stand-in'", fmt("echo '%-34s %10s %10s %10s %8s %8s %8s'", "torch SDPA (causal, gqa, bf16)", "fwd ms",
  "bwd ms", "f+b ms", "fwd TF/s", "bwd TF/s", "f+b TF/s") }
for _, t in ipairs { { 64, torch }, { 128, torch128 }, { 96, torch96 } } do
  py[#py + 1] = fmt('[ "$dh" = %d ] && cat <<\'EOF\'', t[1])
  for _, s in ipairs(t[2]) do
    for _, be in ipairs { "default", "flash", "cudnn", "efficient" } do
      local ms = s[2][be]
      if ms then
        py[#py + 1] = fmt("%-34s %10.3f %10.3f %10.3f %8.1f %8.1f %8.1f", s[1] .. " Dh" .. t[1] .. " " .. be, ms / 3, ms * 2 / 3,
          ms, 1, 1, 1)
      else
        py[#py + 1] = fmt("%s %-10s: unavailable (No available kernel. Aborting execution.)", s[1], be)
      end
    end
  end
  py[#py + 1] = "EOF"
end
py[#py + 1] = "exit 0"
write("python", table.concat(py, "\n") .. "\n", true)
write("nopython", "#!/bin/sh\nexit 1\n", true)

local Z = os.getenv("ZRUN_BIN") or arg[-1]
local function run(env)
  return T.run(fmt("%s sh tests/bench/vs_torch.sh '' %s %s", env, Z, dir))
end
local function row(out, name)
  local rest = out:match("\n" .. name:gsub("[%.%-%/%=]", "%%%0") .. " ([^\n]*)")
  assert(rest, "no row '" .. name .. "' in:\n" .. out)
  local f = {}
  for w in rest:gmatch("%S+") do f[#f + 1] = w end
  return f
end

T.test("vs_torch.sh: zrun's f+b from the default grid next to PyTorch's best backend, and the ratio", function()
  local out, rc = run(fmt("VS_TORCH_SHAPES=none PYTHON=%s/python", dir))
  assert(rc == 0, out)
  assert(not out:find("Llama training", 1, true), "training rows with VS_TORCH_SHAPES=none:\n" .. out)
  local want = { { "causal GQA B4 H32/8 Dh64 T=512", "0.090", "0.196", "2.18" },
    { "causal GQA B4 H32/8 Dh64 T=2048", "0.600", "0.818", "1.36" },
    { "causal GQA B4 H32/8 Dh64 T=8192", "8.000", "9.323", "1.17" },
    { "causal B64 H12 Dh64 T=1024", "1.250", "1.357", "1.09" },
    { "causal GQA B4 H16/8 Dh128 T=512", "0.142", "0.220", "1.55" },
    { "causal GQA B4 H32/8 Dh128 T=2048", "2.116", "1.289", "0.61" },
    { "causal GQA B1 H32/8 Dh128 T=8192", "8.532", "3.949", "0.46" },
    { "causal B2 H32 Dh96 T=4096", "2.750", "3.025", "1.10" } }
  for _, w in ipairs(want) do
    local f = row(out, w[1])
    T.eq(f[1], w[2], w[1] .. ": zrun's f+b (the default grid's row)")
    T.eq(f[2], w[3], w[1] .. ": PyTorch's best f+b")
    T.eq(f[3], "cudnn", w[1] .. ": the best backend")
    T.eq(f[4], w[4], w[1] .. ": best / zrun")
  end
end)

T.test("vs_torch.sh: the attention table again at the power cap (--sustained to both sides)", function()
  os.remove(dir .. "/calls")
  local out, rc = run(fmt("VS_TORCH_SHAPES=none PYTHON=%s/python", dir))
  assert(rc == 0, out)
  local f = assert(io.open(dir .. "/calls")); local calls = f:read("*a"); f:close()
  assert(calls:find("bench_fused attention\n", 1, true) and calls:find("bench_fused attention --sustained\n", 1, true),
    "bench_fused in bursts and sustained:\n" .. calls)
  assert(calls:find("python tests/bench/bench_attention_torch.py --sustained\n", 1, true), "torch sustained:\n" .. calls)
  local rest = out:match("attention f%+b %(ms%) %-%-sustained[^\n]*\n(.*)$")
  assert(rest, "no sustained table in:\n" .. out)
  local r = row("\n" .. rest, "causal GQA B4 H32/8 Dh64 T=8192")
  T.eq(r[1], "8.000"); T.eq(r[2], "9.323"); T.eq(r[4], "1.17")
end)

T.test("vs_torch.sh: without torch, zrun's column alone", function()
  local out, rc = run(fmt("VS_TORCH_SHAPES=none PYTHON=%s/nopython", dir))
  assert(rc == 0, out)
  local f = row(out, "causal GQA B4 H32/8 Dh64 T=2048")
  T.eq(f[1], "0.600"); T.eq(f[2], "-"); T.eq(f[3], "-"); T.eq(f[4], "-")
end)

T.test("vs_torch.sh refuses a malformed shape or round count, in one line", function()
  local out, rc = run(fmt("VS_TORCH_SHAPES=4x512 PYTHON=%s/nopython", dir))
  assert(rc ~= 0 and out:find("VS_TORCH_SHAPES entry '4x512' is not BATCHxSEQxGAS", 1, true), out)
  out, rc = run(fmt("VS_TORCH_ROUNDS=0 PYTHON=%s/nopython", dir))
  assert(rc ~= 0 and out:find("VS_TORCH_ROUNDS=0: use a count of 1 or more", 1, true), out)
end)

os.execute("rm -rf " .. dir)
T.done()
