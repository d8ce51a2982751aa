-- zr.conv1d(x, w, b) = x w + b with w stored (in, out) (Hugging Face's Conv1D, GPT-2's projections):
-- values and every gradient against naive Lua loops in doubles, f64 gradchecks, the composition
-- x:matmul(w) + b in f32 and bf16 (with and without bias, into gradients that already hold values),
-- errors; zr.mlp_gelu with layout "conv1d"; GPT-2 through the ZeRO engine (accumulation over micro
-- batches, the stale gradient after zero_grad) against a reference forward built from matmul.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(17)

local function r(shape, s) return (zr.randn(shape, { dtype = "f64" }) * (s or 1)):detach():requires_grad_(true) end

-- y, dx, dw, db of y = x w + b and the loss sum(y * g), as Lua loops in doubles over the tensors'
-- values: x (rows, in), w (in, out), b (out) or nil, g (rows, out).
local function naive(x, w, b, g)
  local rows, nin, nout = x:size(1), x:size(2), w:size(2)
  local fx, fw, fb, fg = x:flat_table(), w:flat_table(), b and b:flat_table(), g:flat_table()
  local y, dx, dw, db = {}, {}, {}, {}
  for i = 0, rows - 1 do
    for o = 0, nout - 1 do
      local v = fb and fb[o + 1] or 0
      for k = 0, nin - 1 do v = v + fx[i * nin + k + 1] * fw[k * nout + o + 1] end
      y[i * nout + o + 1] = v
    end
    for k = 0, nin - 1 do
      local v = 0
      for o = 0, nout - 1 do v = v + fg[i * nout + o + 1] * fw[k * nout + o + 1] end
      dx[i * nin + k + 1] = v
    end
  end
  for k = 0, nin - 1 do
    for o = 0, nout - 1 do
      local v = 0
      for i = 0, rows - 1 do v = v + fx[i * nin + k + 1] * fg[i * nout + o + 1] end
      dw[k * nout + o + 1] = v
    end
  end
  for o = 0, nout - 1 do
    local v = 0
    for i = 0, rows - 1 do v = v + fg[i * nout + o + 1] end
    db[o + 1] = v
  end
  return y, dx, dw, db
end

local SHAPES = { { 1, 1, 1 }, { 7, 5, 3 }, { 13, 11, 17 }, { 4, 1, 9 }, { 3, 8, 1 } }

T.test("conv1d forward and gradients match Lua loops of x w + b (f64, f32; with and without bias)", function()
  for _, dt in ipairs { "f64", "f32" } do
    local tol = dt == "f64" and 1e-12 or 2e-5
    for _, s in ipairs(SHAPES) do
      local rows, nin, nout = s[1], s[2], s[3]
      for _, bias in ipairs { true, false } do
        local x = zr.randn({ rows, nin }):to(dt):requires_grad_(true)
        local w = zr.randn({ nin, nout }):to(dt):requires_grad_(true)
        local b = bias and zr.randn({ nout }):to(dt):requires_grad_(true) or nil
        local g = zr.randn({ rows, nout }):to(dt)
        local y = zr.conv1d(x, w, b)
        y:backward(g)
        local ny, ndx, ndw, ndb = naive(x, w, b, g)
        local what = ("%s %dx%d -> %d%s"):format(dt, rows, nin, nout, bias and "" or " no bias")
        T.eq(y:dtype(), dt, what .. " dtype")
        T.eq(table.concat(w.grad:shape(), ","), nin .. "," .. nout, what .. " dw is (in, out)")
        T.near(y, ny, tol, tol, what .. " y")
        T.near(x.grad, ndx, tol, tol, what .. " dx")
        T.near(w.grad, ndw, tol, tol, what .. " dw")
        if bias then T.near(b.grad, ndb, tol, tol, what .. " db") end
      end
    end
  end
  -- by hand: x (1, 2) = [1, 2], w (2, 3) = [[1, 0, -1], [2, 1, 0]], b = [10, 20, 30]
  local y = zr.conv1d(zr.tensor({ { 1, 2 } }), zr.tensor({ { 1, 0, -1 }, { 2, 1, 0 } }), zr.tensor({ 10, 20, 30 }))
  T.near(y, { 15, 22, 29 }, 0, 0, "by hand")
end)

