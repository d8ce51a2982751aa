-- ZenFlow (zero_optimization.zenflow) against a naive Lua re-implementation of DeepSpeed's algorithm
-- (zenflow_reference.lua, from runtime/zero/zenflow.c's notes): column selection, selective AdamW, host
-- AdamW on the accumulated window with clipping and the micro-step bias correction, warm-up,
-- re-selection; the settings that reduce to plain offloaded AdamW; learning; the config checks.
local zr = require "zrun"
local T = zr.testing
local C = zr._C

local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "zenflow_reference.lua")
local mlp, config, batch, loss_of, run_engine, max_diff = R.mlp, R.config, R.batch, R.loss_of, R.run_engine, R.max_diff

local function compare(zf, steps, clip)
  local got = run_engine(config(zf, { gradient_clipping = clip }), steps, true)
  local want = R.reference(zf, steps, clip, 2e-2, 0.9, 0.99, 1e-8, 0.05)
  local d = max_diff(got, want)
  if d > 2e-5 then error(string.format("parameters differ from the reference by %g", d)) end
  -- and the selection matters: the parameters moved away from the start
  local start = mlp(true):parameters()[1]:detach():flat_table()
  T.eq(math.abs(got[steps][1][1] - start[1]) > 1e-4, true, "the first weight moved")
end

T.test("zenflow equals DeepSpeed's algorithm: warm-up, windows, re-selection, clipping", function()
  -- boundaries t = 0 (warm-up), 1, 4, 7, 10, 13 (update_interval 3), 5, 11 (before a selection);
  -- selections at t = 2, 6, 12; t = 3 updates the columns from a window already holding t = 2's gradient
  compare({ topk_ratio = 0.3, select_strategy = "step", select_interval = 6, update_interval = 3,
    full_warm_up_rounds = 2 }, 14, 0.05)
end)

T.test("zenflow offload = true (the selected columns' moments on the host) trains as DeepSpeed's algorithm", function()
  local zf = { topk_ratio = 0.3, select_strategy = "step", select_interval = 6, update_interval = 3,
    full_warm_up_rounds = 2, offload = true }
  local c = config(zf, { gradient_clipping = 0.05 })
  c.zero_optimization.overlap_comm = true
  local got, e = run_engine(c, 14, true)
  for _, q in ipairs(e.zenflow.p) do T.eq(q.m:device(), "cpu", "the moments live on the host") end
  local d = max_diff(got, R.reference(zf, 14, 0.05, 2e-2, 0.9, 0.99, 1e-8, 0.05))
  if d > 2e-5 then error(string.format("parameters differ from the reference by %g", d)) end
end)

T.test("zenflow: re-selection inside a window (epoch strategy, steps_per_epoch from the config)", function()
  -- DeepSpeed: no dataloader, so the engine never ends a window for a selection, while the optimizer
  -- re-selects every steps_per_epoch = 5 micro-steps: t = 5 selects from its own gradient mid-window
  compare({ topk_ratio = 0.5, select_strategy = "epoch", select_interval = 1, steps_per_epoch = 5,
    update_interval = 2 }, 11, 0)
end)

T.test("zenflow overlap_step equals DeepSpeed's: each window's host update lands one window late", function()
  -- as the first test, with the host update of the window ending at t applied at the next boundary
  -- (t = 4 applies nothing: it is the first after warm-up), moment sets alternating, and the
  -- selections at t = 6, 12 waiting for the update in flight before the master takes the weights
  compare({ topk_ratio = 0.3, select_strategy = "step", select_interval = 6, update_interval = 3,
    full_warm_up_rounds = 2, overlap_step = true }, 14, 0.05)
  compare({ topk_ratio = 0.5, select_strategy = "epoch", select_interval = 1, steps_per_epoch = 5,
    update_interval = 2, overlap_step = true, pt_reserved_cores_perc = 0.5 }, 11, 0)
  compare({ topk_ratio = 0.3, update_interval = 2, full_warm_up_rounds = 3, overlap_step = true }, 9, 0)
end)

T.test("zenflow overlap_step: engine:step returns while the host update still runs", function()
  local model = mlp(true)
  local e = zr.initialize { model = model, config = config({ topk_ratio = 0.3, update_interval = 2,
    overlap_step = true }) }
  local z = e.zero
  local function micro(t)
    local x, y = batch(t)
    e:backward(loss_of(e, x, y))
    e:step()
  end
  C.zenflow_hold(true) -- the background update waits after its work until released
  local ok, err = pcall(function()
    micro(0)
    micro(1) -- boundary: the first window's update starts and is held
    T.eq(z:async_busy(), true, "the update is still running after the boundary step")
    micro(2) -- the next window's micro-step runs (selected columns updated) meanwhile
    T.eq(z:async_busy(), true, "still running during the next window")
  end)
  C.zenflow_hold(false)
  if not ok then error(err, 0) end
  micro(3) -- boundary: joins it, applies its weights and starts the window ending at t = 3
  z:async_wait()
  T.eq(z:async_busy(), false, "joined")
  micro(4) -- inside the next window: a save is refused as without overlap_step
  T.raises(function() e:save_checkpoint(os.tmpname() .. ".d") end, "inside a ZenFlow update window")
end)

