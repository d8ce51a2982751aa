-- zr.dist: rank information and collectives. Started under mpirun (OpenMPI/PMIx) or srun, every
-- rank joins the world; started plainly, the world is this one process.
local C = require "zrun._C"
local M = {}

local info
local function get()
  if not info then info = C.comm_init() end
  return info
end

function M.init() return get() end
function M.rank() return get().rank end
function M.world_size() return get().world_size end
function M.local_rank() return get().local_rank end
function M.local_size() return get().local_size end
function M.launcher() return get().launcher end
function M.is_main() return get().rank == 0 end

function M.all_reduce(t, op) get(); return C.all_reduce(t, op) end
function M.reduce_scatter(out, inp, op) get(); return C.reduce_scatter(out, inp, op) end
function M.all_gather(out, inp) get(); return C.all_gather(out, inp) end
function M.broadcast(t, root) get(); return C.broadcast(t, root) end
function M.barrier() get(); return C.barrier() end

-- print() on rank 0 only.
function M.print0(...) if get().rank == 0 then print(...) end end

-- Stops every rank with "[rank r] msg" instead of leaving the others waiting.
function M.abort(msg, code) C.comm_abort(tostring(msg), code or 1) end

return M