T.test("gradcheck conv1d (f64 central differences): x, w, b; 3-D input; some inputs without grad", function()
  T.gradcheck(zr.conv1d, { r({ 1, 1 }), r({ 1, 1 }), r({ 1 }) })
  T.gradcheck(zr.conv1d, { r({ 7, 5 }), r({ 5, 3 }), r({ 3 }) })
  T.gradcheck(function(x, w) return zr.conv1d(x, w) end, { r({ 2, 3, 5 }), r({ 5, 11 }) })
  local d = { dtype = "f64" }
  T.gradcheck(zr.conv1d, { zr.randn({ 3, 4 }, d), r({ 4, 5 }), r({ 5 }) })
  T.gradcheck(zr.conv1d, { r({ 3, 4 }), zr.randn({ 4, 5 }, d), zr.randn({ 5 }, d) })
  T.gradcheck(zr.conv1d, { zr.randn({ 3, 4 }, d), zr.randn({ 4, 5 }, d), r({ 5 }) })
end)

-- Two backward passes of f (x, w, b) into w.grad and b.grad set beforehand (f32 for a bf16 w, as
-- the engine's partition, or w's own dtype). Returns y of the first pass, both dx, dw and db.
local function two_passes(f, dt, gdt, xs, w0, b0, gw0, gb0, gys)
  local w = w0:to(dt):detach():requires_grad_(true)
  local b = b0 and b0:to(dt):detach():requires_grad_(true)
  w.grad = gw0:to(gdt):clone()
  if b then b.grad = gb0:to(gdt):clone() end
  local out = { dx = {} }
  for i = 1, 2 do
    local x = xs[i]:to(dt):detach():requires_grad_(true)
    local y = f(x, w, b)
    if i == 1 then out.y = y end
    y:backward(gys[i]:to(dt))
    out.dx[i] = x.grad
  end
  out.dw, out.db = w.grad, b and b.grad
  return out
end

T.test("conv1d equals x:matmul(w) + b: values and gradients, f32 and bf16, 3-D, no bias, existing gradients", function()
  local tols = { f32 = 1e-5, bf16 = 1e-2 }
  for _, dt in ipairs { "f32", "bf16" } do
    for _, gdt in ipairs { "f32", dt } do
      for _, s in ipairs { { 2, 1, 1, 1 }, { 3, 7, 13, 5 }, { 2, 33, 24, 72 }, { 1, 64, 16, 9 } } do
        for _, bias in ipairs { true, false } do
          local B, rows, nin, nout = s[1], s[2], s[3], s[4]
          local xs = { zr.randn({ B, rows, nin }), zr.randn({ B, rows, nin }) }
          local gys = { zr.randn({ B, rows, nout }), zr.randn({ B, rows, nout }) }
          local w0, b0 = zr.randn({ nin, nout }), bias and zr.randn({ nout }) or nil
          local gw0, gb0 = zr.randn({ nin, nout }), zr.randn({ nout })
          local got = two_passes(zr.conv1d, dt, gdt, xs, w0, b0, gw0, gb0, gys)
          local want = two_passes(function(x, w, b)
            local y = x:matmul(w)
            return b and y + b or y
          end, dt, gdt, xs, w0, b0, gw0, gb0, gys)
          local what = ("%s, %s grads, %dx%dx%d -> %d%s"):format(dt, gdt, B, rows, nin, nout, bias and "" or ", no bias")
          local t = tols[dt]
          T.eq(got.y:dtype(), dt, what .. " y dtype")
          T.eq(got.dw:dtype(), gdt, what .. " dw dtype")
          -- scaled by the magnitudes: sums of up to 2 * 64 products of N(0, 1) values
          local sc = math.sqrt(math.max(nin, nout, B * rows)) * 3
          T.near(got.y:float(), want.y:float(), t * sc, t, what .. " y")
          for i = 1, 2 do T.near(got.dx[i]:float(), want.dx[i]:float(), t * sc, t, what .. " dx " .. i) end
          T.near(got.dw:float(), want.dw:float(), t * sc, t, what .. " dw")
          if bias then T.near(got.db:float(), want.db:float(), t * sc, t, what .. " db") end
        end
      end
    end
  end
end)

