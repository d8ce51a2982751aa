-- scaled_dot_product_attention on CUDA vs the CPU: flash (bf16/f16, Dh 64/128), the f32 path,
-- GQA, strided operands; the Hopper backward's in-kernel dq conversion at awkward shapes.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("attention") then return end
local zr, T, randn, both, unpack = C.zr, C.T, C.randn, C.both, C.unpack

T.test("scaled_dot_product_attention: flash (bf16/f16, Dh 64/128) and the f32 path, GQA", function()
  local function sdpa(q, k, v) return zr.scaled_dot_product_attention(q, k, v, { is_causal = true }) end
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs { { 1, 2, 1, 1, 64 }, { 2, 4, 2, 7, 64 }, { 1, 4, 1, 65, 128 }, { 1, 2, 2, 200, 64 } } do
      local B, Hq, Hkv, Tn, Dh = unpack(s)
      both("sdpa flash " .. table.concat(s, ","), dt,
        { randn({ B, Hq, Tn, Dh }), randn({ B, Hkv, Tn, Dh }), randn({ B, Hkv, Tn, Dh }) }, sdpa, 2)
    end
  end
  for _, s in ipairs { { 1, 1, 1, 1, 16 }, { 2, 4, 2, 7, 16 }, { 1, 2, 1, 33, 64 } } do
    local B, Hq, Hkv, Tn, Dh = unpack(s)
    both("sdpa f32 " .. table.concat(s, ","), "f32",
      { randn({ B, Hq, Tn, Dh }), randn({ B, Hkv, Tn, Dh }), randn({ B, Hkv, Tn, Dh }) }, sdpa, 2)
  end
  both("sdpa bf16 head_dim 32 (f32 path)", "bf16", { randn({ 1, 2, 9, 32 }), randn({ 1, 1, 9, 32 }), randn({ 1, 1, 9, 32 }) },
    sdpa, 2)
  -- strided operands (read in place by the Hopper kernels): transposed (B, T, H, Dh) projections,
  -- and head slices of one fused (B, T, (Hq + 2 Hkv) Dh) projection; the output read back through
  -- transpose + reshape, the gradients handed on in the inputs' layouts
  local function heads(t, B, Tn, H, Dh) return t:view(B, Tn, H, Dh):transpose(2, 3) end
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs { { 1, 2, 1, 5, 64 }, { 2, 4, 2, 130, 64 }, { 1, 2, 2, 200, 64 } } do
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

T.test("scaled_dot_product_attention backward: dq tiles converted in the Hopper kernel", function()
  -- each 128-row dq tile is converted by the block that adds its last key tile: T < 128, T one past
  -- a multiple of 128, a GQA group split over blocks (nsplit > 1 at few kv heads), a long tail
  local function sdpa(q, k, v) return zr.scaled_dot_product_attention(q, k, v, { is_causal = true }) end
  for _, dt in ipairs { "bf16", "f16" } do
    for _, s in ipairs { { 1, 4, 1, 57 }, { 1, 8, 1, 129 }, { 2, 4, 2, 255 }, { 1, 16, 2, 300 } } do
      local B, Hq, Hkv, Tn = unpack(s)
      both("sdpa dq tiles " .. table.concat(s, ","), dt,
        { randn({ B, Hq, Tn, 64 }), randn({ B, Hkv, Tn, 64 }), randn({ B, Hkv, Tn, 64 }) }, sdpa, 2)
    end
  end
  -- many heads: more work items (B·H·3) than SMs, so blocks run several and convert tiles other
  -- blocks added to; elementwise |cuda − cpu| <= 2·tol·(scale + |cpu|), judged with tensor ops
  local B, H, Tn = 4, 24, 384
  local tol = C.TOL
  for _, dt in ipairs { "bf16", "f16" } do
    local x = { randn({ B, H, Tn, 64 }), randn({ B, H, Tn, 64 }), randn({ B, H, Tn, 64 }) }
    local w = randn({ B, H, Tn, 64 })
    local function run(dev)
      local xs = {}
      for i = 1, 3 do
        local t = x[i]:to(dt)
        if dev == "cuda" then t = t:cuda() end
        t = t:detach(); t.requires_grad = true
        xs[i] = t
      end
      ;(sdpa(unpack(xs)):float() * (dev == "cuda" and w:cuda() or w)):sum():backward()
      return xs
    end
    local xc, xg = run("cpu"), run("cuda")
    for i, name in ipairs { "dq", "dk", "dv" } do
      local a, b = xg[i].grad:cpu():float(), xc[i].grad:float()
      local scale = b:abs():max():item()
      local excess = ((a - b):abs() - b:abs() * (2 * tol[dt][2])):max():item() - 2 * tol[dt][1] * scale
      assert(excess <= 0, ("sdpa B%d H%d T%d %s %s: cuda vs cpu over the tolerance by %.3g (scale %.3g)"):format(
        B, H, Tn, dt, name, excess, scale))
    end
  end
end)

T.done()
