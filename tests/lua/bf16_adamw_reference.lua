-- A naive Lua restatement of DeepSpeed's AdamW step with bf16 states (bf16_master_weights_and_grads,
-- bf16_optimizer_states), the independent reference of tests/lua/test_engine_bf16_master.lua and
-- tests/mpi/bf16_master_check.lua: R.check_steps(engine, n, round_states, batch) trains n steps and
-- checks each element of this rank's partition against R.ds_step after every one.
local T = require("zrun").testing
local R = {}
local LR, WD, B1, B2, EPS = 3e-3, 0.01, 0.9, 0.95, 1e-8

-- x rounded to the nearest number of `bits` significant bits, ties to even: bf16 (8) is what
-- DeepSpeed's kernels store, f32 (24) what each of their f32 operations yields.
local function round_bits(x, bits)
  if x == 0 or x ~= x or x == math.huge or x == -math.huge then return x end
  local _, e = math.frexp(x) -- |x| = f 2^e, 0.5 <= f < 1
  local scale = 2 ^ (bits - e)
  local r = x * scale
  local f = math.floor(r)
  local d = r - f
  if d > 0.5 or (d == 0.5 and f % 2 == 1) then f = f + 1 end
  return f / scale
end
local function bf16(x) return round_bits(x, 8) end
local function f32(x) return round_bits(x, 24) end

-- DeepSpeed's FusedAdam step on one element (csrc/adam/multi_tensor_adam.cu, ADAM_MODE_1: AdamW),
-- every operation an f32 one (a double op on f32 values, rounded: exact for + - * / sqrt here);
-- its host scalars: the hyper-parameters as f32, 1 - beta in f32, 1 - beta^t in double then f32.
-- g is the bf16 gradient (scaled by 1 in these runs). round_states: the moments are stored as bf16.
function R.ds_step(p, m, v, g, t, round_states)
  local b1, b2, lr, wd, eps = f32(B1), f32(B2), f32(LR), f32(WD), f32(EPS)
  local bc1, bc2 = f32(1 - b1 ^ t), f32(1 - b2 ^ t)
  m = f32(f32(b1 * m) + f32(f32(1 - b1) * g))
  v = f32(f32(b2 * v) + f32(f32(f32(1 - b2) * g) * g))
  local denom = f32(f32(math.sqrt(f32(v / bc2))) + eps)
  local update = f32(f32(f32(m / bc1) / denom) + f32(wd * p))
  p = f32(p - f32(lr * update))
  if round_states then m, v = bf16(m), bf16(v) end
  return bf16(p), m, v
end


R.LR, R.WD, R.B1, R.B2, R.EPS, R.bf16, R.f32 = LR, WD, B1, B2, EPS, bf16, f32

local function flat(t) return t:to("cpu"):to("f64"):flat_table() end

-- Steps 1..n (batch(t): this rank's input ids), each checked against ds_step from the engine's own
-- state and gradient before it:
-- every value equal (bit for bit: the engine does FusedAdam's f32 operations in its order, without
-- FMA contraction). round_states: the moments are bf16 (else f32).
function R.check_steps(engine, n, round_states, batch)
  local z = engine.zero
  local losses = {}
  for t = 1, n do
    local ids = batch(t)
    local out = engine(ids, ids)
    engine:backward(out.loss)
    losses[t] = out.loss:item()
    -- the reduced gradient partition and the states just before the update (stages 0-1 over several
    -- ranks reduce inside engine:step): the engine's ZeRO object behind a proxy that reads them
    local g, p0, m0, v0
    engine.zero = setmetatable({ step = function(_, ...)
      g, p0, m0, v0 = flat(z:state(3)), flat(z:state(0)), flat(z:state(1)), flat(z:state(2))
      T.eq(z:state(3):dtype(), "bf16", "the gradient partition")
      return z:step(...)
    end }, { __index = function(_, k) return function(_, ...) return z[k](z, ...) end end })
    local ok, err = pcall(engine.step, engine)
    engine.zero = z
    if not ok then error(err, 0) end
    local p1, m1, v1 = flat(z:state(0)), flat(z:state(1)), flat(z:state(2))
    -- gradient_clipping: DeepSpeed multiplies the bf16 gradient partition in place by the clip
    -- coefficient (unscale_and_clip_grads), so each element is rounded back to bf16 before AdamW
    local coef = 1 / engine.world_size -- the engine folds the ranks' average into the same factor
    if engine.clip and engine.clip > 0 then coef = coef * math.min(1, engine.clip / (engine.last_grad_norm + 1e-6)) end
    local moved = 0
    for i = 1, #p1 do
      local gi = coef == 1 and g[i] or bf16(f32(g[i] * f32(coef)))
      local rp, rm, rv = R.ds_step(p0[i], m0[i], v0[i], gi, t, round_states)
      for _, c in ipairs { { p1[i], rp, "master" }, { m1[i], rm, "exp_avg" }, { v1[i], rv, "exp_avg_sq" } } do
        if c[1] ~= c[2] then
          error(("step %d element %d %s: engine %.9g, DeepSpeed's step %.9g (from p %.9g m %.9g v %.9g g %.9g)"):format(
            t, i, c[3], c[1], c[2], p0[i], m0[i], v0[i], g[i]), 0)
        end
      end
      if p1[i] ~= p0[i] then moved = moved + 1 end
    end
    assert(moved > 0.5 * #p1, ("step %d: only %d of %d weights moved"):format(t, moved, #p1))
  end
  return losses
end

-- Trains steps from..to on batch(t) (this rank's input ids); returns each step's loss.
function R.train(e, from, to, batch)
  local l = {}
  for t = from, to do
    local ids = batch(t)
    local out = e(ids, ids)
    e:backward(out.loss)
    e:step()
    l[#l + 1] = out.loss:item()
  end
  return l
end

return R
