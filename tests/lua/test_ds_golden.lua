-- zrun's engine against DeepSpeed 0.19.8's on the same file, weights and batches (tests/golden/ds_engine.json,
-- written by tests/golden/make_ds_golden.py on the CPU from llama_tiny's golden weights): OneCycle with its momentum
-- cycle (beta1 moved every step, beta2 pinned at 0.99) and WarmupCosineLR with accumulation and clipping at ZeRO-1.
-- Every micro-step's loss (2e-5 relative: float32 kernels of two libraries), and after every optimizer step the
-- learning rate (1e-12), the betas and the gradient norm (2e-4). Then a resume from step 4 of zrun's own checkpoint
-- must continue with DeepSpeed's losses (OneCycle's betas restored with its iteration).
local zr = require "zrun"
local T = zr.testing
local cjson = require "cjson"
local hf = require "zrun.hf"

local G = cjson.decode(T.read_file("tests/golden/ds_engine.json"))
local tmp = T.tmpdir()
local golden = zr.load_safetensors("tests/golden/llama_tiny.safetensors")
local dir = tmp .. "/llama_tiny"
do -- a model directory: the config transformers wrote and the golden weights under the model's names
  local sd = {}
  for n, v in pairs(golden) do if n:match("^model%.") or n == "lm_head.weight" then sd[n] = v end end
  hf.save_state_dict(dir, sd)
  T.write_file(dir .. "/config.json", T.read_file("tests/golden/llama_tiny.config.json"))
end

local function run(name, o)
  local r = G.runs[name]
  local path = tmp .. "/" .. name .. ".json"
  T.write_file(path, cjson.encode(r.config))
  local m = zr.models.llama.from_pretrained(dir, { dtype = "f32" })
  local e = zr.initialize { model = m, config = path }
  local gas = r.config.gradient_accumulation_steps or 1
  local losses, steps = {}, {}
  local from, to = o and o.from or 1, o and o.to or #r.batches
  if o and o.load then e:load_checkpoint(o.load) end
  for i = from, to do
    local t = zr.tensor(r.batches[i], { dtype = "i64" })
    local loss = e(t, t).loss
    losses[#losses + 1] = loss:item()
    e:backward(loss)
    e:step()
    if i % gas == 0 then
      steps[#steps + 1] = { lr = e:get_lr(), betas = e:param_betas(), grad_norm = e:get_global_grad_norm() }
    end
    if o and o.save_at == i then e:save_checkpoint(o.save) end
  end
  return losses, steps
end

local function compare(name, losses, steps, first_micro, first_step)
  local r = G.runs[name]
  for k, l in ipairs(losses) do
    local want = r.losses[first_micro + k - 1]
    T.near(l, want, 0, 2e-5, ("%s: micro-step %d loss"):format(name, first_micro + k - 1))
  end
  for k, s in ipairs(steps) do
    local want = r.steps[first_step + k - 1]
    local what = ("%s: step %d"):format(name, first_step + k - 1)
    T.near(s.lr, want.lr, 1e-12, 1e-12, what .. " lr")
    T.near({ s.betas[1], s.betas[2] }, want.betas, 1e-12, 0, what .. " betas")
    T.near(s.grad_norm, want.grad_norm, 0, 2e-4, what .. " gradient norm")
  end
end

T.test("OneCycle's momentum cycle and its learning rate: DeepSpeed's losses, lrs, betas and gradient norms", function()
  local losses, steps = run("onecycle_momentum")
  compare("onecycle_momentum", losses, steps, 1, 1)
end)

T.test("WarmupCosineLR, accumulation 2, clipping 0.5, Adam's betas and eps, ZeRO-1: DeepSpeed's run", function()
  local losses, steps = run("warmup_cosine_gas2_clip")
  compare("warmup_cosine_gas2_clip", losses, steps, 1, 1)
end)

T.test("OneCycle resumed from step 4 of zrun's checkpoint continues with DeepSpeed's losses and betas", function()
  local ck = tmp .. "/ck"
  run("onecycle_momentum", { to = 4, save_at = 4, save = ck })
  local losses, steps = run("onecycle_momentum", { from = 5, load = ck })
  compare("onecycle_momentum", losses, steps, 5, 5)
end)

T.done()
