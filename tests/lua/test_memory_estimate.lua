-- DeepSpeed-compatible estimators (zr.memory.estimate_zero2 / estimate_zero3): parameter counts
-- from configs and the memory figures, checked against values worked out by hand from
-- DeepSpeed's formulas (stage_1_and_2.py estimate_zero2_model_states_mem_needs, stage3.py
-- estimate_zero3_model_states_mem_needs), with the arithmetic in the comments. Published
-- parameter counts of the real models are a second, independent check of the counting.
local zr = require "zrun"
local T = zr.testing
local E = require "zrun.memory_estimate"

-- deep equality of nested lists of numbers/strings, with a readable message
local function same(a, b, what)
  local function ser(x)
    if type(x) ~= "table" then return type(x) == "number" and string.format("%.0f", x) or tostring(x) end
    local p = {}
    for i = 1, #x do p[i] = ser(x[i]) end
    return "{" .. table.concat(p, ", ") .. "}"
  end
  if ser(a) ~= ser(b) then error((what and what .. ": " or "") .. "got " .. ser(a) .. ", expected " .. ser(b), 2) end
end

local function rows_of(res)
  local out = {}
  for i, r in ipairs(res.rows) do out[i] = { r.cpu, r.gpu } end
  return out
end

T.test("parameter counts from configs match the published sizes", function()
  -- Llama-3.2-1B (tied): embed 128256*2048 = 262,668,288
  --   layer: q 2048*2048 = 4,194,304; k, v 2048*512 = 1,048,576 each; o 4,194,304;
  --          gate/up/down 3*2048*8192 = 50,331,648; two norms 4,096 -> 60,821,504
  --   16 layers = 973,144,064; final norm 2,048 -> 1,235,814,400 (HF reports 1.24B: 1,235,814,400)
  local total, largest = E.count("meta-llama/Llama-3.2-1B")
  T.eq(total, 1235814400, "Llama-3.2-1B total")
  T.eq(largest, 262668288, "Llama-3.2-1B largest module (embed_tokens)")
  -- Meta-Llama-3-8B (untied): embed 128256*4096 = 525,336,576, twice (lm_head)
  --   layer: q, o 4096^2 = 16,777,216 each; k, v 4096*1024 = 4,194,304 each;
  --          MLP 3*4096*14336 = 176,160,768; norms 8,192 -> 218,112,000; x32 = 6,979,584,000
  --   + 1,050,673,152 + norm 4,096 = 8,030,261,248
  total, largest = E.count("meta-llama/Meta-Llama-3-8B")
  T.eq(total, 8030261248, "Llama-3-8B total")
  T.eq(largest, 525336576, "Llama-3-8B largest module")
  T.eq((E.count("meta-llama/Meta-Llama-3-70B")), 70553706496, "Llama-3-70B total (published)")
  T.eq((E.count("meta-llama/Llama-3.2-3B")), 3212749824, "Llama-3.2-3B total (published)")
  T.eq((E.count("TinyLlama/TinyLlama-1.1B-Chat-v1.0")), 1100048384, "TinyLlama total (published)")
  -- gpt2: wte 50257*768 = 38,597,376; wpe 1024*768 = 786,432; block: ln 2*2*768 = 3,072,
  --   c_attn 768*2304+2304 = 1,771,776, c_proj 768*768+768 = 590,592, c_fc 768*3072+3072 = 2,362,368,
  --   mlp c_proj 3072*768+768 = 2,360,064 -> 7,087,872; x12 = 85,054,464; ln_f 1,536
  --   -> 124,439,808 (tied head)
  total, largest = E.count("gpt2")
  T.eq(total, 124439808, "gpt2 total")
  T.eq(largest, 38597376, "gpt2 largest module (wte)")
  T.eq((E.count("gpt2-xl")), 1557611200, "gpt2-xl total (published)")
  -- zrun/tiny-llama: embed 259*64 = 16,576; layer: q 4,096, k 2,048, v 2,048, o 4,096,
  --   MLP 3*64*176 = 33,792, norms 128 -> 46,208; x2 = 92,416; norm 64; lm_head 16,576 -> 125,632
  T.eq((E.count("zrun/tiny-llama")), 125632, "tiny-llama total")
end)