T.test("zenflow overlap_step: save_16bit_model writes the weights with the host update in flight applied", function()
  -- the reference's latest: the unselected columns as the next boundary will make them; saves at
  -- micro-steps inside a window and right after boundaries (4 is the first after warm-up, 7 applies)
  local zf = { topk_ratio = 0.3, select_strategy = "step", select_interval = 6, update_interval = 3,
    full_warm_up_rounds = 2, overlap_step = true }
  local steps = 11
  local _, _, latest = R.reference(zf, steps, 0.05, 2e-2, 0.9, 0.99, 1e-8, 0.05)
  local e = zr.initialize { model = mlp(true), config = config(zf, { gradient_clipping = 0.05 }) }
  local names = {}
  for name in e.module:named_parameters() do names[#names + 1] = name end
  local dir = os.tmpname()
  os.remove(dir)
  local differs = false
  for t = 0, steps - 1 do
    local x, y = batch(t)
    e:backward(loss_of(e, x, y))
    e:step()
    if t == 1 or t == 4 or t == 5 or t == 7 or t == 9 then
      local before = {}
      for i, p in ipairs(e:parameters()) do before[i] = p:detach():clone() end
      e:save_16bit_model(dir)
      local f = C.safetensors_open(dir .. "/model.safetensors")
      for i, p in ipairs(e:parameters()) do
        local got = f:get(names[i]):flat_table()
        local d = 0
        for j, v in ipairs(latest[t + 1][i]) do d = math.max(d, math.abs(got[j] - v)) end
        if d > 2e-5 then error(("micro-step %d, %s: %g from the reference's latest weights"):format(t, names[i], d)) end
        T.eq((p:detach() - before[i]):abs():max():item(), 0, "the parameters are put back")
        differs = differs or (f:get(names[i]) - before[i]):abs():max():item() > 1e-4
      end
      f:close()
    end
  end
  T.eq(differs, true, "the saved weights differ from the parameters (an update was pending)")
  local want = run_engine(config(zf, { gradient_clipping = 0.05 }), steps, true)
  local got = {}
  for i, p in ipairs(e:parameters()) do got[i] = p:detach():flat_table() end
  T.eq(max_diff({ got }, { want[steps] }), 0, "the run with saves goes on as the one without")
  os.execute("rm -rf '" .. dir .. "'")
end)

T.test("zenflow overlap_step: the background update's threads leave pt_reserved_cores_perc to training", function()
  local zfm = require "zrun.zenflow"
  T.eq(zfm.host_threads(0.5, 8), 4, "half of 8")
  T.eq(zfm.host_threads(0.3, 10), 7, "ceil(3) reserved")
  T.eq(zfm.host_threads(0, 6), 6, "nothing reserved: all")
  T.eq(zfm.host_threads(1, 6), 6, "everything reserved: both share all, as DeepSpeed")
  T.eq(zfm.host_threads(0.5, 1), 1, "one core")
end)

local function plain(bias, steps)
  return run_engine(config(nil), steps, bias)
end

T.test("zenflow with nothing selected and update_interval 1 is plain offloaded AdamW, bit for bit", function()
  local got = run_engine(config({ topk_ratio = 0, update_interval = 1 }), 6, false)
  T.eq(max_diff(got, plain(false, 6)), 0, "max difference")
end)

T.test("zenflow inside full_warm_up_rounds is plain offloaded AdamW, bit for bit", function()
  local got = run_engine(config({ topk_ratio = 0.5, update_interval = 1, full_warm_up_rounds = 10 }), 6, true)
  T.eq(max_diff(got, plain(true, 6)), 0, "max difference")
end)

local function learns(overlap)
  zr.manual_seed(3)
  local model = zr.nn.Sequential(zr.nn.Linear(16, 32), zr.nn.ReLU(), zr.nn.Linear(32, 1))
  local e = zr.initialize { model = model, config = config({ topk_ratio = 0.1, update_interval = 4,
    select_strategy = "step", select_interval = 8, overlap_step = overlap }, { gradient_clipping = 1.0 }) }
  zr.manual_seed(4)
  local x = zr.randn(4, 16)
  local y = x:sum(2, true):mul(0.25)
  local first, last
  for i = 1, 80 do
    local l = loss_of(e, x, y)
    e:backward(l)
    e:step()
    first = first or l:item()
    last = l:item()
  end
  if not (last < 0.5 * first) then error(string.format("loss %g -> %g did not halve", first, last)) end
  T.eq(e.last_grad_norm > 0, true, "gradient norm > 0")
end
T.test("zenflow learns: the loss falls by half with a non-zero gradient norm", function() learns(false) end)
T.test("zenflow learns with overlap_step too", function() learns(true) end)

T.test("zenflow config: auto_ratio and pt_reserved_cores_perc where they have no effect are warnings", function()
  local cfgmod = require "zrun.config"
  local function zf_warnings(zf)
    local out = {}
    for _, w in ipairs(cfgmod.load(config(zf)):warnings()) do if w:find("zenflow", 1, true) then out[#out + 1] = w end end
    return out
  end
  local w = zf_warnings({ update_interval = 4, auto_ratio = 0.9, pt_reserved_cores_perc = 0.3 })
  T.eq(#w, 2, "two warnings")
  assert(w[1]:find('auto_ratio = 0.9 acts only with update_interval "auto"', 1, true), w[1])
  assert(w[2]:find("pt_reserved_cores_perc = 0.3 acts only with overlap_step", 1, true), w[2])
  T.eq(#zf_warnings({ update_interval = 4, overlap_step = true, pt_reserved_cores_perc = 0.3 }), 0, "used with overlap_step")
  T.eq(#zf_warnings({ update_interval = 4 }), 0, "defaults: no warning")
end)

T.test("zenflow config: DeepSpeed's refusals and zrun's limits, one line each", function()
  local cfgmod = require "zrun.config"
  local function refused(zf, pattern, extra)
    local c = config(zf, extra)
    T.raises(function() cfgmod.load(c) end, pattern)
  end
  local ok = cfgmod.load(config({ topk_ratio = 0.05, update_interval = 4, full_warm_up_rounds = 0,
    select_strategy = "auto", select_interval = "auto", pt_reserved_cores_perc = 0.5, auto_ratio = 0.99 }))
  T.eq(ok.zero_optimization.zenflow.update_interval, 4, "accepted")
  refused({ update_interval = 4, select_interval = "often" }, 'select_interval is "often": a string must be "auto"')
  refused({ update_interval = "later" }, 'update_interval is "later"')
  refused({ update_interval = 4, select_strategy = "auto", select_interval = 2 }, 'DeepSpeed refuses select_interval = 2')
  refused({ update_interval = 4, select_strategy = "step" }, 'select_strategy "step" needs a number select_interval')
  refused({ update_interval = 4, select_strategy = "step", select_interval = 2 }, "must be >= update_interval")
  refused({ update_interval = 4, offload = true }, "offload = true needs zero_optimization.overlap_comm = true")
  local off = config({ update_interval = 4, offload = true })
  off.zero_optimization.overlap_comm = true
  T.eq(cfgmod.load(off).zero_optimization.zenflow.offload, true, "offload with overlap_comm")
  refused({ update_interval = 4, topk_ratio = 1.5 }, "topk_ratio")
  refused({ update_interval = 4, select_strategy = "random" }, "select_strategy")
  refused({ update_interval = 4 }, 'needs offload_optimizer.device "cpu"',
    { zero_optimization = { stage = 2, zenflow = { update_interval = 4 } } })
  refused({ update_interval = 4 }, "needs zero_optimization.stage 1 or 2",
    { zero_optimization = { stage = 3, offload_optimizer = { device = "cpu" }, zenflow = { update_interval = 4 } } })
  refused({ update_interval = 4 }, 'optimizer.type must be "Adam" or "AdamW"',
    { optimizer = { type = "Lion", params = { lr = 1e-3 } } })
  refused({ update_interval = 4 }, "use bf16", { fp16 = { enabled = true } })
  refused({ update_interval = 0 }, "update_interval must be")
  local shipped = cfgmod.load("configs/zero2_offload_zenflow.json", { args = { train_dataset_size = 100 } })
  T.eq(shipped.zero_optimization.zenflow.topk_ratio, 0.05, "configs/zero2_offload_zenflow.json loads")
  local auto = cfgmod.load("configs/zero2_offload_zenflow_auto.json", { args = { train_dataset_size = 100 } })
  T.eq(auto.zero_optimization.zenflow.update_interval, "auto", "configs/zero2_offload_zenflow_auto.json loads")
  -- DeepSpeed's defaults: a section without update_interval (or anything) is "auto" throughout
  local bare = cfgmod.load(config({}))
  T.eq(bare.zero_optimization.zenflow.update_interval, "auto", "update_interval defaults to auto")
  T.eq(bare.zero_optimization.zenflow.select_strategy, "auto", "select_strategy defaults to auto")
end)

T.test("zenflow at the engine: host-side gradients are refused in one line", function()
  local zf = require "zrun.zenflow"
  local e = { world_size = 2, offload_grads = "host", device = "cuda" }
  T.raises(function() zf.new(e, { update_interval = 4 }) end, "unset ZRUN_OFFLOAD_GRADS=host")
end)

T.done()
