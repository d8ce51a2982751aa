-- tests/bench/bench_llama.lua's fuse_qk_norm: 1 or 0 only, and 0 (Qwen3's q/k norms as modules, for A/B against
-- the fused op) refused for a model without q/k norms rather than accepted and doing nothing. No model is built.
local zr = require "zrun"
local T = zr.testing

local Z = os.getenv("ZRUN_BIN") or arg[-1]
local function run(args)
  return T.run(Z .. " tests/bench/bench_llama.lua device=cpu " .. args .. " 2>&1")
end

T.test("bench_llama.lua: fuse_qk_norm=0 is refused for a Llama config, fuse_qk_norm=2 for any", function()
  local out, rc = run("fuse_qk_norm=0")
  assert(rc ~= 0, out)
  T.eq(out:find("only Qwen3 has q/k norms to run unfused (this config's model_type is llama)", 1, true) ~= nil, true, out)
  out, rc = run("fuse_qk_norm=2")
  assert(rc ~= 0, out)
  T.eq(out:find("fuse_qk_norm=2: give 1 (the default) or 0", 1, true) ~= nil, true, out)
end)

T.done()
