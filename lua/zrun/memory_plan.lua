-- zr.memory.plan{...}: the per-rank peak of every memory category (params, grads, optimizer,
-- activations, comm, workspace) on the training device and in host memory, predicted from the
-- model config and the DeepSpeed config before anything is allocated, following what zrun's
-- engine (runtime/zero.c, lua/zrun/engine.lua) and ops actually allocate — not DeepSpeed's
-- rules of thumb. Activations come from replaying the Llama forward and backward on a model of
-- the autograd tape (which op allocates what, what each node saves, when backward frees it).
-- Also `fit` advice (which settings fit a GPU) and the `zrun plan` command.
local E = require "zrun.memory_estimate"

local M = {}
local fmt, floor, ceil, max, min, concat = string.format, math.floor, math.ceil, math.max, math.min, table.concat

-- When Lua collects the tensors a step leaves behind. LuaJIT's collector does not see tensor
-- memory, so an op's output lives until a collection, not until its last use:
--   "backward" what zrun does: engine:backward collects right before loss:backward(), so only
--              what autograd saved survives into backward; zr.checkpoint collects right after a
--              segment's no-grad forward and after each segment's recomputation + backward, so
--              a checkpointed model holds the segment inputs plus one segment's activations;
--   "none"     a what-if with no collection during a step (zrun before those collections);
--   "ideal"    a what-if where tensors die with their last Lua reference (as with refcounting).
-- The step modelled is a plain loop (out = engine(ids, ids); engine:backward(out.loss);
-- engine:step()), so the previous step's batch, logits and loss are garbage until the first
-- collection of the next step.
M.DEFAULT_GC = "backward"

local DTYPE_BYTES = { f32 = 4, float32 = 4, bf16 = 2, bfloat16 = 2, f16 = 2, fp16 = 2, float16 = 2 }
local function canon_dtype(d)
  if d == "float32" then return "f32" end
  if d == "bfloat16" then return "bf16" end
  if d == "fp16" or d == "float16" then return "f16" end
  return d
end

local function human(b) return require("zrun.memory").human(b) end

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
    peak = { act = 0, grads = 0, ws = 0, params = 0, other = 0 }, frames = { {} }, garbage = {}, wpeak = 0, ops = {}, live = 0 }, Sim)
end

