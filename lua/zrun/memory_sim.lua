-- The memory simulator behind zr.memory.plan: a model of the autograd tape (storages with
-- reference counts, values as views, nodes with their saved storages, Lua frames and garbage)
-- and a replay of the Llama forward and backward on it, op by op as runtime/ops/*.c and the
-- CUDA ops allocate. llama_activations(cfg, o) returns the peaks by category; o.trace prints
-- the simulated timeline in zr.memory.trace's format (tests/bench/memtrace_llama.lua).
local M = {}
local floor, ceil, max = math.floor, math.ceil, math.max

-- ---------------------------------------------------------------------------------------------
-- A model of the autograd tape. Storages carry bytes and a reference count; values are views of
-- storages with a contiguity flag; nodes keep their inputs' producers and saved storages.
-- Lua's side is a stack of frames (the locals of the running Lua functions) and a list of
-- garbage (userdata nothing references, alive until the collector runs).
-- ---------------------------------------------------------------------------------------------
local Sim = {}
Sim.__index = Sim

local function new_sim(o)
  return setmetatable({ o = o, cur = { act = 0, grads = 0, ws = 0, params = 0, other = 0 },
    peak = { act = 0, grads = 0, ws = 0, params = 0, other = 0 }, frames = { {} }, garbage = {}, wpeak = 0, ops = {}, live = 0,
    total = 0, total_peak = 0, total_peak_in = "forward", at_peak = {} }, Sim)
end

-- Each category's own peak, and the peak of their sum (every byte the step has live at once)
-- with where it happened: the time-line the plan adds the model states to.
function Sim:count(cat, b)
  local c = self.cur[cat] + b
  self.cur[cat] = c
  if c > self.peak[cat] then self.peak[cat] = c end
  if cat == "act" and c > self.wpeak then self.wpeak = c end
  local t = self.total + b
  self.total = t
  if t > self.total_peak then
    self.total_peak, self.total_peak_in = t, self.in_bwd and "backward" or "forward"
    local at = self.at_peak -- each category's bytes at that moment
    for k, v in pairs(self.cur) do at[k] = v end
  end
end
-- o.trace: the simulated timeline in the format of zr.memory.trace (ZRUN_MEM_TRACE) lines.
function Sim:trace(phase, name)
  if not self.o.trace then return end
  io.stderr:write(("[memplan]  %s %-18s act %10.2f peak %10.2f params %10.4f\n"):format(phase, name,
    self.cur.act / 2 ^ 20, self.wpeak / 2 ^ 20, self.cur.params / 2 ^ 20))
  self.wpeak = self.cur.act
end
function Sim:alloc(bytes, cat)
  local s = { bytes = bytes, refs = 1, cat = cat or "act" }
  self:count(s.cat, bytes)
  return s
end
function Sim:retain(s) s.refs = s.refs + 1 end
function Sim:release(s)
  s.refs = s.refs - 1
  if s.refs == 0 then self:count(s.cat, -s.bytes) end
end

-- a new contiguous value (owning one reference)
function Sim:new(bytes, cat) return { s = self:alloc(bytes, cat), n = bytes, c = true } end
function Sim:share(v, contig)
  self:retain(v.s)
  return { s = v.s, n = v.n, c = contig == nil and v.c or contig }
end
function Sim:drop(v) if v then self:release(v.s) end end
-- zr_tensor_to_raw / zr_cpu_in: the same storage when contiguous, else a contiguous copy
function Sim:raw(v)
  if v.c then return self:share(v, true) end
  return self:new(v.n, v.s.cat)
end

-- An op output handed to Lua: a local of the running function (its userdata keeps it alive).
-- Its serial orders the handles as lua/bind_handle.c does (Sim:end_scope).
function Sim:lua(v)
  local f = self.frames[#self.frames]
  f[#f + 1] = v
  if not v.serial then
    self.serial = (self.serial or 0) + 1
    v.serial = self.serial
  end
  return v
end
-- The serial the next handle gets (C.handle_serial) and the release of a scope's handles
-- (C.release_since: zr.checkpoint's segments, the models' forwards): every Lua value made since,
-- in a frame or garbage, except keep[v] and the pinned ones (zr.persist), is freed now.
function Sim:scope() return (self.serial or 0) + 1 end
function Sim:end_scope(serial, keep)
  keep = keep or {}
  local function gone(v) return v.serial and v.serial >= serial and not keep[v] and not v.pinned end
  local g = {}
  for _, v in ipairs(self.garbage) do if gone(v) then self:drop(v) else g[#g + 1] = v end end
  self.garbage = g
  for _, f in ipairs(self.frames) do
    for i = #f, 1, -1 do if gone(f[i]) then self:drop(table.remove(f, i)) end end
  end
end
-- A value nothing in Lua references any more: freed now ("ideal") or at the next collection.
function Sim:unref(v)
  if self.o.gc == "ideal" then self:drop(v) else self.garbage[#self.garbage + 1] = v end
end
-- `local x = ...; x = other`: the old value leaves the running function's frame; now: it was
-- never Lua's (an intermediate an op made and released inside C), so it goes at once; "keep": the caller moves it.
function Sim:forget(v, now)
  local f = self.frames[#self.frames]
  for i = #f, 1, -1 do
    if f[i] == v then
      table.remove(f, i)
      if now == "keep" then return end -- (moved elsewhere by the caller)
      if now then self:drop(v) else self:unref(v) end
      return
    end
  end
end
-- A Lua function starts / returns `ret` (which moves to the caller's frame); its locals die.
function Sim:push() self.frames[#self.frames + 1] = {} end
function Sim:pop(ret, ret2)
  local f = table.remove(self.frames)
  for _, v in ipairs(f) do if v ~= ret and v ~= ret2 then self:unref(v) end end
  if ret then self:lua(ret) end
  if ret2 then self:lua(ret2) end
  return ret
end
-- A full collection (collectgarbage("collect") / lua_gc(LUA_GCCOLLECT)): all garbage is freed.
function Sim:collect()
  for _, v in ipairs(self.garbage) do self:drop(v) end
  self.garbage = {}
end
-- engine:backward's C.collect_tensor_garbage (gc = "backward"; "none": nothing collects during a
-- step): a full collection when it could free more than 1/256 of the bytes live on the device
-- (o.states_bytes: the model states the plan adds to the simulated bytes): the bytes of storages
-- that only Lua values (live or garbage) hold, pinned ones (zr.persist's caches) aside.
function Sim:gc_point()
  if self.o.gc ~= "backward" then return end
  local holders, seen, pinned, bytes = {}, {}, {}, 0
  local function count(v)
    holders[v.s] = (holders[v.s] or 0) + 1
    if v.pinned then pinned[v.s] = true end
  end
  for _, v in ipairs(self.garbage) do count(v) end
  for _, f in ipairs(self.frames) do for _, v in ipairs(f) do count(v) end end
  for st, n in pairs(holders) do
    if n == st.refs and not seen[st] and not pinned[st] then seen[st] = true; bytes = bytes + st.bytes end
  end
  if bytes > (self.total + (self.o.states_bytes or 0)) / 256 then self:collect() end
end

-- ZeRO-3: a module's parameters are gathered (16-bit, full size) while it runs and during its
-- backward; `keep` (the embedding, whose input needs no gradient, and a tied LM head fetched
-- outside its module) stays gathered until backward ends.
-- Prefetch (engine.lua, zero.c): once a module's parameters are gathered, the all-gathers of
-- the modules after it (in forward; before it in backward, from the module boundary nodes) start
-- straight into their storage while the elements started are below stage3_prefetch_bucket_size and
-- below stage3_max_live_parameters minus the live ones (the one crossing starts too, as in
-- DeepSpeed); recomputation inside backward does not.
-- A module's bias (W.bias, a leaf of its own: persistent by its own size) is gathered and released with its weight;
-- the chain runs from the module's last parameter on (first one back).
function Sim:gather(W, in_backward, no_prefetch)
  if not self.o.stage3 or W.leaf.frozen then return end -- (a frozen base is no ZeRO parameter: nothing to gather)
  for _, leaf in ipairs { W.leaf, W.bias and W.bias.leaf } do
    if not leaf.gathered and not leaf.persistent then
      leaf.gathered = true
      self.live = self.live + leaf.numel
      self:count("params", leaf.bytes)
    end
  end
  local order, budget = self.order, self.o.prefetch or 0
  if no_prefetch or budget <= 0 or not order or (self.in_bwd and not in_backward) then return end
  local step = in_backward and -1 or 1
  local k = order.pos[in_backward and W.leaf or (W.bias or W).leaf]
  local list, total = {}, 0 -- the modules along the chain, up to the budget (engine.lua's chain)
  k = k + step
  while order[k] and total < budget do
    list[#list + 1] = order[k]
    total = total + order[k].numel
    k = k + step
  end
  -- zr_zero_prefetch: while the elements started are below min(budget, max_live - live) (DeepSpeed's
  -- rule: the one crossing the bound starts too)
  local limit, started = math.min(budget, (self.o.max_live or 1e18) - self.live), 0
  for _, leaf in ipairs(list) do
    if not leaf.gathered and not leaf.persistent then
      if started >= limit then break end
      started = started + leaf.numel
      leaf.gathered = true
      self.live = self.live + leaf.numel
      self:count("params", leaf.bytes)
    end
  end
end
-- After a module's forward (engine.lua) its parameters stay when their next use, its backward,
-- comes within stage3_max_reuse_distance (twice the parameters of the modules after it) and the
-- live ones are within stage3_max_live_parameters; its backward releases them.
function Sim:release_param(W, after_forward)
  if not self.o.stage3 or W.leaf.frozen or W.leaf.keep then return end
  local order = self.order
  if after_forward and order and not self.in_bwd and self.grad_on ~= false and
    2 * order.after[order.pos[(W.bias or W).leaf]] < (self.o.max_reuse or 0) and self.live <= (self.o.max_live or 1e18) then
    return
  end
  for _, leaf in ipairs { W.leaf, W.bias and W.bias.leaf } do
    if leaf.gathered and not leaf.persistent then
      leaf.gathered = false
      self.live = self.live - leaf.numel
      self:count("params", -leaf.bytes)
    end
  end
end

-- Whether value v needs a gradient: made by a recorded node, or a trained parameter (a frozen one, LoRA's
-- base, gets none).
local function needs(v) return v and (v.node ~= nil or (v.leaf ~= nil and not v.leaf.frozen)) or false end
M.needs = needs

-- Records a node: out.node = node; inputs are values (with .node or .leaf) or nil. As zr_autograd_record,
-- nothing is recorded (nor saved) when no input needs a gradient (a frozen base's ops before the first
-- adapter), unless `always` (zr.checkpoint's zr_autograd_record_always).
function Sim:record(out, inputs, saved, bwd, always)
  local name = self.ops[#self.ops] or "?"
  if self.grad_on == false then self:trace("nograd", name); return out end -- nothing recorded or saved
  local any = always
  for i = 1, #inputs do if needs(inputs[i]) then any = true end end
  if not any then self:trace("nograd", name); return out end
  self:trace("fwd", name)
  local n = { inputs = inputs, saved = {}, bwd = bwd, name = name }
  for _, v in ipairs(saved or {}) do
    self:retain(v.s)
    n.saved[#n.saved + 1] = v.s
  end
  self.tape[#self.tape + 1] = n
  out.node = n
  return out
end

-- Adds g into a pending gradient slot (autograd's accumulate_node: a new sum, then both freed).
function Sim:accumulate(node, g)
  if not node.slot then node.slot = g; return end
  local s = self:new(g.n)
  self:drop(node.slot)
  self:drop(g)
  node.slot = s
end

-- A GPU backward writing its input's gradient into the producer's pending one
-- (zr_node_input_grad_buffer: created when absent, added into in place when this is its only
-- reference, else replaced by a private copy first). Returns nothing to accumulate.
function Sim:grad_into(node, bytes)
  local s = node.slot
  if not s then node.slot = self:new(bytes); return end
  if s.s.refs > 1 then node.slot = self:new(bytes); self:drop(s) end
end

-- A parameter's gradient arriving (zr_accumulate_leaf_grad, then the ZeRO hook).
function Sim:leaf_grad(leaf, g)
  if leaf.frozen then self:drop(g); return end
  if g then
    if leaf.static then -- stages 0-1: fp32 .grad preallocated, added into in place
    elseif not leaf.grad then leaf.grad = self:alloc(leaf.bytes, "grads") end
    self:drop(g)
  end
  leaf.pending = leaf.pending - 1
  if leaf.pending == 0 and leaf.param and leaf.grad then -- hook: packed into the bucket, freed
    self:release(leaf.grad)
    leaf.grad = nil
  end
end

-- Runs backward over `tape` from root node with gradient g (zr_backward).
function Sim:backward(tape, root, g)
  for _, n in ipairs(tape) do
    for i = 1, #n.inputs do local v = n.inputs[i]; if v and v.leaf then v.leaf.pending = 0 end end
  end
  for _, n in ipairs(tape) do
    for i = 1, #n.inputs do local v = n.inputs[i]; if v and v.leaf then v.leaf.pending = v.leaf.pending + 1 end end
  end
  root.slot = g
  local was = self.in_bwd
  self.in_bwd = true
  for k = #tape, 1, -1 do
    local n = tape[k]
    local gk = n.slot
    n.slot = nil
    if gk then
      local gins = n.bwd(self, n, gk) or {}
      for i = 1, #n.inputs do
        local v, gi = n.inputs[i], gins[i]
        if v and v.node then
          if gi then self:accumulate(v.node, gi) end
        elseif v and v.leaf then self:leaf_grad(v.leaf, gi)
        elseif gi then self:drop(gi) end
      end
      self:drop(gk)
    else
      for i = 1, #n.inputs do local v = n.inputs[i]; if v and v.leaf then self:leaf_grad(v.leaf, nil) end end
    end
    for _, s in ipairs(n.saved) do self:release(s) end
    n.saved = {}
    self:trace("bwd", n.name)
  end
  self.in_bwd = was
end

-- ---------- ops, as runtime/ops/*.c allocate them on the CPU path ----------

-- linear: out (rows, o); saves x (and the weight, a parameter); backward dx, dW.
-- At stage 3 its module gathers W around the forward and around the backward.
function Sim:linear(x, W, o_bytes)
  self:gather(W)
  local out = self:lua(self:new(o_bytes))
  self:release_param(W, true)
  return self:record(out, { x, W }, { x }, function(S, _, g)
    S:gather(W, true)
    local gi = S:raw(g)
    -- on a GPU dX goes into x's pending gradient (ops/matmul.c: beta 1 when one is there)
    -- (only the gradients needed: none for an input that needs none, nor for a frozen weight)
    local dx
    if not needs(x) then elseif S.o.gpu and x.node then S:grad_into(x.node, x.n) else dx = S:new(x.n) end
    -- on a GPU with the gradients as views into the fp32 partition (ZeRO direct mode), dW is
    -- accumulated straight into it by the GEMM (ops/matmul.c): no 16-bit temporary
    local dw = not S.o.dw_in_place and not W.leaf.frozen and S:new(W.leaf.bytes) or nil
    S:drop(gi)
    S:release_param(W)
    return { dx, dw }
  end)
end

-- zr.linear_multi (ops/linear_multi.c): one output for several weights (their columns side by
-- side); saves x; backward dx, and dW per weight, except with the gradients as views into the
-- fp32 partition (ZeRO direct mode, CPU or GPU), where the GEMM writes them in place (one GEMM
-- over the spanning region). At stage 3 Module.call_group runs the modules' hooks around it:
-- each weight gathered in turn before the product and released after it; in backward the
-- boundary nodes gather them last module first, and release them after the product's backward.
function Sim:linear_multi(x, Ws, o_bytes)
  for _, W in ipairs(Ws) do self:gather(W) end
  local out = self:lua(self:new(o_bytes))
  for _, W in ipairs(Ws) do self:release_param(W, true) end
  local inputs = { x }
  for i, W in ipairs(Ws) do inputs[i + 1] = W end
  return self:record(out, inputs, { x }, function(S, _, g)
    for i = #Ws, 1, -1 do S:gather(Ws[i], true) end
    local gi = S:raw(g)
    local gins = { needs(x) and S:new(x.n) or nil }
    for i, W in ipairs(Ws) do gins[i + 1] = not S.o.direct and not W.leaf.frozen and S:new(W.leaf.bytes) or nil end
    S:drop(gi)
    for i = #Ws, 1, -1 do S:release_param(Ws[i]) end
    return gins
  end)
end

-- zr.qkv_rope (ops/qkv_rope.c): q, k, v are views of one new buffer (each contiguous, or, when
-- the Hopper attention kernels read strided operands, transposed head slices of a (B, T, heads,
-- D) buffer); the CPU kernel reads x through zr_cpu_in. In backward the first part whose gradient
-- arrives creates x's one gradient buffer (the producer's pending gradient); the parts' gradients
-- wait there until the producer's backward reads it, when one kernel writes the whole buffer.
-- tabs: the cos / sin tables the group keeps until its nodes are gone (the per-token ones of packed
-- sequences on the segments; nil: the model's cached tables, counted once)
function Sim:qkv_rope(x, parts, strided, tabs)
  local xi = not self.o.gpu and self:raw(x) or nil
  local buf, outs, held = self:alloc(x.n), {}, {}
  for i, bytes in ipairs(parts) do
    self:retain(buf)
    local out = self:lua({ s = buf, n = bytes, c = not strided })
    outs[i] = self:record(out, { x }, tabs, function(S, _, g)
      if not x.node.slot then x.node.slot = S:new(x.n) end
      S:retain(g.s)
      held[#held + 1] = g
      if i == 1 then -- q's node runs last, just before the producer's backward reads the buffer
        for _, h in ipairs(held) do S:drop(h) end
        held = {}
      end
      return {}
    end)
  end
  self:release(buf)
  self:drop(xi)
  return outs
end

-- zr.qkv_norm_rope on a GPU (ops/qkv_rope.c's fused kernels, head_dim 64 or 128): qkv_rope's one buffer and
-- three nodes, which keep x (the norms' backward reads it again; the group's one reference), (q, k) the
-- norm's weight and, on the segments, the per-token tables; backward: each part's columns written straight
-- into x's gradient buffer (made by the first part to arrive), for q and k the weight's gradient (its dtype)
-- and the kernel's per-block fp32 partial sums (kernels/cuda/qk_norm_rope.cu: at most 512 blocks of 8 warps, a warp
-- 512 / D head rows)
function Sim:qkv_norm_rope(x, parts, heads, strided, tabs, ws, N, D)
  local buf, outs = self:alloc(x.n), {}
  for i, bytes in ipairs(parts) do
    self:retain(buf)
    local out = self:lua({ s = buf, n = bytes, c = not strided })
    local w = ws[i]
    local saved = { x }
    if tabs then saved[2], saved[3] = tabs[1], tabs[2] end
    outs[i] = self:record(out, { x, w }, saved, function(S, _, g)
      if w then S:gather(w, true) end
      if needs(x) then S:grad_into(x.node, x.n) end
      local gi = S:share(g)
      local dw
      if w and not w.leaf.frozen then
        dw = S:new(w.leaf.bytes)
        S:drop(S:new(math.min(ceil(N * heads[i] / (8 * 512 / D)), 512) * D * 4, "ws"))
      end
      S:drop(gi)
      if w then S:release_param(w) end
      return { nil, dw }
    end)
  end
  self:release(buf)
  return outs
end

-- (x non-contiguous, Qwen3's q and k heads in the q/k/v product: read through a contiguous copy, made after
-- the output and the statistics and freed when the op returns, in forward and again in backward)
-- (unit: Gemma's (1 + w), which the CPU op makes as an f32 copy of the weight while it runs, forward and backward)
function Sim:rms_norm(x, w, rows, unit)
  local w1 = unit and not self.o.gpu and w.leaf.numel * 4
  self:gather(w)
  local out = self:lua(self:new(x.n))
  local rstd = self:new(rows * 4)
  local xr = self:raw(x)
  if w1 then self:drop(self:new(w1, "ws")) end
  self:drop(xr)
  self:release_param(w, true)
  self:record(out, { x, w }, { x, rstd }, function(S, _, g)
    S:gather(w, true)
    local gi = S:raw(g)
    local xi = S:raw(x)
    local wi = w1 and S:new(w1, "ws")
    -- on a GPU dx goes into x's pending gradient (ops/norm.c: the kernel adds what is there)
    local dx
    if not needs(x) then elseif S.o.gpu and x.node then S:grad_into(x.node, x.n) else dx = S:new(x.n) end
    -- the CUDA kernel's in the weight's dtype; with the gradients as views into the fp32
    -- partition (ZeRO direct mode) written into it by the kernel (ops/norm.c, as linear's dW)
    local frozen = w.leaf.frozen
    local dw = not S.o.dw_in_place and not frozen and S:new(S.o.gpu and w.leaf.bytes or w.leaf.numel * 4) or nil
    -- the CUDA kernel's per-block fp32 partial sums of dw (kernels/cuda/norm.cu:
    -- rmsnorm_backward_workspace_size, at most 512 blocks)
    if S.o.gpu and not frozen then S:drop(S:new(math.min(rows, 512) * 2 * w.leaf.numel * 4, "ws")) end
    S:drop(wi)
    S:drop(xi)
    S:drop(gi)
    S:release_param(w)
    return { dx, dw }
  end)
  self:drop(rstd)
  return out
end

function Sim:view(x) -- zr view/reshape of a contiguous tensor: no copy; backward to_input
  local out = self:lua({ s = x.s, n = x.n, c = x.c, strided = x.strided })
  self:retain(x.s)
  return self:record(out, { x }, nil, function(S, _, g) return { S:raw(g) } end)
end
function Sim:reshape(x)
  if x.c then return self:view(x) end
  local out = self:lua(self:new(x.n))
  return self:record(out, { x }, nil, function(S, _, g) return { S:raw(g) } end)
end
function Sim:transpose(x) -- (a strided split part stays non-contiguous)
  self:retain(x.s)
  local out = self:lua({ s = x.s, n = x.n, c = not x.c and not x.strided, strided = x.strided })
  return self:record(out, { x }, nil, function(S, _, g) return { S:share(g, not g.c) } end)
end
function Sim:narrow(x, bytes, contig)
  self:retain(x.s)
  local out = self:lua({ s = x.s, n = bytes, c = contig })
  return self:record(out, { x }, nil, function(S, _, g)
    local z = S:new(x.n)
    local gc = S:raw(g)
    S:drop(gc)
    return { z }
  end)
end
-- zr.split (ops/view.c): views of x (not contiguous: parts of the last dim); in backward the first part whose
-- gradient arrives makes x's producer's one gradient buffer, each part's gradient copied into its slice
function Sim:split(x, parts)
  local outs = {}
  for i, bytes in ipairs(parts) do
    self:retain(x.s)
    outs[i] = self:record(self:lua({ s = x.s, n = bytes, c = false }), { x }, nil, function(S)
      if x.node and not x.node.slot then x.node.slot = S:new(x.n) end
      return {}
    end)
  end
  return outs
end
function Sim:cast(x, bytes) -- x:float(): a copy; backward casts the gradient back
  local out = self:lua(self:new(bytes))
  return self:record(out, { x }, nil, function(S, _, g) return { S:new(x.n) } end)
end

-- kernels/cuda/attention.cu: attention_backward_workspace_size (fp32 dq accumulator, the dO.O row
-- sums and the scaled lse, and per-split fp32 dk/dv partials when the query group is split across
-- blocks)
local function split(blocks, G, limit)
  local ns = 1
  while G % (ns * 2) == 0 and blocks * ns < limit do ns = ns * 2 end
  return ns
end
local function attention_workspace(B, Hq, Hkv, T, Dh)
  local G = Hq / Hkv
  local ns = max(split(B * Hkv * ceil(T / 64), G, 512), split(B * Hkv * ceil(T / 128), G, 200))
  local a16 = function(n) return ceil(n / 16) * 16 end
  local Dc = Dh <= 64 and 64 or Dh == 256 and 256 or 128 -- the accumulators' width (128 at a narrow head_dim)
  local n = a16(B * Hq * T * Dc * 4) + 2 * a16(B * Hq * T * 4)
  if ns > 1 then n = n + 2 * ns * B * Hkv * T * Dc * 4 end
  return n
end

-- The f32 composition that CUDA runs where the flash kernel does not take the shape (ops/attention.c
-- sdpa_composed: f32, or a head_dim the flash kernels do not run, M.flash_dim): differentiable ops (to f32, GQA
-- repeat, matmul, scale, causal mask, softmax, matmul, back to the input dtype) that materialise
-- the (B, Hq, T, T) scores; every intermediate is held until the op returns.
function Sim:sdpa_composed(q, k, v, shape)
  local B, Hq, KV, T, D = unpack(shape)
  local b = self.o.dtype_bytes
  local nq, nk, tt = B * Hq * T * D * 4, B * KV * T * D * 4, B * Hq * T * T * 4
  local held = {} -- the op's own references, dropped when it returns
  local function hold(x) held[#held + 1] = x; return x end
  local function alias(x) -- zr_tensor_retain: the same tensor (its node too)
    self:retain(x.s)
    return { s = x.s, n = x.n, c = x.c, node = x.node, leaf = x.leaf }
  end
  local function to_raw(S, _, g) return { S:raw(g) } end -- view/reshape backward: to_input
  local function view(x, n, contig, bwd) -- a view node (no copy)
    self:retain(x.s)
    return self:record({ s = x.s, n = n or x.n, c = contig }, { x }, nil, bwd or to_raw)
  end
  local function copy(x, n) -- zr_reshape of a non-contiguous tensor: a contiguous copy
    return self:record(self:new(n or x.n), { x }, nil, to_raw)
  end
  local function to(x, n) -- zr_to: a copy in the other dtype; backward casts the gradient back
    return self:record(self:new(n), { x }, nil, function(S) return { S:new(x.n) } end)
  end
  local QF = hold(b == 4 and alias(q) or to(q, nq))
  local KF = hold(b == 4 and alias(k) or to(k, nk))
  local VF = hold(b == 4 and alias(v) or to(v, nk))
  -- (B, KV, T, D) -> (B, KV, 1, T, D) -> expanded (B, KV, G, T, D) -> a (B, Hq, T, D) copy; the
  -- expand's backward sums over the group (zr_sum_to_shape: a permuted contiguous copy, then the sum)
  local function repeat_kv(x)
    local a = x.c and view(x, nil, true) or copy(x)
    local e = view(a, nq, false, function(S, _, g)
      local rows = S:new(g.n)
      local r = S:new(a.n)
      S:drop(rows)
      return { r }
    end)
    local r = copy(e, nq)
    self:drop(a)
    self:drop(e)
    return r
  end
  local KR, VR
  if Hq ~= KV then KR, VR = hold(repeat_kv(KF)), hold(repeat_kv(VF))
  else KR, VR = hold(alias(KF)), hold(alias(VF)) end
  local KT = hold(view(KR, nil, false, function(S, _, g) return { S:share(g, not g.c) } end))
  local function matmul(a, bm, n_out, na, nb) -- saves both operands; backward dA then dB
    return self:record(self:new(n_out), { a, bm }, { a, bm }, function(S) return { S:new(na), S:new(nb) } end)
  end
  local Sc = hold(matmul(QF, KT, tt, nq, nq))
  local SS = hold(self:record(self:new(tt), { Sc }, nil, function(S) return { S:new(tt) } end)) -- zr_affine
  local ar = self:new(T * 4, "other") -- arange(T), compared into the (T, T) u8 mask
  local M = hold(self:new(T * T))
  self:drop(ar)
  local sv = self:new(4, "other") -- the fill value, a device scalar
  local SM = hold(self:record(self:new(tt), { SS }, { M }, function(S)
    local z = S:new(4, "other")
    local w = S:new(tt)
    S:drop(z)
    return { w }
  end))
  self:drop(sv)
  local P = self:new(tt)
  hold(self:record(P, { SM }, { P }, function(S) return { S:new(tt) } end)) -- softmax saves its output
  local O = hold(matmul(P, VR, nq, tt, nq))
  local out = b == 4 and alias(O) or to(O, B * Hq * T * D * b)
  self:lua(out)
  for _, x in ipairs(held) do self:drop(x) end
  return out
end

-- A head_dim the flash kernels run on a GPU in 16 bits: 64, 128, 256 (the mma.sync kernels, contiguous operands),
-- or a multiple of 8 between 64 and 128: a multiple of 16 read in place by the Hopper kernels' 128-wide tiles
-- (M.narrow_dim; attn_sm90_narrow), the others zero-padded to 128 (M.padded_dim: ops/attention.c sdpa_padded). The
-- plan models a Hopper GPU.
function M.narrow_dim(D) return D > 64 and D < 128 and D % 16 == 0 end
function M.padded_dim(D) return D > 64 and D < 128 and D % 8 == 0 and not M.narrow_dim(D) end
function M.flash_dim(D) return D == 64 or D == 128 or D == 256 or M.narrow_dim(D) or M.padded_dim(D) end

-- ops/attention.c sdpa_padded: q, k, v copied into zero-padded (.., 128) tensors (kept), the 128-wide output (kept
-- whole: the op's output is a (.., D) view of it) and lse; backward pads dO (a copy), writes padded dq, dk, dv
-- beside the workspace, then each gradient is a compact copy of its first D columns.
function Sim:sdpa_padded(q, k, v, lse_bytes, shape, seg)
  local B, Hq, KV, T, D = unpack(shape)
  local pad = function(x) return x.n / D * 128 end
  local ins = { q, k, v }
  local p = { self:new(pad(q)), self:new(pad(k)), self:new(pad(v)) }
  local op = self:new(pad(q))
  local lse = self:new(lse_bytes)
  -- (a narrow view of the padded output: not contiguous either way round, so the transpose after it stays
  -- strided and the reshape copies)
  local out = self:lua({ s = op.s, n = q.n, c = false, strided = true })
  self:retain(op.s)
  self:record(out, ins, { p[1], p[2], p[3], op, lse, seg }, function(S, _, g)
    local gp = S:new(pad(q))
    local ws = S:new(attention_workspace(B, Hq, KV, T, 128), "ws")
    local dp = { S:new(pad(q)), S:new(pad(k)), S:new(pad(v)) }
    S:drop(gp)
    S:drop(ws)
    local d = {}
    for i, x in ipairs(ins) do
      d[i] = S:new(x.n)
      S:drop(dp[i])
    end
    return d
  end)
  for _, t in ipairs(p) do self:drop(t) end
  self:drop(op)
  self:drop(lse)
  return out
end

-- (seg: the segments of packed sequences, which the node keeps; nil: causal)
function Sim:sdpa(q, k, v, lse_bytes, gqa, shape, strided, seg)
  if self.o.gpu and self.o.dtype_bytes == 2 and M.padded_dim(shape[5]) then
    return self:sdpa_padded(q, k, v, lse_bytes, shape, seg)
  end
  if self.o.gpu and not (self.o.dtype_bytes == 2 and M.flash_dim(shape[5])) then
    return self:sdpa_composed(q, k, v, shape)
  end
  if self.o.gpu and strided then
    -- the Hopper kernels (ops/attention.c, head_dim 64, 128 or narrow, 16-bit): q, k, v read in place and kept
    -- as they are, unless a view pins a much larger buffer (a compact copy is kept then); the
    -- output is (B, T, H, D) memory seen transposed, each gradient in its input's layout, dO read
    -- in place; q, k, v that are views of one buffer (qkv_rope's) are judged together
    local one = q.s == k.s and k.s == v.s
    local function keep(x)
      if x.s.bytes > 2 * (one and q.n + k.n + v.n or x.n) then return self:new(x.n) end
      return self:share(x)
    end
    local saved = { keep(q), keep(k), keep(v) }
    local out = self:lua({ s = self:alloc(q.n), n = q.n, c = false })
    local lse = self:new(lse_bytes)
    local ins = { q, k, v }
    self:record(out, ins, { saved[1], saved[2], saved[3], out, lse, seg }, function(S, _, g)
      local gi = S:share(g)
      local ws = S:new(attention_workspace(unpack(shape)), "ws")
      local d = {}
      for i, x in ipairs(ins) do d[i] = { s = S:alloc(x.n), n = x.n, c = x.c } end
      S:drop(ws)
      S:drop(gi)
      return d
    end)
    for _, t in ipairs(saved) do self:drop(t) end
    self:drop(lse)
    return out
  end
  if self.o.gpu then -- the flash kernel (ops/attention.c): contiguous q, k, v are what it saves
    local ins = { self:raw(q), self:raw(k), self:raw(v) }
    local out = self:lua(self:new(q.n))
    local lse = self:new(lse_bytes)
    self:record(out, { q, k, v }, { ins[1], ins[2], ins[3], out, lse, seg }, function(S, _, g)
      local gi = S:raw(g)
      local ws = S:new(attention_workspace(unpack(shape)), "ws")
      local dq, dk, dv = S:new(q.n), S:new(k.n), S:new(v.n)
      S:drop(ws)
      S:drop(gi)
      return { dq, dk, dv }
    end)
    for _, t in ipairs(ins) do self:drop(t) end
    self:drop(lse)
    return out
  end
  local ins = { self:raw(q), self:raw(k), self:raw(v) }
  local out = self:lua(self:new(q.n))
  local lse = self:new(lse_bytes)
  for _, t in ipairs(ins) do self:drop(t) end
  self:record(out, { q, k, v }, { q, k, v, out, lse, seg }, function(S, _, g)
    local tmp = { S:raw(q), S:raw(k), S:raw(v), S:raw(out), S:raw(g) }
    local dq, dk, dv = S:new(q.n), S:new(k.n), S:new(v.n)
    local wk, wv
    if gqa then wk, wv = S:new(q.n, "ws"), S:new(q.n, "ws") end
    S:drop(wk); S:drop(wv)
    for _, t in ipairs(tmp) do S:drop(t) end
    return { dq, dk, dv }
  end)
  self:drop(lse)
  return out
end

-- zr.qkv_rope_sdpa on the Hopper kernels (ops/attention.c, head_dim 64, 128 or narrow, 16-bit): qkv_rope's forward
-- (q, k rotated, v copied into one new (B, T, H + 2 KV, D) buffer, x's size) and the attention
-- reading q, k, v there; the node keeps what qkv_rope + sdpa keep: that buffer, the output
-- ((B, T, H·D), o_proj's input as it is) and lse. Backward: dO read in place, the workspace, and
-- x's whole gradient as one new buffer (no q, k, v gradients of their own). Elsewhere
-- llama.lua's fused call is qkv_rope + sdpa + transpose + reshape, which the caller replays.
-- (keep: what else the node keeps, packed sequences' per-token cos, sin and segments; nil: none)
function Sim:qkv_rope_sdpa(x, o_bytes, lse_bytes, shape, keep)
  local r = self:new(x.n)
  local out = self:lua(self:new(o_bytes))
  local lse = self:new(lse_bytes)
  local saved = { r, out, lse }
  for _, t in ipairs(keep or {}) do saved[#saved + 1] = t end
  self:record(out, { x }, saved, function(S, _, g)
    local gi = S:raw(g)
    local ws = S:new(attention_workspace(unpack(shape)), "ws")
    local d = S:new(x.n)
    S:drop(ws)
    S:drop(gi)
    return { d }
  end)
  self:drop(r)
  self:drop(lse)
  return out
end

-- zr.embedding(x, idx) over a tensor's rows (zrun.models.packed's gather of a padding-free batch's rows into
-- a group, and back): a new (rows, W) output saving only the indices (persisted by the model: not counted
-- here); backward scatters into a dense gradient of x's size (on the CPU in f32, then cast to x's dtype)
function Sim:gather_rows(x, out_bytes)
  local b = self.o.dtype_bytes
  local out = self:lua(self:new(out_bytes))
  return self:record(out, { x }, nil, function(S, _, g)
    if S.o.gpu then
      local gi = S:raw(g)
      local gx = S:new(x.n)
      S:drop(gi)
      return { gx }
    end
    local gw = S:new(x.n / b * 4)
    local gi = S:raw(g)
    local c
    if b ~= 4 then c = S:new(x.n) end
    S:drop(gi)
    if c then S:drop(gw); return { c } end
    return { gw }
  end)
end

-- zr.where(mask, x:detach(), x) over x's rows (mask: one bool a row, kept by the node): a new tensor; backward x's
-- gradient, a new one
function Sim:where_rows(mask, x)
  local out = self:lua(self:new(x.n))
  return self:record(out, { x }, { mask }, function(S) return { S:new(x.n) } end)
end
-- x times a number (a new tensor; backward: a new gradient)
function Sim:scaled(x)
  local out = self:lua(self:new(x.n))
  return self:record(out, { x }, nil, function(S) return { S:new(x.n) } end)
end
function Sim:add(a, b)
  local out = self:lua(self:new(a.n))
  return self:record(out, { a, b }, nil, function(S, _, g) return { S:share(g), S:share(g) } end)
end
-- zr.add_rms_norm (ops/norm.c): the composition's allocations (h, then the norm's y and rstd) and
-- nodes (add, rms_norm), whether it ran as one kernel or not; at stage 3 the norm module's hooks
-- run around it (Module.call_group): the weight is gathered first
function Sim:add_rms_norm(x, r, w, rows, unit)
  self:gather(w)
  local h = self:add(x, r)
  return h, self:rms_norm(h, w, rows, unit)
end
-- zr.swiglu (ops/swiglu.c): silu(gate) * up in one op that saves only its inputs; with b nil,
-- the packed form: a holds gate and up side by side, backward one gradient of a's size
function Sim:swiglu(a, b)
  if not b then
    local out = self:lua(self:new(a.n / 2))
    return self:record(out, { a }, { a }, function(S, _, g)
      local gi = S:raw(g)
      local d = S:new(a.n)
      S:drop(gi)
      return { d }
    end)
  end
  local out = self:lua(self:new(a.n))
  return self:record(out, { a, b }, { a, b }, function(S, _, g)
    local gi = S:raw(g)
    -- (ops/swiglu.c: the CPU makes only the gradients needed; CUDA both, one it does not hand on as workspace,
    -- freed after the kernel)
    local d = {}
    for i, x in ipairs { a, b } do
      if needs(x) then d[i] = S:new(x.n) elseif S.o.gpu then d[i] = S:new(x.n, "ws") end
    end
    S:drop(gi)
    for i, x in ipairs { a, b } do
      if d[i] and not needs(x) then S:drop(d[i]); d[i] = nil end
    end
    return { d[1], d[2] }
  end)
end
-- At stage 3 the embedding's input (token ids) needs no gradient, so no node releases its
-- weight after its backward: it stays gathered until backward ends.
function Sim:embedding(ids, W, out_bytes, dt)
  self:gather(W)
  local out = self:lua(self:new(out_bytes))
  self:release_param(W, true)
  return self:record(out, { false, W }, { ids }, function(S, _, g)
    S:gather(W, true) -- no release: see above
    if S.o.gpu then -- the CUDA kernel writes the dense gradient in the weight's dtype directly
      local gi = S:raw(g)
      local gw = S:new(W.leaf.bytes)
      S:drop(gi)
      return { nil, gw }
    end
    -- into the gradient the table has in the compute dtype (f32): the stages' preallocated .grad, or a
    -- tied head's dW already there at stage 2
    if W.leaf.static or (W.leaf.grad and dt == 4) then
      S:drop(S:raw(g))
      return { nil, nil }
    end
    local gw = S:new(W.leaf.numel * 4)
    local gi = S:raw(g)
    local c
    if dt ~= 4 then c = S:new(W.leaf.bytes) end
    S:drop(gi)
    if c then S:drop(gw); return { nil, c } end
    return { nil, gw }
  end)
end

-- zr.checkpoint(fn, x): fn runs without recording; backward reruns it with grad on, backward
-- through the recomputed graph, and hands x's gradient (a leaf gradient, category grads) back.
-- lua/bind_checkpoint.c frees every handle the segment made right after the no-grad forward (only
-- its inputs and a fresh header over the output survive) and right after each segment's
-- recomputation + backward.
function Sim:checkpoint(x, fn)
  local saved_tape, saved_grad = self.tape, self.grad_on
  self.tape, self.grad_on = {}, false
  local serial = self:scope()
  local out = fn(x)
  self.tape, self.grad_on = saved_tape, saved_grad
  self:retain(out.s)
  self:end_scope(serial)
  local res = self:lua({ s = out.s, n = out.n, c = out.c }) -- a fresh header over out's storage
  -- (recorded even when x needs no gradient, as below LoRA's frozen embedding: the adapters inside need theirs)
  return self:record(res, { x }, { x }, function(S, _, g)
    local outer = S.tape
    S.tape = {}
    local rserial = S:scope()
    S:push() -- the arguments and result of the Lua call made from C
    local leaf = { bytes = x.n, pending = 0, frozen = not needs(x) } -- (layer 1's input under a frozen embedding)
    local xs = S:lua({ s = x.s, n = x.n, c = x.c, leaf = leaf }) -- detached input, handed to Lua
    S:retain(x.s)
    local y = fn(xs, true)
    local inner = S.tape
    S.tape = outer
    S:retain(g.s)
    S:backward(inner, y.node, { s = g.s, n = g.n, c = g.c })
    local gx = leaf.grad and { s = leaf.grad, n = x.n, c = true }
    -- the input's userdata holds its .grad until collected; the node hands on its own reference
    if gx then S:lua(S:share(gx)) end
    S:pop()
    S:end_scope(rserial)
    return { gx }
  end, true)
end

-- zr.rope (ops/rope.c) on the CPU, x a (B, H, T, D) view: a new contiguous output, x read through
-- zr_cpu_in (a transposed view: a contiguous copy, freed when the op returns); saves only the cos / sin
-- tables (the model's); backward a new dx
-- A backward that reads its gradient (raw) and makes x's as a new buffer (elementwise ops: rope).
local function new_input_grad(x)
  return function(S, _, g)
    local gi = S:raw(g)
    local dx = S:new(x.n)
    S:drop(gi)
    return { dx }
  end
end

-- (T, D: the tables' rows and head_dim. On a GPU the op converts the first halves of cos and sin to (T, D/2) f32
-- tables of its own, copies in the tables' category (the model's cached ones: "other") saved by the node until
-- its backward; the CPU saves the model's tables themselves. tabs: packed sequences' per-token tables
-- (activations, which the CPU's node keeps); nil: the model's cached ones, counted once.)
function Sim:rope(x, T, D, tabs, R)
  R = R or D
  local partial = R < D
  -- (a partial rotary on a GPU: x cloned, contiguous, and rotated in place: the output)
  local xi = not self.o.gpu and self:raw(x) or nil
  local cat = tabs and tabs[1].s.cat or "other"
  local c = self.o.gpu and self:new(T * R / 2 * 4, cat) or nil
  local sn = self.o.gpu and self:new(T * R / 2 * 4, cat) or nil
  local out = self:lua(self:new(x.n))
  self:drop(xi)
  local saved = self.o.gpu and { c, sn } or tabs
  -- (CUDA: x the transpose of a contiguous (B, T, H, D) tensor, read in place, gets its gradient in that
  -- layout, so the transpose's backward hands on a contiguous one: ops/rope.c rope_backward_dev)
  local bthd = self.o.gpu and not partial and not x.c and not x.strided
  self:record(out, { x }, saved, function(S, _, g)
    if S.o.gpu and partial then return { S:new(x.n) } end -- (the gradient cloned and rotated back in place)
    local gi = S:raw(g)
    local dx = S:new(x.n)
    if bthd then dx.c = false end
    S:drop(gi)
    return { dx }
  end)
  self:drop(c)
  self:drop(sn)
  return out
end

-- zr.lora_multi (ops/lora.c): frozen projections reading one x, each with its LoRA adapter or none (zr.peft's
-- LoraLayers, and plain frozen projections beside them: llama.lua's project_lora, q/k/v or gate/up as one op, o_proj
-- or down_proj alone), as ONE op: the output (rows, Σ out_i) in the model's dtype, the bases' product and each
-- adapter's two written into it in place. projs: {W =, ad = (an adapter: A, B, r, dropout) or nil} in order.
-- ct, the compute dtype: the model's on a GPU (and for f32/f64), f32 for 16 bits on the CPU, where x is read as an f32
-- copy (in its category), the output computed in a workspace buffer, and h = [D_i(x) A_iᵀ] (rows, Σ r_i) made in a
-- workspace buffer and kept as a copy in the model's dtype; elsewhere h is made as the saved tensor itself. With
-- dropout (training, p > 0) one (rows, in) workspace buffer holds each adapter's dropped copy of x in turn; no mask
-- is kept (backward makes them again). The node saves x and h (and the weights: parameters).
-- Backward: g, h and x read in ct (copies only where ct differs), dh (rows, Σ r_i) workspace; dB_i then dx (when x
-- needs a gradient: a new buffer handed on, never written into its producer's pending one), then dA_i (with
-- dropout one (rows, in) workspace buffer for the masks made again); dA_i and dB_i go straight into the leaves'
-- gradients when they have one (stages 0-1, direct mode: leaf.static), else new tensors handed on (cast to the
-- parameter's dtype where ct differs, as dx to x's).
-- At stage 3 Module.call_group runs the hooks of every module of the group around the op: each adapter's lora_A
-- then lora_B gathered in order before it (each gather starting its prefetch) and released in order after it; in
-- backward the output's boundary nodes gather them last first, the input's release them after the op's backward,
-- unless x needs no gradient (no boundary node is recorded on it: they stay gathered until backward ends).
function Sim:lora_multi(x, projs, o_bytes, rows)
  local b = self.o.dtype_bytes
  local cb = (not self.o.gpu and b == 2) and 4 or b -- ct's element size
  local conv = cb ~= b
  local n, R, drop, ads = #projs, 0, false, {}
  for _, pr in ipairs(projs) do
    local a = pr.ad
    if a then
      ads[#ads + 1] = a
      R = R + a.r
      if a.dropout > 0 then drop = true end
    end
  end
  -- zr_tensor_to_raw(v, ct): v itself when contiguous in ct, else a copy in v's category
  local function in_ct(S, v) if conv then return S:new(v.n / b * cb, v.s.cat) end return S:raw(v) end
  for _, a in ipairs(ads) do self:gather(a.A); self:gather(a.B) end
  local out = self:lua(self:new(o_bytes))
  local xi = in_ct(self, x)
  local o = conv and self:new(o_bytes / b * cb, "ws") or nil -- zr_cpu_out_begin
  local hc = self:new(rows * R * cb, conv and "ws" or "act")
  if drop then self:drop(self:new(x.n / b * cb, "ws")) end -- the dropped copies of x, adapter by adapter
  local h = hc
  if conv then h = self:new(rows * R * b) end
  self:drop(o) -- zr_cpu_out_end
  -- inputs as the C node's edges: x, w_i, b_i (none here), A_i, B_i (false where absent)
  local inputs = { x }
  for i, pr in ipairs(projs) do
    inputs[1 + i], inputs[1 + n + i] = pr.W, false
    inputs[1 + 2 * n + i], inputs[1 + 3 * n + i] = pr.ad and pr.ad.A or false, pr.ad and pr.ad.B or false
  end
  self:record(out, inputs, { x, h }, function(S, _, g)
    for k = #ads, 1, -1 do S:gather(ads[k].B, true); S:gather(ads[k].A, true) end
    local gi, hi, xc = in_ct(S, g), in_ct(S, h), in_ct(S, x)
    local dh = S:new(rows * R * cb, "ws")
    local gins = {}
    -- grad_product: into the leaf's gradient where it has one, else a new one in ct (zr_take_as: cast to its dtype)
    local function grad(W, e)
      local leaf = W.leaf
      if leaf.frozen or leaf.static then return end
      local d = S:new(leaf.numel * cb)
      if conv then
        local c = S:new(leaf.bytes)
        S:drop(d)
        d = c
      end
      gins[e] = d
    end
    for i, pr in ipairs(projs) do if pr.ad then grad(pr.ad.B, 1 + 3 * n + i) end end
    local dx = needs(x) and S:new(x.n / b * cb) or nil
    local tmp = drop and S:new(x.n / b * cb, "ws") or nil
    for i, pr in ipairs(projs) do if pr.ad then grad(pr.ad.A, 1 + 2 * n + i) end end
    if dx and conv then
      local c = S:new(x.n)
      S:drop(dx)
      dx = c
    end
    gins[1] = dx
    S:drop(tmp); S:drop(dh); S:drop(xc); S:drop(hi); S:drop(gi)
    if needs(x) then for k = #ads, 1, -1 do S:release_param(ads[k].B); S:release_param(ads[k].A) end end
    return gins
  end)
  self:drop(h)
  if conv then self:drop(hc) end
  self:drop(xi)
  for _, a in ipairs(ads) do self:release_param(a.A, true); self:release_param(a.B, true) end
  return out
end

-- Each op's name on a stack while it runs, for the trace lines of the node it records.
for _, name in ipairs { "linear", "rms_norm", "view", "reshape", "transpose", "narrow", "cast", "sdpa",
  "add", "add_rms_norm", "swiglu", "embedding", "checkpoint", "cross_entropy", "linear_multi", "split", "contiguous",
  "qkv_rope_sdpa", "rope", "lora_multi" } do
  local f = Sim[name]
  if f then
    Sim[name] = function(self, ...)
      local ops = self.ops
      ops[#ops + 1] = name
      local a, b = f(self, ...)
      ops[#ops] = nil
      return a, b
    end
  end
end

-- A layer's modules in forward order (the prefetch chain). A constant kept out of the layer loop on purpose:
-- `for _, k in ipairs { "n1", ... }` inside it made a LuaJIT trace (the 2.1 snapshot Debian ships, before upstream's
-- c42c62e7 "Simplify handling of instable types in TNEW/TDUP load forwarding", LuaJIT issue #994) skip the rest of
-- each layer's list: the looping side trace recorded the list's end (a nil load) and, unrolled, forwarded that nil to
-- the next layer's fresh copy of the literal at index 2, so only each layer's first name was visited (chain entries
-- lost at random, 'arithmetic on k' in gather). The smallest case, 2 instead of 20 with traces, 20 interpreted:
--   jit.opt.start("hotloop=1", "hotexit=1")
--   local set, n = { b = true }, 0
--   for _ = 1, 20 do for _, k in ipairs { "a", "b", "c" } do if set[k] then n = n + 1 end end end
-- (tests/lua/test_memory_plan_jit.lua checks both; an upvalue list is loaded, never folded from the literal)
local LAYER_MODULES = { "n1", "q", "k", "v", "o", "n2", "g", "u", "d" }
-- llama.lua's projection groups (the same rule: constants, never literals in the layer loop)
local QKV, O_PROJ, GATE_UP, DOWN_PROJ = { "q", "k", "v" }, { "o" }, { "g", "u" }, { "d" }
-- Qwen3's: q_norm and k_norm run after the q/k/v product, before o_proj (the order engine.lua records)
local QWEN3_LAYER_MODULES = { "n1", "q", "k", "v", "qn", "kn", "o", "n2", "g", "u", "d" }
-- Phi-3's: qkv_proj and gate_up_proj one module each (zrun.models.phi3)
local PHI3_LAYER_MODULES = { "n1", "qkv", "o", "n2", "gu", "d" }
local PHI3_QKV, PHI3_GATE_UP = { "qkv" }, { "gu" }
-- Gemma 3's: Qwen3's, with a norm after the attention (pa) and after the MLP (pf); pre_feedforward_layernorm is n2
local GEMMA3_LAYER_MODULES = { "n1", "q", "k", "v", "qn", "kn", "o", "pa", "n2", "g", "u", "d", "pf" }

-- ---------------------------------------------------------------------------------------------
-- Llama forward + backward on the model. Returns activation/grad/workspace peaks (bytes).
-- ---------------------------------------------------------------------------------------------
function M.llama_activations(cfg, o)
  -- Gemma 3 (zrun.models.gemma3): Qwen3's attention path (q_norm / k_norm modules between the split product and the
  -- rope) with its own scale, norms after the attention and the MLP, the embeddings scaled (a copy), GeGLU (zr.geglu:
  -- swiglu's allocations), a rope per layer type (each type's tables)
  local gemma = cfg.model_type == "gemma3_text"
  if gemma then cfg = require("zrun.models.hf_config").gemma3_text(cfg) end
  local B, T = o.micro_batch, o.seq_len
  local b = o.dtype_bytes
  local H, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
  local Hq, KV = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
  local D = require("zrun.memory_estimate").head_dim(cfg)
  local N = B * T
  local qk_norm = cfg.model_type == "qwen3" or gemma -- Qwen3: q_norm / k_norm (RMSNorm over D) between the product and the rope
  local fused = cfg.model_type == "phi3" -- Phi-3: one qkv_proj, one gate_up_proj (zr.linear each; the same ops after)
  -- Phi-3's partial_rotary_factor (Phi-4-mini's 0.75): the rope tables R wide, and the attention on the split path
  local prf = cfg.partial_rotary_factor or (type(cfg.rope_parameters) == "table" and cfg.rope_parameters.partial_rotary_factor)
  local R = fused and prf and floor(D * prf) or D
  local partial = R < D
  local S = new_sim(o)
  S.tape = {}
  local tb = b == 8 and 8 or 4 -- the rope tables' element: f32 (f64 for an f64 model)
  -- the model's cos/sin tables for this length, (T, D) each, kept in f32 (f64 for an f64 model;
  -- llama.lua Model:rope, cached from the first step on; made outside any op: "other"); packed sequences:
  -- the power of two above the longest's last position (zrun.models.packed's table_length)
  local TL = o.packed and 2 ^ ceil(math.log(o.packed) / math.log(2) - 1e-9) or T
  -- (Gemma 3: one pair per layer type its layers have, made on the type's first layer of the first forward)
  local types = {}
  for l = 1, gemma and cfg.num_hidden_layers or 0 do
    local t = cfg.layer_types[l]
    if not types[t] then types[t] = true; types[#types + 1] = t end
  end
  for _ = 1, math.max(1, #types) do S:alloc(2 * TL * R * tb, "other") end
  -- packed sequences on the segments (zrun.models.packed.flat_ok: zr.sdpa_segments_ok, the CPU, or a GPU's
  -- flash kernels at head_dim 64, 128, 256 or padded between 64 and 128, in 16 bits): the attention runs once over the rows joined, (1, N),
  -- with the segments and per-token cos/sin; elsewhere over the groups (gathers of rows around it)
  -- a sliding window that masks keys (o.window: {full =, sliding = {per layer}}) runs there too, plain rows included
  local flat = (o.packed or o.window) and (not o.gpu or (M.flash_dim(D) and b == 2))

  -- parameters as leaves (stages 0-1: fp32 grads exist already; 2-3: allocated per backward)
  local static = o.stage <= 1 or o.direct -- direct mode: .grad are views into the partition
  local persist = o.stage3 and (o.persistence_threshold or 0) or 0 -- smaller parameters stay whole
  -- o.lora (memory_plan's lora setting): every base parameter frozen (no gradient, never gathered: ZeRO
  -- holds the adapters only), and each target's lora_A (r, in) and lora_B (out, r) trained
  local lora = o.lora
  local function P(numel, trained)
    local frozen = lora ~= nil and not trained
    return { leaf = { numel = numel, bytes = numel * b, static = static, param = true, pending = 0,
      persistent = frozen or numel < persist, frozen = frozen } }
  end
  local embedW = P(V * H)
  local layers = {}
  local PROJ = fused and { qkv = "self_attn.qkv_proj", o = "self_attn.o_proj", gu = "mlp.gate_up_proj", d = "mlp.down_proj" }
    or { q = "self_attn.q_proj", k = "self_attn.k_proj", v = "self_attn.v_proj", o = "self_attn.o_proj",
      g = "mlp.gate_proj", u = "mlp.up_proj", d = "mlp.down_proj" }
  -- a projection's weight (out, in), and its bias (out) as W.bias where the model has one (Qwen2's q/k/v)
  local qkv_bias, o_bias, mlp_bias = require("zrun.memory_estimate").biases(cfg)
  local function Lin(out, inp, bias)
    local W = P(out * inp)
    if bias then W.bias = P(out) end
    return W
  end
  for l = 1, L do
    local p
    if fused then
      p = { qkv = Lin((Hq + 2 * KV) * D, H), o = Lin(H, Hq * D), gu = Lin(2 * I, H), d = Lin(H, I), n1 = P(H), n2 = P(H),
        ad = {} }
    else
      p = { q = Lin(Hq * D, H, qkv_bias), k = Lin(KV * D, H, qkv_bias), v = Lin(KV * D, H, qkv_bias),
        o = Lin(H, Hq * D, o_bias), g = Lin(I, H, mlp_bias), u = Lin(I, H, mlp_bias), d = Lin(H, I, mlp_bias), n1 = P(H),
        n2 = P(H), ad = {} }
    end
    if qk_norm then p.qn, p.kn = P(D), P(D) end
    if gemma then p.pa, p.pf = P(H), P(H) end
    for k, mod in pairs(lora and PROJ or {}) do
      local t = lora.targets["model.layers." .. (l - 1) .. "." .. mod]
      if t then p.ad[k] = { W = p[k], A = P(lora.r * t[1], true), B = P(t[2] * lora.r, true), r = lora.r,
        dropout = lora.dropout } end
    end
    p.sliding = o.window and o.window.sliding[l] or false
    layers[l] = p
  end
  local normW = P(H)
  local headW = cfg.tie_word_embeddings and embedW or P(V * H)
  -- the modules' parameters in forward order (the prefetch chain; ZeRO's: the trained ones)
  local chain = { embedW }
  for l = 1, L do
    local p = layers[l]
    for _, k in ipairs(fused and PHI3_LAYER_MODULES or gemma and GEMMA3_LAYER_MODULES or qk_norm and QWEN3_LAYER_MODULES
      or LAYER_MODULES) do
      chain[#chain + 1] = p[k]
      if p[k].bias then chain[#chain + 1] = p[k].bias end
      local a = p.ad[k]
      if a then chain[#chain + 1] = a.A; chain[#chain + 1] = a.B end
    end
  end
  chain[#chain + 1] = normW
  if not cfg.tie_word_embeddings then chain[#chain + 1] = headW end
  local order, n_order = { pos = {} }, 0
  for _, v in ipairs(chain) do
    if not v.leaf.frozen then
      n_order = n_order + 1
      order[n_order] = v.leaf; order.pos[v.leaf] = n_order
    end
  end
  order.after = {} -- parameters of the modules after each one
  local acc = 0
  for i = n_order, 1, -1 do order.after[i] = acc; acc = acc + order[i].numel end
  S.order = order

  -- A plain training loop (out = engine(ids, labels); engine:backward(out.loss); engine:step()):
  -- the previous step's batch and out are garbage until the next collection: out holds the loss
  -- and, for its lazy out.logits, the final hidden states (the logits themselves became the
  -- loss's gradient and died in backward).
  if o.gc ~= "ideal" then
    S.garbage[#S.garbage + 1] = S:new(N * 8, "other")
    for _, bytes in ipairs { N * H * b, 4 } do S.garbage[#S.garbage + 1] = S:new(bytes) end
    -- on the segments with checkpointing, the last step's segments and per-token tables too: its
    -- checkpointed layers' functions held them until its backward ended (after its collection)
    if flat and o.gradient_checkpointing then
      local held = { S:new(2 * N * 4, "other") }
      for _ = 1, 2 * math.max(1, #types) do held[#held + 1] = S:new(N * R * tb) end -- (each layer type's tables)
      for _, v in ipairs(held) do
        v.pinned = true
        S.garbage[#S.garbage + 1] = v
      end
    end
  end
  -- input ids (the labels are the same tensor in a causal LM batch): the collator's tensors are
  -- created outside any op, in category "other"
  local ids = S:lua(S:new(N * 8, "other"))
  -- packed sequences: the collator's position_ids (N i64) beside them, made on the host (the device's memory
  -- on CPU ranks; a GPU's forward copies them over, below); the last step's are garbage as its ids are
  if o.packed and not o.gpu then
    S:lua(S:new(N * 8, "other"))
    if o.gc ~= "ideal" then S.garbage[#S.garbage + 1] = S:new(N * 8, "other") end
  end

  -- llama.lua runs q/k/v and gate/up as one product each (zr.linear_multi; with a LoRA adapter on
  -- one of them, one zr.lora_multi), a residual add with the norm after it as one op, and hands
  -- (h, m) from layer to layer (at stage 3 too, the hooks of the modules run around each op:
  -- Module.call_group); a model whose modules have hooks of their own runs them one by one, which
  -- this does not model
  -- handoff: llama.lua's Model:forward runs a plain layer as (h, m) and adds m to h with the next
  -- norm (zr.add_rms_norm); pending is the previous layer's m (nil: x is the layer's input as is)
  local seg, tabs -- packed sequences on the segments: made in the model's forward (below), read by each layer
  local full_seg -- (a window in some layers only: the whole sequences' segments, read by the others)
  local closure_held = {} -- (what the checkpointed layers' functions hold until backward ends)
  local function layer(p, x, handoff, pending)
    local seg = full_seg and not p.sliding and full_seg or seg
    local tabs = p.tabs or tabs -- (Gemma 3's: its layer type's)
    S:push()
    local a1
    if pending then x, a1 = S:add_rms_norm(x, pending, p.n1, N, gemma) else a1 = S:rms_norm(x, p.n1, N, gemma) end
    local strided = (D == 64 or D == 128 or M.narrow_dim(D)) and b == 2 -- the Hopper attention kernels read strided q, k, v
    local att -- o_proj's input
    -- projections as llama.lua runs them: a group (q/k/v, gate/up) with an adapter as one zr.lora_multi (project_lora;
    -- a plain frozen projection among them without one), an adapted o_proj or down_proj as one of its own; else the
    -- plain product (one zr.linear_multi for a group)
    local ad = p.ad
    local function adapted(ks) -- ks: a module constant (LAYER_MODULES' note)
      local projs, any = {}, false
      for i, k in ipairs(ks) do
        projs[i] = { W = p[k], ad = ad[k] }
        if ad[k] then any = true end
      end
      return any and projs or nil
    end
    local lqkv, qkv_bytes = adapted(fused and PHI3_QKV or QKV), N * (Hq + 2 * KV) * D * b
    local qkv = lqkv and S:lora_multi(a1, lqkv, qkv_bytes, N)
      or fused and S:linear(a1, p.qkv, qkv_bytes) or S:linear_multi(a1, { p.q, p.k, p.v }, qkv_bytes)
    -- packed sequences (o.packed: a padding-free batch, position_ids telling its sequences apart): packed.attend
    -- gathers the rows into groups of about one length and the outputs back; modelled as one group without
    -- padding (sequences of one length: padding rows, where lengths differ, depend on the data)
    -- (o.packed: the sequences' length; the attention runs over N / o.packed of them)
    -- (on the segments: qkv viewed as one (1, N) row, the per-token tables and the segments kept by the
    -- attention's nodes, the output viewed back (B, T, H·D))
    local aB, aT = B, T
    -- Qwen3 on a GPU at head_dim 64 or 128 (zr.qkv_norm_rope_fused): the norms fused with the rope, llama.lua's
    -- qkv_attention as Llama's (one op over the product, viewed or gathered as Llama's)
    local qk_fused = qk_norm and not gemma and o.gpu and (D == 64 or D == 128) and b <= 4
    if flat and ((qk_norm and not qk_fused) or partial) then
      aB, aT = 1, N -- (Qwen3, Phi-3's partial rotary: each part of the product viewed as one row, below)
    elseif flat then
      qkv, aB, aT = S:view(qkv), 1, N
    elseif o.packed then
      qkv, aB, aT = S:gather_rows(qkv, qkv.n), N / o.packed, o.packed
    end
    if qk_fused then
      -- zr.qkv_norm_rope_sdpa (ops/attention.c): zr.qkv_norm_rope, the attention, its output transposed back and
      -- reshaped (a copy), in C (its q, k, v, o and transpose go as att is made); the norms' weights gathered
      -- around it at stage 3 (Module.call_group)
      S:gather(p.qn)
      S:gather(p.kn)
      local q, k, v = unpack(S:qkv_norm_rope(qkv, { N * Hq * D * b, N * KV * D * b, N * KV * D * b }, { Hq, KV, KV },
        strided, flat and tabs, { p.qn, p.kn }, N, D))
      local ao = S:sdpa(q, k, v, N * Hq * 4, Hq ~= KV, { aB, Hq, KV, aT, D }, strided, seg)
      local ot = S:transpose(ao)
      att = S:reshape(ot)
      for _, t in ipairs { q, k, v, ao, ot } do S:forget(t, true) end
      S:release_param(p.qn, true)
      S:release_param(p.kn, true)
    elseif qk_norm and (flat or not o.packed) then
      -- llama.lua's unfused path for Qwen3: the product split into q, k, v views; q and k viewed (b, t, heads, D)
      -- and normed (a contiguous copy read), transposed and rotated; v viewed and transposed; the attention;
      -- its output transposed back and reshaped (a copy), o_proj's input. (Lua values of the layer: garbage
      -- when it returns, freed with the model's scope.)
      local parts = S:split(qkv, { N * Hq * D * b, N * KV * D * b, N * KV * D * b })
      if flat then -- (packed sequences on the segments: each part viewed as the (1, B·T) row)
        for i = 1, 3 do parts[i] = S:view(parts[i]) end
      end
      local q4, k4, v4 = S:view(parts[1]), S:view(parts[2]), S:view(parts[3])
      local vt = S:transpose(v4)
      vt.c = false
      local qn = S:rms_norm(q4, p.qn, N * Hq, gemma)
      local kn = S:rms_norm(k4, p.kn, N * KV, gemma)
      -- (the tables' rows: on the segments each token's own, B·T of them, whose first halves the GPU op copies)
      local q = S:rope(S:transpose(qn), flat and N or T, D, tabs)
      local k = S:rope(S:transpose(kn), flat and N or T, D, tabs)
      -- (head_dim 64, 128 or narrow in 16 bits on a GPU: the Hopper kernels read q, k and v where they are)
      local ao = S:sdpa(q, k, vt, N * Hq * 4, Hq ~= KV, { aB, Hq, KV, aT, D }, strided, seg)
      att = S:reshape(S:transpose(ao))
    elseif partial then
      -- zrun.models.phi3's partial rotary: the product split into q, k, v views (zr.split), each viewed (b, t, heads,
      -- D) and transposed (strided views), q and k through zr.rope with R-wide tables (on a GPU a contiguous copy
      -- rotated in place, its gradient a copy too), the attention, its output transposed back and reshaped
      local parts = S:split(qkv, { N * Hq * D * b, N * KV * D * b, N * KV * D * b })
      if flat then for i = 1, 3 do parts[i] = S:view(parts[i]) end end
      local ts = {}
      for i = 1, 3 do
        ts[i] = S:transpose(S:view(parts[i]))
        ts[i].c = false
      end
      local q = S:rope(ts[1], flat and N or T, D, tabs, R)
      local k = S:rope(ts[2], flat and N or T, D, tabs, R)
      local ao = S:sdpa(q, k, ts[3], N * Hq * 4, Hq ~= KV, { aB, Hq, KV, aT, D }, strided, seg)
      att = S:reshape(S:transpose(ao))
    elseif o.gpu and strided then -- zr.qkv_rope_sdpa, one node
      att = S:qkv_rope_sdpa(qkv, N * Hq * D * b, N * Hq * 4, { aB, Hq, KV, aT, D }, flat and { tabs[1], tabs[2], seg })
    else -- zr.qkv_rope_sdpa's composition: qkv_rope, sdpa, transpose, reshape
      local q, k, v = unpack(S:qkv_rope(qkv, { N * Hq * D * b, N * KV * D * b, N * KV * D * b }, false, tabs))
      local o = S:sdpa(q, k, v, N * Hq * 4, Hq ~= KV, { aB, Hq, KV, aT, D }, strided, seg)
      local ot = S:transpose(o)
      att = S:reshape(ot)
      -- the composition runs in C (ops/attention.c): its q, k, v, o and transpose go as att is made
      for _, t in ipairs { q, k, v, o, ot } do S:forget(t, true) end
    end
    if flat then att = S:view(att) elseif o.packed then att = S:gather_rows(att, N * Hq * D * b) end
    local lo = adapted(O_PROJ)
    local ao = lo and S:lora_multi(att, lo, N * H * b, N) or S:linear(att, p.o, N * H * b)
    if gemma then ao = S:rms_norm(ao, p.pa, N, gemma) end -- (post_attention_layernorm)
    local h, a2 = S:add_rms_norm(x, ao, p.n2, N, gemma) -- llama.lua's zr.add_rms_norm
    local lgu, gu_bytes = adapted(fused and PHI3_GATE_UP or GATE_UP), N * 2 * I * b
    -- gate then up side by side, read packed by zr.swiglu
    local act = S:swiglu(lgu and S:lora_multi(a2, lgu, gu_bytes, N)
      or fused and S:linear(a2, p.gu, gu_bytes) or S:linear_multi(a2, { p.g, p.u }, gu_bytes))
    local ld = adapted(DOWN_PROJ)
    local m = ld and S:lora_multi(act, ld, N * H * b, N) or S:linear(act, p.d, N * H * b)
    if gemma then m = S:rms_norm(m, p.pf, N, gemma) end -- (post_feedforward_layernorm)
    if handoff then
      S:pop(h, m)
      return h, m
    end
    return S:pop(S:add(h, m))
  end

  -- both forwards free the handles they made and do not return when they return
  -- (Module:temporaries_scope)
  local causal_scope = S:scope()
  S:push() -- LlamaForCausalLM.forward
  local model_scope = S:scope()
  S:push() -- LlamaModel.forward
  local h = S:embedding(ids, embedW, N * H * b, b)
  -- with a padding_idx (the config's pad_token_id: Gemma's 0) a trained table's lookup goes through zr.where (nn.Embedding:
  -- ids:eq(pad), a bool per token, which the node keeps; a new output); the embedding's output lives on with the scope
  local pad = cfg.pad_token_id
  if type(pad) == "number" and not embedW.leaf.frozen then h = S:where_rows(S:lua(S:new(N)), h) end
  if gemma then h = S:scaled(h) end -- (Gemma3TextScaledWordEmbedding)
  if flat then
    -- packed.segments' (2, 1, N) i32 segments (made on the host: on a GPU a copy there, "other" as its source),
    -- position_ids on the device (a GPU's copy of the collator's host tensor), and the per-token cos / sin
    -- rows, zr.embedding row gathers of the model's tables (activations): temporaries of the forward that the
    -- layers' nodes keep; with checkpointing zr.persist'ed, and the checkpointed layers' functions hold them
    -- until backward ends (then garbage)
    -- a window in some layers only: the whole sequences' segments first, then the windowed ones (packed.segments);
    -- plain rows under a window have no position_ids (their cos / sin rows are the table's, repeated: a copy each)
    if o.window and o.window.full then full_seg = S:lua(S:new(2 * N * 4, "other")) end
    seg = S:lua(S:new(2 * N * 4, "other"))
    if o.gpu and o.packed then S:lua(S:new(N * 8, "other")) end
    tabs = { S:lua(S:new(N * R * tb)), S:lua(S:new(N * R * tb)) }
    local held = { seg, tabs[1], tabs[2] }
    if full_seg then held[#held + 1] = full_seg end
    -- (Gemma 3: each other layer type's rows too, gathered on its first layer; each layer rotates with its type's)
    local of_type = { [types[1] or 1] = tabs }
    for i = 2, #types do
      local t = { S:lua(S:new(N * R * tb)), S:lua(S:new(N * R * tb)) }
      of_type[types[i]] = t
      held[#held + 1], held[#held + 2] = t[1], t[2]
    end
    for l = 1, gemma and L or 0 do layers[l].tabs = of_type[cfg.layer_types[l]] end
    if o.gradient_checkpointing then
      for _, v in ipairs(held) do
        v.pinned = true
        S:forget(v, "keep") -- (out of the forward's frame: the layers' functions hold it)
        table.insert(S.frames[1], v)
        closure_held[#closure_held + 1] = v
      end
    end
  end
  local pending
  for l = 1, L do
    local x, p = h, layers[l]
    if o.gradient_checkpointing then
      h = S:checkpoint(x, function(xx) return layer(p, xx) end)
    else
      local m = pending
      h, pending = layer(p, x, true, m)
      if m then S:forget(m) end
    end
    S:forget(x)
  end
  local hn
  if pending then
    local x = h
    h, hn = S:add_rms_norm(x, pending, normW, N, gemma)
    S:forget(x)
    S:forget(pending)
  else
    hn = S:rms_norm(h, normW, N, gemma)
  end
  hn = S:pop(hn)
  S:end_scope(model_scope, { [hn] = true })
  if o.chunked_loss then -- (the chunked LM head + loss: no logits; M.chunked_loss below)
    local loss = M.chunked_loss(S, hn, headW, B, T, H, V, b, o.chunked_loss)
    S:pop(hn, loss)
    S:end_scope(causal_scope, { [hn] = true, [loss] = true })
    return M.finish_step(S, loss, closure_held)
  end
  -- head and loss (LlamaForCausalLM.forward, causal_lm_loss); a tied head is fetched at stage 3
  -- and stays gathered until backward ends
  if cfg.tie_word_embeddings then S:gather(headW, false, true); headW.leaf.keep = true end -- Module.fetch
  local logits = S:linear(hn, headW, N * V * b)
  S:push()
  -- causal_lm_loss shifts the labels (a -100 pad column, "other", and the shifted copy) and scores
  -- the logits as they are: a view, no copy, no fp32 upcast. cross_entropy's inplace (a training
  -- forward) writes the loss's gradient over the logits and saves only them (and, on a GPU, the
  -- seed it was made for); its backward hands that storage on: no second logits-sized buffer
  local rows = B * T
  S:lua(S:new(B * 8, "other"))
  S:lua(S:new(rows * 8))
  local lg = S:view(logits)
  local lse = S:new(rows * 4)
  local loss
  if o.loss_type == "dft" then
    -- TRL's dft loss (causal_lm_loss): the plain per-token cross-entropy (reduction "none": no in-place
    -- gradient; it saves the logits, lse and the i64 targets, and its backward makes a second logits-sized
    -- gradient), then weights exp(-ce) taken as constants, their product, its sum and the count it is divided by
    local lws = S:new(rows * 4, "ws")
    local per = S:lua(S:new(rows * 4))
    local tgt = S:new(rows * 8)
    if o.gpu then S:drop(S:new(4)) end -- (the count of counted targets, on the device)
    S:record(per, { lg }, { lg, lse, tgt }, function(S2) return { S2:new(N * V * b) } end)
    S:drop(lws)
    S:drop(tgt)
    local w = S:lua(S:new(rows * 4)) -- per:detach():neg():exp() (the negation a temporary)
    S:drop(S:new(rows * 4))
    local wl = S:lua(S:new(rows * 4))
    S:record(wl, { per }, { w }, function(S2) return { S2:new(rows * 4) } end)
    S:lua(S:new(rows)) -- the counted mask (shifted:ne(-100)), then as f32 and summed
    S:lua(S:new(rows * 4))
    local cnt = S:lua(S:new(4))
    local sum = S:lua(S:new(4))
    S:record(sum, { wl }, nil, function(S2) return { S2:new(rows * 4) } end)
    loss = S:lua(S:new(4))
    S:record(loss, { sum }, { cnt }, function(S2) return { S2:new(4) } end)
  else
    loss = S:lua(S:new(4))
    local lws = S:new(rows * 4, "ws")
    S:drop(lws)
    local baked = o.gpu and S:new(4) or nil
    if o.gpu then S:drop(S:new(4, "ws")) end -- the count of counted targets (mean)
    S:record(loss, { lg }, { lg, baked }, function(S2) return { S2:share(lg) } end)
    S:drop(baked)
  end
  S:drop(lse)
  S:pop(loss)
  -- {loss=} is held by the caller through backward, with the final hidden states (for a lazy
  -- out.logits); the logits tensor itself is freed with the scope, kept alive by the loss's node only
  S:pop(hn, loss)
  S:end_scope(causal_scope, { [hn] = true, [loss] = true })
  return M.finish_step(S, loss, closure_held)
end

-- The step's end after the forward: backward from loss, and the figures llama_activations returns.
function M.finish_step(S, loss, closure_held)
  local fwd_act = S.cur.act
  S:gc_point() -- engine:backward collects before loss:backward()
  local g0 = S:new(4)
  S:backward(S.tape, loss.node, g0)
  for _, v in ipairs(closure_held) do -- the checkpointed layers' functions are gone: garbage now
    for i, u in ipairs(S.frames[1]) do if u == v then table.remove(S.frames[1], i); break end end
    S:unref(v)
  end
  -- live_peak: the most the step has live at once (every category of the simulation, the batch
  -- included), live_at_peak its categories then (act, grads, ws, params, other); after_backward:
  -- what is still live when the optimizer step runs (live_after by category; stage 3 releases
  -- every gathered parameter when backward ends)
  return { activations = S.peak.act, forward = fwd_act, after_backward = S.cur.act, leaf_grads = S.peak.grads,
    workspace = S.peak.ws, gathered = S.peak.params, live_peak = S.total_peak, live_peak_in = S.total_peak_in,
    live_after_backward = S.total - S.cur.params, live_at_peak = S.at_peak, live_after = S.cur }
end

-- The forward option chunked_loss (llama.chunked_causal_lm_loss, runtime/ops/linear_ce.c), every label counted (a
-- masked prompt makes the op gather the counted rows: less for its slices, the rows' copy more): the head's weight
-- fetched (at stage 3 gathered until backward ends, tied or not), the labels shifted as causal_lm_loss shifts them,
-- the hidden states viewed (B·T, H), then the op: per row its logsumexp (saved) and, while it runs, the target's
-- logit, the per-row losses, one slice of logits (rows x chunk) and the mean; in backward the slice again, dh in f32
-- (rounded into h's gradient) and dW (straight into the fp32 partition where the engine keeps it on a GPU). On the
-- CPU (f32 compute): 16-bit h and W widened to f32 copies each way, the target logits and smoothing sums kept
-- always, dW made in f32 and narrowed to the weight's dtype. Returns the loss (a Lua value).
function M.chunked_loss(S, hn, W, B, T, H, V, b, chunk)
  local rows = B * T
  local gpu, ct = S.o.gpu, 4
  -- zr_linear_ce_keeps: the default slices' logits made once and kept for backward where they take at most 256 MiB
  -- (the compute dtype's bytes on the CPU, f32 for 16 bits)
  local keep = type(chunk) ~= "number" and rows * V * (gpu and b or math.max(b, ct)) <= 256 * 2 ^ 20
  local vc = keep and V or math.min(V, type(chunk) == "number" and chunk or
    math.max(4096, floor(64 * 2 ^ 20 / (rows * b) / 256) * 256)) -- (zr_linear_ce_chunk)
  S:gather(W, false, true); W.leaf.keep = true -- Module.fetch
  S:push()
  S:lua(S:new(B * 8, "other")) -- shift_labels: the pad column, then the shifted labels
  local tgt = S:lua(S:new(rows * 8))
  local hv = S:view(hn)
  local function widened(cat, bytes) -- zr_cpu_in: the f32 copy of a 16-bit tensor (in its category), or none
    if b == ct then return nil end
    return S:new(bytes, cat)
  end
  local loss = S:lua(S:new(4))
  local lse = S:new(rows * 4)
  local nv = gpu and S:new(4) or nil
  local tmp, kept = {}, nil
  if gpu then
    for _, n in ipairs { rows * 4, rows * 4, 4 } do tmp[#tmp + 1] = S:new(n, "ws") end -- xt, loss, mean
    if keep then kept = S:new(rows * V * b) else tmp[#tmp + 1] = S:new(rows * vc * b, "ws") end -- the slice
  else
    tmp = { widened(hv.s.cat, rows * H * 4), widened("params", V * H * 4) }
    for _, n in ipairs { rows * 4, rows * 4 } do tmp[#tmp + 1] = S:new(n, "ws") end -- xt, tot
    if keep then kept = S:new(rows * V * math.max(b, ct)) else tmp[#tmp + 1] = S:new(rows * vc * 4, "ws") end -- the slice
  end
  for _, v in pairs(tmp) do S:drop(v) end
  local saved = { hv, tgt, lse }
  if nv then saved[#saved + 1] = nv end
  if kept then saved[#saved + 1] = kept end
  S:record(loss, { hv, W }, saved, function(S2, _, g)
    local need_h, need_w = needs(hv), not W.leaf.frozen
    local t2, d = {}, {}
    if gpu then
      if not keep then t2[1] = S2:new(rows * vc * b, "ws") end
      if need_h then t2[2] = S2:new(rows * H * 4, "ws") end -- dh (f32)
      if need_w and not S2.o.dw_in_place then d[2] = S2:new(V * H * b) end
      if need_h then d[1] = S2:new(rows * H * b) end
    else
      t2[1], t2[2] = widened(hv.s.cat, rows * H * 4), widened("params", V * H * 4)
      if not keep then t2[3] = S2:new(rows * vc * 4, "ws") end
      if need_h then t2[4] = S2:new(rows * H * 4, "ws") end
      if need_w then d[2] = S2:new(V * H * 4) end
      if need_h then d[1] = S2:new(rows * H * b) end
      if need_w and b ~= 4 then -- (zr_give_grads: dW narrowed to the weight's dtype, then the f32 one freed)
        local nw = S2:new(V * H * b)
        S2:drop(d[2])
        d[2] = nw
      end
    end
    for _, v in pairs(t2) do S2:drop(v) end
    return { d[1], d[2] }
  end)
  S:drop(lse)
  S:drop(nv)
  S:drop(kept)
  return S:pop(loss)
end

return M
