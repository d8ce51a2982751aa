-- DeepSpeed's own ZeRO checkpoints (torch pickles) in zrun: `zrun zero-to-fp32` consolidates them
-- as DeepSpeed's zero_to_fp32.py does, zr.zero.load_state_dict_from_zero_checkpoint loads them into
-- a model, and engine:load_checkpoint continues the DeepSpeed run (weights, Adam moments, step
-- counts, schedule) at any stage. The checkpoints under tests/golden/torch_files were written by
-- tests/golden/make_torch_files.py in DeepSpeed 0.19.8's layouts: ds_zero2 (bf16, 2 ranks, the
-- default rigid optimizer state, lm_head frozen, a buffer), ds_zero2_aligned (3 ranks,
-- parameter_alignment padding, elastic optimizer state, the Trainer's two groups), ds_zero3 (2 ranks, two flat groups, the
-- embedding frozen and lm_head tied to it), ds_bf16_nozero (BF16_Optimizer: ZeRO-1 in bf16 with fp32 accumulation, its partitions,
-- its param_slice_mappings, no param_shapes), and three saved without ZeRO, everything in the model-states
-- file: ds_nozero_bf16 (FP16_Optimizer in bf16: the Trainer's two groups flattened, lm_head tied to the
-- embedding), ds_nozero_fp16 (FP16_UnfusedOptimizer: the masters one by one, a dynamic loss scale),
-- ds_nozero_fp32 (the optimizer's own state, lm_head frozen). Their weights are in reference.safetensors; the saved
-- moments are exp_avg = w / 2 and exp_avg_sq = w^2 of the master w, so misplaced elements show.
-- Also a universal checkpoint (ds_universal: ds_to_universal.py's per-parameter files, found through
-- latest_universal) and a transformers Trainer checkpoint written without DeepSpeed (hf_plain_out/checkpoint-3:
-- optimizer.pt, scheduler.pt, trainer_state.json), resumed by zr.Trainer.
local zr = require "zrun"
local T = zr.testing
local Z = ZRUN_BIN or os.getenv("ZRUN_BIN") or "./zrun"
local DIR = (ZRUN_HOME or ".") .. "/tests/golden/torch_files/"
local tmp = T.tmpdir()
local CASES = { ds_zero2 = { ranks = 2, stage = 2, frozen = "lm_head.weight", n = 13 },
  ds_zero2_aligned = { ranks = 3, stage = 2, frozen = "lm_head.weight", n = 13 },
  ds_zero3 = { ranks = 2, stage = 3, frozen = "model.embed_tokens.weight", n = 12 },
  ds_bf16_nozero = { ranks = 2, frozen = "lm_head.weight", n = 12,
    kind = "DeepSpeed's BF16_Optimizer checkpoint of 2 ranks" },
  ds_nozero_bf16 = { tied = true, n = 12, kind = "DeepSpeed's checkpoint without ZeRO (FP16_Optimizer)" },
  ds_nozero_fp16 = { n = 12, kind = "DeepSpeed's checkpoint without ZeRO (FP16_UnfusedOptimizer)" },
  ds_nozero_fp32 = { frozen = "lm_head.weight", n = 12, kind = "DeepSpeed's checkpoint without ZeRO (its optimizer)" } }
local ORDER = { "ds_zero2", "ds_zero2_aligned", "ds_zero3", "ds_bf16_nozero", "ds_nozero_bf16", "ds_nozero_fp16",
  "ds_nozero_fp32" }
-- (ds_universal: ds_to_universal.py's, every parameter trained; ds_universal3: a ZeRO-3 one, every
-- parameter flat)
local LOADS = { "ds_zero2", "ds_zero2_aligned", "ds_zero3", "ds_bf16_nozero", "ds_universal", "ds_universal3",
  "ds_nozero_bf16", "ds_nozero_fp16", "ds_nozero_fp32" }

-- 16 rows of 8 token ids below the micro vocabulary's 32, varied by a.
local function token_rows(a)
  local rows = {}
  for i = 1, 16 do
    local r = {}
    for k = 1, 8 do r[k] = (i * a + k * 3) % 32 end
    rows[i] = { input_ids = r }
  end
  return zr.datasets.Dataset.from_rows(rows)
end

local function ref_of(name) return zr.load_safetensors(DIR .. name .. "/reference.safetensors") end
local function max_diff(a, b) return (a:to({ dtype = "f32" }) - b:to({ dtype = "f32" })):abs():max():item() end

-- The micro Llama the checkpoints were saved from (ds_zero3's ties lm_head to the embedding),
-- with the checkpoint's frozen parameter frozen.
local function model_for(name)
  local c = CASES[name] or {}
  local m
  if name == "ds_zero3" or c.tied then
    m = T.tied_llama(DIR .. "llama_micro_bin") -- (built tied, the file's untied lm_head.weight left out)
  else
    m = zr.models.llama.from_pretrained(DIR .. "llama_micro_bin")
  end
  if not c.frozen then return m end
  local frozen = c.frozen == "lm_head.weight" and m.lm_head.weight or m.model.embed_tokens.weight
  frozen:requires_grad_(false)
  return m
end

for _, name in ipairs(ORDER) do
  local c = CASES[name]
  T.test(name .. ": zrun zero-to-fp32 writes the consolidated weights", function()
    local out = tmp .. "/" .. name
    local text, rc = T.run(("%s zero-to-fp32 %s%s %s"):format(Z, DIR, name, out))
    T.eq(rc, 0, "exit status (" .. text .. ")")
    assert(text:find(c.kind or ("DeepSpeed's ZeRO-%d checkpoint of %d ranks"):format(c.stage, c.ranks), 1, true), text)
    assert(not text:find("tensors (0 fp32"), text)
    local got, ref = zr.load_safetensors(out .. "/model.safetensors"), ref_of(name)
    local n = 0
    for k, v in pairs(ref) do
      n = n + 1
      assert(got[k], "missing " .. k)
      T.eq(got[k]:dtype(), "f32", k .. " dtype")
      T.eq(max_diff(got[k], v), 0, k)
    end
    for k in pairs(got) do assert(ref[k], "unexpected " .. k) end
    T.eq(n, c.n, "tensors")
    -- the tag folder given itself (global_step2/) reads the same
    text, rc = T.run(("%s zero-to-fp32 %s%s/global_step2 %s_tag.safetensors"):format(Z, DIR, name, out))
    T.eq(rc, 0, "exit status (" .. text .. ")")
    T.eq(max_diff(zr.load_safetensors(out .. "_tag.safetensors")["model.norm.weight"], ref["model.norm.weight"]), 0, "tag folder")
    -- --exclude_frozen_parameters leaves the frozen one out (and its tied name)
    text, rc = T.run(("%s zero-to-fp32 %s%s %s.safetensors --exclude_frozen_parameters"):format(Z, DIR, name, out))
    T.eq(rc, 0, "exit status (" .. text .. ")")
    local ex = zr.load_safetensors(out .. ".safetensors")
    if c.frozen then assert(not ex[c.frozen], "the frozen parameter was written") end
    assert(ex["model.norm.weight"], "a trained parameter is missing")
  end)
end

T.test("zr.zero.load_state_dict_from_zero_checkpoint loads a DeepSpeed checkpoint into a model", function()
  local m = zr.models.llama.LlamaForCausalLM(zr.models.llama.config(DIR .. "llama_micro_bin"))
  zr.zero.load_state_dict_from_zero_checkpoint(m, DIR .. "ds_zero2")
  local ref = ref_of("ds_zero2")
  for k, p in m:named_parameters() do T.eq(max_diff(p, ref[k]), 0, k) end
end)

for _, name in ipairs(LOADS) do
  for _, stage in ipairs({ 0, 2, 3 }) do
    T.test(("%s: engine:load_checkpoint at stage %d continues the run"):format(name, stage), function()
      local m = model_for(name)
      local engine, _, _, sched = zr.initialize{ model = m, config = { train_micro_batch_size_per_gpu = 1,
        optimizer = { type = "AdamW", params = { lr = 1e-2 } }, zero_optimization = { stage = stage },
        scheduler = { type = "WarmupLR", params = { warmup_num_steps = 10, warmup_max_lr = 1e-2 } } } }
      local cs, path = engine:load_checkpoint(DIR .. name)
      assert(path:find("global_step2", 1, true), path)
      if name == "ds_zero2" or name == "ds_zero2_aligned" then -- (the others' saves had no client_state)
        T.eq(cs.epoch, 3, "client_state")
        T.eq(cs.note.source, "deepspeed", "client_state (a dict)")
        T.eq(cs.buffer_names, nil, "DeepSpeed's own keys are not client_state")
      end
      T.eq(engine.global_steps, 2, "global_steps")
      T.eq(engine.opt_steps, 2, "the optimizer's step (bias correction)")
      T.eq(sched.last_batch_iteration, 1, "the schedule's position")
      local ref = ref_of(name)
      for k, p in m:named_parameters() do
        T.eq(max_diff(p, ref[k]), 0, k)
      end
      if stage == 0 then -- one partition holds everything: the moments at the master's positions
        local z = engine.zero
        for i, p in ipairs(engine.params) do
          local off = z:layout(i)
          local w = p:to({ dtype = "f32" }):reshape({ p:numel() })
          T.eq(max_diff(z:state(1):narrow(1, off + 1, p:numel()), w * 0.5), 0, "exp_avg of parameter " .. i)
          T.eq(max_diff(z:state(2):narrow(1, off + 1, p:numel()), w * w), 0, "exp_avg_sq of parameter " .. i)
        end
      end
      -- and it trains on: the loss on a fixed batch falls
      local ids = zr.tensor({ { 1, 5, 7, 9, 3, 11, 4, 8 } }, { dtype = "i64" })
      local first, last
      for _ = 1, 8 do
        local loss = engine(ids, ids).loss
        engine:backward(loss)
        engine:step()
        first = first or loss:item()
        last = loss:item()
      end
      assert(last < first - 0.05, ("the loss did not fall: %.4f -> %.4f"):format(first, last))
      T.eq(engine.global_steps, 10, "steps counted on from the checkpoint's")
    end)
  end
end

T.test("load_module_only / load_optimizer_states = false on a DeepSpeed checkpoint", function()
  local ref = ref_of("ds_zero2")
  local m = model_for("ds_zero2")
  local engine = zr.initialize{ model = m, config = { train_micro_batch_size_per_gpu = 1,
    optimizer = { type = "AdamW", params = { lr = 1e-3 } }, zero_optimization = { stage = 2 } } }
  engine:load_checkpoint(DIR .. "ds_zero2", nil, { load_module_only = true })
  for k, p in m:named_parameters() do T.eq(max_diff(p, ref[k]), 0, k) end
  T.eq(engine.global_steps, 0, "the run's counters stay (module only)")
  -- another optimizer takes the weights and counters, not Adam's moments
  local m2 = model_for("ds_zero2")
  local e2 = zr.initialize{ model = m2, config = { train_micro_batch_size_per_gpu = 1,
    optimizer = { type = "Lion", params = { lr = 1e-4 } }, zero_optimization = { stage = 2 } } }
  T.raises(function() e2:load_checkpoint(DIR .. "ds_zero2") end, "load it with the optimizer.type it was saved with")
  e2:load_checkpoint(DIR .. "ds_zero2", nil, { load_optimizer_states = false })
  for k, p in m2:named_parameters() do T.eq(max_diff(p, ref[k]), 0, k) end
  T.eq(e2.global_steps, 2, "the counters")
end)

T.test("fp16: the loss scale comes back from DeepSpeed's loss scaler", function()
  local m = model_for("ds_zero2")
  local engine = zr.initialize{ model = m, config = { train_micro_batch_size_per_gpu = 1, fp16 = { enabled = true },
    optimizer = { type = "AdamW", params = { lr = 1e-3 } }, zero_optimization = { stage = 2 } } }
  T.eq(engine.scaler.scale, 2 ^ 16, "the initial scale")
  engine.scaler.scale = 8
  engine:load_checkpoint(DIR .. "ds_zero2")
  T.eq(engine.scaler.scale, 65536, "DynamicLossScaler.cur_scale")
  -- without ZeRO, FP16_UnfusedOptimizer keeps the scaler's fields in its own state: scale 1024, the
  -- last overflow at iteration 3 of 7 (3 good steps since)
  local m2 = model_for("ds_nozero_fp16")
  local e2 = zr.initialize{ model = m2, config = { train_micro_batch_size_per_gpu = 1, fp16 = { enabled = true },
    optimizer = { type = "AdamW", params = { lr = 1e-3 } } } }
  e2:load_checkpoint(DIR .. "ds_nozero_fp16")
  T.eq(e2.scaler.scale, 1024, "FP16_UnfusedOptimizer's cur_scale")
  T.eq(e2.scaler.good, 3, "steps since the last overflow")
end)

T.test("a transformers Trainer checkpoint (DeepSpeed inside) resumes in zr.Trainer", function()
  -- checkpoint-2 of an HF run: ds_zero2's engine files, trainer_state.json, the Trainer's LambdaLR in
  -- scheduler.pt (linear from 2e-2 over 8 steps: 2 done), rng_state.pth (not read)
  local out = tmp .. "/hf_out"
  assert(os.execute(("mkdir -p '%s' && cp -r %shf_trainer_out/checkpoint-2 '%s'/"):format(out, DIR, out)) == 0)
  local m = model_for("ds_zero2")
  local tr = zr.Trainer { model = m, train_dataset = token_rows(7), args = { output_dir = out,
    per_device_train_batch_size = 2, max_steps = 8, learning_rate = 2e-2, logging_steps = 1, save_steps = 100,
    bf16 = true, deepspeed = { train_micro_batch_size_per_gpu = "auto", bf16 = { enabled = "auto" },
      zero_optimization = { stage = 2 }, optimizer = { type = "AdamW", params = { lr = "auto" } } } } }
  tr:load_checkpoint(out .. "/checkpoint-2")
  local before = tr:evaluate(tr.train_dataset).eval_loss
  local r = tr:train { resume_from_checkpoint = out .. "/checkpoint-2" }
  T.eq(r.global_step, 8, "steps")
  local h = tr.state.log_history
  T.eq(h[1].loss, 3.5, "the HF run's log history is kept")
  T.eq(h[3].step, 3, "the run goes on at step 3")
  -- (the config's optimizer with HF's schedule: the engine steps it, and the rate logged at a step is the
  -- one after it, as transformers logs it there)
  T.near(h[3].learning_rate, 2e-2 * 5 / 8, 1e-12, 0, "the schedule goes on from scheduler.pt's position")
  T.near(h[8].learning_rate, 0, 1e-12, 0, "the schedule at the end")
  local after = tr:evaluate(tr.train_dataset).eval_loss
  assert(after < before - 0.02, ("the loss on the training rows did not fall: %.4f -> %.4f"):format(before, after))
  assert(h[3].grad_norm > 0, "grad_norm")
end)

T.test("a transformers Trainer checkpoint without DeepSpeed (optimizer.pt) resumes in zr.Trainer", function()
  -- checkpoint-3 of a plain HF run: model.safetensors, torch AdamW's optimizer.pt (parameters numbered
  -- through the decay / no-decay groups), scheduler.pt (linear over 8 steps: 3 done), trainer_state.json
  local out = tmp .. "/hf_plain"
  assert(os.execute(("mkdir -p '%s' && cp -r %shf_plain_out/checkpoint-3 '%s'/"):format(out, DIR, out)) == 0)
  local m = zr.models.llama.LlamaForCausalLM(zr.models.llama.config(DIR .. "llama_micro_bin"))
  local tr = zr.Trainer { model = m, train_dataset = token_rows(5), args = { output_dir = out,
    per_device_train_batch_size = 2, max_steps = 8, learning_rate = 2e-2, weight_decay = 0.01, logging_steps = 1,
    save_steps = 100 } }
  tr:load_checkpoint(out .. "/checkpoint-3")
  local e, ref = tr.engine, zr.load_safetensors(DIR .. "hf_plain_out/checkpoint-3/model.safetensors")
  for k, p in m:named_parameters() do T.eq(max_diff(p, ref[k]), 0, k) end
  T.eq(e.global_steps, 3, "global_steps from trainer_state.json")
  T.eq(e.opt_steps, 3, "AdamW's step")
  T.eq(e.lr_scheduler.last_batch_iteration, 3, "scheduler.pt's position")
  for i, p in ipairs(e.params) do -- the moments land on their parameters through HF's numbering
    local off = e.zero:layout(i)
    local w = p:to({ dtype = "f32" }):reshape({ p:numel() })
    T.eq(max_diff(e.zero:state(1):narrow(1, off + 1, p:numel()), w * 0.5), 0, "exp_avg of parameter " .. i)
    T.eq(max_diff(e.zero:state(2):narrow(1, off + 1, p:numel()), w * w), 0, "exp_avg_sq of parameter " .. i)
  end
  local before = tr:evaluate(tr.train_dataset).eval_loss
  local r = tr:train { resume_from_checkpoint = out .. "/checkpoint-3" }
  T.eq(r.global_step, 8, "steps")
  local h = tr.state.log_history
  T.eq(h[3].loss, 3.45, "the HF run's log history is kept")
  T.near(h[4].learning_rate, 2e-2 * 5 / 8, 1e-12, 0, "the schedule goes on (step k logs the lr it used: (9 - k) / 8)")
  local after = tr:evaluate(tr.train_dataset).eval_loss
  assert(after < before - 0.02, ("the loss on the training rows did not fall: %.4f -> %.4f"):format(before, after))
  -- another model's checkpoint: refused, naming the mismatch
  local g = zr.models.gpt2.GPT2LMHeadModel({ n_embd = 16, n_layer = 1, n_head = 2, vocab_size = 32, n_positions = 16 })
  local tr2 = zr.Trainer { model = g, train_dataset = token_rows(5), args = { output_dir = out .. "/g",
    per_device_train_batch_size = 2, max_steps = 8 } }
  T.raises(function() tr2:load_checkpoint(out .. "/checkpoint-3") end, "a checkpoint of another model")
end)

T.test("a DeepSpeed checkpoint with a rank missing, mixed or of another model is refused in one line", function()
  local d = tmp .. "/broken"
  assert(os.execute(("mkdir -p '%s' && cp -r %sds_zero2/global_step2 %sds_zero2/latest '%s'/"):format(d, DIR, DIR, d)) == 0)
  local rank1 = d .. "/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
  assert(os.remove(rank1))
  local z = require "zrun.zero_to_fp32"
  T.raises(function() z.get_fp32_state_dict_from_zero_checkpoint(d) end, "saved by 2 ranks, but 1 *_optim_states.pt")
  -- rank 1's file from the 3-rank save: its partitions do not add up
  assert(os.execute(("cp %sds_zero2_aligned/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt '%s'"):format(DIR, rank1)) == 0)
  T.raises(function() z.get_fp32_state_dict_from_zero_checkpoint(d) end, "ranks' partitions hold")
  -- another model: the engine's parameters are not the checkpoint's
  local m = zr.models.llama.from_pretrained(DIR .. "llama_micro_bin")
  local engine = zr.initialize{ model = m, config = { train_micro_batch_size_per_gpu = 1,
    optimizer = { type = "AdamW", params = { lr = 1e-3 } } } }
  T.raises(function() engine:load_checkpoint(DIR .. "ds_zero2") end, "not in the checkpoint: 'lm_head.weight'")
  -- a stage-0 DeepSpeed checkpoint (no optimizer files) is named as such
  local s0 = tmp .. "/stage0/global_step1"
  assert(os.execute(("mkdir -p '%s' && cp %sds_zero2/global_step2/mp_rank_00_model_states.pt '%s'/"):format(s0, DIR, s0)) == 0)
  T.raises(function() z.get_fp32_state_dict_from_zero_checkpoint(tmp .. "/stage0", "global_step1") end,
    "saved without an optimizer state")
end)

T.test("mutated DeepSpeed checkpoint files give a one-line error naming the checkpoint, never a Lua error", function()
  local z = require "zrun.zero_to_fp32"
  local rand = T.lcg(4242)
  local d = tmp .. "/mutant"
  local errors = 0
  for k = 1, T.mutants(150) do -- (ZRUN_MUTANTS=300 for a longer run)
    local case = ORDER[k % #ORDER + 1]
    assert(os.execute(("rm -rf '%s' && mkdir -p '%s' && cp -r %s%s/global_step2 %s%s/latest '%s'/"):format(d, d, DIR,
      case, DIR, case, d)) == 0)
    local names = zr._C.listdir(d .. "/global_step2")
    local f = d .. "/global_step2/" .. names[1 + rand(#names)]
    T.write_mutant(f, T.read_file(f), rand, 3, 1600, 1600)
    local ok, err = pcall(z.get_fp32_state_dict_from_zero_checkpoint, d)
    if not ok then
      errors = errors + 1
      err = tostring(err)
      assert(err:find(d, 1, true) and not err:find("attempt to", 1, true) and not err:find("\n", 1, true),
        "not a one-line error naming the checkpoint: " .. err)
    end
  end
  assert(errors > 0, "no mutant was refused")
end)

T.done()
