-- `zrun check` over real DeepSpeed configs from public projects (tests/configs/corpus): its verdict
-- (accept / warn / refuse) and the key it names must be those written down by hand, from DeepSpeed's
-- source, in tests/configs/corpus/expected.tsv.
local zr = require "zrun"
local T = zr.testing

local DIR = "tests/configs/corpus"

local function read_expected()
  local rows, n = {}, 0
  for line in io.lines(DIR .. "/expected.tsv") do
    if not line:match("^#") and line:match("%S") then
      local file, ds, verdict, key, why = line:match("^([^\t]+)\t([^\t]+)\t([^\t]+)\t([^\t]+)\t(.*)$")
      assert(file, "expected.tsv: a row needs 5 tab-separated fields: " .. line)
      assert(ds == "accept" or ds == "refuse", "expected.tsv: deepspeed verdict " .. ds)
      assert(verdict == "accept" or verdict == "warn" or verdict == "refuse", "expected.tsv: zrun verdict " .. verdict)
      rows[file] = { ds = ds, verdict = verdict, key = key ~= "-" and key or nil, why = why }
      n = n + 1
    end
  end
  return rows, n
end

-- Every file checked by one shell loop (one process per file, as a user runs it).
local function check_all(files)
  local bin = os.getenv("ZRUN_BIN") or "./zrun"
  local cmd = { "for f in" }
  for _, f in ipairs(files) do cmd[#cmd + 1] = DIR .. "/" .. f end
  cmd[#cmd + 1] = '; do echo "@@file $f"; ' .. bin .. ' check --world-size 1 "$f" 2>&1; echo "@@rc $?"; done'
  local p = io.popen(table.concat(cmd, " "))
  local out, cur = {}, nil
  for line in p:lines() do
    local f = line:match("^@@file .*/([^/]+)$")
    local rc = line:match("^@@rc (%d+)$")
    if f then cur = { text = {} }; out[f] = cur
    elseif rc then cur.rc = tonumber(rc)
    else cur.text[#cur.text + 1] = line end
  end
  p:close()
  return out
end

local function verdict_of(r)
  if r.rc ~= 0 then return "refuse" end
  for _, l in ipairs(r.text) do if l:match("^warning: ") then return "warn" end end
  return "accept"
end

T.test("the corpus: at least 40 configs from at least 10 projects, each with an expected verdict", function()
  local rows, n = read_expected()
  local files, projects, np = {}, {}, 0
  for f in io.popen("ls " .. DIR):lines() do
    if f:match("%.json$") then
      files[#files + 1] = f
      assert(rows[f], "no expected verdict for " .. f)
      local proj = f:match("^(.-)__")
      assert(proj, "corpus file names are <project>__<name>: " .. f)
      if not projects[proj] then projects[proj], np = true, np + 1 end
    end
  end
  T.eq(#files, n, "one expected.tsv row per corpus file")
  assert(#files >= 40, "at least 40 configs, got " .. #files)
  assert(np >= 10, "at least 10 projects, got " .. np)
  local readme = io.open(DIR .. "/README.md"):read("*a")
  for _, f in ipairs(files) do assert(readme:find("| " .. f .. " |", 1, true), "README.md lists no source for " .. f) end
end)

T.test("zrun check agrees with the verdicts written from DeepSpeed's source", function()
  local rows = read_expected()
  local files = {}
  for f in pairs(rows) do files[#files + 1] = f end
  table.sort(files)
  local got = check_all(files)
  local bad, counts = {}, { accept = 0, warn = 0, refuse = 0 }
  for _, f in ipairs(files) do
    local e, r = rows[f], got[f]
    local v = verdict_of(r)
    counts[v] = counts[v] + 1
    local text = table.concat(r.text, "\n")
    if v ~= e.verdict then
      bad[#bad + 1] = ("%s: expected %s, zrun check says %s:\n%s"):format(f, e.verdict, v, text)
    elseif e.key and not text:find(e.key, 1, true) then
      bad[#bad + 1] = ("%s: %s, but the message does not name %q:\n%s"):format(f, v, e.key, text)
    end
    -- a refusal is one line per problem, each naming a key
    if v == "refuse" and text:find("traceback", 1, true) then bad[#bad + 1] = f .. ": a traceback instead of a message" end
  end
  print(("corpus: %d accepted, %d with a warning, %d refused"):format(counts.accept, counts.warn, counts.refuse))
  if #bad > 0 then error(#bad .. " verdicts differ:\n" .. table.concat(bad, "\n\n"), 0) end
end)

T.done()
