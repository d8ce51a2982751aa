-- nn.Module: the base class of every layer and model, with torch semantics. Parameters and
-- submodules assigned as fields (self.weight = nn.Parameter(t), self.fc1 = nn.Linear(...)) are
-- registered in assignment order, so dotted names ("layers.0.mlp.up_proj.weight") come out in
-- Hugging Face order. Not here: the layers themselves (linear.lua, ...), optimizers (zrun.optim).
local C = require "zrun._C"

local is_tensor, set_grad_enabled = C.is_tensor, C.set_grad_enabled
local concat, sort, fmt = table.concat, table.sort, string.format
local type, rawget, rawset, pairs, ipairs, select, tostring = type, rawget, rawset, pairs, ipairs, select, tostring

local Module = { __name = "Module" }

local function is_module(v)
  return type(v) == "table" and rawget(v, "_modules") ~= nil and rawget(v, "_parameters") ~= nil
end
Module.is_module = is_module

-- Ordered name → value store: the order list keeps registration order, the map the values.
local function store_set(map, order, name, v)
  if map[name] == nil then order[#order + 1] = name end
  map[name] = v
end
local function store_del(map, order, name)
  if map[name] == nil then return end
  map[name] = nil
  for i = 1, #order do
    if order[i] == name then table.remove(order, i); break end
  end
end

local function shape_str(t) return "(" .. concat(t:shape(), ",") .. ")" end

-- Makes t a parameter: a leaf f32 tensor that requires grad, its memory tagged "params".
-- A tensor with history is detached first (sharing its data).
function Module.Parameter(t, requires_grad)
  if not is_tensor(t) then error("Parameter: expected a tensor, got " .. type(t), 2) end
  if not t.is_leaf then t = t:detach() end
  t:requires_grad_(requires_grad ~= false)
  t:category("params")
  return t
end

-- Instance metatable of a class: fields resolve parameters, buffers, submodules, then methods.
local function make_mt(cls)
  local mt = {}
  mt.__index = function(self, k)
    local v = self._parameters[k]
    if v ~= nil then return v end
    v = self._modules[k]
    if v ~= nil then return v end
    v = self._buffers[k]
    if v ~= nil then return v end
    return cls[k]
  end
  mt.__newindex = function(self, k, v)
    if type(k) == "number" then -- containers: self[i] is the child named tostring(i - 1)
      if not is_module(v) then error(fmt("%s[%d]: expected a module, got %s", cls.__name, k, type(v)), 2) end
      self:add_module(tostring(k - 1), v)
      rawset(self, k, v)
      return
    end
    if is_module(v) then
      store_del(self._parameters, self._param_order, k)
      store_del(self._buffers, self._buffer_order, k)
      self:add_module(k, v)
    elseif is_tensor(v) and (self._parameters[k] ~= nil or (v.is_leaf and (v.requires_grad or v:category() == "params"))) then
      self:register_parameter(k, v)
    elseif is_tensor(v) and self._buffers[k] ~= nil then
      self._buffers[k] = v
    elseif v == nil and (self._parameters[k] ~= nil or self._modules[k] ~= nil or self._buffers[k] ~= nil) then
      store_del(self._parameters, self._param_order, k)
      store_del(self._modules, self._module_order, k)
      store_del(self._buffers, self._buffer_order, k)
    else
      rawset(self, k, v)
    end
  end
  mt.__call = function(self, ...) return self:_call(...) end
  mt.__tostring = function(self) return self:_repr("") end
  return mt
end

local class_mt = {
  __call = function(cls, ...) return cls.new(cls, ...) end,
  __tostring = function(cls) return "class " .. cls.__name end,
}

-- Creates a subclass: local Linear = Module:extend("Linear"); function Linear:__init(...) end.
function Module.extend(parent, name)
  local cls = { __name = name or "Module", __super = parent }
  cls.__mt = make_mt(cls)
  return setmetatable(cls, { __index = parent, __call = class_mt.__call, __tostring = class_mt.__tostring })
end

-- Instances get the base fields before the class's __init runs (no super call is needed).
function Module.new(cls, ...)
  local self = setmetatable({
    _parameters = {}, _param_order = {}, _buffers = {}, _buffer_order = {}, _nonpersistent = {},
    _modules = {}, _module_order = {}, training = true,
  }, cls.__mt)
  self:__init(...)
  return self
end

Module.__mt = make_mt(Module)
setmetatable(Module, class_mt)

-- Module(): a bare module with no parameters or children, to assign them to; a subclass's own
-- __init replaces this one (which does nothing).
function Module:__init() end

-- Subclasses define forward(...); module(...) runs the hooks around it.
function Module:forward()
  error(fmt("%s: forward() is not implemented", self.__name), 2)
end

-- ---------- registration ----------

-- Registers t (a tensor, or nil to reserve the name) as parameter `name`, as self.name = nn.Parameter(t) does.
function Module:register_parameter(name, t)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    error(fmt("register_parameter: bad name '%s' (a non-empty string without dots)", tostring(name)), 2)
  end
  if t ~= nil and not is_tensor(t) then error(fmt("register_parameter '%s': expected a tensor or nil", name), 2) end
  if self._modules[name] ~= nil then error(fmt("register_parameter: '%s' is already a submodule", name), 2) end
  rawset(self, name, nil)
  if t == nil then store_del(self._parameters, self._param_order, name); return end
  -- a frozen parameter (Parameter(t, false)) stays frozen; any other tensor becomes trainable
  if not t.is_leaf or t:category() ~= "params" then t = Module.Parameter(t) end
  store_set(self._parameters, self._param_order, name, t)
end

-- Buffers are tensors that are part of the module's state but not trained (caches, running
-- statistics). persistent=false keeps them out of state_dict().
function Module:register_buffer(name, t, persistent)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    error(fmt("register_buffer: bad name '%s'", tostring(name)), 2)
  end
  rawset(self, name, nil)
  if t == nil then store_del(self._buffers, self._buffer_order, name); return end
  if not is_tensor(t) then error(fmt("register_buffer '%s': expected a tensor", name), 2) end
  store_set(self._buffers, self._buffer_order, name, t)
  self._nonpersistent[name] = persistent == false or nil
