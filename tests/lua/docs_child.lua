-- One document's code blocks, run in this one process as a reader would run them (test_docs.lua
-- writes the plan, runs this in a scratch copy of the repository root and checks what it prints).
-- The plan's `source` is the document with every line blanked except the ```lua blocks' code and
-- each fence line, which calls __zrdoc(k): so an error names the document and its line, and the
-- blocks share their locals as one script does. REPL transcripts and shell commands run inside
-- __zrdoc. Output is delimited by lines starting with "\1zrdoc".
local plan = dofile(arg[1])
io.stdout:setvbuf("no") -- (stderr is unbuffered: the two streams stay in order through 2>&1)

local zr = require "zrun"
local repl = require "zrun.repl"
_G.zr = zr -- as in the REPL, where `zr` is loaded
local env = setmetatable({ zr = zr }, { __index = _G, __newindex = function(_, k, v) rawset(_G, k, v) end })

local function mark(...) io.stdout:write("\1zrdoc ", table.concat({ ... }, " "), "\n") end

-- A statement as the REPL runs it (repl.eval), its results printed as the REPL prints them.
local function repl_statement(src)
  local ok, res = repl.eval(src, env)
  if ok == "incomplete" then io.write("error: incomplete statement\n")
  elseif ok then
    local n = table.maxn(res)
    for i = 2, n do
      local v = res[i]
      io.write(type(v) == "string" and v or repl.pretty(v), i < n and "\t" or "\n")
    end
  else io.write("error: ", tostring(res), "\n") end
end

function _G.__zrdoc(k)
  local b = plan.blocks[k]
  mark("block", k)
  if b.kind == "repl" then
    for i, st in ipairs(b.statements) do
      mark("stmt", k, i)
      repl_statement(st.src)
    end
  elseif b.kind == "sh" then
    for i, cmd in ipairs(b.commands) do
      mark("cmd", k, i)
      local rc = os.execute(cmd .. " 2>&1")
      if rc ~= 0 then mark("status", k, i, tostring(rc)) end
    end
  end
end

local fn, err = loadstring(plan.source, "@" .. plan.doc)
if not fn then
  mark("error")
  print(err)
  os.exit(1)
end
local ok, e = xpcall(fn, debug.traceback)
if not ok then
  mark("error")
  print(tostring(e))
  os.exit(1)
end
mark("end")
