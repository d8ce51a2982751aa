-- The naive Lamb the Lamb tests compare zrun against (tests/ops/test_optim_lamb.lua,
-- tests/lua/test_engine_optimizers.lua): plain Lua arithmetic in double, written from DeepSpeed's
-- FusedLamb (deepspeed/ops/lamb/fused_lamb.py, csrc/lamb/fused_lamb_cuda_kernel.cu), not from zrun's code.
local sqrt = math.sqrt

-- One naive Lamb step on the plain array p (in place) with gradient g; s = {m = {}, v = {}}; h: the
-- group's hyperparameters; t: the step from 1. Returns the trust ratio it used.
--   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  u = m / (sqrt(v) + eps) + wd p  (or sqrt(v + eps))
--   ratio = ||p|| / ||u|| clamped to max_coeff, then to min_coeff; 1 when either norm is 0
--   p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * ratio * u    (lr alone without bias correction)
local function lamb_ref(p, g, s, h, t)
  local b1, b2 = h.betas[1], h.betas[2]
  local u, pn, un = {}, 0, 0
  for i = 1, #p do
    s.m[i] = b1 * (s.m[i] or 0) + (1 - b1) * g[i]
    s.v[i] = b2 * (s.v[i] or 0) + (1 - b2) * g[i] * g[i]
    local denom = h.eps_inside_sqrt and sqrt(s.v[i] + h.eps) or sqrt(s.v[i]) + h.eps
    u[i] = s.m[i] / denom + h.weight_decay * p[i]
    pn, un = pn + p[i] * p[i], un + u[i] * u[i]
  end
  local ratio = 1
  if pn > 0 and un > 0 then
    ratio = sqrt(pn) / sqrt(un)
    if ratio > h.max_coeff then ratio = h.max_coeff end
    if ratio < h.min_coeff then ratio = h.min_coeff end
  end
  local ss = h.bias_correction == false and h.lr or h.lr * sqrt(1 - b2 ^ t) / (1 - b1 ^ t)
  for i = 1, #p do p[i] = p[i] - ss * ratio * u[i] end
  return ratio
end

local DEFAULTS = { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0, max_coeff = 10, min_coeff = 0.01,
  bias_correction = true, eps_inside_sqrt = false }
local function with(o)
  local h = {}
  for k, v in pairs(DEFAULTS) do h[k] = v end
  for k, v in pairs(o) do h[k] = v end
  return h
end

return { step = lamb_ref, hp = with, DEFAULTS = DEFAULTS }
