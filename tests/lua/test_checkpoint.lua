-- zr.checkpoint: same gradients as the plain computation, recomputation in backward, fewer
-- activations kept, random state replayed.
local zr = require "zrun"
local T = zr.testing
zr.manual_seed(3)

local function block(x, w)
  return ((x * w):tanh() * w):sigmoid():exp()
end

T.test("checkpoint gives the same gradients", function()
  local w = zr.randn({ 5, 7 }, { dtype = "f64", requires_grad = true })
  local x = zr.randn({ 5, 7 }, { dtype = "f64", requires_grad = true })
  local y1 = block(x, w):sum()
  y1:backward()
  local gw, gx = w.grad:clone(), x.grad:clone()
  w.grad, x.grad = nil, nil
  local calls = 0
  local y2 = zr.checkpoint(function(a) calls = calls + 1; return block(a, w) end, x):sum()
  T.eq(calls, 1)
  T.near(y2, y1:item(), 1e-12)
  y2:backward()
  T.eq(calls, 2, "recomputed once in backward")
  T.near(w.grad, gw, 1e-12)
  T.near(x.grad, gx, 1e-12)
end)

T.test("checkpoint gradcheck with two inputs", function()
  local a = zr.randn({ 3, 4 }, { dtype = "f64", requires_grad = true })
  local b = zr.randn({ 3, 4 }, { dtype = "f64", requires_grad = true })
  T.gradcheck(function(x, y) return zr.checkpoint(function(p, q) return (p * q):tanh() + p end, x, y) end, { a, b })
end)

T.test("checkpoint keeps fewer activations", function()
  local w = zr.randn({ 256, 256 }, { requires_grad = true })
  local x = zr.randn({ 256, 256 })
  local function deep(v) for _ = 1, 8 do v = (v * w):tanh() end return v end
  T.collect_all() -- nothing of earlier tests left to be freed inside the measurements
  zr.memory.reset_peak()
  local base = zr.memory.stats().activations.current
  local y = deep(x):sum()
  collectgarbage("collect")
  local plain = zr.memory.stats().activations.current - base
  y = nil
  collectgarbage("collect")
  local base2 = zr.memory.stats().activations.current
  local y2 = zr.checkpoint(deep, x):sum()
  collectgarbage("collect")
  local ck = zr.memory.stats().activations.current - base2
  assert(ck < plain / 4, ("checkpointed %d bytes vs plain %d"):format(ck, plain))
  y2:backward()
  assert(w.grad ~= nil)
end)

T.test("checkpoint replays randomness", function()
  local x = zr.randn({ 50 }, { dtype = "f64", requires_grad = true })
  local noise
  -- the segment's tensors are freed when it returns: keep their values, not the tensor
  local y = zr.checkpoint(function(a)
    local r = zr.rand({ 50 }, { dtype = "f64" }); noise = noise or r:flat_table(); return a * r
  end, x)
  y:sum():backward()
  T.near(x.grad, zr.tensor(noise, { dtype = "f64" }), 0)
end)

-- zr.checkpoint frees the tensors a segment makes when it returns (no full Lua collection, which
-- walks the whole heap 16-32 times a micro-batch); one the function kept says so when used.
T.test("checkpoint frees the segment's tensors at once and says so when one was kept", function()
  local x = zr.randn({ 8, 8 }, { requires_grad = true })
  local kept
  local before = zr.memory.stats().total_current
  collectgarbage("stop") -- only the release may free them
  local ok, err = pcall(function()
    local y = zr.checkpoint(function(a)
      local t = a * 2
      for _ = 1, 20 do t = t:exp():log() end -- 40 temporaries of 8x8
      kept = t
      return t * a
    end, x)
    T.eq(zr.memory.stats().total_current - before, 8 * 8 * 4, "only the output is left")
    y:sum():backward()
  end)
  collectgarbage("restart")
  assert(ok, err)
  T.near(x.grad, x * 4, 1e-5)
  T.raises(function() return kept + 1 end, "this tensor was freed (zr.release, or the zr.checkpoint function")
  T.raises(function() return kept:shape() end, "this tensor was freed")
end)

T.done()
