-- ZenFlow's own state in a ZeRO checkpoint (dir/<tag>/zenflow_states.safetensors, written by rank 0;
-- every rank holds the same): per parameter the selected columns (i32), their AdamW moments (f32, on
-- the parameters' device, or the host with offload), the selective optimizer's step count and rate, and with update_interval
-- "auto" the adaptive window's state (its length so far and the last two verdicts in the metadata,
-- each weight's two sums as f64 tensors auto.avg / auto.non), so that a resumed run continues
-- exactly; any world size loads it (the selection is not per partition). The values the device
-- updates (selected columns, 1-D parameters) reach the checkpoint through the master, which takes the
-- model's values at the save.
--
-- With overlap_step (zrun.zenflow: host_step) a save waits for the host update in flight; the host
-- optimizer's own master (one window ahead of the model: its new weights are not applied yet) and what
-- it keeps beside it go to each rank's optimizer file as partitions (f32, S) named in M.OVERLAP_STATES
-- and listed, with {pending, first_after_warm}, in its zrun_state as `zenflow_overlap` (not in
-- `states`, so loaders without overlap_step read the file as before): zenflow_master, zenflow_pending
-- (the new weights, param dtype widened; only when pending), zenflow_exp_avg and zenflow_exp_avg_sq
-- (the second moment set; the first is exp_avg/exp_avg_sq; which one the next window takes follows
-- from the saved micro-step count, as in DeepSpeed's get_overlap_step_state). They reshard as the
-- master does. `master` stays the model, so zero_to_fp32 and a load without overlap_step get the
-- model (the pending window dropped, said in one line).
--
-- DeepSpeed (ZenFlowZeroOptimizerParallel, read at edaa722) saves through stage_1_and_2's state_dict:
-- the fp32 partitions, which its optimizer process may still be updating (nothing joins the step in
-- flight before a save; only wait_last_update_and_copy does), and no separate copy of the weights that
-- wait_last_update_and_copy has yet to copy into the bit16 parameters. zrun joins the step and saves
-- them, so that a resumed run repeats the uninterrupted one bit for bit.
local C = require("zrun")._C
local cjson = require "cjson"
local fmt = string.format

local M = {}
M.FILE = "zenflow_states.safetensors"
M.FORMAT = "zrun-zenflow/1"

-- The tensors and metadata to save for engine e's ZenFlow, and with overlap_step the checkpoint's
-- zenflow_overlap (nil without); every rank calls it (each syncs its master partition). Saving inside
-- an update window would lose the window's accumulated gradients (DeepSpeed saves at step boundaries
-- too): refused in one line.
function M.collect(e)
  local zf = e.zenflow
  if not zf.fresh then
    error(fmt("save_checkpoint inside a ZenFlow update window (micro-step %d, update_interval %d): the window's " ..
      "accumulated gradients are not saved; save right after an engine:step() that returned true",
      e.micro_steps, zf.U), 0)
  end
  -- overlap_step: the update in flight finishes (it writes the master and one moment set); the host
  -- master is kept until M.release_master, the checkpoint's master is the model
  local ov
  if zf.overlap then
    local z = e.zero
    z:async_wait()
    zf.held_master = z:state(0):clone()
    local pending = z:async_pending()
    ov = { pending = pending, first_after_warm = zf.first_after_warm, states = {} }
    for _, n in ipairs(M.OVERLAP_STATES) do
      if n ~= "zenflow_pending" or pending then ov.states[#ov.states + 1] = n end
    end
  end
  -- the host master takes the device-updated values (the selected columns, 1-D parameters): the saved
  -- master is then the model (zero_to_fp32, resharding), and the run is unchanged — the host update's
  -- results for those values are discarded anyway (zrun.zenflow: after_cpu_step)
  zf:sync_master()
  local tensors, kinds = {}, {}
  for i, q in ipairs(zf.p) do
    kinds[i] = q.idx == nil and "whole" or q.idx == false and "none" or "columns"
    tensors[fmt("p%d.exp_avg", i)] = q.m
    tensors[fmt("p%d.exp_avg_sq", i)] = q.v
    if q.idx then tensors[fmt("p%d.columns", i)] = q.idx end
  end
  local st = { steps = zf.steps, kinds = kinds, n = #zf.p, lr = zf.lr }
  if zf.auto then -- update_interval "auto": the window's length so far, both verdicts, each weight's sums
    zf:settle()
    st.auto = { win = zf.win, need = { zf.need[1], zf.need[2] } }
    local avg, non = {}, {}
    for i, q in ipairs(zf.p) do avg[i], non[i] = q.avg, q.non end
    tensors["auto.avg"] = C.tensor(avg, { dtype = "f64" }) -- (doubles: JSON would round them)
    tensors["auto.non"] = C.tensor(non, { dtype = "f64" })
  end
  return tensors, { format = M.FORMAT, zenflow = cjson.encode(st) }, ov
end

M.OVERLAP_STATES = { "zenflow_master", "zenflow_pending", "zenflow_exp_avg", "zenflow_exp_avg_sq" }
local OVERLAP_WHICH = { zenflow_pending = 0, zenflow_exp_avg = 1, zenflow_exp_avg_sq = 2 }

-- overlap_step: the partition (S) saved as name (one of M.OVERLAP_STATES), an f32 tensor.
function M.overlap_tensor(e, name)
  if name == "zenflow_master" then return e.zenflow.held_master end
  return e.zero:async_state(OVERLAP_WHICH[name], true):to("f32")
end

-- After the save's optimizer file (also when it failed): the host master comes back.
function M.release_master(e)
  local zf = e.zenflow
  if zf and zf.held_master then
    e.zero:set_state(0, zf.held_master)
    zf.held_master = nil
  end
end

-- At a load, after the parameters took the saved model: ov is the checkpoint's zenflow_overlap;
-- read(name, dst) fills dst (S elements) with this rank's partition of saved state name. Restores
-- what M.collect kept, so the next boundary applies the pending weights as the uninterrupted run would.
function M.restore_overlap(e, ov, read, say)
  local zf, z = e.zenflow, e.zero
  if not (zf and zf.overlap) then
    say("[zrun] load_checkpoint: the checkpoint was saved with zenflow overlap_step; without it the run " ..
      "continues from the model, without the host update that was pending")
    return
  end
  local ms = z:state(0)
  read("zenflow_master", ms)
  z:set_state(0, ms)
  for _, n in ipairs(ov.states) do
    if OVERLAP_WHICH[n] then read(n, z:async_state(OVERLAP_WHICH[n], true)) end
  end
  z:set_async_pending(ov.pending)
  zf.first_after_warm = ov.first_after_warm
end

-- update_interval "auto": the adaptive window's state from the file f (st: its metadata's auto, nil
-- when saved with a fixed update_interval; then the window statistic starts afresh, said in one line).
function M.restore_auto(zf, st, f, path, say)
  if not zf.auto then
    if st then say(fmt('[zrun] load_checkpoint: %s was saved with update_interval "auto"; this run\'s fixed ' ..
      "update_interval does not use its window statistic", path)) end
    return
  end
  local avg, non = {}, {}
  if st then
    avg, non = f:get("auto.avg"):flat_table(), f:get("auto.non"):flat_table()
  else
    say(fmt('[zrun] load_checkpoint: %s was saved with a fixed update_interval; update_interval "auto" starts its ' ..
      "window statistic afresh", path))
    st = { win = 0, need = { false, false } }
  end
  zf.win, zf.need, zf.pending = st.win, { st.need[1], st.need[2] }, nil -- (a verdict queued before the load is void)
  for i, q in ipairs(zf.p) do q.avg, q.non = avg[i] or 0, non[i] or 0 end
end

-- Restores engine e's ZenFlow from path (a file M.collect wrote). check(metadata) raises when the
-- file is not the checkpoint's own save. Without the file (a checkpoint of a run without ZenFlow)
-- the columns are selected afresh at the next micro-step, said on one line by say(line).
function M.restore(e, path, say, check)
  local zf = e.zenflow
  if C.path_type(path) ~= "file" then
    zf.force_select = true
    say(fmt("[zrun] load_checkpoint: %s has no ZenFlow state (saved without zero_optimization.zenflow); the " ..
      "columns are selected afresh at the next micro-step", path:match("^(.*)/") or path))
    return
  end
  local f = C.safetensors_open(path)
  local ok, err = pcall(function()
    local md = f:metadata()
    if md.format ~= M.FORMAT or not md.zenflow then
      error(fmt("%s: not a zrun ZenFlow state file (format '%s')", path, tostring(md.format)), 0)
    end
    if check then check(md) end
    local st = cjson.decode(md.zenflow)
    if st.n ~= #zf.p then
      error(fmt("%s: ZenFlow state for %d parameters, the model has %d", path, st.n, #zf.p), 0)
    end
    for i, q in ipairs(zf.p) do
      local m = f:get(fmt("p%d.exp_avg", i))
      if m:numel() ~= q.m:numel() then
        error(fmt("%s: parameter %d's ZenFlow moments have %d elements, expected %d (a different topk_ratio or " ..
          "model?)", path, i, m:numel(), q.m:numel()), 0)
      end
      q.m:copy_(m)
      q.v:copy_(f:get(fmt("p%d.exp_avg_sq", i)))
      local kind = st.kinds[i]
      if kind == "columns" then q.idx = f:get(fmt("p%d.columns", i)):to(q.t:device())
      elseif kind == "none" then q.idx = false
      else q.idx = nil end
    end
    -- the rate the next micro-step's selective update takes (synced at each engine:step, after it)
    zf.steps, zf.fresh, zf.lr = st.steps, true, st.lr or zf.lr
    M.restore_auto(zf, st.auto, f, path, say)
  end)
  f:close()
  if not ok then error(err, 0) end
end

return M