T.test("a live model counts like its config (tied weights once)", function()
  local m = zr.models.llama.LlamaForCausalLM("zrun/tiny-llama")
  local t, l = E.count(m)
  T.eq(t, 125632); T.eq(l, 16576)
  local cfg = { model_type = "llama", hidden_size = 24, intermediate_size = 40, num_hidden_layers = 3,
    num_attention_heads = 6, num_key_value_heads = 3, vocab_size = 37, tie_word_embeddings = true }
  local live = zr.models.llama.LlamaForCausalLM(cfg)
  -- embed 37*24 = 888; layer: q 576, k, v 24*12 = 288 each, o 576, MLP 3*24*40 = 2,880,
  -- norms 48 -> 4,656; x3 = 13,968; norm 24 -> 14,880 (head tied: counted once)
  T.eq((E.count(cfg)), 14880, "config")
  T.eq((E.count(live)), 14880, "live")
  T.eq(live:num_parameters(), 14880, "Module:num_parameters agrees")
end)

T.test("ZeRO-2 estimates (DeepSpeed's formula)", function()
  -- P = 1,235,814,400; one node, one GPU (G = 1):
  --   offload:  gpu = 2P = 2,471,628,800; cpu = P*max(4G, 16)*1.5 = 24P = 29,659,545,600
  --   no offload: gpu = 2P + int(18P/G) = 20P = 24,716,288,000; cpu = P*4*1*1.5 = 6P = 7,414,886,400
  local r = E.estimate_zero2("meta-llama/Llama-3.2-1B", { quiet = true })
  same(rows_of(r), { { 29659545600, 2471628800 }, { 7414886400, 24716288000 } })
  -- printed as DeepSpeed prints it: 29659545600/2^30 = 27.6226, 2471628800/2^30 = 2.3019,
  -- 7414886400/2^30 = 6.9057, 24716288000/2^30 = 23.0188
  T.eq(r.text, table.concat({
    "Estimated memory needed for params, optim states and gradients for a:",
    "HW: Setup with 1 node, 1 GPU per node.",
    "SW: Model with 1235M total params.",
    "  per CPU  |  per GPU |   Options",
    "   27.62GB |   2.30GB | offload_optimizer=cpu ",
    "    6.91GB |  23.02GB | offload_optimizer=none" }, "\n"))
  -- two nodes of 8 (G = 16): offload cpu = P*max(64,16)*1.5 = 96P = 118,638,182,400;
  --   no offload: gpu = 2P + int(18P/16) = 2,471,628,800 + 1,390,291,200 = 3,861,920,000,
  --   cpu = P*4*8*1.5 = 48P = 59,319,091,200
  r = E.estimate_zero2("meta-llama/Llama-3.2-1B", { gpus_per_node = 8, num_nodes = 2, quiet = true })
  same(rows_of(r), { { 118638182400, 2471628800 }, { 59319091200, 3861920000 } })
  T.eq(r.text:match("HW: [^\n]*"), "HW: Setup with 2 nodes, 8 GPUs per node.")
  -- Llama-3-8B on 8 GPUs: P = 8,030,261,248; offload gpu 2P = 16,060,522,496,
  --   cpu = P*max(32,16)*1.5 = 48P = 385,452,539,904; no offload gpu = 2P + 18P/8
  --   = 16,060,522,496 + 18,068,087,808 = 34,128,610,304; cpu = P*4*8*1.5 = 48P
  r = E.estimate_zero2("meta-llama/Meta-Llama-3-8B", { gpus_per_node = 8, quiet = true })
  same(rows_of(r), { { 385452539904, 16060522496 }, { 385452539904, 34128610304 } })
  -- truncation: gpt2 on 7 GPUs, 18P/7 = 2,239,916,544/7 = 319,988,077.71 -> 319,988,077;
  --   gpu = 248,879,616 + 319,988,077 = 568,867,693; cpu = P*4*7*1.5 = 42P = 5,226,471,936;
  --   offload cpu = P*max(28,16)*1.5 = 42P
  r = E.estimate_zero2("gpt2", { gpus_per_node = 7, quiet = true })
  same(rows_of(r), { { 5226471936, 248879616 }, { 5226471936, 568867693 } })
  -- tiny: P = 125,632 -> 24P = 3,015,168, 2P = 251,264, 6P = 753,792, 20P = 2,512,640; "0M"
  r = E.estimate_zero2("zrun/tiny-llama", { quiet = true })
  same(rows_of(r), { { 3015168, 251264 }, { 753792, 2512640 } })
  T.eq(r.text:match("SW: [^\n]*"), "SW: Model with 0M total params.")
end)

