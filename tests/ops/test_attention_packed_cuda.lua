-- zr.sdpa_packed on CUDA vs the CPU (output and the packed dqkv): bf16/f16 head_dim 64 (on Hopper
-- the strided kernels read q/k/v in place and write one (B, T, W) gradient), head_dim 128 and f32
-- (split + sdpa), GQA, T = 1 and primes, GPT-2's 12 heads over many tiles; the GPU's packed op
-- against the GPU's narrow + sdpa composition; on Hopper, nothing saved but the output and lse.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("sdpa_packed") then return end
local zr, T, randn, both, close, unpack = C.zr, C.T, C.randn, C.both, C.close, C.unpack

local SHAPES = { -- B, T, Hq, Hkv, D
  { 1, 1, 2, 2, 64 }, { 2, 67, 4, 4, 64 }, { 1, 130, 4, 2, 64 }, { 4, 257, 12, 12, 64 }, { 2, 37, 2, 2, 128 },
  { 1, 200, 4, 1, 128 },
}

T.test("sdpa_packed: CUDA vs CPU, as a leaf and through a product, bf16/f16 (Dh 64 and 128), GQA", function()
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs(SHAPES) do
      local B, Tn, Hq, Hkv, D = unpack(s)
      local what = ("sdpa_packed %s %s"):format(table.concat(s, ","), dt)
      both(what .. " leaf", dt, { randn({ B, Tn, (Hq + 2 * Hkv) * D }) },
        function(x) return zr.sdpa_packed(x, Hq, Hkv) end, 2)
      -- x * 1: a product's output (c_attn's), its gradient handed through the node
      both(what .. " product", dt, { randn({ B, Tn, (Hq + 2 * Hkv) * D }) },
        function(x) return zr.sdpa_packed(x * 1, Hq, Hkv) end, 2)
    end
  end
  for _, s in ipairs { { 1, 1, 1, 1, 16 }, { 2, 7, 4, 2, 16 }, { 1, 33, 2, 2, 64 } } do
    local B, Tn, Hq, Hkv, D = unpack(s)
    both("sdpa_packed f32 " .. table.concat(s, ","), "f32", { randn({ B, Tn, (Hq + 2 * Hkv) * D }) },
      function(x) return zr.sdpa_packed(x * 1, Hq, Hkv) end, 2)
  end
end)

T.test("sdpa_packed equals narrow + view + transpose + sdpa on the GPU (bf16, GPT-2 heads)", function()
  for _, s in ipairs { { 4, 257, 12, 12, 64 }, { 2, 130, 8, 2, 64 }, { 2, 67, 4, 4, 128 } } do
    local B, Tn, Hq, Hkv, D = unpack(s)
    local x0 = randn({ B, Tn, (Hq + 2 * Hkv) * D }, "bf16"):cuda()
    local wo = randn({ B, Tn, Hq * D }):cuda()
    local o1, g1 = C.out_and_grad(x0, wo, function(y) return zr.sdpa_packed(y, Hq, Hkv) end)
    local o2, g2 = C.out_and_grad(x0, wo, function(y)
      local function heads(c0, H) return y:narrow(3, c0 * D + 1, H * D):view(B, Tn, H, D):transpose(2, 3) end
      return zr.scaled_dot_product_attention(heads(0, Hq), heads(Hq, Hkv), heads(Hq + Hkv, Hkv))
        :transpose(2, 3):reshape(B, Tn, Hq * D)
    end)
    local what = "packed vs composed " .. table.concat(s, ",")
    close(o1, o2, "bf16", what .. " forward", 1)
    close(g1, g2, "bf16", what .. " dqkv", 2, 1e-3)
  end
end)

T.test("GPT-2 with head_dim 64 (the packed path) on CUDA bf16 vs the CPU in f32: logits and every gradient", function()
  local cfg = { vocab_size = 64, n_positions = 128, n_embd = 128, n_layer = 2, n_head = 2, dtype = "f32" }
  zr.manual_seed(5)
  C.model_cpu_vs_gpu(zr.models.gpt2.GPT2LMHeadModel, cfg, (zr.rand({ 2, 70 }) * 63):to("i64"))
end)

