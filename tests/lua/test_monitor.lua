-- DeepSpeed's monitors: CRC-32C against its published test vectors, TensorFlow's CRC mask, the
-- TFRecord framing and the hand-encoded Event/Summary protobufs byte for byte (values derived from
-- the formats' specifications), Python's float repr for the CSV files, and a short fp16 run whose
-- event file and CSV files hold DeepSpeed's tags at DeepSpeed's sample counts.
-- (tests/bench/check_tensorboard.py reads the event files with TensorBoard's own reader.)
local zr = require "zrun"
local T = zr.testing
local tfrecord = require "zrun.monitor.tfrecord"
local tb = require "zrun.monitor.tensorboard"
local csv = require "zrun.monitor.csv"

local function hex(s) return (s:gsub(".", function(c) return ("%02x"):format(c:byte()) end)) end
local function bytes(...) local t = { ... }; local out = {}; for i, b in ipairs(t) do out[i] = string.char(b) end; return table.concat(out) end

T.test("CRC-32C: the iSCSI test vectors (RFC 3720, B.4)", function()
  T.eq(tfrecord.crc32c("123456789"), 0xE3069283)
  T.eq(tfrecord.crc32c(""), 0)
  T.eq(tfrecord.crc32c(string.rep("\0", 32)), 0x8A9136AA)
  T.eq(tfrecord.crc32c(string.rep("\255", 32)), 0x62A8AB43)
  local up, down = {}, {}
  for i = 0, 31 do up[#up + 1] = string.char(i); down[#down + 1] = string.char(31 - i) end
  T.eq(tfrecord.crc32c(table.concat(up)), 0x46DD794E)
  T.eq(tfrecord.crc32c(table.concat(down)), 0x113FDB5C)
end)

T.test("masked CRC: rotate right by 15, add 0xa282ead8 (TensorFlow's crc32c::Mask)", function()
  -- the same formula in plain integer arithmetic, independent of the bit library
  local function mask(c) return ((math.floor(c / 2 ^ 15) + (c % 2 ^ 15) * 2 ^ 17) + 0xa282ead8) % 2 ^ 32 end
  for _, c in ipairs { 0, 1, 0xE3069283, 0xFFFFFFFF, 0x80000000, 0x12345678 } do T.eq(tfrecord.mask(c), mask(c), ("%08x"):format(c)) end
  T.eq(tfrecord.mask(0), 0xa282ead8)
  T.eq(tfrecord.mask(1), (2 ^ 17 + 0xa282ead8) % 2 ^ 32)
end)

T.test("TFRecord framing: length, masked CRCs, data; the reader checks both CRCs", function()
  local r = tfrecord.record("abc")
  T.eq(#r, 8 + 4 + 3 + 4)
  T.eq(hex(r:sub(1, 8)), "0300000000000000")
  local function le32(n) return hex(tfrecord.le(n, 4)) end
  T.eq(hex(r:sub(9, 12)), le32(tfrecord.mask(tfrecord.crc32c(bytes(3, 0, 0, 0, 0, 0, 0, 0)))))
  T.eq(r:sub(13, 15), "abc")
  T.eq(hex(r:sub(16, 19)), le32(tfrecord.mask(tfrecord.crc32c("abc"))))
  T.eq(hex(tfrecord.le(0x01020304, 4)), "04030201")
  local two = r .. tfrecord.record("")
  local back = tfrecord.read(two)
  T.eq(#back, 2); T.eq(back[1], "abc"); T.eq(back[2], "")
  T.raises(function() tfrecord.read(r:sub(1, 14) .. "x" .. r:sub(16)) end, "bad data CRC")
  T.raises(function() tfrecord.read("\4" .. r:sub(2)) end, "bad length CRC")
  T.raises(function() tfrecord.read(r:sub(1, -2)) end, "truncated")
end)

T.test("Event protobufs, byte for byte", function()
  -- Event{wall_time=1.5, step=3, summary{value{tag="a", simple_value=2.0}}}
  --   09 <1.5 as a little-endian double> 10 03 2a 0a | Summary: 0a 08 | Value: 0a 01 'a' 15 <2.0f>
  T.eq(hex(tb.scalar_event(1.5, 3, "a", 2.0)), "09" .. "000000000000f83f" .. "1003" .. "2a0a" .. "0a08" ..
    "0a0161" .. "15" .. "00000040")
  -- steps past 127 are multi-byte varints: 300 = ac 02
  T.eq(hex(tb.varint(300)), "ac02"); T.eq(hex(tb.varint(0)), "00"); T.eq(hex(tb.varint(2 ^ 35)), "8080808080" .. "01")
  T.eq(hex(tb.scalar_event(0, 300, "Train/Samples/lr", 0.5)):sub(19, 24), "10ac02")
  -- the file's first event: wall_time and file_version "brain.Event:2"
  T.eq(hex(tb.version_event(2.0)), "09" .. "0000000000000040" .. "1a0d" .. hex("brain.Event:2"))
  T.raises(function() tb.scalar_event(0, -1, "a", 1) end, "step must be a non-negative integer")
end)

T.test("CSV values as Python's repr(float)", function()
  -- what CPython's repr prints for these doubles
  local cases = { { 0.1, "0.1" }, { 1e-5, "1e-05" }, { 1.5e-5, "1.5e-05" }, { 2.0, "2.0" }, { 65536.0, "65536.0" },
    { 1e16, "1e+16" }, { 1e15, "1000000000000000.0" }, { 0.0001, "0.0001" }, { 3e-4, "0.0003" }, { -2.5, "-2.5" },
    { 1 / 3, "0.3333333333333333" }, { 0, "0.0" }, { 123.456, "123.456" } }
  for _, c in ipairs(cases) do T.eq(csv.py_float(c[1]), c[2]) end
end)

-- Minimal protobuf reader for the test: field number -> list of raw values.
local function fields(s)
  local out, pos = {}, 1
  local function varint()
    local n, mul = 0, 1
    repeat
      local b = s:byte(pos); pos = pos + 1
      n = n + (b % 128) * mul; mul = mul * 128
    until b < 128
    return n
  end
  while pos <= #s do
    local key = varint()
    local num, wt = math.floor(key / 8), key % 8
    local v
    if wt == 0 then v = varint()
    elseif wt == 1 then v = s:sub(pos, pos + 7); pos = pos + 8
    elseif wt == 5 then v = s:sub(pos, pos + 3); pos = pos + 4
    elseif wt == 2 then local n = varint(); v = s:sub(pos, pos + n - 1); pos = pos + n
    else error("wire type " .. wt) end
    out[num] = out[num] or {}
    table.insert(out[num], v)
  end
  return out
end
local function f32(b) local ffi = require "ffi"; local x = ffi.new("float[1]"); ffi.copy(x, b, 4); return x[0] end

local function read_file(p) local f = assert(io.open(p, "rb")); local s = f:read("*a"); f:close(); return s end

T.test("a run writes DeepSpeed's tags at DeepSpeed's sample counts (TensorBoard and CSV)", function()
  local dir = os.tmpname()
  os.remove(dir)
  zr.manual_seed(11)
  local model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
  local cfg = { train_micro_batch_size_per_gpu = 2, gradient_accumulation_steps = 2, steps_per_print = 2,
    wall_clock_breakdown = true, fp16 = { enabled = true, initial_scale_power = 8 },
    optimizer = { type = "AdamW", params = { lr = 1e-3 } },
    scheduler = { type = "WarmupLR", params = { warmup_min_lr = 0, warmup_max_lr = 1e-3, warmup_num_steps = 4, warmup_type = "linear" } },
    tensorboard = { enabled = true, output_path = dir .. "/tb", job_name = "job" },
    csv_monitor = { enabled = true, output_path = dir .. "/csv/", job_name = "job" } }
  local engine = zr.initialize({ model = model, config = cfg })
  zr.manual_seed(5)
  local ids = (zr.rand({ 2, 16 }) * 250):to("i64")
  local micro, lrs = {}, {}
  for i = 1, 6 do
    local out = engine(ids, ids)
    engine:backward(out.loss)
    engine:step()
    micro[i], lrs[i] = out.loss:item(), engine:get_lr()[1]
  end
  assert(lrs[2] < lrs[4] and lrs[4] < lrs[6], "warming up")
  engine.monitor:close()
  -- TensorBoard: one file, the version event, then the events in order
  local ls = io.popen("ls " .. dir .. "/tb/job"):read("*a")
  local name = ls:match("(events%.out%.tfevents%.%d+%.[^\n]+)")
  assert(name and ls:match("^%S+\n$"), "one event file in OUTPUT_PATH/JOB_NAME: " .. ls)
  assert(name:match("^events%.out%.tfevents%.%d%d%d%d%d%d%d%d%d%d%.[^.]+%.%d+%.%d+$"), name)
  local recs = tfrecord.read(read_file(dir .. "/tb/job/" .. name))
  T.eq(fields(recs[1])[3][1], "brain.Event:2")
  local got = {}
  for i = 2, #recs do
    local ev = fields(recs[i])
    local val = fields(fields(ev[5][1])[1][1])
    got[#got + 1] = { tag = val[1][1], step = ev[2] and ev[2][1] or 0, value = f32(val[2][1]) }
  end
  -- per step: train_loss (samples before the step), lr, loss_scale, 3 timers (samples after)
  T.eq(#got, 3 * 6)
  for k = 1, 3 do
    local e = { unpack(got, 6 * k - 5, 6 * k) }
    T.eq(e[1].tag, "Train/Samples/train_loss"); T.eq(e[1].step, (k - 1) * 4)
    T.near(e[1].value, (micro[2 * k - 1] + micro[2 * k]) / 2, 1e-5, 1e-5, "mean of the step's micro-batch losses")
    T.eq(e[2].tag, "Train/Samples/lr"); T.eq(e[2].step, k * 4)
    T.near(e[2].value, lrs[2 * k], 1e-12, 1e-6, "the lr after step k (float32 in the event file)")
    T.eq(e[3].tag, "Train/Samples/loss_scale"); T.eq(e[3].step, k * 4)
    T.eq(e[4].tag, "Train/Samples/elapsed_time_ms_forward"); T.eq(e[5].tag, "Train/Samples/elapsed_time_ms_backward")
    T.eq(e[6].tag, "Train/Samples/elapsed_time_ms_step")
    assert(e[4].value >= 0 and e[6].value > 0, "times are this step's, in ms")
  end
  T.eq(got[3].value, 256, "loss scale 2^8 after the first step")
  -- CSV: a file per tag, "step,<last part>" header, rows with \r\n
  local lr = read_file(dir .. "/csv/job/Train_Samples_lr.csv")
  T.eq(lr, "step,lr\r\n4," .. csv.py_float(lrs[2]) .. "\r\n8," .. csv.py_float(lrs[4]) .. "\r\n12," ..
    csv.py_float(lrs[6]) .. "\r\n")
  local ls2 = read_file(dir .. "/csv/job/Train_Samples_loss_scale.csv")
  T.eq(ls2:sub(1, 26), "step,loss_scale\r\n4,256\r\n8,", "the initial scale is a Python int, as in DeepSpeed")
  local tl = read_file(dir .. "/csv/job/Train_Samples_train_loss.csv")
  T.eq(tl:match("^step,train_loss\r\n0,[%d.e-]+\r\n4,[%d.e-]+\r\n8,[%d.e-]+\r\n$") ~= nil, true, tl)
  for _, f in ipairs { "forward", "backward", "step" } do
    read_file(dir .. "/csv/job/Train_Samples_elapsed_time_ms_" .. f .. ".csv")
  end
  os.execute("rm -rf " .. dir)
end)

T.test("monitors off, or not rank 0: nothing is written", function()
  local config = require "zrun.config"
  local cfg = config.load({ train_batch_size = 2 }, { world_size = 1 })
  T.eq(require("zrun.monitor").from_config(cfg, 0), nil)
  cfg = config.load({ train_batch_size = 2, csv_monitor = { enabled = true } }, { world_size = 1 })
  T.eq(require("zrun.monitor").from_config(cfg, 1), nil)
  T.eq(require("zrun.monitor").log_dir(cfg.csv_monitor), "DeepSpeedJobName", "os.path.join(\"\", job_name)")
  T.eq(require("zrun.monitor").log_dir({ output_path = "/a/b/", job_name = "j" }), "/a/b/j")
end)

T.test("the Trainer's report_to = \"tensorboard\": transformers' tags at the global step, in logging_dir", function()
  local dir = os.tmpname()
  os.remove(dir)
  local tok = zr.tokenizers.ByteTokenizer.new()
  local ds = T.sample_rows(tok):group_texts(32)
  local function trainer(a)
    zr.manual_seed(3)
    local args = { max_steps = 4, logging_steps = 1, eval_strategy = "steps", eval_steps = 2, save_strategy = "no",
      output_dir = dir .. "/out", learning_rate = 3e-3 }
    for k, v in pairs(a) do args[k] = v end
    return zr.Trainer { model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama")),
      train_dataset = ds:select(1, 32), eval_dataset = ds:select(33, 40), args = args }
  end
  local t = trainer { report_to = { "tensorboard" }, logging_dir = dir .. "/tb" }
  t:train()
  local names = zr._C.listdir(dir .. "/tb")
  T.eq(#names, 1, "one event file")
  local seen = {}
  for i, rec in ipairs(tfrecord.read(read_file(dir .. "/tb/" .. names[1]))) do
    local ev = fields(rec)
    if i > 1 then
      local v = fields(fields(ev[5][1])[1][1])
      local tag, step = v[1][1], ev[2] and ev[2][1] or 0
      seen[tag] = seen[tag] or {}
      seen[tag][step] = f32(v[2][1])
    end
  end
  for _, r in ipairs(t.state.log_history) do
    if r.loss then T.near(seen["train/loss"][r.step], r.loss, 1e-6, 1e-6, "train/loss at step " .. r.step) end
    if r.learning_rate then T.near(seen["train/learning_rate"][r.step], r.learning_rate, 1e-9, 1e-6) end
    if r.eval_loss then T.near(seen["eval/loss"][r.step], r.eval_loss, 1e-6, 1e-6, "eval/loss at step " .. r.step) end
  end
  T.eq(seen["eval/loss"][2] ~= nil and seen["eval/loss"][4] ~= nil and seen["train/loss"][4] ~= nil, true)
  T.eq(seen["train/step"] == nil and seen["train/eval_loss"] == nil, true, "the step is the axis; eval_ keys under eval/")
  -- the default directory: output_dir/runs/<Mon DD_HH-MM-SS>_<host>; other integrations refused
  trainer({ report_to = "all", max_steps = 1, eval_strategy = "no" }):train()
  local runs = zr._C.listdir(dir .. "/out/runs")
  T.eq(#runs == 1 and runs[1]:match("^%u%l%l%d%d_%d%d%-%d%d%-%d%d_") ~= nil, true, tostring(runs[1]))
  T.raises(function() trainer { report_to = "wandb" } end, 'report_to = "wandb": zrun\'s Trainer reports to TensorBoard only')
  local said = T.printed(trainer, { logging_dir = dir .. "/x" })
  assert(said:find("logging_dir not used: report_to is \"none\"", 1, true), said)
end)

T.done()
