-- DeepSpeed checkpoints saved without ZeRO (zero_optimization.stage 0), read for zrun.zero_to_fp32_ds's
-- Reader: one mp_rank_00_model_states.pt holds the weights ("module") and the optimizer's state_dict
-- ("optimizer"), as engine._save_checkpoint writes it, in one of three forms (DeepSpeed 0.19.8):
--   FP16_Optimizer (fp16 or bf16 with DeepSpeed's fused Adam: runtime/fp16/fused_optimizer.py): each
--     group's trainable parameters flattened, no padding, into fp32_groups_flat[g]; the inner
--     optimizer's state holds one flat exp_avg / exp_avg_sq per group (state[g]);
--   FP16_UnfusedOptimizer (fp16 with another optimizer: unfused_optimizer.py): fp32_groups[g], the
--     group's fp32 masters one by one; the state per parameter, numbered through the groups;
--   the optimizer itself (fp32): its state_dict, the state per parameter numbered through the
--     groups; the module's weights are the master.
-- Which parameters a group holds is not saved. DeepSpeed groups the parameters the caller gave it:
-- the model's trainable parameters in one group, or transformers' Trainer's two (the weights that
-- decay, then biases and norms, each in the model's order); the grouping whose sizes agree with the
-- saved groups' is taken, and none agreeing is an error that says so.
local P = require "zrun.torch_pickle"
local zr = require "zrun"

local M = {}
local fmt, ipairs, type, concat = string.format, ipairs, type, table.concat

-- The groupings DeepSpeed may have been given (names per group): `names` (the trainable parameters,
-- in order) in one group, or split by no_decay(name) as transformers' Trainer groups them.
local function groupings(names, no_decay, what)
  local decay, nd = {}, {}
  for _, n in ipairs(names) do
    if no_decay(n) then nd[#nd + 1] = n else decay[#decay + 1] = n end
  end
  local two = {}
  if #decay > 0 then two[#two + 1] = decay end
  if #nd > 0 then two[#two + 1] = nd end
  return { { label = what .. " in one group", groups = { names } },
    { label = "transformers' Trainer's groups (weights that decay; biases and norms)", groups = two } }
end

-- The one way to find saved sizes `want` (in order) among candidates `have` (in order, some of them
-- frozen: left out): the indices taken, or nil when there is none or more than one.
local function embed(want, have)
  local n, m = #want, #have
  local ways = {} -- ways[i][j]: ways (capped at 2) to place want[i..n] among have[j..m]
  for i = n + 1, 1, -1 do
    ways[i] = {}
    for j = m + 1, 1, -1 do
      if i > n then ways[i][j] = 1
      elseif j > m then ways[i][j] = 0
      else
        local w = ways[i][j + 1] + (want[i] == have[j] and ways[i + 1][j + 1] or 0)
        ways[i][j] = w > 2 and 2 or w
      end
    end
  end
  if ways[1][1] ~= 1 then return nil end
  local out, j = {}, 1
  for i = 1, n do
    while not (want[i] == have[j] and ways[i + 1][j + 1] == 1) do j = j + 1 end
    out[i], j = j, j + 1
  end
  return out
end

-- Grouping `groups` (candidate names per group) matched to the saved groups `saved` ({total=}:
-- exactly those names; {sigs=}: each saved parameter's shape, found among them, the frozen left
-- out; unknown: as many as saved): the names per group, or nil.
local function match(groups, saved, sig)
  if #groups ~= #saved then return nil end
  local out = {}
  for g, s in ipairs(saved) do
    local names = groups[g]
    if s.unknown then -- (a parameter without a state: the count alone)
      if #names ~= #s.idx then return nil end
      out[g] = names
    elseif s.total then
      local total = 0
      for _, n in ipairs(names) do total = total + sig.numel[n] end
      if total ~= s.total then return nil end
      out[g] = names
    else
      local have = {}
      for j, n in ipairs(names) do have[j] = sig.shape[n] end
      local idx = embed(s.sigs, have)
      if not idx then return nil end
      out[g] = {}
      for j, k in ipairs(idx) do out[g][j] = names[k] end
    end
  end
  return out
end

local function sizes_str(saved)
  local out = {}
  for g, s in ipairs(saved) do
    out[g] = s.total and fmt("%d values", s.total) or fmt("%d parameters", #s.sigs)
  end
  return concat(out, ", ")
end

-- Fills Reader r from model-states dict m0 (read from mpath). opts.model, when given (a zrun
-- module: engine:load_checkpoint), names the trainable parameters and their groups; without it the
-- module's parameters and transformers' naming rule do.
function M.scan(r, m0, mpath, opts)
  local module, opt = m0.module, m0.optimizer
  if not P.is_dict(module) then error(fmt("%s: has no module state dict", mpath), 0) end
  if opt == nil or opt == P.None then
    error(fmt("%s: saved without an optimizer state (no ZeRO, no optimizer): take the weights with "
      .. "zr.torch_load(this file).module", mpath), 0)
  end
  if not P.is_dict(opt) then error(fmt("%s: optimizer is %s, not a state dict", mpath, P.repr(opt)), 0) end
  local base, form
  if P.is_list(opt.fp32_groups_flat) then base, form = opt.optimizer_state_dict, "FP16_Optimizer"
  elseif P.is_list(opt.fp32_groups) then base, form = opt.optimizer_state_dict, "FP16_UnfusedOptimizer"
  elseif P.is_dict(opt.state) and P.is_list(opt.param_groups) then base, form = opt, "its optimizer"
  else
    error(fmt("%s: the optimizer state holds %s: a layout zrun does not know (not FP16_Optimizer's, "
      .. "FP16_UnfusedOptimizer's or a torch optimizer's)", mpath, P.repr(opt)), 0)
  end
  if not (P.is_dict(base) and P.is_dict(base.state) and P.is_list(base.param_groups)) then
    error(fmt("%s: %s's optimizer_state_dict is %s, not a torch optimizer's state_dict", mpath, form, P.repr(base)), 0)
  end
  r.stage, r.world, r.where, r.master_dtype = 0, 1, { mpath }, "f32"
  r.osd = { form == "its optimizer" and { optimizer_state_dict = base } or opt }
  r.kind = fmt("DeepSpeed's checkpoint without ZeRO (%s)", form)
  -- the module's parameters: buffers and tied names (a tensor an earlier name holds) set apart
  local is_buffer, held, names, numel, shape, alias = {}, {}, {}, {}, {}, {}
  for _, b in ipairs(P.is_list(m0.buffer_names) and m0.buffer_names or {}) do is_buffer[b] = true end
  for _, n in ipairs(P.keys(module)) do
    local t = module[n]
    if P.is_tensor(t) and not is_buffer[n] then
      local key = t.storage
      for _, prev in ipairs(held[key] or {}) do
        local pt = module[prev]
        if pt.offset == t.offset and concat(pt.shape, "x") == concat(t.shape, "x") then alias[n] = prev end
      end
      if not alias[n] then
        held[key] = held[key] or {}
        held[key][#held[key] + 1] = n
        names[#names + 1] = n
        numel[n], shape[n] = t:numel(), concat(t.shape, "x")
      end
    end
  end
  -- the saved groups' sizes
  local saved = {}
  local groups_t = opt.fp32_groups_flat or opt.fp32_groups
  for g, pg in ipairs(base.param_groups) do
    local idx = P.is_dict(pg) and pg.params
    if not P.is_list(idx) then error(fmt("%s: param_groups[%d] has no params list", mpath, g - 1), 0) end
    if form == "FP16_Optimizer" then
      local t = groups_t[g]
      if not P.is_tensor(t) then error(fmt("%s: fp32_groups_flat[%d] is %s, not a tensor", mpath, g - 1, P.repr(t)), 0) end
      saved[g] = { total = t:numel(), flat = t, key = idx[1] } -- (its one parameter, the flat master)
    else
      -- each parameter's shape from its master (FP16_UnfusedOptimizer) or its state (exp_avg); a
      -- parameter never stepped (no state) leaves only the count to go by
      local s = { sigs = {}, tensors = {}, idx = {} }
      for j, k in ipairs(idx) do
        local t = form == "FP16_UnfusedOptimizer" and P.is_list(groups_t[g]) and groups_t[g][j] or nil
        if form == "FP16_UnfusedOptimizer" and not P.is_tensor(t) then
          error(fmt("%s: fp32_groups[%d][%d] is %s, not a tensor", mpath, g - 1, j - 1, P.repr(t)), 0)
        end
        local st = base.state[k]
        local m = t or P.is_dict(st) and P.is_tensor(st.exp_avg) and st.exp_avg or nil
        s.sigs[j] = m and concat(m.shape, "x") or false
        if not m then s.unknown = true end
        s.tensors[j], s.idx[j] = t, k
      end
      saved[g] = s
    end
  end
  -- which grouping DeepSpeed was given
  local cands
  if opts and opts.model then
    local mnames, seen = {}, {}
    for n, p in opts.model:named_parameters() do
      if p.requires_grad and not seen[p] then seen[p] = n; mnames[#mnames + 1] = n end
    end
    for _, n in ipairs(mnames) do
      if not numel[n] then error(fmt("%s: the module has no weight '%s' (a checkpoint of another model)", mpath, n), 0) end
    end
    local nd = {}
    for p in pairs(require("zrun.trainer").no_decay_params(opts.model)) do if seen[p] then nd[seen[p]] = true end end
    cands = groupings(mnames, function(n) return nd[n] end, "the model's trainable parameters")
  else
    -- (a folder read without the model: transformers' rule by name alone)
    cands = groupings(names, require("zrun.trainer").no_decay_name, "the trainable parameters")
  end
  local pick
  for _, c in ipairs(cands) do
    pick = match(c.groups, saved, { numel = numel, shape = shape })
    if pick then break end
  end
  if not pick then
    error(fmt("%s: the optimizer's %d groups (%s) match neither %s nor %s: a checkpoint of another model, or "
      .. "parameters grouped another way", mpath, #saved, sizes_str(saved), cands[1].label, cands[2].label), 0)
  end
  -- the parameters: the master and moments where the form keeps them
  local in_group = {}
  for g, gnames in ipairs(pick) do
    local s, at = saved[g], 0
    for j, n in ipairs(gnames) do
      in_group[n] = true
      local t = module[n]
      local e = { name = n, shape = t.shape, numel = numel[n] }
      local off = at
      e.range = function(which, lo, hi, put)
        if form == "FP16_Optimizer" then
          local src = which == "master" and s.flat or M.state(base, s.key, which, mpath)
          put(0, src:read(off + lo, hi - lo, { dtype = "f32" }))
          return
        end
        local src
        if which == "master" then src = s.tensors[j] or t
        else src = M.state(base, s.idx[j], which, mpath, true) end
        put(0, src and src:read(lo, hi - lo, { dtype = "f32" }) or zr.zeros({ hi - lo }))
      end
      r:add(e)
      at = at + numel[n]
    end
  end
  -- frozen parameters (in no group): the module's weights, in its training dtype
  for _, n in ipairs(names) do
    if not in_group[n] then
      local t = module[n]
      r:add({ name = n, shape = t.shape, numel = numel[n], frozen = true,
        read = function() return t:get({ dtype = "f32" }):reshape({ numel[n] }) end })
    end
  end
  for _, n in ipairs(P.keys(module)) do
    if alias[n] then r:add_alias(n, alias[n]) end
  end
end

-- State `which` (exp_avg, ...) of the optimizer's parameter k, a tensor; missing_ok: nil for a
-- parameter the optimizer never stepped (no state yet).
function M.state(base, k, which, mpath, missing_ok)
  local st = base.state[k]
  if st == nil and missing_ok then return nil end
  local t = P.is_dict(st) and st[which] or nil
  if not P.is_tensor(t) then
    error(fmt("%s: the optimizer has no state '%s' for parameter %s (an optimizer other than Adam/AdamW, or "
      .. "a layout zrun does not know)", mpath, which, tostring(k)), 0)
  end
  return t
end

return M
