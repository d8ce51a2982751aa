-- Tensor memory that only Lua's collector can free (it does not see tensor bytes): zr.initialize
-- frees the model's parameters as they were before its bf16 cast, and the Trainer's evaluation frees
-- each forward's temporaries, so the first training forward after either runs with what the memory
-- plan counts, not beside dead copies (an out-of-memory error at 32 x 2048 on the H200: RESULTS.md,
-- session 25).
local zr = require "zrun"
local T = zr.testing

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

T.done()
