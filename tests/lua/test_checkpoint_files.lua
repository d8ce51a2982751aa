-- Checkpoint files in one process (zrun.checkpoint, zrun.zero_to_fp32): the DeepSpeed file layout
-- and metadata, resume after a crash mid-save, clear errors for bad input, save_16bit_model as a
-- Hugging Face directory, zero-to-fp32, and the slice/stream safetensors bindings they use.
-- Multi-rank resume and resharding: tests/mpi/test_checkpoint.sh.
local zr = require "zrun"
local T = zr.testing
local ckpt = require "zrun.checkpoint"
local z2f = require "zrun.zero_to_fp32"
local cjson = require "cjson"

local root = os.tmpname()
os.remove(root)
zr.makedirs(root)
local function path(p) return root .. "/" .. p end
local cfg = zr.models.llama.config("zrun/tiny-llama")

local function make(stage, extra)
  zr.manual_seed(77)
  local m = zr.models.llama.LlamaForCausalLM(cfg)
  local c = { train_micro_batch_size_per_gpu = 2, steps_per_print = 1000000,
    optimizer = { type = "AdamW", params = { lr = 2e-3, weight_decay = 0.05 } },
    scheduler = { type = "WarmupLR", params = { warmup_min_lr = 0, warmup_max_lr = 2e-3, warmup_num_steps = 4 } },
    zero_optimization = { stage = stage } }
  for k, v in pairs(extra or {}) do c[k] = v end
  local e = zr.initialize({ model = m, config = c })
  return e, m
