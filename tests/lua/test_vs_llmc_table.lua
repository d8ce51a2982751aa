-- tests/bench/vs_llmc_table.sh on logs written in the two tools' formats: llm.c's step line is
-- train_gpt2.cu's printf (its format string below, verbatim), zrun's is bench_llama.lua's. Checks the
-- median after the warm-ups, tokens/s, the ratio, the losses, and the refusals.
local zr = require "zrun"
local T = zr.testing
local tmp = os.tmpname()
local LLMC_STEP = "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s\n"

local function put(path, s) local f = assert(io.open(path, "wb")); f:write(s); f:close() end
-- llm.c's log: a config table line, val loss, then n steps whose times are ms(step)
local function llmc_log(n, ms, loss)
  local t = { "| max_steps             | " .. n .. " |\n", "val loss 11.012345\n" }
  for s = 1, n do
    local z = s == 1 and 0 / 0 or 0.5
    t[#t + 1] = LLMC_STEP:format(s, n, loss(s), z, 1.2345, z, 1e-4, ms(s), 40.5, 65536 * 1000 / ms(s))
  end
  t[#t + 1] = "val loss 7.5\ntotal average iteration time: 130.000000 ms\n"
  return table.concat(t)
end
local ZRUN_LOG = [[
step 1 loss 10.9876 (2500.1 ms)
step 33 loss 7.2500 (121.0 ms)
model                                    gpt2
optimizer step time (median)             120.0 ms (1 micro-batch)
tokens/s                                 546133
]]
local function table_of(llmc, zrun)
  put(tmp .. ".llmc", llmc); put(tmp .. ".zrun", zrun)
  return T.run(("sh tests/bench/vs_llmc_table.sh %s.llmc %s.zrun 64 1024 3"):format(tmp, tmp))
end
-- warm-ups 1000 ms; timed steps 4..33 take 100 + (s*7 mod 30) ms: 100..129 once each, median 114
local function ms(s) return s <= 3 and 1000 or 100 + (s * 7) % 30 end

T.test("vs_llmc_table.sh: medians after the warm-ups, tokens/s, the ratio and the losses", function()
  local out, rc = table_of(llmc_log(33, ms, function(s) return 11 - s * 0.1 end), ZRUN_LOG)
  assert(rc == 0, out)
  local l = out:match("\nllm%.c +[^\n]+")
  local z = out:match("\nzrun +[^\n]+")
  assert(l and z, out)
  T.eq(l, ("\n%-14s %12.0f %10.2f   10.9000 -> 7.7000 (step 33)"):format("llm.c", 65536 * 1000 / 114, 114), "llm.c row")
  T.eq(z, ("\n%-14s %12.0f %10.2f   10.9876 -> 7.2500 (step 33)"):format("zrun", 65536 * 1000 / 120, 120), "zrun row")
  assert(out:find(("%-14s %12.3f"):format("zrun / llm.c", 114 / 120), 1, true), out)
  assert(out:find("30 steps timed after 3 warm-ups", 1, true), out)
end)

T.test("vs_llmc_table.sh fails when a loss does not fall or a log has no steps", function()
  local out, rc = table_of(llmc_log(33, ms, function() return 10 end), ZRUN_LOG)
  assert(rc ~= 0 and out:find("CHECK: llm.c's loss did not fall", 1, true), out)
  out, rc = table_of(llmc_log(33, ms, function(s) return 11 - s * 0.1 end), ZRUN_LOG:gsub("7%.2500", "11.5"))
  assert(rc ~= 0 and out:find("CHECK: zrun's loss did not fall", 1, true), out)
  out, rc = table_of("val loss 11.0\n", ZRUN_LOG)
  assert(rc ~= 0 and out:find("no timed step lines", 1, true), out)
  out, rc = table_of(llmc_log(33, ms, function(s) return 11 - s * 0.1 end), "tokens/s 5\n")
  assert(rc ~= 0 and out:find("in zrun's log", 1, true), out)
end)

os.remove(tmp .. ".llmc"); os.remove(tmp .. ".zrun"); os.remove(tmp)
T.done()
