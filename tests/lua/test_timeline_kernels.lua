-- tests/bench/timeline_kernels.lua on a made-up gpu_timeline.c recording: three launches of the
-- marker (two steps), kernels of known groups and durations, one of no group, an overlap and a
-- copy (for the busy union), an API row. Checks the sums, the step chosen, wall and idle, top, by=name,
-- the one-line refusals, and timeline_gaps.lua's busy time and gaps on the same recording.
local zr = require "zrun"
local T = zr.testing
local zrun = os.getenv("ZRUN_BIN") or arg[-1]
local csv = os.tmpname()

local rows, MS = {}, 1000000 -- ns a ms
local function K(s, e, name) rows[#rows + 1] = ("K,%d,%d,7,%d,%s"):format(s * MS, e * MS, #rows, name) end
-- step 1: 10 .. 30 ms; step 2: 30 .. 60 ms; the marker (grad norm) opens each
K(10, 11, "_Z20sumsq_partial_kernelIfEvPdPKT_l")
K(11, 15, "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
K(12, 13, "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(cublasLt::cublasSplitKParams<float>)")
K(13, 14, "_Z13ce_fused_kernelI13__nv_bfloat16EvPT_PfPKlllfl") -- (these two under the GEMM too: the busy time stays)
K(14, 15, "_Z23attn_rope_convert_kernelI13__nv_bfloat16Li64EEv8rope_cvt") -- qkv_rope_sdpa's dq pass, under the GEMM
K(15, 16, "_Z13swiglu_kernelI13__nv_bfloat16Li8ELb0EEvPT_S2_PKS1_S4_S4_lll")
K(20, 22, "_Z13swiglu_kernelI13__nv_bfloat16Li8ELb1EEvPT_S2_PKS1_S4_S4_lll")
K(30, 31, "_Z20sumsq_partial_kernelIfEvPdPKT_l")
K(31, 41, "nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN")
K(40, 44, "_Z20attn_fwd_sm90_kernelI13__nv_bfloat16EvPtPf14CUtensorMap_st") -- overlaps the GEMM by 1 ms
K(44, 47, "_Z15qkv_rope_kernelI13__nv_bfloat16Li8ELb1EEv8qkv_args")
K(47, 49, "_Z15qkv_rope_kernelI13__nv_bfloat16Li8ELb0EEv8qkv_args")
K(50, 52, "_ZN39_GLOBAL__N__0d54f62e_7_copy_cu_c973a62618fill_contig_kernelIjLi4EEEvPT_lS1_")
rows[#rows + 1] = ("M,%d,%d,7,99,4096"):format(52 * MS, 55 * MS) -- a copy: busy, not a kernel
rows[#rows + 1] = ("A,%d,%d,1,5,cudaLaunchKernel_v7000"):format(12 * MS, 59 * MS)
K(60, 61, "_Z20sumsq_partial_kernelIfEvPdPKT_l")
K(61, 70, "nvjet_sm90_tst_176x128_64x5_1x2_h_bz_TNN") -- after the last marker: in no complete step
local f = assert(io.open(csv, "w")); f:write(table.concat(rows, "\n") .. "\n"); f:close()

local function tk(args) return T.run(("%s tests/bench/timeline_kernels.lua %s %s"):format(zrun, csv, args or "")) end
local function row(out, name) return out:match("\n" .. name:gsub("[%(%)%+%-]", "%%%0") .. " +([^\n]+)") end

T.test("timeline_kernels.lua: one step's kernel time by group, its wall and idle time", function()
  local out, rc = tk("step=-1")
  assert(rc == 0, out)
  -- step 2: 30 .. 60 ms, busy = 30-49 (kernels, the overlap counted once) + 50-55 (kernel, copy) = 24 ms
  assert(out:find("step 2 of 2 (from one 'sumsq_partial' launch to the next): wall 30.00 ms, kernels 22.00 ms (6), " ..
    "GPU idle 6.00 ms (20.0%)", 1, true), out)
  T.eq(row(out, "GEMMs (cuBLASLt)"), "10.00   33.3%       1    10.0000", "the GEMM")
  T.eq(row(out, "attention forward"), "4.00   13.3%       1     4.0000", "the attention forward")
  T.eq(row(out, "qkv rope forward"), "3.00   10.0%       1     3.0000", "rope forward: qkv_rope_kernel<.., FWD = 1>")
  T.eq(row(out, "qkv rope backward"), "2.00    6.7%       1     2.0000", "rope backward")
  T.eq(row(out, "copy_cu_c973a626::fill_contig_kernel"), nil, "the anonymous namespace is left out")
  T.eq(row(out, "fill_contig_kernel"), "2.00    6.7%       1     2.0000", "a kernel of no group by its name")
  T.eq(row(out, "copies and memsets"), "3.00   10.0%       1     3.0000", "the copy")
  T.eq(row(out, "grad norm"), "1.00    3.3%       1     1.0000", "the marker")
  assert(not out:find("SwiGLU", 1, true), "step 1's kernels are not in step 2:\n" .. out)
  local o1 = tk("step=1")
  assert(o1:find("step 1 of 2 (from one 'sumsq_partial' launch to the next): wall 20.00 ms, kernels 11.00 ms (7), " ..
    "GPU idle 12.00 ms (60.0%)", 1, true), o1)
  T.eq(row(o1, "GEMMs (cuBLASLt)"), "5.00   25.0%       2     2.5000", "cuBLASLt's split-K reduce is a GEMM's, not the cross-entropy's")
  T.eq(row(o1, "cross-entropy"), "1.00    5.0%       1     1.0000", "the cross-entropy alone")
  T.eq(row(o1, "attention dq conversion"), "1.00    5.0%       1     1.0000", "the rope's dq pass is the dq conversion")
  T.eq(row(o1, "SwiGLU forward"), "1.00    5.0%       1     1.0000", "swiglu_kernel<.., BWD = 0>")
  T.eq(row(o1, "SwiGLU backward"), "2.00   10.0%       1     2.0000", "swiglu_kernel<.., BWD = 1>")
  local ot = tk("step=-1 top=2") -- seven groups: the two largest, then a line for the rest
  assert(ot:find("\nattention forward +[^\n]+\n%(5 more rows: top=N%)\n$"), ot)
  assert(not ot:find("qkv rope", 1, true), ot)
  local on = tk("step=1 by=name")
  T.eq(row(on, "swiglu_kernel"), "3.00   15.0%       2     1.5000", "by=name: the two swiglu kernels under one name")
end)

T.test("timeline_kernels.lua refuses a marker that is not there, a step past the end, a bad by", function()
  local function refused(args, msg)
    local out, rc = tk(args)
    assert(rc == 1 and out:find(msg, 1, true), args .. " -> " .. out)
    assert(not out:find("traceback", 1, true), out)
  end
  refused("marker=adamw", "0 launches of a kernel named '*adamw*' in " .. csv .. ": a step needs two")
  refused("step=3", "step=3: the recording holds 2 complete steps")
  refused("step=-3", "step=-3: the recording holds 2 complete steps")
  refused("step=0", "step=0: give 1, 2, .. or -1, -2, ..")
  refused("by=kernel", "by=kernel: use by=group or by=name")
  local out, rc = T.run(("%s tests/bench/timeline_kernels.lua %s.none"):format(zrun, csv))
  assert(rc == 1 and out:find("cannot open " .. csv .. ".none", 1, true), out)
end)

T.test("timeline_gaps.lua on the same recording: busy union, gaps by size; without API rows too", function()
  local out, rc = T.run(("%s tests/bench/timeline_gaps.lua %s from=0 to=1"):format(zrun, csv))
  assert(rc == 0, out)
  -- busy: 10-16, 20-22, 30-49 (the overlap once), 50-55 (kernel, copy), 60-70 = 42 of 60 ms; gaps 4 + 8 + 1 + 5 ms
  assert(out:find("window 0.0-60.0 ms of 60.0 ms recorded: 16 GPU records, busy 42.00 ms, idle 18.00 ms (30.0%)",
    1, true), out)
  assert(out:find("gaps >= 2 us: 4, 18.00 ms; launched only after the GPU went idle (host-bound): 0, 0.00 ms", 1, true), out)
  assert(out:find("\n  >1 ms *4 gaps *18.000 ms"), out)
  assert(out:find("8000%.0 +@ +12%.00 +%- +cudaLaunchKernel_v7000 +swiglu_kernel %-> sumsq_partial_kernel"), out)
  local g = csv .. ".gpu"
  local f = assert(io.open(g, "w"))
  for _, r in ipairs(rows) do if not r:find("^A,") then f:write(r, "\n") end end
  f:close()
  out, rc = T.run(("%s tests/bench/timeline_gaps.lua %s from=0 to=1"):format(zrun, g))
  os.remove(g)
  assert(rc == 0 and out:find("8000%.0 +@ +12%.00 +%- +%- +swiglu_kernel %-> sumsq_partial_kernel"), out)
end)

os.remove(csv)
T.done()