T.test("conv1d errors name the op, the shapes and the fix", function()
  T.raises(function() zr.conv1d(zr.ones({ 2, 3 }), zr.ones({ 4, 5 })) end,
    "conv1d: input (2,3) and weight (4,5) do not match: 3 ≠ 4")
  T.raises(function() zr.conv1d(zr.ones({ 2, 3 }), zr.ones({ 3, 4 }), zr.ones({ 3 })) end,
    "conv1d: bias must have shape (4) to match weight (3,4), got (3)")
  T.raises(function() zr.conv1d(zr.ones({ 2, 3 }), zr.ones({ 3 })) end,
    "conv1d: weight must be 2-D (in_features, out_features), got (3)")
  T.raises(function() zr.conv1d(zr.ones({ 2, 3 }), zr.ones({ 3, 4 }, { dtype = "i64" })) end, "conv1d")
end)

-- ---------- mlp_gelu with Conv1D weights ----------

local function mlp_conv1d(x, wf, bf, wp, bp) return zr.mlp_gelu(x, wf, bf, wp, bp, "conv1d") end
local function mlp_plain(x, wf, bf, wp, bp) return zr.conv1d(zr.conv1d(x, wf, bf):gelu("tanh"), wp, bp) end
local function mlp_matmul(x, wf, bf, wp, bp)
  local h = x:matmul(wf)
  if bf then h = h + bf end
  local y = h:gelu("tanh"):matmul(wp)
  return bp and y + bp or y
end

T.test("mlp_gelu 'conv1d' equals conv1d, gelu('tanh'), conv1d and the matmul composition (f64, f32, bf16)", function()
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    for _, s in ipairs { { 1, 1, 1, 1 }, { 7, 5, 16, 3 }, { 13, 12, 24, 7 } } do
      local rows, nin, hid, nout = s[1], s[2], s[3], s[4]
      local ins = { (zr.randn({ 2, rows, nin }) * 2):to(dt), zr.randn({ nin, hid }):to(dt), zr.randn({ hid }):to(dt),
        zr.randn({ hid, nout }):to(dt), zr.randn({ nout }):to(dt) }
      local gy = zr.randn({ 2, rows, nout }):to(dt)
      local function run(f, nobias)
        local a = {}
        for i = 1, 5 do a[i] = ins[i]:detach():requires_grad_(true) end
        local y = f(a[1], a[2], not nobias and a[3] or nil, a[4], not nobias and a[5] or nil)
        y:backward(gy)
        return { y, a[1].grad, a[2].grad, a[3].grad, a[4].grad, a[5].grad }
      end
      for _, nobias in ipairs { false, true } do
        local what = ("%s %dx%d->%d->%d%s"):format(dt, rows, nin, hid, nout, nobias and " no bias" or "")
        local fused, plain, mm = run(mlp_conv1d, nobias), run(mlp_plain, nobias), run(mlp_matmul, nobias)
        local t = dt == "bf16" and 3e-2 or dt == "f32" and 1e-4 or 1e-10
        for i, name in ipairs { "y", "dx", "dw_fc", "db_fc", "dw_proj", "db_proj" } do
          if nobias and (i == 4 or i == 6) then
            T.eq(fused[i], nil, what .. " " .. name .. " (no bias: none)")
          else
            T.eq(fused[i]:dtype(), dt, what .. " " .. name .. " dtype")
            T.near(fused[i], plain[i], 0, 0, what .. " " .. name) -- the same CPU ops in the same order
            T.near(fused[i]:float(), mm[i]:float(), t * 10, t, what .. " " .. name .. " vs matmul")
          end
        end
      end
    end
  end
end)

