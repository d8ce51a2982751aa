-- The REPL through a pseudo-terminal (util-linux `script`, present on every Debian): tab completion
-- of zr. names, a model config explored with zr.memory.describe, multi-line input, and the history
-- file written on exit. Keystrokes are fed with pauses, as a person would type them.
local zr = require "zrun"
local T = zr.testing

local bin = os.getenv("ZRUN_BIN") or "./zrun"
local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("*a")
  f:close()
  return out
end

if sh("command -v script") == "" then
  T.skip("REPL through a pty", "util-linux `script` is not installed")
elseif not zr._C.build_info().readline then
  T.skip("REPL through a pty", "zrun was built without readline (no line editing or completion)")
else
  T.test("REPL through a pty: completion, describe, multi-line input, history", function()
    local home = os.tmpname()
    os.remove(home)
    os.execute("mkdir -p " .. home)
    -- each entry is typed after a pause; \t is TAB, \004 is Ctrl-D
    local keys = {
      "zr.vers\t .. \"!\"\n",                                 -- completes to zr.version
      'm = zr.models.llama.config("meta-llama/Llama-3.2-1B")\n',
      "zr.memory.describe(m)\n",
      "zr.memory.desc\t(m, {quiet=true}).total + 1\n",         -- lazy module loaded: completes now
      "for i = 1, 3 do\n", "  acc = (acc or 0) + i\n", "end\n",  -- one statement over three lines
      "acc * 1000 + 7\n",
      "\004",
    }
    local feed = {} -- printf with the keys as its format (escapes interpreted)
    for i, k in ipairs(keys) do
      local esc = k:gsub("%%", "%%%%"):gsub("'", "'\\''"):gsub("\n", "\\n"):gsub("\t", "\\t"):gsub("\004", "\\004")
      feed[i] = "sleep 0.4; printf '" .. esc .. "'"
    end
    local cmd = ("( %s; sleep 1 ) | HOME=%s TERM=dumb INPUTRC=/dev/null script -qfec %s /dev/null"):format(
      table.concat(feed, "; "), home, bin)
    local out = sh(cmd)
    local function has(s, what) if not out:find(s, 1, true) then error(what .. ": '" .. s .. "' not in output:\n" .. out, 0) end end
    has("0.1.0!", "zr.vers<TAB> completed to zr.version and printed it")
    has("model.layers.*.mlp.up_proj.weight", "describe printed the per-module table")
    has("1,235,814,400 parameters", "describe printed the total")
    has("1235814401", "zr.memory.desc<TAB> completed to describe")
    has("6007", "multi-line for loop ran (1+2+3 = 6 -> 6007)")
    local h = io.open(home .. "/.zrun_history")
    if not h then error("no history file written in " .. home .. "\n" .. out, 0) end
    local hist = h:read("*a")
    h:close()
    if not hist:find("zr.memory.describe(m)", 1, true) then error("history lacks the describe call:\n" .. hist, 0) end
    if not hist:find("for i = 1, 3 do", 1, true) then error("history lacks the multi-line statement:\n" .. hist, 0) end
    os.execute("rm -rf " .. home)
  end)
end
T.done()
