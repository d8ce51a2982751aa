-- linear_cross_entropy on CUDA vs the CPU (its reference: tests/ops/test_linear_cross_entropy.lua), and vs
-- linear + cross_entropy on the GPU: slice widths on the 16-byte and the scalar kernel paths, reductions, label
-- smoothing, ignored and all-ignored rows, bf16/f32, a vocabulary of 50257 (GPT-2's: the scalar path, an odd last
-- slice), the weight's gradient added straight into an fp32 one (the engine's), and a tied use of the weight.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("linear_cross_entropy") then return end
local zr, T, randn, both, close = C.zr, C.T, C.randn, C.both, C.close

local function targets(n, V, ignored)
  local t = {}
  for i = 1, n do t[i] = (i * 7919 + 13) % V end
  for _, i in ipairs(ignored or {}) do t[i] = -100 end
  return zr.tensor(t, { dtype = "i64" })
end

T.test("linear_cross_entropy CUDA vs CPU: slices, reductions, smoothing, ignored rows, bf16/f32", function()
  for _, dt in ipairs { "f32", "bf16" } do
    for _, s in ipairs { { 1, 16, 40 }, { 37, 64, 1000 }, { 64, 32, 1001 }, { 9, 72, 50257 } } do
      local N, D, V = s[1], s[2], s[3]
      zr.manual_seed(N + D + V)
      local h, w, t = randn({ N, D }) * 0.5, randn({ V, D }) * 0.3, targets(N, V, N > 3 and { 2 } or nil)
      for _, chunk in ipairs { 8, 96, 1000, 0 } do
        for _, red in ipairs { "mean", "sum" } do
          for _, eps in ipairs { 0, 0.1 } do
            both(("lce %dx%dx%d chunk %d %s eps %g"):format(N, D, V, chunk, red, eps), dt, { h, w, t },
              function(a, b, c) return zr.linear_cross_entropy(a, b, c, { chunk = chunk, reduction = red,
                label_smoothing = eps }) end, 2)
          end
        end
      end
    end
  end
  -- token_stats: entropy and argmax as the CPU's (and 0 at ignored rows)
  for _, dt in ipairs { "f32", "bf16" } do
    local h, w, t = (randn({ 41, 32 }) * 0.7):to(dt), (randn({ 3001, 32 }) * 0.5):to(dt), targets(41, 3001, { 3, 30 })
    for _, chunk in ipairs { 100, 1024, 0 } do
      local _, e1, a1 = zr.linear_cross_entropy(h, w, t, { chunk = chunk, token_stats = true })
      local _, e2, a2 = zr.linear_cross_entropy(h:cuda(), w:cuda(), t:cuda(), { chunk = chunk, token_stats = true })
      close(e2:cpu(), e1, dt, ("token_stats entropy %s chunk %d"):format(dt, chunk))
      T.eq(T.diff(a2:cpu():to("f64"), a1:to("f64")), 0, ("token_stats argmax %s chunk %d"):format(dt, chunk))
    end
  end
  -- every target ignored: the mean is NaN (like torch), the gradients zero
  local h, w = randn({ 4, 8 }):cuda():requires_grad_(true), randn({ 20, 8 }):cuda():requires_grad_(true)
  local all = zr.full({ 4 }, -100, { dtype = "i64" }):cuda()
  local l = zr.linear_cross_entropy(h, w, all, { chunk = 8 })
  assert(l:item() ~= l:item(), "mean over no targets is NaN")
  zr.linear_cross_entropy(h, w, all, { chunk = 8, reduction = "sum" }):backward()
  T.eq(h.grad:abs():sum():item(), 0, "h's gradient")
  T.eq(w.grad:abs():sum():item(), 0, "w's gradient")
end)

-- On the GPU against linear + cross_entropy (the LM head as the models ran it): a bf16 head whose weight has an fp32
-- gradient already (as the ZeRO engine keeps it: dW goes straight into it) and a tied use (an embedding of the same
-- weight), twice (accumulation).
T.test("linear_cross_entropy CUDA = linear + cross_entropy: fp32 gradient of a bf16 weight, tied, accumulated", function()
  local N, D, V = 300, 64, 5000
  zr.manual_seed(5)
  local h0, w0, t = (randn({ N, D }) * 0.5):to("bf16"):cuda(), (randn({ V, D }) * 0.3):to("bf16"):cuda(),
    targets(N, V, { 7, 8 }):cuda()
  local e = zr.tensor({ 3, 4999, 17 }, { dtype = "i64" }):cuda()
  -- o: linear_cross_entropy's options (nil: linear + cross_entropy); host: its targets on the host
  local function run(o, host)
    local h, w = h0:clone():requires_grad_(true), w0:clone():requires_grad_(true)
    w.grad = zr.zeros({ V, D }, { device = "cuda" }) -- an fp32 gradient, as the engine's
    local l
    for _ = 1, 2 do
      local x = zr.cat({ h, zr.embedding(w, e) }, 1)
      local tt = zr.cat({ t, zr.tensor({ 1, 2, 3 }, { dtype = "i64" }):cuda() }, 1)
      if host then tt = tt:cpu() end
      l = o and zr.linear_cross_entropy(x, w, tt, o) or zr.cross_entropy(zr.linear(x, w), tt)
      l:backward()
    end
    return l:item(), h.grad:float():cpu(), w.grad:cpu()
  end
  local l1, gh1, gw1 = run(nil)
  -- slices made again in backward; the logits kept (the default at this size); kept, with the targets on the host;
  -- slices with the targets on the host
  for _, c in ipairs { { { chunk = 768 } }, { {} }, { {}, true }, { { chunk = 768 }, true }, { { keep = 0 } } } do
    local what = ("chunk %s keep %s%s"):format(c[1].chunk, c[1].keep, c[2] and ", targets on the host" or "")
    local l2, gh2, gw2 = run(c[1], c[2])
    T.eq(gw2:dtype(), "f32", what .. ": the weight's gradient stays fp32")
    T.near(l2, l1, 1e-5, 1e-5, what .. ": loss")
    close(gh2, gh1, "bf16", what .. ": dh")
    close(gw2, gw1, "bf16", what .. ": dw")
  end
  -- a backward that comes again (retain_graph) over kept logits makes them again
  local h, w = h0:clone():requires_grad_(true), w0:clone():requires_grad_(true)
  local l = zr.linear_cross_entropy(h, w, t)
  l:backward(nil, true)
  local g1 = h.grad:float():cpu()
  h.grad = nil
  l:backward()
  close(h.grad:float():cpu(), g1, "bf16", "dh, second backward")
end)

T.done()
