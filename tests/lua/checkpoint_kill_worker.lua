-- Worker for tests/lua/test_checkpoint_atomic.lua's kill loop (not a test itself): trains the tiny
-- Llama of checkpoint_kill_setup and saves into DIR/ck after every step, forever, until killed;
-- creates the file READY once its first save is done (so the test kills it while saving).
--   zrun tests/lua/checkpoint_kill_worker.lua DIR READY
local setup = dofile((arg[0]:gsub("[^/]*$", "")) .. "checkpoint_kill_setup.lua")
local dir, ready = arg[1], arg[2]
assert(dir and ready, "usage: zrun tests/lua/checkpoint_kill_worker.lua DIR READY")
local e = setup.engine()
for s = 1, 1e9 do
  setup.step(e, s)
  e:save_checkpoint(dir, "ck", { step = s })
  if s == 1 then io.open(ready, "w"):close() end
end
