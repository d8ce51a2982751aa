-- Where one training step's GPU time goes, from a tests/bench/gpu_timeline.c recording: kernel time
-- summed by group (GEMMs, attention forward / backward / prep / dq conversion, SwiGLU, RMSNorm,
-- rope, cross-entropy, optimizer, ...; kernels of no group by their own name) over one step, with
-- the step's wall time and the time the GPU ran nothing. A step is the time from one launch of a
-- marker kernel that runs once a step (default: the grad norm's sumsq_partial_kernel) to the next.
--   zrun tests/bench/timeline_kernels.lua T.csv [step=-1] [marker=sumsq_partial] [by=group] [top=40]
-- step: 1 = the first complete step, -1 the last (negative counts from the end).
-- by=name: every kernel by its own (shortened) name instead of the groups.
local cli = require("zrun.argparse").new("tests/bench/timeline_kernels.lua",
  "Kernel time of one step by group, from a gpu_timeline.c recording.")
cli:option("csv", "", "the recording (GPU_TIMELINE_OUT)"):positional("csv")
cli:option("step", -1, "which complete step: 1 the first, -1 the last")
cli:option("marker", "sumsq_partial", "a kernel name part launched once a step (plain text)")
cli:option("by", "group", "group | name"):option("top", 40, "rows printed")
local a = cli:parse(arg)
local function die(msg) io.stderr:write("timeline_kernels: " .. msg .. "\n"); os.exit(1) end
if a.csv == "" then io.stderr:write(cli:help_text()); os.exit(2) end
if a.by ~= "group" and a.by ~= "name" then die("by=" .. a.by .. ": use by=group or by=name") end
if a.step == 0 or a.step ~= math.floor(a.step) then die("step=" .. a.step .. ": give 1, 2, .. or -1, -2, ..") end

local f = io.open(a.csv)
if not f then die("cannot open " .. a.csv) end
local recs, marks = {}, {}
for line in f:lines() do
  local kind, s, e, name = line:match("^([KM]),(%d+),(%d+),%d+,%d+,(.*)$")
  if kind then
    s, e = tonumber(s), tonumber(e)
    if e >= s and s > 0 then
      recs[#recs + 1] = { s = s, e = e, kernel = kind == "K", name = name }
      if kind == "K" and name:find(a.marker, 1, true) then marks[#marks + 1] = s end
    end
  end
end
f:close()
table.sort(marks)
if #marks < 2 then
  die(("%d launches of a kernel named '*%s*' in %s: a step needs two; pick marker= from a kernel run once a step")
    :format(#marks, a.marker, a.csv))
end
local nsteps = #marks - 1
local k = a.step > 0 and a.step or nsteps + 1 + a.step
if k < 1 or k > nsteps then die(("step=%d: the recording holds %d complete steps"):format(a.step, nsteps)) end
local w0, w1 = marks[k], marks[k + 1]

-- first match wins (Lua patterns over the mangled names; the template flags tell the directions:
-- swiglu_kernel<T, V, BWD>, qkv_rope_kernel<T, V, FWD>)
local GROUPS = {
  { "nvjet", "GEMMs (cuBLASLt)" }, { "xmma", "GEMMs (cuBLASLt)" }, { "cutlass", "GEMMs (cuBLASLt)" },
  { "cublasLt::", "GEMMs (cuBLASLt)" }, -- its split-K reduce ("splitKreduce_kernel": not the cross-entropy's ce_)
  { "gemm", "GEMMs" },
  { "attn_fwd", "attention forward" }, { "attn_bwd_prep", "attention prep" },
  { "attn_sum_convert", "attention dq conversion" }, { "attn_rope_convert", "attention dq conversion" },
  { "attn_bwd", "attention backward" },
  { "swiglu_kernel.-Lb0EE", "SwiGLU forward" }, { "swiglu_kernel.-Lb1EE", "SwiGLU backward" },
  { "qkv_rope_kernel.-Lb1EE", "qkv rope forward" }, { "qkv_rope_kernel.-Lb0EE", "qkv rope backward" },
  { "norm_bwd", "norm backward (+ weight grads)" }, { "norm_wgrad", "norm backward (+ weight grads)" },
  { "norm_fwd", "norm forward (+ residual adds)" }, -- RMSNorm (Llama), LayerNorm (GPT-2): the same kernels
  { "ce_", "cross-entropy" }, { "adamw", "AdamW" }, { "sumsq", "grad norm" }, { "emb_", "embedding" },
}

local short = dofile((arg[0]:match("^(.*)/[^/]*$") or ".") .. "/kernel_name.lua")
local function group_of(r)
  if not r.kernel then return "copies and memsets" end
  if a.by == "name" then return short(r.name) end
  for _, g in ipairs(GROUPS) do
    if r.name:find(g[1]) then return g[2] end
  end
  return short(r.name)
end

-- records that start in the step; the busy time is the union of every record clipped to it
table.sort(recs, function(p, q) return p.s < q.s end)
local sum, count, total, nk = {}, {}, 0, 0
local busy, cs, ce = 0, nil, nil
for _, r in ipairs(recs) do
  if r.s >= w0 and r.s < w1 then
    local g, d = group_of(r), r.e - r.s
    sum[g], count[g] = (sum[g] or 0) + d, (count[g] or 0) + 1
    if r.kernel then total, nk = total + d, nk + 1 end
  end
  if r.e > w0 and r.s < w1 then
    local s, e = math.max(r.s, w0), math.min(r.e, w1)
    if not ce then cs, ce = s, e
    elseif s > ce then busy, cs, ce = busy + (ce - cs), s, e
    elseif e > ce then ce = e end
  end
end
if ce then busy = busy + (ce - cs) end

local ms = function(ns) return ns / 1e6 end
local wall = w1 - w0
print(("step %d of %d (from one '%s' launch to the next): wall %.2f ms, kernels %.2f ms (%d), GPU idle %.2f ms (%.1f%%)")
  :format(k, nsteps, a.marker, ms(wall), ms(total), nk, ms(wall - busy), 100 * (wall - busy) / wall))
local list = {}
for g, t in pairs(sum) do list[#list + 1] = { g, t, count[g] } end
table.sort(list, function(p, q) return p[2] > q[2] or (p[2] == q[2] and p[1] < q[1]) end)
print(("%-40s %10s %7s %7s %10s"):format(a.by == "name" and "kernel" or "group", "ms", "share", "count", "ms/call"))
for i, r in ipairs(list) do
  if i > a.top then print(("(%d more rows: top=N)"):format(#list - a.top)); break end
  print(("%-40s %10.2f %6.1f%% %7d %10.4f"):format(r[1]:sub(1, 40), ms(r[2]), 100 * r[2] / wall, r[3], ms(r[2]) / r[3]))
end
