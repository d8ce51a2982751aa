-- The attention ops over packed sequences ({segments = seg}) on CUDA vs the CPU (test_attention_segments.lua
-- checks the CPU against each sequence alone): bf16/f16 at head_dim 64 (the Hopper kernels where they run)
-- and 128 (the Hopper kernels too) and 256 (the mma.sync kernels) for scaled_dot_product_attention (contiguous and
-- transposed projections), sdpa_packed and qkv_rope_sdpa (per-token cos/sin rows over the rows joined, as the
-- models run them), GQA, sequences of length 1, across 64-row tiles and spanning a row; elsewhere (f32, head_dim 48,
-- 100) scaled_dot_product_attention's f32 composition masked by them, and the packed ops' error that says to ask
-- zr.sdpa_segments_ok (80, 96: in place on Hopper, else padded to 128; test_attention_padded_cuda.lua).
-- SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("attention segments") then return end
local zr, T, randn, both, unpack = C.zr, C.T, C.randn, C.both, C.unpack

local make_seg = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "segments_of.lua")

local why = "packed sequences (segments) run on the CPU and on CUDA (compute capability 9.0 or above) in bf16/f16 at " ..
  "head_dim 64, 128, 256 or a multiple of 8 between 64 and 128"
T.test("segments where the flash kernels do not take them: sdpa's f32 composition masks by them; the packed ops' error names why and zr.sdpa_segments_ok", function()
  local seg = make_seg({ { 3, 4 } }, 7):cuda()
  T.eq(zr.sdpa_segments_ok("cuda", "f32", 64), false, "f32")
  T.eq(zr.sdpa_segments_ok("cuda", "bf16", 128), true, "head_dim 128 (the Hopper kernels)")
  T.eq(zr.sdpa_segments_ok("cuda", "bf16", 256), true, "head_dim 256 (the mma.sync kernels)")
  T.eq(zr.sdpa_segments_ok("cuda", "bf16", 48), false, "head_dim 48")
  T.eq(zr.sdpa_segments_ok("cuda", "bf16", 100), false, "head_dim 100")
  T.eq(zr.sdpa_segments_ok("cuda", "bf16", 96), true, "head_dim 96 (in place on Hopper, else padded to 128)")
  -- (zr.sdpa_segments_ok says where the models join the rows; scaled_dot_product_attention itself takes segments
  -- everywhere: where no flash kernel runs, the f32 composition masks keys before each query's sequence)
  for _, c in ipairs { { "f32", 64 }, { "bf16", 48 } } do
    local dt, D = unpack(c)
    both(("sdpa segments %s D=%d (the composition, masked by them)"):format(dt, D), dt,
      { randn({ 2, 2, 7, D }), randn({ 2, 1, 7, D }), randn({ 2, 1, 7, D }), (make_seg({ { 3, 4 }, { 1, 5, 1 } }, 7)) },
      function(q, k, v, s) return zr.scaled_dot_product_attention(q, k, v, { segments = s }) end, 2)
  end
  T.raises(function() zr.sdpa_packed(zr.randn({ 1, 7, 3 * 32 }, { device = "cuda" }), 1, 1, { segments = seg }) end,
    "sdpa_packed: " .. why)
  T.raises(function() zr.sdpa_packed(zr.randn({ 1, 7, 3 * 32 }, { device = "cuda" }), 1, 1, { segments = seg }) end,
    "use zr.sdpa_segments_ok first")
  -- seg on another device than q
  local q = zr.randn({ 1, 2, 7, 64 }, { dtype = "bf16", device = "cuda" })
  T.raises(function() zr.scaled_dot_product_attention(q, q, q, { segments = seg:cpu() }) end,
    "sdpa: segments are on cpu but the attention's inputs on cuda:0")
end)


-- B rows of T tokens each split as given: several sequences, length 1, across 64-row tiles, a whole row
local LAYOUTS = {
  { Tn = 7, rows = { { 3, 1, 3 }, { 7 } } },
  { Tn = 130, rows = { { 64, 1, 30, 35 }, { 130 } } },
  { Tn = 200, rows = { { 17, 100, 83 }, { 1, 1, 198 } } },
  { Tn = 257, rows = { { 1, 128, 63, 65 } } },
}

T.test("sdpa with segments: CUDA (head_dim 64 and 128: the Hopper kernels; 256: mma.sync) vs CPU, bf16/f16, GQA, contiguous and transposed projections", function()
  local function heads(t, B, Tn, H, D) return t:view(B, Tn, H, D):transpose(2, 3) end
  for _, D in ipairs { 64, 128, 256 } do for _, dt in ipairs { "bf16", "f16" } do
    for _, L in ipairs(LAYOUTS) do
      local B, Tn, seg = #L.rows, L.Tn, make_seg(L.rows, L.Tn)
      for _, h in ipairs { { 2, 2 }, { 4, 1 } } do
        local Hq, Hkv = unpack(h)
        local what = ("sdpa segments %s D=%d T=%d B=%d Hq=%d Hkv=%d"):format(dt, D, Tn, B, Hq, Hkv)
        both(what, dt, { randn({ B, Hq, Tn, D }), randn({ B, Hkv, Tn, D }), randn({ B, Hkv, Tn, D }), seg },
          function(q, k, v, s) return zr.scaled_dot_product_attention(q, k, v, { segments = s }) end, 2)
        both(what .. " transposed projections", dt,
          { randn({ B, Tn, Hq * D }), randn({ B, Tn, Hkv * D }), randn({ B, Tn, Hkv * D }), seg },
          function(q, k, v, s)
            local o = zr.scaled_dot_product_attention(heads(q * 1, B, Tn, Hq, D), heads(k * 1, B, Tn, Hkv, D),
              heads(v * 1, B, Tn, Hkv, D), { segments = s })
            return o:transpose(2, 3):reshape(B, Tn, Hq * D)
          end, 2)
      end
    end
  end end
end)

T.test("sdpa_packed and qkv_rope_sdpa with segments: CUDA vs CPU, bf16/f16, GQA, the rows joined with per-token tables", function()
  for _, D in ipairs { 64, 128, 256 } do for _, dt in ipairs { "bf16", "f16" } do
    for _, L in ipairs(LAYOUTS) do
      local B, Tn, seg = #L.rows, L.Tn, make_seg(L.rows, L.Tn)
      for _, h in ipairs { { 2, 2 }, { 4, 2 } } do
        local Hq, Hkv = unpack(h)
        local W = (Hq + 2 * Hkv) * D
        local what = ("%s D=%d T=%d B=%d Hq=%d Hkv=%d"):format(dt, D, Tn, B, Hq, Hkv)
        both("sdpa_packed segments " .. what, dt, { randn({ B, Tn, W }), seg },
          function(x, s) return zr.sdpa_packed(x * 1, Hq, Hkv, { segments = s }) end, 2)
        -- the rows' tables shared (T, D), as for B rows of one layout
        local cos, sin = zr.rope_tables(Tn, D)
        local tabs = { cpu = { cos, sin }, cuda = { cos:cuda(), sin:cuda() } }
        local function tab(x) return unpack(tabs[x:device() == "cpu" and "cpu" or "cuda"]) end
        both("qkv_rope_sdpa segments " .. what, dt, { randn({ B, Tn, W }), seg }, function(x, s)
          local c, sn = tab(x)
          return zr.qkv_rope_sdpa(x * 1, Hq, Hkv, c, sn, { segments = s })
        end, 2)
        -- the models' form: the rows joined (1, B·T), each token's own cos/sin row (its position in its sequence)
        local pos, flat = {}, {}
        for _, lens in ipairs(L.rows) do for _, n in ipairs(lens) do for t = 0, n - 1 do pos[#pos + 1] = t end end end
        for _, lens in ipairs(L.rows) do for _, n in ipairs(lens) do flat[#flat + 1] = n end end
        local seg1 = make_seg({ flat }, B * Tn)
        local ids = zr.tensor(pos, { dtype = "i64" })
        local c1, s1 = zr.embedding(cos, ids), zr.embedding(sin, ids)
        local tabs1 = { cpu = { c1, s1 }, cuda = { c1:cuda(), s1:cuda() } }
        both("qkv_rope_sdpa segments, rows joined " .. what, dt, { randn({ 1, B * Tn, W }), seg1 }, function(x, s)
          local c, sn = unpack(tabs1[x:device() == "cpu" and "cpu" or "cuda"])
          return zr.qkv_rope_sdpa(x * 1, Hq, Hkv, c, sn, { segments = s })
        end, 2)
      end
    end
  end end
end)

T.done()
