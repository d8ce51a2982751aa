-- Faults that used to hang every rank silently (run by test_comm_timeout.sh with a short
-- ZRUN_COMM_TIMEOUT): arg 1 says which. Every rank must end within the deadline, the culprit named.
--   absent      rank 1 never reaches its second all_reduce (an endless loop, as a stuck read would)
--   collective  rank 1 calls all_gather where the others call all_reduce
--   shape       rank 1 all-reduces 5 elements where the others all-reduce 4
--   async       rank 1 never waits for its part: rank 0 waits on an async handle
--   async_shape rank 1 all-reduces 5 elements asynchronously where the others all-reduce 4 blocking
--               (only ZRUN_COMM_DEBUG=1 compares asynchronous and NCCL collectives)
--   engine      ZeRO stage 2 on a tiny Llama: rank 1 stops before its step 2 backward (engine3: stage 3)
--   exit        rank 1 ends its program before the second all_reduce
--   late        rank 1 arrives 1 s late, inside the deadline: no fault
--   ok          no fault: the same calls complete, under the debug check too
local zr = require "zrun"
local dist = zr.dist
local mode = arg[1] or "ok"
local r, W = dist.rank(), dist.world_size()
-- ZRUN_CHECK_DEVICE=cuda: the same on one GPU per rank, through NCCL (tests/cuda/test_comm_timeout_gpu.sh)
local dev = os.getenv("ZRUN_CHECK_DEVICE") == "cuda" and "cuda" or nil
local o = { device = dev }
if mode == "engine" or mode == "engine3" then -- a tiny Llama under ZeRO; rank 1 stops before its step 2 backward
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.device = dev
  zr.manual_seed(1)
  local engine = zr.initialize({ model = zr.models.llama.LlamaForCausalLM(cfg), config = {
    train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
    zero_optimization = { stage = mode == "engine3" and 3 or 2, reduce_bucket_size = 3000 } } })
  for step = 1, 3 do
    local ids = (zr.rand({ 2, 8 }) * 250):to("i64")
    if dev then ids = ids:to(dev) end
    local loss = engine(ids, ids).loss
    if r == 1 and step == 2 then while true do end end
    engine:backward(loss)
    engine:step()
  end
  return
end
local t = zr.full({ 4 }, r + 1, o)
dist.all_reduce(t, "sum") -- #1: everybody
if r == tonumber(arg[2] or 1) and mode == "absent" then while true do end end -- arg 2: which rank (1)
if r == 1 and mode == "exit" then return end -- finishes (MPI_Finalize) while the others wait
if r == 1 and mode == "late" then
  local now = require("zrun._C").now
  local t0 = now()
  while now() - t0 < 1 do end
end
if r == 1 and mode == "collective" then
  dist.all_gather(zr.zeros(4 * W, o), zr.zeros(4, o))
elseif r == 1 and mode == "shape" then
  dist.all_reduce(zr.zeros(5, o), "sum")
elseif r == 1 and mode == "async_shape" then
  dist.all_reduce(zr.zeros(5, o), "sum", { async_op = true }):wait()
elseif mode == "async" then
  if r == 1 then while true do end end
  dist.all_reduce(t, "sum", { async_op = true }):wait()
else
  dist.all_reduce(t, "sum") -- #2
end
assert(math.abs(t[1] - W * W * (W + 1) / 2) < 1e-4, "wrong sum " .. t[1])
dist.barrier()
if r == 0 then print("hang_check " .. mode .. ": completed") end
