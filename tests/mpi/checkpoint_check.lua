-- Checkpoint resume checks for tests/mpi/test_checkpoint.sh. A tiny Llama is trained on a fixed
-- global batch of G = 8 rows per step (rank k of W takes rows k*G/W+1 .. (k+1)*G/W, so every world
-- size sees the same data) with AdamW, weight decay, clipping and a warmup LR schedule (so the
-- scheduler, Adam step and moments all matter on resume). Modes, each a fresh process:
--   full   STAGE GAS WORK           6 steps; rank 0 writes WORK/full_s<stage>_np<W>.txt (losses,
--                                   %.17g) and ..._state.safetensors (gathered state after step 6)
--   first  STAGE GAS WORK           3 steps, save_checkpoint(WORK/ckpt_s<stage>_np<W>), and the
--                                   gathered state after step 3 in WORK/ref_s<stage>_np<W>.safetensors
--   resume STAGE GAS WORK SRC EXACT  load WORK/ckpt_<SRC> (any stage / world size), check the state
--                                   gathered here equals WORK/ref_<SRC> bitwise, train steps 4-6 and
--                                   compare losses with WORK/full_<SRC>.txt: bitwise and the final
--                                   state too when EXACT=1 (same world size and stage), else within
--                                   2e-5 (fp32, other reduction order; see zero_check.lua)
--   twice  STAGE GAS WORK           saves into the same tag after steps 3 and 6: the tag then holds
--                                   step 6 whole (every rank's file, the manifest, no leftovers),
--                                   and loading it after a 7th step restores step 6's state bitwise,
--                                   also when the save was killed before its folder was renamed in
--                                   (rank 0's cleanup finishes the switch before any rank reads)
--   badload STAGE GAS WORK SRC PAT  loading a damaged checkpoint fails on every rank (no hang)
--   fp32   OUT SRC WORK             (one process) zero-to-fp32 output OUT equals WORK/ref_<SRC>'s
--                                   master weights bitwise; so do load_state_dict_from_zero_checkpoint
--                                   and the model-states file
-- "Gathered state" is assembled by this file from engine.zero:state() and :layout() with an
-- all_gather, independently of zrun.checkpoint.
local zr = require "zrun"
local T = zr.testing
local dist = zr.dist
local mode = arg[1]
local G, TLEN, LR = 8, 12, 1e-3
local STATES = { "master", "exp_avg", "exp_avg_sq" }
local cfg = zr.models.llama.config("zrun/tiny-llama")

local function make_model() zr.manual_seed(1234); return zr.models.llama.LlamaForCausalLM(cfg) end

local function names_of(engine)
  local by = {}
  for n, p in engine.module:named_parameters() do by[p] = n end
  local out = {}
  for i, p in ipairs(engine.params) do out[i] = by[p] end
  return out
end

-- Parameter shapes by name, taken before the engine exists (stage 3 releases parameters to (0)).
local ref_shapes = {}
do
  local seed, off = zr.random_state()
  for n, p in make_model():named_parameters() do ref_shapes[n] = p:shape() end
  zr.random_state(seed, off)
end

-- name -> full f32 tensor for each state.
local function gather_state(engine)
  local z, W = engine.zero, engine.world_size
  local S = z:partition_numel()
  local names = names_of(engine)
  local out = {}
  for k, sname in ipairs(STATES) do
    local part = z:state(k - 1):contiguous()
    local all
    if engine.stage == 0 or W == 1 then all = part
    else
      all = zr.zeros({ W * S })
      dist.all_gather(all, part)
    end
    for i, name in ipairs(names) do
      local off, c = z:layout(i)
      local shape = ref_shapes[name]
      local n = 1
      for _, d in ipairs(shape) do n = n * d end
      local full = zr.zeros({ n })
      if engine.stage == 0 or W == 1 then full:copy_(all:narrow(1, off + 1, n))
      else
        for j = 0, W - 1 do
          local lo = j * c
          local len = math.min(c, n - lo)
          if len > 0 then full:narrow(1, lo + 1, len):copy_(all:narrow(1, j * S + off + 1, len)) end
        end
      end
      out[sname .. "/" .. name] = full:view(shape)
    end
  end
  return out
end

local function compare_state(a, b, what)
  local n = 0
  for k, t in pairs(b) do
    if not a[k] then error(what .. ": missing " .. k) end
    T.eq(table.concat(a[k]:shape(), ","), table.concat(t:shape(), ","), what .. " shape of " .. k)
    T.near(a[k], t, 0, 0, what .. " " .. k)
    n = n + 1
  end
  for k in pairs(a) do if not b[k] then error(what .. ": unexpected " .. k) end end
  assert(n > 0, what .. ": nothing compared")
end

local function read_losses(path)
  local out = {}
  for line in io.lines(path) do out[#out + 1] = tonumber(line) end
  return out
end

if mode == "fp32" then
  local out, src, work = arg[2], arg[3], arg[4]
  local ref = zr.load_safetensors(work .. "/ref_" .. src .. ".safetensors")
  T.test("zero-to-fp32 output equals the gathered master weights (" .. src .. ")", function()
    local got = zr.load_safetensors(out)
    local want = {}
    for k, t in pairs(ref) do
      local name = k:match("^master/(.*)$")
      if name then want[name] = t end
    end
    compare_state(got, want, "consolidated")
  end)
  T.test("model-states file (rank 0, gathered at stage 3) equals the master weights (" .. src .. ")", function()
    local dir = work .. "/ckpt_" .. src .. "/global_step3/"
    local got = zr.load_safetensors(dir .. "mp_rank_00_model_states.safetensors")
    for k, t in pairs(ref) do
      local name = k:match("^master/(.*)$")
      if name then T.near(got[name], t, 0, 0, name) end
    end
  end)
  T.test("load_state_dict_from_zero_checkpoint (" .. src .. ")", function()
    local m = make_model()
    require("zrun.zero_to_fp32").load_state_dict_from_zero_checkpoint(m, work .. "/ckpt_" .. src)
    for n, p in m:named_parameters() do T.near(p, ref["master/" .. n], 0, 0, n) end
  end)
  T.done()
  return
end

local stage, gas, work = tonumber(arg[2]), tonumber(arg[3]), arg[4]
local W, r = dist.world_size(), dist.rank()
local MB = G / W
local tagname = ("s%d_np%d"):format(stage, W)

local function batch(step, micro)
  zr.manual_seed(1000 * step + micro)
  local ids = (zr.rand({ G, TLEN }) * 250):to("i64")
  return ids:narrow(1, r * MB + 1, MB):contiguous()
end

local engine = zr.initialize({ model = make_model(), config = {
  train_micro_batch_size_per_gpu = MB, gradient_accumulation_steps = gas, gradient_clipping = 1.0,
  steps_per_print = 1000000,
  optimizer = { type = "AdamW", params = { lr = LR, betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 } },
  scheduler = { type = "WarmupLR", params = { warmup_min_lr = 0, warmup_max_lr = LR, warmup_num_steps = 5 } },
  zero_optimization = { stage = stage, reduce_bucket_size = 3000 },
} })

local function train(from, to) return T.train_steps(engine, batch, from, to, gas, true) end

local function save_state(path)
  local st = gather_state(engine)
  if r == 0 then zr.save_safetensors(path, st) end
  dist.barrier()
end

local function write_losses(path, losses)
  if r ~= 0 then return end
  local f = assert(io.open(path, "w"))
  for _, l in ipairs(losses) do f:write(("%.17g\n"):format(l)) end
  f:close()
end

local function run(name, fn)
  if r == 0 then T.test(name, fn) else fn() end
end

if mode == "full" then
  local losses = train(1, 6)
  write_losses(work .. "/full_" .. tagname .. ".txt", losses)
  save_state(work .. "/full_" .. tagname .. "_state.safetensors")
  run("uninterrupted run " .. tagname, function()
    for i, l in ipairs(losses) do assert(l == l and l < 10, "loss " .. i .. " is " .. l) end
  end)
elseif mode == "first" then
  train(1, 3)
  zr.manual_seed(4242 + r) -- a random state to find again after loading
  zr.rand({ 5 })
  local seed, off = zr.random_state()
  engine:save_checkpoint(work .. "/ckpt_" .. tagname, nil, { epoch = 7, batch_in_epoch = 3, note = "first" })
  local f = assert(io.open(("%s/rng_%s_r%d.txt"):format(work, tagname, r), "w")) -- per rank
  f:write(("%.17g %.17g\n"):format(seed, off))
  f:close()
  save_state(work .. "/ref_" .. tagname .. ".safetensors")
  run("save after 3 steps " .. tagname, function() T.eq(engine.global_steps, 3, "global_steps") end)
elseif mode == "resume" then
  local src, exact = arg[5], arg[6] == "1"
  local name = ("resume %s -> %s (gas %d)"):format(src, tagname, gas)
  local cs = engine:load_checkpoint(work .. "/ckpt_" .. src)
  local seed, off = zr.random_state()
  local restored = gather_state(engine)
  local ref = zr.load_safetensors(work .. "/ref_" .. src .. ".safetensors")
  run(name .. ": restored master, exp_avg, exp_avg_sq equal the saved run's bitwise", function()
    compare_state(restored, ref, "restored")
    T.eq(cs.epoch, 7, "client_state.epoch")
    T.eq(cs.batch_in_epoch, 3, "client_state.batch_in_epoch")
    T.eq(engine.global_steps, 3, "global_steps")
    T.eq(engine.opt_steps, 3, "opt_steps")
    T.eq(engine.micro_steps, 3 * gas, "micro_steps")
    T.near(engine:get_lr()[1], engine.lr_scheduler:get_lr()[1], 0, 0, "lr")
    -- each rank gets its own saved generator back; ranks beyond the saved world take rank 0's
    local wsrc = tonumber(src:match("np(%d+)$"))
    local f = assert(io.open(("%s/rng_%s_r%d.txt"):format(work, src, r < wsrc and r or 0)))
    local ws, wo = f:read("*n", "*n")
    f:close()
    T.eq(seed, ws, "RNG seed")
    T.eq(off, wo, "RNG offset")
  end)
  local losses = train(4, 6)
  local full = read_losses(work .. "/full_" .. src .. ".txt")
  run(name .. (exact and ": losses 4-6 equal the uninterrupted run bitwise" or ": losses 4-6 match the uninterrupted run (2e-5)"), function()
    for i = 1, 3 do assert(losses[i] == losses[i] and math.abs(losses[i]) < 10, "loss not finite") end
    if exact then
      for i = 1, 3 do
        if losses[i] ~= full[3 + i] then
          error(("loss %d: %.17g resumed vs %.17g uninterrupted"):format(3 + i, losses[i], full[3 + i]))
        end
      end
    else
      T.near(losses, { full[4], full[5], full[6] }, 2e-5, 0, "losses 4-6")
    end
  end)
  local final = gather_state(engine)
  if exact then
    local want = zr.load_safetensors(work .. "/full_" .. src .. "_state.safetensors")
    run(name .. ": state after step 6 equals the uninterrupted run's bitwise", function()
      compare_state(final, want, "final")
    end)
  end
elseif mode == "twice" then
  local dir = work .. "/twice_" .. tagname
  train(1, 3)
  engine:save_checkpoint(dir, "ck")
  train(4, 6)
  engine:save_checkpoint(dir, "ck")
  local want = gather_state(engine)
  train(7, 7)
  if r == 0 then -- as if killed between writing the manifest and renaming the folder in
    local p = io.popen("sh -c 'echo $$'")
    local dead = p:read("*n")
    p:close()
    local id = require("zrun.checkpoint_store").new_id():gsub("%-%d+%-(%d+)$", "-" .. dead .. "-%1")
    assert(os.rename(dir .. "/ck", dir .. "/ck.tmp." .. id))
  end
  dist.barrier()
  engine:load_checkpoint(dir)
  local got = gather_state(engine)
  run("saved twice into one tag " .. tagname .. ": the tag holds the second save whole", function()
    T.eq(engine.global_steps, 6, "global_steps after loading")
    compare_state(got, want, "restored")
    T.eq(table.concat(zr.listdir(dir), ","), "ck,latest", "the checkpoint directory (no leftovers)")
    local names = zr.listdir(dir .. "/ck")
    T.eq(#names, 3 + W, "files in the tag folder: " .. table.concat(names, ","))
    local man = require("cjson").decode(io.open(dir .. "/ck/zrun_manifest.json"):read("*a"))
    T.eq(man.global_steps, 6, "manifest global_steps")
    for k = 0, W - 1 do
      local _, md = zr.safetensors_info(("%s/ck/zero_pp_rank_%d_mp_rank_00_optim_states.safetensors"):format(dir, k))
      local st = require("cjson").decode(md.zrun_state)
      T.eq(st.global_steps, 6, "rank " .. k .. "'s file global_steps")
      T.eq(st.save_id, man.save_id, "rank " .. k .. "'s file save id")
    end
  end)
elseif mode == "badload" then
  -- WORK/ckpt_<SRC> has a damaged file for one rank: every rank must stop with an error (none
  -- left waiting in a collective), rank 0's naming the rank that failed and its message.
  local src, pattern = arg[5], arg[6]
  local ok, err = pcall(engine.load_checkpoint, engine, work .. "/ckpt_" .. src)
  run("damaged checkpoint " .. src .. " fails on every rank", function()
    assert(not ok, "load_checkpoint succeeded")
    if r == 0 and not tostring(err):find(pattern, 1, true) then error("message: " .. tostring(err)) end
  end)
  if ok then os.exit(1) end
else
  error("checkpoint_check.lua: unknown mode '" .. tostring(mode) .. "'")
end
T.done()
