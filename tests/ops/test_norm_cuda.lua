-- rms_norm, layer_norm and their residual-add forms (add_rms_norm, add_layer_norm) on CUDA vs the
-- CPU, with and without affine parameters; rms_norm's unit_offset (Gemma's 1 + weight, rounded once).
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("norm") then return end
local zr, T, randn, both, close_big = C.zr, C.T, C.randn, C.both, C.close_big

T.test("rms_norm and layer_norm, with and without affine parameters", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, sh in ipairs { { 1, 1 }, { 7, 13 }, { 3, 5, 127 }, { 2, 2048 }, { 4, 4099 } } do
      local D = sh[#sh]
      local what = table.concat(sh, ",")
      -- D = 1: LayerNorm's x - mean is 0 and rstd = 1/sqrt(eps) ~ 316, so the exact zero input
      -- gradient comes out as rounding noise of size ~316 * 2^-24; RMSNorm's input gradient is
      -- w*dy*rstd*(1 - xhat^2) with xhat^2 = 1 - O(eps): the same cancellation. Compare at that scale
      local sl = D == 1 and 2000 or 2
      both("rms_norm " .. what, dt, { randn(sh), randn({ D }) }, function(x, w) return zr.rms_norm(x, w, 1e-6) end, sl)
      both("rms_norm no weight " .. what, dt, { randn(sh) }, function(x) return zr.rms_norm(x, nil, 1e-5) end, sl)
      both("rms_norm unit_offset (Gemma's) " .. what, dt, { randn(sh), randn({ D }) },
        function(x, w) return zr.rms_norm(x, w * 0.1, 1e-6, true) end, sl)
      both("layer_norm " .. what, dt, { randn(sh), randn({ D }), randn({ D }) },
        function(x, w, b) return zr.layer_norm(x, w, b, 1e-5) end, sl)
      both("layer_norm no affine " .. what, dt, { randn(sh) }, function(x) return zr.layer_norm(x) end, sl)
    end
  end
end)

-- the fused residual add (one kernel on the GPU, the composition on the CPU): y alone (h's
-- gradient is the norm's dx only) and y + h/2 (h has its own gradient: the norm's dx adds into it,
-- the kernel's dres path); D = 4099 and 2050 take the unvectorised kernel
T.test("add_rms_norm: h and y, gradients of x, r and the weight", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, sh in ipairs { { 1, 1 }, { 7, 13 }, { 3, 5, 127 }, { 2, 2048 }, { 5, 2050 }, { 4, 4099 }, { 33, 24 } } do
      local D = sh[#sh]
      local what = "add_rms_norm " .. table.concat(sh, ",")
      local sl = D == 1 and 2000 or 2
      both(what, dt, { randn(sh), randn(sh), randn({ D }) },
        function(x, r, w) return select(2, zr.add_rms_norm(x, r, w, 1e-6)) end, sl)
      both(what .. " y + h/2", dt, { randn(sh), randn(sh), randn({ D }) }, function(x, r, w)
        local h, y = zr.add_rms_norm(x, r, w, 1e-6)
        return y + h * 0.5
      end, sl)
      both(what .. " no weight, h", dt, { randn(sh), randn(sh) },
        function(x, r) return zr.add_rms_norm(x, r, nil, 1e-5) end, sl)
      both(what .. " unit_offset (Gemma's), y + h/2", dt, { randn(sh), randn(sh), randn({ D }) }, function(x, r, w)
        local h, y = zr.add_rms_norm(x, r, w * 0.1, 1e-6, true)
        return y + h * 0.5
      end, sl)
    end
  end
  -- shapes the kernel does not take: the composition, the same values
  both("add_rms_norm broadcast r", "bf16", { randn({ 4, 64 }), randn({ 64 }), randn({ 64 }) },
    function(x, r, w) return select(2, zr.add_rms_norm(x, r, w, 1e-6)) end, 2)
  both("add_rms_norm transposed x", "bf16", { randn({ 16, 8 }), randn({ 8, 16 }), randn({ 16 }) },
    function(x, r, w) return select(2, zr.add_rms_norm(x:transpose(1, 2), r, w, 1e-6)) end, 2)
end)

T.test("add_rms_norm on the GPU records the composition's nodes (add, rms_norm)", function()
  local x, r = randn({ 6, 40 }):cuda(), randn({ 6, 40 }):cuda()
  x.requires_grad = true
  local h, y = zr.add_rms_norm(x, r, nil, 1e-6)
  T.eq(h.grad_fn, "add")
  T.eq(y.grad_fn, "rms_norm")
  T.near(h:cpu(), x:detach():cpu() + r:cpu(), 0)
end)

T.test("rms_norm unit_offset on the GPU refuses a weight x's dtype does not hold (it would be rounded first)", function()
  local x = randn({ 3, 8 }):cuda():bfloat16()
  T.raises(function() zr.rms_norm(x, randn({ 8 }):cuda(), 1e-6, true) end,
    "rms_norm: unit_offset on cuda reads the weight in x's dtype (bf16), so a f32 weight would be rounded first")
  T.raises(function() zr.rms_norm(x, randn({ 8 }):cuda():to("f16"), 1e-6, true) end, "so a f16 weight would be rounded")
  -- (16-bit weights under f32 x widen exactly: the op runs)
  both("rms_norm unit_offset, f32 x, bf16 weight", "f32", { randn({ 3, 8 }), randn({ 8 }) },
    function(x, w) return zr.rms_norm(x, (w * 0.1):bfloat16(), 1e-6, true) end, 2)
  T.raises(function() zr.add_rms_norm(x, x, randn({ 8 }):cuda(), 1e-6, true) end, "add_rms_norm: unit_offset on cuda")
end)

-- The LayerNorm twin, with each output used: y alone, h alone (the norm's parameters get no
-- gradient), and both (cat: independent weights on h and y, so h's own gradient and the norm's dx
-- meet in the kernel's dres path). 2050 and 4099 take the unvectorised kernels; 16392 (bf16/f16)
-- rows longer than the register path's, the block-per-row forward and the shared-memory backward.
T.test("add_layer_norm: h and y, gradients of x, r, weight and bias", function()
  local uses = {
    y = function(h, y) return y end,
    h = function(h) return h end,
    both = function(h, y) return zr.cat({ h, y }, 1) end,
  }
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, sh in ipairs { { 1, 1 }, { 7, 13 }, { 3, 5, 127 }, { 2, 768 }, { 9, 771 }, { 5, 2050 }, { 4, 4099 },
                          { 33, 24 }, { 3, 16392 } } do
      local D = sh[#sh]
      local sl = D == 1 and 2000 or 2
      for use, f in pairs(uses) do
        local what = ("add_layer_norm %s %s"):format(table.concat(sh, ","), use)
        both(what, dt, { randn(sh), randn(sh), randn({ D }), randn({ D }) },
          function(x, r, w, b) return f(zr.add_layer_norm(x, r, w, b, 1e-5)) end, sl,
          use == "h" and { false, false, true, true } or nil)
      end
      both(("add_layer_norm %s no affine"):format(table.concat(sh, ",")), dt, { randn(sh), randn(sh) },
        function(x, r) return zr.cat({ zr.add_layer_norm(x, r) }, 1) end, sl)
    end
  end
  -- a broadcast r (the composition on the GPU too) and a transposed x (copied contiguous first)
  both("add_layer_norm broadcast r", "bf16", { randn({ 4, 64 }), randn({ 64 }), randn({ 64 }), randn({ 64 }) },
    function(x, r, w, b) return select(2, zr.add_layer_norm(x, r, w, b)) end, 2)
  both("add_layer_norm transposed x", "bf16", { randn({ 16, 8 }), randn({ 8, 16 }), randn({ 16 }), randn({ 16 }) },
    function(x, r, w, b) return select(2, zr.add_layer_norm(x:transpose(1, 2), r, w, b)) end, 2)
  local x, r = randn({ 6, 40 }):cuda(), randn({ 6, 40 }):cuda()
  x.requires_grad = true
  local h, y = zr.add_layer_norm(x, r)
  T.eq(h.grad_fn, "add")
  T.eq(y.grad_fn, "layer_norm")
  T.near(h:cpu(), x:detach():cpu() + r:cpu(), 0)
end)

-- GPT-2 124M's residual stream at batch 64 x 1024 (65536 rows of 768), and an odd width: h, y and
-- every gradient, y and h both used (close_big: too many elements for Lua tables)
T.test("add_layer_norm at 65536 rows: 768 and 771, bf16 and f32", function()
  for _, dt in ipairs { "bf16", "f32" } do
    for _, D in ipairs { 768, 771 } do
      local sh = { 64, 1024, D }
      local x0, r0, w0, b0 = randn(sh):to(dt), randn(sh):to(dt), randn({ D }):to(dt), randn({ D }):to(dt)
      local gh, gy = randn(sh):to(dt), randn(sh):to(dt)
      local function run(dev)
        local p = {}
        for i, t in ipairs { x0, r0, w0, b0 } do p[i] = t:to(dev):detach():requires_grad_(true) end
        local h, y = zr.add_layer_norm(p[1], p[2], p[3], p[4], 1e-5)
        ;((h:float() * gh:to(dev):float()):sum() + (y:float() * gy:to(dev):float()):sum()):backward()
        return { h, y, p[1].grad, p[2].grad, p[3].grad, p[4].grad }
      end
      local c, g = run("cpu"), run("cuda")
      for i, name in ipairs { "h", "y", "grad x", "grad r", "grad weight", "grad bias" } do
        T.eq(g[i]:dtype(), dt, name .. " dtype")
        close_big(g[i], c[i], dt, ("add_layer_norm (64,1024,%d) %s"):format(D, name), i > 2 and 1e-3 or nil)
      end
      c, g = nil, nil
      collectgarbage(); collectgarbage()
    end
  end
end)

-- a 16-bit weight whose .grad is an fp32 tensor already (the ZeRO engine's partition): the
-- reduction kernel adds dW into it in place (no 16-bit dW, no cast or add kernel after)
T.test("rms_norm: the weight gradient added into an existing f32 .grad in place", function()
  for _, dt in ipairs { "bf16", "f16" } do
    for _, sh in ipairs { { 7, 13 }, { 3, 5, 127 }, { 600, 2048 }, { 4, 4099 } } do
      local D = sh[#sh]
      local x0, w0, g0, dy = randn(sh):to(dt), randn({ D }):to(dt), randn({ D }), randn(sh):to(dt)
      local wr = w0:float():detach():requires_grad_(true)
      wr.grad = g0:clone()
      ;(zr.rms_norm(x0:float(), wr, 1e-6) * dy:float()):sum():backward()
      local w = w0:cuda():detach():requires_grad_(true)
      w.grad = g0:cuda()
      local gbuf = w.grad
      ;(zr.rms_norm(x0:cuda(), w, 1e-6):float() * dy:float():cuda()):sum():backward()
      T.eq(w.grad:dtype(), "f32")
      T.near(gbuf:cpu(), wr.grad, 2e-3, 2e-3, ("rms_norm %s %s dW into the f32 grad in place"):format(dt, table.concat(sh, ",")))
    end
  end
end)

-- LayerNorm's weight and bias gradients likewise, each on its own: both into f32 .grads, only the
-- weight's (the bias gets a new 16-bit gradient), only the bias's
T.test("layer_norm: weight and bias gradients added into existing f32 .grads in place", function()
  for _, dt in ipairs { "bf16", "f16" } do
    for _, sh in ipairs { { 7, 13 }, { 3, 5, 127 }, { 600, 768 }, { 4, 4099 } } do
      for _, preset in ipairs { { true, true }, { true, false }, { false, true } } do
        local D = sh[#sh]
        local x0, w0, b0, dy = randn(sh):to(dt), randn({ D }):to(dt), randn({ D }):to(dt), randn(sh):to(dt)
        local g0 = { randn({ D }), randn({ D }) }
        local function run(dev)
          local x = x0:to(dev)
          local p = { w0:float():to(dev), b0:float():to(dev) }
          if dev ~= "cpu" then p = { w0:to(dev), b0:to(dev) } end
          local bufs = {}
          for i = 1, 2 do
            p[i] = p[i]:detach():requires_grad_(true)
            if preset[i] then p[i].grad = g0[i]:clone():to(dev); bufs[i] = p[i].grad end -- (a copy: the CPU run adds into it)
          end
          if dev == "cpu" then x = x:float() end
          ;(zr.layer_norm(x, p[1], p[2], 1e-5):float() * dy:float():to(dev)):sum():backward()
          return p, bufs
        end
        local pc = run("cpu")
        local pg, bufs = run("cuda")
        for i, name in ipairs { "weight", "bias" } do
          local what = ("layer_norm %s %s d%s (%s)"):format(dt, table.concat(sh, ","), name,
            preset[i] and "into the f32 grad in place" or "a new gradient")
          if preset[i] then
            T.eq(pg[i].grad:dtype(), "f32", what)
            T.near(bufs[i]:cpu(), pc[i].grad, 2e-3, 2e-3, what)
          else
            T.eq(pg[i].grad:dtype(), dt, what)
            T.near(pg[i].grad:float():cpu(), pc[i].grad, 2e-2, 2e-2, what)
          end
        end
      end
    end
  end
end)

-- Through the engine (stage 0, bf16, one GPU): the norms' gradients are views of the fp32
-- partition, written by the reduction kernel; added on the second micro-step, overwritten on the
-- first after the optimizer step's zero_grad (stale). lr 0 and no dropout: every micro-step's own
-- gradient is the same, bit for bit.
T.test("gpt2 on the engine: LayerNorm gradients accumulated, then overwritten after zero_grad", function()
  zr.manual_seed(3)
  local model = zr.models.gpt2.GPT2LMHeadModel({ n_embd = 64, n_layer = 2, n_head = 4, vocab_size = 97,
    n_positions = 32, resid_pdrop = 0, embd_pdrop = 0, attn_pdrop = 0, dtype = "bf16", device = "cuda" })
  local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = 2,
    gradient_accumulation_steps = 2, steps_per_print = 1e6, bf16 = { enabled = true },
    optimizer = { type = "AdamW", params = { lr = 0.0 } }, zero_optimization = { stage = 0 } } })
  local ids = (zr.rand({ 2, 24 }) * 96):to("i64"):cuda()
  local function micro()
    engine:backward(engine(ids, ids).loss)
    local g = {}
    for name, p in model:named_parameters() do
      if name:match("ln_") then
        T.eq(p.grad:dtype(), "f32", name .. " grad dtype")
        g[name] = p.grad:cpu():clone()
      end
    end
    engine:step()
    return g
  end
  local g1, g2, g3 = micro(), micro(), micro()
  for name, g in pairs(g1) do
    if g:abs():max():item() == 0 then error(name .. ": zero gradient") end
    T.near(g2[name], g * 2, 0, 0, name .. ": accumulated on the second micro-step")
    T.near(g3[name], g, 0, 0, name .. ": overwritten after zero_grad")
  end
end)

T.done()
