-- Tensors freed without full Lua collections (lua/bind_handle.c): a full collection walks the whole
-- Lua heap (a tokenized dataset of 50k rows: ~130 ms), so zrun's models free the tensors their
-- forward made and do not return when it returns, zr.checkpoint frees a segment's, and the engine
-- collects before backward only when that could free more than 1/256 of the device's bytes.
local zr = require "zrun"
local T = zr.testing
local C = zr._C
local Module = require "zrun.nn.module"

local function tiny(ckpt)
  zr.manual_seed(3)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  cfg.num_hidden_layers = 2
  local model = zr.models.llama.LlamaForCausalLM(cfg)
  if ckpt then model:gradient_checkpointing_enable() end
  return model
end
local function batch(s, B, Tn) return T.token_batch(B, Tn, s) end

T.test("C.release_since frees the handles made since a serial, except those kept and zr.persist's", function()
  local a = zr.ones({ 4 })
  local s = C.handle_serial()
  local b, c, d = a + 1, a + 2, zr.persist(a + 3)
  local n = C.release_since(s, c, { x = a })
  T.eq(n, 1, "b only")
  T.raises(function() return b + 1 end, "this tensor was freed")
  T.eq(c:sum():item(), 12); T.eq(d:sum():item(), 16); T.eq(a:sum():item(), 4)
  T.raises(function() return zr.is_tensor(b) end, "this tensor was freed") -- a freed handle is never quietly a non-tensor
end)

T.test("C.collectable_bytes counts what only Lua holds: not what a graph saves, zr.persist's or model states", function()
  collectgarbage(); collectgarbage()
  local base = C.collectable_bytes("cpu")
  local x = zr.randn({ 256 }) -- 1 KiB held by this handle only
  T.eq(C.collectable_bytes("cpu") - base, 1024)
  local p = zr.persist(zr.randn({ 256 }))
  T.eq(C.collectable_bytes("cpu") - base, 1024, "a cache marked zr.persist is not counted")
  local w = zr.nn.Parameter(zr.randn({ 256 }))
  T.eq(C.collectable_bytes("cpu") - base, 1024, "a parameter (category params) is not counted")
  local v = x:view(16, 16) -- two handles on one storage: counted once
  T.eq(C.collectable_bytes("cpu") - base, 1024)
  local y = zr.randn({ 256 }, { requires_grad = true })
  local z = (y * 2):exp() -- exp saves its output for backward: the graph holds it too
  T.eq(C.collectable_bytes("cpu") - base, 2048, "y (a leaf only Lua holds) yes, z (saved by its node) no")
  assert(p and w and v and z)
end)

-- steps(engine, n, free): n training steps of zrun's tiny Llama, each freeing its outputs and batch at
-- its end when free (as the Trainer does); returns the full collections run, the live bytes' growth
-- over the steps, the live bytes, and the first and last losses.
local function steps(ckpt, n, free)
  collectgarbage(); collectgarbage() -- the earlier tests' engines go: the live bytes are this one's
  local engine = zr.initialize({ model = tiny(ckpt), config = { train_micro_batch_size_per_gpu = 1,
    steps_per_print = 1e9, optimizer = { type = "AdamW", params = { lr = 1e-3 } }, zero_optimization = { stage = 2 } } })
  local function step(s)
    local ids = batch(s, 1, 8)
    local out = engine(ids, ids)
    engine:backward(out.loss)
    engine:step()
    local l = out.loss:item()
    if free then zr.models.llama.release_outputs(out); zr.release(ids) end
    return l
  end
  step(0); step(0)
  collectgarbage("stop") -- only what the code frees explicitly may be freed
  local ok, r = pcall(function()
    local c0 = C.tensor_gc_counts()
    local m0 = zr.memory.stats().total_current
    local first, last = step(1), nil
    for s = 2, n do last = step(s) end
    return { C.tensor_gc_counts() - c0, zr.memory.stats().total_current - m0, m0, first, last }
  end)
  collectgarbage("restart")
  assert(ok, r)
  for _, h in ipairs(engine.hook_handles or {}) do h.remove() end
  return unpack(r)
