-- Collective latency and bandwidth on CPU ranks (MPI or TCP backend): a timed loop of all_reduce at a few
-- sizes, the fastest of 9 rounds (the least disturbed by other load). Compares builds and settings (ZRUN_COMM_TIMEOUT, ZRUN_COMM_DEBUG):
--   mpirun -np 2 ./zrun tests/bench/bench_comm.lua
-- and over the TCP backend (ranks as torchrun starts them; any free port):
--   for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 ./zrun tests/bench/bench_comm.lua & done; wait
local zr = require "zrun"
local now = require("zrun._C").now
local dist = zr.dist
for _, n in ipairs { 1, 1024, 262144, 4194304 } do
  local t = zr.ones(n)
  local iters = n <= 1024 and 20000 or (n <= 262144 and 400 or 20)
  local rounds = {}
  for k = 1, 9 do
    dist.barrier()
    local t0 = now()
    for _ = 1, iters do dist.all_reduce(t, "sum") end
    dist.barrier()
    rounds[k] = (now() - t0) / iters
  end
  table.sort(rounds)
  dist.print0(string.format("all_reduce %8d f32: %9.2f us", n, rounds[1] * 1e6))
end
