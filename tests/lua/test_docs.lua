-- Every code block in docs/*.md and README.md runs, as a reader would run it, and shows what the
-- page says it shows; docs/api.md is what docs/gen_api.lua generates from the code's comments.
--   ```lua      code: the page's blocks run in order in one process (docs_child.lua), sharing locals
--               as one script; an error fails the page at the block's line.
--   ```lua      whose first line starts with "zr> ": a REPL transcript; each statement runs as the
--               REPL runs it, and the lines under it are its expected output ("error: ..." when the
--               page shows an error).
--   ```sh       whose first command starts with zrun or ./zrun: every command runs (in the scratch
--               folder, `zrun` on the PATH) and must exit 0; a block mixing in other commands must
--               be marked. Other ```sh blocks (make, apt) are not run.
--   ```text     right after a code block: its expected output. Each line must appear, in order,
--               among the lines printed (other lines may come between); "..." matches any text.
--   <!-- no-test: why -->   on the line before a fence: not run (a ```lua block is still compiled).
-- The pages run in a scratch folder whose entries link to the repository root's (so recipes/...,
-- configs/... resolve and outputs stay out of the tree); <page>.lua there holds the page's ```lua
-- blocks in one file, which a page may run (`./zrun first_recipe.lua`).
local zr = require "zrun"
local T = zr.testing

local fmt = string.format
local BIN = os.getenv("ZRUN_BIN") or "./zrun"

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("*a")
  p:close()
  return out
end
local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end
local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function lines_of(s)
  local out = {}
  for l in (s .. "\n"):gmatch("(.-)\r?\n") do out[#out + 1] = l end
  if out[#out] == "" then out[#out] = nil end
  return out
end

local ROOT = sh("pwd"):gsub("%s+$", "")
local ABS_BIN = BIN:sub(1, 1) == "/" and BIN or (ROOT .. "/" .. BIN:gsub("^%./", ""))

-- Parsing ------------------------------------------------------------------------------------------

local SHELLS = { sh = true, bash = true, shell = true, console = true }
local function is_zrun_cmd(l) return l == "zrun" or l == "./zrun" or l:match("^%.?/?zrun%s") ~= nil end

-- Blocks of a page: {info=, line= (the opening fence), code = {lines}, notest = reason|nil,
-- kind = "lua"|"repl"|"sh"|"text"|"other", expect = {lines, line=} (a ```text block after it)}.
local function parse(text)
  local L = lines_of(text)
  local blocks, i = {}, 1
  while i <= #L do
    local info, rest = L[i]:match("^```%s*([%w_%-]*)([^`]-)%s*$")
    if info then
      local b = { info = info, line = i, code = {}, words = rest }
      local j = i - 1
      while j >= 1 and L[j]:match("^%s*$") do j = j - 1 end
      if j >= 1 then b.notest = L[j]:match("^<!%-%-%s*no%-test:?%s*(.-)%s*%-%->%s*$") end
      i = i + 1
      while i <= #L and not L[i]:match("^```%s*$") do b.code[#b.code + 1] = L[i]; i = i + 1 end
      b.close = i
      local first
      for _, l in ipairs(b.code) do if l:match("%S") and not (SHELLS[info] and l:match("^%s*#")) then first = l; break end end
      if info == "lua" then b.kind = first and first:match("^zr> ") and "repl" or "lua"
      elseif SHELLS[info] then b.kind = first and is_zrun_cmd(first:match("^%s*(.-)%s*$")) and "sh" or "other"
      elseif info == "text" or info == "output" then b.kind = "text"
      else b.kind = "other" end
      -- an output block right after a code block is that block's expected output
      local prev = blocks[#blocks]
      if b.kind == "text" and prev and prev.kind ~= "text" then
        local gap = true
        for k = prev.close + 1, b.line - 1 do if L[k]:match("%S") then gap = false end end
        if gap then prev.expect = { lines = b.code, line = b.line + 1 } end
      end
      blocks[#blocks + 1] = b
    end
    i = i + 1
  end
  return blocks, L
end

-- A REPL transcript: statements ("zr> " and ">> " continuation lines) with their output lines.
local function statements(b)
  local out = {}
  for k, l in ipairs(b.code) do
    local line = b.line + k
    if l:match("^zr> ") then out[#out + 1] = { src = l:sub(5), line = line, expect = {}, expect_line = line + 1 }
    elseif l:match("^>> ") and out[#out] and #out[#out].expect == 0 then out[#out].src = out[#out].src .. "\n" .. l:sub(4)
    elseif out[#out] then local e = out[#out].expect; e[#e + 1] = l end
  end
  return out
end

-- Expected lines in order among the actual ones; "..." matches anything. Returns nil or the index
-- of the first expected line not found.
local function pattern(e)
  local p = e:gsub("%s+$", ""):gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0"):gsub("%%%.%%%.%%%.", ".-")
  return "^" .. p .. "$"
end
local function match_lines(expected, actual)
  local j = 1
  for i, e in ipairs(expected) do
    if e:match("%S") and e:match("^%s*(.-)%s*$") ~= "..." then
      local p = pattern(e)
      while j <= #actual and not actual[j]:gsub("%s+$", ""):match(p) do j = j + 1 end
      if j > #actual then return i end
      j = j + 1
    end
  end
  return nil
end

-- Running ------------------------------------------------------------------------------------------

local scratch
local function scratch_dir()
  if scratch then return scratch end
  scratch = sh("mktemp -d"):gsub("%s+$", "")
  -- the repository root's entries, linked (outputs land here, not in the tree), and zrun on the PATH
  for name in sh("ls -A " .. q(ROOT)):gmatch("[^\n]+") do
    if name ~= "output" and name ~= ".git" then sh(fmt("ln -s %s %s", q(ROOT .. "/" .. name), q(scratch .. "/" .. name))) end
  end
  sh(fmt("rm -f %s/zrun && ln -s %s %s/zrun && mkdir -p %s/bin && ln -s %s %s/bin/zrun", q(scratch), q(ABS_BIN),
    q(scratch), q(scratch), q(ABS_BIN), q(scratch)))
  return scratch
end

-- Runs one page; returns the problems found (strings naming page:line) and counts.
local function run_page(path, name)
  local text = assert(read(path), "cannot read " .. path)
  local blocks, L = parse(text)
  local dir = scratch_dir()
  local problems, counts = {}, { ran = 0, skipped = 0, notest = {} }
  local function problem(line, msg, ...) problems[#problems + 1] = fmt("%s:%d: " .. msg, name, line, ...) end
  local src, plan_blocks, script = {}, {}, {}
  for i = 1, #L do src[i] = "" end
  for k, b in ipairs(blocks) do
    local pb = { kind = b.kind }
    plan_blocks[k] = pb
    if b.notest and b.kind ~= "text" then
      counts.skipped = counts.skipped + 1
      counts.notest[#counts.notest + 1] = fmt("%s:%d (%s)", name, b.line, b.notest)
      pb.kind = "skip"
      if b.notest == "" then problem(b.line, "a no-test block must say why: <!-- no-test: reason -->") end
      if b.kind == "lua" then -- still compiled
        local ok, err = loadstring(table.concat(b.code, "\n"), "=" .. name)
        if not ok then problem(b.line, "no-test block does not compile: %s", err) end
      end
    elseif b.kind == "lua" then
      counts.ran = counts.ran + 1
      for n, l in ipairs(b.code) do src[b.line + n] = l; script[#script + 1] = l end
      script[#script + 1] = ""
    elseif b.kind == "repl" then
      counts.ran = counts.ran + 1
      b.statements = statements(b)
      pb.statements = {}
      for n, st in ipairs(b.statements) do pb.statements[n] = { src = st.src } end
    elseif b.kind == "sh" then
      counts.ran = counts.ran + 1
      pb.commands, b.cmd_lines = {}, {}
      for n, l in ipairs(b.code) do
        local c = l:match("^%s*(.-)%s*$")
        if c ~= "" and not c:match("^#") then
          if not is_zrun_cmd(c) then
            problem(b.line + n, "`%s` in a zrun block: mark the block <!-- no-test: why --> or split it", c)
          end
          pb.commands[#pb.commands + 1] = c
          b.cmd_lines[#pb.commands] = b.line + n
        end
      end
    end
    src[b.line] = fmt("__zrdoc(%d)", k)
  end
  if #problems > 0 then return problems, counts end
  local base = name:match("([^/]+)%.md$") or "page"
  write(dir .. "/" .. base .. ".lua", table.concat(script, "\n"))
  local plan = { doc = name, source = table.concat(src, "\n"), blocks = plan_blocks }
  local function ser(v)
    if type(v) == "table" then
      local parts = {}
      for k, x in pairs(v) do parts[#parts + 1] = "[" .. ser(k) .. "]=" .. ser(x) end
      return "{" .. table.concat(parts, ",") .. "}"
    elseif type(v) == "string" then return fmt("%q", v) end
    return tostring(v)
  end
  local plan_file = dir .. "/.zrdoc_plan_" .. base .. ".lua"
  write(plan_file, "return " .. ser(plan))
  local out = sh(fmt("cd %s && PATH=%s/bin:$PATH OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 %s %s %s 2>&1", q(dir), q(dir),
    q(ABS_BIN), q(ROOT .. "/tests/lua/docs_child.lua"), q(plan_file)))
  -- split the output at the markers
  local regions, cur, ended, err = {}, nil, false, nil
  for _, l in ipairs(lines_of(out)) do
    local m = l:match("^\1zrdoc (.*)$")
    if m then
      local w = {}
      for x in m:gmatch("%S+") do w[#w + 1] = x end
      if w[1] == "end" then ended = true; cur = nil
      elseif w[1] == "error" then err = {}; cur = err
      elseif w[1] == "status" then
        local b = blocks[tonumber(w[2])]
        problem(b.cmd_lines[tonumber(w[3])], "command exited with status %s", w[4])
      else
        cur = {}
        regions[table.concat(w, " ", 1, w[1] == "block" and 2 or 3)] = cur
      end
    elseif cur then cur[#cur + 1] = l end
  end
  if err then
    problems[#problems + 1] = fmt("%s: a block failed:\n      %s", name, table.concat(err, "\n      "))
  elseif not ended then
    problems[#problems + 1] = fmt("%s: the run stopped early; its output:\n%s", name, out:sub(-3000))
  end
  local function expect(line, what, exp, got)
    local miss = match_lines(exp, got)
    if miss then
      problem(line + miss - 1, "%s: expected line not printed (in this order): %q\n    printed:\n      %s", what,
        exp[miss], table.concat(got, "\n      "))
    end
  end
  for k, b in ipairs(blocks) do
    if plan_blocks[k].kind == "repl" then
      for n, st in ipairs(b.statements) do
        local got = regions[fmt("stmt %d %d", k, n)]
        if got then
          local shows_error = st.expect[1] and st.expect[1]:match("^error:")
          local errl
          for _, l in ipairs(got) do if l:match("^error:") then errl = l; break end end
          if errl and not shows_error then problem(st.line, "zr> %s: %s", st.src, errl) end
          if #st.expect > 0 then expect(st.expect_line, "zr> " .. st.src, st.expect, got) end
        end
      end
    elseif b.expect and (plan_blocks[k].kind == "lua" or plan_blocks[k].kind == "sh") then
      local got = {}
      local reg = regions["block " .. k]
      if reg then
        for _, l in ipairs(reg) do got[#got + 1] = l end
        for n = 1, #(plan_blocks[k].commands or {}) do
          for _, l in ipairs(regions[fmt("cmd %d %d", k, n)] or {}) do got[#got + 1] = l end
        end
        expect(b.expect.line, fmt("the output of the block at line %d", b.line), b.expect.lines, got)
      end
    end
  end
  return problems, counts
end

-- Tests --------------------------------------------------------------------------------------------

local pages = {}
for p in sh("ls docs/*.md 2>/dev/null"):gmatch("[^\n]+") do pages[#pages + 1] = p end
pages[#pages + 1] = "README.md"

local total_ran, notest = 0, {}
for _, p in ipairs(pages) do
  T.test(p .. ": every code block runs and prints what the page shows", function()
    local t0 = zr.now()
    local problems, c = run_page(p, p)
    total_ran = total_ran + c.ran
    for _, n in ipairs(c.notest) do notest[#notest + 1] = n end
    if #problems > 0 then error(table.concat(problems, "\n"), 0) end
    print(fmt("  %s: %d blocks ran, %d not run (no-test), %.1f s", p, c.ran, c.skipped, zr.now() - t0))
  end)
end
print(fmt("  %d blocks ran; not run: %s", total_ran, #notest > 0 and table.concat(notest, "; ") or "none"))

T.test("the runner fails a page naming the page and the line", function()
  local dir = scratch_dir()
  local page = dir .. "/bad.md"
  write(page, table.concat({
    "# A page with mistakes", "", "```lua", "local a = 1", "print('a is ' .. a)", "```", "```text", "a is 2", "```", "",
    "```lua", "zr> 1 + 1", "3", "zr> error('boom')", "```", "",
    "```sh", "./zrun check configs/zero2.json", "make test", "```", "",
    "<!-- no-test -->", "```lua", "x = 1", "```", "",
    "```lua", "print(a + 1)", "local b = nil + 1", "```",
  }, "\n") .. "\n")
  local problems = run_page(page, "bad.md")
  local all = table.concat(problems, "\n")
  -- the unmarked shell command and the reasonless no-test stop the page before it runs
  assert(all:find("bad.md:19: `make test` in a zrun block", 1, true), all)
  assert(all:find("bad.md:23: a no-test block must say why", 1, true), all)
  write(page, (read(page):gsub("make test\n", ""):gsub("<!%-%- no%-test %-%->", "<!-- no-test: a GPU -->")))
  problems = run_page(page, "bad.md")
  all = table.concat(problems, "\n")
  assert(all:find('bad.md:8: the output of the block at line 3: expected line not printed (in this order): "a is 2"', 1, true), all)
  assert(all:find('bad.md:13: zr> 1 + 1: expected line not printed', 1, true), all)
  assert(all:find("bad.md:14: zr> error('boom'): error: ", 1, true), all)
  assert(all:find("bad.md:28: attempt to perform arithmetic on a nil value", 1, true), all)
  assert(#problems == 4, all)
end)

T.test("docs/api.md is what docs/gen_api.lua generates from the comments", function()
  local want = sh(fmt("%s docs/gen_api.lua - 2>&1", q(BIN)))
  local have = read("docs/api.md") or ""
  if want ~= have then
    local a, b = lines_of(want), lines_of(have)
    local i = 1
    while a[i] == b[i] and i <= math.max(#a, #b) do i = i + 1 end
    error(fmt("docs/api.md differs from the generated reference at line %d:\n  committed: %s\n  generated: %s\n" ..
      "run `./zrun docs/gen_api.lua` and commit docs/api.md", i, tostring(b[i]), tostring(a[i])), 0)
  end
end)

if scratch and scratch:match("^/tmp/") then sh("rm -rf " .. q(scratch)) end
T.done()
