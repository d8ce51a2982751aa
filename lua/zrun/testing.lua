-- Test helpers for tests/lua: named tests that print PASS/FAIL lines (counted by tests/run.sh),
-- closeness checks, and float64 central-difference gradient checks.
local C = require "zrun._C"
local M = {}
local n_fail = 0

-- Runs fn as a test; an error inside fails it with the message.
function M.test(name, fn)
  local ok, err = xpcall(fn, debug.traceback)
  if ok then print("PASS " .. name)
  else
    n_fail = n_fail + 1
    print("FAIL " .. name .. ": " .. tostring(err):gsub("\n", "\n    "))
  end
  io.stdout:flush()
end

-- Runs a shell command: its stdout and stderr together, and its exit status.
function M.run(cmd)
  local f = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = f:read("*a")
  f:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return (out:gsub("rc=%d+%s*$", "")), rc
end

-- Runs fn() with every earlier garbage collected and the collector stopped, so that a memory count
-- taken inside is not shrunk by an unrelated tensor freed halfway; returns fn's results.
function M.without_gc(fn)
  collectgarbage(); collectgarbage(); collectgarbage("stop")
  local function finish(ok, ...)
    collectgarbage("restart")
    if not ok then error((...), 0) end
    return ...
  end
  return finish(pcall(fn))
end

