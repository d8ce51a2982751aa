-- Launchers: torchrun/Accelerate's variables with MASTER_ADDR/MASTER_PORT start the TCP backend
-- (tests/tcp/ runs it); a partial torchrun environment is refused with the fix, a mixed launch whose
-- variables disagree is refused, and a consistent one (or a world of one) runs.
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist

local function env(t) return function(k) return t[k] end end
local z = os.getenv("ZRUN_BIN") or "./zrun"

T.test("no launcher variables, or torchrun with one process: runs", function()
  T.eq(dist.check_launch(env {}), nil)
  T.eq(dist.check_launch(env { RANK = "0", WORLD_SIZE = "1", LOCAL_RANK = "0", LOCAL_WORLD_SIZE = "1",
    MASTER_ADDR = "127.0.0.1", MASTER_PORT = "29500" }), nil)
end)

T.test("torchrun with several processes joins over TCP; a partial environment is refused with the fix", function()
  T.eq(dist.check_launch(env { RANK = "1", WORLD_SIZE = "2", LOCAL_RANK = "1", LOCAL_WORLD_SIZE = "2",
    MASTER_ADDR = "10.0.0.1", MASTER_PORT = "29500" }), nil)
  local m = dist.check_launch(env { RANK = "1", WORLD_SIZE = "2", LOCAL_RANK = "1", LOCAL_WORLD_SIZE = "2" })
  assert(m and m:find("started as rank 1 of 2 (RANK, WORLD_SIZE) without MASTER_ADDR and MASTER_PORT", 1, true), m)
  assert(m:find("mpirun -np 2", 1, true) and m:find("--bind-to none", 1, true), m)
  m = dist.check_launch(env { RANK = "0", WORLD_SIZE = "8", MASTER_ADDR = "h", MASTER_PORT = "70000" })
  assert(m and m:find("without MASTER_ADDR and MASTER_PORT", 1, true), m)
  m = dist.check_launch(env { RANK = "3" })
  assert(m:find("WORLD_SIZE is not", 1, true), m)
  m = dist.check_launch(env { RANK = "2", WORLD_SIZE = "2" })
  assert(m:find("outside WORLD_SIZE=2", 1, true), m)
  T.eq(dist.check_launch(env { WORLD_SIZE = "8" }), nil, "WORLD_SIZE alone (zrun check's world) is no launch")
  m = dist.check_launch(env { WORLD_SIZE = "4", LOCAL_RANK = "0" })
  assert(m:find("LOCAL_RANK=0 and WORLD_SIZE=4 are set but RANK is not", 1, true), m)
  m = dist.check_launch(env { WORLD_SIZE = "two" })
  assert(m:find("WORLD_SIZE=two is not a non-negative integer", 1, true), m)
end)

T.test("mixed launch: MPI and torchrun variables must agree", function()
  local base = { OMPI_COMM_WORLD_RANK = "1", OMPI_COMM_WORLD_SIZE = "2", OMPI_COMM_WORLD_LOCAL_RANK = "1" }
  local function with(t)
    local e = {}
    for k, v in pairs(base) do e[k] = v end
    for k, v in pairs(t) do e[k] = v end
    return env(e)
  end
  T.eq(dist.check_launch(with {}), nil)
  T.eq(dist.check_launch(with { RANK = "1", WORLD_SIZE = "2", LOCAL_RANK = "1" }), nil)
  local m = dist.check_launch(with { WORLD_SIZE = "4" })
  assert(m:find("mixed launch: openmpi started this process as OMPI_COMM_WORLD_SIZE=2 but WORLD_SIZE=4", 1, true), m)
  m = dist.check_launch(with { RANK = "0" })
  assert(m:find("OMPI_COMM_WORLD_RANK=1 but RANK=0", 1, true), m)
  m = dist.check_launch(env { SLURM_PROCID = "0", SLURM_NTASKS = "4", WORLD_SIZE = "8", RANK = "0" })
  assert(m:find("slurm started", 1, true) and m:find("before srun", 1, true), m)
end)

T.test("mpirun command: --allow-run-as-root as root, --oversubscribe past the cores", function()
  local c = dist.mpirun_command(4, { root = true, cpus = 2, argv = { "r.lua", "a=b c" }, zrun = "zrun" })
  T.eq(c, "mpirun -np 4 --allow-run-as-root --oversubscribe --bind-to none zrun r.lua 'a=b c'")
  c = dist.mpirun_command(2, { root = false, cpus = 8, argv = { "r.lua" }, zrun = "zrun" })
  T.eq(c, "mpirun -np 2 --bind-to none zrun r.lua")
end)

T.test("zrun started with RANK=1 WORLD_SIZE=2 and no MASTER_ADDR stops with the reason instead of running as rank 0 of 1", function()
  local out, rc = T.run(("env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u MASTER_ADDR -u MASTER_PORT RANK=1 " ..
    "WORLD_SIZE=2 %s -e 'print(\"ran as rank \" .. require(\"zrun\").dist.rank())'"):format(z))
  assert(not out:find("^ran as rank") and not out:find("\nran as rank"), out)
  assert(rc == 1 and out:find("rank 1 of 2", 1, true) and out:find("MASTER_ADDR", 1, true), out)
  out = T.run(("RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 %s -e 'print(\"world \" .. require(\"zrun\").dist.world_size())'"):format(z))
  assert(out:find("world 1", 1, true), out)
end)

T.test("a rank bound to fewer CPUs than its share is told about --bind-to none", function()
  local i = { rank = 0, world_size = 2, local_size = 2, launcher = "openmpi" }
  local w = dist.binding_warning(i, 16, 1)
  assert(w and w:find("bound each rank to 1 of this machine's 16 CPUs, so 14 of them idle", 1, true), w)
  assert(w:find("--bind-to none` (with OMP_NUM_THREADS=8)", 1, true), w)
  T.eq(dist.binding_warning(i, 16, 8), nil)
  T.eq(dist.binding_warning({ rank = 0, world_size = 1, local_size = 1, launcher = "none" }, 16, 1), nil)
end)

T.done()
