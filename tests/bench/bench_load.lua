-- Model loading and saving speed, in one table: from_pretrained of a random Llama directory with a
-- warm page cache (loaded twice, the second timed), transformers' from_pretrained of the same files
-- (tests/bench/bench_load_hf.py, when python3 has torch and transformers), save_pretrained and
-- save_checkpoint, each next to the disk's sequential write bandwidth for as many bytes (dd,
-- 64 MB blocks, conv=fsync; best of 2), measured in the same run.
--   zrun tests/bench/bench_load.lua [--size 1b|8b|small] [--device cuda|cpu] [--dir DIR] [--threads N]
-- 1b: Llama-3.2-1B shapes, bf16, one model.safetensors. 8b: Llama-3.1-8B shapes, bf16, sharded at
-- 5GB with model.safetensors.index.json, as transformers writes it. small: 1B widths, 2 layers.
local zr = require "zrun"
local C = zr._C
local llama = require "zrun.models.llama"
local gpu = zr.cuda.is_available()
local cli = require("zrun.argparse").new("tests/bench/bench_load.lua", "Model load/save speed vs transformers and the disk.")
cli:option("size", gpu and "1b" or "small", "1b | 8b | small (default 1b on a GPU machine, small on a CPU one)")
cli:option("device", gpu and "cuda" or "cpu", "where from_pretrained puts the model")
cli:option("dir", nil, "model directory (default /tmp/zrun_bench_load_<size>; written when it has no config.json)")
cli:option("checkpoint", -1, "1: also time engine:save_checkpoint (model + AdamW state at stage 0, 16 B/param on the device); default 1, 0 for 8b (128 GB would not fit one GPU)")
cli:option("threads", 0, "threads reading the files (0: from_pretrained's default, min(8, CPUs))")
local opt = cli:parse(arg)

local CONFIGS = { ["1b"] = "meta-llama/Llama-3.2-1B", ["8b"] = "meta-llama/Llama-3.1-8B", small = "meta-llama/Llama-3.2-1B" }
if not CONFIGS[opt.size] then error("bench_load: --size must be 1b, 8b or small, got " .. tostring(opt.size), 0) end
if opt.checkpoint == -1 then opt.checkpoint = opt.size == "8b" and 0 or 1 end
local dir = opt.dir or ("/tmp/zrun_bench_load_" .. opt.size)
local now = C.now
local function sync() if opt.device ~= "cpu" then zr.cuda.synchronize() end end

local function dir_bytes(d)
  local n = 0
  for _, f in ipairs(C.listdir(d) or {}) do
    local p = d .. "/" .. f
    if C.path_type(p) == "dir" then n = n + dir_bytes(p)
    else
      local h = io.open(p, "rb")
      if h then n = n + h:seek("end"); h:close() end
    end
  end
  return n
end

local rows = {}
local function row(what, secs, bytes, note) rows[#rows + 1] = { what, secs, bytes, note or "" } end

-- 1. the model directory (random weights, bf16), written by zrun's save_pretrained
local save_s
if C.path_type(dir .. "/config.json") ~= "file" then
  local cfg = llama.config(CONFIGS[opt.size])
  if opt.size == "small" then cfg.num_hidden_layers, cfg.vocab_size = 2, 32000 end
  cfg.dtype, cfg.device = "bf16", opt.device
  io.write(("writing a random %s bf16 model to %s ...\n"):format(opt.size, dir))
  local m = llama.LlamaForCausalLM(cfg)
  sync()
  local t0 = now()
  m:save_pretrained(dir) -- max_shard_size 5GB: 1b is one file, 8b four shards and an index
  save_s = now() - t0
  m = nil
  collectgarbage()
end
local bytes = dir_bytes(dir)
io.write(("%s: %.2f GB of weights\n"):format(dir, bytes / 1e9))

-- 2. zrun from_pretrained, warm: twice, the second timed
local model, load_s
for _ = 1, 2 do
  model = nil
  collectgarbage()
  sync()
  local t0 = now()
  model = llama.from_pretrained(dir, { dtype = "bf16", device = opt.device, threads = opt.threads })
  sync()
  load_s = now() - t0
end
row("zrun from_pretrained (warm, 2nd of 2)", load_s, bytes, "to " .. opt.device)

-- 3. transformers on the same files
local hf_s
local has_torch = os.execute("python3 -c 'import torch, transformers' >/dev/null 2>&1")
if has_torch == 0 or has_torch == true then
  local script = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "bench_load_hf.py"
  local p = io.popen(("python3 %s %s --device %s 2>&1"):format(script, dir, opt.device))
  local out = p:read("*a")
  p:close()
  hf_s = tonumber(out:match("hf_load_s%s+([%d%.eE%-]+)"))
  if hf_s then row("transformers from_pretrained (warm, 2nd of 2)", hf_s, bytes, ("zrun is %.2fx faster"):format(hf_s / load_s))
  else io.write("bench_load_hf.py gave no time:\n" .. out .. "\n") end
else
  row("transformers from_pretrained", nil, nil, "python3 with torch + transformers not found")
end

-- 4. saves, each next to dd writing as many bytes to the same disk (write + fsync), dirty pages
-- flushed (sync) before each timing
local function settle() os.execute("sync") end
local disk = {} -- row index -> {seconds, bytes} of dd
local function dd(nbytes)
  local count = math.max(1, math.ceil(nbytes / 2 ^ 26))
  local best
  for _ = 1, 2 do
    settle()
    local t = now()
    os.execute(("dd if=/dev/zero of=%s.dd bs=64M count=%d conv=fsync 2>/dev/null"):format(dir, count))
    local s = now() - t
    os.remove(dir .. ".dd")
    if not best or s < best then best = s end
  end
  return { best, count * 2 ^ 26 }
end
local tmpdir = dir .. "_save"
os.execute("rm -rf " .. tmpdir)
settle()
sync()
local t0 = now()
model:save_pretrained(tmpdir)
local sp = now() - t0
row("zrun save_pretrained", sp, dir_bytes(tmpdir), "from " .. opt.device)
disk[#rows] = dd(dir_bytes(tmpdir))
if save_s then row("zrun save_pretrained (first write of the dir)", save_s, bytes, "from " .. opt.device) end
os.execute("rm -rf " .. tmpdir)

if opt.checkpoint == 1 then
  local e = zr.initialize({ model = model, config = { train_micro_batch_size_per_gpu = 1, bf16 = { enabled = true },
    optimizer = { type = "AdamW", params = { lr = 1e-5 } }, zero_optimization = { stage = 0 } } })
  settle()
  sync()
  t0 = now()
  e:save_checkpoint(tmpdir, "bench")
  local sc = now() - t0
  row("zrun save_checkpoint (bf16 + fp32 master + AdamW)", sc, dir_bytes(tmpdir), "from " .. opt.device)
  disk[#rows] = dd(dir_bytes(tmpdir))
  os.execute("rm -rf " .. tmpdir)
  e = nil
end

print(("\n%-52s %10s %10s  %s"):format("", "seconds", "GB/s", ""))
for i, r in ipairs(rows) do
  local bw = r[2] and r[3] and r[3] / r[2]
  local note = r[4]
  if disk[i] then
    local dbw = disk[i][2] / disk[i][1]
    note = note .. ("; dd of the same size: %.2f GB/s, so %.0f%% of the disk"):format(dbw / 1e9, 100 * bw / dbw)
  end
  print(("%-52s %10s %10s  %s"):format(r[1], r[2] and ("%.3f"):format(r[2]) or "-", bw and ("%.2f"):format(bw / 1e9) or "-", note))
end