T.test("gradcheck mlp_gelu 'conv1d' (f64 central differences); layout errors", function()
  T.gradcheck(mlp_conv1d, { r({ 4, 6 }, 2), r({ 6, 16 }), r({ 16 }), r({ 16, 5 }), r({ 5 }) })
  T.gradcheck(function(x, wf, wp) return zr.mlp_gelu(x, wf, nil, wp, nil, "conv1d") end,
    { r({ 2, 3, 4 }, 2), r({ 4, 7 }), r({ 7, 2 }) })
  T.raises(function() zr.mlp_gelu(zr.ones({ 2, 3 }), zr.ones({ 3, 4 }), nil, zr.ones({ 4, 2 }), nil, "hf") end,
    "mlp_gelu: layout must be 'linear' (weights (out, in)) or 'conv1d' (weights (in, out)), got 'hf'")
  T.raises(function() mlp_conv1d(zr.ones({ 2, 3 }), zr.ones({ 4, 5 }), nil, zr.ones({ 5, 2 })) end,
    "mlp_gelu: conv1d: input (2,3) and weight (4,5) do not match: 3 ≠ 4")
  T.raises(function() mlp_conv1d(zr.ones({ 2, 3 }), zr.ones({ 3, 4 }), nil, zr.ones({ 5, 2 })) end,
    "mlp_gelu (second linear): conv1d: input (2,4) and weight (5,2) do not match: 4 ≠ 5")
end)

-- ---------- GPT-2 through the engine ----------

-- GPT2LMHeadModel's forward with every Conv1D as x:matmul(w) + b and c_attn as one product split
-- into q, k, v afterwards (neither the model's zr.conv1d nor its attention layout).
local function gpt2_reference(cfg, P, ids)
  local B, Tn, C, H = ids:size(1), ids:size(2), cfg.n_embd, cfg.n_head
  local function conv(x, name) return x:matmul(P[name .. ".weight"]) + P[name .. ".bias"] end
  local function ln(x, name) return zr.layer_norm(x, P[name .. ".weight"], P[name .. ".bias"], cfg.layer_norm_epsilon) end
  local x = zr.embedding(P["transformer.wte.weight"], ids) + zr.embedding(P["transformer.wpe.weight"], zr.arange(Tn))
  for l = 0, cfg.n_layer - 1 do
    local pre = "transformer.h." .. l .. "."
    local qkv = conv(ln(x, pre .. "ln_1"), pre .. "attn.c_attn")
    local function heads(i) return qkv:narrow(3, i * C + 1, C):reshape(B, Tn, H, C / H):transpose(2, 3) end
    local o = zr.scaled_dot_product_attention(heads(0), heads(1), heads(2))
    x = x + conv(o:transpose(2, 3):reshape(B, Tn, C), pre .. "attn.c_proj")
    x = x + conv(conv(ln(x, pre .. "ln_2"), pre .. "mlp.c_fc"):gelu("tanh"), pre .. "mlp.c_proj")
  end
  local logits = zr.linear(ln(x, "transformer.ln_f"), P["transformer.wte.weight"])
  return zr.models.llama.causal_lm_loss(logits, ids)
end

-- Stage 0 on one rank (direct mode: every .grad is a view of the fp32 partition), lr 0 and two
-- micro-batches per step: the first micro-step's gradient, the accumulated one at the boundary,
-- then (after the step's zero_grad left the partition stale) the first one again, overwritten.
T.test("GPT-2 through the engine: Conv1D gradients accumulated over micro-batches and after zero_grad", function()
  local cfg = { n_embd = 24, n_layer = 2, n_head = 3, vocab_size = 53, n_positions = 32, dtype = "f32" }
  zr.manual_seed(9)
  local model = zr.models.gpt2.GPT2LMHeadModel(cfg)
  local P = {}
  for name, p in model:named_parameters() do P[name] = p:detach():clone():requires_grad_(true) end
  local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = 2,
    steps_per_print = 1e6, gradient_accumulation_steps = 2,
    optimizer = { type = "AdamW", params = { lr = 0.0 } }, zero_optimization = { stage = 0 } } })
  local ids = (zr.rand({ 2, 11 }) * 52):to("i64")
  gpt2_reference(model.config, P, ids):backward()
  local function micro()
    local out = engine(ids, ids)
    engine:backward(out.loss)
    local g = {}
    for name, p in model:named_parameters() do g[name] = p.grad:clone() end
    engine:step()
    return g
  end
  -- (the engine scales the loss by 1 / gradient_accumulation_steps)
  for i, scale in ipairs { 0.5, 1, 0.5 } do
    local g = micro()
    for name in pairs(P) do T.near(g[name], P[name].grad * scale, 2e-6, 1e-4, ("micro-step %d: %s"):format(i, name)) end
  end
end)

T.done()
