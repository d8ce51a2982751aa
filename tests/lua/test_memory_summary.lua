-- zr.memory.summary() prints its table from a script (not only in the REPL); summary_text() returns it.
local zr = require "zrun"
local T = zr.testing
local z = os.getenv("ZRUN_BIN") or "./zrun"

T.test("summary_text: every category with current and peak bytes", function()
  local x = zr.memory.with_category("activations", function() return zr.randn(256, 256) end)
  local s = zr.memory.summary_text("cpu")
  assert(s:find("^cpu%s+current%s+peak"), s)
  for _, c in ipairs(zr.memory.categories) do assert(s:find("\n  " .. c .. " ", 1, true), c .. " missing:\n" .. s) end
  assert(s:find("activations%s+256%.00 KiB"), s)
  x = nil
end)

T.test("zr.memory.summary() as a statement in a script prints the table", function()
  local out = T.run(z .. [[ -e 'local zr = require "zrun"; local w = zr.randn(64, 64); zr.memory.summary()']])
  assert(out:find("cpu%s+current%s+peak") and out:find("total", 1, true), "nothing printed: " .. out)
end)

T.done()