end

T.test("a training loop that frees its outputs (as the Trainer) runs no full collection; memory stays flat", function()
  for _, ckpt in ipairs { false, true } do
    local ran, grown, live, first, last = steps(ckpt, 30, true)
    T.eq(ran, 0, "no full collection (checkpointing " .. tostring(ckpt) .. ")")
    T.eq(grown <= 0, true, ("grew %d bytes of %d"):format(grown, live))
    T.eq(last < first, true, "and it learns: " .. first .. " -> " .. last)
  end
end)

T.test("a loop that leaves its outputs to Lua: a collection once they pass 1/256 of the live bytes", function()
  for _, ckpt in ipairs { false, true } do
    local ran, grown, live = steps(ckpt, 30, false)
    -- each step leaves its hidden states (8 x 64 f32), loss and ids: 2,124 bytes, 1/256 of ~2.7 MB in ~5 steps
    T.eq(ran >= 2 and ran <= 10, true, ran .. " collections in 30 steps")
    T.eq(grown <= live / 256, true, ("grew %d bytes of %d"):format(grown, live))
  end
end)

-- n dataset rows of len ids ({input_ids =, labels = the same ids} with labels)
local function id_rows(n, len, labels)
  local rows = {}
  for i = 1, n do
    local r = {}
    for j = 1, len do r[j] = (i * 7 + j * 3) % 251 end
    rows[i] = { input_ids = r, labels = labels and r or nil }
  end
  return rows
end

