-- One metrics.jsonl per run: the header record (run id, start time, world size, resolved DeepSpeed
-- config, the user's arguments, resumed_from), the previous run's file renamed to
-- metrics.<its run id>.jsonl (never overwritten), and a resumed run joined to the run it resumed.
local zr = require "zrun"
local T = zr.testing
local metrics = require "zrun.metrics"
local cjson = require "cjson"

local tmp = os.tmpname()
os.remove(tmp)
local function sh(c) assert(os.execute(c) == 0, c) end
sh("mkdir -p " .. tmp)
local function exists(p) local f = io.open(p); if f then f:close() end return f ~= nil end
local function files(dir)
  local out = {}
  local p = io.popen("ls " .. dir)
  for l in p:lines() do if l:match("^metrics") then out[#out + 1] = l end end
  p:close()
  return table.concat(out, " ")
end
local function write(path, s) local f = assert(io.open(path, "w")); f:write(s); f:close() end

T.test("rotate: the previous file gets its run id; a file without header, an empty one, a taken name", function()
  local d = tmp .. "/rot"
  sh("mkdir -p " .. d)
  write(d .. "/metrics.jsonl", '{"step":1,"loss":2}\n')
  local f, h, prev = metrics.open(d, { world_size = 1 })
  f:write('{"step":1,"loss":3}\n'); f:close()
  T.eq(prev, nil, "a file from before headers has no run id")
  T.eq(files(d), "metrics.jsonl metrics.no-header.jsonl")
  assert(h.run_id:match("^%d%d%d%d%d%d%d%d%-%d%d%d%d%d%d%-%d+$"), "run id: UTC date-time and pid, got " .. h.run_id)
  assert(h.start_time:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$"), h.start_time)
  local f2, h2, prev2 = metrics.open(d, { run_id = "second" })
  f2:close()
  T.eq(prev2, h.run_id)
  T.eq(h2.previous_run_id, h.run_id)
  assert(exists(d .. "/metrics." .. h.run_id .. ".jsonl"), "renamed to its run id: " .. files(d))
  local hh, recs = metrics.read(d .. "/metrics." .. h.run_id .. ".jsonl")
  T.eq(hh.run_id, h.run_id)
  T.eq(#recs, 1)
  T.eq(recs[1].loss, 3)
  -- the same run id again (a copied folder): the older file is kept as .2
  local f3 = metrics.open(d, { run_id = "third" })
  f3:close()
  write(d .. "/metrics.jsonl", '{"run_id":"second"}\n')
  metrics.open(d, { run_id = "fourth" }):close()
  assert(exists(d .. "/metrics.second.jsonl") and exists(d .. "/metrics.second.2.jsonl"), files(d))
  write(d .. "/metrics.jsonl", "")
  local _, _, p = metrics.open(d, { run_id = "fifth" })
  T.eq(p, nil, "an empty file is replaced, not kept")
  T.eq(metrics.jsonable({ a = 0 / 0, b = math.huge, c = print, [1] = 2 }).a, "nan")
end)

-- a tiny llama on the sample text: 4 steps logged each, a checkpoint at 2
local tok = zr.tokenizers.ByteTokenizer.new()
local rows = {}
for line in io.lines("recipes/data/sample.txt") do rows[#rows + 1] = { input_ids = tok:encode(line) } end
local blocks = zr.datasets.Dataset.from_rows(rows):group_texts(16)
local function trainer(out, extra)
  zr.manual_seed(3)
  local a = { output_dir = out, per_device_train_batch_size = 2, max_steps = 4, logging_steps = 1, save_steps = 2,
    learning_rate = 2e-3, deepspeed = { train_micro_batch_size_per_gpu = "auto", zero_optimization = { stage = 1 },
      optimizer = { type = "AdamW", params = { lr = "auto" } } } }
  for k, v in pairs(extra or {}) do a[k] = v end
  return zr.Trainer { model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama")),
    train_dataset = blocks, args = a }
end

T.test("a record's line: sorted keys, every digit, non-finite numbers as Python's json writes them, read back", function()
  local line = require("zrun.hf").encode_json_line
  local rec = { step = 3, loss = 0.1 + 0.2, grad_norm = math.huge, lo = -math.huge, nan = 0 / 0, name = 'a"b\n',
    list = { 1, 2.5 }, empty = {}, none = cjson.null, ok = true }
  local s = line(rec)
  T.eq(s, '{"empty":{},"grad_norm":Infinity,"list":[1,2.5],"lo":-Infinity,"loss":0.30000000000000004,' ..
    '"name":"a\\"b\\n","nan":NaN,"none":null,"ok":true,"step":3}')
  local back = cjson.decode(s)
  T.eq(back.grad_norm, math.huge); T.eq(back.lo, -math.huge); T.eq(back.nan ~= back.nan, true)
  T.eq(back.loss, 0.1 + 0.2, "every digit"); T.eq(back.name, 'a"b\n')
end)

T.test("the Trainer: a header first, a new file per run, a resumed run names the checkpoint and joins the curve", function()
  local out = tmp .. "/run"
  trainer(out):train()
  local h1, r1 = metrics.read(out .. "/metrics.jsonl")
  assert(h1, "the first line is a header")
  T.eq(h1.world_size, 1)
  T.eq(h1.zero_stage, 1)
  T.eq(h1.deepspeed_config.zero_optimization.stage, 1, "the resolved DeepSpeed config")
  T.eq(h1.deepspeed_config.train_micro_batch_size_per_gpu, 2, "with \"auto\" resolved")
  T.eq(h1.args.max_steps, 4, "the user's arguments")
  T.eq(h1.args.learning_rate, 2e-3)
  T.eq(h1.args.per_device_eval_batch_size, nil, "only what the user set")
  T.eq(h1.resumed_from, nil)
  local steps = {}
  for _, r in ipairs(r1) do if r.loss then steps[#steps + 1] = r.step end end
  T.eq(table.concat(steps, ","), "1,2,3,4")
  -- a second run into the same folder: the first run's file moves aside
  trainer(out, { max_steps = 6, resume_from_checkpoint = out .. "/checkpoint-2" }):train()
  local h2, r2 = metrics.read(out .. "/metrics.jsonl")
  T.eq(files(out), "metrics." .. h1.run_id .. ".jsonl metrics.jsonl")
  T.eq(h2.resumed_from, 2)
  T.eq(h2.resume_checkpoint, out .. "/checkpoint-2")
  T.eq(h2.continues, h1.run_id, "a checkpoint of this folder: the run continues the previous file")
  steps = {}
  for _, r in ipairs(r2) do if r.loss then steps[#steps + 1] = r.step end end
  T.eq(table.concat(steps, ","), "3,4,5,6", "this run's file holds this run's steps")
  local _, old = metrics.read(out .. "/metrics." .. h1.run_id .. ".jsonl")
  T.eq(#old, #r1, "the first run's file is intact")
  -- joined: steps 1-2 of the first run, then the resumed run (not the first run's 3-4)
  local run = metrics.load(out)
  local joined = {}
  for _, r in ipairs(run.records) do if r.loss then joined[#joined + 1] = r.step end end
  T.eq(table.concat(joined, ","), "1,2,3,4,5,6")
  T.eq(run.resumes[1], 2)
  T.eq(run.records[1].loss, r1[1].loss, "step 1 comes from the first run")
  -- a checkpoint from another folder: resumed_from is said, the folder's previous file is not joined
  local other = tmp .. "/other"
  trainer(other, { max_steps = 2, save_strategy = "no" }):train()
  trainer(other, { resume_from_checkpoint = out .. "/checkpoint-4", max_steps = 5, save_strategy = "no" }):train()
  local h3 = metrics.read(other .. "/metrics.jsonl")
  T.eq(h3.resumed_from, 4)
  T.eq(h3.continues, nil)
  T.eq(#metrics.load(other).resumes, 0)
end)

T.test("tests/mpi/learn_check.lua reads a file with a header (records with step and loss)", function()
  local bin = os.getenv("ZRUN_BIN") or "./zrun"
  local p = io.popen(bin .. " tests/mpi/learn_check.lua " .. tmp .. "/run/metrics.jsonl run 0.0 2>&1")
  local s = p:read("*a")
  p:close()
  assert(s:find("PASS run: loss", 1, true), s)
end)

os.execute("rm -rf '" .. tmp .. "'")
T.done()