function Sim:count(cat, b)
  local c = self.cur[cat] + b
  self.cur[cat] = c
  if c > self.peak[cat] then self.peak[cat] = c end
  if cat == "act" and c > self.wpeak then self.wpeak = c end
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
function Sim:lua(v)
  local f = self.frames[#self.frames]
  f[#f + 1] = v
  return v
end
-- A value nothing in Lua references any more: freed now ("ideal") or at the next collection.
function Sim:unref(v)
  if self.o.gc == "ideal" then self:drop(v) else self.garbage[#self.garbage + 1] = v end
end
-- `local x = ...; x = other`: the old value leaves the running function's frame.
function Sim:forget(v)
  local f = self.frames[#self.frames]
  for i = #f, 1, -1 do
    if f[i] == v then
      table.remove(f, i)
      self:unref(v)
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
-- The places where zrun collects (engine:backward; zr.checkpoint after a segment's forward and
-- after its backward); with gc = "none" nothing collects during a step.
function Sim:gc_point()
  if self.o.gc == "backward" then self:collect() end
end

-- ZeRO-3: a module's parameters are gathered (16-bit, full size) while it runs and during its
-- backward; `keep` (the embedding, whose input needs no gradient, and a tied LM head fetched
-- outside its module) stays gathered until backward ends.
-- Prefetch (engine.lua, zero.c): once a module's parameters are gathered, the all-gathers of
-- the modules after it (in forward; before it in backward, from the module boundary nodes) start
-- straight into their storage, up to stage3_prefetch_bucket_size elements and while the live
-- elements stay within stage3_max_live_parameters; recomputation inside backward does not.
function Sim:gather(W, in_backward, no_prefetch)
  if not self.o.stage3 then return end
  if not W.leaf.gathered and not W.leaf.persistent then
    W.leaf.gathered = true
    self.live = self.live + W.leaf.numel
    self:count("params", W.leaf.bytes)
  end
  local order, budget = self.order, self.o.prefetch or 0
  if no_prefetch or budget <= 0 or not order or (self.in_bwd and not in_backward) then return end
  local k, step = order.pos[W.leaf], in_backward and -1 or 1
  local list, total = {}, 0 -- the modules along the chain, up to the budget (engine.lua's chain)
  k = k + step
  while order[k] and total < budget do
    list[#list + 1] = order[k]
    total = total + order[k].numel
    k = k + step
  end
  for _, leaf in ipairs(list) do -- zr_zero_prefetch
    if not leaf.gathered and not leaf.persistent then
      if leaf.numel > budget or self.live + leaf.numel > (self.o.max_live or 1e18) then break end
      budget = budget - leaf.numel
      leaf.gathered = true
      self.live = self.live + leaf.numel
      self:count("params", leaf.bytes)
    end
  end
end
function Sim:release_param(W)
  if not self.o.stage3 or not W.leaf.gathered or W.leaf.keep or W.leaf.persistent then return end
  W.leaf.gathered = false
  self.live = self.live - W.leaf.numel
  self:count("params", -W.leaf.bytes)
end

-- Records a node: out.node = node; inputs are values (with .node or .leaf) or nil.
function Sim:record(out, inputs, saved, bwd)
  local name = self.ops[#self.ops] or "?"
  if self.grad_on == false then self:trace("nograd", name); return out end -- nothing recorded or saved
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

-- A parameter's gradient arriving (zr_accumulate_leaf_grad, then the ZeRO hook).
function Sim:leaf_grad(leaf, g)
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
    for _, v in ipairs(n.inputs) do if v and v.leaf then v.leaf.pending = 0 end end
  end
  for _, n in ipairs(tape) do
    for _, v in ipairs(n.inputs) do if v and v.leaf then v.leaf.pending = v.leaf.pending + 1 end end
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
      for i, v in ipairs(n.inputs) do
        local gi = gins[i]
        if v and v.node then
          if gi then self:accumulate(v.node, gi) end
        elseif v and v.leaf then self:leaf_grad(v.leaf, gi)
        elseif gi then self:drop(gi) end
      end
      self:drop(gk)
    else
      for _, v in ipairs(n.inputs) do if v and v.leaf then self:leaf_grad(v.leaf, nil) end end
    end
    for _, s in ipairs(n.saved) do self:release(s) end
    n.saved = {}
    self:trace("bwd", n.name)
  end
  self.in_bwd = was
end

-- ---------- ops, as runtime/ops_*.c allocate them on the CPU path ----------

-- linear: out (rows, o); saves x (and the weight, a parameter); backward dx, dW.
-- At stage 3 its module gathers W around the forward and around the backward.
function Sim:linear(x, W, o_bytes)
  self:gather(W)
  local out = self:lua(self:new(o_bytes))
  self:release_param(W)
  return self:record(out, { x, W }, { x }, function(S, _, g)
    S:gather(W, true)
    local gi = S:raw(g)
    local dx = S:new(x.n)
    -- on a GPU with the gradients as views into the fp32 partition (ZeRO direct mode), dW is
    -- accumulated straight into it by the GEMM (ops_matmul.c): no 16-bit temporary
    local dw = not S.o.dw_in_place and S:new(W.leaf.bytes) or nil
    S:drop(gi)
    S:release_param(W)
    return { dx, dw }
  end)
end

function Sim:rms_norm(x, w, rows)
  self:gather(w)
  local out = self:lua(self:new(x.n))
  local rstd = self:new(rows * 4)
  self:release_param(w)
  self:record(out, { x, w }, { x, rstd }, function(S, _, g)
    S:gather(w, true)
    local gi = S:raw(g)
    local dx = S:new(x.n)
    local dw = S:new(w.leaf.numel * 4)
    S:drop(gi)
    S:release_param(w)
    return { dx, dw }
  end)
  self:drop(rstd)
  return out
end

function Sim:view(x) -- zr view/reshape of a contiguous tensor: no copy; backward to_input
  local out = self:lua({ s = x.s, n = x.n, c = x.c })
  self:retain(x.s)
  return self:record(out, { x }, nil, function(S, _, g) return { S:raw(g) } end)
end
function Sim:reshape(x)
  if x.c then return self:view(x) end
  local out = self:lua(self:new(x.n))
  return self:record(out, { x }, nil, function(S, _, g) return { S:raw(g) } end)
end
function Sim:transpose(x)
  self:retain(x.s)
  local out = self:lua({ s = x.s, n = x.n, c = not x.c })
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
function Sim:cast(x, bytes) -- x:float(): a copy; backward casts the gradient back
  local out = self:lua(self:new(bytes))
  return self:record(out, { x }, nil, function(S, _, g) return { S:new(x.n) } end)
end

function Sim:rope(x)
  if self.o.gpu then -- the CUDA kernel reads the strided (B,H,T,D) view in place, both ways
    local out = self:lua(self:new(x.n))
    return self:record(out, { x }, nil, function(S, _, g) return { S:new(x.n) } end)
  end
  local xi = self:raw(x) -- the kernel reads a contiguous input
  local out = self:lua(self:new(x.n))
  self:drop(xi)
  return self:record(out, { x }, nil, function(S, _, g)
    local gi = S:raw(g)
    local dx = S:new(x.n)
    S:drop(gi)
    return { dx }
  end)
end

-- kernels/cuda/attention.cu: attention_backward_workspace_size (fp32 dq accumulator, the dO.O row
-- sums, and per-split fp32 dk/dv partials when the query group is split across blocks)
local function split(blocks, G, limit)
  local ns = 1
  while G % (ns * 2) == 0 and blocks * ns < limit do ns = ns * 2 end
  return ns
end
local function attention_workspace(B, Hq, Hkv, T, Dh)
  local G = Hq / Hkv
  local ns = max(split(B * Hkv * ceil(T / 64), G, 512), split(B * Hkv * ceil(T / 128), G, 200))
  local a16 = function(n) return ceil(n / 16) * 16 end
  local n = a16(B * Hq * T * Dh * 4) + a16(B * Hq * T * 4)
  if ns > 1 then n = n + 2 * ns * B * Hkv * T * Dh * 4 end
  return n
end

function Sim:sdpa(q, k, v, lse_bytes, gqa, shape)
  if self.o.gpu then -- the flash kernel (ops_attention.c): contiguous q, k, v are what it saves
    local ins = { self:raw(q), self:raw(k), self:raw(v) }
    local out = self:lua(self:new(q.n))
    local lse = self:new(lse_bytes)
    self:record(out, { q, k, v }, { ins[1], ins[2], ins[3], out, lse }, function(S, _, g)
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
  self:record(out, { q, k, v }, { q, k, v, out, lse }, function(S, _, g)
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

function Sim:add(a, b)
  local out = self:lua(self:new(a.n))
  return self:record(out, { a, b }, nil, function(S, _, g) return { S:share(g), S:share(g) } end)
end
-- zr.swiglu (ops_swiglu.c): silu(gate) * up in one op that saves only its inputs
function Sim:swiglu(a, b)
  local out = self:lua(self:new(a.n))
  return self:record(out, { a, b }, { a, b }, function(S, _, g)
    local gi = S:raw(g)
    local da, db = S:new(a.n), S:new(b.n)
    S:drop(gi)
    return { da, db }
  end)
end
-- At stage 3 the embedding's input (token ids) needs no gradient, so no node releases its
-- weight after its backward: it stays gathered until backward ends.
function Sim:embedding(ids, W, out_bytes, dt)
  self:gather(W)
  local out = self:lua(self:new(out_bytes))
  self:release_param(W)
  return self:record(out, { false, W }, { ids }, function(S, _, g)
    S:gather(W, true) -- no release: see above
    if S.o.gpu then -- the CUDA kernel writes the dense gradient in the weight's dtype directly
      local gi = S:raw(g)
      local gw = S:new(W.leaf.bytes)
      S:drop(gi)
      return { nil, gw }
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
-- lua/bind_checkpoint.c collects fully right after the no-grad forward (only the segment's
-- inputs and output survive) and right after each segment's recomputation + backward.
function Sim:checkpoint(x, fn)
  local saved_tape, saved_grad = self.tape, self.grad_on
  self.tape, self.grad_on = {}, false
  local out = fn(x)
  self.tape, self.grad_on = saved_tape, saved_grad
  self:gc_point()
  local res = self:lua({ s = out.s, n = out.n, c = out.c }) -- a fresh header over out's storage
  self:retain(out.s)
  self:forget(out)
  return self:record(res, { x }, { x }, function(S, _, g)
    local outer = S.tape
    S.tape = {}
    S:push() -- the arguments and result of the Lua call made from C
    local leaf = { bytes = x.n, pending = 0 }
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
    S:gc_point()
    return { gx }
  end)
end

-- Each op's name on a stack while it runs, for the trace lines of the node it records.
for _, name in ipairs { "linear", "rms_norm", "view", "reshape", "transpose", "narrow", "cast", "rope", "sdpa",
  "add", "swiglu", "embedding", "checkpoint", "cross_entropy" } do
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

-- ---------------------------------------------------------------------------------------------
-- Llama forward + backward on the model. Returns activation/grad/workspace peaks (bytes).
-- ---------------------------------------------------------------------------------------------
local function llama_activations(cfg, o)
  local B, T = o.micro_batch, o.seq_len
  local b = o.dtype_bytes
  local H, I, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
  local Hq, KV = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
  local D = cfg.head_dim or floor(H / Hq)
  local N = B * T
  local S = new_sim(o)
  S.tape = {}

  -- parameters as leaves (stages 0-1: fp32 grads exist already; 2-3: allocated per backward)
  local static = o.stage <= 1 or o.direct -- direct mode: .grad are views into the partition
  local persist = o.stage3 and (o.persistence_threshold or 0) or 0 -- smaller parameters stay whole
  local function P(numel)
    return { leaf = { numel = numel, bytes = numel * b, static = static, param = true, pending = 0,
      persistent = numel < persist } }
  end
  local embedW = P(V * H)
  local layers = {}
  for l = 1, L do
    layers[l] = { q = P(Hq * D * H), k = P(KV * D * H), v = P(KV * D * H), o = P(H * Hq * D), g = P(I * H),
      u = P(I * H), d = P(H * I), n1 = P(H), n2 = P(H) }
  end
  local normW = P(H)
  local headW = cfg.tie_word_embeddings and embedW or P(V * H)
  -- the modules' parameters in forward order (the prefetch chain)
  local order = { pos = {} }
  local function add(v) order[#order + 1] = v.leaf; order.pos[v.leaf] = #order end
  add(embedW)
  for l = 1, L do
    local p = layers[l]
    for _, v in ipairs { p.n1, p.q, p.k, p.v, p.o, p.n2, p.g, p.u, p.d } do add(v) end
  end
  add(normW)
  if not cfg.tie_word_embeddings then add(headW) end
  S.order = order

  -- A plain training loop (out = engine(ids, labels); engine:backward(out.loss); engine:step()):
  -- the previous step's batch, logits and loss are garbage until the next collection.
  if o.gc ~= "ideal" then
    S.garbage[#S.garbage + 1] = S:new(N * 8, "other")
    for _, bytes in ipairs { N * V * b, 4 } do S.garbage[#S.garbage + 1] = S:new(bytes) end
  end
  -- input ids (the labels are the same tensor in a causal LM batch): the collator's tensors are
  -- created outside any op, in category "other"
  local ids = S:lua(S:new(N * 8, "other"))

  local function layer(p, x)
    S:push()
    local a1 = S:rms_norm(x, p.n1, N)
    local q = S:transpose(S:view(S:linear(a1, p.q, N * Hq * D * b)))
    local k = S:transpose(S:view(S:linear(a1, p.k, N * KV * D * b)))
    local v = S:transpose(S:view(S:linear(a1, p.v, N * KV * D * b)))
    q, k = S:rope(q), S:rope(k)
    local att = S:sdpa(q, k, v, B * Hq * T * 4, Hq ~= KV, { B, Hq, KV, T, D })
    local ao = S:linear(S:reshape(S:transpose(att)), p.o, N * H * b)
    local h = S:add(x, ao)
    local a2 = S:rms_norm(h, p.n2, N)
    local gate = S:linear(a2, p.g, N * I * b)
    local up = S:linear(a2, p.u, N * I * b)
    local out = S:add(h, S:linear(S:swiglu(gate, up), p.d, N * H * b))
    return S:pop(out)
  end

  S:push() -- LlamaForCausalLM.forward
  S:push() -- LlamaModel.forward
  local h = S:embedding(ids, embedW, N * H * b, b)
  for l = 1, L do
    local x, p = h, layers[l]
    if o.gradient_checkpointing then
      h = S:checkpoint(x, function(xx) return layer(p, xx) end)
    else
      h = layer(p, x)
    end
    S:forget(x)
  end
  local hn = S:pop(S:rms_norm(h, normW, N))
  -- head and loss (LlamaForCausalLM.forward, causal_lm_loss); a tied head is fetched at stage 3
  -- and stays gathered until backward ends
  if cfg.tie_word_embeddings then S:gather(headW, false, true); headW.leaf.keep = true end -- Module.fetch
  local logits = S:linear(hn, headW, N * V * b)
  S:push()
  -- causal_lm_loss shifts the labels (a -100 pad column, "other", and the shifted copy) and scores
  -- the logits as they are: a view, no copy, no fp32 upcast; cross_entropy saves logits + lse
  local rows = B * T
  S:lua(S:new(B * 8, "other"))
  S:lua(S:new(rows * 8))
  local lg = S:view(logits)
  local lse = S:new(rows * 4)
  local loss = S:lua(S:new(4))
  local lws = S:new(rows * 4, "ws")
  S:drop(lws)
  S:record(loss, { lg }, { lg, lse }, function(S2, _, g)
    local gi = S2:raw(g)
    local gx = S2:new(lg.n)
    S2:drop(gi)
    return { gx }
  end)
  S:drop(lse)
  S:pop(loss)
  S:pop(logits, loss) -- {logits=, loss=} is held by the caller through backward
  local fwd_act = S.cur.act
  S:gc_point() -- engine:backward collects before loss:backward()
  local g0 = S:new(4)
  S:backward(S.tape, loss.node, g0)
  return { activations = S.peak.act, forward = fwd_act, after_backward = S.cur.act, leaf_grads = S.peak.grads,
    workspace = S.peak.ws, gathered = S.peak.params }
end

-- ---------------------------------------------------------------------------------------------
-- The plan
-- ---------------------------------------------------------------------------------------------

local function parse_bytes(s)
  if type(s) == "number" then return s end
  local n, u = tostring(s):match("^%s*([%d%.]+)%s*(%a*)%s*$")
  n = tonumber(n)
  if not n then error(fmt("cannot read '%s' as a memory size (e.g. 80GB, 24GiB, 512MB)", tostring(s)), 0) end
  u = u:lower()
  local mult = ({ [""] = 1, b = 1, k = 2 ^ 10, kb = 2 ^ 10, kib = 2 ^ 10, m = 2 ^ 20, mb = 2 ^ 20, mib = 2 ^ 20,
    g = 2 ^ 30, gb = 2 ^ 30, gib = 2 ^ 30, t = 2 ^ 40, tb = 2 ^ 40, tib = 2 ^ 40 })[u]
  if not mult then error(fmt("unknown memory unit '%s' in '%s' (use GB, GiB, MB, ...)", u, s), 0) end
  return floor(n * mult)
end
M.parse_bytes = parse_bytes

-- Settings from the arguments and the DeepSpeed config (arguments win).
local function settings(o, cfg_model)
  local W = o.world_size or ((o.gpus_per_node or 1) * (o.nodes or o.num_nodes or 1))
  local ds = {}
  if o.config then
    ds = require("zrun.config").load(o.config, { world_size = W, hidden_size = cfg_model.hidden_size or cfg_model.n_embd })
  end
  local zc = ds.zero_optimization or {}
  local s = { world_size = W, gpus_per_node = o.gpus_per_node or W, nodes = o.nodes or o.num_nodes or 1 }
  s.stage = o.stage or zc.stage or 0
  s.offload_optimizer = o.offload_optimizer
  if s.offload_optimizer == nil then s.offload_optimizer = zc.offload_optimizer and zc.offload_optimizer.device == "cpu" or false end
  s.offload_param = o.offload_param
  if s.offload_param == nil then s.offload_param = zc.offload_param and zc.offload_param.device == "cpu" or false end
  -- overlap_comm: DeepSpeed's default is on at stage 3 and off below (zrun follows the config)
  if o.overlap_comm ~= nil then s.overlap_comm = o.overlap_comm
  elseif type(zc.overlap_comm) == "boolean" then s.overlap_comm = zc.overlap_comm
  else s.overlap_comm = s.stage == 3 end
  local pt = o.persistence_threshold or zc.stage3_param_persistence_threshold
  s.persistence_threshold = type(pt) == "number" and pt or 1e5 -- DeepSpeed's default
  local pf = o.prefetch_bucket_size or zc.stage3_prefetch_bucket_size
  s.prefetch_bucket_size = type(pf) == "number" and pf or 5e7 -- DeepSpeed's default
  local ml = o.max_live_parameters or zc.stage3_max_live_parameters
  s.max_live_parameters = type(ml) == "number" and ml or 1e9
  local rbs = o.reduce_bucket_size or zc.reduce_bucket_size
  s.reduce_bucket_size = type(rbs) == "number" and rbs or 5e8
  local dt = o.dtype
  if not dt then
    if ds.bf16 and ds.bf16.enabled == true then dt = "bf16"
    elseif ds.fp16 and ds.fp16.enabled == true then dt = "f16"
    else dt = "f32" end
  end
  s.dtype = canon_dtype(dt)
  s.dtype_bytes = DTYPE_BYTES[s.dtype]
  if not s.dtype_bytes then error(fmt("memory plan: dtype must be f32, bf16 or f16, got '%s'", tostring(dt)), 0) end
  local mb = o.micro_batch or ds.train_micro_batch_size_per_gpu
  s.micro_batch = type(mb) == "number" and mb or 1
  s.seq_len = o.seq_len or 1024
  s.gradient_checkpointing = o.gradient_checkpointing and true or false
  s.gc = o.gc or M.DEFAULT_GC
  s.device = o.device or "cuda"
  s.gas = type(ds.gradient_accumulation_steps) == "number" and ds.gradient_accumulation_steps or 1
  if s.stage < 0 or s.stage > 3 or s.stage ~= floor(s.stage) then
    error("memory plan: zero_optimization.stage must be 0, 1, 2 or 3, got " .. tostring(s.stage), 0)
  end
  if s.offload_param and s.stage ~= 3 then
    error("memory plan: zero_optimization.offload_param needs stage 3 (got stage " .. s.stage .. ")", 0)
  end
  if s.offload_optimizer and s.stage == 0 then
    error("memory plan: zero_optimization.offload_optimizer needs stage 1, 2 or 3", 0)
  end
  if s.seq_len < 2 then error("memory plan: seq_len must be at least 2 (the causal LM loss shifts by one)", 0) end
  return s
end

local CATS = { "params", "grads", "optimizer", "activations", "comm", "workspace" }
M.categories = CATS

-- zr.memory.plan{model=, config=, micro_batch=, seq_len=, gradient_checkpointing=, world_size= |
-- gpus_per_node= + nodes=, dtype=, stage=, offload_optimizer=, offload_param=, gc=, device=}
-- Returns {device = {<category> = peak bytes, total=}, host = {...}, settings=, notes=, ...};
-- tostring(plan) is the printed table.
function M.plan(o)
  o = o or {}
  if o.model == nil then error("zr.memory.plan: `model` (a model, a config or a model name) is required", 2) end
  local total, largest, list, r = E.count(o.model)
  local cfg = r.config or {}
  local s = settings(o, cfg)
  local W, b = s.world_size, s.dtype_bytes
  local Wc = s.stage == 0 and 1 or W -- chunks per parameter (zero.c: stage 0 keeps W = 1)
  local S, max_c, maxn, maxn2 = 0, 0, 0, 0
  for _, p in ipairs(list) do
    local c = ceil(p.numel / Wc)
    S = S + c
    if c > max_c then max_c = c end
    if p.numel > maxn then maxn, maxn2 = p.numel, maxn
    elseif p.numel > maxn2 then maxn2 = p.numel end
  end
  local dev = { params = 0, grads = 0, optimizer = 0, activations = 0, comm = 0, workspace = 0 }
  local host = { params = 0, grads = 0, optimizer = 0, activations = 0, comm = 0, workspace = 0 }
  local notes = {}
  local opt = s.offload_optimizer and host or dev

  -- model states (zero.c: zr_zero_new)
  opt.optimizer = 3 * S * 4 -- fp32 master, exp_avg, exp_avg_sq partitions
  opt.grads = S * 4         -- reduced fp32 gradient partition
  -- direct mode (zero.c): one chunk per parameter and the partition on the device: .grad are views
  -- into the partition, weights views into one flat buffer, no reduce buckets
  local direct = Wc == 1 and s.stage <= 2 and (not s.offload_optimizer or s.device == "cpu") -- on the CPU offload moves nothing
  if s.stage <= 1 and not direct then dev.grads = dev.grads + total * 4 end -- full fp32 .grad per parameter
  if s.stage <= 2 then
    dev.params = total * b
  else -- the 16-bit shard; gathered parameters are added below (one module's at a time)
    local shard = s.offload_param and host or dev
    shard.params = S * b
    -- parameters below stage3_param_persistence_threshold are never released (zero.c)
    for _, p in ipairs(list) do
      if p.numel < s.persistence_threshold then dev.params = dev.params + p.numel * b end
    end
  end
  -- comm buckets (zero.c): send W*cap fp32, plus compaction copy and receive buffer when W > 1
  local cap = floor(s.reduce_bucket_size / Wc)
  if cap < max_c then cap = max_c end
  if cap > S then cap = S end
  dev.comm = direct and 0 or (cap * Wc * 4 + (Wc > 1 and (cap * Wc * 4 + cap * 4) or 0))
  -- overlap_comm keeps a second buffer set so a bucket can be reduced while the next one fills
  if s.overlap_comm and Wc > 1 and not direct then dev.comm = dev.comm * 2 end
  local comm_tr = 0
  if Wc > 1 and s.stage <= 2 then comm_tr = cap * b + cap * Wc * b end -- all-gather of updated weights
  -- stage 3 all-gathers straight into the parameters' storage (counted as params); with
  -- offload_param the host shard's slice is staged on the device first
  if s.stage == 3 and s.offload_param then comm_tr = max(comm_tr, ceil(maxn / Wc) * b) end
  dev.comm = dev.comm + comm_tr
  if s.offload_optimizer and not direct then
    -- zero_offload.c: a pinned staging bucket for gradients that are added to the partition (all
    -- but the first of a step after zero_grad; made once, on the first step)
    host.comm = cap * 4
    -- the new 16-bit weights are written into a pinned host buffer and uploaded from there (one
    -- world: into each parameter; stage 3: into the device shard)
    if (s.stage < 3 and Wc == 1) or (s.stage == 3 and not s.offload_param) then host.params = host.params + S * b end
  end

  -- activations
  local fam = E.family(cfg)
  local act
  if fam ~= "gpt2" then
    act = llama_activations(cfg, { micro_batch = s.micro_batch, seq_len = s.seq_len, dtype_bytes = b,
      stage = s.stage, stage3 = s.stage == 3, gradient_checkpointing = s.gradient_checkpointing, gc = s.gc,
      direct = direct, persistence_threshold = s.persistence_threshold,
      prefetch = s.prefetch_bucket_size, max_live = s.max_live_parameters,
      dw_in_place = direct and s.device ~= "cpu", gpu = s.device ~= "cpu", trace = o.trace })
    dev.activations = act.activations
    dev.grads = dev.grads + act.leaf_grads
    dev.workspace = act.workspace
  else
    notes[#notes + 1] = "activations are modelled for the Llama family only; gpt2 shows model states"
  end
  if s.stage == 3 then
    -- ZeRO-3 gathers a module's parameters (full size, 16-bit, on the device) for its forward and
    -- again for its backward, and releases them after; saved weights are the parameters
    -- themselves, so nothing pins a released copy. The embedding (its input needs no gradient)
    -- and a tied LM head (fetched outside its module) stay gathered until backward ends.
    local gathered = act and act.gathered or (maxn + (cfg.tie_word_embeddings and maxn2 or 0)) * b
    dev.params = dev.params + gathered
  end
  -- engine:step: the global gradient norm reads the fp32 partition once (a fused kernel on the
  -- GPU, an OpenMP reduction on the host): no temporary
  if s.device == "cpu" and b ~= 4 then
    notes[#notes + 1] = "16-bit on the CPU: ops widen inputs to fp32 copies that this plan does not count"
  end
  if s.gradient_checkpointing and s.gc == "none" then
    notes[#notes + 1] = "checkpointing frees nothing while Lua does not collect during the step: the " ..
      "recomputed and the discarded activations stay until a collection (gc = \"none\")"
  end
  if s.gc ~= M.DEFAULT_GC then
    notes[#notes + 1] = fmt("gc = \"%s\" is a what-if: zrun collects before backward and around checkpointed " ..
      "segments (gc = \"backward\")", s.gc)
  end

  local function sum(t)
    local n = 0
    for _, c in ipairs(CATS) do n = n + t[c] end
    return n
  end
  dev.total = sum(dev)
  host.total = sum(host)
  -- Setup (model construction + zr.initialize), before the first step: zrun builds the model
  -- whole in its training dtype, and zr_zero_new allocates the states, the buckets and (stage 3)
  -- the shard before it releases the full parameters. Only at stage 3 can this exceed training.
  local setup = { params = total * b + (direct and S * b or 0), -- direct: the flat copy, then originals freed
    grads = (s.stage <= 1 and not direct and total * 4 or 0) + (s.offload_optimizer and 0 or S * 4),
    optimizer = s.offload_optimizer and 0 or 3 * S * 4, comm = dev.comm - comm_tr }
  if s.stage == 3 and not s.offload_param then setup.params = setup.params + S * b end
  setup.total = setup.params + setup.grads + setup.optimizer + setup.comm
  if s.stage == 3 then
    notes[#notes + 1] = fmt("stage 3: the model is built whole before zr.initialize partitions it; that setup " ..
      "peak is %s per rank (the whole model in %s%s, and the states)", human(setup.total), s.dtype,
      s.offload_param and "" or ", its shard")
  end
  local training_total = dev.total
  if setup.total > dev.total then dev.total = setup.total end

  local plan = { device = dev, host = host, setup = setup, training_total = training_total, settings = s, notes = notes, total_params = total,
    largest_layer_params = largest, partition_numel = S, name = r.name,
    activations_forward = act and act.forward, host_per_node = host.total * s.gpus_per_node }
  return setmetatable(plan, { __tostring = M.format })
end

function M.format(p)
  local s = p.settings
  local lines = {}
  lines[1] = fmt("memory plan for %s (%s parameters), per rank", p.name or "model", require("zrun.memory_describe").commas(p.total_params))
  lines[2] = fmt("  ZeRO stage %d, %d rank%s (%d per node x %d node%s), %s, micro-batch %d x %d tokens%s%s%s",
    s.stage, s.world_size, s.world_size > 1 and "s" or "", s.gpus_per_node, s.nodes, s.nodes > 1 and "s" or "",
    s.dtype, s.micro_batch, s.seq_len, s.gradient_checkpointing and ", activation checkpointing" or "",
    s.offload_optimizer and ", optimizer offloaded" or "", s.offload_param and ", params offloaded" or "")
  lines[#lines + 1] = fmt("  %-12s %14s %14s", "category", s.device == "cpu" and "device (cpu)" or "GPU", "host")
  for _, c in ipairs(CATS) do
    lines[#lines + 1] = fmt("  %-12s %14s %14s", c, human(p.device[c]), human(p.host[c]))
  end
  lines[#lines + 1] = fmt("  %-12s %14s %14s", "peak total", human(p.device.total), human(p.host.total))
  if s.gpus_per_node > 1 and p.host.total > 0 then
    lines[#lines + 1] = fmt("  host memory per node (%d ranks): %s", s.gpus_per_node, human(p.host_per_node))
  end
  for _, n in ipairs(p.notes) do lines[#lines + 1] = "  note: " .. n end
  return concat(lines, "\n")
end

-- ---------------------------------------------------------------------------------------------
-- Fit: the cheapest settings that fit, in DeepSpeed's usual order.
-- ---------------------------------------------------------------------------------------------

local function biggest(p)
  local best, bv = nil, -1
  for _, c in ipairs(CATS) do if p.device[c] > bv then best, bv = c, p.device[c] end end
  return best, bv
end

-- zr.memory.fit{model=, config=, micro_batch=, seq_len=, gpu_memory=, host_memory=, gpus_per_node=,
-- nodes=, headroom=} -> {fits=, plan=, settings=, steps = {{change=, reason=, plan=, fits=}}, text=}
function M.fit(o)
  local gpu = parse_bytes(o.gpu_memory or error("zr.memory.fit: gpu_memory is required (e.g. \"80GB\")", 2))
  local hostmem = o.host_memory and parse_bytes(o.host_memory)
  -- CUDA context, allocator rounding and fragmentation: keep 5% and 1 GiB free
  local usable = floor(gpu * (1 - (o.headroom or 0.05))) - (o.reserve or 2 ^ 30)
  local cur = {}
  for k, v in pairs(o) do cur[k] = v end
  local base = M.plan(cur)
  for k, v in pairs(base.settings) do if cur[k] == nil then cur[k] = v end end
  cur.stage, cur.micro_batch = base.settings.stage, base.settings.micro_batch
  local steps = {}
  local function fits(p)
    if p.device.total > usable then return false end
    if hostmem and p.host_per_node > hostmem then return false end
    return true
  end
  local function try(change, mutate, why)
    local nxt = {}
    for k, v in pairs(cur) do nxt[k] = v end
    mutate(nxt)
    local p = M.plan(nxt)
    steps[#steps + 1] = { change = change, reason = why, plan = p, fits = fits(p) }
    cur = nxt
    return p
  end
  local p = base
  steps[1] = { change = "as configured", reason = "", plan = p, fits = fits(p) }
  local accepted = p
  local function why_not(pl)
    local c, v = biggest(pl)
    local hostmsg = ""
    if hostmem and pl.host_per_node > hostmem then
      hostmsg = fmt("; host memory per node %s > %s", human(pl.host_per_node), human(hostmem))
    end
    return fmt("needs %s per GPU > %s usable (largest: %s %s)%s", human(pl.device.total), human(usable), c, human(v), hostmsg)
  end
  local order = {
    { "stage 2", function(t) return t.stage < 2 end, function(t) t.stage = 2 end,
      "shards gradients and optimizer states over the ranks (ZeRO-2)" },
    { "stage 3", function(t) return t.stage < 3 end, function(t) t.stage = 3 end,
      "shards the 16-bit parameters too (ZeRO-3)" },
    { "offload_optimizer: cpu", function(t) return not t.offload_optimizer end,
      function(t) t.offload_optimizer = true; if t.stage < 1 then t.stage = 2 end end, -- offload needs stage >= 1
      "moves fp32 master weights, Adam states and reduced gradients to pinned host memory" },
    { "offload_param: cpu", function(t) return t.stage == 3 and not t.offload_param end, function(t) t.offload_param = true end,
      "keeps parameter shards in host memory" },
    { "activation checkpointing", function(t) return not t.gradient_checkpointing end,
      function(t) t.gradient_checkpointing = true end, "keeps only each layer's input and recomputes the rest in backward" },
  }
  local i = 1
  while not steps[#steps].fits do
    local st = order[i]
    if st then
      i = i + 1
      if st[2](cur) then
        local before = accepted
        local reason = why_not(before)
        local prev = cur
        local np = try(st[1], st[3], st[4])
        local saved = before.device.total - np.device.total
        local last = steps[#steps]
        if saved <= 0 and not last.fits then -- no gain with zrun's allocation pattern: not kept
          cur, last.skipped = prev, true
          last.reason = fmt("%s: %s; saves nothing here with zrun's allocations, so it is not kept", reason, st[4])
        else
          accepted = np
          last.reason = fmt("%s: %s; saves %s per GPU", reason, st[4], human(saved))
        end
      end
    elseif cur.micro_batch > 1 then
      local before = accepted
      local reason = why_not(before)
      local mb = floor(cur.micro_batch / 2)
      accepted = try(fmt("micro-batch %d (gradient accumulation x2 keeps the global batch)", mb),
        function(t) t.micro_batch = mb end, "")
      steps[#steps].reason = reason .. ": activations scale with the micro-batch"
    else
      break
    end
  end
  local last = steps[#steps]
  if last.skipped then for k = #steps, 1, -1 do if not steps[k].skipped then last = steps[k]; break end end end
  local lines = { fmt("fit on %s GPUs (%s usable after 5%% and 1 GiB headroom)%s:", human(gpu), human(usable),
    hostmem and (", " .. human(hostmem) .. " host memory per node") or "") }
  for k, st in ipairs(steps) do
    lines[#lines + 1] = fmt("  %d. %-40s GPU %12s  host/node %12s  %s", k, st.change, human(st.plan.device.total),
      human(st.plan.host_per_node), st.fits and "fits" or (st.skipped and "skipped" or "does not fit"))
    if st.reason ~= "" then lines[#lines + 1] = "       why: " .. st.reason end
  end
  if last.fits then
    local ss = last.plan.settings
    lines[#lines + 1] = fmt("proposal: zero_optimization.stage %d%s%s, micro-batch %d%s", ss.stage,
      ss.offload_optimizer and ", offload_optimizer cpu" or "", ss.offload_param and ", offload_param cpu" or "",
      ss.micro_batch, ss.gradient_checkpointing and ", activation checkpointing on" or "")
  else
    lines[#lines + 1] = "nothing fits: use more GPUs (stage 3 divides the states by the number of ranks), " ..
      "a shorter sequence length, or GPUs with more memory"
  end
  local res = { fits = last.fits, plan = last.plan, settings = last.plan.settings, steps = steps, usable = usable }
  res.text = concat(lines, "\n")
  return setmetatable(res, { __tostring = function(t) return t.text end })
end

-- ---------------------------------------------------------------------------------------------
-- zrun plan MODEL [--config ds.json] [--micro-batch B] [--seq-len T] [--gpus-per-node N --nodes M]
--                 [--stage S] [--dtype bf16] [--gradient-checkpointing] [--offload-optimizer]
--                 [--offload-param] [--gc none|backward|ideal] [--fit --gpu-memory 80GB [--host-memory 512GB]]
-- ---------------------------------------------------------------------------------------------
local USAGE = [==[usage: zrun plan MODEL [--config ds.json] [--micro-batch B] [--seq-len T]
                 [--gpus-per-node N] [--nodes M] [--stage 0-3] [--dtype f32|bf16|f16]
                 [--gradient-checkpointing] [--offload-optimizer] [--offload-param]
                 [--device cuda|cpu] [--gc none|backward|ideal]
                 [--fit --gpu-memory 80GB [--host-memory 512GB]]
  MODEL: a Hugging Face model dir, a config.json, a cached hub id, or a built-in name
  --gc: when Lua's collector frees forward temporaries; the default, backward, is what zrun
        does (it collects before backward and around checkpointed segments); none and ideal
        are what-ifs]==]

function M.main_plan(args)
  local flags = { help = true, fit = true, ["gradient-checkpointing"] = true, ["offload-optimizer"] = true,
    ["offload-param"] = true }
  local o, pos = E.parse_args(args or {}, flags)
  if o.help or #pos ~= 1 then
    print(USAGE)
    return o.help and 0 or 1
  end
  local known = { config = 1, ["micro-batch"] = 1, ["seq-len"] = 1, ["gpus-per-node"] = 1, gpus = 1, nodes = 1, stage = 1,
    dtype = 1, ["gradient-checkpointing"] = 1, ["offload-optimizer"] = 1, ["offload-param"] = 1, device = 1, gc = 1,
    fit = 1, ["gpu-memory"] = 1, ["host-memory"] = 1, help = 1 }
  for k in pairs(o) do if not known[k] then error(fmt("zrun plan: unknown option --%s\n%s", k, USAGE), 0) end end
  local function int(k)
    if o[k] == nil then return nil end
    local n = tonumber(o[k])
    if not n or n < 0 or n ~= floor(n) then error(fmt("zrun plan: --%s must be an integer, got '%s'", k, o[k]), 0) end
    return n
  end
  local gc = o.gc
  if gc and gc ~= "none" and gc ~= "backward" and gc ~= "ideal" then error("zrun plan: --gc must be none, backward or ideal", 0) end
  local opts = { model = pos[1], config = o.config, micro_batch = int("micro-batch"), seq_len = int("seq-len"),
    gpus_per_node = int("gpus-per-node") or int("gpus") or 1, nodes = int("nodes") or 1, stage = int("stage"),
    dtype = o.dtype, gradient_checkpointing = o["gradient-checkpointing"] or nil,
    offload_optimizer = o["offload-optimizer"] or nil, offload_param = o["offload-param"] or nil,
    device = o.device, gc = gc, gpu_memory = o["gpu-memory"], host_memory = o["host-memory"] }
  if opts.dtype == nil and not opts.config and (opts.device or "cuda") ~= "cpu" then opts.dtype = "bf16" end
  print(tostring(M.plan(opts)))
  if o.fit then
    if not o["gpu-memory"] then error("zrun plan --fit needs --gpu-memory (e.g. --gpu-memory 80GB)", 0) end
    print("")
    print(tostring(M.fit(opts)))
  end
  return 0
end

return M
