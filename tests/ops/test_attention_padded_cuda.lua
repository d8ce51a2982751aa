-- Attention at a head_dim between 64 and 128 (a multiple of 8: Phi-3's 96, 80, 112, 72, 120) on CUDA: the 128-wide
-- flash kernels, reading a multiple of 16 in place on Hopper (TMA's zero fill past it) and the others over
-- zero-padded copies (ops/attention.c sdpa_padded), against the CPU, bf16/f16, GQA, causal rows and packed
-- sequences with a sliding window (the segments), scaled_dot_product_attention (contiguous and transposed
-- projections), sdpa_packed and qkv_rope_sdpa. SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("attention padded") then return end
local zr, T, randn, both, unpack = C.zr, C.T, C.randn, C.both, C.unpack

local make_seg = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "segments_of.lua")

T.test("sdpa at head_dim 72, 80, 96, 112, 120 on CUDA (in place or zero-padded to 128) vs CPU, bf16/f16, GQA", function()
  T.eq(zr.sdpa_segments_ok("cuda", "bf16", 96), true)
  local function heads(t, B, Tn, H, D) return t:view(B, Tn, H, D):transpose(2, 3) end
  for _, D in ipairs { 72, 80, 96, 112, 120 } do for _, dt in ipairs { "bf16", "f16" } do
    for _, Tn in ipairs { 1, 65, 200 } do
      for _, h in ipairs { { 2, 2 }, { 4, 1 } } do
        local Hq, Hkv, B = h[1], h[2], 2
        local what = ("sdpa %s D=%d T=%d Hq=%d Hkv=%d"):format(dt, D, Tn, Hq, Hkv)
        both(what, dt, { randn({ B, Hq, Tn, D }), randn({ B, Hkv, Tn, D }), randn({ B, Hkv, Tn, D }) },
          function(q, k, v) return zr.scaled_dot_product_attention(q, k, v) end, 2)
        both(what .. " transposed projections", dt, { randn({ B, Tn, Hq * D }), randn({ B, Tn, Hkv * D }), randn({ B, Tn, Hkv * D }) },
          function(q, k, v)
            local o = zr.scaled_dot_product_attention(heads(q * 1, B, Tn, Hq, D), heads(k * 1, B, Tn, Hkv, D), heads(v * 1, B, Tn, Hkv, D))
            return o:transpose(2, 3):reshape(B, Tn, Hq * D)
          end, 2)
      end
    end
  end end
end)

T.test("head_dim 96 on CUDA: packed sequences and a sliding window (the segments), sdpa_packed, qkv_rope_sdpa", function()
  local D, Hq, Hkv = 96, 4, 2
  local rows, Tn = { { 100, 30, 70 }, { 200 } }, 200
  local seg = make_seg(rows, Tn)
  local B = #rows
  for _, s in ipairs { seg, zr.sdpa_window_segments(B, Tn, 33, seg), zr.sdpa_window_segments(B, Tn, 128) } do
    both("sdpa D=96 segments", "bf16", { randn({ B, Hq, Tn, D }), randn({ B, Hkv, Tn, D }), randn({ B, Hkv, Tn, D }), s },
      function(q, k, v, sg) return zr.scaled_dot_product_attention(q, k, v, { segments = sg }) end, 2)
    local W = (Hq + 2 * Hkv) * D
    both("sdpa_packed D=96 segments", "bf16", { randn({ B, Tn, W }), s },
      function(x, sg) return zr.sdpa_packed(x * 1, Hq, Hkv, { segments = sg }) end, 2)
    local cos, sin = zr.rope_tables(Tn, D)
    local tabs = { cpu = { cos, sin }, cuda = { cos:cuda(), sin:cuda() } }
    both("qkv_rope_sdpa D=96 segments", "bf16", { randn({ B, Tn, W }), s }, function(x, sg)
      local c, sn = unpack(tabs[x:device() == "cpu" and "cpu" or "cuda"])
      return zr.qkv_rope_sdpa(x * 1, Hq, Hkv, c, sn, { segments = sg })
    end, 2)
  end
  -- plain causal through qkv_rope_sdpa (the models' fused call) too
  local W = (Hq + 2 * Hkv) * D
  local cos, sin = zr.rope_tables(Tn, D)
  both("qkv_rope_sdpa D=96", "bf16", { randn({ 2, Tn, W }) }, function(x)
    local c, sn = cos, sin
    if x:device() ~= "cpu" then c, sn = cos:cuda(), sin:cuda() end
    return zr.qkv_rope_sdpa(x * 1, Hq, Hkv, c, sn)
  end, 2)
end)

T.test("qkv_rope_sdpa at head_dim 96 on Hopper: q, k, v read in place, no padded copies kept", function()
  if not C.hopper() then print("SKIP not a Hopper GPU"); return end
  local B, Tn, Hq, Hkv, D = 2, 300, 8, 4, 96
  local x = randn({ B, Tn, (Hq + 2 * Hkv) * D }, "bf16"):cuda(); x.requires_grad = true
  local cos, sin = zr.rope_tables(Tn, D)
  cos, sin = cos:cuda(), sin:cuda()
  local y = x * 1
  zr.cuda.synchronize()
  local before = zr.memory_stats("cuda:0").activations.current
  local o = zr.qkv_rope_sdpa(y, Hq, Hkv, cos, sin)
  local grown = zr.memory_stats("cuda:0").activations.current - before
  T.eq(o.grad_fn, "qkv_rope_sdpa")
  -- the rotated product (x's size), the output (bf16) and lse (f32); padded copies of q, k, v and a padded output
  -- would add at least B * Tn * (2 Hq + 2 Hkv) * 128 * 2 bytes
  local want = B * Tn * (Hq + 2 * Hkv) * D * 2 + B * Tn * Hq * D * 2 + B * Hq * Tn * 4
  assert(grown <= want + 512 * 1024, ("activations grew by %d bytes, want %d"):format(grown, want))
  o:sum():backward()
  T.eq(x.grad:size(3), (Hq + 2 * Hkv) * D)
end)

T.done()
