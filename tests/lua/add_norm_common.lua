-- The checks test_gpt2_add_norm.lua and test_llama_add_norm.lua share: a model whose residual adds
-- run with the norm after them as one fused op (zr.add_layer_norm / zr.add_rms_norm, within a block
-- and across blocks) against the model written out with modules (f64), and which adds take the
-- fused op when a block is hooked, a norm is hooked, checkpointing is on, or global hooks are set
-- (ZeRO-3's, which act on a module's own parameters, run around the fused op; any other keeps the
-- module calls).
--   local AN = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "add_norm_common.lua")
--   AN.check{ name =, op =, model =, ids =, reference = function() -> logits, loss end,
--     blocks = (the model's list of blocks), final_norm = (the module), ckpt_owner = (the module
--     whose gradient_checkpointing field checkpointing sets) }
local zr = require "zrun"
local T = zr.testing
local Module = require "zrun.nn.module"
local M = {}

function M.check(c)
  local n, ids, model = #c.blocks, c.ids, c.model
  -- The model's logits, loss and gradients, and how many times the fused op ran (forward and
  -- backward: checkpointing recomputes).
  local function run(fn)
    local real, calls = zr[c.op], 0
    zr[c.op] = function(...) calls = calls + 1; return real(...) end
    model:zero_grad()
    local ok, logits, loss = pcall(function()
      local l, s = (fn or function() local o = model(ids, ids); return o.logits, o.loss end)()
      s:backward()
      return l, s
    end)
    zr[c.op] = real
    if not ok then error(logits, 0) end
    local g = {}
    for name, p in model:named_parameters() do g[name] = p.grad:clone() end
    return logits, loss, g, calls
  end
  local want_logits, want_loss, want_g = run(c.reference)
  local function same(what, logits, loss, g)
    T.near(logits, want_logits, 1e-12, 1e-12, what .. ": logits")
    T.near(loss, want_loss, 1e-12, 1e-12, what .. ": loss")
    for name, w in pairs(want_g) do T.near(g[name], w, 1e-12, 1e-12, what .. ": grad of " .. name) end
  end

  T.test(c.name .. ": every residual add with its norm (2 per block: within it, and the next block's or the final norm)", function()
    local logits, loss, g, calls = run()
    T.eq(calls, 2 * n, c.op .. " calls")
    same("fused", logits, loss, g)
  end)

  T.test(c.name .. ": gradient checkpointing fuses within each block only (one zr.checkpoint output)", function()
    model:gradient_checkpointing_enable()
    local logits, loss, g, calls = run()
    rawset(c.ckpt_owner, "gradient_checkpointing", nil)
    -- each block's inner add in the forward, again in backward's recomputation
    T.eq(calls, 2 * n, c.op .. " calls, forward and recomputation")
    same("checkpointed", logits, loss, g)
  end)

  T.test(c.name .. ": a hooked block is called as a module on the summed residual, a hooked norm as itself", function()
    local seen = {}
    local h1 = c.blocks[2]:register_forward_hook(function(_, out) seen[#seen + 1] = out:size(3) end)
    local logits, loss, g, calls = run()
    h1:remove()
    T.eq(#seen, 1, "block 2's hook ran")
    -- block 2's first norm (its input arrives summed) and block 3's (block 2's output too) are plain
    T.eq(calls, 2 * n - 2, c.op .. " calls with block 2 hooked")
    same("block hooked", logits, loss, g)
    local ran = 0
    local h2 = c.final_norm:register_forward_pre_hook(function() ran = ran + 1 end)
    logits, loss, g, calls = run()
    h2:remove()
    T.eq(ran, 1, "the final norm's hook ran")
    T.eq(calls, 2 * n - 1, c.op .. " calls with the final norm hooked")
    same("final norm hooked", logits, loss, g)
  end)

  T.test(c.name .. ": global hooks acting on a module's own parameters (ZeRO-3's) run around the fused op", function()
    local pre, post = {}, {}
    local h1 = Module.register_module_forward_pre_hook(function(m) pre[m] = (pre[m] or 0) + 1 end, true)
    local h2 = Module.register_module_forward_hook(function(m) post[m] = (post[m] or 0) + 1 end, true)
    Module.fetch = function(p) return p end
    local ok, logits, loss, g, calls = pcall(run)
    Module.fetch = nil
    h1.remove(); h2.remove()
    if not ok then error(logits, 0) end
    T.eq(calls, 2 * n, c.op .. " calls with ZeRO-3's kind of hooks")
    -- every norm's hooks ran once, whether its module was called or a fused op stood for it
    for i, b in ipairs(c.blocks) do
      for name, m in b:named_children() do
        if name:match("norm$") or name:match("^ln_") then
          T.eq(pre[m], 1, ("block %d's %s: pre-hook runs"):format(i, name))
          T.eq(post[m], 1, ("block %d's %s: post-hook runs"):format(i, name))
        end
      end
    end
    T.eq(pre[c.final_norm], 1, "the final norm's pre-hook runs")
    same("own-parameter hooks", logits, loss, g)
  end)

  T.test(c.name .. ": with any other global hook every norm and block is called as a module", function()
    local seen = 0
    local h = Module.register_module_forward_pre_hook(function() seen = seen + 1 end)
    local ok, logits, loss, g, calls = pcall(run)
    h.remove()
    if not ok then error(logits, 0) end
    T.eq(calls, 0, c.op .. " calls with a global hook")
    T.eq(seen > 0, true, "the global hook ran")
    same("global hook", logits, loss, g)
  end)
end

return M
