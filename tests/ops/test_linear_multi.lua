-- Fused projections: zr.linear_multi (several Linear layers over one input as one product),
-- zr.split (views whose backward fills ONE gradient buffer), the packed zr.swiglu(gu), and the
-- Llama / GPT-2 models built on them. References are independent: separate zr.linear calls,
-- zr.narrow/zr.cat, the two-input swiglu, float64 central differences, and tiny Llama / GPT-2
-- forwards written out by hand below with zr.linear / zr.swiglu (the unfused formulation).
local zr = require "zrun"
local T = zr.testing
local Module = require "zrun.nn.module"
zr.manual_seed(41)

local IN, OUTS = 11, { 3, 5, 7 }
local function f64(shape, s) return (zr.randn(shape, { dtype = "f64" }) * (s or 1)):detach() end
local function leaf(t) return t:detach():requires_grad_(true) end

-- Weights (out_i, IN) back to back in one flat buffer (as ZeRO's direct mode lays them out):
-- leaf views of it. The flat buffer itself needs no grad, so the views are leaves.
local function adjacent(outs, dt)
  local total = 0
  for _, o in ipairs(outs) do total = total + o * IN end
  local flat = zr.randn({ total }, { dtype = dt or "f64" })
  local ws, off = {}, 0
  for i, o in ipairs(outs) do
    ws[i] = flat:narrow(1, off + 1, o * IN):view(o, IN):requires_grad_(true)
    off = off + o * IN
  end
  return ws, flat
end
local function separate(outs, dt)
  local ws = {}
  for i, o in ipairs(outs) do ws[i] = zr.randn({ o, IN }, { dtype = dt or "f64" }):requires_grad_(true) end
  return ws
end
local function biases(outs, dt)
  local bs = {}
  for i, o in ipairs(outs) do bs[i] = zr.randn({ o }, { dtype = dt or "f64" }):requires_grad_(true) end
  return bs
end
-- the reference: one zr.linear per weight, concatenated
local function reference(x, ws, bs)
  local ys = {}
  for i, w in ipairs(ws) do ys[i] = zr.linear(x, w, bs and bs[i]) end
  return zr.cat(ys, -1)
end

T.test("linear_multi forward equals separate linears (adjacent, separate, partly adjacent; bias or not)", function()
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    local tol = ({ f64 = 1e-12, f32 = 1e-5, bf16 = 2e-2 })[dt]
    local x = zr.randn({ 2, 3, IN }):to(dt)
    local adj = adjacent(OUTS, dt)
    local sep = separate(OUTS, dt)
    local part = { adj[1], adj[2], sep[3] } -- q, k adjacent; v elsewhere
    T.eq(zr.linear_multi_runs(adj), 1, "adjacent: one GEMM")
    T.eq(zr.linear_multi_runs(sep), 3, "separate: one per weight")
    T.eq(zr.linear_multi_runs(part), 2, "partly adjacent")
    for _, ws in ipairs { adj, sep, part } do
      for _, bs in ipairs { false, biases(OUTS, dt) } do
        local y = zr.linear_multi(x, ws, bs or nil)
        T.eq(table.concat(y:shape(), ","), "2,3,15", "shape")
        T.eq(y:dtype(), dt)
        T.near(y, reference(x, ws, bs or nil), tol, tol, dt .. " values")
      end
    end
    -- a 1-D input and a single weight
    local x1 = zr.randn({ IN }):to(dt)
    T.near(zr.linear_multi(x1, adj), reference(x1, adj), tol, tol, "1-D input")
    T.near(zr.linear_multi(x, { sep[2] }), zr.linear(x, sep[2]), tol, tol, "one weight")
  end
  -- strided weights (transposed views) and a strided input read in place
  local wt = f64({ IN, 5 }):transpose(1, 2)
  local xs = f64({ IN, 4 }):transpose(1, 2)
  local w3 = separate({ 3 })[1]
  T.near(zr.linear_multi(xs, { wt, w3 }), reference(xs, { wt, w3 }), 1e-12, 1e-12, "strided operands")
end)

T.test("gradcheck linear_multi (f64; out 3, 5, 7, in 11; adjacent and separate, bias or not)", function()
  local x = leaf(f64({ 2, 3, IN }))
  local function fn(xx, ...)
    local a = { ... }
    local ws, bs = { a[1], a[2], a[3] }, a[4] and { a[4], a[5], a[6] } or nil
    return zr.linear_multi(xx, ws, bs)
  end
  for _, ws in ipairs { adjacent(OUTS), separate(OUTS) } do
    T.gradcheck(fn, { x, ws[1], ws[2], ws[3] })
    local bs = biases(OUTS)
    T.gradcheck(fn, { x, ws[1], ws[2], ws[3], bs[1], bs[2], bs[3] })
  end
  -- only some inputs need gradients: x alone, one weight alone
  local ws = adjacent(OUTS)
  local c = { ws[1]:detach(), ws[2]:detach(), ws[3]:detach() }
  T.gradcheck(function(xx) return zr.linear_multi(xx, c) end, { x })
  T.gradcheck(function(w2) return zr.linear_multi(x:detach(), { c[1], w2, c[3] }) end, { leaf(c[2]) })
end)

-- Gradients of sum(y * gy) for y = linear_multi and for the separate linears, on copies of the
-- same leaves.
local function grads_of(fn, x0, ws0, bs0, gy)
  local x = leaf(x0)
  local ws, bs = {}, bs0 and {} or nil
  for i, w in ipairs(ws0) do ws[i] = leaf(w) end
  if bs0 then for i, b in ipairs(bs0) do bs[i] = leaf(b) end end
  ;(fn(x, ws, bs) * gy):sum():backward()
  local out = { x.grad }
  for i, w in ipairs(ws) do out[#out + 1] = w.grad end
  if bs then for i, b in ipairs(bs) do out[#out + 1] = b.grad end end
  return out
end

T.test("linear_multi gradients equal the separate linears' (f32, bf16)", function()
  for _, dt in ipairs { "f32", "bf16" } do
    local tol = dt == "f32" and 1e-5 or 3e-2
    local x0, gy = zr.randn({ 4, 5, IN }):to(dt), zr.randn({ 4, 5, 15 }):to(dt)
    local ws0, bs0 = separate(OUTS, dt), biases(OUTS, dt)
    local got = grads_of(zr.linear_multi, x0, ws0, bs0, gy)
    local want = grads_of(reference, x0, ws0, bs0, gy)
    for i = 1, #want do T.near(got[i], want[i], tol, tol, dt .. " gradient " .. i) end
  end
end)

T.test("linear_multi adds into existing leaf gradients in place (adjacent and separate)", function()
  local x = f64({ 3, IN })
  local gy = f64({ 3, 15 })
  for _, layout in ipairs { "adjacent", "separate" } do
    local ws = layout == "adjacent" and adjacent(OUTS) or separate(OUTS)
    local want = grads_of(reference, x, ws, nil, gy)
    -- gradients as views of one buffer (adjacent, like the engine's partition) or separate ones,
    -- holding earlier values that must be added to
    local gflat = f64({ 15 * IN })
    local before = gflat:clone()
    local off = 0
    for i, o in ipairs(OUTS) do
      ws[i].grad = layout == "adjacent" and gflat:narrow(1, off + 1, o * IN):view(o, IN) or gflat:narrow(1, off + 1, o * IN):view(o, IN):clone()
      off = off + o * IN
    end
    if layout == "adjacent" then T.eq(zr.linear_multi_runs { ws[1].grad, ws[2].grad, ws[3].grad }, 1) end
    local held = { ws[1].grad, ws[2].grad, ws[3].grad }
    local xx = leaf(x)
    ;(zr.linear_multi(xx, ws) * gy):sum():backward()
    off = 0
    for i, o in ipairs(OUTS) do
      T.eq(ws[i].grad == held[i], true, "the same gradient tensor, written in place")
      T.near(ws[i].grad, before:narrow(1, off + 1, o * IN):view(o, IN) + want[1 + i], 1e-12, 1e-12, layout .. " grad " .. i)
      off = off + o * IN
    end
    T.near(xx.grad, want[1], 1e-12, 1e-12, "x grad")
    -- a second backward adds again
    ;(zr.linear_multi(leaf(x), ws) * gy):sum():backward()
    off = 0
    for i, o in ipairs(OUTS) do
      T.near(ws[i].grad, before:narrow(1, off + 1, o * IN):view(o, IN) + want[1 + i] * 2, 1e-12, 1e-12, "twice")
      off = off + o * IN
    end
  end
end)

T.test("linear_multi errors name the op and the shapes", function()
  local x = zr.zeros({ 2, IN })
  T.raises(function() zr.linear_multi(x, { zr.zeros({ 3, 4 }) }) end, "linear_multi: weight 1 must be (out_features, 11)")
  T.raises(function() zr.linear_multi(x, { zr.zeros({ 3, IN }) }, { zr.zeros({ 4 }) }) end,
    "linear_multi: bias 1 must have shape (3)")
  T.raises(function() zr.linear_multi(x, { zr.zeros({ 3, IN }), zr.zeros({ 2, IN }) }, { zr.zeros({ 3 }) }) end,
    "2 weights but 1 biases")
  T.raises(function() zr.linear_multi(x, {}) end, "1 to 7 weights")
  T.raises(function() zr.linear_multi(x, { x, x, x, x, x, x, x, x }) end, "1 to 7 weights")
end)

-- ---------------------------------------------------------------------------------------------
-- split
-- ---------------------------------------------------------------------------------------------
local SIZES = { 2, 0, 3, 4 } -- along dim 2 of (3, 9, 2); an empty part too

-- By hand: the gradient of t from parts' gradients gs (nil: the part got none) is their
-- concatenation with zeros for the missing ones.
local function padded(gs, shape)
  local pieces = {}
  for i, s in ipairs(SIZES) do
    pieces[i] = gs[i] or zr.zeros({ shape[1], s, shape[3] }, { dtype = "f64" })
  end
  return zr.cat(pieces, 2)
end

T.test("split: views of t, and t's one gradient (parts used or unused, an empty part)", function()
  local a = leaf(f64({ 3, 9, 2 }))
  local t = a * 2 -- a producer node: the parts' gradients go to its one buffer
  local p = zr.split(t, SIZES, 2)
  T.eq(#p, 4)
  T.eq(table.concat(p[3]:shape(), ","), "3,3,2")
  T.near(p[3], t:narrow(2, 3, 3), 0, 0, "values")
  T.eq(p[1].grad_fn, "split")
  local w1, w4 = f64({ 3, 2, 2 }), f64({ 3, 4, 2 })
  ;((p[1] * w1):sum() + (p[4] * w4):sum()):backward()
  T.near(a.grad, padded({ w1, nil, nil, w4 }, { 3, 9, 2 }) * 2, 0, 0, "parts 1 and 4 used, 2 and 3 not")
  -- a part used twice (its gradient accumulates before split's backward) and retain_graph
  a.grad = nil
  t = a * 2
  p = zr.split(t, SIZES, 2)
  local w3 = f64({ 3, 3, 2 })
  local loss = (p[3] * w3):sum() + (p[3] * w3):sum() + (p[1] * w1):sum()
  loss:backward(nil, true)
  local once = padded({ w1, nil, w3 * 2, nil }, { 3, 9, 2 }) * 2
  T.near(a.grad, once, 0, 1e-15, "first backward")
  loss:backward(nil, true)
  T.near(a.grad, once * 2, 0, 1e-15, "retain_graph: a second backward adds the same again")
  loss:backward()
  T.near(a.grad, once * 3, 0, 1e-15, "and a third")
end)

T.test("split: t also used directly, before, between and after the parts' consumers", function()
  local shape = { 3, 9, 2 }
  local w1, w3, w4, wt = f64({ 3, 2, 2 }), f64({ 3, 3, 2 }), f64({ 3, 4, 2 }), f64(shape)
  local want = (padded({ w1, nil, w3, w4 }, shape) + wt) * 2
  -- the order in which ops are recorded decides the order of their backward (last first)
  local orders = {
    before = function(t, p) return (t * wt):sum() + (p[1] * w1):sum() + (p[3] * w3):sum() + (p[4] * w4):sum() end,
    between = function(t, p) return (p[1] * w1):sum() + (t * wt):sum() + (p[3] * w3):sum() + (p[4] * w4):sum() end,
    after = function(t, p) return (p[1] * w1):sum() + (p[3] * w3):sum() + (p[4] * w4):sum() + (t * wt):sum() end,
  }
  for name, f in pairs(orders) do
    local a = leaf(f64(shape))
    local t = a * 2
    local p = zr.split(t, SIZES, 2)
    f(t, p):backward()
    T.near(a.grad, want, 1e-15, 1e-14, name)
  end
  -- the other use hands the same gradient tensor to t and to s (add's backward passes its
  -- gradient on to both inputs): split must not write into s's gradient
  local a, b = leaf(f64(shape)), leaf(f64(shape))
  local t, s = a * 2, b * 3
  local p = zr.split(t, SIZES, 2)
  local loss = (p[1] * w1):sum() + (p[4] * w4):sum() + ((t + s) * wt):sum()
  loss:backward()
  T.near(b.grad, wt * 3, 0, 0, "s's gradient untouched")
  T.near(a.grad, (padded({ w1, nil, nil, w4 }, shape) + wt) * 2, 1e-15, 1e-14, "t's gradient")
  -- t split twice: the two groups share the buffer
  a = leaf(f64(shape))
  t = a * 2
  local p1, p2 = zr.split(t, SIZES, 2), zr.split(t, { 5, 4 }, 2)
  local v1 = f64({ 3, 5, 2 })
  loss = (p1[1] * w1):sum() + (p2[1] * v1):sum() + (p1[4] * w4):sum()
  loss:backward()
  T.near(a.grad, (padded({ w1, nil, nil, w4 }, shape) + zr.cat({ v1, zr.zeros({ 3, 4, 2 }, { dtype = "f64" }) }, 2)) * 2,
    1e-15, 1e-14, "two splits of t")
end)

T.test("split of a leaf: a padded gradient first, then added in place", function()
  local shape = { 3, 9, 2 }
  local t = leaf(f64(shape))
  local w1, w4 = f64({ 3, 2, 2 }), f64({ 3, 4, 2 })
  local function run()
    local p = zr.split(t, SIZES, 2)
    ;((p[1] * w1):sum() + (p[4] * w4):sum()):backward()
  end
  run()
  local g = t.grad
  T.near(g, padded({ w1, nil, nil, w4 }, shape), 0, 0, "first")
  run()
  T.eq(t.grad == g, true, "the same gradient tensor")
  T.near(t.grad, padded({ w1, nil, nil, w4 }, shape) * 2, 0, 0, "second adds")
end)

T.test("gradcheck split (f64): non-leaf and leaf inputs, dims 1 and -1", function()
  local w = f64({ 9, 2 })
  T.gradcheck(function(a)
    local p = zr.split(a * a, SIZES, 2)
    return zr.cat({ p[4] * 3, p[1] * p[1] }, 2) + zr.cat({ p[3], p[1] }, 2):sum()
  end, { leaf(f64({ 3, 9, 2 })) })
  T.gradcheck(function(a)
    local p = zr.split(a, { 4, 5 }, 1)
    return (p[2] * w:narrow(1, 1, 5)):sum() + (a * w):sum()
  end, { leaf(f64({ 9, 2 })) })
  T.gradcheck(function(a)
    local p = zr.split(a:exp(), { 1, 1 }, -1)
    return p[1] * p[2]
  end, { leaf(f64({ 4, 2 })) })
end)

T.test("split backward keeps one buffer, no zero-padded gradient per part", function()
  -- t (R, 3C) f32, a view of a leaf (its backward passes the gradient on without a copy), split
  -- in three, each part summed (sum's backward hands back a dense part-sized gradient). Backward
  -- then holds those (one t in all) and the buffer (one t): 2 t. Zero-padded full gradients per
  -- part (narrow's backward) and their running sum need at least 3 t.
  local R, C = 64, 2048
  local full = R * 3 * C * 4
  local function peak_of(split)
    local a = zr.randn({ R * 3 * C }):requires_grad_(true)
    local p = split(a:view(R, 3 * C))
    local loss = (p[1]:sum() + p[2]:sum()) + p[3]:sum()
    collectgarbage(); collectgarbage()
    local base = zr.memory_stats().activations.current
    zr.memory_reset_peak()
    loss:backward()
    T.near(a.grad, zr.ones({ R * 3 * C }), 0, 0)
    return zr.memory_stats().activations.peak - base
  end
  local ours = peak_of(function(t) return zr.split(t, { C, C, C }, 2) end)
  local padded_parts = peak_of(function(t) return { t:narrow(2, 1, C), t:narrow(2, C + 1, C), t:narrow(2, 2 * C + 1, C) } end)
  assert(ours <= 2.05 * full, ("split: backward peak %d bytes, over 2 t (%d)"):format(ours, 2 * full))
  assert(padded_parts >= 2.9 * full, ("narrow: backward peak %d bytes, expected 3 t or more"):format(padded_parts))
end)

-- ---------------------------------------------------------------------------------------------
-- packed swiglu
-- ---------------------------------------------------------------------------------------------
T.test("packed swiglu equals swiglu(gate, up): values and the one gradient (f64, f32, bf16)", function()
  for _, dt in ipairs { "f64", "f32", "bf16" } do
    for _, sh in ipairs { { 2 }, { 3, 14 }, { 2, 3, 18 } } do
      local F = sh[#sh] / 2
      local gu0 = (zr.randn(sh) * 3):to(dt)
      local gh = zr.randn((function() local s = { unpack(sh) }; s[#s] = F; return s end)()):to(dt)
      local gu = gu0:detach():requires_grad_(true)
      local h = zr.swiglu(gu)
      T.eq(h:shape()[#sh], F, "last dim halves")
      local g, u = gu0:detach():requires_grad_(true), gu0:detach():requires_grad_(true)
      local nd = #sh
      local ref = zr.swiglu(g:narrow(nd, 1, F), u:narrow(nd, F + 1, F))
      T.near(h, ref, 0, 0, dt .. " values (the same kernel arithmetic)")
      ;(h * gh):sum():backward()
      ;(ref * gh):sum():backward()
      local want = zr.cat({ g.grad:narrow(nd, 1, F), u.grad:narrow(nd, F + 1, F) }, nd)
      T.near(gu.grad, want, 0, 0, dt .. " gradient")
    end
  end
end)

T.test("gradcheck packed swiglu (f64), and its errors", function()
  T.gradcheck(function(gu) return zr.swiglu(gu) end, { leaf(f64({ 3, 10 }, 3)) })
  T.gradcheck(function(gu) return zr.swiglu(gu:transpose(1, 2)) end, { leaf(f64({ 6, 5 }, 3)) })
  T.raises(function() zr.swiglu(zr.zeros({ 2, 5 })) end, "last dim, which must be even, got (2,5)")
  T.raises(function() zr.swiglu(zr.tensor(1)) end, "must be even")
end)

-- ---------------------------------------------------------------------------------------------
-- models against the unfused formulation, written out by hand
-- ---------------------------------------------------------------------------------------------

-- Copies of a model's parameters as fresh leaves, by name.
local function leaf_copies(model)
  local ps = {}
  for name, p in model:named_parameters() do ps[name] = p:detach():clone():requires_grad_(true) end
  return ps
end

-- LlamaForCausalLM's forward with one zr.linear per projection and the two-input zr.swiglu.
local function llama_reference(cfg, P, ids)
  local B, Tn = ids:size(1), ids:size(2)
  local H, KV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
  local eps = cfg.rms_norm_eps
  local cos, sin = zr.rope_tables(Tn, D, { theta = cfg.rope_theta, rope_scaling = cfg.rope_scaling, dtype = "f32" })
  cos, sin = cos:to(cfg.dtype), sin:to(cfg.dtype)
  local function lin(x, name) return zr.linear(x, P[name .. ".weight"], P[name .. ".bias"]) end
  local h = zr.embedding(P["model.embed_tokens.weight"], ids)
  for l = 0, cfg.num_hidden_layers - 1 do
    local pre = "model.layers." .. l .. "."
    local a = zr.rms_norm(h, P[pre .. "input_layernorm.weight"], eps)
    local q = lin(a, pre .. "self_attn.q_proj"):view(B, Tn, H, D):transpose(2, 3)
    local k = lin(a, pre .. "self_attn.k_proj"):view(B, Tn, KV, D):transpose(2, 3)
    local v = lin(a, pre .. "self_attn.v_proj"):view(B, Tn, KV, D):transpose(2, 3)
    local o = zr.scaled_dot_product_attention(zr.rope(q, cos, sin), zr.rope(k, cos, sin), v)
    h = h + lin(o:transpose(2, 3):reshape(B, Tn, H * D), pre .. "self_attn.o_proj")
    local m = zr.rms_norm(h, P[pre .. "post_attention_layernorm.weight"], eps)
    h = h + lin(zr.swiglu(lin(m, pre .. "mlp.gate_proj"), lin(m, pre .. "mlp.up_proj")), pre .. "mlp.down_proj")
  end
  h = zr.rms_norm(h, P["model.norm.weight"], eps)
  local logits = zr.linear(h, P["lm_head.weight"] or P["model.embed_tokens.weight"])
  return logits, zr.models.llama.causal_lm_loss(logits, ids)
end

local function llama_cfg(o)
  local cfg = zr.models.llama.config("zrun/tiny-llama")
  for k, v in pairs(o or {}) do cfg[k] = v end
  return cfg
end

local function check_llama(cfg, tol, what)
  zr.manual_seed(5)
  local model = zr.models.llama.LlamaForCausalLM(cfg)
  local ids = (zr.rand({ 2, 13 }) * (cfg.vocab_size - 1)):to("i64")
  local P = leaf_copies(model)
  local out = model(ids, ids)
  out.loss:backward()
  local logits, loss = llama_reference(cfg, P, ids)
  loss:backward()
  T.near(out.logits, logits, tol, tol, what .. " logits")
  T.near(out.loss, loss, tol, tol, what .. " loss")
  for name, p in model:named_parameters() do T.near(p.grad, P[name].grad, tol, tol, what .. " grad of " .. name) end
  return model
end

T.test("Llama: logits and every gradient equal the unfused formulation (f64, f32; biases; tied)", function()
  local m = check_llama(llama_cfg { dtype = "f64" }, 1e-10, "f64")
  local a = m.model.layers[1].self_attn
  -- a model built alone: separate parameter storages, one GEMM per projection (still one node)
  T.eq(zr.linear_multi_runs { a.q_proj.weight, a.k_proj.weight, a.v_proj.weight }, 3)
  check_llama(llama_cfg { dtype = "f32" }, 2e-5, "f32")
  check_llama(llama_cfg { dtype = "f64", attention_bias = true, mlp_bias = true }, 1e-10, "biases")
  check_llama(llama_cfg { dtype = "f64", tie_word_embeddings = true, num_key_value_heads = 4 }, 1e-10, "tied, MHA")
end)

T.test("Llama fuses projections without hooks of their own (a hooked one runs as a module), with ZeRO-3's kind of global hooks too", function()
  zr.manual_seed(5)
  local model = zr.models.llama.LlamaForCausalLM(llama_cfg { dtype = "f64" })
  local calls = 0
  local h = model.model.layers[1].self_attn.k_proj:register_forward_hook(function() calls = calls + 1 end)
  local ids = (zr.rand({ 1, 7 }) * 258):to("i64")
  local logits = model(ids).logits
  T.eq(calls, 1, "the hooked k_proj was called")
  h.remove()
  T.near(model(ids).logits, logits, 1e-12, 1e-12, "same result fused")
  -- global hooks acting on a module's own parameters (ZeRO-3's on several ranks) keep the fusion:
  -- Module.call_group runs them for q, k, v (gate, up) in turn around the one product
  local Module = require "zrun.nn.module"
  local seen, products = {}, 0
  local pre = Module.register_module_forward_pre_hook(function(m) seen[#seen + 1] = m end, true)
  local real = zr.linear_multi
  zr.linear_multi = function(...) products = products + 1; return real(...) end
  local ok, got = pcall(function() return model(ids).logits end)
  zr.linear_multi = real
  pre.remove()
  if not ok then error(got, 0) end
  T.eq(products, 2 * #model.model.layers, "q/k/v and gate/up as one product each, hooks around")
  local a, m = model.model.layers[1].self_attn, model.model.layers[1].mlp
  local pos = {}
  for i, mod in ipairs(seen) do pos[mod] = pos[mod] or i end
  T.eq(pos[a.k_proj] == pos[a.q_proj] + 1 and pos[a.v_proj] == pos[a.k_proj] + 1, true, "q, k, v hooks in turn")
  T.eq(pos[m.up_proj] == pos[m.gate_proj] + 1, true, "gate, up hooks in turn")
  T.near(got, logits, 1e-12, 1e-12, "same result with the hooks")
end)

-- Through the engine (ZeRO stage 0, one rank, direct mode): q/k/v and gate/up weights are adjacent
-- views of the flat buffer, their gradients adjacent views of the fp32 partition, so the forward
-- and both backward products are one GEMM each, and dW is written into the partition (added on
-- the second micro-step, overwriting the stale values after zero_grad).
T.test("Llama through the engine: one GEMM per product; accumulated and stale gradients", function()
  zr.manual_seed(11)
  local cfg = llama_cfg { dtype = "f32" }
  local model = zr.models.llama.LlamaForCausalLM(cfg)
  local P = leaf_copies(model)
  local engine = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = 2,
    steps_per_print = 1e6, gradient_accumulation_steps = 2,
    optimizer = { type = "AdamW", params = { lr = 0.0 } }, zero_optimization = { stage = 0 } } })
  local L1 = model.model.layers[1]
  local attn, mlp = L1.self_attn, L1.mlp
  T.eq(zr.linear_multi_runs { attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight }, 1, "q/k/v adjacent")
  T.eq(zr.linear_multi_runs { mlp.gate_proj.weight, mlp.up_proj.weight }, 1, "gate/up adjacent")
  zr.manual_seed(5)
  local ids = (zr.rand({ 2, 24 }) * 250):to("i64")
  local _, loss = llama_reference(cfg, P, ids)
  loss:backward()
  local names = {}
  for name in model:named_parameters() do names[#names + 1] = name end
  local function micro()
    local out = engine(ids, ids)
    engine:backward(out.loss)
    local g = {}
    for name, p in model:named_parameters() do g[name] = p.grad:clone() end
    T.eq(zr.linear_multi_runs { attn.q_proj.weight.grad, attn.k_proj.weight.grad, attn.v_proj.weight.grad }, 1,
      "q/k/v gradients adjacent")
    engine:step()
    return g
  end
  -- (the engine scales the loss by 1 / gradient_accumulation_steps)
  local g1 = micro()
  for _, n in ipairs(names) do T.near(g1[n], P[n].grad * 0.5, 2e-6, 1e-4, "first micro-step: " .. n) end
  local g2 = micro() -- the boundary: accumulated, then the optimizer step and zero_grad (stale)
  for _, n in ipairs(names) do T.near(g2[n], P[n].grad, 4e-6, 1e-4, "accumulated: " .. n) end
  local g3 = micro() -- lr 0: the same gradient again, overwriting the stale one
  for _, n in ipairs(names) do T.near(g3[n], P[n].grad * 0.5, 2e-6, 1e-4, "after zero_grad: " .. n) end
end)

-- GPT2LMHeadModel's forward with c_attn as three products on column slices of its weight.
local function gpt2_reference(cfg, P, ids)
  local B, Tn, C, H = ids:size(1), ids:size(2), cfg.n_embd, cfg.n_head
  local eps = cfg.layer_norm_epsilon
  local function conv(x, name, lo, n)
    local w, b = P[name .. ".weight"], P[name .. ".bias"]
    if lo then w, b = w:narrow(2, lo, n), b:narrow(1, lo, n) end
    return zr.linear(x, w:transpose(1, 2), b)
  end
  local function ln(x, name) return zr.layer_norm(x, P[name .. ".weight"], P[name .. ".bias"], eps) end
  local x = zr.embedding(P["transformer.wte.weight"], ids) + zr.embedding(P["transformer.wpe.weight"], zr.arange(Tn))
  for l = 0, cfg.n_layer - 1 do
    local pre = "transformer.h." .. l .. "."
    local a = ln(x, pre .. "ln_1")
    local function heads(i) return conv(a, pre .. "attn.c_attn", i * C + 1, C):view(B, Tn, H, C / H):transpose(2, 3) end
    local o = zr.scaled_dot_product_attention(heads(0), heads(1), heads(2))
    x = x + conv(o:transpose(2, 3):reshape(B, Tn, C), pre .. "attn.c_proj")
    x = x + conv(conv(ln(x, pre .. "ln_2"), pre .. "mlp.c_fc"):gelu("tanh"), pre .. "mlp.c_proj")
  end
  local logits = zr.linear(ln(x, "transformer.ln_f"), P["transformer.wte.weight"])
  return logits, zr.models.llama.causal_lm_loss(logits, ids)
end

T.test("GPT-2: logits and every gradient equal three products on c_attn's column slices (f64)", function()
  local cfg = { n_embd = 24, n_layer = 2, n_head = 3, vocab_size = 53, n_positions = 32, layer_norm_epsilon = 1e-5,
    tie_word_embeddings = true, dtype = "f64" }
  zr.manual_seed(9)
  local model = zr.models.gpt2.GPT2LMHeadModel(cfg)
  local ids = (zr.rand({ 2, 11 }) * 52):to("i64")
  local P = leaf_copies(model)
  local out = model(ids, ids)
  out.loss:backward()
  local logits, loss = gpt2_reference(cfg, P, ids)
  loss:backward()
  T.near(out.logits, logits, 1e-10, 1e-10, "logits")
  T.near(out.loss, loss, 1e-10, 1e-10, "loss")
  for name, p in model:named_parameters() do T.near(p.grad, P[name].grad, 1e-10, 1e-10, "grad of " .. name) end
end)

T.done()
