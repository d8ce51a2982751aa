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

-- The collectives work in place on contiguous tensors. With { async_op = true } as the last
-- argument they return a handle instead; handle:wait() completes it (on a GPU: later kernels
-- wait for it, the host does not), as torch.distributed's async_op does.
local function async(o) return type(o) == "table" and o.async_op end
function M.all_reduce(t, op, o)
  get()
  if async(op) then op, o = nil, op end
  if async(o) then return C.all_reduce_async(t, op) end
  return C.all_reduce(t, op)
end
function M.reduce_scatter(out, inp, op, o)
  get()
  if async(op) then op, o = nil, op end
  if async(o) then return C.reduce_scatter_async(out, inp, op) end
  return C.reduce_scatter(out, inp, op)
end
function M.all_gather(out, inp, o)
  get()
  if async(o) then return C.all_gather_async(out, inp) end
  return C.all_gather(out, inp)
end
function M.broadcast(t, root) get(); return C.broadcast(t, root) end
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
