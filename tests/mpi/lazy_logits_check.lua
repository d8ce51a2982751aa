-- A training forward's out.logits at ZeRO stage S on W ranks: the loss took the logits over for its
-- gradient (cross_entropy's inplace), so reading out.logits (here after backward, before the step)
-- makes them again with the tied head. They must equal the logits of an eval forward of the same
-- weights (the independent reference: no loss, no inplace), the step after must train as usual
-- (losses equal to a run that never reads out.logits), and at stage 3 no more elements may stay
-- gathered between steps than in that run.
--   mpirun -np W zrun tests/mpi/lazy_logits_check.lua STAGE
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local stage = tonumber(arg[1] or 3)
local W, r = dist.world_size(), dist.rank()
local cfg = zr.models.llama.config("zrun/tiny-llama")
cfg.tie_word_embeddings = true -- the head is the embedding, used outside its module
local name = ("lazy out.logits, stage %d np=%d"):format(stage, W)

local function batch(s) -- this rank's 2 rows of a seeded 2W-row batch
  zr.manual_seed(100 + s)
  return (zr.rand({ 2 * W, 9 }) * 250):to("i64"):narrow(1, 2 * r + 1, 2):contiguous()
end

-- Losses of 4 steps; read: whether each step reads out.logits after backward (and compares them
-- with an eval forward's, taken before the step).
local function run(read)
  zr.manual_seed(4321)
  local engine = zr.initialize({ model = zr.models.llama.LlamaForCausalLM(cfg), config = {
    train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
    optimizer = { type = "AdamW", params = { lr = 1e-3 } },
    zero_optimization = { stage = stage, reduce_bucket_size = 4000 } } })
  local losses, live = {}, {}
  for s = 1, 4 do
    local ids = batch(1) -- one batch, so that the loss falls in 4 steps
    local want
    if read then
      engine:eval()
      want = zr.no_grad(function() return engine(ids).logits end)
      engine:train()
    end
    local out = engine(ids, ids)
    losses[s] = out.loss:item()
    engine:backward(out.loss)
    if read then
      T.eq(rawget(out, "logits"), nil, "step " .. s .. ": out.logits not made before it is read")
      T.near(out.logits, want, 1e-5, 1e-5, "step " .. s .. ": out.logits (made on read) vs an eval forward")
    end
    engine:step()
    live[s] = stage == 3 and engine.zero:live_numel() or 0 -- gathered elements between steps
  end
  return losses, live
end

T.test(name, function()
  local plain, live_plain = run(false)
  local read, live_read = run(true)
  T.near(read, plain, 0, 0, "losses with and without reading out.logits")
  T.eq(table.concat(live_read, " "), table.concat(live_plain, " "), "stage 3: elements gathered between steps")
  assert(plain[4] < plain[1], ("the loss falls: %.4f -> %.4f"):format(plain[1], plain[4]))
end)
T.done()
