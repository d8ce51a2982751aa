-- zr.conv1d and zr.mlp_gelu(..., "conv1d") on CUDA (the (in, out) weight read in place, dW made
-- (in, out) by one GEMM, straight into an existing gradient) vs the CPU op: forward and every
-- gradient at awkward sizes, f32/bf16/f16; two micro-batches into gradients that already hold
-- values (f32 for 16-bit weights, as the engine's partition: beta 1); GPT-2 through the ZeRO engine
-- (the partition's stale gradient after zero_grad: beta 0; stages 0-3, gradient accumulation).
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("conv1d") then return end
local zr, T, randn, both, close = C.zr, C.T, C.randn, C.both, C.close

T.test("conv1d: f32/bf16/f16 forward and every gradient vs the CPU (bias epilogue, no bias, 3-D, sizes 1 and primes)", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    -- 1543 and 2100 rows: the chunked bias-gradient sum; 70 and 264 columns
    for _, s in ipairs { { 1, 1, 1 }, { 7, 13, 5 }, { 127, 33, 65 }, { 3, 64, 257 }, { 1543, 37, 70 }, { 2100, 16, 264 } } do
      local rows, nin, nout = s[1], s[2], s[3]
      local what = ("conv1d %s %dx%d->%d"):format(dt, rows, nin, nout)
      both(what, dt, { randn({ rows, nin }), randn({ nin, nout }), randn({ nout }) }, zr.conv1d, 2)
      both(what .. " no bias, 3-D", dt, { randn({ 2, rows, nin }), randn({ nin, nout }) }, zr.conv1d, 2)
    end
    -- only some inputs want gradients: the weight and bias (x is data), the bias alone
    both("conv1d, x without grad " .. dt, dt, { randn({ 1543, 9 }), randn({ 9, 24 }), randn({ 24 }) }, zr.conv1d, 2, { true })
    both("conv1d, bias grad only " .. dt, dt, { randn({ 1543, 9 }), randn({ 9, 24 }), randn({ 24 }) }, zr.conv1d, 2,
      { true, true })
    -- a column slice of the weight (GPT-2's c_attn read as three products): a strided (in, out) view
    both("conv1d on a column slice of the weight " .. dt, dt, { randn({ 2, 37, 16 }), randn({ 16, 72 }), randn({ 72 }) },
      function(x, w, b) return zr.conv1d(x, w:narrow(2, 25, 24), b:narrow(1, 25, 24)) end, 2)
  end
  -- GPT-2's c_attn width (768 -> 2304) on a few rows
  both("conv1d 256x768 -> 2304", "bf16", { randn({ 256, 768 }) * 0.5, randn({ 768, 2304 }) * 0.05, randn({ 2304 }) * 0.1 },
    zr.conv1d, 2)
  both("conv1d f64", "f64", { randn({ 5, 7 }):to("f64"), randn({ 7, 3 }):to("f64"), randn({ 3 }):to("f64") }, zr.conv1d)
  T.raises(function() zr.conv1d(zr.ones({ 2, 3 }, { device = "cuda" }), zr.ones({ 3, 8 })) end, "conv1d")
end)

-- Two micro-batches of backward into leaf gradients that already hold values: f32 buffers for
-- 16-bit weights (the ZeRO engine's partition: dW lands there through the product with beta 1) and
-- gradients of the weight's own dtype. f(x, ps...) with ps the parameters. Returns the parameters'
-- gradients, then both dX.
local function two_micro_batches(f, dev, dt, gdt, xs, ps, g0s, gys)
  local p = {}
  for i, v in ipairs(ps) do
    p[i] = v:to(dt):to(dev):detach():requires_grad_(true)
    p[i].grad = g0s[i]:to(gdt):to(dev):clone()
  end
  local dx = {}
  for i = 1, 2 do
    local x = xs[i]:to(dt):to(dev):detach():requires_grad_(true)
    ;(f(x, C.unpack(p)):float() * gys[i]:to(dev)):sum():backward()
    dx[i] = x.grad:cpu()
  end
  local out = {}
  for i = 1, #p do out[i] = p[i].grad:cpu() end
  out[#p + 1], out[#p + 2] = dx[1], dx[2]
  return out
end

local function compare_micro_batches(f, name, dt, gdt, xs, ps, gys, names)
  local g0s = {}
  for i, v in ipairs(ps) do g0s[i] = randn(v:shape()) end
  local c = two_micro_batches(f, "cpu", dt, gdt, xs, ps, g0s, gys)
  local g = two_micro_batches(f, "cuda", dt, gdt, xs, ps, g0s, gys)
  for i, n in ipairs(names) do
    T.eq(g[i]:dtype(), gdt, name .. " " .. n .. " dtype")
    close(g[i], c[i], dt, name .. " " .. n, 2, 1e-3)
  end
  for i = 1, 2 do close(g[#ps + i], c[#ps + i], dt, name .. " dX " .. i, 2, 1e-3) end
end

T.test("conv1d: weight and bias gradients, 2 micro-batches into existing gradients (f32 and own dtype)", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, gdt in ipairs { "f32", dt } do
      for _, s in ipairs { { 1, 1, 1 }, { 7, 13, 5 }, { 127, 33, 64 }, { 1543, 37, 70 }, { 2100, 16, 264 } } do
        local rows, nin, nout = s[1], s[2], s[3]
        local name = ("conv1d %s, %s grads, %dx%d->%d"):format(dt, gdt, rows, nin, nout)
        compare_micro_batches(zr.conv1d, name, dt, gdt, { randn({ rows, nin }), randn({ rows, nin }) },
          { randn({ nin, nout }), randn({ nout }) }, { randn({ rows, nout }), randn({ rows, nout }) }, { "dW", "db" })
      end
    end
  end
end)

local function mlp(x, wf, bf, wp, bp) return zr.mlp_gelu(x, wf, bf, wp, bp, "conv1d") end

T.test("mlp_gelu 'conv1d': forward and every gradient vs the CPU (dGELU epilogue and fallback widths)", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    -- hidden 8, 24, 64: the epilogues; 3, 13: the unfused fallback
    for _, s in ipairs { { 1, 1, 8, 1 }, { 7, 5, 24, 3 }, { 127, 13, 64, 17 }, { 7, 5, 3, 4 }, { 33, 17, 13, 8 } } do
      local rows, nin, hid, nout = s[1], s[2], s[3], s[4]
      local what = ("mlp_gelu conv1d %s %dx%d -> %d -> %d"):format(dt, rows, nin, hid, nout)
      both(what, dt, { randn({ rows, nin }) * 2, randn({ nin, hid }), randn({ hid }), randn({ hid, nout }), randn({ nout }) },
        mlp, 2)
      both(what .. " no biases", dt, { randn({ rows, nin }) * 2, randn({ nin, hid }), randn({ hid, nout }) },
        function(x, wf, wp) return mlp(x, wf, nil, wp) end, 2)
    end
    both("mlp_gelu conv1d, x without grad " .. dt, dt,
      { randn({ 5, 7 }) * 2, randn({ 7, 16 }), randn({ 16 }), randn({ 16, 3 }), randn({ 3 }) }, mlp, 2, { true })
  end
  both("mlp_gelu conv1d 256x768 -> 3072 -> 768", "bf16", { randn({ 256, 768 }) * 0.5, randn({ 768, 3072 }) * 0.05,
    randn({ 3072 }) * 0.1, randn({ 3072, 768 }) * 0.02, randn({ 768 }) * 0.1 }, mlp, 2)
end)

T.test("mlp_gelu 'conv1d': 2 micro-batches into existing gradients (f32 and own dtype)", function()
  for _, dt in ipairs { "f32", "bf16" } do
    for _, gdt in ipairs { "f32", dt } do
      for _, s in ipairs { { 7, 5, 24, 3 }, { 64, 48, 192, 48 } } do
        local rows, nin, hid, nout = s[1], s[2], s[3], s[4]
        local name = ("mlp_gelu conv1d %s, %s grads, %dx%d->%d->%d"):format(dt, gdt, rows, nin, hid, nout)
        compare_micro_batches(mlp, name, dt, gdt, { randn({ rows, nin }) * 2, randn({ rows, nin }) * 2 },
          { randn({ nin, hid }) * 0.3, randn({ hid }), randn({ hid, nout }) * 0.3, randn({ nout }) },
          { randn({ rows, nout }), randn({ rows, nout }) }, { "dW_fc", "db_fc", "dW_proj", "db_proj" })
      end
    end
  end
end)

-- ---------- GPT-2 through the engine ----------

local GPT2 = { n_embd = 64, n_layer = 2, n_head = 4, vocab_size = 97, n_positions = 32 }

local function gpt2(dev, dt)
  zr.manual_seed(9)
  local c = {}
  for k, v in pairs(GPT2) do c[k] = v end
  c.device, c.dtype = dev, dt
  return zr.models.gpt2.GPT2LMHeadModel(c)
end

-- Stage 0 on one rank (direct mode: every .grad is a view of the fp32 partition, dW goes into it
-- through the product), lr 0, two micro-batches per step: the first micro-step's gradients (beta 1
-- into the zeroed partition), the accumulated ones (beta 1), then after the step's zero_grad
-- (stale partition: beta 0) the first ones again. The same on the CPU is the reference.
T.test("GPT-2 through the engine: Conv1D gradients accumulated and after zero_grad, f32 and bf16, vs the CPU", function()
  local function run(dev, dt)
    local model = gpt2(dev, dt)
    local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = 2,
      steps_per_print = 1e6, gradient_accumulation_steps = 2, bf16 = { enabled = dt == "bf16" },
      optimizer = { type = "AdamW", params = { lr = 0.0 } }, zero_optimization = { stage = 0 } } })
    zr.manual_seed(5)
    local ids = (zr.rand({ 2, 24 }) * 96):to("i64"):to(dev)
    local steps = {}
    for i = 1, 3 do
      engine:backward(engine(ids, ids).loss)
      local g = {}
      for name, p in model:named_parameters() do g[name] = p.grad:float():cpu():clone() end
      steps[i] = g
      engine:step()
    end
    return steps
  end
  for _, dt in ipairs { "f32", "bf16" } do
    local cs, gs = run("cpu", dt), run("cuda", dt)
    for i = 1, 3 do
      for name, want in pairs(cs[i]) do
        close(gs[i][name], want, dt, ("%s micro-step %d: %s"):format(dt, i, name), 4, 1e-3)
      end
    end
    -- the third micro-step repeats the first (lr 0): overwritten, not added to the stale values
    -- (which would give 3x the first: dt's tolerance, as the attention backward need not round alike)
    for name, g1 in pairs(gs[1]) do close(gs[3][name], g1, dt, dt .. " after zero_grad: " .. name, 2, 1e-3) end
  end
end)

T.test("GPT-2 trains the same on CUDA as on the CPU: stages 0-3, gradient accumulation, ZeRO-3's fetch", function()
  local function run(dev, stage, gas)
    local model = gpt2(dev, "f32")
    local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = 2,
      gradient_accumulation_steps = gas, gradient_clipping = 1.0, steps_per_print = 1e6,
      optimizer = { type = "AdamW", params = { lr = 1e-3, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
      zero_optimization = { stage = stage, reduce_bucket_size = 3000 } } })
    local losses = {}
    for s = 1, 3 * gas do
      zr.manual_seed(100 + s)
      local ids = (zr.rand({ 2, 12 }) * 96):to("i64"):to(dev)
      local loss = engine(ids, ids).loss
      losses[s] = loss:item()
      engine:backward(loss)
      engine:step()
    end
    local w = {}
    for i, p in ipairs(engine:gather_parameters()) do w[i] = p:cpu():clone() end
    return losses, w
  end
  for _, c in ipairs { { 0, 1 }, { 0, 2 }, { 1, 2 }, { 2, 2 }, { 3, 1 }, { 3, 2 } } do
    local what = ("stage %d gas %d"):format(c[1], c[2])
    local lc, wc = run("cpu", c[1], c[2])
    local lg, wg = run("cuda", c[1], c[2])
    T.near(lg, lc, 1e-4, 1e-4, "losses, " .. what)
    for i = 1, #wc do T.near(wg[i], wc[i], 1e-4, 1e-4, ("%s weights of parameter %d"):format(what, i)) end
  end
end)

T.done()
