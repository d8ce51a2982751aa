-- ZenFlow with update_interval "auto" (DeepSpeed's default): the adaptive host-update boundary against
-- a naive re-statement of DeepSpeed's rule (zenflow_reference.lua): the whole trajectory and the
-- boundaries, the rule fed the engine's own logged statistic, the statistic by hand, learning.
local zr = require "zrun"
local T = zr.testing

local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "zenflow_reference.lua")
-- inputs of very different scales: a few columns of the first weight carry most of its gradient, so
-- the unselected ones take several micro-steps to catch up (windows of 4-5 micro-steps, not all 1)
local scale = zr.tensor({ 4, 1, 0.5, 0.25, 0.1, 0.05 }):view(1, 6)
local plain_batch = R.batch
R.batch = function(t)
  local x, y = plain_batch(t)
  return x * scale, y
end

-- runs zf through the engine and the reference; returns the engine's boundaries (a string of 0/1)
local function compare(zf, steps, clip)
  local got, e, gb = R.run_engine(R.config(zf, { gradient_clipping = clip }), steps, true)
  local want, wb = R.reference(zf, steps, clip, 2e-2, 0.9, 0.99, 1e-8, 0.05)
  local s1, s2 = {}, {}
  for t = 1, steps do s1[t], s2[t] = gb[t] and "1" or "0", wb[t] and "1" or "0" end
  local got_b, want_b = table.concat(s1), table.concat(s2)
  T.eq(got_b, want_b, "boundaries (1: the micro-step ran the host update)")
  local d = R.max_diff(got, want)
  if d > 2e-5 then error(string.format("parameters differ from the reference by %g", d)) end
  return got_b, e
end

-- windows of a boundary string: the lengths of the runs ending in a 1 after warm-up
local function windows(b, warm)
  local out, n = {}, 0
  for t = warm + 1, #b do
    n = n + 1
    if b:sub(t, t) == "1" then out[#out + 1], n = n, 0 end
  end
  return out
end

T.test('zenflow update_interval "auto" equals DeepSpeed\'s rule: boundaries and parameters', function()
  -- auto_ratio 1: both weights must have caught up (0.99 x 2 weights floors to 1: either one)
  local b = compare({ topk_ratio = 0.2, update_interval = "auto", auto_ratio = 1 }, 30, 0.05)
  local lens, long = {}, 0
  for _, n in ipairs(windows(b, 0)) do lens[n], long = true, math.max(long, n) end
  T.eq(long >= 4, true, "windows of 4 micro-steps and more (" .. b .. ")")
  T.eq(next(lens, next(lens)) ~= nil, true, "windows of different lengths (" .. b .. ")")
  -- DeepSpeed's default auto_ratio 0.99, warm-up 3, a step selection every 10 micro-steps
  b = compare({ topk_ratio = 0.2, update_interval = "auto", full_warm_up_rounds = 3, select_strategy = "step",
    select_interval = 10 }, 24, 0)
  T.eq(b:sub(1, 3), "111", "warm-up micro-steps are boundaries")
  T.eq(b:find("0", 4) ~= nil, true, "windows after warm-up (" .. b .. ")")
end)

T.test('zenflow update_interval "auto" with overlap_step: moment sets by micro-step parity, as DeepSpeed', function()
  compare({ topk_ratio = 0.2, update_interval = "auto", auto_ratio = 1, overlap_step = true }, 20, 0.05)
  compare({ topk_ratio = 0.2, update_interval = "auto", full_warm_up_rounds = 2, overlap_step = true }, 16, 0)
end)

-- DeepSpeed's rule once more, as a hand-written state machine over the logged sums of each micro-step:
-- total (sum |g|) and crit (sum |g| of the selected columns) per weight; returns the boundary string
local function rule_by_hand(log, steps, topk, ratio, nweights)
  local avg, non, flag_prev, win, out = {}, {}, false, 0, {}
  for t = 0, steps - 1 do
    local boundary = flag_prev -- the previous micro-step's verdict ends this window
    if flag_prev then win, non = 0, {} end
    win = win + 1
    local ok = 0
    for i, total in pairs(log[t].total) do
      local crit = log[t].crit[i]
      avg[i] = ((avg[i] or 0) * (win - 1) + crit) / win / (topk * 10)
      non[i] = (non[i] or 0) + (total - crit) / ((1 - topk) * 10)
      if non[i] >= avg[i] then ok = ok + 1 end
    end
    flag_prev = ok >= math.floor(ratio * nweights)
    out[t + 1] = boundary and "1" or "0"
  end
  return table.concat(out)
end

T.test('zenflow "auto": the boundaries follow from the logged statistic, which is sum |g| by hand', function()
  local zf = { topk_ratio = 0.2, update_interval = "auto", auto_ratio = 1 }
  local model = R.mlp(true)
  -- micro-step 0's statistic by hand: the first weight's gradient at the initial parameters
  local x, y = R.batch(0)
  R.loss_of(model, x, y):backward()
  local g = model:parameters()[1].grad:flat_table() -- (10, 6)
  local sums, total = {}, 0
  for c = 1, 6 do
    sums[c] = 0
    for r = 1, 10 do sums[c] = sums[c] + math.abs(g[(r - 1) * 6 + c]) end
    total = total + sums[c]
  end
  table.sort(sums, function(a, b) return a > b end)
  local crit = sums[1] -- floor(0.2 x 6) = 1 column
  model:zero_grad(true)
  local e = zr.initialize { model = model, config = R.config(zf) }
  local log, got = {}, {}
  for t = 0, 19 do
    local xb, yb = R.batch(t)
    e:backward(R.loss_of(e, xb, yb))
    log[t] = e.zenflow:statistics()
    got[t + 1] = e:step() and "1" or "0"
  end
  T.near(log[0].total[1], total, 0, 1e-5, "micro-step 0: sum |g| of the first weight")
  T.near(log[0].crit[1], crit, 0, 1e-5, "micro-step 0: sum |g| of its selected column")
  T.eq(log[0].total[3] ~= nil and log[0].total[2] == nil, true, "the second weight (3 rows) is measured, a bias not")
  local b = table.concat(got)
  T.eq(rule_by_hand(log, 20, 0.2, 1, 2), b, "boundaries from the logged statistic")
  T.eq(b:find("00") ~= nil, true, "windows longer than one micro-step (" .. b .. ")")
end)

T.test('zenflow "auto" learns: the loss falls to a quarter', function()
  zr.manual_seed(3)
  local model = zr.nn.Sequential(zr.nn.Linear(16, 32), zr.nn.ReLU(), zr.nn.Linear(32, 1))
  local e = zr.initialize { model = model, config = R.config({ topk_ratio = 0.1, update_interval = "auto" },
    { gradient_clipping = 1.0 }) }
  zr.manual_seed(4)
  local x = zr.randn(4, 16)
  local y = x:sum(2, true):mul(0.25)
  local first, last, host = nil, nil, 0
  for _ = 1, 80 do
    local l = R.loss_of(e, x, y)
    e:backward(l)
    if e:step() then host = host + 1 end
    first = first or l:item()
    last = l:item()
  end
  if not (last < 0.25 * first) then error(string.format("loss %g -> %g did not fall to a quarter", first, last)) end
  T.eq(host > 1 and host < 80, true, "some micro-steps ran the host update, not all (" .. host .. ")")
end)

T.done()
