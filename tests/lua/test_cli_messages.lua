-- What a user sees when a subcommand or an API call is misused: `zrun estimate`, `plan` and
-- `zero-to-fp32` print one line (the Lua traceback only with ZRUN_DEBUG=1) and exit 1; unknown
-- options are called unknown; tokenizer methods and save_checkpoint name themselves and the fix.
local zr = require "zrun"
local T = zr.testing
local fmt = string.format

local ZRUN = os.getenv("ZRUN_BIN") or arg[-1]
local root = os.tmpname()
os.remove(root)
zr.makedirs(root)

-- Runs `zrun ARGS`; returns its stderr+stdout and exit status.
local function run(args, env)
  local out = root .. "/out.txt"
  local rc = os.execute(fmt("%s '%s' %s >'%s' 2>&1", env or "", ZRUN, args, out))
  local f = assert(io.open(out, "rb"))
  local s = f:read("*a")
  f:close()
  return s, rc
end
local function one_line(args, want)
  local s, rc = run(args)
  T.eq(rc ~= 0, true, args .. ": exit status")
  local first = s:match("^[^\n]*")
  T.eq(first:find(want, 1, true) ~= nil, true, fmt("zrun %s: '%s' does not contain '%s'", args, first, want))
  T.eq(s:find("traceback", 1, true), nil, "zrun " .. args .. ": no traceback in: " .. s)
  T.eq(first:find("%.lua:%d"), nil, "zrun " .. args .. ": no internal position in: " .. first)
  return s
end

T.test("estimate, plan, zero-to-fp32: one line, no traceback (ZRUN_DEBUG=1 shows it)", function()
  local s = one_line("estimate nosuchmodel/xyz", "zrun: no model found for 'nosuchmodel/xyz'")
  T.eq(select(2, s:gsub("\n", "")), 1, "one line: " .. s)
  s = one_line("plan nosuchmodel/xyz", "zrun: no model found for 'nosuchmodel/xyz'")
  T.eq(select(2, s:gsub("\n", "")), 1, "one line: " .. s)
  s = one_line(fmt("zero-to-fp32 '%s/none' '%s/o.safetensors'", root, root), "checkpoint directory " .. root .. "/none does not exist")
  T.eq(select(2, s:gsub("\n", "")), 1, "one line: " .. s)
  zr.makedirs(root .. "/ck/t")
  one_line(fmt("zero-to-fp32 --tag t '%s/ck' '%s/o.safetensors'", root, root), root .. "/ck/t: not a complete checkpoint")
  local dbg = run("plan nosuchmodel/xyz", "ZRUN_DEBUG=1")
  T.eq(dbg:find("stack traceback", 1, true) ~= nil, true, "ZRUN_DEBUG=1 shows the traceback: " .. dbg)
end)

T.test("unknown options are called unknown, before any value is looked for", function()
  one_line("estimate gpt2 --bogus-flag", "zrun: estimate: unknown option --bogus-flag")
  one_line("estimate --bogus-flag gpt2", "zrun: estimate: unknown option --bogus-flag")
  one_line("plan gpt2 --bogus-flag", "zrun: plan: unknown option --bogus-flag")
  one_line("plan gpt2 -x", "zrun: plan: unknown option -x")
  one_line("plan gpt2 --micro-batch", "zrun: plan: --micro-batch needs a value")
  one_line("zero-to-fp32 --bogus-flag", "zrun: zero-to-fp32: unknown option '--bogus-flag'")
  one_line("report --bogus", "zrun: zrun report takes no arguments, got '--bogus'")
  local s = run("estimate zrun/tiny-llama --stage=3")
  T.eq(s:find("ZeRO-3", 1, true) ~= nil, true, "--key=value still works: " .. s)
end)