end
local function train(e, from, to)
  local out = {}
  for s = from, to do
    zr.manual_seed(500 + s)
    local ids = (zr.rand({ 2, 9 }) * 250):to("i64")
    local loss = e(ids, ids).loss
    e:backward(loss)
    e:step()
    out[#out + 1] = loss:item()
  end
  return out
end
local function read(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end
local function write(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end
local function clone_params(m)
  local out = {}
  for n, p in m:named_parameters() do out[n] = p:clone() end
  return out
end

T.test("save writes DeepSpeed's layout with metadata that describes the partition", function()
  local e, m = make(2)
  train(e, 1, 2)
  e:save_checkpoint(path("a"), nil, { epoch = 3, sampler = { pos = 17 } })
  T.eq(read(path("a/latest")), "global_step2", "latest")
  local tdir = path("a/global_step2")
  for _, f in ipairs({ "mp_rank_00_model_states.safetensors", "mp_rank_00_model_states.json",
      "zero_pp_rank_0_mp_rank_00_optim_states.safetensors", "zrun_manifest.json" }) do
    T.eq(zr.path_type(tdir .. "/" .. f), "file", f)
  end
  -- no temporary files or folders left behind
  T.eq(#zr.listdir(tdir), 4, "files in the tag directory")
  T.eq(table.concat(zr.listdir(path("a")), ","), "global_step2,latest", "the checkpoint directory")
  local man = cjson.decode(read(tdir .. "/zrun_manifest.json"))
  T.eq(man.files["zero_pp_rank_0_mp_rank_00_optim_states.safetensors"],
    #read(tdir .. "/zero_pp_rank_0_mp_rank_00_optim_states.safetensors"), "manifest: optimizer file size")
  T.eq(man.tag, "global_step2", "manifest: tag")
  -- model states: HF names, training dtype, equal to the parameters
  local sd = zr.load_safetensors(tdir .. "/mp_rank_00_model_states.safetensors")
  local n = 0
  for name, p in m:named_parameters() do
    T.eq(sd[name]:dtype(), "f32", name .. " dtype")
    T.near(sd[name], p, 0, 0, name)
    n = n + 1
  end
  T.eq(n, 21, "tiny llama parameters")
  -- optimizer states: partitions and metadata
  local info, md = zr.safetensors_info(tdir .. "/zero_pp_rank_0_mp_rank_00_optim_states.safetensors")
  local st = cjson.decode(md.zrun_state)
  T.eq(st.world_size, 1, "world_size")
  T.eq(st.stage, 2, "stage")
  T.eq(st.global_steps, 2, "global_steps")
  T.eq(st.opt_steps, 2, "opt_steps")
  T.eq(st.client_state.sampler.pos, 17, "client_state")
  T.eq(st.lr_scheduler.last_batch_iteration, e.lr_scheduler.last_batch_iteration, "scheduler state")
  T.eq(st.config.zero_optimization.stage, 2, "config")
  T.eq(st.partition_numel, 125632, "partition_numel")
  for _, k in ipairs({ "master", "exp_avg", "exp_avg_sq" }) do T.eq(info[k].numel, 125632, k) end
  -- the per-parameter table locates each parameter in the partition: master there == weights
  local master = zr.load_safetensors(tdir .. "/zero_pp_rank_0_mp_rank_00_optim_states.safetensors").master
  local tot = 0
  for _, p in ipairs(st.params) do
    local w = sd[p.name]
    T.eq(p.numel, w:numel(), p.name .. " numel")
    T.eq(table.concat(p.shape, ","), table.concat(w:shape(), ","), p.name .. " shape")
    T.eq(p.offset, tot, p.name .. " offset")
    T.near(master:narrow(1, p.offset + 1, p.numel), w:reshape({ w:numel() }), 0, 0, p.name .. " in master")
    tot = tot + p.chunk
  end
  local sidecar = cjson.decode(read(tdir .. "/mp_rank_00_model_states.json"))
  T.eq(sidecar.global_steps, 2, "sidecar global_steps")
  T.eq(sidecar.client_state.epoch, 3, "sidecar client_state")
end)

local RESUME = {
  { "stage 1", 1 }, { "stage 2 offload", 2, { zero_optimization = { stage = 2, offload_optimizer = { device = "cpu" } } } },
  { "stage 3 bf16", 3, { bf16 = { enabled = true } } },
}
for _, case in ipairs(RESUME) do
  T.test("resume restores weights, moments, counters, scheduler, RNG: same next losses (" .. case[1] .. ")", function()
    local e = make(case[2], case[3])
    train(e, 1, 3)
    zr.manual_seed(99)
    local dir = path("b_" .. case[2])
    e:save_checkpoint(dir, "mytag", { k = "v" })
    local seed, off = zr.random_state()
    local lr = e:get_lr()[1]
    local want = train(e, 4, 6)
    local e2 = make(case[2], case[3])
    local cs, tdir = e2:load_checkpoint(dir)
    T.eq(cs.k, "v", "client_state")
    T.eq(tdir, dir .. "/mytag", "loaded from")
    local s2, o2 = zr.random_state()
    T.eq(s2, seed, "rng seed")
    T.eq(o2, off, "rng offset")
    T.eq(e2.global_steps, 3, "global_steps")
    T.eq(e2:get_lr()[1], lr, "lr")
    T.eq(e2.lr_scheduler.last_batch_iteration, e.lr_scheduler.last_batch_iteration - 3, "scheduler position")
    T.near(train(e2, 4, 6), want, 0, 0, "losses 4-6")
    for k = 0, 2 do T.near(e2.zero:state(k), e.zero:state(k), 0, 0, "state " .. k .. " after 6 steps") end
  end)
end

T.test("a crash mid-save leaves the previous checkpoint the one that loads", function()
  local e, m = make(2)
  train(e, 1, 2)
  e:save_checkpoint(path("c"))
  local saved = clone_params(m)
  train(e, 3, 3)
  -- simulate a crash while writing global_step3: a partial tag directory, `latest` not updated
  zr.makedirs(path("c/global_step3"))
  local good = read(path("c/global_step2/zero_pp_rank_0_mp_rank_00_optim_states.safetensors"))
  write(path("c/global_step3/zero_pp_rank_0_mp_rank_00_optim_states.safetensors"), good:sub(1, math.floor(#good / 2)))
  T.eq(read(path("c/latest")), "global_step2", "latest")
  local e2, m2 = make(2)
  e2:load_checkpoint(path("c"))
  T.eq(e2.global_steps, 2, "loaded global_steps")
  for n, p in m2:named_parameters() do T.near(p, saved[n], 0, 0, n) end
  -- the partial tag named explicitly: refused, naming the folder and what is missing
  T.raises(function() e2:load_checkpoint(path("c"), "global_step3") end,
    "c/global_step3: not a complete checkpoint: zrun_manifest.json is missing")
end)

T.test("bad input: clear errors naming the file and the problem", function()
  local e = make(2)
  train(e, 1, 1)
  e:save_checkpoint(path("d"), "t1")
  local function show(err) if os.getenv("SHOW_ERRORS") then print("    " .. err) end end
  show(T.raises(function() e:load_checkpoint(path("nope")) end, "checkpoint directory " .. path("nope") .. " does not exist"))
  zr.makedirs(path("d2/only_a_tag"))
  show(T.raises(function() e:load_checkpoint(path("d2")) end, path("d2/latest") .. " is missing"))
  T.raises(function() e:load_checkpoint(path("d2")) end, "only_a_tag")
  show(T.raises(function() e:load_checkpoint(path("d"), "t9") end, "no checkpoint 't9' in " .. path("d")))
  T.raises(function() e:load_checkpoint(path("d"), "t9") end, "tags there: t1")
  -- missing optimizer file (a copy of t1 without it)
  os.execute(string.format("cp -r '%s' '%s'", path("d/t1"), path("d/t2")))
  os.remove(path("d/t2/zero_pp_rank_0_mp_rank_00_optim_states.safetensors"))
  show(T.raises(function() e:load_checkpoint(path("d"), "t2") end,
    path("d/t2/zero_pp_rank_0_mp_rank_00_optim_states.safetensors") .. ": missing, but zrun_manifest.json lists it"))
  -- truncated optimizer file
  local f = path("d/t1/zero_pp_rank_0_mp_rank_00_optim_states.safetensors")
  local good = read(f)
  os.execute(string.format("cp -r '%s' '%s'", path("d/t1"), path("d/t3")))
  local f3 = path("d/t3/zero_pp_rank_0_mp_rank_00_optim_states.safetensors")
  write(f3, good:sub(1, #good - 1000))
  local before = e.zero:state(0):clone()
  show(T.raises(function() e:load_checkpoint(path("d"), "t3") end, f3 .. ": " .. (#good - 1000) .. " bytes, but"))
  T.near(e.zero:state(0), before, 0, 0, "a failed load leaves the master weights alone")
  -- a file that is not a checkpoint (the manifest updated to its size)
  zr.save_safetensors(f3, { master = zr.zeros({ 3 }) })
  local man = read(path("d/t3/zrun_manifest.json"))
  write(path("d/t3/zrun_manifest.json"), (man:gsub('("zero_pp_rank_0_mp_rank_00_optim_states.safetensors": )%d+',
    "%1" .. #read(f3))))
  show(T.raises(function() e:load_checkpoint(path("d"), "t3") end, "not a zrun ZeRO optimizer-state file"))
  -- a checkpoint of another model: other shapes and names
  local c2 = {}
  for k, v in pairs(cfg) do c2[k] = v end
  c2.intermediate_size, c2.num_hidden_layers = 160, 3
  zr.manual_seed(1)
  local other = zr.initialize({ model = zr.models.llama.LlamaForCausalLM(c2),
    config = { train_micro_batch_size_per_gpu = 2, zero_optimization = { stage = 2 } } })
  local err = T.raises(function() other:load_checkpoint(path("d"), "t1") end,
    path("d/t1/zero_pp_rank_0_mp_rank_00_optim_states.safetensors") .. ": checkpoint of a different model")
  show(err)
  T.raises(function() error(err, 0) end, "'model.layers.0.mlp.gate_proj.weight' has shape (176,64) in the checkpoint but (160,64) in the model")
  T.raises(function() error(err, 0) end, "model.layers.2.")
  T.raises(function() z2f.load_state_dict_from_zero_checkpoint(other.module, path("d"), "t1") end, "does not match the model")
  -- bad tag on save
  T.raises(function() e:save_checkpoint(path("d"), "a/b") end, "tag 'a/b'")
end)

T.test("save_16bit_model writes a Hugging Face directory that loads back exactly", function()
  for _, prec in ipairs({ "f32", "bf16" }) do
    local e, m = make(2, prec == "bf16" and { bf16 = { enabled = true } } or nil)
    train(e, 1, 2)
    local dir = path("hf_" .. prec)
    T.eq(e:save_16bit_model(dir), true, "saved")
    local c = cjson.decode(read(dir .. "/config.json"))
    T.eq(c.hidden_size, 64, "config.json hidden_size")
    T.eq(c.torch_dtype, prec == "bf16" and "bfloat16" or "float32", "torch_dtype")
    T.eq(c.dtype, c.torch_dtype, "dtype (transformers 5's name for torch_dtype), not zrun's internal one")
    local sd = zr.hf.load_state_dict(dir)
    local fresh = zr.models.llama.LlamaForCausalLM(zr.models.llama.normalize_config(c))
    if prec == "bf16" then fresh:to("bf16") end
    fresh:load_state_dict(sd, true)
    local want = {}
    for n, p in m:named_parameters() do want[n] = p end
    for n, p in fresh:named_parameters() do
      T.eq(sd[n]:dtype(), prec, n .. " stored dtype")
      T.near(p:float(), want[n]:float(), 0, 0, n)
    end
  end
  -- stage 3 needs stage3_gather_16bit_weights_on_model_save, as in DeepSpeed
  local e3 = make(3)
  T.eq(e3:save_16bit_model(path("hf_s3_off")), false, "refused without the flag")
  T.eq(zr.path_type(path("hf_s3_off/model.safetensors")), nil, "nothing written")
  local e4, m4 = make(3, { zero_optimization = { stage = 3, stage3_gather_16bit_weights_on_model_save = true } })
  train(e4, 1, 1)
  T.eq(e4:save_16bit_model(path("hf_s3")), true, "saved at stage 3")
  local sd = zr.hf.load_state_dict(path("hf_s3"))
  e4:gather_parameters()
  for n, p in m4:named_parameters() do T.near(sd[n], p, 0, 0, n) end
  e4.zero:release_all()
end)

-- The seed's direct API in bf16 (an f32 model, model_parameters taken before the cast): the
-- consolidated file holds each parameter once, under its Hugging Face name, and its fp32 master
-- rounds to the bf16 weights the model trains with.
T.test("zero-to-fp32 after bf16 training with model_parameters: each parameter once, HF names", function()
  zr.manual_seed(77)
  local m = zr.models.llama.LlamaForCausalLM(cfg)
  local e = zr.initialize({ model = m, model_parameters = m:parameters(), config = { train_micro_batch_size_per_gpu = 2,
    steps_per_print = 1000000, bf16 = { enabled = true }, optimizer = { type = "AdamW", params = { lr = 2e-3 } },
    zero_optimization = { stage = 2 } } })
  train(e, 1, 2)
  e:save_checkpoint(path("zb"))
  T.eq(z2f.main({ path("zb"), path("zb.safetensors") }), 0, "exit status")
  local got = zr.load_safetensors(path("zb.safetensors"))
  local n, want = 0, 0
  for name, p in m:named_parameters() do
    want = want + 1
    assert(got[name], "missing " .. name)
    T.eq(p:dtype(), "bf16", name)
    T.near(got[name]:to("bf16"), p, 0, 0, name)
  end
  for name in pairs(got) do
    n = n + 1
    assert(not name:match("^param_"), "a parameter without its model name: " .. name)
  end
  T.eq(n, want, "tensors in the consolidated file")
end)

T.test("zero-to-fp32 streams consolidated fp32 weights; --tag; usage errors", function()
  local e, m = make(3)
  train(e, 1, 2)
  e:save_checkpoint(path("z"), "first")
  e:gather_parameters()
  local want = clone_params(m)
  e.zero:release_all()
  train(e, 3, 3)
  e:save_checkpoint(path("z"), "second")
  T.eq(z2f.main({ path("z"), "--tag", "first", path("z_first.safetensors") }), 0, "exit status")
  local got = zr.load_safetensors(path("z_first.safetensors"))
  local n = 0
  for name, t in pairs(want) do
    T.eq(got[name]:dtype(), "f32", name)
    T.near(got[name], t, 0, 0, name)
    n = n + 1
  end
  for name in pairs(got) do T.eq(want[name] ~= nil, true, "unexpected " .. name) end
  T.eq(n, 21, "tensors")
  -- default: latest ("second") differs from "first"
  z2f.main({ path("z"), path("z_latest.safetensors") })
  local latest = zr.load_safetensors(path("z_latest.safetensors"))
  T.eq(T.diff(latest["lm_head.weight"], want["lm_head.weight"]) > 0, true, "latest is the later tag")
  local sd = z2f.get_fp32_state_dict_from_zero_checkpoint(path("z"), "first")
  T.near(sd["model.norm.weight"], want["model.norm.weight"], 0, 0, "get_fp32_state_dict")
  T.raises(function() z2f.main({ path("z") }) end, "usage: zrun zero-to-fp32")
  T.raises(function() z2f.main({ path("z"), "--bogus", "x" }) end, "unknown option '--bogus'")
  T.raises(function() z2f.main({ path("z"), "--tag", "third", path("o.safetensors") }) end, "no checkpoint 'third'")
end)

T.test("zero-to-fp32 as DeepSpeed's zero_to_fp32.py: an output directory, max_shard_size shards, frozen ones left out", function()
  zr.manual_seed(77)
  local m = zr.models.llama.LlamaForCausalLM(cfg)
  local trained = {}
  for name, p in m:named_parameters() do if name ~= "model.norm.weight" then trained[#trained + 1] = p end end
  local e = zr.initialize({ model = m, model_parameters = trained, config = { train_micro_batch_size_per_gpu = 2,
    steps_per_print = 1000000, optimizer = { type = "AdamW", params = { lr = 2e-3 } }, zero_optimization = { stage = 2 } } })
  train(e, 1, 2)
  e:save_checkpoint(path("zd"))
  T.eq(z2f.main({ path("zd"), path("one.safetensors") }), 0)
  local one = zr.load_safetensors(path("one.safetensors"))
  -- a directory (created), one file under 5GB
  T.eq(z2f.main({ path("zd"), path("out1"), "--safe_serialization" }), 0)
  T.eq(zr._C.path_type(path("out1/model.safetensors")), "file")
  -- shards of at most 40 kB, in checkpoint order, with the index transformers reads
  T.eq(z2f.main({ path("zd"), "--max_shard_size", "40KB", path("out2") }), 0)
  local idx = require("cjson").decode(T.read_file(path("out2/model.safetensors.index.json")))
  local files = {}
  for _, f in pairs(idx.weight_map) do files[f] = true end
  local nfiles = 0
  for f in pairs(files) do
    nfiles = nfiles + 1
    assert(f:match("^model%-%d%d%d%d%d%-of%-%d%d%d%d%d%.safetensors$"), f)
  end
  T.eq(nfiles > 1, true, "sharded")
  T.eq(zr._C.path_type(path("out2/model.safetensors")), nil, "no single file beside the shards")
  local sd = zr.hf.load_state_dict(path("out2"))
  local n = 0
  for name, t in pairs(one) do T.near(sd[name], t, 0, 0, name); n = n + 1 end
  local total = 0
  for _, t in pairs(one) do total = total + 4 * t:numel() end
  T.eq(idx.metadata.total_size, total)
  T.eq(idx.metadata.total_parameters, nil) -- DeepSpeed 0.19.8's zero_to_fp32.py writes total_size alone
  -- writing the directory again as one file removes the shards and the index
  T.eq(z2f.main({ path("zd"), path("out2") }), 0)
  T.eq(zr._C.path_type(path("out2/model.safetensors.index.json")), nil)
  T.eq(zr.hf.load_state_dict(path("out2"))["lm_head.weight"] ~= nil, true)
  -- save_16bit_model{exclude_frozen_parameters = true}, as DeepSpeed's: the norm left out of the HF directory
  T.eq(e:save_16bit_model(path("hf_ex"), { exclude_frozen_parameters = true }), true)
  local hf_ex = zr.hf.load_state_dict(path("hf_ex"))
  T.eq(hf_ex["model.norm.weight"] == nil and hf_ex["lm_head.weight"] ~= nil, true, "save_16bit_model without the frozen norm")
  T.eq(e:save_16bit_model(path("hf_all")), true)
  T.eq(zr.hf.load_state_dict(path("hf_all"))["model.norm.weight"] ~= nil, true)
  -- --exclude_frozen_parameters: the norm (not in model_parameters) left out
  T.eq(z2f.main({ path("zd"), "--exclude_frozen_parameters", path("ex.safetensors") }), 0)
  local ex = zr.load_safetensors(path("ex.safetensors"))
  T.eq(one["model.norm.weight"] ~= nil and ex["model.norm.weight"] == nil and ex["lm_head.weight"] ~= nil, true)
  T.raises(function() z2f.main({ path("zd"), "--max_shard_size" }) end, "--max_shard_size needs a value")
end)

T.test("load_checkpoint's DeepSpeed options: optimizer states, scheduler, module only, strict", function()
  local e, m = make(2)
  train(e, 1, 3)
  e:save_checkpoint(path("lo"), "t")
  local want = clone_params(m)
  local function moments(x) return x.zero:state(1):abs():sum():item() end
  local function fresh(extra) local x, xm = make(2, extra); return x, xm end
  -- everything (the default): weights, moments, counters, schedule
  local a, am = fresh()
  a:load_checkpoint(path("lo"), "t")
  T.eq(a.global_steps, 3); T.eq(a.opt_steps, 3); T.eq(moments(a) > 0, true); T.eq(a:get_lr()[1], e:get_lr()[1])
  for n, p in am:named_parameters() do T.near(p, want[n], 0, 0, n) end
  -- load_optimizer_states = false: the weights and the run's counters and schedule; the moments and their step stay fresh
  local b, bm = fresh()
  local lr_fresh = b:get_lr()[1]
  b:load_checkpoint(path("lo"), "t", { load_optimizer_states = false })
  for n, p in bm:named_parameters() do T.near(p, want[n], 0, 0, n) end
  T.eq(b.global_steps, 3); T.eq(b.opt_steps or 0, 0); T.eq(moments(b), 0)
  -- (the schedule's counter restored; the param groups' lr, the optimizer's state, as the engine had it until the
  -- schedule's next step, as in DeepSpeed)
  T.eq(b.lr_scheduler.last_batch_iteration, e.lr_scheduler.last_batch_iteration); T.eq(b:get_lr()[1], lr_fresh)
  -- load_lr_scheduler_states = false: the schedule restarts (its counter as the engine has it); the param groups'
  -- lr is the optimizer's state, loaded with it (as DeepSpeed's optimizer.load_state_dict does)
  local c = fresh()
  local lr0, it0 = c:get_lr()[1], c.lr_scheduler.last_batch_iteration
  c:load_checkpoint(path("lo"), "t", { load_lr_scheduler_states = false })
  T.eq(c.lr_scheduler.last_batch_iteration, it0); T.eq(e.lr_scheduler.last_batch_iteration ~= it0, true)
  T.eq(c:get_lr()[1], e:get_lr()[1]); T.eq(c.global_steps, 3); T.eq(moments(c) > 0, true)
  -- load_module_only: the weights alone
  local d, dm = fresh()
  d:load_checkpoint(path("lo"), "t", { load_module_only = true })
  for n, p in dm:named_parameters() do T.near(p, want[n], 0, 0, n) end
  T.eq(d.global_steps, 0); T.eq(moments(d), 0); T.eq(d:get_lr()[1], lr0)
  -- another optimizer loads the weights only
  local sgd = { optimizer = { type = "SGD", params = { lr = 1e-3 } }, zero_allow_untested_optimizer = true }
  T.raises(function() fresh(sgd):load_checkpoint(path("lo"), "t") end, "load it with the optimizer.type it was saved with")
  local g, gm = fresh(sgd)
  g:load_checkpoint(path("lo"), "t", { load_optimizer_states = false })
  for n, p in gm:named_parameters() do T.near(p, want[n], 0, 0, n) end
  T.raises(function() fresh():load_checkpoint(path("lo"), "t", { load_module_strict = false }) end,
    "load_module_strict = false: zrun loads every parameter")
  T.raises(function() fresh():load_checkpoint(path("lo"), "t", { load_optimizer = false }) end,
    "load_checkpoint: unknown option 'load_optimizer'")
  T.raises(function() e:save_checkpoint(path("lo"), "u", {}, false) end, "DeepSpeed's further arguments (save_latest")
end)

T.test("safetensors slices and streaming writes (bindings the checkpoints use)", function()
  local t = zr.arange(0, 24):float():reshape({ 4, 6 })
  zr.save_safetensors(path("s.safetensors"), { a = t, b = zr.tensor({ 1, 2, 3 }, { dtype = "f64" }) })
  local f = zr.safetensors_open(path("s.safetensors"))
  T.near(f:get_slice("a", 5, 4), { 4, 5, 6, 7 }, 0, 0, "a[5..8]")
  T.near(f:get_slice("a", 24, 1), { 23 }, 0, 0, "last")
  T.eq(f:get_slice("a", 3, 0):numel(), 0, "empty")
  T.eq(f:get_slice("b", 2, 2, { dtype = "f32" }):dtype(), "f32", "converted")
  T.near(f:get_slice("b", 2, 2), { 2, 3 }, 0, 0, "b[2..3]")
  T.raises(function() f:get_slice("a", 20, 6) end, "out of range: the tensor has 24 elements")
  T.raises(function() f:get_slice("zz", 1, 1) end, "no tensor named 'zz'")
  f:close()
  local calls = {}
  zr.save_safetensors_stream(path("st.safetensors"),
    { { name = "x", dtype = "f32", shape = { 2, 3 } }, { name = "w", dtype = "f64", shape = { 2 } } },
    function(i)
      calls[#calls + 1] = i
      if i == 1 then return zr.arange(0, 6):float():reshape({ 2, 3 }) end
      return zr.tensor({ 7, 8 }, { dtype = "f64" })
    end, { format = "pt" })
  T.eq(table.concat(calls, ","), "2,1", "data order: widest dtype first")
  local back, md = zr.load_safetensors(path("st.safetensors"))
  T.near(back.x, { 0, 1, 2, 3, 4, 5 }, 0, 0, "x")
  T.near(back.w, { 7, 8 }, 0, 0, "w")
  T.eq(md.format, "pt", "metadata")
  T.raises(function()
    zr.save_safetensors_stream(path("bad.safetensors"), { { name = "x", dtype = "f32", shape = { 2 } } },
      function() error("boom from get") end)
  end, "boom from get")
  T.raises(function()
    zr.save_safetensors_stream(path("bad.safetensors"), { { name = "x", dtype = "f32", shape = { 2 } } },
      function() return zr.zeros({ 3 }) end)
  end, "announced as f32 (2)")
  T.eq(zr.path_type(path("bad.safetensors")), nil, "no file left by a failed write")
end)

os.execute("rm -rf '" .. root .. "'")
T.done()
