-- Padded batches run without their padding on a GPU (tests/lua/test_unpad.lua's checks in bf16 at head_dim 64,
-- where the Hopper attention kernels take the segments): the unpadded batch's loss and gradients against the
-- padded batch's, per model, and the Trainer's curve against the padded run's, learning. Prints SKIP without a
-- GPU, and where the attention does not take the segments (not sm_90).
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../ops/cuda_common.lua")
if C.skip_without_gpu("padded batches unpadded on CUDA") then return end
local zr, T = C.zr, C.T
local packed = require "zrun.models.packed"
if not zr.sdpa_segments_ok("cuda", "bf16", 64) then
  print("SKIP padded batches unpadded on CUDA: this GPU's attention does not take the segments")
  return
end

local function i64(rows) return zr.tensor(rows, { dtype = "i64" }) end
local function llama(tied)
  local cfg = {}
  for k, v in pairs(zr.models.llama.config("zrun/tiny-llama")) do cfg[k] = v end
  cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 128, 2, 1, 64
  cfg.num_hidden_layers, cfg.tie_word_embeddings, cfg.dtype, cfg.device = 2, tied, "bf16", "cuda"
  zr.manual_seed(3)
  return zr.models.llama.LlamaForCausalLM(cfg)
end
local function gpt2()
  zr.manual_seed(3)
  return zr.models.gpt2.GPT2LMHeadModel { n_embd = 128, n_layer = 2, n_head = 2, vocab_size = 64, n_positions = 64,
    attn_pdrop = 0, resid_pdrop = 0, embd_pdrop = 0, dtype = "bf16", device = "cuda" }
end

-- 3 rows of 40, 23 and 9 tokens padded to 40 (labels -100 there), below V.
local LM = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../lua/loss_models_common.lua")
local function padded(V)
  zr.manual_seed(11)
  local ids = (zr.rand({ 3, 40 }) * (V - 1)):to("i64")
  return LM.padded(ids, ids:clone(), { 40, 23, 9 })
end

local function grads(m)
  local g = {}
  for n, p in m:named_parameters() do g[n] = p.grad:to("cpu", "f64"); p.grad = nil end
  return g
end

T.test("bf16, head_dim 64: the unpadded batch's loss and gradients are the padded batch's (Llama, tied, GPT-2)", function()
  for _, c in ipairs { { "llama", function() return llama(false) end }, { "llama tied", function() return llama(true) end },
    { "gpt2", gpt2 } } do
    local name, m = c[1], c[2]()
    assert(m:packs_flat(), name .. ": packed sequences run as one row on this GPU")
    local b = padded(m.config.vocab_size)
    local ref = m(b.input_ids:to("cuda"), b.labels:to("cuda"))
    ref.loss:backward()
    local g0 = grads(m)
    local fb = packed.unpad(b)
    T.eq(fb.input_ids:size(2), 72, name .. ": the 72 tokens of the 3 rows")
    local out = m(fb.input_ids:to("cuda"), fb.labels:to("cuda"), { position_ids = fb.position_ids })
    out.loss:backward()
    local g1 = grads(m)
    T.near(out.loss:item(), ref.loss:item(), 0, 5e-3, name .. ": loss")
    for n, g in pairs(g0) do
      local scale = g:abs():max():item()
      local d = T.diff(g1[n], g)
      assert(d <= 0.03 * scale + 1e-6, ("%s: gradient of %s differs by %g (scale %g)"):format(name, n, d, scale))
    end
  end
end)

T.test("bf16 Trainer on a GPU: padded batches unpadded train the padded run's curve, and learn", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  local rows = T.varied_rows(tok, 32, function(i) return 5 + (i * 37) % 56 end)
  local function run(unpad, extra)
    local m = llama(false)
    local ones = T.count_one_row_forwards(m)
    local t
    T.printed(function()
      t = zr.Trainer { model = m, train_dataset = rows, processing_class = { pad_id = function() return 0 end },
        args = { output_dir = T.tmpdir(), save_strategy = "no", logging_steps = 1, report_to = "none", bf16 = true,
          per_device_train_batch_size = 4, gradient_accumulation_steps = 2, learning_rate = 3e-3, max_steps = 12,
          use_liger_kernel = extra } }
      t.unpad_batches = unpad
      t:train()
    end)
    local loss, norm = {}, {}
    for _, r in ipairs(t.state.log_history) do if r.loss then loss[#loss + 1], norm[#norm + 1] = r.loss, r.grad_norm end end
    return loss, norm, ones()
  end
  local l0, n0, o0 = run(false)
  local l1, n1, o1 = run(nil)
  T.eq(o0, 0, "unpad_batches = false: padded batches")
  T.eq(o1, 24, "every micro-batch unpadded")
  -- curve b against curve a (losses within 1%, gradient norms within 5% and not 0)
  local function same_curve(la, na, lb, nb, what)
    for k = 1, #la do
      assert(math.abs(lb[k] - la[k]) <= 0.01 * la[k], ("step %d loss: %s %.4f vs %.4f"):format(k, what, lb[k], la[k]))
      assert(nb[k] > 0 and math.abs(nb[k] - na[k]) <= 0.05 * na[k],
        ("step %d grad_norm: %s %.4f vs %.4f"):format(k, what, nb[k], na[k]))
    end
  end
  same_curve(l0, n0, l1, n1, "unpadded vs padded")
  assert(l1[12] < 0.8 * l1[1], ("the loss falls by 20%%: %.4f -> %.4f"):format(l1[1], l1[12]))
  -- Liger's fused linear cross-entropy (the chunked head, its labels read on the host, the logits kept): the same curve
  local l2, n2, o2 = run(nil, true)
  T.eq(o2, 24, "use_liger_kernel: every micro-batch unpadded")
  same_curve(l1, n1, l2, n2, "chunked vs plain")
end)

T.done()
