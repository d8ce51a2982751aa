-- Worker for tests/lua/test_checkpoint_atomic.lua's kill loop (not a test itself): trains the tiny
-- Llama of checkpoint_kill_setup and saves into DIR/ck after every step, forever, until killed.
--   zrun tests/lua/checkpoint_kill_worker.lua DIR
local setup = dofile((arg[0]:gsub("[^/]*$", "")) .. "checkpoint_kill_setup.lua")
local dir = assert(arg[1], "usage: zrun tests/lua/checkpoint_kill_worker.lua DIR")
local e = setup.engine()
for s = 1, 1e9 do
  setup.step(e, s)
  e:save_checkpoint(dir, "ck", { step = s })
end
