-- The LM head and its loss, forward + backward, at the training shapes (Llama-3.2-1B: 4x512 and 4x2048 tokens x
-- 128256, hidden 2048; Gemma-3-1B: 4x1024 x 262144, hidden 1152; GPT-2: 64x1024 x 50257, hidden 768): the models'
-- plain path (zr.linear, then zr.cross_entropy with inplace: the logits made whole, the gradient written over them)
-- against zr.linear_cross_entropy (chunked_loss: a slice of the vocabulary at a time, made again in backward), at its
-- default slices and others, with every label counted and with half of each row's labels -100 (an SFT prompt: the op
-- skips those rows). The weight's gradient is an fp32 buffer, as the ZeRO engine keeps it (dW goes straight into it).
-- ms: forward + backward, synchronised, median of 10 after 3 warm-ups; MiB: the most memory allocated beyond the
-- inputs and the weight's gradient. On the CPU a small shape.
--   ./zrun tests/bench/bench_linear_ce.lua
local zr = require "zrun"
local C = zr._C
local gpu = C.cuda and C.cuda.device_count() > 0
local dev = gpu and "cuda:0" or "cpu"
local sync = gpu and function() zr.cuda.synchronize() end or function() end
local dt = gpu and "bf16" or "f32"

local shapes = gpu and { { "Llama 4x512", 2048, 2048, 128256 }, { "Llama 4x2048", 8192, 2048, 128256 },
  { "Gemma-3 4x1024", 4096, 1152, 262144 }, { "GPT-2 64x1024", 65536, 768, 50257 } }
  or { { "small (CPU)", 512, 64, 4096 } }

local function median(t) table.sort(t); return t[math.ceil(#t / 2)] end

-- f(h, w, t) -> loss, run forward + backward; ms and peak MiB beyond what is allocated before
local function measure(h0, w, t, f)
  local ms, mib = {}, {}
  for i = 1, 13 do
    local h = h0:detach():requires_grad_(true)
    sync()
    collectgarbage()
    local before = zr.memory.stats(dev).total_current
    zr.memory.reset_peak(dev)
    local t0 = C.now()
    local l = f(h, w, t)
    l:backward()
    sync()
    local t1 = C.now()
    if i > 3 then
      ms[#ms + 1] = (t1 - t0) * 1e3
      mib[#mib + 1] = (zr.memory.stats(dev).total_peak - before) / 2 ^ 20
    end
    l, h = nil, nil
  end
  return median(ms), median(mib)
end

print(("device %s, %s; ms = forward + backward, MiB = the most allocated beyond the inputs"):format(dev, dt))
print(("%-16s %-8s %-28s %9s %9s"):format("shape", "labels", "path", "ms", "MiB"))
for _, s in ipairs(shapes) do
  local name, N, D, V = s[1], s[2], s[3], s[4]
  zr.manual_seed(1)
  local h0 = (zr.randn({ N, D }) * 0.5):to(dt):to(dev)
  local w = (zr.randn({ V, D }) * 0.02):to(dt):to(dev):requires_grad_(true)
  w.grad = zr.zeros({ V, D }, { device = dev }) -- fp32, as the engine's
  local ids = (zr.rand({ N }) * (V - 1)):to("i64")
  for _, prompt in ipairs { 0, 0.5 } do
    local t = ids:clone()
    if prompt > 0 then -- the first half of every 1024 tokens -100 (of all N on the CPU): half the tokens
      local m = zr.tensor((function()
        local r = {}
        local L = math.min(N, 1024)
        for i = 1, N do r[i] = ((i - 1) % L) < L / 2 and 0 or 1 end
        return r
      end)()):to("f32")
      t = (t:to("f32") * m + (m - 1) * 100):to("i64")
    end
    t = t:to(dev)
    local paths = { { "linear + cross_entropy", function(h, ww, tt)
      return zr.cross_entropy(zr.linear(h, ww), tt, { inplace = true })
    end } }
    for _, c in ipairs(gpu and { 0, 8192, 32768 } or { 0, 512 }) do
      paths[#paths + 1] = { "linear_cross_entropy " .. (c == 0 and "default" or c), function(h, ww, tt)
        return zr.linear_cross_entropy(h, ww, tt, { chunk = c })
      end }
    end
    for _, p in ipairs(paths) do
      local ms, mib = measure(h0, w, t, p[2])
      print(("%-16s %-8s %-28s %9.3f %9.1f"):format(name, prompt > 0 and "half" or "all", p[1], ms, mib))
    end
  end
end