end

-- Registers module m as child `name`, as self.name = m does (m = nil removes the child); also
-- Module:register_module. Raises for a name that is not a non-empty string without dots, for m
-- not a module, or for a name that is already a parameter. Returns m.
function Module:add_module(name, m)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    error(fmt("add_module: bad name '%s' (a non-empty string without dots)", tostring(name)), 2)
  end
  if m ~= nil and not is_module(m) then error(fmt("add_module '%s': expected a module, got %s", name, type(m)), 2) end
  if self._parameters[name] ~= nil then error(fmt("add_module: '%s' is already a parameter", name), 2) end
  rawset(self, name, nil)
  if m == nil then store_del(self._modules, self._module_order, name); return end
  store_set(self._modules, self._module_order, name, m)
  return m
end
Module.register_module = Module.add_module

-- ---------- traversal ----------

-- Iterator over (name, child) in registration order.
function Module:named_children()
  local i, order, mods = 0, self._module_order, self._modules
  return function()
    i = i + 1
    local n = order[i]
    if n then return n, mods[n] end
  end
end

-- The direct submodules, in registration order.
function Module:children()
  local out = {}
  for _, n in ipairs(self._module_order) do out[#out + 1] = self._modules[n] end
  return out
end

-- Pre-order list of {name, module}, self first (name ""); each module once.
local function collect_modules(self, prefix, memo, out)
  if memo[self] then return end
  memo[self] = true
  out[#out + 1] = { prefix, self }
  for _, n in ipairs(self._module_order) do
    collect_modules(self._modules[n], prefix == "" and n or (prefix .. "." .. n), memo, out)
  end
end

local function list_iter(list)
  local i = 0
  return function()
    i = i + 1
    local e = list[i]
    if e then return e[1], e[2] end
  end
end

-- Iterates name, module over self (name "") and every submodule, pre-order, each once.
function Module:named_modules(prefix)
  local out = {}
  collect_modules(self, prefix or "", {}, out)
  return list_iter(out)
end

-- List of self and every submodule, pre-order, each once (named_modules without the names).
function Module:modules()
  local out = {}
  collect_modules(self, "", {}, out)
  for i = 1, #out do out[i] = out[i][2] end
  return out
end

-- List of {name, tensor} for parameters (kind "_parameters") or buffers, in module pre-order.
-- Shared tensors (tied weights) appear once, under their first name, unless keep_duplicates.
local function collect_tensors(self, kind, order_key, recurse, keep_duplicates)
  local mods = {}
  if recurse == false then mods[1] = { "", self } else collect_modules(self, "", {}, mods) end
  local out, seen = {}, {}
  for _, e in ipairs(mods) do
    local prefix, m = e[1], e[2]
    for _, n in ipairs(m[order_key]) do
      local t = m[kind][n]
      if keep_duplicates or not seen[t] then
        seen[t] = true
        out[#out + 1] = { prefix == "" and n or (prefix .. "." .. n), t, m, n }
      end
    end
  end
  return out
end

-- Iterator over (dotted name, parameter): for name, p in model:named_parameters() do ... end
function Module:named_parameters(recurse)
  return list_iter(collect_tensors(self, "_parameters", "_param_order", recurse))
end

-- List of parameters (each once), for optimizers: zr.optim.AdamW(model:parameters(), ...)
function Module:parameters(recurse)
  local l = collect_tensors(self, "_parameters", "_param_order", recurse)
  for i = 1, #l do l[i] = l[i][2] end
  return l
end

-- Buffers (tensors that are state but not parameters), with their dotted names or as a list.
function Module:named_buffers(recurse)
  return list_iter(collect_tensors(self, "_buffers", "_buffer_order", recurse))
end

-- List of buffers (each once), in module pre-order; recurse = false: this module's own only.
function Module:buffers(recurse)
  local l = collect_tensors(self, "_buffers", "_buffer_order", recurse)
  for i = 1, #l do l[i] = l[i][2] end
  return l
end

-- Whether m is an instance of cls or of a class derived from it (Python's isinstance).
function Module.isinstance(m, cls)
  if type(m) ~= "table" then return false end
  if getmetatable(m) == cls.__mt then return true end
  local c = m.__super
  while c do
    if c == cls then return true end
    c = c.__super
  end
  return false
end

-- Number of parameter elements (tied weights counted once); trainable_only skips frozen ones;
-- exclude_embeddings the weights of Embedding modules (and a head tied to one), as transformers'
-- num_parameters(exclude_embeddings=True) counts them for its FLOPs estimate.
function Module:num_parameters(trainable_only, exclude_embeddings)
  local skip = {}
  if exclude_embeddings then
    local Embedding = require("zrun.nn").Embedding
    for _, m in ipairs(self:modules()) do
      if Module.isinstance(m, Embedding) and m.weight then skip[m.weight] = true end
    end
  end
  local n = 0
  for _, p in ipairs(self:parameters()) do
    if (not trainable_only or p.requires_grad) and not skip[p] then n = n + p:numel() end
  end
  return n
end

-- ---------- modes, hooks, calls ----------

-- Sets training mode (default true) on self and every submodule; eval() is train(false). Returns self.
function Module:train(mode)
  if mode == nil then mode = true end
  for _, m in ipairs(self:modules()) do rawset(m, "training", mode and true or false) end
  return self
end

-- Sets evaluation mode (training = false) on self and every submodule: train(false). Returns self.
function Module:eval() return self:train(false) end

-- Sets requires_grad on every parameter (default true; false freezes them). Returns self.
function Module:requires_grad_(on)
  for _, p in ipairs(self:parameters()) do p:requires_grad_(on ~= false) end
  return self
end

-- fn(module) on every submodule (children first, as torch does), then on self.
function Module:apply(fn)
  for _, n in ipairs(self._module_order) do self._modules[n]:apply(fn) end
  fn(self)
  return self
end

-- Drops every parameter's .grad (set_to_none = false: zeroes it in place instead).
function Module:zero_grad(set_to_none)
  for _, p in ipairs(self:parameters()) do
    if set_to_none == false then
      local g = p.grad
      if g then g:zero_() end
    else
      p.grad = nil
    end
  end
end

-- Hooks run around forward: pre(module, ...) may return replacement arguments (as a table);
-- post(module, output, ...) may return a replacement output. Global hooks (the ZeRO-3 engine
-- gathers and releases parameters with them) run for every module, before local ones.
local global_pre, global_post = {}, {}
-- Global hooks registered as acting on a module's own parameters only (own_params: the ZeRO-3
-- engine's gather and release), whatever the module computes; see Module:groupable().
local own_params = setmetatable({}, { __mode = "k" })

local hook_generation = 0 -- changes whenever a hook is added or removed (temporaries_scope's cache)
local function add_hook(list, fn)
  list[#list + 1] = fn
  hook_generation = hook_generation + 1
  return { remove = function()
    for i = #list, 1, -1 do if list[i] == fn then table.remove(list, i) end end
    hook_generation = hook_generation + 1
  end }
end

local keeps_nothing = setmetatable({}, { __mode = "k" }) -- hooks registered with keeps_tensors = false
local function hook_opts(fn, opts)
  for k in pairs(opts or {}) do
    if k ~= "keeps_tensors" then error(fmt("register_forward_hook: unknown option '%s' (keeps_tensors)", tostring(k)), 3) end
  end
  if opts and opts.keeps_tensors == false then keeps_nothing[fn] = true end
end
-- Hooks on this module only (see above); each returns a handle with :remove(). opts.keeps_tensors
-- = false (zrun's): the hook keeps no tensor past its call (it may return one), so the model's
-- forward still frees its temporaries when it returns (Module:temporaries_scope); any other hook
-- could keep one, and the forward then leaves them to the collector.
function Module:register_forward_pre_hook(fn, opts)
  hook_opts(fn, opts)
  local l = rawget(self, "_pre_hooks") or {}
  rawset(self, "_pre_hooks", l)
  return add_hook(l, fn)
end

-- The post hook on this module only: fn(module, output, ...) after forward, its return (if not
-- nil) replacing the output; opts as register_forward_pre_hook's. Returns a handle with :remove().
function Module:register_forward_hook(fn, opts)
  hook_opts(fn, opts)
  local l = rawget(self, "_post_hooks") or {}
  rawset(self, "_post_hooks", l)
  return add_hook(l, fn)
end

-- Hooks on every module (see above); each returns a handle with :remove(). own_params (zrun's,
-- not torch's): the hook acts only on the parameters a module holds itself (the ZeRO-3 engine's
-- gather and release), so a fused op may stand for several modules' calls (Module.call_group).
function Module.register_module_forward_pre_hook(fn, own_params_only)
  if own_params_only then own_params[fn] = true end
  return add_hook(global_pre, fn)
end
-- The same for a hook run after every module's forward: post(module, output, ...).
function Module.register_module_forward_hook(fn, own_params_only)
  if own_params_only then own_params[fn] = true end
  return add_hook(global_post, fn)
end

-- The hooks of a call standing for the modules mods (one module: its own call): each module's
-- pre-hooks (global, then its own) in turn, fn(...) (fself: fn(fself, ...)), then each module's
-- post-hooks on fn's first result.
local function run_hooked(mods, fn, fself, pre, post, ...)
  local args = { n = select("#", ...), ... }
  for _, m in ipairs(mods) do
    for _, list in ipairs { global_pre, pre or {} } do
      for _, h in ipairs(list) do
        local r = h(m, unpack(args, 1, args.n))
        if r ~= nil then args = { n = #r, unpack(r) } end
      end
    end
  end
  local out
  if fself then out = { fn(fself, unpack(args, 1, args.n)) } else out = { fn(unpack(args, 1, args.n)) } end
  for _, m in ipairs(mods) do
    for _, list in ipairs { global_post, post or {} } do
      for _, h in ipairs(list) do
        local r = h(m, out[1], unpack(args, 1, args.n))
        if r ~= nil then out[1] = r end
      end
    end
  end
  return unpack(out)
end

local function own_hooks(m)
  local pre, post = rawget(m, "_pre_hooks"), rawget(m, "_post_hooks")
  return (pre and #pre > 0) or (post and #post > 0)
end

local scope_ok = setmetatable({}, { __mode = "k" }) -- model -> hook generation it was checked at
local function may_keep(list)
  for _, h in ipairs(list or {}) do if not keeps_nothing[h] then return true end end
  return false
end
-- Whether every global hook acts on a module's own parameters only (none, or ZeRO-3's).
local function global_hooks_own_params()
  for _, list in ipairs { global_pre, global_post } do
    for _, h in ipairs(list) do
      if not own_params[h] then return false end
    end
  end
  return true
end
-- A model's forward frees the tensors it made and does not return when it returns, as PyTorch's
-- reference counting does, instead of leaving them to Lua's collector: a full collection walks the
-- whole Lua heap (a tokenized dataset of 50k rows: ~130 ms), and the engine would otherwise pay
-- one every micro-batch. The scope (a handle serial, for Module.end_scope) is nil when a hook
-- could have kept one of them: one a user registered on a module of this model, or on every
-- module (ZeRO-3's act on parameters only). A cache built inside forward is marked zr.persist(t).
function Module:temporaries_scope()
  if scope_ok[self] ~= hook_generation then
    if not global_hooks_own_params() then return nil end
    for _, m in ipairs(self:modules()) do
      if may_keep(rawget(m, "_pre_hooks")) or may_keep(rawget(m, "_post_hooks")) then return nil end
    end
    scope_ok[self] = hook_generation
  end
  return C.handle_serial()
end
-- Frees the tensors made since scope (from temporaries_scope; nil: nothing) except the tensors
-- among ... (tensors, or tables of them one level deep); returns ...
function Module.end_scope(scope, ...)
  if scope then C.release_since(scope, ...) end
  return ...
end

-- Whether running m:forward(...) directly does all that calling m(...) does: no hooks of its own
-- and no ZeRO-3 (which sets Module.fetch and gathers parameters around module calls).
function Module:plain_call()
  return not Module.fetch and not own_hooks(self)
end

-- Whether a fused op may stand for this module's call through Module.call_group: no hooks of its
-- own, and every global hook acts on a module's own parameters only (none, or ZeRO-3's on several
-- ranks). Models fuse such modules (llama.lua's projections and norms, gpt2.lua's MLP and norms).
function Module:groupable()
  return not own_hooks(self) and global_hooks_own_params()
end

-- Whether m:forward(...) may run in place of m(...): a plain call, or a groupable module holding
-- no parameters itself (the hooks then have nothing to do for it: llama.lua's decoder layers).
function Module:skippable()
  return self:plain_call() or (self:groupable() and #self._param_order == 0)
end

-- fn(...) standing for the calls of mods (each groupable(), which the caller checked): with global
-- hooks, each module's pre-hooks run before fn (ZeRO-3: its parameters gathered, fn's first
-- tensor argument marked to release them after its backward) and its post-hooks after (ZeRO-3:
-- released, fn's first result marked to gather them before its backward). Returns fn's results.
function Module.call_group(mods, fn, ...)
  if #global_pre == 0 and #global_post == 0 then return fn(...) end
  return run_hooked(mods, fn, nil, nil, nil, ...)
end

function Module:_call(...)
  local pre, post = rawget(self, "_pre_hooks"), rawget(self, "_post_hooks")
  if pre == nil and post == nil and #global_pre == 0 and #global_post == 0 then
    return self:forward(...)
  end
  return run_hooked({ self }, self.forward, self, pre, post, ...)
end

-- ---------- state ----------

-- Ordered list of state_dict keys: each module's parameters then persistent buffers, in module
-- pre-order; tied weights appear under every name (as in torch).
function Module:state_dict_keys()
  local keys, tensors = {}, {}
  local mods = {}
  collect_modules(self, "", {}, mods)
  for _, e in ipairs(mods) do
    local prefix, m = e[1], e[2]
    local function add(n, t)
      local k = prefix == "" and n or (prefix .. "." .. n)
      keys[#keys + 1] = k
      tensors[k] = t
    end
    for _, n in ipairs(m._param_order) do add(n, m._parameters[n]) end
    for _, n in ipairs(m._buffer_order) do
      if not m._nonpersistent[n] then add(n, m._buffers[n]) end
    end
  end
  return keys, tensors
end

-- name → tensor (detached, sharing memory with the module's tensors).
function Module:state_dict()
  local keys, tensors = self:state_dict_keys()
  local sd = {}
  for _, k in ipairs(keys) do sd[k] = tensors[k]:detach() end
  return sd
end

local function quoted(list)
  local q = {}
  for i, k in ipairs(list) do q[i] = '"' .. k .. '"' end
  return concat(q, ", ")
end

-- Matches sd's entries to the module's parameters and buffers, checked as load_state_dict
-- checks them, and raises its error (at `level`) when they do not match. sd: name → tensor, or,
-- with described = true, name → {shape = {...}, ...} (tensors not read yet). Returns the list of
-- {own tensor, sd's value} pairs and the missing and unexpected keys.
function Module:match_state_dict(sd, strict, described, level)
  if type(sd) ~= "table" then error("load_state_dict: expected a table of name -> tensor, got " .. type(sd), level) end
  if strict == nil then strict = true end
  local keys, own = self:state_dict_keys()
  local missing, unexpected, errs, todo = {}, {}, {}, {}
  for _, k in ipairs(keys) do
    local src = sd[k]
    local shape = described and type(src) == "table" and src.shape or is_tensor(src) and src:shape()
    if src == nil then missing[#missing + 1] = k
    elseif not shape then
      errs[#errs + 1] = fmt('value for "%s" is a %s, expected a tensor', k, type(src))
    elseif #shape ~= #own[k]:shape() or "(" .. concat(shape, ",") .. ")" ~= shape_str(own[k]) then
      errs[#errs + 1] = fmt("size mismatch for %s: copying a tensor with shape (%s) from checkpoint, the shape in current model is %s.",
        k, concat(shape, ","), shape_str(own[k]))
    else
      todo[#todo + 1] = { own[k], src }
    end
  end
  for k in pairs(sd) do
    if own[k] == nil then unexpected[#unexpected + 1] = tostring(k) end
  end
  sort(unexpected)
  local lines = {}
  if strict and #missing > 0 then lines[#lines + 1] = "Missing key(s) in state_dict: " .. quoted(missing) .. "." end
  if strict and #unexpected > 0 then lines[#lines + 1] = "Unexpected key(s) in state_dict: " .. quoted(unexpected) .. "." end
  for _, e in ipairs(errs) do lines[#lines + 1] = e end
  if #lines > 0 then
    error(fmt("Error(s) in loading state_dict for %s:\n\t%s", self.__name, concat(lines, "\n\t")), level)
  end
  return todo, missing, unexpected
end

-- Copies tensors from sd (name → tensor) into the module's parameters and buffers (casting
-- dtype and moving device as needed). strict (default true): every key must match exactly.
-- Shape mismatches always fail. Nothing is copied when it fails. Returns
-- {missing_keys = {...}, unexpected_keys = {...}}.
function Module:load_state_dict(sd, strict)
  local todo, missing, unexpected = self:match_state_dict(sd, strict, false, 3)
  local prev = set_grad_enabled(false)
  local ok, err = pcall(function() for _, c in ipairs(todo) do c[1]:copy_(c[2]) end end)
  set_grad_enabled(prev)
  if not ok then error(err, 2) end
  return { missing_keys = missing, unexpected_keys = unexpected }
end

-- ---------- dtype / device ----------

-- model:to("bf16"), model:to("cuda:0"), model:to{dtype=, device=}: casts floating parameters and
-- buffers and moves everything, in place as torch does: each parameter keeps its identity and
-- takes the converted data (p:set_data), so a list taken earlier with model:parameters() (an
-- optimizer's, the engine's model_parameters) stays valid. Gradients are converted with it.
function Module:to(...)
  local args = { n = select("#", ...), ... }
  local prev = set_grad_enabled(false)
  local ok, err = pcall(function()
    for _, m in ipairs(self:modules()) do
      for _, n in ipairs(m._param_order) do
        local p = m._parameters[n]
        local q = p:to(unpack(args, 1, args.n))
        if not (q == p) then
          local g = p.grad
          p:set_data(q)
          p:category("params")
          if g then p.grad = g:to(unpack(args, 1, args.n)) end
        end
      end
      for _, n in ipairs(m._buffer_order) do
        local b = m._buffers[n]
        local float = ({ f32 = true, f64 = true, bf16 = true, f16 = true })[b:dtype()]
        local bargs = args
        if not float then -- integer buffers keep their dtype and only move
          bargs = { n = 0 }
          for i = 1, args.n do
            local a = args[i]
            if type(a) == "table" then bargs.n = bargs.n + 1; bargs[bargs.n] = { device = a.device }
            elseif type(a) == "string" and (a == "cpu" or a:sub(1, 4) == "cuda") then bargs.n = bargs.n + 1; bargs[bargs.n] = a end
          end
        end
        if bargs.n > 0 then m._buffers[n] = b:to(unpack(bargs, 1, bargs.n)) end
      end
    end
  end)
  set_grad_enabled(prev)
  if not ok then error(err, 2) end
  return self
end

-- Shorthands for module:to(dtype or device), as torch's.
function Module:float() return self:to("f32") end
function Module:double() return self:to("f64") end
function Module:bfloat16() return self:to("bf16") end
function Module:half() return self:to("f16") end
function Module:cpu() return self:to("cpu") end
function Module:cuda(i) return self:to(i and ("cuda:" .. i) or "cuda") end

-- ---------- printing ----------

-- One line of settings shown inside the parentheses, e.g. "in_features=4, out_features=3".
function Module:extra_repr() return "" end

function Module:_repr(indent)
  local extra = self:extra_repr()
  if #self._module_order == 0 then return self.__name .. "(" .. extra .. ")" end
  local inner = indent .. "  "
  local parts = { self.__name .. "(" }
  if extra ~= "" then parts[#parts + 1] = "\n" .. inner .. extra end
  for _, n in ipairs(self._module_order) do
    parts[#parts + 1] = "\n" .. inner .. "(" .. n .. "): " .. self._modules[n]:_repr(inner)
  end
  parts[#parts + 1] = "\n" .. indent .. ")"
  return concat(parts)
end

return Module
