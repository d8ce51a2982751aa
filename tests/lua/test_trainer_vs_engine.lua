-- The Trainer and the direct engine API (zr.initialize + engine:backward + engine:step) give the
-- same loss curve for the same data, weights and settings: bf16 on an f32-built model, ZeRO-2,
-- 2 accumulated micro-batches, clipping; the direct API with and without model_parameters.
local zr = require "zrun"
local T = zr.testing
local D = zr.datasets

local cfg = zr.models.llama.config("zrun/tiny-llama")
local STEPS, MB, GAS, LR = 6, 2, 2, 3e-3

local function dataset()
  zr.manual_seed(3)
  local rows = {}
  for i = 1, 16 do
    local ids = {}
    for j = 1, 24 do ids[j] = (i * 31 + j * 7 + (j % 5) * i) % 250 + 3 end
    rows[i] = { input_ids = ids }
  end
  return D.Dataset.from_rows(rows)
end

local function ds_config()
  return { train_micro_batch_size_per_gpu = MB, gradient_accumulation_steps = GAS, gradient_clipping = 1.0,
    steps_per_print = 1000000, bf16 = { enabled = true },
    optimizer = { type = "AdamW", params = { lr = LR, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0.0 } },
    zero_optimization = { stage = 2 } }
end

local function model()
  zr.manual_seed(21)
  return zr.models.llama.LlamaForCausalLM(cfg)
end

local function direct(with_params)
  local m = model()
  local e, _, loader = zr.initialize({ model = m, config = ds_config(), training_data = dataset(),
    model_parameters = with_params and m:parameters() or nil, collate_fn = D.causal_lm_collator({ pad_token_id = 0 }),
    seed = 42 })
  local losses, acc, n, epoch = {}, 0, 0, 0
  while #losses < STEPS do
    loader:set_epoch(epoch)
    for batch in loader:iter() do
      local out = e(batch.input_ids, batch.labels)
      e:backward(out.loss)
      acc, n = acc + out.loss:item(), n + 1
      if e:step() then
        losses[#losses + 1] = acc / n
        acc, n = 0, 0
        if #losses == STEPS then break end
      end
    end
    epoch = epoch + 1
  end
  return losses, e
end

local function trainer()
  local out = os.tmpname()
  os.remove(out)
  local t = zr.Trainer({ model = model(), train_dataset = dataset(),
    data_collator = D.causal_lm_collator({ pad_token_id = 0 }),
    args = { output_dir = out, per_device_train_batch_size = MB, gradient_accumulation_steps = GAS,
      learning_rate = LR, weight_decay = 0.0, max_grad_norm = 1.0, bf16 = true, max_steps = STEPS,
      logging_steps = 1, seed = 42, deepspeed = ds_config(),
      -- the config has no scheduler, so HF's Trainer would add its linear decay; the direct run has none
      lr_scheduler_type = "constant" } })
  t:train()
  local losses = {}
  for line in io.lines(out .. "/metrics.jsonl") do
    local r = require("cjson").decode(line)
    if r.step and r.loss then losses[r.step] = r.loss end
  end
  os.execute("rm -rf '" .. out .. "'")
  return losses, t.engine
end

T.test("Trainer and direct API (with and without model_parameters): same loss curve, bf16 ZeRO-2", function()
  local lt, et = trainer()
  local la, ea = direct(true)
  local lb = direct(false)
  T.eq(#lt, STEPS, "trainer steps logged")
  for i = 1, STEPS do
    T.near(lt[i], la[i], 1e-5, 1e-6, "step " .. i .. " trainer vs direct with model_parameters")
    T.near(la[i], lb[i], 0, 0, "step " .. i .. " direct with vs without model_parameters")
  end
  assert(lt[STEPS] < lt[1] - 0.3, ("the loss must fall: %g -> %g"):format(lt[1], lt[STEPS]))
  assert(et.last_grad_norm > 0 and ea.last_grad_norm > 0, "gradient norm is zero")
  T.near(et.last_grad_norm, ea.last_grad_norm, 1e-5, 1e-6, "last gradient norm")
end)

T.test("the engine's training dataloader keeps a last shorter micro-batch unless dataloader_drop_last, as DeepSpeed's", function()
  local rows = {}
  for i = 1, 7 do rows[i] = { input_ids = { i + 2, i + 3, i + 4 } } end
  for _, drop in ipairs { false, true } do
    local c = ds_config()
    c.dataloader_drop_last = drop
    local _, _, loader = zr.initialize({ model = model(), config = c, training_data = D.Dataset.from_rows(rows), seed = 1 })
    local sizes, seen = {}, 0
    for batch in loader:iter() do
      sizes[#sizes + 1] = batch.input_ids:size(1)
      seen = seen + batch.input_ids:size(1)
    end
    T.eq(table.concat(sizes, ","), drop and "2,2,2" or "2,2,2,1", "micro-batch rows, dataloader_drop_last " .. tostring(drop))
    T.eq(loader:len(), #sizes, "len()")
  end
end)

T.done()