-- GPT-2's scale_attn_weights false / scale_attn_by_inverse_layer_idx hand the kernels a scale other
-- than 1/sqrt(Dh): the packed op with it on CUDA against the CPU, plain and over segments
T.test("sdpa_packed with a given scale: CUDA vs CPU (bf16, Dh 64; segments too)", function()
  for _, sc in ipairs { 1.0, 0.0625, 0.02 } do
    for _, s in ipairs { { 2, 67, 4, 4, 64 }, { 1, 130, 4, 2, 64 } } do
      local B, Tn, Hq, Hkv, D = unpack(s)
      both(("sdpa_packed scale %g %s"):format(sc, table.concat(s, ",")), "bf16", { randn({ B, Tn, (Hq + 2 * Hkv) * D }) },
        function(x) return zr.sdpa_packed(x * 1, Hq, Hkv, sc) end, 2)
    end
    local flat = {} -- (2, 1, 32) i32: each token's segment start and end, lengths 5, 8, 19
    for t = 0, 31 do
      local a, b = t < 5 and 0 or t < 13 and 5 or 13, t < 5 and 5 or t < 13 and 13 or 32
      flat[t + 1], flat[33 + t] = a, b
    end
    local seg = zr.tensor(flat, { dtype = "i32" }):view(2, 1, 32)
    both(("sdpa_packed scale %g segments"):format(sc), "bf16", { randn({ 1, 32, 3 * 2 * 64 }), seg },
      function(x, s) return zr.sdpa_packed(x * 1, 2, 2, { scale = sc, segments = s }) end, 2)
  end
end)

-- (ReLU's kink: bf16 rounding moves pre-activations across 0, each such element's gradient whole, so ReLU's
-- bf16 run is ~5% off the f32 CPU's in L2 (sqrt of the share near 0); in f32 the GPU gives the CPU's to 7e-7)
T.test("GPT-2 variants on CUDA vs the CPU: unscaled + ReLU in f32; 1/layer, untied head, quick_gelu in bf16", function()
  local function cfg(extra)
    local c = { vocab_size = 64, n_positions = 128, n_embd = 128, n_layer = 2, n_head = 2, dtype = "f32" }
    for k, v in pairs(extra) do c[k] = v end
    return c
  end
  local ids = (zr.rand({ 2, 70 }) * 63):to("i64")
  zr.manual_seed(5)
  local ref = zr.models.gpt2.GPT2LMHeadModel(cfg { scale_attn_weights = false, activation_function = "relu" })
  local out = ref(ids, ids)
  out.loss:backward()
  local m = zr.models.gpt2.GPT2LMHeadModel(cfg { scale_attn_weights = false, activation_function = "relu", device = "cuda" })
  m:load_state_dict(ref:state_dict(), true)
  local o = m(ids:cuda(), ids:cuda())
  o.loss:backward()
  T.near(o.loss:cpu(), out.loss, 1e-5, 1e-5, "f32 loss")
  local g = {}
  for n, p in m:named_parameters() do g[n] = p.grad:cpu() end
  for n, p in ref:named_parameters() do T.near(g[n], p.grad, 1e-4, 1e-4, "f32 grad of " .. n) end
  zr.manual_seed(5)
  C.model_cpu_vs_gpu(zr.models.gpt2.GPT2LMHeadModel,
    cfg { scale_attn_by_inverse_layer_idx = true, tie_word_embeddings = false, activation_function = "quick_gelu" }, ids)
end)

T.test("sdpa_packed on Hopper: one node over qkv, nothing saved but the output and lse", function()
  if not C.hopper() then print("SKIP not a Hopper GPU"); return end
  local B, Tn, Hq, D = 4, 257, 12, 64
  local x = randn({ B, Tn, 3 * Hq * D }, "bf16"):cuda(); x.requires_grad = true
  local y = x * 1
  zr.cuda.synchronize()
  local before = zr.memory_stats("cuda:0").activations.current
  local o = zr.sdpa_packed(y, Hq)
  local grown = zr.memory_stats("cuda:0").activations.current - before
  T.eq(o.grad_fn, "sdpa_packed")
  local want = B * Tn * Hq * D * 2 + B * Hq * Tn * 4 -- the output (bf16) and lse (f32)
  -- compact copies of q, k and v would add 3 * B * Tn * Hq * D * 2 bytes
  assert(grown <= want + 256 * 1024, ("activations grew by %d bytes, want %d"):format(grown, want))
end)

T.done()
