-- Host time of a training micro-batch with a large dataset in the Lua heap: a tokenized dataset is
-- Lua tables (40 bytes a token), and a full Lua collection walks all of it (50k rows of 300 tokens:
-- ~130 ms). zrun's models and zr.checkpoint free their temporaries when they return, and the
-- engine collects before backward only when that could free more than 1/256 of the device's bytes
-- (C.collect_tensor_garbage): this shows what a step costs with and without such a dataset, with
-- and without gradient checkpointing, and how many collections ran.
--   zrun tests/bench/bench_lua_heap.lua [rows=50000] [steps=20] [device=cpu] [layers=4] [T=64] [B=1]
--   (device=cuda: the Llama-3.2-1B shape from config=<config.json>, bf16)
local zr = require "zrun"
local C = zr._C
local counts = C.tensor_gc_counts or function() return 0, 0 end -- (older builds: not counted)
local o = {}
local known = { rows = 1, steps = 1, device = 1, layers = 1, T = 1, B = 1, config = 1 }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if not k or not known[k] then error("bench_lua_heap: unknown argument '" .. a .. "' (rows= steps= device= layers= T= B= config=)", 0) end
  o[k] = v
end
local rows_n, steps = tonumber(o.rows or 50000), tonumber(o.steps or 20)
local device = o.device or "cpu"
local B, T = tonumber(o.B or 1), tonumber(o.T or 64)

local function dataset(n) -- what a tokenized SFT dataset holds: ids, labels and a mask per row
  local rows = {}
  for i = 1, n do
    local ids, mask, labels = {}, {}, {}
    for j = 1, 300 do ids[j] = (i * 31 + j) % 250; mask[j] = 1; labels[j] = j % 3 == 0 and -100 or ids[j] end
    rows[i] = { input_ids = ids, attention_mask = mask, labels = labels }
  end
  return rows
end

local function model_cfg()
  local cfg
  if o.config then
    cfg = require("cjson").decode(assert(io.open(o.config)):read("*a"))
  else
    cfg = zr.models.llama.config("zrun/tiny-llama")
    cfg.num_hidden_layers = tonumber(o.layers or 4)
  end
  cfg.device = device
  if device ~= "cpu" then cfg.dtype = "bf16" end
  return cfg
end

local function run(ckpt)
  zr.manual_seed(1)
  local model = zr.models.llama.LlamaForCausalLM(model_cfg())
  if ckpt then model:gradient_checkpointing_enable() end
  local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = B, steps_per_print = 1e9,
    optimizer = { type = "AdamW", params = { lr = 1e-4 } }, bf16 = { enabled = device ~= "cpu" },
    zero_optimization = { stage = 2 } } })
  local vocab = model.config.vocab_size
  local function batch(s)
    local r = {}
    for i = 1, B do
      local t = {}
      for j = 1, T do t[j] = (i * 37 + j * 11 + s * 5) % vocab end
      r[i] = t
    end
    local ids = zr.tensor(r, { dtype = "i64" })
    return device == "cpu" and ids or ids:to(device)
  end
  local function step(s)
    local ids = batch(s)
    local out = engine(ids, ids)
    engine:backward(out.loss)
    engine:step()
    return out.loss
  end
  step(0); step(0) -- warm-up (kernels, allocator, JIT)
  if device ~= "cpu" then C.cuda.synchronize() end
  local c0, s0 = counts()
  local t0 = C.now()
  local loss
  for s = 1, steps do loss = step(s) end
  local l = loss:item()
  if device ~= "cpu" then C.cuda.synchronize() end
  local ms = (C.now() - t0) * 1000 / steps
  local c1, s1 = counts()
  for _, h in ipairs(engine.hook_handles or {}) do h.remove() end
  engine, model = nil, nil
  collectgarbage(); collectgarbage() -- this run's model and optimizer states go before the next
  return ms, c1 - c0, s1 - s0, l
end

print(("| dataset in the Lua heap | checkpointing | ms / micro-batch | full collections | skipped | loss |"))
print("|---|---|---|---|---|---|")
local ds
for _, n in ipairs { 0, rows_n } do
  ds = n > 0 and dataset(n) or nil
  collectgarbage(); collectgarbage()
  local heap = collectgarbage("count") / 1024
  for _, ck in ipairs { false, true } do
    local ms, ran, skipped, l = run(ck)
    print(("| %d rows (%.0f MB) | %s | %.2f | %d | %d | %.4f |"):format(n, heap, ck and "on" or "off", ms, ran, skipped, l))
  end
end
local t0 = C.now()
collectgarbage("collect")
print(("one full Lua collection with the %d-row dataset: %.1f ms"):format(rows_n, (C.now() - t0) * 1000))
assert(ds) -- (kept alive to here)
