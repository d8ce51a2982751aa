-- zr.qkv_rope_sdpa on CUDA: vs the CPU (output and the packed gradient; leaf and through a
-- product; real rope tables and arbitrary ones, which tell the pairs' two cos/sin entries apart),
-- MHA and GQA (H 8 / KV 2), T = 1, 57, 200, B 1 and 3, shapes whose backward splits each kv
-- head's query group (dk, dv from f32 partials) and shapes that do not (dk turned in place),
-- head_dim 128 and f32 (the composition); against today's unfused qkv_rope + sdpa on the GPU
-- (Llama-1B heads; one unsplit GQA shape); on Hopper one node that keeps what qkv_rope + sdpa
-- keep (q, k, v in qkv_rope's buffer, the output, lse); a Llama model on the GPU vs the CPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("qkv_rope_sdpa") then return end
local zr, T, randn, both, close, unpack = C.zr, C.T, C.randn, C.both, C.close, C.unpack
local hopper = C.hopper()

-- B, T, H, KV, D. On Hopper (attn_sm90_bwd_nsplit: split while B·KV·ceil(T/128) < 200 and the
-- group allows): 1,57,8,2 and 3,200,8,2 split 4 ways, MHA never splits.
local SHAPES = {
  { 1, 57, 8, 2, 64 }, { 3, 200, 8, 2, 64 }, { 3, 57, 8, 8, 64 }, { 1, 200, 4, 4, 64 }, { 1, 1, 2, 1, 64 },
  { 3, 130, 6, 2, 64 }, { 2, 37, 4, 1, 128 },
}

T.test("qkv_rope_sdpa: CUDA vs CPU, leaf and through a product, bf16/f16, real and arbitrary tables", function()
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs(SHAPES) do
      local B, Tn, H, KV, D = unpack(s)
      local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32" })
      local tables = { { "rope", cos, sin }, { "arbitrary", randn({ Tn, D }) * 0.7, randn({ Tn, D }) * 0.7 } }
      for _, tb in ipairs(tables) do
        local what = ("qkv_rope_sdpa %s %s %s tables"):format(table.concat(s, ","), dt, tb[1])
        local W = (H + 2 * KV) * D
        both(what .. " leaf", dt, { randn({ B, Tn, W }), tb[2], tb[3] },
          function(x, c, sn) return zr.qkv_rope_sdpa(x, H, KV, c, sn) end, 2, { false, true, true })
        both(what .. " product", dt, { randn({ B, Tn, W }), tb[2], tb[3] },
          function(x, c, sn) return zr.qkv_rope_sdpa(x * 1, H, KV, c, sn) end, 2, { false, true, true })
      end
    end
  end
  for _, s in ipairs { { 1, 1, 1, 1, 16 }, { 2, 7, 4, 2, 16 }, { 1, 33, 2, 2, 64 } } do
    local B, Tn, H, KV, D = unpack(s)
    local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32" })
    both("qkv_rope_sdpa f32 " .. table.concat(s, ","), "f32", { randn({ B, Tn, (H + 2 * KV) * D }), cos, sin },
      function(x, c, sn) return zr.qkv_rope_sdpa(x * 1, H, KV, c, sn) end, 2, { false, true, true })
  end
end)

T.test("qkv_rope_sdpa equals qkv_rope + sdpa on the GPU (bf16; Llama-1B heads, an unsplit GQA shape, MHA)", function()
  -- 3,1100,16,8: B·KV·ceil(T/128) = 216 >= 200, so GQA with the kernel writing dk itself
  for _, s in ipairs { { 2, 67, 32, 8, 64 }, { 3, 1100, 16, 8, 64 }, { 4, 257, 8, 8, 64 }, { 1, 200, 8, 2, 64 } } do
    local B, Tn, H, KV, D = unpack(s)
    local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32" })
    cos, sin = cos:cuda(), sin:cuda()
    local x0 = randn({ B, Tn, (H + 2 * KV) * D }, "bf16"):cuda()
    local wo = randn({ B, Tn, H * D }):cuda()
    local o1, g1 = C.out_and_grad(x0, wo, function(y)
      return zr.scaled_dot_product_attention(zr.qkv_rope(y, H, KV, cos, sin)):transpose(2, 3):reshape(B, Tn, H * D)
    end)
    local o2, g2 = C.out_and_grad(x0, wo, function(y)
      local o = zr.qkv_rope_sdpa(y, H, KV, cos, sin)
      if hopper then T.eq(o.grad_fn, "qkv_rope_sdpa", "the fused node runs on Hopper") end
      return o
    end)
    local what = "fused vs qkv_rope + sdpa " .. table.concat(s, ",")
    -- the same kernels forward: the same bits
    T.eq((o2:float() - o1:float()):abs():max():item(), 0, what .. " forward (bitwise)")
    C.close_big(g2, g1, "bf16", what .. " dqkv", 1e-3)
  end
end)

T.test("qkv_rope_sdpa on Hopper: one node over qkv, keeping what qkv_rope + sdpa keep (q, k, v, o, lse)", function()
  if not hopper then print("SKIP not a Hopper GPU"); return end
  local B, Tn, H, KV, D = 4, 257, 8, 2, 64
  local W = (H + 2 * KV) * D
  local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32" })
  cos, sin = cos:cuda(), sin:cuda()
  local x = randn({ B, Tn, W }, "bf16"):cuda(); x.requires_grad = true
  local y = x * 1
  local function growth(f) -- exact bytes: nothing else may be freed meanwhile
    collectgarbage(); collectgarbage()
    zr.cuda.synchronize()
    local before = zr.memory_stats("cuda:0").activations.current
    local o = f()
    local grown = zr.memory_stats("cuda:0").activations.current - before
    return o, grown
  end
  local o, fused = growth(function() return zr.qkv_rope_sdpa(y, H, KV, cos, sin) end)
  T.eq(o.grad_fn, "qkv_rope_sdpa")
  local o2, today = growth(function()
    return zr.scaled_dot_product_attention(zr.qkv_rope(y, H, KV, cos, sin)):transpose(2, 3):reshape(B, Tn, H * D)
  end)
  T.eq(fused, today, "the fused node keeps exactly what qkv_rope + sdpa keep")
  local want = B * Tn * W * 2 + B * Tn * H * D * 2 + B * H * Tn * 4 -- rotated q/k/v, output (bf16), lse (f32)
  T.eq(fused, want, "q, k, v (one buffer), the output and lse")
  o, o2 = nil, nil
end)

T.test("Llama with head_dim 64 on CUDA bf16 (qkv_rope_sdpa) vs the CPU in f32: logits and every gradient", function()
  local cfg = { model_type = "llama", vocab_size = 64, hidden_size = 128, intermediate_size = 192,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 64,
    max_position_embeddings = 256, rms_norm_eps = 1e-5, rope_theta = 10000, dtype = "f32" }
  local calls, orig = 0, zr.qkv_rope_sdpa
  zr.qkv_rope_sdpa = function(...) calls = calls + 1; return orig(...) end
  local ok, err = pcall(function()
    zr.manual_seed(5)
    C.model_cpu_vs_gpu(zr.models.llama.LlamaForCausalLM, cfg, (zr.rand({ 2, 70 }) * 63):to("i64"))
  end)
  zr.qkv_rope_sdpa = orig
  assert(ok, err)
  T.eq(calls, 4, "the fused op ran in every layer, on the CPU and on the GPU")
end)

-- Training through the node in the precision users run: bf16 weights (fp32 master), ZeRO 0 and 2
-- (stage 3's hooked projections take llama.lua's unfused path), 10 steps on one batch.
local function train(dev, stage)
  local cfg = { model_type = "llama", vocab_size = 64, hidden_size = 128, intermediate_size = 192,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, head_dim = 64,
    max_position_embeddings = 256, rms_norm_eps = 1e-5, rope_theta = 10000, device = dev,
    dtype = dev == "cuda" and "bf16" or "f32" }
  zr.manual_seed(7)
  local config = { train_micro_batch_size_per_gpu = 4, gradient_clipping = 1.0, steps_per_print = 1000000,
    optimizer = { type = "AdamW", params = { lr = 3e-3, weight_decay = 0.0 } }, zero_optimization = { stage = stage } }
  if dev == "cuda" then config.bf16 = { enabled = true } end
  local engine = zr.initialize({ model = zr.models.llama.LlamaForCausalLM(cfg), config = config })
  zr.manual_seed(9)
  local ids = (zr.rand({ 4, 96 }) * 63):to("i64"):to(dev)
  local losses, norms = {}, {}
  for i = 1, 10 do
    local out = engine(ids, ids)
    engine:backward(out.loss)
    engine:step()
    losses[i], norms[i] = out.loss:float():item(), engine.last_grad_norm
  end
  return losses, norms
end

T.test("a bf16 Llama (head_dim 64) learns through qkv_rope_sdpa at ZeRO 0 and 2, near the CPU's f32 curve", function()
  local calls, fused, orig = 0, 0, zr.qkv_rope_sdpa
  zr.qkv_rope_sdpa = function(...)
    local o = orig(...)
    calls = calls + 1
    if o.grad_fn == "qkv_rope_sdpa" then fused = fused + 1 end
    return o
  end
  local ok, err = pcall(function()
    for _, stage in ipairs { 0, 2 } do
      local l32 = train("cpu", stage)
      calls, fused = 0, 0
      local l16, n16 = train("cuda", stage)
      T.eq(calls, 20, "stage " .. stage .. ": the op ran in both layers at every step")
      if hopper then T.eq(fused, 20, "stage " .. stage .. ": as the one node on Hopper") end
      for i = 1, #l16 do
        assert(l16[i] == l16[i] and n16[i] > 0, ("stage %d step %d: loss %g, gradient norm %g"):format(stage, i,
          l16[i], n16[i]))
      end
      assert(l16[#l16] < l16[1] - 0.5, ("stage %d: loss did not fall: %g -> %g"):format(stage, l16[1], l16[#l16]))
      T.near(l16, l32, 5e-2, 5e-2, "stage " .. stage .. ": bf16 losses on the GPU vs f32 on the CPU")
    end
  end)
  zr.qkv_rope_sdpa = orig
  assert(ok, err)
end)

T.done()
