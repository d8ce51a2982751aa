-- ZenFlow (zero_optimization.zenflow) over several ranks against the one-rank run (itself checked
-- against a naive re-implementation of DeepSpeed's algorithm in tests/lua/test_zenflow.lua): the same
-- global batch split over the ranks must give the same selection and parameters. Usage:
--   zrun zenflow_check.lua ref STAGE OVERLAP FILE [bf16|auto]  (np=1) writes the parameters, selection and
--                                                    the micro-steps that ended a window to
--                                                    FILE (in f32 a checkpoint to FILE.ckpt too)
--   zrun zenflow_check.lua cmp STAGE OVERLAP FILE [bf16|auto]  (np>1) compares every rank's with FILE's
--   zrun zenflow_check.lua cmp_resumed STAGE OVERLAP FILE [auto]  (np>1) the same, resumed from FILE.ckpt
--                                                    (resharded; overlap_step: its pending weights too)
--   zrun zenflow_check.lua resume STAGE DIR [0|1 [bf16|auto]]  a run resumed from a checkpoint in DIR continues bit
--                                                    for bit as the uninterrupted one (every rank; 1:
--                                                    overlap_step, an update pending at the save;
--                                                    ZENFLOW_CHECK_MUTANT=drop_pending: the load loses
--                                                    it, and the check must fail)
-- 12 micro-steps, update_interval 2, one warm-up round, selection at micro-steps 1, 4 and 8
-- (select_interval 4), clipping and a warm-up LR schedule. Tolerance: fp32 gradients summed in another
-- order (each rank's half, then the all-reduce): 2e-5 absolute on weights of size ~0.3 after 12 AdamW
-- steps of lr <= 1e-2 (measured differences ~3e-8; one step moves a weight by ~1e-2).
-- bf16: the ranks' bf16 gradients reduced in another order than one rank's, so 2 bf16 ulps (rtol 8e-3).
-- auto: update_interval "auto" (inputs of very different scales, for windows of several micro-steps;
-- no select_interval): every rank ends the same windows as np=1 (rank 0's verdict), and saves and
-- resumes happen at the first window's end from micro-step 6 on.
-- ZRUN_CHECK_DEVICE=cuda: each rank trains on its GPU, NCCL collectives (tests/cuda/test_zenflow_multi_gpu.sh).
local zr = require "zrun"
local T = zr.testing
local C = zr._C
local dist = zr.dist

local mode, stage, a3, a4 = arg[1], tonumber(arg[2]), arg[3], arg[4]
local bf16 = arg[5] == "bf16" -- bf16 weights (.grad in bf16 at several ranks, f32 at one)
local auto = arg[5] == "auto"
local overlap = (mode == "resume" and a4 or a3) == "1"
local W, r = dist.world_size(), dist.rank()
local G, STEPS = 8, 12 -- global batch rows, micro-steps
local dev = os.getenv("ZRUN_CHECK_DEVICE") == "cuda" and "cuda" or nil

local function engine()
  zr.manual_seed(7)
  local model = zr.nn.Sequential(zr.nn.Linear(12, 16), zr.nn.Tanh(), zr.nn.Linear(16, 5))
  if dev then model:to(dev) end -- (zrun picks the local rank's GPU under mpirun)
  return zr.initialize { model = model, config = {
    train_micro_batch_size_per_gpu = G / W, gradient_accumulation_steps = 1, steps_per_print = 1000,
    gradient_clipping = 0.1, bf16 = bf16 and { enabled = true } or nil,
    optimizer = { type = "AdamW", params = { lr = 1e-2, betas = { 0.9, 0.99 }, eps = 1e-8, weight_decay = 0.05 } },
    scheduler = { type = "WarmupLR", params = { warmup_min_lr = 0, warmup_max_lr = 1e-2, warmup_num_steps = 8 } },
    zero_optimization = { stage = stage, reduce_bucket_size = 64, offload_optimizer = { device = "cpu" },
      zenflow = auto and { topk_ratio = 0.2, update_interval = "auto", full_warm_up_rounds = 1, overlap_step = overlap }
        or { topk_ratio = 0.3, update_interval = 2, select_strategy = "step", select_interval = 4,
        full_warm_up_rounds = 1, overlap_step = overlap } } } }
end
local function micro(e, t) -- micro-step t (0-based): this rank's rows of the global batch
  zr.manual_seed(100 + t)
  local x, y = zr.randn(G, 12), zr.randn(G, 5)
  if auto then x = x * zr.tensor({ 4, 2, 1, 1, 0.5, 0.5, 0.25, 0.2, 0.1, 0.1, 0.05, 0.05 }):view(1, 12) end
  local n = G / W
  x, y = x:narrow(1, r * n + 1, n):contiguous(), y:narrow(1, r * n + 1, n):contiguous()
  if dev then x, y = x:to(dev), y:to(dev) end
  e:backward((e(x) - y):square():mean())
  return e:step()
end
local function state(e) -- the parameters and each weight's selected columns, by name
  local out = {}
  for i, p in ipairs(e:parameters()) do
    out["p" .. i] = p:detach():to("cpu"):contiguous()
    local idx = e.zenflow.p[i].idx
    if idx then out["idx" .. i] = idx:to("cpu") end
  end
  return out
end
local name = ("zenflow stage %d np=%d%s%s"):format(stage, W, overlap and " overlap_step" or "",
  bf16 and " bf16" or auto and " update_interval auto" or "")

-- micro-steps from..STEPS-1; save(t) after each that ends a window; returns those ends as "t,t,..."
local function run(e, from, save)
  local ends = {}
  for t = from, STEPS - 1 do
    if micro(e, t) then
      ends[#ends + 1] = t
      if save then save(t) end
    end
  end
  return table.concat(ends, ",")
end
-- the window ends in "t,t,..." from micro-step from on
local function ends_from(ends, from)
  local out = {}
  for t in ends:gmatch("%d+") do if tonumber(t) >= from then out[#out + 1] = t end end
  return table.concat(out, ",")
end
-- saves at the first window's end from micro-step 6 on (fixed update_interval: 6 itself), into dir
local function save_once(e, dir)
  local done = false
  return function(t)
    if not done and t >= 6 then e:save_checkpoint(dir, "w"); done = true end
  end
end

if mode == "ref" then
  local e = engine()
  local ends = run(e, 0, not bf16 and save_once(e, a4 .. ".ckpt")) -- for cmp_resumed
  C.save_safetensors(a4, state(e), { format = "zenflow_check", ends = ends })
elseif mode == "cmp" or mode == "cmp_resumed" then
  local e = engine()
  if mode == "cmp_resumed" then e:load_checkpoint(a4 .. ".ckpt", "w") end -- the np=1 run's, resharded
  local from = e.micro_steps
  local ends = run(e, from)
  local worst = 0
  local function check()
    local f = C.safetensors_open(a4)
    T.eq(ends, ends_from(f:metadata().ends, from), "the micro-steps that ended a window")
    for k, v in pairs(state(e)) do
      if k:match("^idx") then T.eq(table.concat(v:flat_table(), ","), table.concat(f:get(k):flat_table(), ","), k)
      else
        local want = f:get(k)
        T.near(v, want, bf16 and 1e-3 or 2e-5, bf16 and 8e-3 or 0, k .. " (rank " .. r .. ")")
        worst = math.max(worst, (v - want):abs():max():item())
      end
    end
    f:close()
    if r == 0 then print(("  largest difference from np=1: %.3g"):format(worst)) end
  end
  local what = mode == "cmp" and " matches np=1" or " resumed from np=1's checkpoint matches np=1"
  if r == 0 then T.test(name .. what, check) else check() end
  local function same_selection() -- a rank that ranked otherwise still takes rank 0's selection
    local zf, tops, want = e.zenflow, {}, {}
    for i, q in ipairs(zf.p) do
      if q.two and q.k > 0 then
        tops[i], want[i] = {}, {}
        for j = 1, q.k do tops[i][j], want[i][j] = (j - 1 + r) % q.cols, j - 1 end
        table.sort(tops[i])
      end
    end
    zf:set_selection(tops)
    for i in pairs(want) do T.eq(table.concat(zf.p[i].idx:to("cpu"):flat_table(), ","), table.concat(want[i], ","), "idx" .. i) end
  end
  if mode == "cmp" then
    if r == 0 then T.test(name .. ": every rank takes rank 0's selection", same_selection) else same_selection() end
  end
elseif mode == "resume" then
  local ref = engine()
  local ref_ends = run(ref, 0, save_once(ref, a3))
  local e = engine()
  e:load_checkpoint(a3, "w")
  local from = e.micro_steps
  if overlap then T.eq(e.zero:async_pending(), true, "an update pending at the save (rank " .. r .. ")") end
  if os.getenv("ZENFLOW_CHECK_MUTANT") == "drop_pending" then e.zero:set_async_pending(false) end -- must fail
  local ends = run(e, from)
  local function check()
    T.eq(ends, ends_from(ref_ends, from), "the micro-steps that ended a window after micro-step " .. from)
    T.eq(from > 6 and ends ~= "", true, "resumed after micro-step 6, with windows ending after it")
    local want = state(ref)
    for k, v in pairs(state(e)) do
      local a, b = v:flat_table(), want[k]:flat_table()
      for j = 1, #b do if a[j] ~= b[j] then error(("%s[%d] after the resume (rank %d): %.9g, uninterrupted %.9g"):format(k, j, r, a[j], b[j]), 0) end end
    end
  end
  if r == 0 then T.test(name .. " resumes bit for bit from a checkpoint", check) else check() end
else
  error("zenflow_check.lua: the first argument must be ref, cmp, cmp_resumed or resume, got " .. tostring(mode), 0)
end
