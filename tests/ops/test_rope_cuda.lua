-- rope on CUDA vs the CPU: contiguous and (B,T,H,D)-transposed inputs, T = 1 and primes.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("rope") then return end
local zr, T, randn, both = C.zr, C.T, C.randn, C.both

T.test("rope: contiguous and (B,T,H,D)-transposed inputs, T=1 and primes", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, s in ipairs { { 1, 1, 1, 2 }, { 2, 3, 7, 8 }, { 1, 4, 33, 64 }, { 2, 2, 5, 128 } } do
      local B, H, Tn, Dh = s[1], s[2], s[3], s[4]
      local cos, sin = zr.rope_tables(Tn, Dh, { theta = 10000, dtype = "f32" })
      local what = table.concat(s, ",")
      both("rope " .. what, dt, { randn({ B, H, Tn, Dh }), cos:to(dt), sin:to(dt) },
        function(x, c, sn) return zr.rope(x, c, sn) end, 1, { false, true, true })
      both("rope transposed " .. what, dt, { randn({ B, Tn, H, Dh }), cos:to(dt), sin:to(dt) },
        function(x, c, sn) return zr.rope(x:transpose(2, 3), c, sn) end, 1, { false, true, true })
    end
  end
end)

T.test("rope, partial rotary (tables narrower than the head): contiguous and transposed, T=1 and primes", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, s in ipairs { { 1, 1, 1, 4, 2 }, { 2, 3, 7, 8, 6 }, { 1, 4, 33, 96, 72 }, { 2, 2, 5, 128, 96 } } do
      local B, H, Tn, Dh, R = s[1], s[2], s[3], s[4], s[5]
      local cos, sin = zr.rope_tables(Tn, R, { theta = 10000, dtype = "f32" })
      local what = table.concat(s, ",")
      both("rope partial " .. what, dt, { randn({ B, H, Tn, Dh }), cos:to(dt), sin:to(dt) },
        function(x, c, sn) return zr.rope(x, c, sn) end, 1, { false, true, true })
      both("rope partial transposed " .. what, dt, { randn({ B, Tn, H, Dh }), cos:to(dt), sin:to(dt) },
        function(x, c, sn) return zr.rope(x:transpose(2, 3), c, sn) end, 1, { false, true, true })
    end
  end
end)

T.done()