T.test("ZeRO-3 estimates (DeepSpeed's formula, every offload/zero_init row)", function()
  -- Llama-3.2-1B, one node of 4 GPUs (G = 4, gpus_factor = 1/1): largest layer memory
  -- LLM = 4*262,668,288 = 1,050,673,152
  --   offload param+optimizer: gpu = LLM; cpu = P*18*1*1.5 = 27P = 33,366,988,800 (zero_init 1);
  --     zero_init 0: P*max(4*4, 18)*1.5 = 27P
  --   offload optimizer only: gpu = LLM + int(2P/4) = 1,050,673,152 + 617,907,200 = 1,668,580,352;
  --     cpu = P*16*1.5 = 24P = 29,659,545,600; zero_init 0: P*max(16,16)*1.5 = 24P
  --   no offload: gpu = LLM + int(18P/4) = 1,050,673,152 + 5,561,164,800 = 6,611,837,952;
  --     cpu = largest*4*4*1.5 = 6,304,038,912 (zero_init 1), P*4*4*1.5 = 24P (zero_init 0)
  local r = E.estimate_zero3("meta-llama/Llama-3.2-1B", { gpus_per_node = 4, quiet = true })
  same(rows_of(r), {
    { 33366988800, 1050673152 }, { 33366988800, 1050673152 },
    { 29659545600, 1668580352 }, { 29659545600, 1668580352 },
    { 6304038912, 6611837952 }, { 29659545600, 6611837952 } })
  local lines = {}
  for l in r.text:gmatch("[^\n]+") do lines[#lines + 1] = l end
  T.eq(lines[3], "SW: Model with 1235M total params, 262M largest layer params.")
  T.eq(lines[5]:sub(25), "offload_param=cpu , offload_optimizer=cpu , zero_init=1")
  T.eq(lines[8]:sub(25), "offload_param=none, offload_optimizer=cpu , zero_init=0")
  T.eq(lines[10]:sub(25), "offload_param=none, offload_optimizer=none, zero_init=0")
  -- 33366988800/2^30 = 31.0754 -> "   31.08GB"; 1050673152/2^30 = 0.9785 -> "  0.98GB"
  T.eq(lines[5]:sub(1, 21), "   31.08GB |   0.98GB")
  -- gpt2 on two nodes of one GPU (G = 2, gpus_factor = 0.5): LLM = 4*38,597,376 = 154,389,504
  --   param+opt offload: gpu = LLM; cpu = P*18*0.5*1.5 = 13.5P = 1,679,937,408, zero_init 0:
  --     P*max(4, 9)*1.5 = 13.5P
  --   opt offload: gpu = LLM + int(2P/2) = 278,829,312; cpu = P*16*0.5*1.5 = 12P = 1,493,277,696,
  --     zero_init 0: P*max(4, 8)*1.5 = 12P
  --   none: gpu = LLM + 9P = 1,274,347,776; cpu = 38,597,376*4*1*1.5 = 231,584,256 / P*6 = 746,638,848
  r = E.estimate_zero3("gpt2", { gpus_per_node = 1, num_nodes = 2, quiet = true })
  same(rows_of(r), {
    { 1679937408, 154389504 }, { 1679937408, 154389504 },
    { 1493277696, 278829312 }, { 1493277696, 278829312 },
    { 231584256, 1274347776 }, { 746638848, 1274347776 } })
end)

T.test("zrun estimate: arguments and errors", function()
  T.raises(function() E.estimate_zero2("gpt2", { gpus_per_node = 0, quiet = true }) end, "positive integers")
  T.raises(function() E.count({ model_type = "bert", hidden_size = 8 }) end, "model_type 'bert' is not known")
  local o, pos = E.parse_args({ "gpt2", "--gpus-per-node", "4", "--nodes=2", "--help" }, { help = true })
  same(pos, { "gpt2" }); T.eq(o["gpus-per-node"], "4"); T.eq(o.nodes, "2"); T.eq(o.help, true)
  T.raises(function() E.main_estimate({ "gpt2", "--gpus-per-node", "x" }) end, "positive integer")
  T.raises(function() E.main_estimate({ "gpt2", "--bogus", "1" }) end, "unknown option --bogus")
  -- the command itself (the lead routes `zrun estimate` to main_estimate)
  local bin = os.getenv("ZRUN_BIN") or "./zrun"
  local f = io.popen(bin .. " -e 'os.exit(require(\"zrun.memory_estimate\").main_estimate({\"meta-llama/Llama-3.2-1B\", \"--gpus-per-node\", \"8\", \"--nodes\", \"2\"}))' 2>&1")
  local out = f:read("*a")
  f:close()
  T.eq(out:match("HW: Setup with 2 nodes, 8 GPUs per node%.") ~= nil, true, "printed:\n" .. out)
  T.eq(out:find("  15.54GB |   0.98GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1", 1, true) ~= nil, true,
    "ZeRO-3 row (P*18*0.5*1.5 = 16,683,494,400 B = 15.54 GiB; 4*262,668,288 = 0.98 GiB):\n" .. out)
end)

T.test("zrun estimate prints Python's digits: an exact tie rounds to even", function()
  -- offload row: gpu = 2 * P = 1.125 GiB exactly, which DeepSpeed (Python) prints as 1.12
  local P = 603979776
  local r = E.estimate_zero2("x", { total_params = P, quiet = true })
  T.eq(r.rows[1].gpu / 2 ^ 30, 1.125)
  T.eq(r.text:find("   13.50GB |   1.12GB | offload_optimizer=cpu ", 1, true) ~= nil, true, r.text)
end)

T.test("zrun estimate path/to/file.json reads that file, not its folder's config.json", function()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. dir)
  local function write(name, t)
    local f = io.open(dir .. "/" .. name, "w")
    f:write(require("cjson").encode(t))
    f:close()
  end
  local base = { model_type = "llama", hidden_size = 64, intermediate_size = 128, num_hidden_layers = 2,
    num_attention_heads = 4, vocab_size = 100, tie_word_embeddings = true }
  write("config.json", base)
  local other = {}
  for k, v in pairs(base) do other[k] = v end
  other.num_hidden_layers = 5
  write("other.json", other)
  local n_dir = E.count(dir .. "/config.json")
  local n_other = E.count(dir .. "/other.json")
  os.execute("rm -rf " .. dir)
  T.eq(n_other > n_dir, true, ("other.json has more layers: %d vs %d"):format(n_other, n_dir))
  T.eq(n_other, E.count(other))
end)

T.test("zrun estimate config.json: JSON nulls are unset, as in a model folder (save_pretrained writes n_inner: null)", function()
  -- gpt2_tiny.config.json has "n_inner": null (4 * n_embd), as every GPT-2 config transformers saves
  local f = ZRUN_HOME and (ZRUN_HOME .. "/tests/golden/gpt2_tiny.config.json") or "tests/golden/gpt2_tiny.config.json"
  local t_file, l_file = E.count(f)
  local cfg = require("cjson").decode(io.open(f):read("*a"))
  cfg.n_inner = nil
  local t_tab, l_tab = E.count(cfg)
  T.eq(t_file, t_tab); T.eq(l_file, l_tab)
  local out, rc = T.run((os.getenv("ZRUN_BIN") or "./zrun") .. " estimate " .. f .. " --stage 2")
  T.eq(rc, 0, out)
end)

T.done()
