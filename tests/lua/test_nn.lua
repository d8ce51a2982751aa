-- zr.nn and zr.data: module trees and HF-order names, state_dict round trips and their errors,
-- torch's init bounds, train/eval, modules against hand-computed values, DataLoader batching and
-- shuffling, and a tiny MLP that overfits 16 samples.
local zr = require "zrun"
local T = zr.testing
local nn = zr.nn
zr.manual_seed(7)

local function shape(t) return table.concat(t:shape(), "x") end

-- A Llama-shaped toy model: names must come out as Hugging Face writes them.
local MLP = nn.Module:extend("ToyMLP")
function MLP:__init(d, h)
  self.gate_proj = nn.Linear(d, h, false)
  self.up_proj = nn.Linear(d, h, false)
  self.down_proj = nn.Linear(h, d, false)
  self.act = nn.SiLU()
end
function MLP:forward(x) return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x)) end

local Block = nn.Module:extend("ToyBlock")
function Block:__init(d, h)
  self.input_layernorm = nn.RMSNorm(d)
  self.mlp = MLP(d, h)
end
function Block:forward(x) return x + self.mlp(self.input_layernorm(x)) end

local Toy = nn.Module:extend("Toy")
function Toy:__init(vocab, d, h, n_layers, tied)
  self.embed_tokens = nn.Embedding(vocab, d)
  self.layers = nn.ModuleList()
  for _ = 1, n_layers do self.layers:append(Block(d, h)) end
  self.norm = nn.RMSNorm(d)
  self.lm_head = nn.Linear(d, vocab, false)
  if tied then self.lm_head.weight = self.embed_tokens.weight end
end
function Toy:forward(ids)
  local x = self.embed_tokens(ids)
  for _, layer in ipairs(self.layers) do x = layer(x) end
  return self.lm_head(self.norm(x))
end

