-- One training step of the train_mlp recipe's model (512 -> 2048 -> 2048 -> 10, batch 4, AdamW),
-- split into forward, backward and optimizer step. Median of 50 steps after 5 warm-ups.
local zr = require "zrun"
local C = zr._C
local nn = zr.nn
zr.manual_seed(0)
local model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
local opt = zr.optim.AdamW(model:parameters(), { lr = 1e-4, weight_decay = 0.01 })
local x, y = zr.randn(4, 512), zr.tensor({ 1, 2, 3, 4 }, { dtype = "i64" })
local f, b, s, tot = {}, {}, {}, {}
for i = 1, 55 do
  local t0 = C.now()
  local loss = zr.cross_entropy(model(x), y)
  local t1 = C.now()
  loss:backward()
  local t2 = C.now()
  opt:step()
  opt:zero_grad()
  local t3 = C.now()
  if i > 5 then f[#f + 1], b[#b + 1], s[#s + 1], tot[#tot + 1] = t1 - t0, t2 - t1, t3 - t2, t3 - t0 end
end
local function med(t) table.sort(t); return t[math.ceil(#t / 2)] * 1e3 end
print(("%-34s %10s"):format("MLP train step (batch 4)", "ms"))
print(("%-34s %10.3f"):format("forward", med(f)))
print(("%-34s %10.3f"):format("backward", med(b)))
print(("%-34s %10.3f"):format("AdamW step + zero_grad", med(s)))
print(("%-34s %10.3f"):format("whole step", med(tot)))
print(("%-34s %10.0f"):format("samples/s", 4 / (med(tot) / 1e3)))
