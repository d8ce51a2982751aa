-- Sliding-window attention on CUDA vs the CPU (test_attention_window.lua checks the CPU against the masked
-- composition): the segments zr.sdpa_window_segments builds, through the flash kernels in bf16/f16 at
-- head_dim 64 (the Hopper kernels: 192-query tiles, key tiles skipped before a tile's first window) and 128
-- (the Hopper kernels: the forward's 128-query tiles, the backward's 64-query steps) and 256 (the mma.sync kernels, the
-- backward's columns over two blocks), for scaled_dot_product_attention, sdpa_packed and qkv_rope_sdpa; windows of 1,
-- at and around the tile sizes, and past T; plain rows and packed sequences; GQA. SKIP without a GPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("attention window") then return end
local zr, T, randn, both, unpack = C.zr, C.T, C.randn, C.both, C.unpack

local make_seg = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "segments_of.lua")

local CASES = { -- rows (nil: B one-sequence rows), T, windows
  { B = 2, Tn = 300, windows = { 1, 64, 65, 127, 128, 129, 191, 192, 193, 200, 400 } },
  { B = 1, Tn = 1000, windows = { 100, 256, 511 } },
  { Tn = 330, rows = { { 200, 130 }, { 1, 329 } }, windows = { 3, 64, 150 } },
}

T.test("sdpa with window segments: CUDA (head_dim 64, 128: the Hopper kernels; 256: mma.sync) vs CPU, bf16/f16, GQA", function()
  for _, D in ipairs { 64, 128, 256 } do for _, dt in ipairs { "bf16", "f16" } do
    for _, c in ipairs(CASES) do
      local B = c.rows and #c.rows or c.B
      local seg = c.rows and make_seg(c.rows, c.Tn) or nil
      for _, W in ipairs(c.windows) do
        local ws = zr.sdpa_window_segments(B, c.Tn, W, seg)
        for _, h in ipairs { { 2, 2 }, { 4, 1 } } do
          local Hq, Hkv = unpack(h)
          local what = ("sdpa window %d %s D=%d T=%d B=%d Hq=%d Hkv=%d%s"):format(W, dt, D, c.Tn, B, Hq, Hkv,
            c.rows and " packed" or "")
          -- (a window of 1: each query sees itself alone, q's and k's gradients are 0 up to rounding at the scale of
          -- dO . V, as test_attention_cuda's T = 1: judged against 1)
          both(what, dt, { randn({ B, Hq, c.Tn, D }), randn({ B, Hkv, c.Tn, D }), randn({ B, Hkv, c.Tn, D }), ws },
            function(q, k, v, s) return zr.scaled_dot_product_attention(q, k, v, { segments = s }) end, 2, nil,
            W == 1 and 1 or nil)
        end
      end
    end
  end end
end)

T.test("sdpa_packed and qkv_rope_sdpa with window segments: CUDA vs CPU, bf16, GQA (the models' ops)", function()
  for _, D in ipairs { 64, 128, 256 } do
    for _, c in ipairs(CASES) do
      local B = c.rows and #c.rows or c.B
      local seg = c.rows and make_seg(c.rows, c.Tn) or nil
      local cos, sin = zr.rope_tables(c.Tn, D)
      local tabs = { cpu = { cos, sin }, cuda = { cos:cuda(), sin:cuda() } }
      for _, W in ipairs { c.windows[1], c.windows[#c.windows] } do
        local ws = zr.sdpa_window_segments(B, c.Tn, W, seg)
        local Hq, Hkv = 4, 2
        local width = (Hq + 2 * Hkv) * D
        local what = ("window %d bf16 D=%d T=%d B=%d%s"):format(W, D, c.Tn, B, c.rows and " packed" or "")
        both("sdpa_packed " .. what, "bf16", { randn({ B, c.Tn, width }), ws },
          function(x, s) return zr.sdpa_packed(x * 1, Hq, Hkv, { segments = s }) end, 2)
        both("qkv_rope_sdpa " .. what, "bf16", { randn({ B, c.Tn, width }), ws }, function(x, s)
          local cs, sn = unpack(tabs[x:device() == "cpu" and "cpu" or "cuda"])
          return zr.qkv_rope_sdpa(x * 1, Hq, Hkv, cs, sn, { segments = s })
        end, 2)
      end
    end
  end
end)

T.done()
