-- Sharding shown, not assumed: after a training step, each rank's allocator bytes by category
-- equal the formula for the stage and world size (tiny Llama, fp32 on CPU). With n_i the
-- parameters' sizes, P = Σ n_i and S = Σ ceil(n_i / W) (W = 1 at stage 0):
--   params     stages 0-2: 4P (whole model)           stage 3: 4S (this rank's shard only)
--              + 4 W ceil(n_i / W) for every parameter below stage3_param_persistence_threshold (kept
--              whole, in the storage its W chunks were all-gathered into);
--              the test runs with threshold 0, and 5000 (the norms and some projections persist)
--   optimizer  fp32 master + exp_avg + exp_avg_sq:     12S
--   grads      stages 0-1: 4P (fp32 .grad) + 4S        stages 2-3: 4S (reduced partition only)
--              except with one chunk per parameter (stage 0, or world size 1, stages 0-2): the
--              .grad tensors are views into the partition, so 4S (= 4P) alone
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local stage = tonumber(arg[1] or 2)
local persist = tonumber(arg[2] or 0)
local W, r = dist.world_size(), dist.rank()
zr.manual_seed(7)
local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
local sizes, P = {}, 0
for _, p in ipairs(model:parameters()) do sizes[#sizes + 1] = p:numel(); P = P + p:numel() end
local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000,
  optimizer = { type = "AdamW", params = { lr = 1e-3 } },
  zero_optimization = { stage = stage, stage3_param_persistence_threshold = persist } } })
local ids = (zr.rand({ 2, 16 }) * 250):to("i64")
local out = engine(ids, ids)
engine:backward(out.loss)
engine:step()
out = nil
collectgarbage("collect")
local Wl = stage == 0 and 1 or W
local S = 0
for _, n in ipairs(sizes) do S = S + math.ceil(n / Wl) end
local kept = 0
for _, n in ipairs(sizes) do if n < persist then kept = kept + W * math.ceil(n / W) end end
local want = {
  params = stage == 3 and (4 * S + 4 * kept) or 4 * P,
  optimizer = 12 * S,
  grads = (stage <= 1 and Wl > 1) and (4 * P + 4 * S) or 4 * S,
}
local s = zr.memory.stats()
local function check()
  for _, c in ipairs { "params", "grads", "optimizer" } do
    T.eq(s[c].current, want[c], ("rank %d %s bytes (stage %d, W=%d, P=%d, S=%d)"):format(r, c, stage, W, P, S))
  end
end
if r == 0 then T.test(("memory formula stage %d np=%d%s"):format(stage, W, persist > 0 and (" persistence<" .. persist) or ""), check)
else check() end
T.done()
