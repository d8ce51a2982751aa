-- ZenFlow (zero_optimization.zenflow): DeepSpeed's schedule of selective column updates around the
-- offloaded optimizer step. DeepSpeed's semantics are written down in runtime/zero/zenflow.c; the
-- column kernels are C.zenflow_*. M.check validates the section (config.lua), M.new attaches it to an engine.
local C = require("zrun")._C
local dist = require "zrun.dist"
local fmt = string.format
local floor = math.floor

local M = {}
local ZF = {}
ZF.__index = ZF

local function is_int(v) return type(v) == "number" and v == floor(v) end

-- Validates zero_optimization.zenflow as DeepSpeed's ZenFlowConfig and configure_zenflow do, plus what
-- zrun does not implement; add(fmt, ...) records one error line, warn(fmt, ...) one warning (a key set
-- where it has no effect, in DeepSpeed too). vals: the resolved config.
function M.check(vals, add, warn)
  local zo = vals.zero_optimization
  local zf = zo.zenflow
  local p = "zero_optimization.zenflow."
  local si, ui = zf.select_interval, zf.update_interval
  if type(si) == "string" and si ~= "auto" then add('%sselect_interval is "%s": a string must be "auto"', p, si) end
  if type(ui) == "string" and ui ~= "auto" then add('%supdate_interval is "%s": a string must be "auto"', p, ui) end
  if type(si) ~= "string" and not (is_int(si) and si >= 0) then
    add('%sselect_interval must be "auto" or a whole number >= 0, got %s', p, tostring(si))
  end
  if type(ui) ~= "string" and not (is_int(ui) and ui >= 1) then
    add('%supdate_interval must be "auto" or a whole number >= 1, got %s', p, tostring(ui))
  end
  if zf.select_strategy == "auto" and type(si) == "number" then
    add('%sselect_strategy "auto" sets select_interval to 1 epoch: DeepSpeed refuses select_interval = %s with it; ' ..
      'remove select_interval or set select_strategy to "step" or "epoch"', p, tostring(si))
  elseif zf.select_strategy ~= "auto" and si == "auto" then
    add('%sselect_strategy "%s" needs a number select_interval (DeepSpeed refuses "auto" there)', p, zf.select_strategy)
  end
  if zf.select_strategy == "step" and is_int(si) and is_int(ui) and si ~= 0 and si < ui then
    add("%sselect_interval (%d) must be >= update_interval (%d), as DeepSpeed requires", p, si, ui)
  end
  if warn and zf.auto_ratio ~= 0.99 and ui ~= "auto" then
    warn('%sauto_ratio = %s acts only with update_interval "auto" (as in DeepSpeed); with update_interval %s it has ' ..
      "no effect", p, tostring(zf.auto_ratio), tostring(ui))
  end
  if warn and zf.pt_reserved_cores_perc ~= 0.5 and not zf.overlap_step then
    warn("%spt_reserved_cores_perc = %s acts only with overlap_step (the background host update's cores, as in " ..
      "DeepSpeed); without it it has no effect", p, tostring(zf.pt_reserved_cores_perc))
  end
  if zf.offload and not zo.overlap_comm then
    add('%soffload = true needs zero_optimization.overlap_comm = true (DeepSpeed asserts "offload selective ' ..
      'optimizer should be used with overlap_comm")', p)
  end
  local off = zo.offload_optimizer and zo.offload_optimizer.device
  if off ~= "cpu" then
    add('zero_optimization.zenflow needs offload_optimizer.device "cpu" (DeepSpeed: "Zenflow must be used with cpu ' ..
      'offload"); got %s', tostring(off or "none"))
  end
  if zo.stage ~= 1 and zo.stage ~= 2 then
    add("zero_optimization.zenflow needs zero_optimization.stage 1 or 2 in zrun, got %d (DeepSpeed's stage-3 ZenFlow " ..
      "is not implemented)", zo.stage)
  end
  local ot = vals.optimizer and vals.optimizer.type
  if ot and ot ~= "Adam" and ot ~= "AdamW" then
    add('zero_optimization.zenflow updates with AdamW: optimizer.type must be "Adam" or "AdamW", got "%s"', ot)
  end
  local op = vals.optimizer and vals.optimizer.params or {}
  if op.adam_w_mode == false or op.torch_adam == true or op.bias_correction == false then
    add("zero_optimization.zenflow: the selected columns use torch.optim.AdamW; optimizer.params adam_w_mode false, " ..
      "bias_correction false and torch_adam true are not supported with it")
  end
  if vals.fp16 and vals.fp16.enabled == true then
    add("zero_optimization.zenflow with fp16: the selected columns' update would see loss-scaled gradients; use bf16")
  end
  local ga = vals.data_types and vals.data_types.grad_accum_dtype
  if ga and ga ~= "fp32" and ga ~= "float32" then
    add("zero_optimization.zenflow needs fp32 gradient accumulation (data_types.grad_accum_dtype %s)", tostring(ga))
  end
  if zo.offload_optimizer and (zo.offload_optimizer.ratio or 1) < 1 then
    add("zero_optimization.zenflow with offload_optimizer.ratio < 1 is not implemented in zrun; set ratio to 1")
  end
