-- Helper of test_progress.lua (not a test itself): a loop of N steps, PAUSE seconds each, with a
-- progress bar and a print() every 10 steps, as the Trainer's loop does.
--   zrun tests/lua/progress_demo.lua [N] [PAUSE]
local zr = require "zrun"
local n, pause = tonumber(arg[1]) or 30, tonumber(arg[2]) or 0.05
local bar = zr.progress { total = n, desc = "demo", interval = 0.2 }
for i = 1, n do
  local t = zr.now()
  while zr.now() - t < pause do end
  if i % 10 == 0 then print("log line " .. i) end
  bar:update(1, { loss = 1 / i })
end
bar:close()
print("finished")
