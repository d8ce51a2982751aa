-- Tensor memory that only Lua's collector can free (it does not see tensor bytes): zr.initialize
-- frees the model's parameters as they were before its bf16 cast, and the Trainer's evaluation frees
-- each forward's temporaries, so the first training forward after either runs with what the memory
-- plan counts, not beside dead copies (an out-of-memory error at 32 x 2048 on the H200: RESULTS.md,
-- session 25). A plain loop's unreached tensors are collected once host tensors pass a soft limit
-- (core/alloc.h; without it the loop grew until the kernel killed the process: RESULTS.md, session 34).
local zr = require "zrun"
local T = zr.testing
local z = os.getenv("ZRUN_BIN") or "./zrun"

local cfg = zr.models.llama.config("zrun/tiny-llama")
local function cur(cat) return zr.memory.stats("cpu")[cat].current end

T.test("zr.initialize in bf16 leaves the bf16 parameters only (the f32 originals freed)", function()
  collectgarbage("collect")
  local base = cur("params")
  local m = zr.models.llama.LlamaForCausalLM(cfg)
  local f32 = cur("params") - base
  T.eq(f32, 4 * m:num_parameters())
  local e = zr.initialize { model = m, config = { train_micro_batch_size_per_gpu = 1, bf16 = { enabled = true },
    optimizer = { type = "AdamW", params = { lr = 1e-3 } }, zero_optimization = { stage = 2 } } }
  T.eq(cur("params") - base, 2 * m:num_parameters(), "params after initialize: the bf16 copy alone")
  assert(e)
end)

T.test("Trainer:evaluate frees its forwards' temporaries", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  local ds = T.sample_rows(tok):group_texts(32)
  zr.manual_seed(1)
  local t = zr.Trainer { model = zr.models.llama.LlamaForCausalLM(cfg), eval_dataset = ds, processing_class = tok,
    args = { output_dir = T.tmpdir(), per_device_eval_batch_size = 8 } }
  t:setup()
  collectgarbage("collect")
  local before = cur("activations")
  collectgarbage("stop") -- only the evaluation's own collections may free anything
  local ok, err = pcall(t.evaluate, t)
  local after = cur("activations")
  collectgarbage("restart")
  assert(ok, err)
  assert(after - before < 64 * 1024, ("activations left by the evaluation: %d bytes"):format(after - before))
end)

-- A child zrun runs body n times with x, a leaf of mb MiB, keeping nothing, Lua's own collector
-- stopped; it prints the host's tensor peak above the start (MiB) and the allocator's collections.
local function loop(env, n, mb, body)
  local out = T.run(env .. " " .. z .. [[ -e 'local zr = require "zrun"
    local x = zr.randn(]] .. mb .. [[ * 262144):requires_grad_(true); collectgarbage("collect")
    local s0 = zr.memory.stats("cpu"); collectgarbage("stop")
    for i = 1, ]] .. n .. " do " .. body .. [[ end
    local s1 = zr.memory.stats("cpu")
    print("peak", (s1.total_peak - s0.total_current) / 2^20, "collections", s1.collections - s0.collections)']])
  local peak, runs = out:match("peak%s+([%d.]+)%s+collections%s+(%d+)")
  assert(peak, "no figures from the child: " .. out)
  return tonumber(peak), tonumber(runs)
end

T.test("a plain loop's unreached host tensors are collected past the soft limit", function()
  local fresh = "local t = zr.empty(x:numel())"
  local peak, runs = loop("ZRUN_COLLECT_FLOOR_MB=16", 100, 4, fresh) -- 400 MiB made, 4 at a time live
  assert(peak <= 24, ("peak %.1f MiB with a 16 MiB floor"):format(peak))
  assert(runs >= 15, "collections: " .. runs)
  -- forward and backward, the gradient set aside each time (gradients are collected too)
  peak, runs = loop("ZRUN_COLLECT_FLOOR_MB=16", 50, 4, "x.grad = nil; (x * x):sum():backward()")
  assert(peak <= 32, ("peak %.1f MiB of a forward and backward loop"):format(peak))
  assert(runs >= 5, "collections: " .. runs)
  peak, runs = loop("", 24, 32, fresh) -- the default floor, 256 MiB: 768 MiB made
  assert(peak <= 256 + 64, ("peak %.1f MiB with the default floor"):format(peak))
  assert(runs >= 2, "collections: " .. runs)
end)

T.test("ZRUN_COLLECT_FLOOR_MB takes a positive whole number only", function()
  for _, v in ipairs { "0", "-4", "1.5", "lots" } do
    local out, rc = T.run("ZRUN_COLLECT_FLOOR_MB=" .. v .. " " .. z .. " -e 'print(1)'")
    assert(out:find("ZRUN_COLLECT_FLOOR_MB=" .. v .. ": use a positive whole number", 1, true), out)
    T.eq(rc, 1, "exit status")
  end
end)

T.test("freed host blocks of 32 MiB or more are kept for their size: host_kept, and zeros where asked", function()
  local MiB = 1024 * 1024
  local x = zr.full({ 10 * MiB }, 7) -- 40 MiB
  local before = zr.memory.stats().host_kept
  zr.release(x)
  T.eq(zr.memory.stats().host_kept, before + 40 * MiB, "kept after the release")
  local y = zr.zeros({ 10 * MiB })
  T.eq(zr.memory.stats().host_kept, before, "handed to the next request of its size")
  T.eq(y:abs():max():item(), 0, "a kept block handed out as zeros")
  zr.release(y)
end)

T.done()
