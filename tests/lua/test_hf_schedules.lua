-- The Hugging Face Trainer's schedules (lr_scheduler_type + lr_scheduler_kwargs, zrun.schedulers_hf)
-- against transformers' own learning rates, step by step past the end of training
-- (tests/golden/hf_schedules.json, written by tests/golden/make_hf_schedules.py).
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local H = require "zrun.schedulers_hf"

local f = assert(io.open((ZRUN_HOME or ".") .. "/tests/golden/hf_schedules.json"))
local golden = cjson.decode(f:read("*a"))
f:close()

T.test(("every schedule transformers %s builds is covered by the golden file"):format(golden.transformers), function()
  local seen = {}
  for _, c in ipairs(golden.cases) do seen[c.name] = true end
  for _, name in ipairs(H.NAMES) do assert(seen[name], name .. " has no golden case") end
end)

for _, c in ipairs(golden.cases) do
  local kw = next(c.kwargs) and c.kwargs or nil
  T.test(("%s, warm-up %d of %d steps, kwargs %s: transformers' lr at every step"):format(c.name, c.warmup, c.total,
    kw and cjson.encode(kw) or "none"), function()
    local opt = { param_groups = { { lr = golden.lr }, { lr = golden.lr } } }
    local s = H.new(c.name, opt, { num_warmup_steps = c.warmup, num_training_steps = c.total, kwargs = kw })
    local got = { opt.param_groups[1].lr }
    for _ = 1, #c.lrs - 1 do
      s:step()
      T.eq(opt.param_groups[2].lr, opt.param_groups[1].lr, "both groups")
      got[#got + 1] = opt.param_groups[1].lr
    end
    T.near(got, c.lrs, 1e-18, 1e-12, c.name)
  end)
end

T.done()
