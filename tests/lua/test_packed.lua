-- Packed sequences (TRL's packing = true with "bfd", padding_free = true): position_ids that restart
-- split a row into sequences, as transformers' find_packed_sequence_indices does; each attends to
-- itself only, with its own positions. The reference is independent of the packing: every sequence
-- run on its own (its logits, and the gradient of the summed token losses). Then TRL's bfd packing
-- and padding-free collator on the examples of TRL's documentation, and SFTTrainer with packing
-- learning. TRL's own rows and curves: tests/golden/sft_trl.json (test_sft_trl.lua),
-- tests/golden/check_sft_trl.py.
-- The model checks run twice: on the segments (the attention op masks each token to its sequence over
-- the rows joined, packed.use_segments, where zr.sdpa_segments_ok) and on the groups (gathered padded
-- batches: packed.use_segments = false); each run checks which path ran.
-- Also run on a GPU by tests/cuda/test_packed_cuda.lua (globals PACKED_DEVICE = "cuda", PACKED_DTYPE f32 or
-- bf16: head_dim 64 there, the Hopper attention kernels).
local zr = require "zrun"
local T = zr.testing
local packed = require "zrun.models.packed"

local DEV = rawget(_G, "PACKED_DEVICE") or "cpu"
local DT = rawget(_G, "PACKED_DTYPE") or (DEV == "cpu" and "f64" or "f32")
local TOL = ({ f64 = 1e-10, f32 = 2e-4, bf16 = 5e-3 })[DT]

local DOCS = { { 5, 6, 7, 8, 9, 10, 11 }, { 12, 13, 14 }, { 30 }, { 20, 21, 22, 23, 24 } }

local function flat_docs(docs)
  local ids, pos, labels = {}, {}, {}
  for _, d in ipairs(docs) do
    for i, v in ipairs(d) do ids[#ids + 1], pos[#pos + 1], labels[#labels + 1] = v, i - 1, i == 1 and -100 or v end
  end
  return ids, pos, labels
end
local function t64(rows) return zr.tensor(rows, { dtype = "i64", device = DEV }) end

T.test("segments: position_ids split where they do not go up by one (transformers' rule), rows apart", function()
  local function lens(p, B, Tn)
    local s = packed.segments(zr.tensor(p, { dtype = "i64" }), B, Tn)
    if not s then return "plain" end
    local out = {}
    for i, g in ipairs(s) do out[i] = g.len .. "@" .. g.p0 end
    return table.concat(out, " ")
  end
  T.eq(lens({ { 0, 1, 2, 0, 1, 0 } }, 1, 6), "3@0 2@0 1@0")
  T.eq(lens({ { 0, 1, 2, 3 } }, 1, 4), "plain")
  T.eq(lens({ { 0, 1, 2 }, { 0, 1, 2 } }, 2, 3), "plain")
  T.eq(lens({ { 0, 1, 0 }, { 0, 1, 2 } }, 2, 3), "2@0 1@0 3@0")
  T.eq(lens({ { 5, 6, 7, 0, 1 } }, 1, 5), "3@5 2@0") -- (a sequence may start at any position)
  T.eq(lens({ { 0, 1, 0, 0, 0 } }, 1, 5), "2@0 1@0 1@0 1@0") -- (padding at position 0: one token each)
  T.eq(lens({ { 0, 2, 3 } }, 1, 3), "1@0 2@2")
  T.raises(function() packed.segments(zr.tensor({ { 0, 1 } }, { dtype = "i64" }), 1, 3) end, "position_ids must be")
  T.raises(function() packed.segments(zr.tensor({ { 0, -1 } }, { dtype = "i64" }), 1, 2) end, "is not a position")
end)

T.test("segments, flat: the rows joined as one, each token's first token and one past its last (i32 (2, 1, B·T))", function()
  -- row 2 goes on from row 1's last position: a new sequence all the same (rows apart)
  local s = packed.segments(zr.tensor({ { 0, 1, 2, 0, 1 }, { 2, 3, 0, 1, 2 } }, { dtype = "i64" }), 2, 5, "cpu", true)
  T.eq(s.groups, nil, "no groups")
  T.eq(s.seg:dtype(), "i32")
  T.eq(table.concat(s.seg:shape(), ","), "2,1,10")
  T.eq_list(s.seg:flat_table(), { 0, 0, 0, 3, 3, 5, 5, 7, 7, 7, 3, 3, 3, 5, 5, 7, 7, 10, 10, 10 })
  T.eq(packed.segments(zr.tensor({ { 0, 1, 2 } }, { dtype = "i64" }), 1, 3, "cpu", true), nil, "plain")
end)

local function llama_cfg()
  local cfg = {}
  for k, v in pairs(zr.models.llama.config("zrun/tiny-llama")) do cfg[k] = v end
  if DEV ~= "cpu" then -- (the Hopper attention kernels: head_dim 64, 16-bit)
    cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 128, 2, 1, 64
  end
  cfg.dtype, cfg.device = DT, DEV
  return cfg
end
local function gpt2_cfg()
  return { model_type = "gpt2", n_embd = DEV == "cpu" and 32 or 128, n_layer = 2, n_head = 2, vocab_size = 64,
    n_positions = 16, layer_norm_epsilon = 1e-5, tie_word_embeddings = true, dtype = DT, device = DEV }
end

-- the packed run's logits and gradients against each sequence run alone
local function check_model(m, what, docs)
  docs = docs or DOCS
  local ids, pos, labels = flat_docs(docs)
  local out = m(t64({ ids }), t64({ labels }), { position_ids = t64({ pos }) })
  local count = 0 -- (the labels scored: each after the first of its sequence)
  for i = 2, #labels do if labels[i] ~= -100 then count = count + 1 end end
  local lc = out.loss * count
  lc:backward()
  local gp = {}
  for name, p in m:named_parameters() do gp[name] = p.grad:to("cpu", "f64"); p.grad = nil end
  local logits = out.logits:to("cpu", "f64")
  local off, gsum = 0, {}
  for _, d in ipairs(docs) do
    local l = { -100 }
    for i = 2, #d do l[i] = d[i] end
    local o = m(t64({ d }), #d > 1 and t64({ l }) or nil)
    local part = logits:narrow(2, off + 1, #d)
    local want = o.logits:to("cpu", "f64")
    local a = T.diff(part, want)
    assert(a <= TOL * 10, ("%s: sequence at %d: logits differ by %g"):format(what, off, a))
    if #d > 1 then
      local ld = o.loss * (#d - 1)
      ld:backward()
      for name, p in m:named_parameters() do
        local g = p.grad:to("cpu", "f64")
        gsum[name] = gsum[name] and gsum[name] + g or g
        p.grad = nil
      end
    end
    off = off + #d
  end
  for name, g in pairs(gp) do
    local a = T.diff(g, gsum[name])
    local scale = gsum[name]:abs():max():item()
    assert(a <= TOL * 10 * math.max(1, scale), ("%s: gradient of %s differs by %g (scale %g)"):format(what, name, a, scale))
  end
end

-- The grouped path's runs (packed.attend calls), counted while the model tests run.
local attend, attends = packed.attend, 0
packed.attend = function(...)
  attends = attends + 1
  return attend(...)
end

-- The model tests on the segments (segments = true, where they run) or on the groups.
local function model_tests(segments)
  packed.use_segments = segments
  local cfg = llama_cfg()
  local flat = packed.flat_ok(DEV, DT, cfg.head_dim or cfg.hidden_size / cfg.num_attention_heads)
  local mode = flat and " [segments]" or " [groups]"
  -- runs fn, then checks that the attention ran the path mode names
  local function test(name, fn, grouped_anyway)
    T.test(name .. mode, function()
      attends = 0
      fn()
      if flat and not grouped_anyway then T.eq(attends, 0, "packed.attend calls on the segments")
      else assert(attends > 0, "the groups ran") end
    end)
  end

test("Llama: packed sequences give each sequence's own logits and gradients (qkv_rope_sdpa path)", function()
  zr.manual_seed(0)
  check_model(zr.models.llama.LlamaForCausalLM(llama_cfg()), "llama")
end)

test("groups: sequences of about one length in one padded batch; each logit and gradient still its sequence's own", function()
  -- lengths 200, 130, 70, 65, 3 (64-row tiles 4, 3, 2, 2, 1): groups {200, 130}, {70, 65}, {3}
  local lens = { 70, 3, 200, 65, 130 }
  local docs = {}
  for i, n in ipairs(lens) do
    local d = {}
    for t = 1, n do d[t] = 3 + (i * 31 + t * 7) % 250 end
    docs[i] = d
  end
  local _, pos = flat_docs(docs)
  local segs = packed.segments(zr.tensor({ pos }, { dtype = "i64" }), 1, #pos)
  local shape = {}
  for k, g in ipairs(segs.groups) do shape[k] = #g.members .. "x" .. g.T end
  T.eq(table.concat(shape, " "), "2x200 2x70 1x3", "groups")
  -- a sequence that does not start at position 0 goes alone (its own rope positions)
  segs = packed.segments(zr.tensor({ { 0, 1, 2, 5, 6, 0, 1 } }, { dtype = "i64" }), 1, 7)
  shape = {}
  for k, g in ipairs(segs.groups) do shape[k] = #g.members .. "x" .. g.T .. "@" .. g.p0 end
  T.eq(table.concat(shape, " "), "1x3@0 1x2@5 1x2@0", "p0 alone")
  attends = 0 -- (the model below runs the mode's path)
  zr.manual_seed(0)
  check_model(zr.models.llama.LlamaForCausalLM(llama_cfg()), "llama, groups", docs)
end)

test("Llama: the same with q/k/v called one by one (rope + sdpa) and with gradient checkpointing", function()
  zr.manual_seed(0)
  local m = zr.models.llama.LlamaForCausalLM(llama_cfg())
  for _, layer in ipairs(m.model.layers) do -- (a forward of its own: not fusable)
    layer.self_attn.q_proj.forward = function(self, x) return zr.nn.Linear.forward(self, x) end
  end
  check_model(m, "llama unfused")
  zr.manual_seed(0)
  local m2 = zr.models.llama.LlamaForCausalLM(llama_cfg())
  m2:gradient_checkpointing_enable()
  m2:train()
  check_model(m2, "llama checkpointed")
end)

test("a sequence starting at position p: Llama's rotations are relative (its logits as from 0), GPT-2 reads wpe rows p..", function()
  zr.manual_seed(0)
  local m = zr.models.llama.LlamaForCausalLM(llama_cfg())
  local ids = { 5, 6, 7, 8, 9, 40, 41, 42 }
  local at7 = m(t64({ ids }), nil, { position_ids = t64({ { 0, 1, 2, 3, 4, 7, 8, 9 } }) }).logits:to("cpu", "f64")
  local at0 = m(t64({ ids }), nil, { position_ids = t64({ { 0, 1, 2, 3, 4, 0, 1, 2 } }) }).logits:to("cpu", "f64")
  T.near(at7, at0, TOL * 10, 0, "llama")
  local g = zr.models.gpt2.GPT2LMHeadModel(gpt2_cfg())
  g:eval()
  local out = g(t64({ { 1, 2, 3 } }), nil, { position_ids = t64({ { 3, 4, 5 } }) }).logits:to("cpu", "f64")
  -- the reference: the plain model (positions 0..2) with wpe's rows 4..6 moved to 1..3
  zr.no_grad(function()
    local w = g.transformer.wpe.weight
    w:narrow(1, 1, 3):copy_(w:narrow(1, 4, 3):clone())
  end)
  T.near(out, g(t64({ { 1, 2, 3 } })).logits:to("cpu", "f64"), TOL * 10, 0, "gpt2")
end)

test("Llama: two rows of packed sequences (B = 2) as each sequence alone", function()
  zr.manual_seed(0)
  local m = zr.models.llama.LlamaForCausalLM(llama_cfg())
  local rows = { { 5, 6, 7, 8, 9, 10 }, { 20, 21, 22, 23, 24, 25 } }
  local pos = { { 0, 1, 2, 0, 1, 2 }, { 0, 1, 2, 3, 0, 1 } }
  local out = m(t64(rows), nil, { position_ids = t64(pos) }).logits:to("cpu", "f64")
  local function alone(r, a, b) return m(t64({ { unpack(rows[r], a, b) } })).logits:to("cpu", "f64") end
  T.near(out:narrow(1, 1, 1):narrow(2, 1, 3), alone(1, 1, 3), TOL * 10, 0, "row 1, first")
  T.near(out:narrow(1, 1, 1):narrow(2, 4, 3), alone(1, 4, 6), TOL * 10, 0, "row 1, second")
  T.near(out:narrow(1, 2, 1):narrow(2, 1, 4), alone(2, 1, 4), TOL * 10, 0, "row 2, first")
  T.near(out:narrow(1, 2, 1):narrow(2, 5, 2), alone(2, 5, 6), TOL * 10, 0, "row 2, second")
end)

test("GPT-2: packed sequences give each sequence's own logits and gradients (learned positions restart)", function()
  zr.manual_seed(0)
  local m = zr.models.gpt2.GPT2LMHeadModel(gpt2_cfg())
  m:eval() -- (no dropout)
  check_model(m, "gpt2")
  T.raises(function() m(t64({ { 1, 2, 3 } }), nil, { position_ids = t64({ { 0, 1, 16 } }) }) end,
    "position 16 exceeds n_positions 16")
  -- checkpointed blocks, training without dropout (cfg's pdrop 0)
  zr.manual_seed(0)
  local m2 = zr.models.gpt2.GPT2LMHeadModel(gpt2_cfg())
  m2:gradient_checkpointing_enable()
  m2:train()
  check_model(m2, "gpt2 checkpointed")
end)

test("GPT-2 with the attention dropout (its eager path) runs the groups", function()
  zr.manual_seed(0)
  local cfg = gpt2_cfg()
  cfg.attn_pdrop, cfg.resid_pdrop, cfg.embd_pdrop = 1e-300, 0, 0 -- (the eager path, dropping nothing)
  local m = zr.models.gpt2.GPT2LMHeadModel(cfg)
  m:train()
  check_model(m, "gpt2 eager")
end, true)
end

model_tests(true)
model_tests(false)
packed.use_segments = true

T.test("TRL's bfd packing on its documentation's example (bfd and bfd_split)", function()
  local rows = {}
  for _, ids in ipairs { { 1, 2, 3, 4, 5 }, { 6, 7 }, { 8, 9, 10 }, { 11 } } do rows[#rows + 1] = { input_ids = ids, labels = ids } end
  local function show(out)
    local s = {}
    for _, r in ipairs(out) do s[#s + 1] = table.concat(r.input_ids, ",") .. "/" .. table.concat(r.seq_lengths, ",") end
    return table.concat(s, " ")
  end
  -- (data_utils.pack_dataset's docstring: [[1,2,3,4],[8,9,10,11],[6,7]], seq_lengths [[4],[3,1],[2]]; and with
  -- bfd_split [[1,2,3,4],[8,9,10,5],[6,7,11]], [[4],[3,1],[2,1]])
  T.eq(show(zr.sft.pack_bfd(rows, 4)), "1,2,3,4/4 8,9,10,11/3,1 6,7/2")
  T.eq(show(zr.sft.pack_bfd(rows, 4, nil, true)), "1,2,3,4/4 8,9,10,5/3,1 6,7,11/2,1")
  T.eq(show(zr.sft.pack_bfd({ { input_ids = {}, labels = {} }, rows[2] }, 4)), "6,7/2") -- (empty rows dropped)
end)

T.test("the padding-free collator: TRL's example; seq_lengths; padding at position 0; the padded one refuses packed rows", function()
  local c = zr.datasets.causal_lm_collator { pad_token_id = 0, padding_free = true }
  -- (DataCollatorForLanguageModeling's docstring: [[1,2,3],[4,5]] -> input_ids [[1,2,3,4,5]], position_ids [[0,1,2,0,1]],
  -- labels [[-100,2,3,-100,5]])
  local b = c { { input_ids = { 1, 2, 3 } }, { input_ids = { 4, 5 } } }
  T.eq_list(b.input_ids:flat_table(), { 1, 2, 3, 4, 5 })
  T.eq_list(b.position_ids:flat_table(), { 0, 1, 2, 0, 1 })
  T.eq_list(b.labels:flat_table(), { -100, 2, 3, -100, 5 })
  T.eq(b.attention_mask, nil, "no attention_mask")
  b = zr.datasets.causal_lm_collator { pad_token_id = 0, padding_free = true, pad_to_multiple_of = 4 } {
    { input_ids = { 1, 2, 3, 4 }, labels = { 1, -100, 3, 4 }, seq_lengths = { 1, 3 } } }
  T.eq_list(b.input_ids:flat_table(), { 1, 2, 3, 4 })
  T.eq_list(b.position_ids:flat_table(), { 0, 0, 1, 2 })
  T.eq_list(b.labels:flat_table(), { -100, -100, 3, 4 })
  b = zr.datasets.causal_lm_collator { pad_token_id = 9, padding_free = true, pad_to_multiple_of = 4 } { { input_ids = { 1, 2 } } }
  T.eq_list(b.input_ids:flat_table(), { 1, 2, 9, 9 })
  T.eq_list(b.position_ids:flat_table(), { 0, 1, 0, 0 })
  T.eq_list(b.labels:flat_table(), { -100, 2, -100, -100 })
  T.raises(function() c { { input_ids = { 1, 2 }, seq_lengths = { 1 } } } end, "seq_lengths add up to 1 for 2")
  -- a token equal to the pad is learned (no padding inside the row): [[5,0,7],[3,4]] with pad 0 -> labels
  -- [[-100,0,7,-100,4]] from transformers 5.17's DataCollatorWithFlattening() and TRL 1.10's collator (padding_free=True)
  T.eq_list(c({ { input_ids = { 5, 0, 7 } }, { input_ids = { 3, 4 } } }).labels:flat_table(), { -100, 0, 7, -100, 4 })
  T.raises(function() zr.datasets.causal_lm_collator { pad_token_id = 0 } { { input_ids = { 1, 2 }, seq_lengths = { 1, 1 } } } end,
    "causal_lm_collator{padding_free = true}")
end)

T.test("SFTTrainer with packing = true (bfd, TRL's default) learns, on padding-free batches", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  local rows = {}
  local words = { "red", "green", "blue", "sky", "sea", "stone" }
  for i = 1, 48 do
    local w = {}
    for k = 1, 1 + i % 5 do w[k] = words[(i + k) % #words + 1] end
    rows[i] = { text = table.concat(w, " ") }
  end
  zr.manual_seed(0)
  local cfg = llama_cfg()
  cfg.dtype = "f32"
  local widths, npos = {}, 0
  local tr
  T.printed(function()
    tr = zr.SFTTrainer { model = zr.models.llama.LlamaForCausalLM(cfg), processing_class = tok,
      train_dataset = zr.datasets.Dataset.from_rows(rows),
      args = { output_dir = T.tmpdir(), save_strategy = "no", packing = true, max_length = 64, per_device_train_batch_size = 2,
        learning_rate = 3e-3, lr_scheduler_type = "constant", logging_steps = 1, max_steps = 16, bf16 = DT == "bf16",
        gradient_checkpointing = false, train_sampling_strategy = "sequential" } }
  end)
  for _, r in ipairs(tr.train_dataset.rows) do assert(#r.input_ids <= 64 and r.seq_lengths, "bfd blocks") end
  local collate = tr.collator
  tr.collator = function(b)
    local out = collate(b)
    widths[#widths + 1] = out.input_ids:size(1)
    if out.position_ids then npos = npos + 1 end
    return out
  end
  T.printed(function() tr:train() end)
  local loss, norm = {}, {}
  for _, r in ipairs(tr.state.log_history) do if r.loss then loss[#loss + 1], norm[#norm + 1] = r.loss, r.grad_norm end end
  T.eq(#loss, 16, "16 logged steps")
  for _, w in ipairs(widths) do T.eq(w, 1, "one flattened row a micro-batch") end
  T.eq(npos, #widths, "position_ids in every batch")
  for i, g in ipairs(norm) do assert(g > 0 and g == g, ("step %d: gradient norm %s"):format(i, tostring(g))) end
  local first = (loss[1] + loss[2]) / 2
  local last = (loss[15] + loss[16]) / 2
  assert(last < first - 1.0, ("the loss falls by more than 1.0: %.3f -> %.3f"):format(first, last))
end)

T.done()
