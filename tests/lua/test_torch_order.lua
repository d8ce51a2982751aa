-- The orders zrun draws as torch draws them: C.randperm_torch against torch.randperm(n, generator) with
-- torch.Generator().manual_seed(seed) (values printed by torch 2.11), and the Trainer's random order against
-- the rows transformers 5.17's Trainer read (seed + epoch under accelerate; tests/golden/check_trainer_defaults.py
-- compares the two live, tests/golden/reference.sh runs it). torch's DistributedSampler: the same permutation.
local zr = require "zrun"
local T = zr.testing
local C = require "zrun._C"

local function zero_based(t) local out = {}; for i, v in ipairs(t) do out[i] = v - 1 end; return out end

T.test("randperm_torch = torch.randperm with a seeded CPU generator (MT19937), small and large n, seeds past 2^32", function()
  T.eq_list(zero_based(C.randperm_torch(10, 42):flat_table()), { 2, 6, 1, 8, 4, 5, 0, 9, 3, 7 }, "n 10, seed 42")
  T.eq_list(zero_based(C.randperm_torch(10, 43):flat_table()), { 8, 4, 9, 0, 5, 1, 6, 7, 2, 3 }, "n 10, seed 43")
  T.eq_list(zero_based(C.randperm_torch(7, 2 ^ 32 + 5):flat_table()), { 1, 0, 4, 2, 6, 5, 3 }, "seed 2^32 + 5: its low 32 bits")
  T.eq_list(zero_based(C.randperm_torch(1, 3):flat_table()), { 0 }, "n 1")
  T.eq(#C.randperm_torch(0, 3):flat_table(), 0, "n 0")
  -- n = 100000: sum of position x value, and the first five, as torch gives them
  for _, c in ipairs { { 0, 249799464714015, { 36044, 73702, 76369, 2549, 52523 } },
                       { 42, 249820086276545, { 37542, 60279, 68544, 70051, 15790 } } } do
    local p = zero_based(C.randperm_torch(100000, c[1]):flat_table())
    local s = 0
    for i, v in ipairs(p) do s = s + v * (i - 1) end
    T.eq(s, c[2], "n 100000, seed " .. c[1] .. ": sum of i * p[i]")
    T.eq_list({ p[1], p[2], p[3], p[4], p[5] }, c[3], "n 100000, seed " .. c[1] .. ": first five")
  end
  T.raises(function() C.randperm_torch(3, -1) end, "seed must be a non-negative integer")
end)

T.test("the Trainer's random order is transformers': the rows its Trainer read, epoch by epoch (seed, data_seed)", function()
  local rows = {}
  for i = 0, 22 do rows[i + 1] = { input_ids = { i % 90 + 1, 1, 2 } } end
  local function order(extra)
    local args = { output_dir = T.tmpdir() .. "/ord", per_device_train_batch_size = 2, gradient_accumulation_steps = 2,
      num_train_epochs = 2, seed = 42, save_strategy = "no" }
    for k, v in pairs(extra) do args[k] = v end
    local tr = zr.Trainer { model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama")),
      train_dataset = rows, args = args }
    return zero_based((tr:data_order()))
  end
  -- transformers 5.17 Trainer, 23 rows, micro-batch 2, accumulation 2, 2 epochs, seed 42 (and data_seed 7)
  T.eq_list(order {}, { 16, 8, 6, 17, 2, 0, 1, 11, 18, 5, 14, 21, 15, 3, 10, 19, 22, 4, 20, 7, 12, 13, 9,
    13, 17, 16, 20, 18, 7, 1, 10, 15, 12, 11, 21, 14, 6, 4, 8, 22, 2, 19, 0, 3, 9, 5 }, "seed 42")
  T.eq_list(order { data_seed = 7 }, { 10, 15, 1, 9, 11, 20, 7, 14, 21, 12, 5, 18, 17, 0, 16, 3, 6, 8, 2, 4, 13, 19,
    22, 8, 21, 5, 12, 17, 9, 20, 10, 7, 22, 18, 16, 19, 1, 3, 0, 15, 11, 4, 6, 14, 2, 13 }, "data_seed 7")
end)

T.test("DistributedSampler shuffles as torch's: torch.randperm seeded seed + epoch, padded, every world_size-th", function()
  local s = zr.datasets.DistributedSampler.new(10, { rank = 1, world_size = 3, seed = 42 })
  -- torch: randperm(10, seed 42) = 2 6 1 8 4 5 0 9 3 7, padded to 12 with 2 6, rank 1 takes 6 4 9 2
  T.eq_list(zero_based(s:indices()), { 6, 4, 9, 2 }, "epoch 0")
  s:set_epoch(1) -- seed 43: 8 4 9 0 5 1 6 7 2 3 (+ 8 4): rank 1 takes 4 5 7 8
  T.eq_list(zero_based(s:indices()), { 4, 5, 7, 8 }, "epoch 1")
end)

T.done()
