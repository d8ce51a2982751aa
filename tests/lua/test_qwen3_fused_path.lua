-- llama.lua's Qwen3 branch that hands q_norm / k_norm to zr.qkv_norm_rope_sdpa (the GPU's path: fused kernels
-- there) run on the CPU, where the op is its composition: with zr.qkv_norm_rope_fused answering yes the model
-- must give bit for bit what its modules give (logits, loss and every gradient), on plain rows, packed sequences
-- on the segments and on the groups, a sliding window, with the op called once a layer; through zr.initialize at
-- ZeRO stages 2 and 3 (the norms' hooks around the op: Module.call_group) the same losses over 3 AdamW steps;
-- and it is not taken when a norm has a hook of its own.
local zr = require "zrun"
local T = zr.testing
local packed = require "zrun.models.packed"

local CFG = { model_type = "qwen3", vocab_size = 48, hidden_size = 32, intermediate_size = 40, num_hidden_layers = 2,
  num_attention_heads = 4, num_key_value_heads = 2, head_dim = 16, max_position_embeddings = 128, rms_norm_eps = 1e-6,
  rope_theta = 1e6 }

-- f with zr.qkv_norm_rope_fused answering `fused`; returns f's results and how often the op ran
local function with_fused(fused, f)
  local orig_ok, orig_op, calls = zr.qkv_norm_rope_fused, zr.qkv_norm_rope_sdpa, 0
  zr.qkv_norm_rope_fused = function() return fused end
  zr.qkv_norm_rope_sdpa = function(...) calls = calls + 1; return orig_op(...) end
  local res = { pcall(f) }
  zr.qkv_norm_rope_fused, zr.qkv_norm_rope_sdpa = orig_ok, orig_op
  assert(res[1], res[2])
  return res[2], calls
end

local function model_of(cfg)
  zr.manual_seed(3)
  local m = zr.models.qwen3.Qwen3ForCausalLM(cfg)
  for _, l in ipairs(m.model.layers) do -- norms' weights away from ones, so that a lost weight shows
    l.self_attn.q_norm.weight:copy_(zr.rand({ cfg.head_dim }) + 0.5)
    l.self_attn.k_norm.weight:copy_(zr.rand({ cfg.head_dim }) + 0.5)
  end
  return m
end

-- logits, loss and every gradient of one forward + backward
local function run(m, ids, opts)
  m:zero_grad()
  local out = m(ids, ids, opts)
  out.loss:backward()
  local r = { logits = out.logits:clone(), loss = out.loss:item() }
  for n, p in m:named_parameters() do r[n] = p.grad:clone() end
  return r
end

local function same(got, want, what)
  for k, v in pairs(want) do
    if type(v) == "number" then T.eq(got[k], v, what .. ": " .. k)
    else T.eq((got[k]:to("f64") - v:to("f64")):abs():max():item(), 0, what .. ": " .. k) end
  end
end

T.test("qwen3: the fused-norms branch equals the modules bit for bit (plain rows, segments, groups, a window)", function()
  zr.manual_seed(4)
  local ids = (zr.rand({ 2, 24 }) * (CFG.vocab_size - 1)):to("i64")
  local pos = zr.cat({ zr.arange(0, 14, { dtype = "i64" }), zr.arange(0, 10, { dtype = "i64" }) }, 1):view(1, 24)
  local wcfg = {}
  for k, v in pairs(CFG) do wcfg[k] = v end
  wcfg.use_sliding_window, wcfg.sliding_window, wcfg.max_window_layers = true, 6, 1
  local cases = {
    { "plain rows", CFG, ids },
    { "a sliding window from layer 2", wcfg, ids },
    { "packed sequences on the segments", CFG, ids:narrow(1, 1, 1), { position_ids = pos }, true },
    { "packed sequences on the groups", CFG, ids:narrow(1, 1, 1), { position_ids = pos }, false },
  }
  local keep = packed.use_segments
  for _, c in ipairs(cases) do
    local what, cfg, x, opts, seg = c[1], c[2], c[3], c[4], c[5]
    local m = model_of(cfg)
    if seg ~= nil then packed.use_segments = seg end
    local ok, err = pcall(function()
      local want, n0 = with_fused(false, function() return run(m, x, opts) end)
      local got, n1 = with_fused(true, function() return run(m, x, opts) end)
      T.eq(n0, 0, what .. ": the modules' path does not call the op")
      T.eq(n1 > 0 and n1 % cfg.num_hidden_layers == 0, true, what .. ": the op ran in every layer (" .. n1 .. " calls)")
      same(got, want, what)
    end)
    packed.use_segments = keep
    if not ok then error(err, 0) end
  end
end)

T.test("qwen3: the fused-norms branch trains as the modules do through zr.initialize, ZeRO 2 and 3", function()
  zr.manual_seed(5)
  local ids = (zr.rand({ 2, 16 }) * (CFG.vocab_size - 1)):to("i64")
  for _, stage in ipairs { 2, 3 } do
    local function losses()
      local engine = zr.initialize({ model = model_of(CFG), config = { train_micro_batch_size_per_gpu = 2,
        steps_per_print = 1000000, optimizer = { type = "AdamW", params = { lr = 1e-2 } },
        zero_optimization = { stage = stage } } })
      return T.train_steps(engine, function() return ids end, 1, 3, 1)
    end
    local want = with_fused(false, losses)
    local got, calls = with_fused(true, losses)
    T.eq(calls, 3 * CFG.num_hidden_layers, "stage " .. stage .. ": the op in every layer at every step")
    for i = 1, 3 do T.eq(got[i], want[i], ("stage %d step %d: loss"):format(stage, i)) end
    assert(want[3] < want[1], ("stage %d: the loss falls (%g -> %g)"):format(stage, want[1], want[3]))
  end
end)

T.test("qwen3: a norm with a hook of its own keeps the modules' path", function()
  local m = model_of(CFG)
  local seen = 0
  m.model.layers[1].self_attn.q_norm:register_forward_hook(function() seen = seen + 1 end)
  zr.manual_seed(6)
  local ids = (zr.rand({ 1, 8 }) * (CFG.vocab_size - 1)):to("i64")
  local _, calls = with_fused(true, function() return m(ids).logits end)
  T.eq(seen, 1, "the hooked q_norm ran as a module")
  T.eq(calls, 1, "the other layer still took the op")
end)

T.done()
