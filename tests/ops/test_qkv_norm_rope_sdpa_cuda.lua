-- zr.qkv_norm_rope_sdpa on CUDA (Qwen3's q/k norms + rope + attention): vs the CPU (output and the
-- gradients of qkv and both norms' weights; leaf and through a product; real and arbitrary rope
-- tables; packed-sequence segments), MHA and GQA, head_dim 64 and 128, bf16 and f16, f32, head_dim 16
-- (the composition); zr.qkv_norm_rope's q, k, v each (one alone: the others' columns zero; one used
-- twice), its one buffer; against the unfused ops on the GPU; a Qwen3 model on the GPU vs the CPU;
-- training in bf16 learns, through the fused kernels and without them alike.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("qkv_norm_rope_sdpa") then return end
local zr, T, randn, both, unpack = C.zr, C.T, C.randn, C.both, C.unpack

-- B, T, H, KV, D
local SHAPES = { { 1, 57, 8, 2, 64 }, { 3, 200, 8, 2, 64 }, { 2, 130, 4, 4, 128 }, { 1, 1, 2, 1, 128 },
  { 2, 37, 16, 8, 128 } }

local function weights(D) return randn({ D }) * 0.3 + 1, randn({ D }) * 0.3 + 1 end

T.test("qkv_norm_rope_sdpa: CUDA vs CPU, leaf and through a product, bf16/f16, real and arbitrary tables", function()
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs(SHAPES) do
      local B, Tn, H, KV, D = unpack(s)
      local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32", theta = 1e6 })
      local wq, wk = weights(D)
      local W = (H + 2 * KV) * D
      for _, tb in ipairs { { "rope", cos, sin }, { "arbitrary", randn({ Tn, D }) * 0.7, randn({ Tn, D }) * 0.7 } } do
        local what = ("qkv_norm_rope_sdpa %s %s %s tables"):format(table.concat(s, ","), dt, tb[1])
        -- (T = 1: the one key's softmax is 1, so q's gradient and q_norm's are 0 up to rounding: judged against
        -- a floor of 0.01, as close's floor says)
        local floor = Tn == 1 and 1e-2 or nil
        both(what .. " leaf", dt, { randn({ B, Tn, W }) * 3, wq, wk, tb[2], tb[3] },
          function(x, a, b, c, sn) return zr.qkv_norm_rope_sdpa(x, H, KV, a, b, 1e-6, c, sn) end, 2,
          { false, false, false, true, true }, floor)
        both(what .. " product", dt, { randn({ B, Tn, W }), wq, wk, tb[2], tb[3] },
          function(x, a, b, c, sn) return zr.qkv_norm_rope_sdpa(x * 1, H, KV, a, b, 1e-6, c, sn) end, 2,
          { false, false, false, true, true }, floor)
      end
    end
  end
  local B, Tn, H, KV, D = 2, 7, 4, 2, 16 -- f32 and head_dim 16: the composition on the GPU
  local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32" })
  local wq, wk = weights(D)
  both("qkv_norm_rope_sdpa f32 composition", "f32", { randn({ B, Tn, (H + 2 * KV) * D }), wq, wk, cos, sin },
    function(x, a, b, c, sn) return zr.qkv_norm_rope_sdpa(x * 1, H, KV, a, b, 1e-6, c, sn) end, 2,
    { false, false, false, true, true })
end)

T.test("qkv_norm_rope_sdpa with packed sequences (segments): CUDA vs CPU", function()
  for _, s in ipairs { { 1, 300, 8, 2, 64 }, { 1, 260, 4, 2, 128 } } do
    local _, Tn, H, KV, D = unpack(s)
    -- three sequences in the row, each token's own rope row (positions restart at each)
    local pos, starts = {}, { 0, 90, 200 }
    for t = 0, Tn - 1 do
      local p0 = 0
      for _, st in ipairs(starts) do if t >= st then p0 = st end end
      pos[t + 1] = t - p0
    end
    local ids = zr.tensor(pos, { dtype = "i64" }):view(1, Tn)
    local segs = zr.models.packed.segments(ids, 1, Tn, "cpu", true)
    local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32" })
    cos, sin = zr.embedding(ids:view(Tn), cos), zr.embedding(ids:view(Tn), sin)
    local wq, wk = weights(D)
    both("qkv_norm_rope_sdpa segments " .. table.concat(s, ","), "bf16",
      { randn({ 1, Tn, (H + 2 * KV) * D }), wq, wk, cos, sin, segs.seg },
      function(x, a, b, c, sn, sg) return zr.qkv_norm_rope_sdpa(x * 1, H, KV, a, b, 1e-6, c, sn, { segments = sg }) end,
      2, { false, false, false, true, true, true })
  end
end)

T.test("qkv_norm_rope_sdpa vs the unfused ops on the GPU (bf16, Qwen3-0.6B's heads)", function()
  local B, Tn, H, KV, D = 2, 300, 16, 8, 128
  local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32", theta = 1e6 })
  cos, sin = cos:cuda(), sin:cuda()
  local x0, wo = randn({ B, Tn, (H + 2 * KV) * D }, "bf16"):cuda(), randn({ B, Tn, H * D }):cuda()
  local a0, b0 = weights(D)
  local function run(fused)
    local a, b = a0:to("bf16"):cuda():detach(), b0:to("bf16"):cuda():detach()
    a.requires_grad, b.requires_grad = true, true
    local o, g = C.out_and_grad(x0, wo, function(y)
      if fused then
        return zr.qkv_norm_rope_sdpa(y, H, KV, a, b, 1e-6, cos, sin)
      end
      local q, k, v = unpack(zr.split(y, { H * D, KV * D, KV * D }, 3))
      q = zr.rope(zr.rms_norm(q:view(B, Tn, H, D), a, 1e-6):transpose(2, 3), cos, sin)
      k = zr.rope(zr.rms_norm(k:view(B, Tn, KV, D), b, 1e-6):transpose(2, 3), cos, sin)
      v = v:view(B, Tn, KV, D):transpose(2, 3)
      return zr.scaled_dot_product_attention(q, k, v):transpose(2, 3):reshape(B, Tn, H * D)
    end)
    return o, g, a.grad:cpu(), b.grad:cpu()
  end
  local got, want = { run(true) }, { run(false) }
  for i, name in ipairs { "output", "dqkv", "d q_norm", "d k_norm" } do
    C.close_big(got[i], want[i], "bf16", "fused vs unfused " .. name, 1e-3)
  end
end)

T.test("qkv_norm_rope: CUDA vs CPU for q, k and v (leaf and product), q alone (k's, v's columns zero)", function()
  for _, s in ipairs { { 2, 67, 8, 2, 64 }, { 1, 40, 4, 4, 128 } } do
    local B, Tn, H, KV, D = unpack(s)
    local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32", theta = 1e6 })
    local wq, wk = weights(D)
    local W = (H + 2 * KV) * D
    local function all(q, k, v) return zr.cat({ q:reshape(B * H * Tn * D), k:reshape(B * KV * Tn * D), v:reshape(B * KV * Tn * D) }, 1) end
    for _, dt in ipairs { "bf16", "f32" } do
      local what = ("qkv_norm_rope %s %s"):format(table.concat(s, ","), dt)
      both(what .. " leaf", dt, { randn({ B, Tn, W }), wq, wk, cos, sin },
        function(x, a, b, c, sn) return all(zr.qkv_norm_rope(x, H, KV, a, b, 1e-6, c, sn)) end, 2,
        { false, false, false, true, true })
      both(what .. " product", dt, { randn({ B, Tn, W }), wq, wk, cos, sin },
        function(x, a, b, c, sn) return all(zr.qkv_norm_rope(x * 1, H, KV, a, b, 1e-6, c, sn)) end, 2,
        { false, false, false, true, true })
      both(what .. " q alone", dt, { randn({ B, Tn, W }), wq, wk, cos, sin },
        function(x, a, b, c, sn) return (zr.qkv_norm_rope(x * 1, H, KV, a, b, 1e-6, c, sn)) * 1 end, 2,
        { false, false, true, true, true })
      both(what .. " q twice", dt, { randn({ B, Tn, W }), wq, wk, cos, sin },
        function(x, a, b, c, sn)
          local q, k = zr.qkv_norm_rope(x * 1, H, KV, a, b, 1e-6, c, sn)
          return zr.cat({ q:reshape(B * H * Tn * D), (q * 2):reshape(B * H * Tn * D), k:reshape(B * KV * Tn * D) }, 1)
        end, 2, { false, false, false, true, true })
    end
  end
end)

T.test("qkv_norm_rope on CUDA: one buffer of qkv_rope's size, the fused nodes", function()
  local B, Tn, H, KV, D = 2, 257, 8, 4, 128
  local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32" })
  cos, sin = cos:cuda(), sin:cuda()
  local x = randn({ B, Tn, (H + 2 * KV) * D }, "bf16"):cuda(); x.requires_grad = true
  local a, b = zr.ones({ D }, { dtype = "bf16" }):cuda(), zr.ones({ D }, { dtype = "bf16" }):cuda()
  a.requires_grad, b.requires_grad = true, true
  local y = x * 1
  local function growth(f)
    collectgarbage(); collectgarbage()
    zr.cuda.synchronize()
    local before = zr.memory_stats("cuda:0").activations.current
    local o = { f() }
    return o, zr.memory_stats("cuda:0").activations.current - before
  end
  local o, fused = growth(function() return zr.qkv_norm_rope(y, H, KV, a, b, 1e-6, cos, sin) end)
  local _, plain = growth(function() return zr.qkv_rope(y, H, KV, cos, sin) end)
  T.eq(o[1].grad_fn, "qkv_norm_rope")
  T.eq(fused, plain, "q, k, v in one buffer, as qkv_rope's")
  T.eq(fused, B * Tn * (H + 2 * KV) * D * 2, "the buffer's bytes")
end)

local QWEN3 = { model_type = "qwen3", vocab_size = 64, hidden_size = 128, intermediate_size = 192,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 64,
  max_position_embeddings = 256, rms_norm_eps = 1e-6, rope_theta = 1e6, dtype = "f32" }

T.test("Qwen3 on CUDA bf16 (qkv_norm_rope_sdpa) vs the CPU in f32: logits and every gradient", function()
  local calls, orig = 0, zr.qkv_norm_rope_sdpa
  zr.qkv_norm_rope_sdpa = function(...) calls = calls + 1; return orig(...) end
  local ok, err = pcall(function()
    zr.manual_seed(5)
    C.model_cpu_vs_gpu(zr.models.qwen3.Qwen3ForCausalLM, QWEN3, (zr.rand({ 2, 70 }) * 63):to("i64"))
  end)
  zr.qkv_norm_rope_sdpa = orig
  assert(ok, err)
  T.eq(calls, 2, "the fused op ran in every layer on the GPU (the CPU runs the norms as modules)")
end)

-- 12 steps of AdamW on one batch, bf16 weights (fp32 master), ZeRO stage `stage` on the GPU (3: the
-- norms' weights gathered around the fused op by Module.call_group): the fused op or (fused = false)
-- the norms as modules.
local function train(fused, stage)
  local orig = zr.qkv_norm_rope_fused
  if not fused then zr.qkv_norm_rope_fused = function() return false end end
  local ok, res = pcall(function()
    local cfg = {}
    for k, v in pairs(QWEN3) do cfg[k] = v end
    cfg.dtype, cfg.device = "bf16", "cuda"
    zr.manual_seed(7)
    local engine = zr.initialize({ model = zr.models.qwen3.Qwen3ForCausalLM(cfg), config = {
      train_micro_batch_size_per_gpu = 4, gradient_clipping = 1.0, steps_per_print = 1000000, bf16 = { enabled = true },
      optimizer = { type = "AdamW", params = { lr = 3e-3, weight_decay = 0.0 } }, zero_optimization = { stage = stage } } })
    zr.manual_seed(8)
    local ids = (zr.rand({ 4, 96 }) * 63):to("i64"):cuda()
    local losses, norms = {}, {}
    for i = 1, 12 do
      local out = engine(ids, ids)
      engine:backward(out.loss)
      engine:step()
      losses[i], norms[i] = out.loss:float():item(), engine.last_grad_norm
    end
    return { losses, norms }
  end)
  zr.qkv_norm_rope_fused = orig
  assert(ok, res)
  return res[1], res[2]
end

T.test("Qwen3 trains in bf16 through the fused op as through the unfused ops, ZeRO 2 and 3 (loss falls by 40%)", function()
  for _, stage in ipairs { 2, 3 } do
    local lf, nf = train(true, stage)
    local lu = train(false, stage)
    assert(lf[12] < 0.6 * lf[1], ("stage %d fused: loss %.4f -> %.4f"):format(stage, lf[1], lf[12]))
    assert(nf[1] > 0 and nf[12] > 0, "fused: gradient norm zero")
    for i = 1, 12 do
      assert(math.abs(lf[i] - lu[i]) <= 0.02 * lu[i], ("stage %d step %d: fused %.4f vs unfused %.4f"):format(stage, i,
        lf[i], lu[i]))
    end
  end
end)

T.done()
