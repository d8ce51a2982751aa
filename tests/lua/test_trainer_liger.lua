-- use_liger_kernel / liger_kernel_config (transformers' TrainingArguments): Liger's fused linear cross-entropy is zrun's
-- chunked LM head + loss (the models' chunked_loss: no full logits). The Trainer hands the option to the model, the
-- losses follow the plain Trainer's and fall; the other Liger switches are said to change nothing; what Liger refuses
-- is refused; a model without the option is refused in one line.
local zr = require "zrun"
local T = zr.testing
local nn = zr.nn

local tok = zr.tokenizers.ByteTokenizer.new()
local train_ds = T.sample_rows(tok):group_texts(32):select(1, 48)
local cfg = zr.models.llama.config("zrun/tiny-llama")
local function model()
  zr.manual_seed(3)
  return zr.models.llama.LlamaForCausalLM(cfg)
end

-- The logged losses of 8 steps, and the chunked_loss values the model's forward received.
local function train(args)
  local m, seen = model(), {}
  local f = m.forward
  rawset(m, "forward", function(self, ids, labels, o)
    seen[#seen + 1] = o and o.chunked_loss or false
    return f(self, ids, labels, o)
  end)
  local a = { output_dir = T.tmpdir(), per_device_train_batch_size = 4, max_steps = 8, learning_rate = 3e-3,
    logging_steps = 1, save_strategy = "no", report_to = "none" }
  for k, v in pairs(args) do a[k] = v end
  local t
  local out = T.printed(function()
    t = zr.Trainer { model = m, train_dataset = train_ds, args = a }
    t:train()
  end)
  local losses = {}
  for _, r in ipairs(t.state.log_history) do if r.loss then losses[#losses + 1] = r.loss end end
  return losses, seen, out
end

T.test("use_liger_kernel: the LM head and loss without the full logits; the plain Trainer's losses, falling", function()
  local plain, s0 = train {}
  local liger, s1 = train { use_liger_kernel = true }
  T.eq(s0[1], false, "plain: no chunked_loss")
  T.eq(s1[1], true, "use_liger_kernel: chunked_loss")
  for i = 1, #plain do T.near(liger[i], plain[i], 0, 1e-5, "step " .. i .. " loss") end
  assert(liger[#liger] < 0.9 * liger[1], ("loss %g -> %g did not fall below 90%% of its start"):format(liger[1], liger[#liger]))
  -- fused_linear_cross_entropy off: the logits as without Liger; the kernel switches are said to change nothing
  local _, s2, out = train { use_liger_kernel = true, liger_kernel_config = { fused_linear_cross_entropy = false, rope = true,
    swiglu = false } }
  T.eq(s2[1], false, "fused_linear_cross_entropy = false: the plain loss")
  assert(out:find("liger_kernel_config.rope has no effect in zrun", 1, true), out)
  assert(out:find("liger_kernel_config.swiglu has no effect in zrun", 1, true), out)
  local _, s3 = train { use_liger_kernel = true, liger_kernel_config = '{"fused_linear_cross_entropy": true}' }
  T.eq(s3[1], true, "the command line's JSON object")
  local _, s4, out4 = train { liger_kernel_config = { rms_norm = true } }
  T.eq(s4[1], false, "a config without use_liger_kernel: unused")
  assert(out4:find("liger_kernel_config has no effect without use_liger_kernel", 1, true), out4)
end)

T.test("use_liger_kernel refuses what Liger refuses, and a model without chunked_loss, in one line", function()
  local function new(a, m) return zr.Trainer { model = m or model(), train_dataset = train_ds, args = a } end
  T.raises(function() new { use_liger_kernel = true, liger_kernel_config = { fused_cross_entropy = true } } end,
    "liger_kernel_config: unexpected option 'fused_cross_entropy' (Liger's: cross_entropy, fused_linear_cross_entropy")
  T.raises(function() new { use_liger_kernel = true, liger_kernel_config = { rope = "yes" } } end,
    "liger_kernel_config.rope must be true or false")
  T.raises(function() new { use_liger_kernel = true, liger_kernel_config = { cross_entropy = true } } end,
    "cross_entropy and fused_linear_cross_entropy cannot both be true")
  T.raises(function() new { use_liger_kernel = true, liger_kernel_config = "{rope: 1}" } end,
    "liger_kernel_config must be a JSON object")
  local Tiny = nn.Module:extend("Tiny")
  function Tiny:__init() self.w = nn.Linear(4, 4) end
  function Tiny:forward(x) return self.w(x) end
  T.raises(function() new({ use_liger_kernel = true }, Tiny()) end, "which this model does not declare")
  -- without the fused linear cross-entropy, any model: Liger's other kernels change nothing here
  new({ use_liger_kernel = true, liger_kernel_config = { fused_linear_cross_entropy = false } }, Tiny())
end)

T.done()
