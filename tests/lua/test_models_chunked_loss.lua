-- The models' forward with opts.chunked_loss (the LM head and its loss by zr.linear_cross_entropy: no full logits)
-- against the plain forward (itself checked against transformers' goldens): loss and every gradient for Llama
-- (untied, tied) and GPT-2 in f64 / f32 / bf16, with label smoothing and a masked prompt; out.logits made on first
-- read; engine steps with gradient accumulation and a bf16 model with fp32 masters (the precision users run), where
-- the loss must fall; what it refuses.
local zr = require "zrun"
local T = zr.testing
local llama = zr.models.llama

local LM = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "loss_models_common.lua")
local llama_model, gpt2_model, batch, vocab, grads = LM.llama_model, LM.gpt2_model, LM.batch, LM.vocab, LM.grads

local cases = { -- name, constructor
  { "llama untied", function(dt) return llama_model(false, dt) end },
  { "llama tied", function(dt) return llama_model(true, dt) end },
  { "gpt2", gpt2_model },
}

T.test("models: chunked_loss gives the plain loss and gradients (f64, f32, bf16; smoothing, a masked prompt)", function()
  local TOL = { f64 = { 1e-14, 1e-12 }, f32 = { 1e-6, 1e-5 }, bf16 = { 1e-6, 2e-2 } }
  for _, c in ipairs(cases) do
    for _, dt in ipairs { "f64", "f32", "bf16" } do
      for _, o in ipairs { { chunked_loss = 16 }, { chunked_loss = true, label_smoothing = 0.1 },
        { chunked_loss = 7, prompt = true } } do
        local what = ("%s %s chunk %s%s%s"):format(c[1], dt, tostring(o.chunked_loss), o.label_smoothing and " smoothing" or "",
          o.prompt and " prompt" or "")
        local m = c[2](dt)
        local ids, labels = batch(vocab(m), 1, o.prompt)
        local want = m(ids, labels, { label_smoothing = o.label_smoothing })
        want.loss:backward()
        local wl, wg = want.loss:item(), grads(m)
        local out = m(ids, labels, { label_smoothing = o.label_smoothing, chunked_loss = o.chunked_loss })
        T.eq(rawget(out, "logits"), nil, what .. ": no logits made")
        T.near(out.loss, wl, 0, TOL[dt][1], what .. " loss")
        out.loss:backward()
        for n, g in pairs(grads(m)) do
          local s = wg[n]:abs():max():item()
          T.near(g:to("f64"), wg[n]:to("f64"), TOL[dt][2] * math.max(s, 1e-3), 0, what .. " grad " .. n)
        end
        -- token_stats: the plain forward's entropy and argmax at the positions whose shifted label counts
        local o2 = m(ids, labels, { label_smoothing = o.label_smoothing, chunked_loss = o.chunked_loss, token_stats = true })
        local o1 = m(ids, labels, { label_smoothing = o.label_smoothing, token_stats = true })
        local counted = llama.shift_labels(labels):ne(-100):to("f64")
        T.near(o2.entropy:to("f64"), o1.entropy:to("f64") * counted, 1e-5, 1e-5, what .. " entropy")
        T.near(o2.argmax:to("f64"), o1.argmax:to("f64") * counted, 0, 0, what .. " argmax")
        -- out.logits, read after backward: the eval forward's logits
        local ev = zr.no_grad(function() return m(ids) end)
        T.near(out.logits, ev.logits, 0, 0, what .. ": out.logits = the eval logits")
      end
    end
  end
end)

-- Engine steps, 2 micro-batches a step: the chunked loss against the plain one; then a bf16 model with fp32 masters
-- (bf16 config) whose loss must fall by a stated margin and follow the plain path's.
T.test("models: engine steps with chunked_loss follow the plain loss (f32 gas 2; bf16 model, fp32 masters)", function()
  for _, c in ipairs(cases) do
    local function train(chunked, dt, steps)
      local m = c[2](dt)
      if chunked then
        local f = m.forward
        rawset(m, "forward", function(self, ids, labels) return f(self, ids, labels, { chunked_loss = 24 }) end)
      end
      local V = vocab(m)
      local cfg = { train_micro_batch_size_per_gpu = 3, gradient_accumulation_steps = 2, steps_per_print = 1e6,
        optimizer = { type = "AdamW", params = { lr = 1e-2 } } }
      if dt == "bf16" then cfg.bf16 = { enabled = true } end
      local engine = zr.initialize({ model = m, config = cfg })
      return T.train_steps(engine, function(_, mi) return (batch(V, mi)) end, 1, steps, 2)
    end
    local a, b = train(true, "f32", 4), train(false, "f32", 4)
    for i = 1, #a do T.near(a[i], b[i], 0, 1e-5, ("%s f32 step %d loss"):format(c[1], i)) end
    -- bf16: the two paths round dh and the loss's sums differently, and 12 steps at lr 1e-2 amplify that into a few
    -- per cent; the first steps agree closely, and both must learn
    a, b = train(true, "bf16", 12), train(false, "bf16", 12)
    for i = 1, 3 do T.near(a[i], b[i], 0, 0.005, ("%s bf16 step %d loss"):format(c[1], i)) end
    for i = 4, #a do T.near(a[i], b[i], 0, 0.06, ("%s bf16 step %d loss"):format(c[1], i)) end
    assert(a[#a] < 0.8 * a[1], ("%s bf16: loss %g -> %g did not fall below 80%% of its start"):format(c[1], a[1], a[#a]))
  end
end)

T.test("models: chunked_loss refuses what it cannot do, in one line", function()
  local m = llama_model(false)
  local ids, labels = batch(vocab(m), 3)
  T.raises(function() m(ids, labels, { chunked_loss = true, loss_type = "dft" }) end, "loss_type dft needs the per-token")
  T.raises(function() m(ids, labels, { chunked_loss = 0.5 }) end, "chunked_loss must be true or a whole number")
  local p = zr.peft.get_peft_model(m, zr.peft.LoraConfig { r = 2, target_modules = { "lm_head" } })
  T.raises(function() p(ids, labels, { chunked_loss = true }) end, "lm_head is a")
  -- without labels, or with chunked_loss false: the plain forward
  assert(rawget(m(ids, nil, { chunked_loss = true }), "logits"), "no labels: the logits")
end)

T.done()
