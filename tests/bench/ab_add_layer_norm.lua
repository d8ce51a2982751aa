-- A/B of zr.add_layer_norm in a whole training step: runs bench_llama.lua with its options, and
-- with unfused=1 replaces zr.add_layer_norm by x + r then zr.layer_norm (the add and the norm as
-- two kernels again; GPT-2's graph and everything else unchanged). Alternate the two in one session.
--   ./zrun tests/bench/ab_add_layer_norm.lua unfused=0|1 model=gpt2 batch=64 seq=1024 steps=10 warmup=2
local zr = require "zrun"
local rest, unfused = {}, nil
for _, a in ipairs(arg) do
  local v = a:match("^unfused=(.*)$")
  if v then unfused = v else rest[#rest + 1] = a end
end
if unfused ~= "0" and unfused ~= "1" then
  error("ab_add_layer_norm: pass unfused=0 (zr.add_layer_norm) or unfused=1 (x + r, then layer_norm), "
    .. "then bench_llama.lua's options", 0)
end
if unfused == "1" then
  local layer_norm = zr.layer_norm
  zr.add_layer_norm = function(x, r, w, b, eps)
    local h = x + r
    return h, layer_norm(h, w, b, eps)
  end
end
print("ab_add_layer_norm: " .. (unfused == "1" and "unfused (add, then layer_norm)" or "fused (zr.add_layer_norm)"))
rest[0] = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/bench_llama.lua"
arg = rest
dofile(rest[0])
