-- Shared by the CUDA-vs-CPU op tests (tests/ops/test_*_cuda.lua) and tests/cuda/test_cuda.lua:
-- tolerances per dtype, `close` (CUDA result vs CPU reference; `close_big` for millions of
-- elements), `both` (one function on both devices, forward and every input gradient), and the skip
-- on machines without a GPU.
--   local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
--   if C.skip_without_gpu("norm") then return end
--   local zr, T, close, both = C.zr, C.T, C.close, C.both
local zr = require "zrun"
local T = require "zrun.testing"
local M = { zr = zr, T = T }

local abs, max = math.abs, math.max
local unpack = table.unpack or unpack -- LuaJIT: the global
M.unpack = unpack
M.SIZES = { 1, 7, 127, 1000003 }
local TOL = { f32 = { 1e-5, 1e-5 }, f64 = { 1e-12, 1e-12 }, bf16 = { 1e-2, 1e-2 }, f16 = { 4e-3, 4e-3 } }
M.TOL = TOL

-- Prints SKIP and returns true without a CUDA device (the file then returns).
function M.skip_without_gpu(what)
  if zr.cuda.is_available() then return false end
  T.skip(what, "no CUDA device (" .. zr.cuda.unavailable_reason() .. ")")
  return true
end

-- True on a Hopper GPU (H100 / H200 by name: the sm_90a kernels' tests; elsewhere they print SKIP).
function M.hopper() return zr.cuda.device_name():match("H[12]00") ~= nil end

-- |a - b| <= atol * scale + rtol * |b|, scale = max |b| (so values near zero are judged against
-- the tensor's magnitude, not their own), with the first offending element in the message.
-- floor: the least scale (for gradients that are 0 up to rounding, e.g. rms_norm with D = 1 or
-- attention's dq at T = 1, whose values are cancellation noise of O(1) terms).
function M.close(got, want, dtype, what, slack, floor)
  local tol = TOL[dtype] or TOL.f32
  slack = slack or 1
  local g, w = T.flat(got), T.flat(want)
  if #g ~= #w then error(("%s: %d vs %d elements"):format(what, #g, #w), 2) end
  local scale = 0
  for i = 1, #w do local a = abs(w[i]); if a == a and a ~= math.huge and a > scale then scale = a end end
  scale = max(scale, floor or 1e-30)
  for i = 1, #g do
    local a, b = g[i], w[i]
    local ok = (a == b) or (a ~= a and b ~= b) or abs(a - b) <= slack * (tol[1] * scale + tol[2] * abs(b))
    if not ok then
      error(("%s (%s): element %d: cuda %.9g vs cpu %.9g (diff %.3g, scale %.3g)"):format(
        what, dtype, i, a, b, abs(a - b), scale), 2)
    end
  end
end
local close = M.close

-- close's rule for tensors too large for Lua tables (millions of elements), judged with tensor
-- reductions on the CPU; the message gives the largest excess over the tolerance.
function M.close_big(got, want, dtype, what, floor)
  local tol = TOL[dtype] or TOL.f32
  local a, b = got:cpu():float():detach(), want:float():detach()
  local scale = max(b:abs():max():item(), floor or 1e-30)
  local excess = ((a - b):abs() - b:abs() * tol[2]):max():item() - tol[1] * scale
  if not (excess <= 0) then -- NaN fails too
    error(("%s (%s): cuda vs cpu exceed the tolerance by %.3g (scale %.3g)"):format(what, dtype, excess, scale), 2)
  end
end

function M.randn(shape, dtype) return zr.randn(shape, { dtype = dtype or "f32" }) end
-- The same values on both devices (the GPU copy is made from the CPU tensor, exactly).
function M.pair(cpu) return cpu, cpu:cuda() end
local randn = M.randn

-- Forward value and input gradient of f on one device; w weights the outputs.
function M.fwd_bwd(f, x, w)
  x = x:detach(); x.requires_grad = true
  local y = f(x)
  local l = (y * w):sum()
  l:backward()
  return y, x.grad
end

-- Runs f on CPU and on CUDA with the same inputs (CPU tensors; float ones get requires_grad
-- unless nograd[i]), weights the output(s) by fixed random tensors, backpropagates, and compares
-- the outputs and every input gradient. dt: the dtype the inputs are cast to on both devices.
-- floor: the least scale the gradients are judged against (close's; 1e-3 unless given).
function M.both(what, dt, inputs, f, slack, nograd, floor)
  nograd = nograd or {}
  local function run(dev)
    local xs = {}
    for i, x in ipairs(inputs) do
      local t = x:dtype() == "f32" and x:to(dt) or x
      if dev == "cuda" then t = t:cuda() end
      t = t:detach()
      if t:dtype() == dt and not nograd[i] then t.requires_grad = true end
      xs[i] = t
    end
    local ok, y = pcall(f, unpack(xs)) -- a failure names the case
    if not ok then error(what .. " on " .. dev .. ": " .. tostring(y), 0) end
    return y, xs
  end
  local yc, xc = run("cpu")
  local yg, xg = run("cuda")
  T.eq(yg:device(), "cuda:0", what .. " output device")
  close(yg:cpu(), yc, dt, what .. " forward", slack)
  if not yc.requires_grad then return end
  zr.manual_seed(99)
  local w = zr.randn(yc:shape())
  ;(yc:float() * w):sum():backward()
  ;(yg:float() * w:cuda()):sum():backward()
  for i = 1, #xc do
    if xc[i].requires_grad then
      assert(xg[i].grad, what .. ": no CUDA gradient for input " .. i)
      close(xg[i].grad:cpu(), xc[i].grad, dt, ("%s grad %d"):format(what, i), slack, floor or 1e-3)
    end
  end
end

-- f(y) through a product y = x * 1 of a fresh leaf x = x0 (so its gradient goes into the product's
-- buffer, as a projection's would), then backward of sum(o * wo): o and x's gradient, on the CPU.
function M.out_and_grad(x0, wo, f)
  local x = x0:detach(); x.requires_grad = true
  local o = f(x * 1)
  ;(o:float() * wo):sum():backward()
  return o:cpu(), x.grad:cpu()
end

-- A model built by ctor(cfg) (cfg.dtype "f32") on the CPU in f32 against the same weights on the
-- GPU in bf16: logits and every parameter's gradient of the loss on ids (B, T) within 3% relative
-- error of the whole tensor (bf16 rounding stays near 1%, a wrong layout is O(1)).
function M.model_cpu_vs_gpu(ctor, cfg, ids)
  local function rel(a, b, what)
    local d = a:float():cpu() - b
    local e = math.sqrt((d * d):sum():item() / (b * b):sum():item())
    assert(e < 0.03, ("%s: relative error %.4g"):format(what, e))
  end
  local ref = ctor(cfg)
  local out = ref(ids, ids)
  out.loss:backward()
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.dtype, c.device = "bf16", "cuda"
  local m = ctor(c)
  local sd = {}
  for n, p in ref:named_parameters() do sd[n] = p:detach() end
  m:load_state_dict(sd, true)
  local got = m(ids:cuda(), ids:cuda())
  got.loss:backward()
  rel(got.logits, out.logits, "logits")
  local g = {}
  for n, p in m:named_parameters() do g[n] = p.grad end
  for n, p in ref:named_parameters() do
    assert(g[n], "no CUDA gradient for " .. n)
    rel(g[n], p.grad, "grad of " .. n)
  end
end

return M
