-- Chat templates come with downloaded models, so the renderer must fail cleanly on any template: the
-- golden templates (tests/golden/jinja/cases.json) mutated at random (bytes dropped, doubled, swapped,
-- replaced by template punctuation; pieces of other templates spliced in) either render or raise one
-- "chat template ..." error, never a Lua runtime error, and every render finishes (loops and ranges
-- are bounded). Seeded: the same mutations every run. ZRUN_FUZZ_N sets the count (default 3000).
local zr = require "zrun"
local T = zr.testing
local jinja = require "zrun.jinja"
local cjson = require "cjson"

local home = (ZRUN_HOME or ".") .. "/"
local cases = cjson.decode(T.read_file(home .. "tests/golden/jinja/cases.json")).cases
local N = tonumber(os.getenv("ZRUN_FUZZ_N") or "3000")
local PIECES = { "{{", "}}", "{%", "%}", "{#", "#}", "-", "(", ")", "[", "]", "'", '"', "|", ".", ",", " if ", " for ",
  " in ", " endfor ", " endif ", " else ", " set ", " loop.", " namespace(", " raise_exception(", "\n", "~", "**", " macro ",
  " endmacro ", " generation ", " endgeneration ", "range(99999999)", "recursive", " is ", " not ", "0", "-1", "[::-1]" }

local seed = 12345
local function rand(n) -- a small LCG: the same sequence on every machine
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed % n + 1
end

local function mutate(s)
  for _ = 1, rand(4) do
    local i = rand(#s + 1)
    local op = rand(5)
    if op == 1 then s = s:sub(1, i - 1) .. s:sub(i + rand(6))
    elseif op == 2 then local j = math.min(#s, i + rand(8)); s = s:sub(1, j) .. s:sub(i, j) .. s:sub(j + 1)
    elseif op == 3 then s = s:sub(1, i - 1) .. PIECES[rand(#PIECES)] .. s:sub(i)
    elseif op == 4 then local o = cases[rand(#cases)].template; local a = rand(#o); s = s:sub(1, i - 1) .. o:sub(a, a + rand(40)) .. s:sub(i)
    else local j = rand(#s + 1); s = s:sub(1, math.min(i, j) - 1) .. s:sub(math.max(i, j)) .. s:sub(math.min(i, j), math.max(i, j) - 1) end
  end
  return s
end

T.test(("%d mutated templates: a render or one clean 'chat template' error, never a Lua error"):format(N), function()
  local rendered, refused = 0, 0
  for k = 1, N do
    local c = cases[rand(#cases)]
    local src = mutate(c.template)
    local ok, err = pcall(jinja.render, src, c.context)
    if ok then rendered = rendered + 1
    else
      local msg = type(err) == "string" and err or tostring(err)
      if not msg:match("^chat template") then
        error(("mutation %d of case %s: not a clean template error: %s\ntemplate: %q"):format(k, c.name, msg, src), 0)
      end
      refused = refused + 1
    end
  end
  print(("  %d rendered, %d refused with a template error"):format(rendered, refused))
  assert(rendered > N / 20 and refused > N / 20, "the mutations exercise both paths")
end)

T.done()