end

-- The engine's and the optimizer's select intervals (DeepSpeed keeps two; 0: select once, after warm-up).
local function intervals(zf, steps_per_epoch_loader)
  if zf.select_strategy == "step" then return zf.select_interval, zf.select_interval end
  local n = zf.select_strategy == "auto" and 1 or zf.select_interval
  local spe = steps_per_epoch_loader or zf.steps_per_epoch
  return steps_per_epoch_loader and n * steps_per_epoch_loader or 0, spe and n * spe or 0
end

-- Attaches ZenFlow to engine e (zr.initialize, after the ZeRO engine exists). loader_len: the
-- training dataloader's length (micro-batches per epoch), or nil.
function M.new(e, zf, loader_len)
  if e.offload_grads ~= "device" and e.device ~= "cpu" then
    error("zero_optimization.zenflow reads each micro-batch's gradient where it is accumulated: it needs the " ..
      "gradients on the parameters' device (unset ZRUN_OFFLOAD_GRADS=host)", 0)
  end
  local si_engine, si_opt = intervals(zf, loader_len)
  local U = zf.update_interval
  local auto = U == "auto"
  if not auto and (si_engine ~= 0 and si_engine < U or si_opt ~= 0 and si_opt < U) then
    error(fmt("zero_optimization.zenflow: the select interval (%d micro-steps) must be >= update_interval (%d), " ..
      "as DeepSpeed requires", si_engine ~= 0 and si_engine or si_opt, U), 0)
  end
  -- W > 1: stage 1 accumulates the window in .grad on each rank; stage 2 hands each micro-step's
  -- gradient to the reduce-scatter, and the engine leaves it on the parameter (zero_new's keep_grads)
  local self = setmetatable({ e = e, W = e.world_size, step_grads = e.stage == 2 and e.world_size > 1,
    topk = zf.topk_ratio, U = U, warm = zf.full_warm_up_rounds, auto = auto,
    si_engine = si_engine, si_opt = si_opt, fresh = true, steps = 0, p = {}, lr = e:param_lrs(),
    overlap = zf.overlap_step, first_after_warm = true, threads = M.host_threads(zf.pt_reserved_cores_perc) }, ZF)
  local total, counted = 0, 0
  for i, t in ipairs(e.params) do
    local sh = t:shape()
    local two = #sh == 2
    local rows, cols = two and sh[1] or 1, two and sh[2] or t:numel()
    local k = two and floor(zf.topk_ratio * cols) or cols
    local dev = t:device()
    -- offload: the moments live on the host and visit the device for each update (ZF:update)
    local mdev = zf.offload and "cpu" or dev
    self.p[i] = { t = t, two = two, rows = rows, cols = cols, k = k, off = total, away = mdev ~= dev,
      m = C.zeros(rows * k, { device = mdev }), v = C.zeros(rows * k, { device = mdev }), avg = 0, non = 0 }
    total = total + rows * k
    if #sh ~= 1 then counted = counted + 1 end
  end
  -- every micro-step's selected gradients (the 1-D parameters' whole), one flat buffer: one all-reduce
  self.red = C.empty(math.max(total, 1), { device = e.params[1] and e.params[1]:device() or "cpu" })
  if auto then -- the adaptive window's state (see ZF:is_boundary)
    self.ratio, self.counted, self.need, self.win = zf.auto_ratio, counted, { false, false }, 0
    -- one rank: each micro-step's gradient mass is sum |.grad - q.last| in one pass that also keeps
    -- .grad in q.last for the next micro-step (a persistent f32 copy of the measured weights' gradients),
    -- instead of a clone before backward and a difference, |.|, sum after it (four passes, three new
    -- tensors). Several ranks need the difference itself (reduced over the ranks before |.|).
    self.keep_last = self.W == 1
    self.sums = C.empty(2 * math.max(#self.p, 1), { device = self.red:device() })
  end
  return self
end

-- DeepSpeed's is_zenflow_update_boundary for micro-step t (0-based). update_interval "auto": the flag
-- the previous micro-step's statistic left in need[parity of t-1] (ZF:judge), or a forced boundary.
function ZF:is_boundary(t)
  if self.forced == t then return true end
  if self.auto then
    self:settle()
    if t < self.warm then return true end
    return self.need[(t + 1) % 2 + 1] or (self.si_engine ~= 0 and (t + 1) % self.si_engine == 0)
  end
  if t + 1 < self.warm then return true end
  return (t + 1 - self.warm) % self.U == 0 or (self.si_engine ~= 0 and (t + 1) % self.si_engine == 0)
end

-- Makes micro-step t (not yet run) end a host update window (zrun's Trainer, to save a checkpoint
-- there with update_interval "auto"); the adaptive statistic goes on as at a select-interval boundary.
function ZF:force_boundary(t) self.forced = t end

function ZF:is_select(t)
  local d = t - self.warm
  return d >= 0 and (d == 0 or (self.si_opt ~= 0 and t % self.si_opt == 0))
end

-- update_interval "auto" measures the 2-D weights of more than one row (DeepSpeed's rule)
local function measured(q) return q.two and q.rows > 1 end

local function grad_of(q)
  local g = q.t.grad
  if not g then error("zenflow: a parameter has no gradient after backward (every parameter must get one)", 0) end
  return g
end

-- Before backward of micro-step t: at a selection, the master takes the parameters' values (t > 0)
-- and the selected columns' moments restart; then what the window accumulated so far is noted, so
-- that this micro-step's own gradient can be told apart after backward.
function ZF:before_backward(t)
  if self.auto then -- DeepSpeed's backward_prologue: the previous micro-step's flag restarts the window
    self:settle()
    self.need[t % 2 + 1] = false
    if self.need[(t + 1) % 2 + 1] then
      self.win = 0
      for _, q in ipairs(self.p) do q.non = 0 end
    end
    self.win = self.win + 1
  end
  -- force_select: resumed from a checkpoint without ZenFlow state (zrun.zenflow_state)
  local sel = self:is_select(t) or (self.force_select and t >= self.warm) or false
  if sel then
    self.force_select = nil
    -- overlap_step: the update in flight finishes first (it writes the master); its weights stay pending
    if self.overlap then self.e.zero:async_wait() end
    if t > 0 then self:sync_master() end
    for _, q in ipairs(self.p) do q.m:zero_(); q.v:zero_() end
  end
  for _, q in ipairs(self.p) do
    q.prev, q.prev_full = nil, nil
    -- the window holds earlier micro-steps' gradients (not where .grad is each micro-step's own)
    if not self.fresh and not self.step_grads then
      -- the selection changes, or "auto" measures the whole micro-step gradient (several ranks): keep
      -- them whole (one rank: q.last holds them already, ZF:judge)
      if q.two and (sel or self.auto and t >= self.warm and not self.keep_last) then q.prev_full = grad_of(q):clone()
      elseif t >= self.warm and q.idx ~= false then q.prev = self:gather(q, grad_of(q)) end
    end
  end
  self.selecting, self.had_prev = sel, not self.fresh and not self.step_grads
end

-- src (rows, cols) of q's shape -> its selected columns (rows, k), a new tensor
function ZF:gather(q, src)
  local out = C.empty(q.rows * q.k, { dtype = src:dtype(), device = src:device() })
  C.zenflow_gather(out, src, q.idx)
  return out
end

-- The master (this rank's partition: its chunk of each parameter) takes the parameters' values.
function ZF:sync_master()
  local z, r = self.e.zero, self.e.global_rank
  local ms = z:state(0)
  for i, q in ipairs(self.p) do
    local off, chunk = z:layout(i)
    local n = q.t:numel()
    local a = math.min(n, r * chunk)
    local len = math.min(n, a + chunk) - a
    if len > 0 then ms:narrow(1, off + 1, len):copy_(q.t:view(n):narrow(1, a + 1, len)) end
  end
  z:set_state(0, ms)
end

-- g (a rank's micro-step gradient, or several ranks' laid end to end in self.red) -> the mean over
-- the ranks, as DeepSpeed's reduction gives it; g itself at one rank.
function ZF:reduced(g, in_place)
  if self.W == 1 then return g end
  if not in_place then g = g:clone() end
  dist.all_reduce(g)
  return g:mul_(1 / self.W)
end

-- The top-k columns of this micro-step's gradient g (rows, cols): sorted 0-based indices, a list.
function ZF:top_columns(q, g)
  local sums = C.empty(q.cols, { device = g:device() })
  C.zenflow_colsum(sums, g)
  local s = sums:to("cpu"):flat_table()
  local order = {}
  for j = 1, q.cols do order[j] = j end
  table.sort(order, function(a, b) if s[a] ~= s[b] then return s[a] > s[b] end return a < b end)
  local top = {}
  for j = 1, q.k do top[j] = order[j] - 1 end
  table.sort(top)
  return top
end

-- tops[i]: weight i's top columns (nil for a 1-D parameter) -> q.idx, an i32 tensor (false: none).
-- Several ranks take rank 0's in one broadcast (as DeepSpeed broadcasts the selecting rank's): they
-- ranked the same all-reduced sums, and a selection that differed would part the replicas for good.
function ZF:set_selection(tops)
  local all, at = {}, {}
  for i, q in ipairs(self.p) do
    at[i] = #all
    for _, j in ipairs(tops[i] or {}) do all[#all + 1] = j end
  end
  local t = #all > 0 and C.tensor(all, { dtype = "i32" }):to(self.red:device())
  if t and self.W > 1 then dist.broadcast(t, 0) end
  for i, q in ipairs(self.p) do
    if not q.two then q.idx = nil
    else q.idx = q.k > 0 and t:narrow(1, at[i] + 1, q.k):clone() or false end
  end
end

-- q's gradient of this micro-step alone, f32 and reduced over the ranks (a temporary, or .grad itself).
function ZF:own_grad(q)
  local g, tmp = grad_of(q), q.prev_full ~= nil -- (g - prev_full: a temporary)
  if tmp then g = g - q.prev_full end
  if g:dtype() ~= "f32" then g, tmp = g:to("f32"), true end -- several ranks: .grad in the weights' dtype
  return self:reduced(g:contiguous(), tmp)
end

-- After backward of micro-step t (boundary: whether the engine's step will run the CPU update).
function ZF:after_backward(t, boundary)
  local measure = self.auto and t >= self.warm
  local own = {}
  if self.selecting or measure then -- from the micro-step's gradient reduced over the ranks
    for i, q in ipairs(self.p) do
      if q.two and self.selecting and q.k > 0 or measure and measured(q) and not self.keep_last then
        own[i] = self:own_grad(q)
      end
    end
  end
  if self.selecting then
    local tops = {}
    for i, q in ipairs(self.p) do
      if q.two and q.k > 0 then tops[i] = self:top_columns(q, own[i]) end
    end
    self:set_selection(tops)
    self.selecting = false
  end
  for _, q in ipairs(self.p) do
    if q.prev_full and q.idx ~= false then q.prev = self:gather(q, q.prev_full) end
    q.prev_full = nil
  end
  self.fresh = false
  if t < self.warm then return end
  self:reduce_selected()
  if measure then self:judge(t, own, boundary) end
  if boundary then -- keep the selected values: the CPU update must not change them
    for _, q in ipairs(self.p) do
      if q.idx ~= false then q.temp = self:gather(q, q.t) end
    end
  else
    self:update()
  end
end

-- update_interval "auto" (DeepSpeed's _process_selected_fp32_groups_grad): each 2-D weight with more
-- than one row compares the mass of this window's unselected gradient with a running mean of its
-- selected columns' (sums of |g| of micro-step t's reduced gradient own[i] and of q.gs); when at least
-- floor(auto_ratio x the non-1-D parameters) say "enough", need[parity of t] is set and micro-step
-- t+1 ends the window. Sums in double; several ranks take rank 0's verdict. One rank: the micro-step's
-- gradient is .grad - q.last (q.last: .grad after micro-step t-1, none after a host update), and
-- q.last takes .grad unless t ends the window (boundary: the next micro-step starts from zero).
function ZF:judge(t, own, boundary)
  local sums = self.sums
  sums:zero_()
  if self.keep_last and self.had_prev and self.last_t ~= t - 1 and self.last_t ~= t then
    error(fmt("zenflow: internal: micro-step %d's gradient sum was not kept for micro-step %d", t - 1, t), 0)
  end
  local list = {} -- {slot, a, prev|nil, have_prev, keep}: every sum in one call (on CUDA one pass, two launches)
  for i, q in ipairs(self.p) do
    if measured(q) then
      if self.keep_last then
        local g = grad_of(q)
        if not q.last then
          q.last = C.empty(g:numel(), { device = g:device() })
          q.last:category("grads")
        end
        list[#list + 1] = { 2 * i - 1, g, q.last, self.had_prev, not boundary }
      else
        list[#list + 1] = { 2 * i - 1, own[i] }
      end
      if q.gs then list[#list + 1] = { 2 * i, q.gs } end
    end
  end
  C.zenflow_absdiff_sums(sums, list)
  self.last_t = not boundary and t or nil
  self.pending = { t = t, win = self.win }
  if not self.keep_last then self:settle() end -- several ranks: the verdict's broadcast now, on every rank alike
end

-- The verdict of the micro-step judged last (ZF:judge queued its sums): the sums read back, which waits for
-- the GPU, and the rule run. One rank leaves this to the first reader (is_boundary in the next micro-step's
-- backward, once its forward is queued), so that the GPU is not idle while the host issues the selective
-- update and the next forward.
function ZF:settle()
  local p = self.pending
  if not p then return end
  self.pending = nil
  local t = p.t
  local s = self.sums:to("cpu"):flat_table()
  local count, seen, U, r = 0, false, p.win, self.topk
  self.stats = { t = t, win = U, total = {}, crit = {} }
  for i, q in ipairs(self.p) do
    if measured(q) then
      local total, crit = s[2 * i - 1], s[2 * i]
      q.avg = (q.avg * (U - 1) + crit) / U / (r * 10)
      q.non = q.non + (total - crit) / ((1 - r) * 10)
      if q.non >= q.avg then count = count + 1 end
      seen = true
      self.stats.total[i], self.stats.crit[i] = total, crit
    end
  end
  local need = seen and count >= floor(self.ratio * self.counted)
  if self.W > 1 then
    local v = C.tensor({ need and 1 or 0 }, { dtype = "i32" }):to(self.red:device())
    dist.broadcast(v, 0)
    need = v:to("cpu"):flat_table()[1] == 1
  end
  self.need[t % 2 + 1], self.stats.need = need, need
end

-- update_interval "auto": the statistic of the micro-step judged last ({t, win, total = {}, crit = {}, need}).
function ZF:statistics()
  self:settle()
  return self.stats
end

-- This micro-step's gradient of the selected columns (the 1-D parameters' whole), reduced over the
-- ranks in one all-reduce of self.red: q.gs (rows, k), a view into it.
function ZF:reduce_selected()
  for _, q in ipairs(self.p) do
    if q.idx ~= false then
      q.gs = self.red:narrow(1, q.off + 1, q.rows * q.k)
      local g = grad_of(q)
      if g:dtype() == "f32" then C.zenflow_gather(q.gs, g, q.idx)
      else q.gs:copy_(self:gather(q, g)) end -- several ranks: .grad in the weights' dtype, widened
      if q.prev then q.gs:add_(q.prev:dtype() == "f32" and q.prev or q.prev:to("f32"), -1) end
    end
    q.prev = nil
  end
  self:reduced(self.red, true)
end

-- AdamW on every selected column and 1-D parameter with this micro-step's reduced gradient q.gs.
function ZF:update()
  self.steps = self.steps + 1
  local e, lrs = self.e, self.lr
  for i, q in ipairs(self.p) do
    if q.idx ~= false then
      local lr = type(lrs) == "table" and lrs[i] or lrs
      local m, v = q.m, q.v
      if q.away then m, v = m:to(q.t:device()), v:to(q.t:device()) end -- offload: one weight's at a time
      C.zenflow_adamw(q.t, q.gs, q.idx, m, v, lr, e.hp.betas[1], e.hp.betas[2], e.hp.eps, e.hp.weight_decay,
        self.steps)
      if q.away then q.m:copy_(m); q.v:copy_(v) end
    end
    q.gs = nil
  end
end

-- engine:step's start: the selected columns' learning rate becomes the optimizer's (DeepSpeed's
-- _sync_selective_optimizer_lr; non-boundary micro-steps update during backward, with the last one).
function ZF:sync_lr(lrs) self.lr = lrs end

-- engine:step at micro-step t, after the CPU update of a boundary: the selected columns get their
-- saved values back, then their own update.
function ZF:after_cpu_step(t)
  self.fresh = true
  if t < self.warm then return end
  for _, q in ipairs(self.p) do
    if q.temp then C.zenflow_scatter(q.t, q.temp, q.idx); q.temp = nil end
  end
  self:update()
end

-- The background host step's OpenMP threads: DeepSpeed reserves ceil(perc x n) of the n cores for
-- training and gives the optimizer the rest; when that leaves either side empty both use all n.
function M.host_threads(perc, n)
  n = n or C.build_info().omp_threads
  local pt = math.ceil((perc or 0) * n)
  if pt > 0 and pt < n then return n - pt end
  return n
end

-- overlap_step: engine:step's host update at boundary t (coef: the gradients' scale with clipping).
-- Warm-up (t < W) waits for it at once; after it, the update of the last window reaches the
-- parameters now (not at the first boundary after warm-up: nothing is in flight) and this window's
-- starts on a background thread, with moment set (t < W and t or t // U) % 2, as DeepSpeed's
-- (update_interval "auto": (t + 1) % 2, the parity DeepSpeed's zenflow_state holds after t's backward).
function ZF:host_step(coef, t, lrs)
  local z, hp = self.e.zero, self.e.hp
  local set = (t < self.warm and t or self.auto and t + 1 or floor(t / self.U)) % 2
  if t >= self.warm then
    if self.first_after_warm then self.first_after_warm = false else z:async_apply() end
  end
  z:step_async(coef, t + 1, lrs, hp.betas[1], hp.betas[2], hp.eps, hp.extra, set, self.threads)
  if t < self.warm then z:async_apply() end
end

-- overlap_step: runs fn() with the parameters as the next boundary would leave them: the host update
-- in flight joined and its new weights applied to every column except the selected ones and the 1-D
-- parameters (those keep their values, as at a boundary); then the parameters and the pending update
-- are put back, so training goes on unchanged. save_16bit_model writes the model this way (DeepSpeed
-- writes the parameters as they are, one host window behind). Without an update pending: fn().
-- Collective (the new weights are all-gathered over the ranks).
function ZF:with_host_update(fn)
  local z = self.e.zero
  if not self.overlap then return fn() end
  z:async_wait()
  if not z:async_pending() then return fn() end
  local keep = {}
  for i, q in ipairs(self.p) do keep[i] = q.t:detach():clone() end
  z:async_apply()
  for i, q in ipairs(self.p) do
    if q.idx == nil then q.t:detach():copy_(keep[i])
    elseif q.idx then C.zenflow_scatter(q.t, self:gather(q, keep[i]), q.idx) end
  end
  local ok, err = pcall(fn)
  for i, q in ipairs(self.p) do q.t:detach():copy_(keep[i]) end
  z:set_async_pending(true)
  if not ok then error(err, 0) end
end

M.intervals = intervals
return M
