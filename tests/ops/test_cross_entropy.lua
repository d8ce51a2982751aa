-- cross_entropy (fused): values computed by hand, every target ignored, float64 finite-difference
-- gradient checks (ignore_index, reductions, label smoothing, 3-D logits), errors.
local zr = require "zrun"
local T = zr.testing
local exp, log = math.exp, math.log
zr.manual_seed(7)

local function r(...) return zr.randn({ ... }, { dtype = "f64", requires_grad = true }) end
local function ids(t) return zr.tensor(t, { dtype = "i64" }) end

-- ---------- cross-entropy ----------

-- Hand-computed: logits {{1,2,3},{1,3,0}}, targets {2, 0}.
local L2x3 = { { 1, 2, 3 }, { 1, 3, 0 } }
local lse1 = log(exp(1) + exp(2) + exp(3))
local lse2 = log(exp(1) + exp(3) + exp(0))
local ce1, ce2 = lse1 - 3, lse2 - 1

T.test("cross_entropy values (2x3 by hand)", function()
  local x = zr.tensor(L2x3, { dtype = "f64" })
  T.near(zr.cross_entropy(x, ids { 2, 0 }), (ce1 + ce2) / 2, 1e-14)
  T.near(zr.cross_entropy(x, ids { 2, 0 }, { reduction = "sum" }), ce1 + ce2, 1e-14)
  T.near(zr.cross_entropy(x, ids { 2, 0 }, { reduction = "none" }), { ce1, ce2 }, 1e-14)
  T.near(zr.cross_entropy(x, zr.tensor({ 2, 0 }, { dtype = "i32" })), (ce1 + ce2) / 2, 1e-14)
  -- ignore_index: the mean is over the remaining targets only
  T.near(zr.cross_entropy(x, ids { 2, -100 }), ce1, 1e-14)
  T.near(zr.cross_entropy(x, ids { 5, 0 }, 5), ce2, 1e-14)
  T.near(zr.cross_entropy(x, ids { 2, -100 }, { reduction = "none" }), { ce1, 0 }, 1e-14)
  -- label smoothing eps: (1-eps)*nll + eps * mean_j(lse - x_j)
  local eps = 0.1
  local s1 = (1 - eps) * ce1 + eps * (3 * lse1 - 6) / 3
  local s2 = (1 - eps) * ce2 + eps * (3 * lse2 - 4) / 3
  T.near(zr.cross_entropy(x, ids { 2, 0 }, { label_smoothing = eps }), (s1 + s2) / 2, 1e-14)
  -- f32 logits agree
  T.near(zr.cross_entropy(x:float(), ids { 2, 0 }), (ce1 + ce2) / 2, 1e-6)
  -- gradient of the mean: (softmax - onehot) / 2 on both rows
  local xg = zr.tensor(L2x3, { dtype = "f64", requires_grad = true })
  zr.cross_entropy(xg, ids { 2, -100 }):backward()
  local z = exp(1) + exp(2) + exp(3)
  T.near(xg.grad, { exp(1) / z, exp(2) / z, exp(3) / z - 1, 0, 0, 0 }, 1e-14)
end)

T.test("cross_entropy with every target ignored is nan (0/0, like torch)", function()
  local x = zr.tensor(L2x3, { dtype = "f64", requires_grad = true })
  local l = zr.cross_entropy(x, ids { -100, -100 })
  local v = l:item()
  assert(v ~= v, "expected nan, got " .. tostring(v))
  T.near(zr.cross_entropy(x, ids { -100, -100 }, { reduction = "sum" }), 0)
  l:backward()
  T.near(x.grad, { 0, 0, 0, 0, 0, 0 })
end)

T.test("gradcheck cross_entropy (ignore_index, reductions, smoothing, 3-D logits)", function()
  local tg = ids { 3, -100, 0, 4, 1, -100, 2 }
  T.gradcheck(function(x) return zr.cross_entropy(x, tg) end, { r(7, 5) })
  T.gradcheck(function(x) return zr.cross_entropy(x, tg, { reduction = "sum" }) end, { r(7, 5) })
  T.gradcheck(function(x) return zr.cross_entropy(x, tg, { reduction = "none" }) end, { r(7, 5) })
  T.gradcheck(function(x) return zr.cross_entropy(x, tg, { label_smoothing = 0.2 }) end, { r(7, 5) })
  local t3 = ids { { 0, 2, -100 }, { 1, 1, 3 } }
  T.gradcheck(function(x) return zr.cross_entropy(x, t3) end, { r(2, 3, 4) })
  T.gradcheck(function(x) return x:cross_entropy(t3, -100, "none", 0.05) end, { r(2, 3, 4) })
end)

T.test("cross_entropy 3-D logits equal the flattened 2-D call", function()
  local x = zr.randn({ 2, 3, 11 }, { dtype = "f64" })
  local t = ids { { 0, 10, 5 }, { -100, 3, 7 } }
  T.near(zr.cross_entropy(x, t), zr.cross_entropy(x:view(6, 11), t:view(6)), 1e-14)
  T.eq(table.concat(zr.cross_entropy(x, t, { reduction = "none" }):shape(), ","), "2,3")
end)

T.test("cross_entropy errors", function()
  local x = zr.randn(2, 3)
  T.raises(function() zr.cross_entropy(x, ids { 3, 0 }) end, "target 3 (at flat position 1) is out of range for 3 classes")
  T.raises(function() zr.cross_entropy(x, ids { 0, -1 }) end, "target -1")
  T.raises(function() zr.cross_entropy(x, ids { 0, 1, 2 }) end, "logits (2,3) and targets (3) do not match")
  T.raises(function() zr.cross_entropy(x, zr.tensor({ 0, 1 })) end, "targets must be i64 or i32")
  T.raises(function() zr.cross_entropy(x, ids { 0, 1 }, { reduction = "avg" }) end, "reduction must be")
end)

T.test("logits_stats: each row's softmax entropy and first argmax, as softmax / log_softmax / max compute them", function()
  zr.manual_seed(5)
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    local x = (zr.randn({ 2, 3, 50 }, { dtype = "f64" }) * 4):to(dt)
    local xr = x:to("f64")
    local want = -(xr:softmax(3) * xr:log_softmax(3)):sum(3)
    local e, a = zr.logits_stats(x)
    T.eq(table.concat(e:shape(), "x"), "2x3", dt .. ": entropy shape")
    T.eq(a:dtype(), "i64", dt .. ": argmax dtype")
    T.near(e:to("f64"), want, dt == "f64" and 1e-12 or 1e-5, 0, dt .. ": entropy")
    local _, idx = xr:max(3) -- (1-based)
    T.eq_list(a:flat_table(), (idx:to("f64") - 1):flat_table(), dt .. ": argmax")
  end
  -- a tie: the first index (torch.argmax); a one-hot row: entropy 0; uniform: log C
  local e, a = zr.logits_stats(zr.tensor({ { 1, 3, 3, 0 }, { -1e30, 0, -1e30, -1e30 }, { 2, 2, 2, 2 } }, { dtype = "f32" }))
  T.eq_list(a:flat_table(), { 1, 1, 0 }, "ties: the first")
  local S = math.exp(-2) + 2 + math.exp(-3) -- (row 1's sum of exp(x - 3)): H = lse - sum p x
  T.near(e, { 3 + math.log(S) - (1 * math.exp(-2) + 3 * 2) / S, 0, math.log(4) }, 1e-5, 0,
    "entropy of a tie, a one-hot, a uniform row")
  T.raises(function() zr.logits_stats(zr.tensor({ 1, 2 }, { dtype = "i64" })) end, "logits_stats")
end)

T.done()
