-- How a checkpoint tag reaches the disk whole (zrun.checkpoint decides what goes in it). A save
-- writes every rank's files into dir/<tag>.tmp.<id>/, then rank 0 writes zrun_manifest.json there
-- (every file's size and the save's id, which each file also carries) and swaps the folder in for
-- dir/<tag> with two renames, then rewrites dir/latest:
--
--   dir/<tag>.tmp.<id>/   a save in progress (or killed): never read, removed by the next save/load
--   dir/<tag>.old.<id>/   the tag's previous contents between the two renames, then removed
--   dir/<tag>/            only ever a complete save; the manifest proves it on load
--
-- A kill between the two renames leaves no dir/<tag> but both folders: the next save or load of
-- dir finishes the switch (the new folder when its manifest is whole, else the old one back).
-- <id> is <host>-<pid>-<n> of rank 0, so a save still running on this host is never touched.
local C = require "zrun._C"
local cjson = require "cjson"

local M = {}
local fmt, concat = string.format, table.concat

M.MANIFEST = "zrun_manifest.json"
M.FORMAT = "zrun-checkpoint-manifest/1"

local function join(a, b) return a:sub(-1) == "/" and a .. b or a .. "/" .. b end

-- A file's contents, or nil.
local function read_all(p)
  local f = io.open(p, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end
M.read_all = read_all

-- Size in bytes of a regular file, or nil.
function M.size(p)
  if C.path_type(p) ~= "file" then return nil end
  local f = io.open(p, "rb")
  if not f then return nil end
  local n = f:seek("end")
  f:close()
  return n
end

local host_cache, pid_cache
local function host()
  if not host_cache then
    host_cache = ((read_all("/proc/sys/kernel/hostname") or "host"):match("^%s*(.-)%s*$"):gsub("[^%w_]", "_"))
    if host_cache == "" then host_cache = "host" end
  end
  return host_cache
end
local function pid()
  if not pid_cache then pid_cache = tonumber((read_all("/proc/self/stat") or ""):match("^(%d+)")) or 0 end
  return pid_cache
end
-- Is another process p, which wrote a leftover, still running on this machine? (This process's
-- own leftovers are from saves that already failed. Unknown: running, so nothing is removed.)
local function running(p)
  if p == pid() then return false end
  if C.path_type("/proc/self") ~= "dir" then return true end
  return C.path_type("/proc/" .. p) == "dir"
end

local counter = 0
-- A fresh save id (rank 0): unique per host, process and save.
function M.new_id()
  counter = counter + 1
  return fmt("%s-%d-%d", host(), pid(), counter)
end

-- The files a save writes into a tag folder, and the temporary names zrun's atomic writes give
-- them (<name>.tmp.<pid>.<n>): what cleaning may remove, and nothing else.
local function zrun_name(n)
  return n == M.MANIFEST or n == "mp_rank_00_model_states.safetensors" or n == "mp_rank_00_model_states.json"
    or n:match("^zero_pp_rank_%d+_mp_rank_00_optim_states%.safetensors$") ~= nil
end
local function temp_of(n) -- the file's own name and the writer's pid, when n is an atomic-write temp
  local base, p = n:match("^(.+)%.tmp%.(%d+)%.%d+$")
  return base, tonumber(p)
end
-- Whether n is a file name zrun writes into a tag folder (or the temporary of one).
function M.is_zrun_file(n)
  local base = temp_of(n)
  return zrun_name(base or n)
end

-- dir/<tag>.tmp.<id> or .old.<id>: tag, kind, host, pid.
local function parse_leftover(n)
  local tag, kind, h, p = n:match("^(.+)%.(tmp)%.([%w_]+)%-(%d+)%-%d+$")
  if not tag then tag, kind, h, p = n:match("^(.+)%.(old)%.([%w_]+)%-(%d+)%-%d+$") end
  if tag then return tag, kind, h, tonumber(p) end
end
-- Whether n is a tag folder a save left behind (<tag>.tmp.<id> or <tag>.old.<id>).
function M.is_leftover(n) return parse_leftover(n) ~= nil end

-- The folder a save writes before it is renamed to dir/tag.
function M.temp_dir(dir, tag, id) return join(dir, tag .. ".tmp." .. id) end

-- ---------------------------------------------------------------- manifest

-- Writes tdir's manifest (format, tag, save id, world size, stage, each file's size) atomically.
function M.write_manifest(tdir, m)
  local names = {}
  for n in pairs(m.files) do names[#names + 1] = n end
  table.sort(names)
  local parts = {}
  for _, n in ipairs(names) do parts[#parts + 1] = fmt("    %s: %d", cjson.encode(n), m.files[n]) end
  local s = fmt('{\n  "format": %s,\n  "tag": %s,\n  "save_id": %s,\n  "world_size": %d,\n  "stage": %d,\n'
    .. '  "global_steps": %d,\n  "files": {\n%s\n  }\n}\n', cjson.encode(M.FORMAT), cjson.encode(m.tag),
    cjson.encode(m.save_id), m.world_size, m.stage, m.global_steps, concat(parts, ",\n"))
  C.write_file_atomic(join(tdir, M.MANIFEST), s)
end

-- The manifest of tag folder tdir, checked against the files there: every listed file present
-- with its size. Errors are one line: the folder or file, what is wrong, what to do.
function M.verify(tdir, others)
  local p = join(tdir, M.MANIFEST)
  local s = read_all(p)
  local redo = fmt("load another tag%s or save this one again", others and fmt(" (%s)", others) or "")
  if not s then
    error(fmt("%s: not a complete checkpoint: %s is missing (a save that did not finish, or one written "
      .. "before zrun kept manifests); %s", tdir, M.MANIFEST, redo), 0)
  end
  local ok, m = pcall(cjson.decode, s)
  if not ok or type(m) ~= "table" or m.format ~= M.FORMAT or type(m.files) ~= "table" or type(m.save_id) ~= "string" then
    error(fmt("%s: not a zrun checkpoint manifest (damaged?); %s", p, redo), 0)
  end
  for name, bytes in pairs(m.files) do
    local f = join(tdir, name)
    local got = M.size(f)
    if not got then
      error(fmt("%s: missing, but %s lists it: the checkpoint is incomplete; %s", f, M.MANIFEST, redo), 0)
    elseif got ~= bytes then
      error(fmt("%s: %d bytes, but %s says %d: the file was changed or truncated after the save; %s", f, got,
        M.MANIFEST, bytes, redo), 0)
    end
  end
  return m
end

-- Checks that a file's save id (from its metadata) is the manifest's: files of one tag folder
-- written by different saves are refused.
function M.check_id(path, got, m)
  if got ~= m.save_id then
    error(fmt("%s: written by save '%s', but %s belongs to save '%s': files of different saves are mixed "
      .. "in one checkpoint; load another tag or save this one again", path, tostring(got), M.MANIFEST, m.save_id), 0)
  end
end

-- ---------------------------------------------------------------- switching a tag in (rank 0)

local function rename(a, b)
  local ok, err = os.rename(a, b)
  if not ok then error(fmt("cannot rename %s to %s: %s", a, b, tostring(err)), 0) end
end

-- Removes zrun's files in folder p and then p; returns bytes freed and whether p is gone (a
-- folder holding anything else is left there).
local function remove_folder(p)
  local freed = 0
  for _, n in ipairs(C.listdir(p) or {}) do
    local f = join(p, n)
    if M.is_zrun_file(n) and C.path_type(f) == "file" then
      freed = freed + (M.size(f) or 0)
      os.remove(f)
    end
  end
  os.remove(p)
  return freed, C.path_type(p) == nil
end

-- Removes a tag's previous folder once the new one is in place, moving files someone else put
-- there over to the new one; returns what remove_folder does.
local function retire(old, final)
  for _, n in ipairs(C.listdir(old) or {}) do
    if not M.is_zrun_file(n) and not C.path_type(join(final, n)) then os.rename(join(old, n), join(final, n)) end
  end
  return remove_folder(old)
end

-- A failed save's temporary folder (rank 0), best effort.
function M.discard(p) pcall(remove_folder, p) end

-- Puts the finished save in tmp in place of dir/<tag> (two renames; see the header), then
-- rewrites dir/latest, whose atomic write also makes the renames durable (it syncs dir). Files
-- someone else put in the tag folder move over to the new one.
function M.commit(dir, tag, tmp, id)
  local final = join(dir, tag)
  local old
  if C.path_type(final) then
    old = join(dir, tag .. ".old." .. id)
    rename(final, old)
  end
  local ok, err = os.rename(tmp, final)
  if not ok then
    if old then os.rename(old, final) end
    error(fmt("cannot rename %s to %s: %s", tmp, final, tostring(err)), 0)
  end
  C.write_file_atomic(join(dir, "latest"), tag)
  if old then retire(old, final) end
end

-- ---------------------------------------------------------------- leftovers

local function human(n)
  if n >= 2 ^ 30 then return fmt("%.1f GB", n / 2 ^ 30) end
  if n >= 2 ^ 20 then return fmt("%.1f MB", n / 2 ^ 20) end
  if n >= 2 ^ 10 then return fmt("%.1f kB", n / 2 ^ 10) end
  return fmt("%d bytes", n)
end

local function whole(p) -- a tmp folder whose manifest and files check out
  return (pcall(M.verify, p))
end

-- Cleans dir of what killed or failed saves left: tag folders of unfinished saves, the previous
-- contents of a tag switched in, `latest` and tag files' temporary copies. A switch cut between its
-- two renames is finished. Only zrun's names are touched; a save still running on this host is
-- left alone, and so is one from another host unless `all` (a save cleans them, a load may be
-- reading a directory another job is saving into). Returns one line saying what was done (nil
-- when nothing was), never an error.
function M.clean(dir, all)
  local names = C.listdir(dir)
  if not names then return nil end
  local done, kept, freed, me = {}, {}, 0, host()
  local function drop(p, label, final)
    local n, gone = (final and retire or remove_folder)(p, final)
    freed = freed + n
    if gone then done[#done + 1] = label else kept[#kept + 1] = p end
  end
  local tmps, olds = {}, {}
  for _, n in ipairs(names) do
    local p = join(dir, n)
    local tag, kind, h, pp = parse_leftover(n)
    local busy = tag and (h == me and running(pp) or h ~= me and not all)
    if tag and not busy and C.path_type(p) == "dir" then
      if kind == "tmp" then tmps[#tmps + 1] = { n = n, p = p, tag = tag } else olds[#olds + 1] = { n = n, p = p, tag = tag } end
    elseif not tag then
      local base, wp = temp_of(n)
      if base == "latest" and not running(wp) and C.path_type(p) == "file" then
        freed = freed + (M.size(p) or 0)
        if os.remove(p) then done[#done + 1] = n end
      elseif C.path_type(p) == "dir" then -- a tag folder: temporary copies of its files
        for _, f in ipairs(C.listdir(p) or {}) do
          local b, fp = temp_of(f)
          local fpath = join(p, f)
          if b and zrun_name(b) and not running(fp) and C.path_type(fpath) == "file" then
            freed = freed + (M.size(fpath) or 0)
            if os.remove(fpath) then done[#done + 1] = n .. "/" .. f end
          end
        end
      end
    end
  end
  -- tmp folders first: one whose tag is gone and whose manifest is whole is switched in
  for _, e in ipairs(tmps) do
    local final = join(dir, e.tag)
    if not C.path_type(final) and whole(e.p) and os.rename(e.p, final) then
      done[#done + 1] = fmt("finished switching in %s", e.tag)
    else
      drop(e.p, e.n .. "/")
    end
  end
  for _, e in ipairs(olds) do
    local final = join(dir, e.tag)
    if not C.path_type(final) and os.rename(e.p, final) then
      done[#done + 1] = fmt("restored %s from %s", e.tag, e.n)
    else
      drop(e.p, e.n .. "/", final)
    end
  end
  if #done == 0 and #kept == 0 then return nil end
  local line = fmt("cleaned %s after interrupted saves: %s%s", dir, concat(done, ", "),
    freed > 0 and fmt(" (%s freed)", human(freed)) or "")
  if #kept > 0 then
    line = line .. fmt("; left %s, which hold%s files zrun did not write", concat(kept, ", "), #kept == 1 and "s" or "")
  end
  return line
end

return M
