-- A checkpoint tag switches from its old contents to the new in one step (zrun.checkpoint_store):
-- what killed saves leave behind and how the next save or load cleans it (one line), a kill between
-- the two renames, mixed or incomplete tags refused, a failed save leaving the directory as it was,
-- and a loop of saves killed with SIGKILL at random moments, each followed by a load that must
-- find exactly one of the complete checkpoints and continue with the same losses.
-- ZRUN_KILLS=N sets the number of kills (default 10; the report's long run used 100).
local zr = require "zrun"
local T = zr.testing
local store = require "zrun.checkpoint_store"
local cjson = require "cjson"
local setup = dofile((arg[0]:gsub("[^/]*$", "")) .. "checkpoint_kill_setup.lua")
local fmt = string.format

local root = os.tmpname()
os.remove(root)
zr.makedirs(root)
local function path(p) return root .. "/" .. p end
local function read(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end
local function write(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end
local function sh(cmd) assert(os.execute(cmd) == 0, "command failed: " .. cmd) end
local function listing(d) return table.concat(zr.listdir(d) or {}, ",") end
local OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.safetensors"

-- The pid of a process that has exited (a leftover's writer that was killed).
local function dead_pid()
  local f = io.popen("sh -c 'echo $$'")
  local p = tonumber(f:read("*a"))
  f:close()
  return p
end
-- A leftover folder name as a save from process `pid` on this host (or on `host`) would give it.
local function leftover(tag, kind, pid, host)
  local id = store.new_id():gsub("^(.-)%-%d+%-(%d+)$", function(h, n) return (host or h) .. "-" .. pid .. "-" .. n end)
  return tag .. "." .. kind .. "." .. id
end
-- Runs fn with print captured; returns the printed lines.
local function printed(fn)
  local lines, orig = {}, print
  print = function(...) lines[#lines + 1] = table.concat({ ... }, "\t") end
  local ok, err = pcall(fn)
  print = orig
  if not ok then error(err, 0) end
  return lines
end

-- States after each step of the shared run, computed as far as asked: master weights (exact) and
-- the loss of each step.
local ref = { e = setup.engine(), master = {}, loss = {}, n = 0 }
local function ref_upto(k)
  while ref.n < k do
    ref.n = ref.n + 1
    ref.loss[ref.n] = setup.step(ref.e, ref.n)
    ref.master[ref.n] = ref.e.zero:state(0):clone()
  end
end
local function saved_at(dir, steps, tag) -- a checkpoint of the shared run after `steps` steps
  local e = setup.engine()
  for s = 1, steps do setup.step(e, s) end
  e:save_checkpoint(dir, tag or "ck", { step = steps })
  return e
end

T.test("saving into an existing tag replaces it whole; leftovers of killed saves go, in one line", function()
  local d = path("a")
  local e = saved_at(d, 1)
  local p = dead_pid()
  -- what a save killed mid-way leaves: its temporary tag folder (half a file inside), a copy of
  -- `latest` being written, and (older zrun) a file's temporary copy inside the tag folder
  local tmp = leftover("ck", "tmp", p)
  zr.makedirs(d .. "/" .. tmp)
  write(d .. "/" .. tmp .. "/" .. OPTIM .. ".tmp." .. p .. ".1", string.rep("x", 5000))
  write(d .. "/latest.tmp." .. p .. ".2", "c")
  write(d .. "/ck/" .. OPTIM .. ".tmp." .. p .. ".3", string.rep("y", 100))
  write(d .. "/ck/README.txt", "the user's notes") -- not zrun's: kept in the tag across saves
  setup.step(e, 2)
  local lines = printed(function() e:save_checkpoint(d, "ck", { step = 2 }) end)
  T.eq(#lines, 1, "lines printed: " .. table.concat(lines, " | "))
  local line = lines[1]
  for _, s in ipairs({ "[zrun] save_checkpoint: cleaned " .. d .. " after interrupted saves: ", tmp .. "/",
      "latest.tmp." .. p .. ".2", "ck/" .. OPTIM .. ".tmp." .. p .. ".3", "(5.0 kB freed)" }) do
    T.eq(line:find(s, 1, true) ~= nil, true, "the line names '" .. s .. "': " .. line)
  end
  T.eq(listing(d), "ck,latest", "the checkpoint directory")
  T.eq(listing(d .. "/ck"), "README.txt,mp_rank_00_model_states.json,mp_rank_00_model_states.safetensors," .. OPTIM
    .. ",zrun_manifest.json", "the tag folder")
  T.eq(read(d .. "/ck/README.txt"), "the user's notes", "a file zrun did not write, moved over")
  local man = cjson.decode(read(d .. "/ck/zrun_manifest.json"))
  T.eq(man.global_steps, 2, "the manifest is the second save's")
  local e2 = setup.engine()
  local cs = e2:load_checkpoint(d)
  T.eq(cs.step, 2, "client_state of the second save")
  T.near(e2.zero:state(0), e.zero:state(0), 0, 0, "master weights")
  -- nothing left: a second save prints nothing
  T.eq(#printed(function() e:save_checkpoint(d, "ck") end), 0, "lines printed by a clean save")
end)

T.test("a load cleans too, but leaves a save still running and another host's save alone", function()
  local d = path("b")
  saved_at(d, 1)
  local p = dead_pid()
  local dead, live, remote = leftover("ck", "tmp", p), leftover("ck", "tmp", 1), leftover("ck", "tmp", p, "otherhost")
  for _, n in ipairs({ dead, live, remote }) do
    zr.makedirs(d .. "/" .. n)
    write(d .. "/" .. n .. "/" .. OPTIM, "partial")
  end
  local e = setup.engine()
  local lines = printed(function() e:load_checkpoint(d) end)
  T.eq(#lines, 1, "lines printed: " .. table.concat(lines, " | "))
  T.eq(lines[1]:find("[zrun] load_checkpoint: cleaned " .. d .. " after interrupted saves: " .. dead .. "/", 1, true) ~= nil,
    true, lines[1])
  local want = { "ck", live, "latest", remote }
  table.sort(want)
  T.eq(listing(d), table.concat(want, ","), "after the load")
  -- a save removes the other host's leftover too (a job saving here owns the directory)
  T.eq(printed(function() e:save_checkpoint(d, "ck") end)[1]:find(remote .. "/", 1, true) ~= nil, true, "save's line")
  T.eq(listing(d), table.concat({ "ck", live, "latest" }, ","), "after the save")
  -- files zrun did not write keep a leftover folder in place, and the line says so
  local mine = leftover("ck", "tmp", p)
  zr.makedirs(d .. "/" .. mine)
  write(d .. "/" .. mine .. "/" .. OPTIM, "partial")
  write(d .. "/" .. mine .. "/notes.txt", "the user's")
  local line = printed(function() e:load_checkpoint(d) end)[1]
  T.eq(line:find("left " .. d .. "/" .. mine .. ", which holds files zrun did not write", 1, true) ~= nil, true, line)
  T.eq(listing(d .. "/" .. mine), "notes.txt", "only zrun's file removed")
end)

T.test("killed between the two renames: the next load finishes the switch, or puts the old tag back", function()
  for _, whole in ipairs({ true, false }) do
    local d, scratch = path(whole and "c1" or "c2"), path(whole and "c1s" or "c2s")
    saved_at(d, 1)
    saved_at(scratch, 2)
    local p = dead_pid()
    local tmp, old = leftover("ck", "tmp", p), leftover("ck", "old", p)
    -- rank 0 had renamed ck aside and not yet the new folder in
    write(d .. "/ck/notes.txt", "the user's") -- not zrun's: stays with the tag
    assert(os.rename(d .. "/ck", d .. "/" .. old))
    assert(os.rename(scratch .. "/ck", d .. "/" .. tmp))
    if not whole then os.remove(d .. "/" .. tmp .. "/zrun_manifest.json") end
    local e = setup.engine()
    local line = printed(function() e:load_checkpoint(d) end)[1]
    T.eq(line:find(whole and "finished switching in ck" or "restored ck from " .. old, 1, true) ~= nil, true, line)
    T.eq(e.global_steps, whole and 2 or 1, "loaded step")
    T.eq(listing(d), "ck,latest", "the checkpoint directory")
    T.eq(read(d .. "/ck/notes.txt"), "the user's", "the file zrun did not write")
    ref_upto(2)
    T.near(e.zero:state(0), ref.master[whole and 2 or 1], 0, 0, "master weights")
  end
end)

T.test("a load refuses a mixed or incomplete tag folder with one line naming the file and the fix", function()
  local d, other = path("m"), path("m_other")
  saved_at(d, 1)
  saved_at(other, 2)
  local e = setup.engine()
  local function refuses(what, want)
    local err = T.raises(function() e:load_checkpoint(d) end, want)
    T.eq(err:find("\n") == nil and err:find("%.lua:%d") == nil, true, what .. ": one line, no internal position: " .. err)
    T.eq(err:find("save this one again", 1, true) ~= nil, true, what .. ": says what to do: " .. err)
  end
  local man = read(d .. "/ck/zrun_manifest.json")
  local function patch(name, size) -- the manifest made to agree with a swapped-in file's size
    write(d .. "/ck/zrun_manifest.json", (man:gsub('("' .. name:gsub("%p", "%%%0") .. '": )%d+', "%1" .. size)))
  end
  -- the optimizer file of another save (same size, as the manifest is patched)
  local good = read(d .. "/ck/" .. OPTIM)
  write(d .. "/ck/" .. OPTIM, read(other .. "/ck/" .. OPTIM))
  patch(OPTIM, #read(other .. "/ck/" .. OPTIM))
  refuses("mixed optimizer file", d .. "/ck/" .. OPTIM .. ": written by save '")
  write(d .. "/ck/" .. OPTIM, good)
  write(d .. "/ck/zrun_manifest.json", man)
  -- the model-states sidecar of another save
  local js = read(d .. "/ck/mp_rank_00_model_states.json")
  write(d .. "/ck/mp_rank_00_model_states.json", read(other .. "/ck/mp_rank_00_model_states.json"))
  patch("mp_rank_00_model_states.json", #read(other .. "/ck/mp_rank_00_model_states.json"))
  refuses("mixed sidecar", "mp_rank_00_model_states.json: written by save '")
  write(d .. "/ck/mp_rank_00_model_states.json", js)
  write(d .. "/ck/zrun_manifest.json", man)
  -- a truncated file, a missing one, no manifest
  write(d .. "/ck/" .. OPTIM, good:sub(1, 1000))
  refuses("truncated", d .. "/ck/" .. OPTIM .. ": 1000 bytes, but zrun_manifest.json says " .. #good)
  os.remove(d .. "/ck/" .. OPTIM)
  refuses("missing", d .. "/ck/" .. OPTIM .. ": missing, but zrun_manifest.json lists it")
  write(d .. "/ck/" .. OPTIM, good)
  os.remove(d .. "/ck/zrun_manifest.json")
  refuses("no manifest", d .. "/ck: not a complete checkpoint: zrun_manifest.json is missing")
  write(d .. "/ck/zrun_manifest.json", "{")
  refuses("damaged manifest", d .. "/ck/zrun_manifest.json: not a zrun checkpoint manifest")
  write(d .. "/ck/zrun_manifest.json", man)
  e:load_checkpoint(d)
  T.eq(e.global_steps, 1, "whole again: loads")
  -- zero-to-fp32 reads through the same check
  os.remove(d .. "/ck/zrun_manifest.json")
  T.raises(function() require("zrun.zero_to_fp32").main({ d, path("m.safetensors") }) end,
    "zrun_manifest.json is missing")
end)

T.test("a failed save leaves the directory as it was, with one line naming the checkpoint", function()
  local d = path("f")
  local e = saved_at(d, 1)
  local before = read(d .. "/ck/zrun_manifest.json")
  setup.step(e, 2)
  local C, orig, orig_stream = zr._C, zr._C.save_safetensors, zr._C.save_safetensors_stream
  local function failing(f)
    return function(p, ...)
      if p:find(OPTIM, 1, true) then error(p .. ": write failed: No space left on device", 0) end
      return f(p, ...)
    end
  end
  C.save_safetensors, C.save_safetensors_stream = failing(orig), failing(orig_stream)
  local ok, err = pcall(e.save_checkpoint, e, d, "ck")
  C.save_safetensors, C.save_safetensors_stream = orig, orig_stream
  T.eq(ok, false, "the save failed")
  T.eq(err:find("^save_checkpoint " .. d:gsub("%p", "%%%0") .. "/ck: .*No space left on device$") ~= nil, true, err)
  T.eq(listing(d), "ck,latest", "no temporary folder left")
  T.eq(read(d .. "/ck/zrun_manifest.json"), before, "the tag is the first save's")
  -- errors a user causes: one line naming the checkpoint path
  write(path("afile"), "x")
  err = T.raises(function() e:save_checkpoint(path("afile"), "ck") end,
    "save_checkpoint " .. path("afile") .. "/ck: cannot create directory " .. path("afile"))
  T.eq(err:find("\n") == nil and err:find("%.lua:%d") == nil, true, err)
  T.raises(function() e:save_checkpoint(nil) end, "save_checkpoint: expected a directory path, got nil")
  T.raises(function() e:save_checkpoint(d, "ck.tmp.h-1-1") end, "tag 'ck.tmp.h-1-1' cannot name")
end)

-- The kill loop: a worker process saves into DIR/ck after every step; SIGKILL at a random moment
-- after its first save; then this process loads DIR (cleaning what the kill left), checks the state is the shared
-- run's after the loaded step exactly, trains three more steps and compares their losses bitwise.
T.test("saves killed at random moments: every load finds one complete checkpoint and resumes exactly", function()
  local kills = tonumber(os.getenv("ZRUN_KILLS") or "10")
  local zrun = os.getenv("ZRUN_BIN") or arg[-1]
  local worker = (arg[0]:gsub("[^/]*$", "")) .. "checkpoint_kill_worker.lua"
  local d = path("kill")
  math.randomseed(tonumber(os.getenv("ZRUN_KILL_SEED") or "1"))
  local e = setup.engine()
  local tally = { mid_save = 0, between = 0, none_yet = 0, switch = 0 }
  local steps = {}
  for i = 1, kills do
    -- after the worker's first save, a random delay of up to about four steps and saves
    local ready = d .. ".ready"
    sh(fmt("rm -f '%s'; '%s' '%s' '%s' '%s' >/dev/null 2>&1 & p=$!; n=0; while [ ! -e '%s' ] && [ $n -lt 3000 ]; "
      .. "do sleep 0.01; n=$((n+1)); done; sleep %.3f; kill -9 $p; wait $p 2>/dev/null; true",
      ready, zrun, worker, d, ready, ready, math.random() * 0.25))
    local left, has_ck, has_old = false, false, false
    for _, n in ipairs(zr.listdir(d) or {}) do
      if store.is_leftover(n) then left = true end
      if n:match("^ck%.old%.") then has_old = true end
      if n == "ck" then has_ck = true end
    end
    local ok, cs = pcall(e.load_checkpoint, e, d)
    if not ok then
      -- only when no save has finished yet (the first rounds): nothing to load, nothing left
      if #steps > 0 or has_ck or has_old then error(fmt("kill %d: the load failed: %s", i, tostring(cs))) end
      T.eq(tostring(cs):find("latest is missing", 1, true) ~= nil, true, "kill " .. i .. ": " .. tostring(cs))
      T.eq(listing(d), "", "kill " .. i .. ": nothing left after the load")
      tally.none_yet = tally.none_yet + 1
    else
      if has_old and not has_ck then tally.switch = tally.switch + 1
      elseif left then tally.mid_save = tally.mid_save + 1
      else tally.between = tally.between + 1 end
      local k = e.global_steps
      steps[#steps + 1] = k
      T.eq(cs.step, k, "kill " .. i .. ": client_state step")
      ref_upto(k + 3)
      T.near(e.zero:state(0), ref.master[k], 0, 0, fmt("kill %d: master weights after step %d", i, k))
      for s = k + 1, k + 3 do
        local loss = setup.step(e, s)
        if loss ~= ref.loss[s] then error(fmt("kill %d: loss of step %d after resuming from step %d: %.17g, the run's %.17g",
          i, s, k, loss, ref.loss[s])) end
      end
      T.eq(listing(d), "ck,latest", "kill " .. i .. ": nothing left after the load")
    end
  end
  print(fmt("    %d kills: %d mid-save (leftovers cleaned), %d between saves, %d mid-switch, %d before any save; "
    .. "loaded steps %s", kills, tally.mid_save, tally.between, tally.switch, tally.none_yet, table.concat(steps, " ")))
  T.eq(#steps > 0, true, "at least one kill found a checkpoint")
end)

os.execute("rm -rf '" .. root .. "'")
T.done()