-- Frees all earlier garbage that holds zrun memory, for a test that measures memory across a call
-- that itself collects (zr.initialize does, so the collector stopped would not keep an earlier
-- engine's tensors from being freed inside the measurement). LuaJIT's compiled traces can keep an
-- object reachable (as trace constants) until they are flushed at some later, unpredictable moment,
-- and finalizers free tensors that other finalized objects held: so the traces are flushed, then
-- the collector runs until zrun's live bytes stop changing.
function M.collect_all()
  if jit and jit.flush then jit.flush() end
  local stats = require("zrun").memory.stats
  local last
  repeat
    last = stats().total_current
    collectgarbage()
  until stats().total_current == last
end

-- Reports a test as skipped (a SKIP line, counted by tests/run.sh).
function M.skip(name, why) print("SKIP " .. name .. ": " .. why) end

-- Exits non-zero when any test failed (call at the end of a test file).
function M.done() if n_fail > 0 then os.exit(1) end end

-- Trains `engine` (zr.initialize's) for optimizer steps from..to, gas micro-batches each;
-- batch(step, micro) gives input ids that are also the labels. Returns each step's mean loss over
-- its micro-batches, averaged over the ranks too when avg_ranks.
function M.train_steps(engine, batch, from, to, gas, avg_ranks)
  local losses = {}
  for s = from, to do
    local tot = 0
    for m = 1, gas do
      local ids = batch(s, m)
      local loss = engine(ids, ids).loss
      tot = tot + loss:item()
      engine:backward(loss)
      engine:step()
    end
    local l = tot / gas
    if avg_ranks then
      local t = require("zrun").tensor({ l }, { dtype = "f64" })
      require("zrun.dist").all_reduce(t, "avg")
      l = t:item()
    end
    losses[#losses + 1] = l
  end
  return losses
end

-- Runs fn(...) with zrun.dist.print0 captured (restored afterwards, also on an error, which is raised
-- again); returns the lines printed, joined by newlines, then fn's first result.
function M.printed(fn, ...)
  local dist = require "zrun.dist"
  local lines, saved = {}, dist.print0
  dist.print0 = function(m) lines[#lines + 1] = m end
  local ok, res = pcall(fn, ...)
  dist.print0 = saved
  if not ok then error(res, 0) end
  return table.concat(lines, "\n"), res
end

-- Input ids for micro-batch `micro` of optimizer step `step`, seeded by both so that every run
-- and world size sees the same global batch of world_size x mb rows of tlen ids below 250: this
-- rank's mb rows (o = {rank=, world_size=, mb=, tlen=, device= (nil: the CPU)}).
function M.rank_batch(step, micro, o)
  C.manual_seed(1000 * step + micro)
  local ids = (C.rand({ o.world_size * o.mb, o.tlen }) * 250):to("i64")
  ids = ids:narrow(1, o.rank * o.mb + 1, o.mb):contiguous()
  return o.device and ids:to(o.device) or ids
end

-- position_ids (B, T) i64 of rows that each hold T / len packed sequences of len tokens (positions restarting
-- every len tokens): a padding-free batch as TRL's collator makes it.
function M.packed_positions(B, T, len)
  local pos = {}
  for r = 1, B do
    pos[r] = {}
    for t = 1, T do pos[r][t] = (t - 1) % len end
  end
  return require("zrun").tensor(pos, { dtype = "i64" })
end

-- A causal-LM batch as a collator builds it: B rows of Tn ids below 251 that vary with s (a tensor
-- made from a Lua table, i64, category "other").
function M.token_batch(B, Tn, s)
  local rows = {}
  for i = 1, B do
    local r = {}
    for j = 1, Tn do r[j] = (i * 37 + j * 11 + s * 5) % 251 end
    rows[i] = r
  end
  return C.tensor(rows, { dtype = "i64" })
end

local function flat(x)
  if C.is_tensor(x) then return x:flat_table() end
  if type(x) == "number" then return { x } end
  local out = {}
  local function rec(t) for _, v in ipairs(t) do if type(v) == "table" then rec(v) else out[#out + 1] = v end end end
  rec(x)
  return out
end
M.flat = flat

-- Max abs and relative difference between two tensors/tables/numbers.
function M.diff(a, b)
  local fa, fb = flat(a), flat(b)
  assert(#fa == #fb, ("size mismatch: %d vs %d elements"):format(#fa, #fb))
  local maxabs, maxrel = 0, 0
  for i = 1, #fa do
    local d = math.abs(fa[i] - fb[i])
    if d ~= d then d = math.huge end
    if d > maxabs then maxabs = d end
    local r = d / math.max(math.abs(fb[i]), 1e-12)
    if r > maxrel then maxrel = r end
  end
  return maxabs, maxrel
end

-- Asserts |a - b| <= atol + rtol * |b| elementwise.
function M.near(a, b, atol, rtol, what)
  atol, rtol = atol or 1e-6, rtol or 0
  local fa, fb = flat(a), flat(b)
  if #fa ~= #fb then error(("%s: %d elements vs %d"):format(what or "near", #fa, #fb), 2) end
  for i = 1, #fa do
    local d = math.abs(fa[i] - fb[i])
    if not (d <= atol + rtol * math.abs(fb[i])) then
      error(("%s: element %d: %.10g vs %.10g (diff %.3g, atol %g, rtol %g)"):format(
        what or "near", i, fa[i], fb[i], d, atol, rtol), 2)
    end
  end
end

-- Asserts a == b (raw equality), naming `what` in the error.
function M.eq(a, b, what)
  if a ~= b then error(("%s: got %s, expected %s"):format(what or "eq", tostring(a), tostring(b)), 2) end
end

-- Asserts two lists are equal element by element (raw equality), naming the first difference.
function M.eq_list(a, b, what)
  local function show(t, i) -- a few elements around i
    local out = {}
    for k = math.max(1, i - 3), math.min(#t, i + 3) do out[#out + 1] = tostring(t[k]) end
    return table.concat(out, ",")
  end
  for i = 1, math.max(#a, #b) do
    if a[i] ~= b[i] then
      error(("%s: element %d of %d/%d: got %s (..%s..), expected %s (..%s..)"):format(what or "eq_list", i, #a, #b,
        tostring(a[i]), show(a, i), tostring(b[i]), show(b, i)), 2)
    end
  end
end

-- Asserts two values are equal, tables key by key at every depth, naming the first path that differs.
function M.same(a, b, what)
  local function walk(x, y, path)
    if type(x) == "table" and type(y) == "table" then
      for k, v in pairs(x) do
        local d = walk(v, y[k], path .. "." .. tostring(k))
        if d then return d end
      end
      for k, v in pairs(y) do
        if x[k] == nil then return ("%s.%s: missing, expected %s"):format(path, tostring(k), tostring(v)) end
      end
      return nil
    end
    if x ~= y then return ("%s: got %s, expected %s"):format(path, tostring(x), tostring(y)) end
  end
  local d = walk(a, b, "")
  if d then error(("%s: %s"):format(what or "same", d), 2) end
end

-- A new empty temporary directory, for a test file's outputs.
function M.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  assert(os.execute("mkdir -p '" .. d .. "'") == 0, "cannot create " .. d)
  return d
end

-- The project's sample text (recipes/data/sample.txt under ZRUN_HOME) as a Dataset, one row per
-- line ({input_ids = tok:encode(line)}): the Trainer tests' data (:group_texts(n) packs it).
function M.sample_rows(tok)
  local text = M.read_file((ZRUN_HOME or ".") .. "/recipes/data/sample.txt")
  local lines = {}
  for line in text:gmatch("[^\n]+") do lines[#lines + 1] = { input_ids = tok:encode(line) } end
  return require("zrun.datasets").Dataset.from_rows(lines)
end

-- The sample text's tokens cut into n rows of len(i) tokens each (rows of different lengths: padding
-- in every micro-batch), as a Dataset: the Trainer's token-count tests.
function M.varied_rows(tok, n, len)
  local all, rows, pos = {}, {}, 1
  for _, l in ipairs(M.sample_rows(tok).rows) do for _, id in ipairs(l.input_ids) do all[#all + 1] = id end end
  for i = 1, n do
    local r = {}
    for k = 1, len(i) do r[k], pos = all[pos], pos + 1 end
    rows[i] = { input_ids = r }
  end
  return require("zrun.datasets").Dataset.from_rows(rows)
end

-- Counts m's forwards over one-row batches (a padded batch run unpadded, or packed sequences): wraps m.forward in
-- place; returns a function that gives the count so far. The unpadding tests' probe.
function M.count_one_row_forwards(m)
  local n, f = 0, m.forward
  rawset(m, "forward", function(self, ids, labels, o)
    if ids:size(1) == 1 then n = n + 1 end
    return f(self, ids, labels, o)
  end)
  return function() return n end
end

-- A Llama built tied from the HF directory dir, its weights loaded but the file's own lm_head.weight left out
-- (from_pretrained refuses a tied config whose files hold a different head: transformers 5 unties them). The
-- DeepSpeed checkpoint tests' micro Llama, whose DeepSpeed runs trained it tied.
function M.tied_llama(dir)
  local llama, hf = require("zrun.models.llama"), require("zrun.hf")
  local cfg = llama.config(dir)
  cfg.tie_word_embeddings = true
  local m = llama.LlamaForCausalLM(cfg)
  local sd = hf.load_state_dict(dir)
  sd["lm_head.weight"] = nil
  m:load_state_dict(sd, true)
  return m
end

-- The bytes of the file at path (raises when it cannot be read).
function M.read_file(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Writes text to the file at path (raises when it cannot).
function M.write_file(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

-- Cuts the last n bytes off the file at path (a truncated download or an interrupted copy).
function M.truncate_file(path, n)
  local s = M.read_file(path)
  local f = assert(io.open(path, "wb"))
  f:write(s:sub(1, #s - n))
  f:close()
end

-- A random-number function of its own, rand(n) in [0, n), from seed (a linear congruential
-- generator: the same sequence on every machine, whatever else draws numbers).
function M.lcg(seed)
  local r = seed
  return function(n) r = (r * 1103515245 + 12345) % 2147483648; return r % n end
end

-- Writes to path the bytes s with 1 to `most` of them replaced at random (rand: M.lcg's), each in
-- s's first `head` bytes (a pickle, a header), its last `tail` (a zip directory) or anywhere.
function M.write_mutant(path, s, rand, most, head, tail)
  local bytes = {}
  for i = 1, #s do bytes[i] = s:sub(i, i) end
  for _ = 1, 1 + rand(most) do
    local where = rand(3)
    local at = where == 0 and 1 + rand(#bytes) or where == 1 and #bytes - rand(tail) or 1 + rand(head)
    bytes[math.max(1, math.min(#bytes, at))] = string.char(rand(256))
  end
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(bytes))
  f:close()
end

-- How many mutants a test tries: its default n, or ZRUN_MUTANTS (a longer run, by hand).
function M.mutants(n) return tonumber(os.getenv("ZRUN_MUTANTS")) or n end

-- Expects fn to raise an error whose message contains `pattern` (plain text).
function M.raises(fn, pattern)
  local ok, err = pcall(fn)
  if ok then error("expected an error" .. (pattern and (" containing '" .. pattern .. "'") or ""), 2) end
  if pattern and not tostring(err):find(pattern, 1, true) then
    error(("error '%s' does not contain '%s'"):format(tostring(err), pattern), 2)
  end
  return err
end

-- Float64 central-difference check of fn's gradients with respect to every input that
-- requires grad. inputs: f64 tensors. fn(inputs...) returns a tensor; the scalar checked is
-- sum(out * w) with fixed random weights w, so every output element matters.
function M.gradcheck(fn, inputs, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-7, opts.rtol or 1e-5
  local out = fn(unpack(inputs))
  local w = C.randn(out:shape(), { dtype = "f64" })
  local function loss()
    local o = C.set_grad_enabled(false)
    local ok, v = pcall(function() return (fn(unpack(inputs)) * w):sum():item() end)
    C.set_grad_enabled(o)
    if not ok then error(v, 0) end
    return v
  end
  for _, x in ipairs(inputs) do if C.is_tensor(x) then x.grad = nil end end
  local l = (out * w):sum()
  l:backward()
  for k, x in ipairs(inputs) do
    if C.is_tensor(x) and x.requires_grad and x.is_leaf then
      assert(x:dtype() == "f64", "gradcheck inputs must be f64")
      local g = x.grad
      if not g then error(("input %d: no gradient was computed"):format(k), 2) end
      local n = x:numel()
      for i = 1, n do
        local v = x:get_flat(i)
        x:set_flat(i, v + eps)
        local lp = loss()
        x:set_flat(i, v - eps)
        local lm = loss()
        x:set_flat(i, v)
        local num, ana = (lp - lm) / (2 * eps), g:get_flat(i)
        if math.abs(num - ana) > atol + rtol * math.abs(num) then
          error(("input %d element %d: analytic %.10g vs numeric %.10g"):format(k, i, ana, num), 2)
        end
      end
    end
  end
  return true
end

return M
