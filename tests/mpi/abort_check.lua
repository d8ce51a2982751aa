-- Rank 1 fails while the others wait in a collective: every rank must exit, none may hang.
local zr = require "zrun"
local dist = zr.dist
if dist.rank() == 1 then error("deliberate failure on rank 1") end
dist.barrier()
print("rank " .. dist.rank() .. " passed the barrier (should not happen)")
