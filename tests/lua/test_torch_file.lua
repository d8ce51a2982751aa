-- torch.save files read without Python (zrun.torch_file, zrun.torch_pickle): the files under
-- tests/golden/torch_files were written by tests/golden/make_torch_files.py (torch.save's format:
-- Python's pickler with torch's persistent ids and rebuild functions; the zip and the legacy
-- layout), with every tensor's values also in reference.safetensors. Checked: Python values as
-- pickled (zip, zip64 with aligned records, legacy; None, bools, ints past 2^31, floats, text, bytes, dict order and non-string keys,
-- torch.Size, IntEnum, class instances, shared and offset tensors), from_pretrained of a
-- pytorch_model.bin and of sharded .bin files (zip bf16 + legacy f32) equal to the reference,
-- transposed and strided views made contiguous, damaged files refused in one line, never a crash on
-- mutated bytes.
local zr = require "zrun"
local tf = require "zrun.torch_file"
local P = require "zrun.torch_pickle"
local hf = require "zrun.hf"
local T = zr.testing

local DIR = (ZRUN_HOME or ".") .. "/tests/golden/torch_files/"
local tmp = T.tmpdir()

local function list_of(v)
  local out = {}
  for i, x in ipairs(v) do out[i] = x end
  return out
end

for _, name in ipairs({ "values.pt", "values_legacy.pt", "values_zip64.pt" }) do
  T.test(name .. ": Python values as pickled", function()
    local obj, file = tf.load(DIR .. name)
    T.eq(obj.none, P.None, "None")
    T.eq_list(list_of(obj.flags), { true, false }, "bools")
    T.eq_list(list_of(obj.ints), { 0, 1, -1, 255, 256, 65535, 65536, -2 ^ 31, 2 ^ 31, 2 ^ 40, -(2 ^ 50) }, "ints")
    T.eq_list(list_of(obj.floats), { 0.5, -2.25, 1e-300, math.huge }, "floats")
    T.eq(obj.text, "h\195\169llo \226\156\147", "text (UTF-8)")
    T.eq(obj.raw, "\0\255\128abc", "bytes (protocol 2's _codecs.encode)")
    T.eq_list(P.keys(obj.order), { "z", "a", "m", "b" }, "OrderedDict keeps the file's order")
    T.eq(obj.order.m, 2, "OrderedDict value")
    T.eq(obj.nested[7], "seven", "an int key")
    T.eq(obj.nested["(1, 2)"], "tuple key", "a tuple key, by its text")
    T.eq_list(list_of(obj.nested.a[2]), { 2, 3 }, "a tuple in a list")
    T.eq_list(list_of(obj.size), { 3, 4 }, "torch.Size")
    T.eq(P.value(obj.stage), 3, "an IntEnum's value")
    T.eq(obj.stage.class, "deepspeed.runtime.zero.config.Color", "its class")
    T.eq(obj.scaler.class, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", "an instance's class")
    T.eq(P.field(obj.scaler, "cur_scale"), 65536, "an instance's field")
    T.eq(P.field(obj.scaler, "dynamic"), true, "an instance's field")
    T.eq(obj.same, obj.whole, "one tensor pickled twice is one value")
    T.eq_list(T.flat(obj.whole:get()), { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 }, "a tensor")
    T.eq_list(obj.whole:get():shape(), { 3, 4 }, "its shape")
    T.eq_list(T.flat(obj.row1:get()), { 4, 5, 6, 7 }, "a view at a storage offset")
    T.eq_list(T.flat(obj.whole:read(5, 3)), { 5, 6, 7 }, "a part of a tensor")
    T.eq_list(T.flat(obj.ids:get()), { 5, -7, 2 ^ 40 }, "int64")
    T.eq(obj.ids:get():dtype(), "i64", "int64 dtype")
    T.eq_list(T.flat(obj.flat:get()), { 0.25, 0.5, 0.75 }, "a tensor with attributes (_rebuild_from_type_v2)")
    T.eq(obj.flat.attrs.ds_id, 4, "its attributes")
    T.eq(obj.param.parameter, true, "an nn.Parameter")
    T.eq_list(T.flat(obj.param:get()), { 1.5, -1.5 }, "its data")
    local b = obj.bf16:get()
    T.eq(b:dtype(), "bf16", "bf16 stays bf16")
    T.eq_list(T.flat(obj.bf16:get({ dtype = "f32" })), { 1, -0.5, 3 }, "bf16 widened")
    T.eq(#obj.scalar:get():shape(), 0, "a 0-d tensor")
    T.eq(obj.scalar:get():item(), 2.5, "its value")
    T.eq(obj.empty:get():numel(), 0, "an empty tensor")
    T.eq_list(T.flat(obj.transposed:get()), { 0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11 }, "a transposed view, made contiguous")
    T.eq_list(obj.transposed:get():shape(), { 4, 3 }, "its shape")
    T.eq_list(T.flat(obj.transposed:read(4, 3)), { 5, 9, 2 }, "a part of it")
    T.eq_list(T.flat(obj.column:get()), { 1, 5, 9 }, "a strided view (a column), gathered")
    T.eq_list(T.flat(obj.column:read(1, 2)), { 5, 9 }, "a part of it")
    local keep = tf.STRIDED_MAX
    tf.STRIDED_MAX = 2
    T.raises(function() obj.column:get() end, "a strided view of 3 elements")
    tf.STRIDED_MAX = keep
    file:close()
  end)
end

T.test("zr.torch_load: a file's values as plain Lua, its tensors read", function()
  local o = zr.torch_load(DIR .. "hf_plain_out/checkpoint-3/optimizer.pt", { dtype = "bf16" })
  T.eq(o.state[0].exp_avg:dtype(), "bf16", "dtype")
  T.eq_list(o.state[0].exp_avg:shape(), { 32, 16 }, "the moment's shape")
  T.eq(o.param_groups[2].weight_decay, 0, "a plain number")
  T.eq_list(o.param_groups[1].betas, { 0.9, 0.999 }, "a tuple")
  T.eq(o.param_groups[1].foreach, nil, "None")
  local v = zr.torch_load(DIR .. "values_legacy.pt")
  T.eq(v.same, v.whole, "one tensor, read once")
  T.eq(v.scaler.class, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", "an object's class")
  T.eq(v.scaler.state.cur_scale, 65536, "its state")
  T.raises(function() zr.torch_load(DIR .. "values.pt", { dtyp = "f32" }) end, "dtype")
end)

T.test("an old-format file whose pickles outrun the first read is read whole", function()
  local keep = tf.LEGACY_PREFIX
  tf.LEGACY_PREFIX = 64
  local ok, err = pcall(function()
    local obj, file = tf.load(DIR .. "values_legacy.pt")
    T.eq_list(T.flat(obj.whole:get()), { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 }, "a tensor")
    file:close()
  end)
  tf.LEGACY_PREFIX = keep
  if not ok then error(err, 0) end
end)

T.test("from_pretrained reads pytorch_model.bin (zip, f32) exactly", function()
  local d = DIR .. "llama_micro_bin"
  local ref = zr.load_safetensors(d .. "/reference.safetensors")
  local sd = hf.load_state_dict(d)
  local n = 0
  for k, v in pairs(ref) do
    n = n + 1
    T.eq(sd[k]:dtype(), "f32", k .. " dtype")
    T.eq((sd[k] - v):abs():max():item(), 0, k)
  end
  T.eq(n, 12, "tensors")
  local m = zr.models.llama.from_pretrained(d, { dtype = "bf16" })
  for name, p in m:named_parameters() do
    T.eq((p:to({ dtype = "f32" }) - ref[name]):abs():max():item(), 0, "bf16 model " .. name)
  end
end)

T.test("from_pretrained reads sharded pytorch_model-*.bin (zip bf16 + legacy f32) with their index", function()
  local d = DIR .. "llama_micro_sharded"
  local ref = zr.load_safetensors(d .. "/reference.safetensors")
  local m = zr.models.llama.from_pretrained(d)
  local n = 0
  for name, p in m:named_parameters() do
    n = n + 1
    T.eq((p - ref[name]):abs():max():item(), 0, name)
  end
  T.eq(n, 12, "parameters")
  local m2 = zr.models.llama.from_pretrained(d, { dtype = "auto" })
  T.eq(m2.lm_head.weight:dtype(), "bf16", "dtype auto: config.json's bfloat16")
  local ids = zr.tensor({ { 1, 5, 7, 9, 3 } }, { dtype = "i64" })
  T.near(m(ids, ids).loss:item(), zr.models.llama.from_pretrained(DIR .. "llama_micro_bin")(ids, ids).loss:item(),
    1e-6, 0, "the same model from either directory")
end)

T.test("model.safetensors wins over pytorch_model.bin (transformers' order)", function()
  local d = tmp .. "/both"
  zr.makedirs(d)
  assert(os.execute(("cp %sllama_micro_bin/pytorch_model.bin %sllama_micro_bin/config.json '%s'/"):format(DIR, DIR, d)) == 0)
  local files = hf.weight_files(d)
  T.eq(files[1]:match("[^/]+$"), "pytorch_model.bin", "only the .bin")
  local sd = hf.load_state_dict(d)
  sd["lm_head.weight"] = sd["lm_head.weight"] * 2
  zr.save_safetensors(d .. "/model.safetensors", sd)
  T.eq(hf.weight_files(d)[1]:match("[^/]+$"), "model.safetensors", "safetensors first")
end)

T.test("files that are not state dicts, or damaged, are refused in one line", function()
  T.raises(function() tf.open_state_dict(DIR .. "no_tensors.pt") end, "not a state dict")
  T.raises(function() tf.open_state_dict(DIR .. "values.pt") end, "not contiguous")
  local bin = T.read_file(DIR .. "llama_micro_bin/pytorch_model.bin")
  local function write(name, bytes)
    local f = assert(io.open(tmp .. "/" .. name, "wb")); f:write(bytes); f:close()
    return tmp .. "/" .. name
  end
  T.raises(function() tf.load(write("cut.bin", bin:sub(1, #bin - 100))) end, "cut.bin")
  T.raises(function() tf.load(write("half.bin", bin:sub(1, 3000))) end, "half.bin")
  T.raises(function() tf.load(write("text.bin", "hello")) end, "not a torch.save file")
  T.raises(function() tf.load(tmp .. "/absent.bin") end, "cannot open")
  local leg = T.read_file(DIR .. "values_legacy.pt")
  T.raises(function() tf.load(write("legcut.pt", leg:sub(1, #leg - 10))) end, "truncated")
end)

T.test("zrun inspect shows a pickle's tree, a safetensors file's tensors and a folder's files", function()
  local Z = ZRUN_BIN or os.getenv("ZRUN_BIN") or "./zrun"
  local out, rc = T.run(Z .. " inspect " .. DIR .. "ds_zero3/global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt")
  T.eq(rc, 0, "exit status (" .. out .. ")")
  for _, want in ipairs({ "torch.save, dict of 3, 6 tensors", "zero_stage: <deepspeed.runtime.zero.config.ZeroStageEnum> (3)",
    "loss_scaler: <deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler> cur_scale=65536, dynamic=true",
    "fp32_flat_groups: list of 2", "0: tensor f32 [" }) do
    assert(out:find(want, 1, true), "missing '" .. want .. "' in:\n" .. out)
  end
  out, rc = T.run(Z .. " inspect --depth 1 " .. DIR .. "llama_micro_bin/reference.safetensors")
  T.eq(rc, 0, "exit status")
  assert(out:find("safetensors, 12 tensors (12 F32; 11.69 KiB)", 1, true), out)
  assert(out:find("model.layers.0.mlp.down_proj.weight: f32 [16, 24]", 1, true), out)
  out, rc = T.run(Z .. " inspect " .. DIR .. "hf_trainer_out/checkpoint-2")
  T.eq(rc, 0, "exit status")
  assert(out:find("checkpoint-2/latest: global_step2", 1, true), out)
  assert(out:find("global_step2/mp_rank_00_model_states.pt: torch.save, dict of 20, 14 tensors", 1, true), out)
  out, rc = T.run(Z .. " inspect " .. tmp .. "/nothing.pt")
  assert(rc ~= 0 and out:find("no such file or folder", 1, true), out)
end)

T.test("mutated files give an error or a value, never a crash", function()
  local seeds = { T.read_file(DIR .. "values.pt"), T.read_file(DIR .. "values_legacy.pt"), T.read_file(DIR .. "values_zip64.pt"),
    T.read_file(DIR .. "llama_micro_sharded/pytorch_model-00002-of-00002.bin") }
  local rand = T.lcg(12345)
  local path = tmp .. "/mutant.pt"
  local errors = 0
  for k = 1, T.mutants(600) do -- (ZRUN_MUTANTS=3000 for a longer run)
    T.write_mutant(path, seeds[k % #seeds + 1], rand, 4, 1500, 600)
    local ok, err = pcall(function()
      local obj, file = tf.load(path)
      for _, t in ipairs(tf.tensors(obj)) do pcall(t.get, t) end -- every tensor the mutant still describes
      file:close()
    end)
    if not ok then
      errors = errors + 1
      if not tostring(err):find("mutant.pt", 1, true) then error("an error without the file's name: " .. tostring(err)) end
    end
  end
  assert(errors > 0, "no mutant was refused")
end)

T.done()
