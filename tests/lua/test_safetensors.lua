-- safetensors from Lua (load/save/info/open, a hand-assembled file, error messages) and Hugging
-- Face model directories: hub-cache resolution in a fake cache, sharded save/load, missing models.
local zr = require "zrun"
local hf = require "zrun.hf"
local cjson = require "cjson"
local T = zr.testing

local tmp = os.tmpname()
os.remove(tmp)
zr.makedirs(tmp)
local function P(name) return tmp .. "/" .. name end
local function write(path, s)
  local f = assert(io.open(path, "wb")); f:write(s); f:close()
end
local function read(path)
  local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s
end
-- little-endian helpers for hand-assembled files
local function u64(n)
  local b = {}
  for i = 1, 8 do b[i] = string.char(n % 256); n = math.floor(n / 256) end
  return table.concat(b)
end
local function u16(n) return string.char(n % 256, math.floor(n / 256)) end
local function raw_file(path, header, data)
  write(path, u64(#header) .. header .. (data or ""))
end

T.test("round trip of every dtype, 0-dim and empty", function()
  local sd = {
    f32 = zr.tensor({ { 1.5, -2.25, 3 }, { 4, 5, 6.125 } }),
    bf16 = zr.tensor({ 1.5, -0.0078125, 65536, -3 }, { dtype = "bf16" }),
    f16 = zr.tensor({ 0.5, -1024, 6.103515625e-05 }, { dtype = "f16" }),
    f64 = zr.tensor({ 0.1, 1 / 3 }, { dtype = "f64" }),
    i32 = zr.tensor({ -2147483648, 7, 2147483647 }, { dtype = "i32" }),
    i64 = zr.tensor({ -9007199254740992, 3 }, { dtype = "i64" }),
    u8 = zr.tensor({ 0, 200, 255 }, { dtype = "u8" }),
    scalar = zr.tensor(2.5),
    empty = zr.zeros({ 0, 7 }),
  }
  zr.save_safetensors(P("all.safetensors"), sd, { format = "pt", step = 42 })
  local got, meta = zr.load_safetensors(P("all.safetensors"))
  T.eq(meta.format, "pt"); T.eq(meta.step, "42")
  for name, t in pairs(sd) do
    local g = got[name]
    assert(g, "missing " .. name)
    T.eq(g:dtype(), t:dtype(), name .. " dtype")
    T.eq(#g:shape(), #t:shape(), name .. " ndim")
    for d, s in ipairs(t:shape()) do T.eq(g:shape()[d], s, name .. " shape") end
    T.near(g, t, 0, 0, name)
  end
  T.eq(#got.scalar:shape(), 0)
  T.eq(got.empty:numel(), 0)
  -- any stored dtype converts on load
  local as32 = zr.load_safetensors(P("all.safetensors"), { dtype = "f32", names = { "bf16", "i64" } })
  T.eq(as32.bf16:dtype(), "f32"); T.near(as32.bf16, { 1.5, -0.0078125, 65536, -3 }, 0)
  T.near(as32.i64, { -9007199254740992, 3 }, 0)
  T.eq(as32.f32, nil, "only the names asked for")
end)

T.test("hand-assembled file (format spec, independent of the writer)", function()
  -- bf16 {1, -2} = 0x3F80 0xC000 at [0,4); I16 {-300} at [4,6); F32 {0.75} = 0x3F400000 at [6,10)
  local header = '{"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},'
    .. '"k":{"dtype":"I16","shape":[1,1],"data_offsets":[4,6]},'
    .. '"y":{"dtype":"F32","shape":[],"data_offsets":[6,10]},'
    .. '"__metadata__":{"format":"pt"}}   '
  local data = u16(0x3F80) .. u16(0xC000) .. u16(65536 - 300) .. string.char(0, 0, 0x40, 0x3F)
  raw_file(P("hand.safetensors"), header, data)
  local t, meta = zr.load_safetensors(P("hand.safetensors"))
  T.eq(meta.format, "pt")
  T.eq(t.x:dtype(), "bf16"); T.near(t.x, { 1, -2 }, 0)
  T.eq(t.k:dtype(), "i32"); T.near(t.k, { -300 }, 0); T.eq(#t.k:shape(), 2)
  T.eq(#t.y:shape(), 0); T.near(t.y, { 0.75 }, 0)
  local info = zr.safetensors_info(P("hand.safetensors"))
  T.eq(info.k.stored, "I16"); T.eq(info.x.nbytes, 4); T.eq(info.y.numel, 1)
end)

T.test("writer output layout", function()
  zr.save_safetensors(P("one.safetensors"), { a = zr.tensor({ 1, 2 }) }, { format = "pt" })
  local s = read(P("one.safetensors"))
  local n = s:byte(1) + 256 * s:byte(2)
  T.eq(n % 8, 0, "header padded to 8")
  local header = s:sub(9, 8 + n)
  T.eq(header:gsub(" +$", ""), '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')
  T.eq(#s, 8 + n + 8)
end)

-- Files written by the Python library (the golden fixtures) must come back byte for byte from
-- load + save, apart from the order of __metadata__ keys (a Rust HashMap: arbitrary order).
for _, name in ipairs { "llama_tiny", "gpt2_tiny" } do
  local src = "tests/golden/" .. name .. ".safetensors"
  if zr.path_type(src) ~= "file" then T.skip("python-written " .. name, src .. " not present")
  else
    T.test("python-written " .. name .. " rewrites byte-identically", function()
      local sd, meta = zr.load_safetensors(src)
      zr.save_safetensors(P("re.safetensors"), sd, meta)
      local a, b = read(src), read(P("re.safetensors"))
      T.eq(#b, #a, "file size")
      local ha = a:sub(9, 8 + a:byte(1) + 256 * a:byte(2) + 65536 * a:byte(3))
      T.eq(b:sub(1, 8), a:sub(1, 8), "header length")
      T.eq(b:sub(9 + #ha), a:sub(9 + #ha), "data section")
      local at = ha:find('":{"dtype":"', 1, true)
      T.eq(b:sub(9 + at - 1, 8 + #ha), ha:sub(at), "tensor entries")
    end)
  end
end

T.test("info and the file handle read the header only", function()
  local big = zr.zeros({ 3, 5 }, { dtype = "bf16" })
  zr.save_safetensors(P("h.safetensors"), { ["model.w"] = big, b = zr.ones({ 2 }) })
  local info, meta = zr.safetensors_info(P("h.safetensors"))
  T.eq(info["model.w"].dtype, "bf16"); T.eq(info["model.w"].shape[2], 5); T.eq(info["model.w"].nbytes, 30)
  T.eq(next(meta), nil)
  local f = zr.safetensors_open(P("h.safetensors"))
  T.eq(table.concat(f:keys(), ","), "b,model.w")
  T.near(f:get("b", { dtype = "f64" }), { 1, 1 }, 0)
  T.raises(function() f:get("nope") end, "no tensor named 'nope'")
  f:close()
  T.raises(function() f:keys() end, "closed")
end)

T.test("errors name the file, the tensor and the problem", function()
  raw_file(P("trunc.safetensors"),
    '{"lm_head.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', string.rep("\0", 10))
  local e = T.raises(function() zr.load_safetensors(P("trunc.safetensors")) end,
    P("trunc.safetensors") .. ": tensor 'lm_head.weight': data_offsets end 16")
  assert(e:find("the file looks truncated", 1, true), e)
  raw_file(P("json.safetensors"), '{"a":{"dtype":"F32",,}}', "")
  T.raises(function() zr.safetensors_info(P("json.safetensors")) end, "the header is not valid JSON")
  raw_file(P("ov.safetensors"), '{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
    .. '"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}}', "12345")
  T.raises(function() zr.load_safetensors(P("ov.safetensors")) end, "overlap")
  raw_file(P("cnt.safetensors"), '{"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}}', string.rep("\0", 8))
  T.raises(function() zr.load_safetensors(P("cnt.safetensors")) end, "hold 8 bytes, but F64 (2) needs 16")
  raw_file(P("meta2.safetensors"), '{"__metadata__":{"format":"pt"},"__metadata__":{"note":"x"}}', "")
  T.raises(function() zr.safetensors_info(P("meta2.safetensors")) end, 'the header has the key "__metadata__" twice')
  raw_file(P("dt.safetensors"), '{"a":{"dtype":"U32","shape":[1],"data_offsets":[0,4]}}', "\0\0\0\0")
  T.raises(function() zr.load_safetensors(P("dt.safetensors")) end, "dtype 'U32' is not supported")
  write(P("hl.safetensors"), u64(4096) .. "{}")
  T.raises(function() zr.load_safetensors(P("hl.safetensors")) end, "header length 4096 is past the end of the file (10 bytes)")
  T.raises(function() zr.load_safetensors(P("absent.safetensors")) end, "cannot open")
  T.raises(function() zr.load_safetensors(P("h.safetensors"), { names = { "zzz" } }) end, "no tensor named 'zzz'")
  T.raises(function() zr.save_safetensors(P("x.safetensors"), { a = 3 }) end, "value for 'a' is a number")
  T.raises(function() zr.save_safetensors(P("x.safetensors"), { a = zr.ones({ 1 }) }, { k = {} }) end, "metadata must map strings")
end)

T.test("atomic save leaves no temporary file", function()
  local d = P("atomic")
  zr.makedirs(d)
  zr.save_safetensors(d .. "/m.safetensors", { a = zr.ones({ 3 }) })
  zr.save_safetensors(d .. "/m.safetensors", { a = zr.ones({ 4 }) })
  T.eq(table.concat(zr.listdir(d), ","), "m.safetensors")
  T.eq(zr.safetensors_info(d .. "/m.safetensors").a.shape[1], 4)
  T.raises(function() zr.save_safetensors(P("no/such/dir/m.safetensors"), { a = zr.ones({ 1 }) }) end,
    "cannot create the temporary file")
end)

-- ------------------------------------------------------------------ Hugging Face directories

local function tiny_state_dict()
  zr.manual_seed(3)
  return {
    ["model.embed_tokens.weight"] = zr.randn({ 11, 4 }, { dtype = "bf16" }),
    ["model.layers.0.self_attn.q_proj.weight"] = zr.randn({ 4, 4 }, { dtype = "bf16" }),
    ["model.norm.weight"] = zr.ones({ 4 }, { dtype = "bf16" }),
    ["lm_head.weight"] = zr.randn({ 11, 4 }, { dtype = "bf16" }),
  }
end
local function same_sd(a, b)
  local n = 0
  for k, v in pairs(a) do
    n = n + 1
    assert(b[k], "missing " .. k)
    T.near(b[k], v, 0, 0, k)
  end
  for k in pairs(b) do assert(a[k], "extra " .. k) end
  return n
end

local HASH = "0123456789abcdef0123456789abcdef01234567"
local function fake_cache()
  local home = P("hfhome")
  local repo = home .. "/hub/models--tiny-org--Tiny-Llama"
  local snap = repo .. "/snapshots/" .. HASH
  zr.makedirs(repo .. "/refs")
  zr.makedirs(snap)
  write(repo .. "/refs/main", HASH) -- no trailing newline, as huggingface_hub writes it
  write(snap .. "/config.json", '{"model_type":"llama","hidden_size":4,"rope_scaling":null,"rms_norm_eps":1e-05,'
    .. '"architectures":["LlamaForCausalLM"],"tie_word_embeddings":false}')
  return home, repo, snap
end

T.test("hub id resolves through HF_HOME without network", function()
  local home, _, snap = fake_cache()
  local sd = tiny_state_dict()
  -- like huggingface_hub: the snapshot holds a symlink into blobs/
  zr.makedirs(home .. "/hub/models--tiny-org--Tiny-Llama/blobs")
  zr.save_safetensors(home .. "/hub/models--tiny-org--Tiny-Llama/blobs/5e1f", sd, { format = "pt" })
  assert(os.execute("ln -s ../../blobs/5e1f '" .. snap .. "/model.safetensors'") == 0)
  zr.setenv("HF_HUB_CACHE", nil); zr.setenv("HUGGINGFACE_HUB_CACHE", nil)
  zr.setenv("HF_HOME", home)
  T.eq(hf.cache_dir(), home .. "/hub")
  T.eq(hf.resolve("tiny-org/Tiny-Llama"), snap)
  T.eq(hf.resolve(snap .. "/config.json"), snap)
  T.eq(hf.resolve(snap .. "/"), snap)
  T.eq(hf.resolve("tiny-org/Tiny-Llama", { revision = HASH }), snap)
  local cfg, dir = hf.read_config("tiny-org/Tiny-Llama")
  T.eq(dir, snap); T.eq(cfg.hidden_size, 4); T.eq(cfg.rope_scaling, nil); T.eq(cfg.architectures[1], "LlamaForCausalLM")
  T.near(cfg.rms_norm_eps, 1e-5, 0)
  local loaded = hf.load_state_dict("tiny-org/Tiny-Llama", { dtype = "f32" })
  T.eq(loaded["lm_head.weight"]:dtype(), "f32")
  T.eq(same_sd(sd, loaded), 4)
  -- HF_HUB_CACHE wins over HF_HOME
  zr.setenv("HF_HUB_CACHE", P("elsewhere"))
  T.eq(hf.cache_dir(), P("elsewhere"))
  T.raises(function() hf.resolve("tiny-org/Tiny-Llama") end, "looked in " .. P("elsewhere") .. "/models--tiny-org--Tiny-Llama (missing)")
  zr.setenv("HF_HUB_CACHE", nil)
end)

T.test("missing model: the message says what was looked for where", function()
  zr.setenv("HF_HOME", P("hfhome"))
  local e = T.raises(function() hf.load_state_dict("meta-llama/Llama-3.2-1B") end,
    "no model found for 'meta-llama/Llama-3.2-1B': looked in " .. P("hfhome")
    .. "/hub/models--meta-llama--Llama-3.2-1B (missing); pass a local directory")
  T.raises(function() hf.resolve(P("not-here")) end, "no model found at '" .. P("not-here") .. "'")
  -- refs/main pointing at a snapshot that is not there
  local repo = P("hfhome") .. "/hub/models--org--broken"
  zr.makedirs(repo .. "/refs"); zr.makedirs(repo .. "/snapshots")
  write(repo .. "/refs/main", "ffffffffffffffffffffffffffffffffffffffff\n")
  T.raises(function() hf.resolve("org/broken") end, "incomplete download?")
  -- a directory without weights
  zr.makedirs(P("noweights")); write(P("noweights/config.json"), "{}"); write(P("noweights/model.gguf"), "x")
  T.raises(function() hf.load_state_dict(P("noweights")) end,
    "no weights in " .. P("noweights") .. ": looked for model.safetensors, model.safetensors.index.json, "
    .. "pytorch_model.bin and pytorch_model.bin.index.json (found model.gguf")
  -- a pytorch_model.bin that is not one: named as such
  write(P("noweights/pytorch_model.bin"), "x")
  T.raises(function() hf.load_state_dict(P("noweights")) end,
    P("noweights/pytorch_model.bin") .. ": not a torch.save file")
  write(P("noweights/config.json"), "{bad json")
  T.raises(function() hf.read_config(P("noweights")) end, P("noweights") .. "/config.json: invalid JSON")
  T.raises(function() hf.read_config(P("atomic")) end, "config.json: missing")
  assert(e)
end)

T.test("sharded index written by hand loads", function()
  local d = P("sharded_by_hand")
  zr.makedirs(d)
  local sd = tiny_state_dict()
  zr.save_safetensors(d .. "/part-a.safetensors", { ["lm_head.weight"] = sd["lm_head.weight"], ["model.norm.weight"] = sd["model.norm.weight"] }, { format = "pt" })
  zr.save_safetensors(d .. "/part-b.safetensors", { ["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"],
    ["model.layers.0.self_attn.q_proj.weight"] = sd["model.layers.0.self_attn.q_proj.weight"] }, { format = "pt" })
  write(d .. "/model.safetensors.index.json", [[{
  "metadata": {"total_size": 216},
  "weight_map": {
    "lm_head.weight": "part-a.safetensors",
    "model.norm.weight": "part-a.safetensors",
    "model.embed_tokens.weight": "part-b.safetensors",
    "model.layers.0.self_attn.q_proj.weight": "part-b.safetensors"
  }
}]])
  local files = hf.weight_files(d)
  T.eq(#files, 2); T.eq(files[1], d .. "/part-a.safetensors")
  T.eq(same_sd(sd, hf.load_state_dict(d)), 4)
  local part = hf.load_state_dict(d, { names = { "model.norm.weight" }, dtype = "f64" })
  T.eq(part["model.norm.weight"]:dtype(), "f64"); T.eq(part["lm_head.weight"], nil)
  -- index naming a tensor its shard lacks, and a missing shard
  write(d .. "/model.safetensors.index.json", '{"weight_map":{"ghost":"part-a.safetensors"}}')
  T.raises(function() hf.load_state_dict(d) end, "says 'ghost' is in part-a.safetensors, but that file has no such tensor")
  write(d .. "/model.safetensors.index.json", '{"weight_map":{"x":"part-c.safetensors"}}')
  T.raises(function() hf.load_state_dict(d) end, "lists part-c.safetensors for 1 tensors, but that file is missing")
end)

T.test("save_pretrained shards past max_shard_size and loads back", function()
  local d = P("out/model")
  local sd = tiny_state_dict() -- bytes: embed 88, q 32, norm 8, lm_head 88 = 216
  local cfg = { model_type = "llama", hidden_size = 4, rms_norm_eps = 1e-5, rope_theta = 500000,
                architectures = { "LlamaForCausalLM" }, rope_scaling = { rope_type = "llama3", factor = 32 } }
  local files = hf.save_pretrained(d, sd, cfg, { max_shard_size = 100 })
  -- greedy in name order: lm_head(88) | embed(88) | q(32)+norm(8)
  T.eq(table.concat(files, ","), "model-00001-of-00003.safetensors,model-00002-of-00003.safetensors,"
    .. "model-00003-of-00003.safetensors,model.safetensors.index.json,config.json")
  local index = cjson.decode(read(d .. "/model.safetensors.index.json"))
  T.eq(index.metadata.total_size, 216)
  T.eq(index.metadata.total_parameters, 108) -- transformers 5.17's save_pretrained writes num_parameters() there
  T.eq(index.weight_map["lm_head.weight"], "model-00001-of-00003.safetensors")
  T.eq(index.weight_map["model.norm.weight"], "model-00003-of-00003.safetensors")
  T.eq(zr.safetensors_open(d .. "/model-00002-of-00003.safetensors"):metadata().format, "pt")
  local cfg2, sd2 = hf.load_pretrained(d)
  T.eq(same_sd(sd, sd2), 4)
  T.eq(cfg2.rope_scaling.rope_type, "llama3"); T.eq(cfg2.rope_theta, 500000); T.near(cfg2.rms_norm_eps, 1e-5, 0)
  T.eq(cfg2.architectures[1], "LlamaForCausalLM")
  -- saving again unsharded removes the stale index and shards
  hf.save_pretrained(d, sd, cfg)
  T.eq(table.concat(zr.listdir(d), ","), "config.json,model.safetensors")
  T.eq(same_sd(sd, hf.load_state_dict(d)), 4)
  T.eq(hf.parse_size("5GB"), 5e9); T.eq(hf.parse_size("2GiB"), 2 ^ 31); T.eq(hf.parse_size("500MB"), 5e8)
  T.raises(function() hf.parse_size("lots") end, "max_shard_size")
end)

T.test("encode_json writes JSON that decodes to the same values", function()
  local v = { a = { 1, 2.5, -3e-7 }, b = "q\"uote\\\n\1", c = true, d = { x = 0.1, y = 1e300 } }
  local s = hf.encode_json(v)
  local back = cjson.decode(s)
  T.eq(back.b, v.b); T.eq(back.c, true); T.eq(back.d.x, 0.1); T.eq(back.d.y, 1e300); T.eq(back.a[3], -3e-7)
  assert(s:find('\n  "a": %[\n    1,'), s)
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
