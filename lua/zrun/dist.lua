-- zr.dist: rank information and collectives. Started under mpirun (OpenMPI/PMIx) or srun, every
-- rank joins the world through MPI; started by torchrun, `accelerate launch` or the deepspeed
-- launcher (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), through a TCP rendezvous at
-- rank 0 as torch's TCPStore does (launcher "torchrun"); started plainly, the world is this one
-- process. A launch whose MPI and torchrun variables disagree is refused with the reason.
local C = require "zrun._C"
local M = {}
local fmt = string.format

-- torchrun's (and Accelerate's, and the deepspeed launcher's) variables, and the launchers zrun joins.
local TORCH_VARS = { "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE" }
local MPI_VARS = { -- launcher, rank, world size, local rank, local size
  { "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE" },
  { "pmix", "PMIX_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS" },
  { "pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS" }, -- MPICH, Intel MPI
  { "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE" },
}

-- True when this process runs as root (mpirun then needs --allow-run-as-root).
local function is_root()
  local f = io.open("/proc/self/status", "r")
  if not f then return false end
  local s = f:read("*a")
  f:close()
  return s:match("\nUid:%s+(%d+)") == "0"
end

-- The mpirun line that starts n ranks of this program on this machine: as root OpenMPI needs
-- --allow-run-as-root; with more ranks than cores, --oversubscribe; --bind-to none lets each rank's
-- OpenMP threads use more than the one core OpenMPI binds it to by default.
-- o: { root = bool, cpus = n, argv = { script, args... } } (defaults: this process).
function M.mpirun_command(n, o)
  o = o or {}
  local root = o.root
  if root == nil then root = is_root() end
  local cpus = o.cpus or C.build_info().cpus
  local argv = o.argv
  if not argv then
    argv = {}
    if arg and arg[0] then
      argv[1] = arg[0]
      for i = 1, #arg do argv[#argv + 1] = arg[i] end
    end
  end
  local words = { "mpirun", "-np", tostring(n) }
  if root then words[#words + 1] = "--allow-run-as-root" end
  if type(n) ~= "number" or n > cpus then words[#words + 1] = "--oversubscribe" end -- ("N": any count)
  words[#words + 1] = "--bind-to none"
  words[#words + 1] = o.zrun or (arg and arg[-1] and arg[-1]:find("zrun$") and arg[-1]) or "zrun"
  for _, a in ipairs(argv) do
    words[#words + 1] = a:find("^[%w_%-%./=:,@+]+$") and a or ("'" .. a:gsub("'", "'\\''") .. "'")
  end
  return table.concat(words, " ")
end

-- The local rank the launcher set (LOCAL_RANK, else the MPI launcher's), read without joining the job;
-- nil without a launcher. getenv as check_launch's.
function M.env_local_rank(getenv)
  getenv = getenv or os.getenv
  local v = tonumber(getenv("LOCAL_RANK") or "")
  if v then return v end
  for _, m in ipairs(MPI_VARS) do
    if getenv(m[2]) then return tonumber(getenv(m[4]) or "") end
  end
  return nil
end

-- Checks the launch environment before any rank joins: nil when it is consistent (no launcher, MPI,
-- or torchrun's RANK/WORLD_SIZE with MASTER_ADDR/MASTER_PORT), else the one-line reason naming the fix. getenv: a function name -> value (default os.getenv), for tests.
function M.check_launch(getenv)
  getenv = getenv or os.getenv
  local t = {}
  for _, k in ipairs(TORCH_VARS) do
    local v = getenv(k)
    if v and v ~= "" then
      t[k] = tonumber(v)
      if not t[k] or t[k] < 0 or t[k] ~= math.floor(t[k]) then
        return fmt("%s=%s is not a non-negative integer (torchrun/Accelerate set it; unset it to run one process)", k, v)
      end
    end
  end
  local mpi
  for _, m in ipairs(MPI_VARS) do
    local r, w = tonumber(getenv(m[2]) or ""), tonumber(getenv(m[3]) or "")
    if r then -- (the world size may be absent: PMIx)
      mpi = { name = m[1], vars = m, rank = r, world = w, local_rank = tonumber(getenv(m[4]) or "") }
      break
    end
  end
  if not next(t) then return nil end
  if mpi then -- a mixed launch: the two sets of variables must describe the same process
    local pairs_ = { { "RANK", mpi.rank, mpi.vars[2] }, { "WORLD_SIZE", mpi.world, mpi.vars[3] },
      { "LOCAL_RANK", mpi.local_rank, mpi.vars[4] } }
    for _, p in ipairs(pairs_) do
      local k, mv, mk = p[1], p[2], p[3]
      if t[k] and mv and t[k] ~= mv then
        return fmt("mixed launch: %s started this process as %s=%d but %s=%d is also set (torchrun/Accelerate's " ..
          "variable); use one launcher: unset RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE before %s",
          mpi.name, mk, mv, k, t[k], mpi.name == "slurm" and "srun" or "mpirun")
      end
    end
    return nil
  end
  local world, rank = t.WORLD_SIZE, t.RANK
  if (world or 1) <= 1 and (rank or 0) == 0 then return nil end -- torchrun --nproc_per_node 1: a world of one
  -- WORLD_SIZE alone is no launch (torchrun sets RANK and LOCAL_RANK with it): `WORLD_SIZE=8 zrun
  -- check ds.json` checks a config for 8 ranks
  if not rank and not t.LOCAL_RANK then return nil end
  if not world then
    return fmt("RANK=%d is set but WORLD_SIZE is not: this looks like a partial torchrun environment; " ..
      "unset RANK to run one process, or set WORLD_SIZE, MASTER_ADDR and MASTER_PORT for every rank", rank)
  end
  if not rank then
    return fmt("LOCAL_RANK=%d and WORLD_SIZE=%d are set but RANK is not: set RANK (0 to %d) for every process, " ..
      "as torchrun does, or unset WORLD_SIZE to run one process", t.LOCAL_RANK, world, world - 1)
  end
  if rank >= world then
    return fmt("RANK=%d is outside WORLD_SIZE=%d; unset RANK and WORLD_SIZE, or start the ranks with torchrun", rank, world)
  end
  local addr, port = getenv("MASTER_ADDR"), tonumber(getenv("MASTER_PORT") or "")
  if not addr or addr == "" or not port or port < 1 or port > 65535 or port ~= math.floor(port) then
    return fmt("started as rank %d of %d (RANK, WORLD_SIZE) without MASTER_ADDR and MASTER_PORT: set both for " ..
      "every rank, to rank 0's host and a free port (torchrun, accelerate and deepspeed set them), or start " ..
      "the ranks with: %s", rank, world, M.mpirun_command(world))
  end
  return nil
end

-- CPUs this process may run on (Cpus_allowed_list in /proc/self/status), nil when unknown.
local function allowed_cpus()
  local f = io.open("/proc/self/status", "r")
  if not f then return nil end
  local list = f:read("*a"):match("\nCpus_allowed_list:%s*([%d,%-]+)")
  f:close()
  if not list then return nil end
  local n = 0
  for a, b in list:gmatch("(%d+)%-?(%d*)") do n = n + (b ~= "" and tonumber(b) - tonumber(a) + 1 or 1) end
  return n
end

-- OpenMPI binds each rank to one core by default (up to 2 ranks; to a socket beyond): its OpenMP
-- threads then share that core while the machine's others idle. The warning, or nil; i: comm info,
-- cpus: the machine's, mine: this rank's allowed CPUs (default: this process's).
function M.binding_warning(i, cpus, mine)
  if i.world_size < 2 or i.launcher == "none" then return nil end
  cpus, mine = cpus or C.build_info().cpus, mine or allowed_cpus()
  if not mine or mine * i.local_size >= cpus then return nil end
  return fmt("[zrun] %s bound each rank to %d of this machine's %d CPUs, so %d of them idle; " ..
    "`mpirun --bind-to none` (with OMP_NUM_THREADS=%d) lets the ranks use them all", i.launcher, mine, cpus,
    cpus - mine * i.local_size, math.max(1, math.floor(cpus / i.local_size)))
end

local info
local function get()
  if not info then
    local bad = M.check_launch()
    if bad then error(bad, 0) end
    local ok, i = pcall(C.comm_init) -- a launch that cannot form its world is one line, without a position
    if not ok then error((tostring(i):gsub("^[^\n:]*:%d+: ", "")), 0) end
    info = i
    -- the world MPI actually formed must be the one torchrun's variables describe, where set
    for k, v in pairs { RANK = info.rank, WORLD_SIZE = info.world_size } do
      local e = tonumber(os.getenv(k) or "")
      if e and e ~= v and info.launcher ~= "none" then
        error(fmt("mixed launch: %s formed a world where this process is %s %d, but %s=%d is also set " ..
          "(torchrun/Accelerate's variable); use one launcher: unset RANK, WORLD_SIZE, LOCAL_RANK and " ..
          "LOCAL_WORLD_SIZE", info.launcher, k == "RANK" and "rank" or "one of", v, k, e), 0)
      end
    end
    local w = info.rank == 0 and M.binding_warning(info)
    if w then io.stderr:write(w, "\n") end
  end
  return info
end

-- Joins the job (once; every other function here calls it): reads the launcher's variables (mpirun's,
-- or RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT as torchrun sets them) and returns
-- { rank, world_size, local_rank, local_size, launcher }. One process without a launcher: rank 0 of 1.
function M.init() return get() end
-- This process's rank, 0 .. world_size() - 1 (torch.distributed.get_rank()).
function M.rank() return get().rank end
-- The number of processes in the job (torch.distributed.get_world_size()).
function M.world_size() return get().world_size end
-- This process's rank among those on its node (LOCAL_RANK, or the MPI launcher's): the GPU it takes.
function M.local_rank() return get().local_rank end
-- The number of processes on this node (LOCAL_WORLD_SIZE, or the MPI launcher's).
function M.local_size() return get().local_size end
-- What started the job: "openmpi" (mpirun), "pmix", "slurm" (srun), "torchrun" (RANK / WORLD_SIZE
-- variables, as torchrun, Accelerate and the deepspeed launcher set them) or "none".
function M.launcher() return get().launcher end
-- Whether this is rank 0 (the one that prints and writes files, as print0 does).
function M.is_main() return get().rank == 0 end

local function async(o) -- (the options table's async_op; another key is refused)
  if type(o) ~= "table" then return false end
  return require("zrun.kwargs").check("dist collective", o, { "async_op" }).async_op
end

-- The collectives work in place on contiguous tensors. With { async_op = true } as the last
-- argument they return a handle instead; handle:wait() completes it (on a GPU: later kernels
-- wait for it, the host does not), as torch.distributed's async_op does.
function M.all_reduce(t, op, o)
  get()
  if async(op) then op, o = nil, op end
  if async(o) then return C.all_reduce_async(t, op) end
  return C.all_reduce(t, op)
end
-- out (1/world of inp, contiguous) = this rank's slice of op over every rank's inp; op "sum" (default),
-- "avg", "max" or "min".
function M.reduce_scatter(out, inp, op, o)
  get()
  if async(op) then op, o = nil, op end
  if async(o) then return C.reduce_scatter_async(out, inp, op) end
  return C.reduce_scatter(out, inp, op)
end
-- out (world x inp's size) = every rank's inp, in rank order.
function M.all_gather(out, inp, o)
  get()
  if async(o) then return C.all_gather_async(out, inp) end
  return C.all_gather(out, inp)
end
-- t on every rank = t on rank root (default 0), in place.
function M.broadcast(t, root) get(); return C.broadcast(t, root) end
-- Returns when every rank has called it.
function M.barrier() get(); return C.barrier() end

-- Every collective must complete within `seconds` (<= 0: no deadline), as torch's init_process_group(timeout=)
-- and deepspeed.init_distributed(timeout=) say; the default comes from ZRUN_COMM_TIMEOUT (seconds) or
-- DEEPSPEED_TIMEOUT (minutes), else 30 minutes. Past it, the waiting rank names the collective, its tensor,
-- the step and the ranks that have not arrived in one line, and every rank stops.
function M.set_timeout(seconds) get(); C.comm_set_timeout(seconds) end
function M.timeout() get(); return C.comm_timeout() end
-- The training step those messages name (the engine sets it).
function M.set_step(n) C.comm_set_step(n) end

-- print() on rank 0 only.
function M.print0(...) if get().rank == 0 then print(...) end end

-- Stops every rank with "[rank r] msg" instead of leaving the others waiting.
function M.abort(msg, code) C.comm_abort(tostring(msg), code or 1) end

return M
