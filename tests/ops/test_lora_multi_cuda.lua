-- zr.lora_multi on CUDA vs the CPU (tests/ops/test_lora_multi.lua holds the references): the frozen bases,
-- the adapters' products into the output, the dropout masks made by the kernel (the CPU's for the same seed),
-- gradients into the adapters' leaf .grad (f32 beside bf16 weights, as ZeRO's partition holds them).
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("lora_multi") then return end
local zr, T, close, randn = C.zr, C.T, C.close, C.randn

-- one case: rows x in, outs, ranks (0: a plain projection), dropout p, biases or not
local function case(dt, rows, inn, outs, ranks, p, with_bias)
  local ins = { x = randn({ rows, inn }), w = {}, b = {}, A = {}, B = {}, s = {} }
  for i, o in ipairs(outs) do
    ins.w[i] = randn({ o, inn })
    ins.b[i] = randn({ o })
    ins.A[i] = ranks[i] > 0 and randn({ ranks[i], inn }) or false
    ins.B[i] = ranks[i] > 0 and randn({ o, ranks[i] }) or false
    ins.s[i] = ranks[i] > 0 and 32 / ranks[i] or 0
  end
  local N = 0
  for _, o in ipairs(outs) do N = N + o end
  local gy = randn({ rows, N })
  local function run(dev, leaf_grads)
    local function put(t, grad)
      if not t then return false end
      local u = t:to(dt):to(dev):detach()
      if grad then u.requires_grad = true end
      return u
    end
    local x = put(ins.x, true)
    local w, b, A, B = {}, {}, {}, {}
    for i = 1, #outs do
      w[i], b[i], A[i], B[i] = put(ins.w[i]), put(ins.b[i]), put(ins.A[i], true), put(ins.B[i], true)
      if leaf_grads and A[i] then -- existing f32 gradients to add into
        A[i].grad = zr.ones(A[i]:shape(), { dtype = "f32", device = dev })
        B[i].grad = zr.ones(B[i]:shape(), { dtype = "f32", device = dev })
      end
    end
    zr.manual_seed(1234)
    local y = zr.lora_multi(x, w, with_bias and b or nil, A, B, ins.s, p, true)
    ;(y:float() * gy:to(dev)):sum():backward()
    local out = { y = y:cpu(), x = x.grad:cpu() }
    for i = 1, #outs do if A[i] then out["A" .. i], out["B" .. i] = A[i].grad:cpu(), B[i].grad:cpu() end end
    return out
  end
  for _, leaf_grads in ipairs { false, true } do
    local c, g = run("cpu", leaf_grads), run("cuda", leaf_grads)
    local what = ("lora_multi %s %dx%d -> %s r %s p %g%s%s"):format(dt, rows, inn, table.concat(outs, "+"),
      table.concat(ranks, "/"), p, with_bias and " bias" or "", leaf_grads and " into .grad" or "")
    for k, v in pairs(c) do
      -- (bf16: each adapter gradient sums rows products of rounded values: judged at 2x the tolerance)
      close(g[k], v, dt, what .. " " .. k, dt == "bf16" and 2 or 1, 1e-3)
    end
  end
end

T.test("lora_multi on CUDA vs CPU: q/k/v with a plain k, gate/up, one projection; dropout; biases", function()
  for _, dt in ipairs { "f32", "bf16" } do
    case(dt, 37, 64, { 64, 16, 16 }, { 8, 0, 8 }, 0, false)
    case(dt, 37, 64, { 64, 16, 16 }, { 8, 4, 8 }, 0.1, true)
    case(dt, 130, 96, { 160, 160 }, { 16, 16 }, 0.05, false)
    case(dt, 5, 33, { 7 }, { 3 }, 0.5, true) -- odd sizes: the masks' 4-element groups straddle rows
  end
end)

T.test("lora_multi's dropout kernel draws zr.dropout's masks (same seed, CUDA)", function()
  local x = randn({ 7, 129 }):to("bf16"):cuda()
  local w = randn({ 5, 129 }):to("bf16"):cuda()
  local a, b = randn({ 3, 129 }):to("bf16"):cuda(), randn({ 5, 3 }):to("bf16"):cuda()
  a.requires_grad, b.requires_grad = true, true
  zr.manual_seed(5)
  local y = zr.lora_multi(x, { w }, nil, { a }, { b }, { 1 }, 0.3, true)
  zr.manual_seed(5)
  local want = zr.linear(x, w) + zr.linear(zr.linear(zr.dropout(x, 0.3, true), a), b)
  close(y:cpu(), want:cpu(), "bf16", "fused vs zr.dropout + linears")
end)

T.done()
