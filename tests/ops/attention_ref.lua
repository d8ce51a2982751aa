-- The attention tests' independent reference: naive causal GQA attention over Lua numbers, one
-- score row at a time (query head h reads kv head floor(h / (Hq / Hkv))). The caller says where
-- elements live: q(b, h, t, e), k(b, g, t, e), v(b, g, t, e) read one (0-based), put(b, h, t, e, x) stores one.
local exp, floor, huge = math.exp, math.floor, math.huge
return function(q, k, v, put, B, Hq, Hkv, Tn, Dh, scale)
  for b = 0, B - 1 do
    for h = 0, Hq - 1 do
      local g = floor(h / (Hq / Hkv))
      for i = 0, Tn - 1 do
        local s, m, z = {}, -huge, 0
        for j = 0, i do
          local d = 0
          for e = 0, Dh - 1 do d = d + q(b, h, i, e) * k(b, g, j, e) end
          s[j] = d * scale
          if s[j] > m then m = s[j] end
        end
        for j = 0, i do s[j] = exp(s[j] - m); z = z + s[j] end
        for e = 0, Dh - 1 do
          local acc = 0
          for j = 0, i do acc = acc + s[j] / z * v(b, g, j, e) end
          put(b, h, i, e, acc)
        end
      end
    end
  end
end
