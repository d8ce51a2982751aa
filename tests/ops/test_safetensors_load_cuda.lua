-- from_pretrained to a GPU (safetensors_load.c's CUDA path: pinned staging, stream copies, dtype
-- conversion on the device) against the CPU load, which test_load_weights.lua checks against the
-- file: every parameter equal bit for bit, for each file/model dtype pair, one file or shards, any
-- thread count; the pinned pool reused and grown; errors; and save_pretrained from the GPU writes
-- the same bytes as from the CPU.
local C = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cuda_common.lua")
if C.skip_without_gpu("safetensors load") then return end
local zr, T = C.zr, C.T
local llama = require "zrun.models.llama"

local tmp = os.tmpname()
os.remove(tmp)
zr.makedirs(tmp)
local function P(name) return tmp .. "/" .. name end

-- A small Llama whose embedding spans several 4 MB chunks (40009 x 64), in the file dtype.
local function write_model(dir, dtype, shard)
  zr.manual_seed(11)
  local cfg = llama.config("zrun/tiny-llama")
  cfg.vocab_size, cfg.dtype = 40009, dtype
  return llama.LlamaForCausalLM(cfg):save_pretrained(dir, shard and { max_shard_size = shard } or nil)
end

local function same(gpu, cpu, what)
  local n = 0
  local want = {}
  for name, p in cpu:named_parameters() do want[name] = p end
  for name, p in gpu:named_parameters() do
    T.eq(p:device(), "cuda:0", name .. " device")
    T.eq(p:dtype(), want[name]:dtype(), name .. " dtype")
    local a, b = T.flat(p:to("cpu")), T.flat(want[name])
    T.eq(#a, #b, name .. " numel")
    for i = 1, #b do
      if a[i] ~= b[i] then error(("%s %s element %d: cuda %.10g, cpu %.10g"):format(what, name, i, a[i], b[i]), 2) end
    end
    n = n + 1
  end
  T.eq(n, 21, what .. ": parameters compared")
end

T.test("every file/model dtype pair: the GPU load equals the CPU load bit for bit", function()
  for _, fdt in ipairs { "bf16", "f32", "f16" } do
    local dir = P("m_" .. fdt)
    write_model(dir, fdt)
    for _, mdt in ipairs { "bf16", "f32", "f16" } do
      local cpu = llama.from_pretrained(dir, { dtype = mdt })
      same(llama.from_pretrained(dir, { dtype = mdt, device = "cuda" }), cpu, fdt .. " -> " .. mdt)
    end
  end
end)

T.test("sharded directory, 1 to 12 threads (the pinned pool grows), loaded twice", function()
  write_model(P("sharded"), "bf16", "1MB")
  local cpu = llama.from_pretrained(P("sharded"), { dtype = "f32" })
  for _, threads in ipairs { 1, 3, 12, 2 } do
    same(llama.from_pretrained(P("sharded"), { dtype = "f32", device = "cuda", threads = threads }), cpu,
      "sharded, " .. threads .. " threads")
  end
end)

T.test("a truncated shard fails with one line; destinations on two devices are refused", function()
  local victim = P("trunc") .. "/" .. write_model(P("trunc"), "bf16", "1MB")[2]
  T.truncate_file(victim, 1000)
  local err = T.raises(function() llama.from_pretrained(P("trunc"), { device = "cuda" }) end, "the file looks truncated")
  assert(not err:find("\n"), err)
  write_model(P("mix"), "bf16")
  local st = zr.safetensors_open(P("mix") .. "/model.safetensors")
  T.raises(function()
    zr.safetensors_load_into({ { st, "model.norm.weight", zr.empty({ 64 }, { device = "cuda" }) },
      { st, "model.layers.0.input_layernorm.weight", zr.empty({ 64 }) } })
  end, "goes to cpu but others go to cuda:0")
  st:close()
end)

T.test("save_pretrained from the GPU (pinned staging, device-to-host copies) writes the CPU's bytes", function()
  write_model(P("save_src"), "bf16")
  for _, mdt in ipairs { "bf16", "f32" } do
    llama.from_pretrained(P("save_src"), { dtype = mdt }):save_pretrained(P("save_cpu"))
    llama.from_pretrained(P("save_src"), { dtype = mdt, device = "cuda" }):save_pretrained(P("save_gpu"))
    local a, b = T.read_file(P("save_gpu") .. "/model.safetensors"), T.read_file(P("save_cpu") .. "/model.safetensors")
    T.eq(#a, #b, mdt .. ": file size")
    assert(a == b, mdt .. ": the file saved from the GPU differs from the CPU's")
  end
end)

os.execute("rm -rf " .. tmp)
T.done()