T.test("the Trainer frees each micro-batch's tensors: no full collection while it trains or evaluates", function()
  local rows = id_rows(64, 16, true)
  local tmp = os.tmpname(); os.remove(tmp)
  local tr = zr.Trainer { model = tiny(true), train_dataset = zr.datasets.Dataset.from_rows(rows),
    args = { output_dir = tmp, per_device_train_batch_size = 2, gradient_accumulation_steps = 2, max_steps = 12,
      learning_rate = 1e-3, logging_steps = 4, save_strategy = "no" } }
  tr:setup()
  collectgarbage(); collectgarbage() -- (the earlier tests' leftovers)
  local c0 = C.tensor_gc_counts()
  local m = tr:train()
  T.eq(C.tensor_gc_counts() - c0, 0, "no collection in 24 micro-batches (gradient checkpointing on)")
  T.eq(m.train_loss > 0, true)
  tr.token_accuracy = true -- (zr.SFTTrainer's: the evaluation's argmax over the logits too)
  c0 = C.tensor_gc_counts()
  local ev = tr:evaluate(zr.datasets.Dataset.from_rows(rows))
  T.eq(C.tensor_gc_counts() - c0, 0, "no collection in the evaluation's 8 batches")
  T.eq(ev.eval_loss > 0 and ev.eval_mean_token_accuracy >= 0, true)
  os.execute("rm -rf " .. tmp)
end)

T.test("the Trainer frees what its collator made for a batch, not a tensor the collator keeps", function()
  local rows = id_rows(16, 8, false)
  local mask = zr.ones({ 2, 8 }, { dtype = "i64" }) -- kept across batches by the collator
  local function collator(b)
    local ids = {}
    for i, r in ipairs(b) do ids[i] = r.input_ids end
    local t = zr.tensor(ids, { dtype = "i64" })
    return { input_ids = t, labels = t, attention_mask = mask }
  end
  local tmp = os.tmpname(); os.remove(tmp)
  local tr = zr.Trainer { model = tiny(false), train_dataset = zr.datasets.Dataset.from_rows(rows), data_collator = collator,
    args = { output_dir = tmp, per_device_train_batch_size = 2, max_steps = 6, learning_rate = 1e-3, save_strategy = "no",
      logging_steps = 3 } }
  tr:train()
  tr:evaluate(zr.datasets.Dataset.from_rows(rows))
  T.eq(mask:to("f64"):sum():item(), 16, "the collator's own mask is alive after training and evaluating")
  os.execute("rm -rf " .. tmp)
end)

T.test("the Trainer says when full collections take its time (a hook that may keep tensors, a large Lua heap)", function()
  local dir = T.tmpdir()
  local f = assert(io.open(dir .. "/run.lua", "w"))
  f:write([[
local zr = require "zrun"
local heap = {} -- a tokenized dataset's worth of Lua tables
for i = 1, 50000 do local r = {} for j = 1, 300 do r[j] = j end heap[i] = r end
local rows = {}
for i = 1, 32 do local r = {} for j = 1, 8 do r[j] = (i * 7 + j * 3) % 251 end rows[i] = { input_ids = r, labels = r } end
local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
local seen
model.model.layers[1]:register_forward_hook(function(_, out) seen = out end) -- may keep a tensor
local tr = zr.Trainer { model = model, train_dataset = zr.datasets.Dataset.from_rows(rows), args = { output_dir = "]] ..
    dir .. [[/out", per_device_train_batch_size = 2, max_steps = 16, logging_steps = 4, save_strategy = "no" } }
tr:train()
assert(#heap == 50000 and seen)
]])
  f:close()
  local out, rc = T.run((os.getenv("ZRUN_BIN") or "./zrun") .. " " .. dir .. "/run.lua")
  T.eq(rc, 0, out)
  T.eq(select(2, out:gsub("full Lua collections took", "")), 1, "said once: " .. out)
  T.eq(out:find("keeps_tensors = false", 1, true) ~= nil, true)
  os.execute("rm -rf " .. dir)
end)

T.test("with a hook of the user's on a module, a forward keeps its tensors (the collector frees them)", function()
  local model = tiny(false)
  local kept
  local h = model.model.layers[1].mlp:register_forward_hook(function(_, out) kept = out end)
  T.eq(model.model:temporaries_scope(), nil, "no scope while a hook could keep a tensor")
  local out = model(batch(1, 2, 8), batch(1, 2, 8))
  T.eq(kept:size(1), 2, "the hook's tensor is usable after the forward")
  T.eq(out.loss:item() > 0, true)
  h.remove()
  T.eq(model.model:temporaries_scope() ~= nil, true, "the hook gone: the forward frees its tensors again")
  h = model.model.embed_tokens:register_forward_hook(function(_, o) return o * 1 end, { keeps_tensors = false })
  T.eq(model.model:temporaries_scope() ~= nil, true, "a hook that keeps nothing (NEFTune's) leaves the scope on")
  h.remove()
  T.raises(function() model.model:register_forward_hook(function() end, { keep_tensors = false }) end,
    "unknown option 'keep_tensors' (keeps_tensors)")
  out = model(batch(1, 2, 8), batch(1, 2, 8))
  T.eq(out.logits:size(3), model.config.vocab_size, "lazy logits from the kept hidden states")
end)

T.test("the forward's scope keeps the rope cache and what it returns; a second forward reuses the cache", function()
  local model = tiny(false)
  local l1 = model(batch(1, 1, 8), batch(1, 1, 8)).loss:item()
  local cos = model.model.rope_cache["8f32cpu"][1]
  T.eq(cos:size(1), 8, "the cached table is alive after the forward")
  T.near(model(batch(1, 1, 8), batch(1, 1, 8)).loss:item(), l1, 0)
  zr.no_grad(function()
    local o = model(batch(2, 1, 8))
    T.eq(o.logits:size(2), 8, "eval: the logits are returned and kept")
  end)
end)

T.test("Module.end_scope without a scope (nil) frees nothing and returns its arguments", function()
  local a = zr.ones({ 2 })
  local x, y = Module.end_scope(nil, a, 5)
  T.eq(x, a); T.eq(y, 5)
  T.eq(a:sum():item(), 2)
end)

T.done()
