-- qkv_rope on CUDA vs the CPU (forward and the packed gradient) at awkward sizes (T = 1, primes,
-- head_dim 2 and 6 off the vector path, 64 and 128), both layouts, f32/bf16/f16; through the
-- attention (the Hopper kernels read the BTHD views in place); and against the unfused
-- split + rope composition on the GPU itself.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("qkv_rope") then return end
local zr, T, randn, both, close = C.zr, C.T, C.randn, C.both, C.close

local SHAPES = { -- B, T, H, KV, D
  { 1, 1, 1, 1, 2 }, { 2, 7, 4, 2, 8 }, { 1, 5, 3, 3, 6 }, { 1, 33, 4, 1, 64 }, { 2, 5, 2, 2, 128 },
}
local function flat(q, k, v) return zr.cat({ q:reshape(-1), k:reshape(-1), v:reshape(-1) }, 1) end

T.test("qkv_rope: CUDA vs CPU, leaf and through a product, both layouts, T=1 and primes", function()
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, s in ipairs(SHAPES) do
      local B, Tn, H, KV, D = unpack(s)
      local cos, sin = zr.rope_tables(Tn, D, { theta = 10000, dtype = "f32" })
      for _, layout in ipairs { "bhtd", "bthd", false } do
        local what = ("qkv_rope %s layout=%s"):format(table.concat(s, ","), tostring(layout))
        local lay = layout or nil
        both(what .. " leaf", dt, { randn({ B, Tn, (H + 2 * KV) * D }), cos:to(dt), sin:to(dt) },
          function(x, c, sn) return flat(zr.qkv_rope(x, H, KV, c, sn, lay)) end, 1, { false, true, true })
        -- x * 1: the gradient goes into the product's buffer; the product used again: added there
        both(what .. " product", dt, { randn({ B, Tn, (H + 2 * KV) * D }), cos:to(dt), sin:to(dt) },
          function(x, c, sn)
            local y = x * 1
            return zr.cat({ flat(zr.qkv_rope(y, H, KV, c, sn, lay)), y:reshape(-1) }, 1)
          end, 1, { false, true, true })
        -- one part used: the others' slices of the product's gradient are zeros
        both(what .. " k only", dt, { randn({ B, Tn, (H + 2 * KV) * D }), cos:to(dt), sin:to(dt) },
          function(x, c, sn) return select(2, zr.qkv_rope(x * 1, H, KV, c, sn, lay)) end, 1, { false, true, true })
      end
    end
  end
end)

T.test("qkv_rope into attention: CUDA vs CPU (bf16 head_dim 64 runs the strided Hopper path)", function()
  for _, dt in ipairs { "bf16", "f16", "f32" } do
    for _, s in ipairs { { 2, 37, 4, 2, 64 }, { 1, 130, 8, 8, 64 }, { 1, 19, 4, 1, 128 } } do
      local B, Tn, H, KV, D = unpack(s)
      local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32" })
      both(("qkv_rope + sdpa %s %s"):format(table.concat(s, ","), dt), dt,
        { randn({ B, Tn, (H + 2 * KV) * D }), cos:to(dt), sin:to(dt) }, function(x, c, sn)
          local o = zr.scaled_dot_product_attention(zr.qkv_rope(x * 1, H, KV, c, sn))
          return o:transpose(2, 3):reshape(B, Tn, H * D)
        end, 2, { false, true, true })
    end
  end
end)

T.test("qkv_rope equals split + contiguous + rope + transpose on the GPU (bf16, Llama-1B heads)", function()
  local B, Tn, H, KV, D = 2, 67, 32, 8, 64
  local cos, sin = zr.rope_tables(Tn, D, { dtype = "f32" })
  cos, sin = cos:to("cuda", "bf16"), sin:to("cuda", "bf16")
  local x0 = randn({ B, Tn, (H + 2 * KV) * D }, "bf16"):cuda()
  local wo = randn({ B, Tn, H * D }):cuda()
  local function run(fused)
    local x = x0:detach(); x.requires_grad = true
    local y = x * 1
    local q, k, v
    if fused then q, k, v = zr.qkv_rope(y, H, KV, cos, sin)
    else
      q, k, v = unpack(zr.split(y, { H * D, KV * D, KV * D }, 3))
      q = q:contiguous():view(B, Tn, H, D):transpose(2, 3):rope(cos, sin)
      k = k:contiguous():view(B, Tn, KV, D):transpose(2, 3):rope(cos, sin)
      v = v:view(B, Tn, KV, D):transpose(2, 3)
    end
    local o = zr.scaled_dot_product_attention(q, k, v):transpose(2, 3):reshape(B, Tn, H * D)
    ;(o:float() * wo):sum():backward()
    return o, x.grad
  end
  local o1, g1 = run(false)
  local o2, g2 = run(true)
  close(o2:cpu(), o1:cpu(), "bf16", "attention output: fused vs unfused", 1)
  close(g2:cpu(), g1:cpu(), "bf16", "product gradient: fused vs unfused", 1)
end)

T.done()
