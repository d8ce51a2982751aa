-- Reads a Trainer's metrics.jsonl (one record per logged step) and says whether the run learned:
-- every gradient norm finite and above zero, and the last logged loss below the first by at
-- least MARGIN nats; with PRECISION, the run's header record says it trained in it (bf16, f16, f32).
-- Prints one PASS/FAIL line named LABEL.
--   zrun tests/mpi/learn_check.lua output_dir/metrics.jsonl LABEL MARGIN [PRECISION]
local cjson = require "cjson"
local path, label, margin, precision = arg[1], arg[2] or arg[1], tonumber(arg[3] or "1.0"), arg[4]
local f = io.open(path or "")
if not f then print("FAIL " .. label .. ": no metrics file " .. tostring(path)); os.exit(1) end
local steps, ran_in = {}, nil
for line in f:lines() do
  local ok, r = pcall(cjson.decode, line)
  if ok and type(r) == "table" and r.step and r.loss then steps[#steps + 1] = r end
  if ok and type(r) == "table" and r.run_id and r.precision then ran_in = r.precision end
end
f:close()
local function fail(msg) print("FAIL " .. label .. ": " .. msg); os.exit(1) end
if precision and ran_in ~= precision then
  fail(("trained in %s, expected %s"):format(tostring(ran_in), precision))
end
if #steps < 2 then fail(#steps .. " logged steps in " .. path .. " (expected logging_steps=1 and several steps)") end
for _, r in ipairs(steps) do
  local g = r.grad_norm
  if type(g) ~= "number" or not (g > 0) or g == math.huge then
    fail(("grad_norm %s at step %d (the gradients do not reach the optimizer)"):format(tostring(g), r.step))
  end
end
local first, last = steps[1].loss, steps[#steps].loss
if not (last <= first - margin) then
  fail(("loss %.4f -> %.4f over %d steps: it must fall by at least %.2f"):format(first, last, steps[#steps].step, margin))
end
print(("PASS %s: loss %.4f -> %.4f, grad_norm %.3f -> %.3f"):format(label, first, last, steps[1].grad_norm,
  steps[#steps].grad_norm))