T.test("module tree: names in registration (HF) order, counts", function()
  local m = Toy(11, 6, 5, 2)
  local names, shapes = {}, {}
  for n, p in m:named_parameters() do names[#names + 1] = n; shapes[#shapes + 1] = shape(p) end
  local expect = { "embed_tokens.weight" }
  for i = 0, 1 do
    for _, s in ipairs { "input_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight" } do
      expect[#expect + 1] = ("layers.%d.%s"):format(i, s)
    end
  end
  expect[#expect + 1] = "norm.weight"
  expect[#expect + 1] = "lm_head.weight"
  T.eq(table.concat(names, " "), table.concat(expect, " "))
  T.eq(shapes[1], "11x6"); T.eq(shapes[3], "5x6"); T.eq(shapes[5], "6x5"); T.eq(shapes[#shapes], "11x6")
  -- 11*6 + 2*(6 + 3*30) + 6 + 66
  T.eq(m:num_parameters(), 66 + 2 * 96 + 6 + 66)
  T.eq(#m:parameters(), 11)
  T.eq(#m.layers, 2)
  T.eq(m.layers[2], m._modules.layers._modules["1"])
  local mods = {}
  for n in m:named_modules() do mods[#mods + 1] = n end
  T.eq(mods[1], ""); T.eq(mods[2], "embed_tokens"); T.eq(mods[3], "layers"); T.eq(mods[4], "layers.0")
  T.eq(mods[5], "layers.0.input_layernorm"); T.eq(mods[6], "layers.0.mlp"); T.eq(mods[7], "layers.0.mlp.gate_proj")
  T.eq(#m:modules(), 1 + 1 + 1 + 2 * 7 + 1 + 1) -- block, norm, mlp, gate, up, down, act per layer
  local kids = {}
  for n in m:named_children() do kids[#kids + 1] = n end
  T.eq(table.concat(kids, ","), "embed_tokens,layers,norm,lm_head")
  for _, p in ipairs(m:parameters()) do
    T.eq(p:category(), "params"); T.eq(p:dtype(), "f32"); T.eq(p.requires_grad, true); T.eq(p.is_leaf, true)
  end
end)

T.test("tied weights: one parameter, two state_dict keys", function()
  local m = Toy(11, 6, 5, 1, true)
  T.eq(m.lm_head.weight, m.embed_tokens.weight)
  T.eq(#m:parameters(), 1 + 4 + 1)
  T.eq(m:num_parameters(), 66 + 96 + 6)
  local keys = m:state_dict_keys()
  T.eq(keys[#keys], "lm_head.weight")
  T.eq(#keys, 7)
end)

T.test("printing the module tree", function()
  local m = nn.Sequential(nn.Linear(4, 3), nn.GELU("tanh"), nn.Dropout(0.25), nn.Linear(3, 2, false))
  T.eq(tostring(m), table.concat({
    "Sequential(",
    "  (0): Linear(in_features=4, out_features=3, bias=true)",
    "  (1): GELU(approximate='tanh')",
    "  (2): Dropout(p=0.25)",
    "  (3): Linear(in_features=3, out_features=2, bias=false)",
    ")" }, "\n"))
  local s = tostring(Toy(11, 6, 5, 1))
  T.eq(s:find("  (layers): ModuleList(\n    (0): ToyBlock(\n      (input_layernorm): RMSNorm((6,), eps=1e-06", 1, true) ~= nil, true, s)
end)

T.test("register_parameter/buffer/add_module, attribute rules", function()
  local m = nn.Module()
  m.w = zr.randn(3):requires_grad_()          -- a leaf that requires grad becomes a parameter
  m.frozen = nn.Parameter(zr.randn(2), false)  -- a frozen parameter stays one
  m.plain = zr.randn(4)                        -- a plain tensor is just an attribute
  m:register_buffer("stat", zr.zeros(2))
  m:register_buffer("cache", zr.zeros(5), false)
  m:add_module("sub", nn.Linear(2, 2))
  local names = {}
  for n in m:named_parameters() do names[#names + 1] = n end
  T.eq(table.concat(names, ","), "w,frozen,sub.weight,sub.bias")
  T.eq(m.frozen.requires_grad, false)
  T.eq(m:num_parameters(true), 3 + 6)
  T.eq(table.concat(m:state_dict_keys(), ","), "w,frozen,stat,sub.weight,sub.bias")
  T.eq(#m:buffers(), 2)
  m.w = nil
  names = {}
  for n in m:named_parameters() do names[#names + 1] = n end
  T.eq(table.concat(names, ","), "frozen,sub.weight,sub.bias")
  T.raises(function() m:register_parameter("a.b", zr.randn(1)) end, "without dots")
  T.raises(function() m:add_module("frozen", nn.ReLU()) end, "already a parameter")
  T.raises(function() nn.Module()(zr.randn(1)) end, "forward() is not implemented")
end)

T.test("state_dict round trip", function()
  local a, b = Toy(11, 6, 5, 2), Toy(11, 6, 5, 2)
  local ids = zr.tensor({ { 1, 4, 10 }, { 0, 3, 3 } }, { dtype = "i64" })
  local ya, yb = a(ids), b(ids)
  T.eq(T.diff(ya, yb) > 1e-3, true) -- different initialisations
  local sd = a:state_dict()
  local n = 0
  for _ in pairs(sd) do n = n + 1 end
  T.eq(n, 11)
  local res = b:load_state_dict(sd)
  T.eq(#res.missing_keys + #res.unexpected_keys, 0)
  T.near(b(ids), a(ids), 0, 0)
  for name, p in b:named_parameters() do T.near(p, sd[name], 0, 0, name) end
  -- state_dict tensors share memory with the parameters; loading copies
  a.norm.weight:fill_(2)
  T.near(sd["norm.weight"], { 2, 2, 2, 2, 2, 2 })
  T.near(b.norm.weight, { 1, 1, 1, 1, 1, 1 })
  T.eq(b.norm.weight.is_leaf and b.norm.weight.requires_grad, true)
  -- loading casts dtypes
  local sd64 = {}
  for k, v in pairs(a:state_dict()) do sd64[k] = v:double() end
  b:load_state_dict(sd64)
  T.near(b.norm.weight, { 2, 2, 2, 2, 2, 2 })
  T.eq(b.norm.weight:dtype(), "f32")
end)

T.test("load_state_dict errors name missing, unexpected and mismatched keys", function()
  local m = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 4))
  local sd = m:state_dict()
  local before = m[1].weight:flat_table()
  local bad = {}
  for k, v in pairs(sd) do bad[k] = v end
  bad["2.bias"] = nil
  bad["extra.weight"] = zr.zeros(1)
  bad["0.weight"] = zr.zeros(3, 2)
  local err = T.raises(function() m:load_state_dict(bad) end, "Error(s) in loading state_dict for Sequential")
  T.eq(err:find('Missing key(s) in state_dict: "2.bias".', 1, true) ~= nil, true, err)
  T.eq(err:find('Unexpected key(s) in state_dict: "extra.weight".', 1, true) ~= nil, true, err)
  T.eq(err:find("size mismatch for 0.weight: copying a tensor with shape (3,2) from checkpoint, the shape in current model is (2,3).", 1, true) ~= nil, true, err)
  T.near(m[1].weight, before, 0, 0) -- nothing was copied
  -- strict = false: only shape mismatches fail; missing/unexpected keys are reported
  bad["0.weight"] = zr.ones(2, 3)
  local res = m:load_state_dict(bad, false)
  T.eq(table.concat(res.missing_keys, ","), "2.bias")
  T.eq(table.concat(res.unexpected_keys, ","), "extra.weight")
  T.near(m[1].weight, { 1, 1, 1, 1, 1, 1 })
  T.raises(function() m:load_state_dict({ ["0.weight"] = 3 }, false) end, 'value for "0.weight" is a number')
end)

T.test("Linear init: torch's kaiming_uniform(a=sqrt(5)) and bias bounds", function()
  local fan_in, out = 37, 1000
  local l = nn.Linear(fan_in, out)
  local bound = 1 / math.sqrt(fan_in)
  local w = l.weight:flat_table()
  local maxa, sum, sq = 0, 0, 0
  for _, v in ipairs(w) do
    maxa = math.max(maxa, math.abs(v)); sum = sum + v; sq = sq + v * v
  end
  T.eq(maxa <= bound, true, "weights within bound")
  T.eq(maxa > 0.99 * bound, true, "weights fill the bound")
  local n = #w
  T.near(sum / n, 0, 0.01)
  T.near(sq / n, bound * bound / 3, 0.05 * bound * bound / 3 + 1e-4) -- var of U(-b, b) = b^2/3
  local b = l.bias:flat_table()
  local bmax = 0
  for _, v in ipairs(b) do bmax = math.max(bmax, math.abs(v)) end
  T.eq(bmax <= bound and bmax > 0.95 * bound, true, "bias bound")
  T.eq(shape(l.weight), "1000x37")
  -- Embedding ~ N(0, 1)
  local e = nn.Embedding(500, 40).weight:flat_table()
  local es, eq = 0, 0
  for _, v in ipairs(e) do es = es + v; eq = eq + v * v end
  T.near(es / #e, 0, 0.03); T.near(eq / #e, 1, 0.05)
  -- xavier / kaiming helpers against the formulas
  local t = zr.empty(13, 7)
  nn.init.xavier_uniform_(t, 2)
  local xb = 2 * math.sqrt(6 / 20)
  for _, v in ipairs(t:flat_table()) do T.eq(math.abs(v) <= xb, true) end
  T.near(nn.init.calculate_gain("relu"), math.sqrt(2), 1e-15)
  T.near(nn.init.calculate_gain("leaky_relu", math.sqrt(5)), math.sqrt(1 / 3), 1e-15)
  T.raises(function() nn.init.kaiming_uniform_(zr.empty(5)) end, "fewer than 2 dims")
end)

T.test("Linear forward against a hand computation", function()
  local l = nn.Linear(3, 2)
  l.weight:copy_(zr.tensor({ { 1, 2, 3 }, { -1, 0.5, 0 } }))
  l.bias:copy_(zr.tensor({ 0.25, -2 }))
  local x = zr.tensor({ { 1, 1, 1 }, { 2, -1, 0.5 } })
  T.near(l(x), { { 6.25, -2.5 }, { 1.75, -4.5 } }, 1e-6)
  local nb = nn.Linear(3, 2, { bias = false })
  T.eq(nb.bias, nil)
  T.eq(#nb:parameters(), 1)
end)

T.test("train/eval switch Dropout recursively", function()
  local inner = nn.Sequential(nn.Dropout(0.5))
  local m = nn.Sequential(nn.ReLU(), inner)
  local x = zr.ones(4000)
  local y = m(x):flat_table()
  local zeros, twos = 0, 0
  for _, v in ipairs(y) do
    if v == 0 then zeros = zeros + 1 elseif math.abs(v - 2) < 1e-6 then twos = twos + 1 end
  end
  T.eq(zeros + twos, 4000, "outputs are 0 or 1/(1-p)")
  T.eq(zeros > 1800 and zeros < 2200, true, "about half dropped: " .. zeros)
  m:eval()
  T.eq(inner[1].training, false)
  T.near(m(x), x, 0, 0)
  m:train()
  T.eq(inner[1].training, true)
  T.raises(function() nn.Dropout(1.5) end, "probability in [0, 1]")
end)

T.test("activation modules match their definitions", function()
  local xs = { -2.5, -0.3, 0, 0.7, 3 }
  local x = zr.tensor(xs, { dtype = "f64" })
  local function each(f) local o = {}; for i, v in ipairs(xs) do o[i] = f(v) end; return o end
  local sig = function(v) return 1 / (1 + math.exp(-v)) end
  T.near(nn.ReLU()(x), each(function(v) return math.max(v, 0) end), 1e-12)
  T.near(nn.SiLU()(x), each(function(v) return v * sig(v) end), 1e-12)
  T.near(nn.Sigmoid()(x), each(sig), 1e-12)
  T.near(nn.Tanh()(x), each(math.tanh), 1e-12)
  T.near(nn.GELU("tanh")(x), each(function(v)
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3))) end), 1e-12)
  -- erf GELU at known values: gelu(1) = 0.8413447460685429, gelu(-1) = -0.15865525393145707
  T.near(nn.GELU()(zr.tensor({ 1, -1 }, { dtype = "f64" })), { 0.8413447460685429, -0.15865525393145707 }, 1e-12)
  T.raises(function() nn.GELU("fast") end, "approximate must be")
end)

T.test("RMSNorm and LayerNorm modules against hand values", function()
  local x = zr.tensor({ { 1, 2, 3, 4 }, { -1, 0, 1, 2 } }, { dtype = "f64" })
  local r = nn.RMSNorm(4, 1e-6):double()
  r.weight:copy_(zr.tensor({ 1, 2, 0.5, -1 }))
  local rows = { { 1, 2, 3, 4 }, { -1, 0, 1, 2 } }
  local expect = {}
  for i, row in ipairs(rows) do
    local ms = 0
    for _, v in ipairs(row) do ms = ms + v * v / 4 end
    local inv = 1 / math.sqrt(ms + 1e-6)
    expect[i] = { row[1] * inv * 1, row[2] * inv * 2, row[3] * inv * 0.5, row[4] * inv * -1 }
  end
  T.near(r(x), expect, 1e-12)
  local ln = nn.LayerNorm(4):double()
  for i, row in ipairs(rows) do
    local mean, var = 0, 0
    for _, v in ipairs(row) do mean = mean + v / 4 end
    for _, v in ipairs(row) do var = var + (v - mean) ^ 2 / 4 end
    for j = 1, 4 do expect[i][j] = (row[j] - mean) / math.sqrt(var + 1e-5) end
  end
  T.near(ln(x), expect, 1e-12)
  T.eq(table.concat(ln:state_dict_keys(), ","), "weight,bias")
end)

-- Reference cross entropy: mean over non-ignored rows of (1-eps)*nll + eps * mean_c(-logp_c).
local function ce_ref(logits, targets, ignore, eps, reduction)
  local per, total, count = {}, 0, 0
  for i, row in ipairs(logits) do
    local mx = -math.huge
    for _, v in ipairs(row) do mx = math.max(mx, v) end
    local s = 0
    for _, v in ipairs(row) do s = s + math.exp(v - mx) end
    local lse = mx + math.log(s)
    if targets[i] == ignore then per[i] = 0
    else
      local smooth = 0
      for _, v in ipairs(row) do smooth = smooth + (lse - v) / #row end
      per[i] = (1 - eps) * (lse - row[targets[i] + 1]) + eps * smooth
      total, count = total + per[i], count + 1
    end
  end
  if reduction == "none" then return per end
  if reduction == "sum" then return total end
  return total / count
end

T.test("CrossEntropyLoss against a hand value", function()
  local L = { { 2, 1, 0.1, -1, 0.5 }, { 0.3, 0.3, 2.2, 1, -3 }, { -1, 4, 0, 0, 1 } }
  local tg = { 0, 2, 4 }
  local logits = zr.tensor(L, { dtype = "f64" })
  local targets = zr.tensor(tg, { dtype = "i64" })
  -- first row by hand: log(e^2 + e^1 + e^0.1 + e^-1 + e^0.5) - 2
  local lse1 = math.log(math.exp(2) + math.exp(1) + math.exp(0.1) + math.exp(-1) + math.exp(0.5))
  T.near(nn.CrossEntropyLoss{ reduction = "none" }(logits, targets)[1], lse1 - 2, 1e-12)
  T.near(nn.CrossEntropyLoss()(logits, targets), ce_ref(L, tg, -100, 0, "mean"), 1e-12)
  T.near(nn.CrossEntropyLoss{ reduction = "sum" }(logits, targets), ce_ref(L, tg, -100, 0, "sum"), 1e-12)
  local tgi = { 0, -100, 4 }
  local ti = zr.tensor(tgi, { dtype = "i64" })
  T.near(nn.CrossEntropyLoss()(logits, ti), ce_ref(L, tgi, -100, 0, "mean"), 1e-12)
  T.near(nn.CrossEntropyLoss{ ignore_index = 2 }(logits, zr.tensor({ 0, 2, 4 }, { dtype = "i64" })),
    ce_ref(L, { 0, 2, 4 }, 2, 0, "mean"), 1e-12)
  T.near(nn.CrossEntropyLoss{ label_smoothing = 0.1 }(logits, ti), ce_ref(L, tgi, -100, 0.1, "mean"), 1e-12)
  T.raises(function() nn.CrossEntropyLoss{ reduction = "avg" } end, "reduction must be")
end)

T.test("gradients flow through modules (float64 finite differences)", function()
  local m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)):double()
  for _, p in ipairs(m:parameters()) do T.eq(p:dtype(), "f64"); T.eq(p.is_leaf and p.requires_grad, true) end
  local x = zr.randn({ 5, 3 }, { dtype = "f64" })
  local p = m:parameters()
  T.gradcheck(function() return m(x) end, p)
end)

T.test("apply, zero_grad, forward hooks, to()", function()
  local m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
  local seen = {}
  m:apply(function(mod) seen[#seen + 1] = mod.__name end)
  T.eq(table.concat(seen, ","), "Linear,Linear,Sequential")
  m(zr.randn(3, 2)):sum():backward()
  T.eq(m[1].weight.grad ~= nil, true)
  m:zero_grad(false)
  T.near(m[1].weight.grad, { 0, 0, 0, 0 })
  m:zero_grad()
  T.eq(m[1].weight.grad, nil)
  local calls = {}
  local h1 = m[2]:register_forward_pre_hook(function(mod, x) calls[#calls + 1] = "pre" end)
  local h2 = m[2]:register_forward_hook(function(mod, out) calls[#calls + 1] = "post"; return out * 0 end)
  T.near(m(zr.randn(3, 2)), { 0, 0, 0 })
  T.eq(table.concat(calls, ","), "pre,post")
  h1.remove(); h2.remove()
  T.eq(T.diff(m(zr.ones(1, 2)), { 0 }) > 0, true)
  m:to("bf16")
  T.eq(m[1].weight:dtype(), "bf16")
  T.eq(m[1].weight:category(), "params")
  T.eq(m[1].weight.is_leaf and m[1].weight.requires_grad, true)
  m:float()
  T.eq(m[2].bias:dtype(), "f32")
end)

-- ---------- zr.data ----------

local data = zr.data

T.test("DataLoader batch counts with and without drop_last", function()
  local x = zr.arange(0, 23 * 3):view(23, 3):float()
  local y = zr.arange(23)
  local ds = data.TensorDataset(x, y)
  T.eq(ds:len(), 23)
  for _, c in ipairs { { 5, false, 5, 3 }, { 5, true, 4, 5 }, { 1, false, 23, 1 }, { 23, true, 1, 23 }, { 30, true, 0, 0 }, { 30, false, 1, 23 } } do
    local bs, drop, nb, last = c[1], c[2], c[3], c[4]
    local dl = data.DataLoader{ dataset = ds, batch_size = bs, drop_last = drop }
    T.eq(dl:len(), nb, ("len bs=%d drop=%s"):format(bs, tostring(drop)))
    local n, lastsize = 0, 0
    for xb, yb in dl:iter() do
      n = n + 1
      lastsize = xb:size(1)
      T.eq(yb:size(1), xb:size(1)); T.eq(xb:size(2), 3); T.eq(yb:dtype(), "i64")
      -- rows stay paired: x[i] = 3*y[i] + {0, 1, 2}
      local xf, yf = xb:flat_table(), yb:flat_table()
      for r = 1, #yf do T.eq(xf[3 * (r - 1) + 1], 3 * yf[r]) end
    end
    T.eq(n, nb); T.eq(lastsize, last)
  end
  T.raises(function() data.DataLoader{ dataset = ds, batch_size = 0 } end, "batch_size must be a positive integer")
  T.raises(function() data.DataLoader{ dataset = ds, bs = 2 } end, "unknown option 'bs'")
  T.raises(function() data.TensorDataset(x, zr.arange(22)) end, "size mismatch")
end)

local function epoch_order(dl)
  local out = {}
  for _, yb in dl:iter() do for _, v in ipairs(yb:flat_table()) do out[#out + 1] = v end end
  return out
end

T.test("DataLoader shuffling: deterministic per seed, new order per epoch, each sample once", function()
  local n = 37
  local ds = data.TensorDataset(zr.zeros(n, 2), zr.arange(n))
  local a = data.DataLoader{ dataset = ds, batch_size = 4, shuffle = true, seed = 11 }
  local b = data.DataLoader{ dataset = ds, batch_size = 4, shuffle = true, seed = 11 }
  local c = data.DataLoader{ dataset = ds, batch_size = 4, shuffle = true, seed = 12 }
  local a1, a2, b1, b2, c1 = epoch_order(a), epoch_order(a), epoch_order(b), epoch_order(b), epoch_order(c)
  T.eq(table.concat(a1, ","), table.concat(b1, ","), "same seed, epoch 0")
  T.eq(table.concat(a2, ","), table.concat(b2, ","), "same seed, epoch 1")
  T.eq(table.concat(a1, ",") ~= table.concat(a2, ","), true, "epochs differ")
  T.eq(table.concat(a1, ",") ~= table.concat(c1, ","), true, "seeds differ")
  local ident = {}
  for i = 0, n - 1 do ident[#ident + 1] = i end
  T.eq(table.concat(a1, ",") ~= table.concat(ident, ","), true, "shuffled")
  for _, order in ipairs { a1, a2, c1 } do
    local seen = {}
    for _, v in ipairs(order) do T.eq(seen[v], nil, "duplicate"); seen[v] = true end
    T.eq(#order, n)
  end
  -- set_epoch replays an epoch
  a:set_epoch(1)
  T.eq(table.concat(epoch_order(a), ","), table.concat(a2, ","))
  -- no shuffle: identity order
  T.eq(table.concat(epoch_order(data.DataLoader{ dataset = ds, batch_size = 5 }), ","), table.concat(ident, ","))
end)

T.test("DataLoader over plain samples with default_collate", function()
  local samples = {}
  for i = 1, 7 do samples[i] = { x = zr.full({ 2 }, i), label = i - 1, w = i + 0.5 } end
  local dl = data.DataLoader{ dataset = samples, batch_size = 3 }
  local batches = {}
  for b in dl:iter() do batches[#batches + 1] = b end
  T.eq(#batches, 3)
  T.eq(shape(batches[1].x), "3x2"); T.near(batches[1].x, { 1, 1, 2, 2, 3, 3 })
  T.eq(batches[1].label:dtype(), "i64"); T.near(batches[3].label, { 6 })
  T.eq(batches[2].w:dtype(), "f32"); T.near(batches[2].w, { 4.5, 5.5, 6.5 })
  local seen = 0
  local custom = data.DataLoader{ dataset = samples, batch_size = 4, collate_fn = function(s) seen = seen + #s; return s end }
  for _ in custom:iter() do end
  T.eq(seen, 7)
end)

-- ---------- end to end ----------

T.test("a tiny MLP overfits 16 samples", function()
  zr.manual_seed(3)
  local x = zr.randn(16, 8)
  local y = zr.tensor({ 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0 }, { dtype = "i64" })
  local m = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
  local opt = zr.optim.AdamW(m:parameters(), { lr = 1e-2, weight_decay = 0 })
  local loss_fn = nn.CrossEntropyLoss()
  local first, last
  for step = 1, 300 do
    local loss = loss_fn(m(x), y)
    opt:zero_grad()
    loss:backward()
    opt:step()
    last = loss:item()
    first = first or last
  end
  T.eq(first > 0.8, true, "starts near log(3): " .. first)
  T.eq(last < 1e-2, true, "final loss " .. last)
end)

T.done()