T.test("tokenizer methods name themselves and what they take", function()
  local f = assert(io.open(root .. "/tokenizer.json", "wb"))
  f:write('{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"ByteLevel",'
    .. '"add_prefix_space":false,"trim_offsets":true,"use_regex":true},"post_processor":null,'
    .. '"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]}}')
  f:close()
  local tok = zr.tokenizers.load(root)
  T.eq(table.concat(tok:encode("ab"), ","), "0,1", "encode")
  T.raises(function() tok:encode(nil) end, "tok:encode(text [, add_special_tokens [, max_length]]): text must be a string, got nil")
  T.raises(function() tok.encode("ab") end, "tokenizer method called on a string instead of a tokenizer (call methods with a colon")
  T.raises(function() tok:token_to_id() end, "tok:token_to_id(token): token must be a string, got no value")
  T.raises(function() tok:id_to_token("a") end, "tok:id_to_token(id): id must be an integer, got string")
  -- (was: tokenizers.lua:10: bad argument #1 to 'open' (string expected, got nil))
  T.raises(function() zr.tokenizers.load(nil) end,
    "tokenizers.load: expected a tokenizer.json path, a model folder or a hub id in the local cache, got nil")
end)

T.test("save_checkpoint errors: one line naming the checkpoint, from a script too", function()
  local f = assert(io.open(root .. "/afile", "wb"))
  f:write("x")
  f:close()
  local script = root .. "/save.lua"
  f = assert(io.open(script, "wb"))
  f:write(fmt([[
local zr = require "zrun"
local e = zr.initialize({ model = zr.nn.Linear(3, 2), config = { train_micro_batch_size_per_gpu = 1,
  optimizer = { type = "AdamW", params = { lr = 1e-3 } } } })
e:save_checkpoint(arg[1], arg[2])
]]))
  f:close()
  one_line(fmt("'%s' '%s/afile' t", script, root), "zrun: save_checkpoint " .. root .. "/afile/t: cannot create directory "
    .. root .. "/afile: a file of that name is in the way")
  one_line(fmt("'%s' '%s/ok' latest", script, root), "zrun: save_checkpoint: tag 'latest' cannot name a directory")
  one_line(fmt("'%s' ''", script), "zrun: save_checkpoint: expected a directory path, got ''")
end)

-- A tiny model folder as the Trainer saves one (config.json, model.safetensors, tokenizer.json).
local function tiny_model(dir)
  zr.manual_seed(1)
  zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama")):save_pretrained(dir)
  zr.tokenizers.ByteTokenizer.new():save_pretrained(dir)
  return dir
end
local RECIPE = (ZRUN_HOME or ".") .. "/recipes/finetune_llama.lua"
-- zrun recipes/finetune_llama.lua ARGS (a few steps on the tiny model): one line, no position inside zrun
-- (the recipe's own progress lines come first: the error is the last line)
local function recipe_error(args, want)
  local cmd = fmt("'%s' max_steps=1 eval_strategy=no save_strategy=no %s", RECIPE, args)
  local s, rc = run(cmd)
  T.eq(rc ~= 0, true, cmd .. ": exit status")
  local last = s:match("([^\n]*)\n?$")
  T.eq(last:find(want, 1, true) ~= nil, true, fmt("zrun %s: '%s' does not contain '%s'", cmd, last, want))
  T.eq(s:find("traceback", 1, true), nil, "no traceback in: " .. s)
  T.eq(last:find("/lua/zrun/", 1, true), nil, "no position inside zrun's library: " .. last)
  T.eq(s:find("ZRUN_DEBUG=1 shows", 1, true), nil, "not reported as an internal error: " .. s)
  return s
end

T.test("a user's files: a truncated model, a broken tokenizer.json, a folder as --config, output_dir in the way", function()
  local m = tiny_model(root .. "/m")
  recipe_error(fmt("--config '%s'", root), "zrun: " .. root .. ": cannot read it (Is a directory): name a DeepSpeed JSON config file")
  one_line(fmt("check '%s'", root), "cannot read it (Is a directory)")
  one_line(fmt("plan zrun/tiny-llama --config '%s/none.json'", root), "zrun: config: cannot open " .. root ..
    "/none.json: No such file or directory: name a DeepSpeed JSON config file")
  os.execute(fmt("cp -r '%s' '%s/trunc'", m, root))
  T.truncate_file(root .. "/trunc/model.safetensors", 100)
  recipe_error(fmt("model='%s/trunc'", root), "the file looks truncated (an interrupted download or copy: fetch it again)")
  os.execute(fmt("cp -r '%s' '%s/badtok'", m, root))
  T.write_file(root .. "/badtok/tokenizer.json", '{"version": "1.0", "model": ')
  recipe_error(fmt("model='%s/badtok'", root), "zrun: " .. root .. "/badtok/tokenizer.json:1:")
  os.execute(fmt("cp -r '%s' '%s/badconf'", m, root))
  T.write_file(root .. "/badconf/config.json", '{"model_type": "llama",\n  "hidden_size": 64,,\n}')
  recipe_error(fmt("model='%s/badconf'", root), "zrun: " .. root .. "/badconf/config.json: invalid JSON (line 2, column 21): ")
  os.execute(fmt("cp -r '%s' '%s/nonorm'", m, root)) -- (the weights of a model without its final norm)
  local sd = zr.hf.load_state_dict(root .. "/nonorm")
  sd["model.norm.weight"] = nil
  zr._C.save_safetensors(root .. "/nonorm/model.safetensors", sd, { format = "pt" })
  recipe_error(fmt("model='%s/nonorm'", root), "zrun: llama: " .. root .. "/nonorm: the weights do not fit config.json's model: " ..
    "Error(s) in loading state_dict for LlamaForCausalLM: Missing key(s) in state_dict: \"model.norm.weight\". (a checkpoint")
  T.write_file(root .. "/afile", "x")
  recipe_error(fmt("model='%s' output_dir='%s/afile/out'", m, root), "zrun: output_dir: cannot create directory " .. root ..
    "/afile: a file of that name is in the way; pass output_dir= a folder you can write to")
end)

T.test("output_dir= empty (a variable left unset) is refused, not turned into the file system's root", function()
  -- (checked in this process: a zrun without the check would write checkpoint-1 and metrics.jsonl into /)
  T.raises(function() require("zrun.trainer_args").resolve({ output_dir = "" }, true) end, "TrainingArguments: output_dir " ..
    "must name a folder, got an empty string (output_dir=$VAR with VAR unset?)")
  T.raises(function() require("zrun.trainer_args").resolve({ output_dir = 3 }, true) end, "output_dir must name a folder, got 3")
end)

T.test("a user's data: an empty file, a file too small for the evaluation slice, a folder without splits", function()
  local m = root .. "/m" -- (the previous test's model)
  T.write_file(root .. "/empty.txt", "")
  recipe_error(fmt("model='%s' data='%s/empty.txt'", m, root), root .. "/empty.txt has no rows (an empty file?)")
  T.write_file(root .. "/two.csv", "text,label\nhello world,1\nfoo bar,0\n")
  recipe_error(fmt("model='%s' data='%s/two.csv'", m, root), "selects none of the file's 2 rows; widen the slice or pass " ..
    "more rows (validation_split_percentage=5 makes that slice)")
  -- (ZRUN_WIKITEXT names the data as data= does: a path that is not there is an error, not the sample)
  local s, rc = run(fmt("'%s' model='%s' max_steps=1 output_dir='%s/o'", RECIPE, m, root), "ZRUN_WIKITEXT='" .. root .. "/none'")
  T.eq(rc ~= 0 and s:find("zrun: dataset not found: " .. root .. "/none (pass a wikitext folder, a .txt/.raw file or a .jsonl " ..
    "file) (data comes from ZRUN_WIKITEXT=" .. root .. "/none)", 1, true) ~= nil, true, s)
  zr.makedirs(root .. "/nosplits")
  recipe_error(fmt("model='%s' data='%s/nosplits'", m, root), "; add one of them, or pass the file itself")
end)

T.test("finetune_llama: a bad device, text too short for one block, options the data leaves unread are said", function()
  local m = root .. "/m"
  recipe_error(fmt("model='%s' device=gpu", m), "zrun: device must be cpu, cuda, cuda:N or auto, got 'gpu'")
  recipe_error(fmt("model='%s' block_size=2.5", m), "zrun: finetune_llama: block_size must be a whole number of tokens >= 2, got 2.5")
  recipe_error(fmt("model='%s' validation_split_percentage=0", m),
    "zrun: finetune_llama: validation_split_percentage must be a whole percentage from 1 to 99, got 0")
  zr.makedirs(root .. "/wt")
  T.write_file(root .. "/wt/wiki.train.raw", "a b c\nd e f\n")
  T.write_file(root .. "/wt/wiki.valid.raw", "g h\ni j\n")
  recipe_error(fmt("model='%s' data='%s/wt'", m, root), "zrun: the training text of " .. root .. "/wt makes no full block " ..
    "of block_size=512 tokens (group_texts drops the rest, as run_clm does): pass more text or a smaller block_size")
  local s = run(fmt("'%s' model='%s' data='%s/wt' block_size=4 validation_split_percentage=50 max_steps=1 eval_strategy=no " ..
    "save_strategy=no output_dir='%s/o'", RECIPE, m, root, root))
  T.eq(s:find("validation_split_percentage=50 has no effect: " .. root .. "/wt has a validation split of its own", 1, true) ~= nil,
    true, "said: " .. s)
  s = run(fmt("'%s' model='%s' data='%s/wt/wiki.valid.raw' block_size=2 train_split=train[:1] max_steps=1 eval_strategy=no " ..
    "save_strategy=no output_dir='%s/o' validation_split_percentage=50", RECIPE, m, root, root))
  T.eq(s:find("train_split=train[:1] has no effect: " .. root .. "/wt/wiki.valid.raw has no train split", 1, true) ~= nil,
    true, "said: " .. s)
end)

T.test("model=DIR without data=: the sample text is used and the model named is the user's, not the tiny fallback", function()
  local s = run(fmt("'%s' model='%s/m' max_steps=1 eval_strategy=no save_strategy=no output_dir='%s/o'", RECIPE, root, root))
  T.eq(s:find("model " .. root .. "/m (", 1, true) ~= nil, true, "the model's name: " .. s)
end)

T.test("a script that is not there: a close name, zrun's own recipe, a subcommand; ZRUN_HOME without the library", function()
  local home = ZRUN_HOME or "."
  one_line(fmt("'%s/recipes/finetune_lama.lua'", home),
    fmt("zrun: cannot open %s/recipes/finetune_lama.lua: no such file (did you mean %s/recipes/finetune_llama.lua?)", home, home))
  one_line("reprot", "zrun: 'reprot' is neither a script nor a subcommand (did you mean 'zrun report'?)")
  -- (a script's option put before the script: was the line and the whole usage, 12 lines)
  local u = one_line("--config x.json", "zrun: unknown option '--config' (zrun --help lists what zrun takes; a script's " ..
    "options go after it: zrun SCRIPT.lua --config)")
  T.eq(select(2, u:gsub("\n", "")), 1, "one line: " .. u)
  one_line(fmt("'%s/zzzqqqxx.lua'", root), "zrun: cannot open " .. root .. "/zzzqqqxx.lua: no such file (zrun SCRIPT.lua runs")
  local abs = ZRUN:sub(1, 1) == "/" and ZRUN or os.getenv("PWD") .. "/" .. ZRUN
  local rc = os.execute(fmt("cd '%s' && '%s' recipes/finetune_llama.lua >'%s/out.txt' 2>&1", root, abs, root))
  local s = T.read_file(root .. "/out.txt")
  T.eq(rc ~= 0 and s:find("zrun: cannot open recipes/finetune_llama.lua: no such file in this folder; zrun's own is " ..
    home .. "/recipes/finetune_llama.lua", 1, true) ~= nil, true, "from another folder: " .. s)
  s = run("report", "ZRUN_HOME='" .. root .. "/nohome'")
  T.eq(s, "zrun: ZRUN_HOME=" .. root .. "/nohome holds no lua/zrun/init.lua: point it at zrun's folder (the one with lua/ " ..
    "and recipes/), or unset it to use the library next to the zrun executable\n")
end)

T.test("Ctrl-C during training: one line naming the last checkpoint, status 130, the log kept up to it", function()
  local out, dir = root .. "/int.txt", root .. "/int"
  -- (waits for the first checkpoint, then sends SIGINT as a terminal's Ctrl-C does)
  T.write_file(root .. "/int.sh", fmt("'%s' '%s' max_steps=100000 eval_strategy=no save_steps=5 logging_steps=1 " ..
    "output_dir='%s' >'%s' 2>&1 & p=$!\ni=0\nwhile ! grep -q 'saved checkpoint' '%s' && [ $i -lt 300 ]; do sleep 0.1; " ..
    "i=$((i+1)); done\nkill -INT $p\nwait $p\necho \"rc=$?\" >>'%s'\n", ZRUN, RECIPE, dir, out, out, out))
  os.execute("sh '" .. root .. "/int.sh'")
  local s = T.read_file(out)
  T.eq(s:find("\nrc=130\n$") ~= nil, true, "killed by SIGINT: " .. s:sub(-300))
  local line = s:match("\n(zrun: [^\n]*)\nrc=130\n$") or ""
  T.eq(line:gsub("checkpoint%-%d+", "checkpoint-N"), "zrun: interrupted (Ctrl-C); the last checkpoint is " .. dir ..
    "/checkpoint-N: resume_from_checkpoint=true continues from it", "the line: " .. s:sub(-300))
  T.eq(s:find("%[zrun%] saved checkpoint") ~= nil, true, "the log up to the interrupt is kept")
end)

T.test("zero-to-fp32 on a Trainer's output_dir names its checkpoint folders; plan checks a memory size before planning", function()
  local out = root .. "/tr"
  run(fmt("'%s' max_steps=2 save_steps=1 eval_strategy=no output_dir='%s'", RECIPE, out))
  local s = one_line(fmt("zero-to-fp32 '%s' '%s/o.safetensors'", out, root), fmt("zrun: zero_to_fp32: %s holds checkpoint folders " ..
    "(checkpoint-1, checkpoint-2), each a checkpoint directory of its own: pass one of them, e.g. %s/checkpoint-2", out, out))
  T.eq(select(2, s:gsub("\n", "")), 1, "one line: " .. s)
  one_line(fmt("zero-to-fp32 --tag checkpoint-2 '%s' '%s/o.safetensors'", out, root), fmt("zrun: zero_to_fp32: %s/checkpoint-2 " ..
    "is a checkpoint directory of its own (it has a latest file), not a tag: pass it as the directory, without the tag", out))
  s = one_line("plan zrun/tiny-llama --gpu-memory 24XB --fit", "zrun: unknown memory unit 'xb' in '24XB' (use GB, GiB, MB, ...)")
  T.eq(select(2, s:gsub("\n", "")), 1, "no plan printed before the error: " .. s)
end)

T.test("API calls with a missing or wrong argument name it, not a line inside zrun", function()
  local D = zr.datasets.Dataset
  local ds = D.from_rows({ { text = "a" } })
  -- (were: datasets.lua:394 attempt to call upvalue 'fn', datasets.lua:363 bad argument to 'ipairs', datasets.lua:26 ...)
  T.raises(function() ds:map(nil) end, "Dataset:map(fn [, opts]): fn must be a function(row), got nil")
  T.raises(function() ds:filter(5) end, "Dataset:filter(fn [, opts]): fn must be a function(row) returning true")
  T.raises(function() ds:group_texts(nil) end, "group_texts(block_size [, column [, batch_size]]): block_size must be a positive integer")
  T.raises(function() D.from_rows(nil) end, "Dataset.from_rows(rows): rows must be a list of rows (tables), got nil")
  local m = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama"))
  T.raises(function() m:save_pretrained(nil) end, "save_pretrained(dir): dir must be a folder path, got nil")
  -- (was: llama.lua:220 attempt to call method 'size'; transformers' model(**batch) habit)
  T.raises(function() m({ input_ids = zr.tensor({ { 1, 2 } }, { dtype = "i64" }) }) end, "input_ids must be a tensor of token " ..
    "ids (B, T), got table (zrun takes the tensors as arguments: model(batch.input_ids, batch.labels)")
  local e = zr.initialize({ model = zr.nn.Linear(2, 2), config = { train_batch_size = 1,
    optimizer = { type = "AdamW", params = { lr = 1e-3 } } } })
  T.raises(function() e:backward(nil) end, "engine:backward(loss): loss must be the forward's scalar loss tensor, got nil")
end)

T.test("sft_llama: a plain text file is sent to finetune_llama (was: 'plain.txt:1: invalid JSON')", function()
  T.write_file(root .. "/plain.txt", "hello world\nfoo bar\n")
  local s, rc = run(fmt("'%s/recipes/sft_llama.lua' model='%s/m' data='%s/plain.txt'", ZRUN_HOME or ".", root, root))
  T.eq(rc ~= 0, true, s)
  T.eq(s:match("([^\n]*)\n?$"), fmt("zrun: sft_llama: data: %s/plain.txt is plain text; this recipe reads rows from .jsonl, " ..
    ".json or .csv (messages, prompt + completion, or text fields); to train on plain text: zrun recipes/finetune_llama.lua " ..
    "data=%s/plain.txt", root, root))
end)

os.execute("rm -rf '" .. root .. "'")
T.done()
