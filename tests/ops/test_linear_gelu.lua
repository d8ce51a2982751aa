-- zr.linear_gelu(x, w, b) = gelu_tanh(x wᵀ + b): forward against a naive Lua loop in doubles,
-- float64 finite-difference gradchecks (x, w, b; GPT-2's transposed Conv1D weight), agreement
-- with the unfused zr.linear(...):gelu("tanh") in f32 and bf16 (values and gradients), errors;
-- zr.mlp_gelu (linear, GELU, linear as one node) against the composed ops and by gradcheck.
local zr = require "zrun"
local T = zr.testing
local tanh, sqrt, pi = math.tanh, math.sqrt, math.pi
zr.manual_seed(31)

local function r(shape, s) return (zr.randn(shape, { dtype = "f64" }) * (s or 1)):detach():requires_grad_(true) end

-- x (rows, in), w (out, in), b (out) or nil as Lua loops in doubles from the tensors' values.
local function naive(x, w, b)
  local rows, in_, out = x:size(1), x:size(2), w:size(1)
  local fx, fw, fb, y = x:flat_table(), w:flat_table(), b and b:flat_table(), {}
  for i = 0, rows - 1 do
    for j = 0, out - 1 do
      local v = fb and fb[j + 1] or 0
      for k = 0, in_ - 1 do v = v + fx[i * in_ + k + 1] * fw[j * in_ + k + 1] end
      y[#y + 1] = 0.5 * v * (1 + tanh(sqrt(2 / pi) * (v + 0.044715 * v * v * v)))
    end
  end
  return y
end

T.test("linear_gelu forward matches a Lua loop of gelu_tanh(x wᵀ + b) (f64, f32; with and without bias)", function()
  for _, dt in ipairs { "f64", "f32" } do
    for _, s in ipairs { { 1, 1, 1 }, { 7, 5, 3 }, { 4, 13, 16 } } do
      local rows, in_, out = s[1], s[2], s[3]
      -- scaled so that pre-activations reach both tails and the bend of the GELU
      local x, w, b = (zr.randn({ rows, in_ }) * 2):to(dt), zr.randn({ out, in_ }):to(dt), zr.randn({ out }):to(dt)
      local tol = dt == "f64" and 1e-13 or 1e-5
      local what = ("%s %dx%d -> %d"):format(dt, rows, in_, out)
      T.near(zr.linear_gelu(x, w, b), naive(x, w, b), tol, tol, what)
      T.near(zr.linear_gelu(x, w), naive(x, w), tol, tol, what .. " no bias")
      T.eq(zr.linear_gelu(x, w, b):dtype(), dt, "dtype")
    end
  end
  -- leading dims are kept: (2, 3, in) -> (2, 3, out)
  local x3, w3 = zr.randn({ 2, 3, 5 }, { dtype = "f64" }), zr.randn({ 8, 5 }, { dtype = "f64" })
  local y3 = zr.linear_gelu(x3, w3)
  T.eq(table.concat(y3:shape(), ","), "2,3,8", "shape")
  T.near(y3, naive(x3:reshape(6, 5), w3), 1e-13, 1e-13, "3-D input")
  -- by hand: x = 1, w = 1, b = 0 -> gelu_tanh(1) = 0.841191990...
  T.near(zr.linear_gelu(zr.ones({ 1, 1 }, { dtype = "f64" }), zr.ones({ 1, 1 }, { dtype = "f64" })):item(),
    0.8411919906082768, 1e-15, 0, "gelu_tanh(1)")
end)

T.test("gradcheck linear_gelu (f64 central differences): x, w, b; transposed weight; 3-D input", function()
  local f = function(x, w, b) return zr.linear_gelu(x, w, b) end
  T.gradcheck(f, { r({ 1, 1 }, 2), r({ 1, 1 }), r({ 1 }) })
  T.gradcheck(f, { r({ 7, 5 }, 2), r({ 3, 5 }), r({ 3 }) })
  T.gradcheck(function(x, w) return zr.linear_gelu(x, w) end, { r({ 2, 3, 5 }, 2), r({ 11, 5 }) })
  -- GPT-2's Conv1D: the weight stored (in, out), passed as its transposed view
  T.gradcheck(function(x, w, b) return zr.linear_gelu(x, w:transpose(1, 2), b) end,
    { r({ 4, 6 }, 2), r({ 6, 8 }), r({ 8 }) })
  -- only some inputs need a gradient
  T.gradcheck(f, { zr.randn({ 3, 4 }, { dtype = "f64" }), r({ 5, 4 }), r({ 5 }) })
  T.gradcheck(f, { r({ 3, 4 }), zr.randn({ 5, 4 }, { dtype = "f64" }), zr.randn({ 5 }, { dtype = "f64" }) })
end)

T.test("linear_gelu equals zr.linear(...):gelu('tanh'), values and gradients (f32, bf16)", function()
  for _, dt in ipairs { "f32", "bf16" } do
    local x0, w0, b0 = (zr.randn({ 2, 7, 12 }) * 2):to(dt), zr.randn({ 24, 12 }):to(dt), zr.randn({ 24 }):to(dt)
    local gy = zr.randn({ 2, 7, 24 }):to(dt)
    local function run(f)
      local x, w, b = x0:detach():requires_grad_(true), w0:detach():requires_grad_(true), b0:detach():requires_grad_(true)
      local y = f(x, w, b)
      y:backward(gy)
      return y, x.grad, w.grad, b.grad
    end
    local fused = { run(zr.linear_gelu) }
    local plain = { run(function(x, w, b) return zr.linear(x, w, b):gelu("tanh") end) }
    for i, name in ipairs { "y", "dx", "dw", "db" } do
      T.eq(fused[i]:dtype(), dt, name .. " dtype")
      T.near(fused[i], plain[i], 0, 0, ("%s %s"):format(dt, name)) -- the same ops on the CPU
    end
  end
end)

T.test("linear_gelu errors name the op, the shapes and the fix", function()
  T.raises(function() zr.linear_gelu(zr.ones({ 2, 3 }), zr.ones({ 4, 5 })) end,
    "linear_gelu: linear: input (2,3) and weight (4,5) do not match: 3 ≠ 5")
  T.raises(function() zr.linear_gelu(zr.ones({ 2, 3 }), zr.ones({ 4, 3 }), zr.ones({ 5 })) end,
    "linear_gelu: linear: bias must have shape (4)")
  T.raises(function() zr.linear_gelu(zr.ones({ 2, 3 })) end, "tensor")
end)

local function mlp_plain(x, wf, bf, wp, bp) return zr.linear(zr.linear(x, wf, bf):gelu("tanh"), wp, bp) end

T.test("mlp_gelu equals linear, gelu('tanh'), linear: values and all gradients (f64, f32, bf16; no biases; wᵀ views)", function()
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    for _, s in ipairs { { 1, 1, 1, 1 }, { 7, 5, 16, 3 }, { 13, 12, 24, 7 } } do
      local rows, in_, hid, out = s[1], s[2], s[3], s[4]
      local ins = { (zr.randn({ 2, rows, in_ }) * 2):to(dt), zr.randn({ hid, in_ }):to(dt), zr.randn({ hid }):to(dt),
        zr.randn({ out, hid }):to(dt), zr.randn({ out }):to(dt) }
      local gy = zr.randn({ 2, rows, out }):to(dt)
      local function run(f, nobias, tr)
        local a = {}
        for i = 1, 5 do a[i] = ins[i]:detach():requires_grad_(true) end
        local wf, wp = a[2], a[4]
        if tr then -- GPT-2's Conv1D: weights stored (in, out), passed as transposed views
          wf, wp = a[2]:transpose(1, 2):contiguous():detach():requires_grad_(true), a[4]:transpose(1, 2):contiguous():detach():requires_grad_(true)
          a[2], a[4] = wf, wp
          wf, wp = wf:transpose(1, 2), wp:transpose(1, 2)
        end
        local y = f(a[1], wf, not nobias and a[3] or nil, wp, not nobias and a[5] or nil)
        y:backward(gy)
        return { y, a[1].grad, a[2].grad, a[3].grad, a[4].grad, a[5].grad }
      end
      for _, v in ipairs { { false, false }, { true, false }, { false, true } } do
        local what = ("%s %dx%d->%d->%d%s%s"):format(dt, rows, in_, hid, out, v[1] and " no bias" or "", v[2] and " wᵀ" or "")
        local fused, plain = run(zr.mlp_gelu, v[1], v[2]), run(mlp_plain, v[1], v[2])
        for i, name in ipairs { "y", "dx", "dw_fc", "db_fc", "dw_proj", "db_proj" } do
          if v[1] and (i == 4 or i == 6) then
            T.eq(fused[i], nil, what .. " " .. name .. " (no bias: none)")
          else
            T.eq(fused[i]:dtype(), dt, what .. " " .. name .. " dtype")
            T.near(fused[i], plain[i], 0, 0, what .. " " .. name) -- the same CPU ops in the same order
          end
        end
      end
    end
  end
end)

T.test("gradcheck mlp_gelu (f64 central differences): every input; wᵀ views; some inputs without grad", function()
  T.gradcheck(zr.mlp_gelu, { r({ 1, 1 }, 2), r({ 1, 1 }), r({ 1 }), r({ 1, 1 }), r({ 1 }) })
  T.gradcheck(zr.mlp_gelu, { r({ 2, 3, 5 }, 2), r({ 8, 5 }), r({ 8 }), r({ 3, 8 }), r({ 3 }) })
  T.gradcheck(function(x, wf, bf, wp, bp) return zr.mlp_gelu(x, wf:transpose(1, 2), bf, wp:transpose(1, 2), bp) end,
    { r({ 4, 6 }, 2), r({ 6, 16 }), r({ 16 }), r({ 16, 5 }), r({ 5 }) })
  T.gradcheck(function(x, wf, wp) return zr.mlp_gelu(x, wf, nil, wp) end, { r({ 3, 4 }, 2), r({ 7, 4 }), r({ 2, 7 }) })
  local d = { dtype = "f64" }
  T.gradcheck(zr.mlp_gelu, { zr.randn({ 3, 4 }, d), r({ 5, 4 }), r({ 5 }), zr.randn({ 2, 5 }, d), r({ 2 }) })
  T.gradcheck(zr.mlp_gelu, { r({ 3, 4 }), zr.randn({ 5, 4 }, d), zr.randn({ 5 }, d), r({ 2, 5 }), zr.randn({ 2 }, d) })
end)

T.test("mlp_gelu errors name the op, the part and the shapes", function()
  T.raises(function() zr.mlp_gelu(zr.ones({ 2, 3 }), zr.ones({ 4, 5 }), nil, zr.ones({ 2, 4 })) end,
    "mlp_gelu: linear: input (2,3) and weight (4,5) do not match: 3 ≠ 5")
  T.raises(function() zr.mlp_gelu(zr.ones({ 2, 3 }), zr.ones({ 4, 3 }), nil, zr.ones({ 2, 5 })) end,
    "mlp_gelu (second linear): linear: input (2,4) and weight (2,5) do not match: 4 ≠ 5")
  T.raises(function() zr.mlp_gelu(zr.ones({ 2, 3 }), zr.ones({ 4, 3 }), nil, zr.ones({ 2, 4 }), zr.ones({ 3 })) end,
    "mlp_gelu (second linear): linear: bias must have shape (2)")
  T.raises(function() zr.mlp_gelu(zr.ones({ 2, 3 }), zr.ones({ 4, 3 })) end, "tensor")
end)

T.done()
