-- scaled_dot_product_attention on CUDA vs the CPU: flash (bf16/f16, Dh 64/128/256), the f32 path,
-- GQA.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("attention") then return end
local zr, T, randn, both, unpack = C.zr, C.T, C.randn, C.both, C.unpack

T.test("scaled_dot_product_attention: flash (bf16/f16, Dh 64/128/256) and the f32 path, GQA", function()
  local function sdpa(q, k, v) return zr.scaled_dot_product_attention(q, k, v, { is_causal = true }) end
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs { { 1, 2, 1, 1, 64 }, { 2, 4, 2, 7, 64 }, { 1, 4, 1, 65, 128 }, { 1, 2, 2, 200, 64 },
      { 2, 4, 1, 130, 256 }, { 1, 2, 2, 1, 256 } } do
      local B, Hq, Hkv, Tn, Dh = unpack(s)
      both("sdpa flash " .. table.concat(s, ","), dt,
        { randn({ B, Hq, Tn, Dh }), randn({ B, Hkv, Tn, Dh }), randn({ B, Hkv, Tn, Dh }) }, sdpa, 2)
    end
  end
  -- With one key (T = 1) q's and k's gradients are 0 up to rounding at the scale of dO . V (the
  -- CPU's flash backward forms D = rowsum(dO * O) apart from dP = dO V): judged against 1.
  for _, s in ipairs { { 1, 1, 1, 1, 16 }, { 2, 4, 2, 7, 16 }, { 1, 2, 1, 33, 64 } } do
    local B, Hq, Hkv, Tn, Dh = unpack(s)
    both("sdpa f32 " .. table.concat(s, ","), "f32",
      { randn({ B, Hq, Tn, Dh }), randn({ B, Hkv, Tn, Dh }), randn({ B, Hkv, Tn, Dh }) }, sdpa, 2, nil, Tn == 1 and 1 or nil)
  end
  both("sdpa bf16 head_dim 32 (f32 path)", "bf16", { randn({ 1, 2, 9, 32 }), randn({ 1, 1, 9, 32 }), randn({ 1, 1, 9, 32 }) },
    sdpa, 2)
  -- strided operands (read in place by the Hopper kernels): transposed (B, T, H, Dh) projections,
  -- and head slices of one fused (B, T, (Hq + 2 Hkv) Dh) projection; the output read back through
  -- transpose + reshape, the gradients handed on in the inputs' layouts
  local function heads(t, B, Tn, H, Dh) return t:view(B, Tn, H, Dh):transpose(2, 3) end
  -- (head_dim 256: the mma.sync kernels over contiguous copies, the gradients handed back through the views)
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs { { 1, 2, 1, 5, 64 }, { 2, 4, 2, 130, 64 }, { 1, 2, 2, 200, 64 }, { 1, 4, 1, 70, 256 } } do
      local B, Hq, Hkv, Tn, Dh = unpack(s)
      local name = table.concat(s, ",")
      both("sdpa on transposed (B, T, H, Dh) projections " .. name, dt,
        { randn({ B, Tn, Hq * Dh }), randn({ B, Tn, Hkv * Dh }), randn({ B, Tn, Hkv * Dh }) }, function(q, k, v)
          local o = sdpa(heads(q, B, Tn, Hq, Dh), heads(k, B, Tn, Hkv, Dh), heads(v, B, Tn, Hkv, Dh))
          return o:transpose(2, 3):reshape(B, Tn, Hq * Dh)
        end, 2)
      both("sdpa on head slices of a fused projection " .. name, dt, { randn({ B, Tn, (Hq + 2 * Hkv) * Dh }) },
        function(x)
          local q, k, v = unpack(zr.split(x * 2, { Hq * Dh, Hkv * Dh, Hkv * Dh }, 3))
          local o = sdpa(heads(q, B, Tn, Hq, Dh), heads(k, B, Tn, Hkv, Dh), heads(v, B, Tn, Hkv, Dh))
          return o:transpose(2, 3):reshape(B, Tn, Hq * Dh)
        end, 2)
    end
  end
end)

T.done()
