-- Llama's and GPT-2's training forward with the loss's gradient written over the logits
-- (causal_lm_loss's inplace) against the unfused composition: the logits of a forward without
-- labels scored by causal_lm_loss without inplace. Loss, every gradient, steps through the engine
-- (gradient accumulation: the hint 1/2), out.logits made lazily, eval forwards untouched, and a
-- tiny Llama that still learns.
local zr = require "zrun"
local T = zr.testing
local llama, gpt2 = zr.models.llama, zr.models.gpt2

-- Every zr.cross_entropy call's inplace option, while fn runs.
local function spy(fn)
  local real, seen = zr.cross_entropy, {}
  zr.cross_entropy = function(x, t, o)
    seen[#seen + 1] = o and o.inplace or false
    return real(x, t, o)
  end
  local ok, err = pcall(fn)
  zr.cross_entropy = real
  if not ok then error(err, 0) end
  return seen
end

local LM = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "loss_models_common.lua")
local llama_model, gpt2_model, batch, vocab, grads = LM.llama_model, LM.gpt2_model, LM.batch, LM.vocab, LM.grads

-- The unfused reference: the logits of a forward without labels, scored by causal_lm_loss.
local function reference(m, ids, labels)
  local logits = m(ids).logits
  return { logits = logits, loss = llama.causal_lm_loss(logits, labels) }
end


local cases = { -- name, constructor, class
  { "llama untied", function(dt) return llama_model(false, dt) end, llama.LlamaForCausalLM },
  { "llama tied", function(dt) return llama_model(true, dt) end, llama.LlamaForCausalLM },
  { "gpt2", gpt2_model, gpt2.GPT2LMHeadModel },
}

T.test("models: the in-place loss gives the unfused loss and gradients (f32, f64)", function()
  for _, c in ipairs(cases) do
    for _, dt in ipairs { "f64", "f32" } do
      local what = c[1] .. " " .. dt
      local m = c[2](dt)
      local ids, labels = batch(vocab(m), 1)
      local want = reference(m, ids, labels)
      want.loss:backward()
      local wg = grads(m)
      local out
      local seen = spy(function() out = m(ids, labels) end)
      T.eq(seen[1], true, what .. ": the training forward takes the logits in place")
      T.eq(rawget(out, "logits"), nil, what .. ": out.logits not made until read")
      T.near(out.loss, want.loss:item(), 0, dt == "f64" and 1e-15 or 1e-6, what .. " loss")
      out.loss:backward()
      local tol = dt == "f64" and 1e-12 or 1e-5
      for n, g in pairs(grads(m)) do
        local s = wg[n]:abs():max():item()
        T.near(g, wg[n], tol * math.max(s, 1e-3), 0, what .. " grad " .. n)
      end
      -- out.logits, read after backward: the logits of an eval forward, made again; kept
      local lg = out.logits
      T.eq(rawget(out, "logits"), lg, what .. ": out.logits kept once made")
      local ev = zr.no_grad(function() return m(ids, labels) end)
      T.near(lg, ev.logits, 0, 0, what .. ": lazy logits = eval logits")
      T.near(lg, want.logits, 0, 0, what .. ": lazy logits = the reference's")
      T.eq(lg:size(3), vocab(m), what .. ": (B, T, V) logits")
    end
  end
end)

T.test("models: eval and no-label forwards score the logits as they are", function()
  for _, c in ipairs(cases) do
    local m = c[2]()
    local ids, labels = batch(vocab(m), 2)
    local out
    local seen = spy(function() out = zr.no_grad(function() return m(ids, labels) end) end)
    T.eq(seen[1], false, c[1] .. ": no_grad: not in place")
    assert(rawget(out, "logits"), c[1] .. ": eval out.logits is the tensor itself")
    T.eq(getmetatable(out), nil, c[1] .. ": no lazy field in eval")
    T.near(out.loss, llama.causal_lm_loss(out.logits, labels), 0, 0, c[1] .. ": eval loss from out.logits")
    -- a frozen model (no parameter needs a gradient): nothing recorded, nothing in place
    m:requires_grad_(false)
    seen = spy(function() out = m(ids, labels) end)
    T.eq(seen[1], false, c[1] .. ": frozen: not in place")
    assert(rawget(out, "logits"), c[1] .. ": frozen out.logits is the tensor itself")
  end
end)

-- Steps through the engine with 2 micro-batches per step (engine:forward sets the hint 1/2):
-- the in-place model against the same model scoring its logits unfused.
T.test("models: engine steps (gradient accumulation 2) match the unfused loss", function()
  for _, c in ipairs(cases) do
    local function train(plain)
      local m = c[2]()
      if plain then rawset(m, "forward", function(self, ids, labels)
        local logits = c[3].forward(self, ids).logits
        return { logits = logits, loss = llama.causal_lm_loss(logits, labels) }
      end) end
      local V = vocab(m)
      local engine = zr.initialize({ model = m, config = { train_micro_batch_size_per_gpu = 3,
        gradient_accumulation_steps = 2, steps_per_print = 1e6,
        optimizer = { type = "AdamW", params = { lr = 3e-3 } } } })
      return T.train_steps(engine, function(_, mi) return (batch(V, mi)) end, 1, 4, 2)
    end
    local a, b = train(false), train(true)
    for i = 1, #a do T.near(a[i], b[i], 0, 1e-5, ("%s step %d loss"):format(c[1], i)) end
    assert(a[#a] < a[1], c[1] .. ": the loss falls over the steps")
  end
end)

T.test("a tiny Llama trained with the in-place loss learns (loss falls below 60% of its start)", function()
  local m = llama_model(false)
  local V = vocab(m)
  local engine = zr.initialize({ model = m, config = { train_micro_batch_size_per_gpu = 3, steps_per_print = 1e6,
    optimizer = { type = "AdamW", params = { lr = 1e-2 } } } })
  local ids = batch(V, 7)
  local losses = T.train_steps(engine, function() return ids end, 1, 30, 1)
  assert(losses[30] < 0.6 * losses[1], ("loss %g -> %g: did not fall below 60%%"):format(losses[1], losses[30]))
end)

T.done()
