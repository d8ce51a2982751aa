-- from_pretrained of the same weights as model.safetensors and as pytorch_model.bin (torch.save's
-- zip, read by zrun.torch_file), warm page cache, best of 3, in one table; then checks that the
-- two models are equal tensor for tensor. The directories: tests/bench/make_bin_model.py.
--   zrun tests/bench/bench_load_bin.lua [DIR] [--device cuda|cpu]   (DIR default /tmp/zrun_bench_bin)
local zr = require "zrun"
local C = zr._C
local cli = require("zrun.argparse").new("tests/bench/bench_load_bin.lua", "pytorch_model.bin vs model.safetensors load time.")
cli:option("dir", "/tmp/zrun_bench_bin", "folder with st/ and bin/ (tests/bench/make_bin_model.py)")
cli:positional("dir")
cli:option("device", zr.cuda.is_available() and "cuda" or "cpu", "where from_pretrained puts the model")
local opt = cli:parse(arg)
local function exists(p) local f = io.open(p, "rb"); if f then f:close() end return f ~= nil end
if not exists(opt.dir .. "/st/model.safetensors") or not exists(opt.dir .. "/bin/pytorch_model.bin") then
  print(("SKIP bench_load_bin: no st/model.safetensors and bin/pytorch_model.bin under %s "
    .. "(python3 tests/bench/make_bin_model.py %s writes them)"):format(opt.dir, opt.dir))
  os.exit(0)
end
local function sync() if opt.device ~= "cpu" then zr.cuda.synchronize() end end
local rows, models = {}, {}
for _, sub in ipairs({ "st", "bin", "st", "bin" }) do -- (twice each: the first pass warms the page cache)
  local d = opt.dir .. "/" .. sub
  local best = math.huge
  for _ = 1, 3 do
    local t0 = C.now()
    local m = zr.models.llama.from_pretrained(d, { dtype = "bf16", device = opt.device })
    sync()
    best = math.min(best, C.now() - t0)
    models[sub] = m
    m = nil
    collectgarbage()
  end
  rows[sub] = best
end
local h = assert(io.open(opt.dir .. "/st/model.safetensors", "rb"))
local bytes = h:seek("end")
h:close()
print(("| from_pretrained, %.0f MB bf16, to %s, warm | model.safetensors %.3f s | pytorch_model.bin %.3f s | ratio %.2f |")
  :format(bytes / 1e6, opt.device, rows.st, rows.bin, rows.bin / rows.st))
local a, b = {}, {}
for n, p in models.st:named_parameters() do a[n] = p end
local diff = 0
for n, p in models.bin:named_parameters() do
  diff = math.max(diff, (p:to({ dtype = "f32" }) - a[n]:to({ dtype = "f32" })):abs():max():item())
end
print("largest difference between the two models: " .. diff)
