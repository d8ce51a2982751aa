-- Generates docs/api.md, the Lua API reference, from the code's own comments: for every module in
-- lua/zrun/**/*.lua its opening comment, then each public function's signature and the comment
-- block right above it. Run from the repository root:
--   ./zrun docs/gen_api.lua       writes docs/api.md
--   ./zrun docs/gen_api.lua -     prints it (tests/lua/test_docs.lua fails when the two differ)
-- Public: a top-level `function T.name(...)`, `function T:name(...)` or `T.name = function(...)`
-- where T is the table the file returns or a local table it exports (`M.Engine = Engine`);
-- names starting with "_" are private, except `__init`, shown as the constructor `T(...)`.
-- The C functions (tensors and ops, zr._C) are not here: their comments are in lua/bind_*.c.
local fmt, concat = string.format, table.concat

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function lines_of(s)
  local out = {}
  for l in (s .. "\n"):gmatch("(.-)\n") do out[#out + 1] = l end
  return out
end

local function files()
  local p = assert(io.popen("find lua/zrun -name '*.lua' | LC_ALL=C sort"))
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  if #out == 0 then error("gen_api: no lua/zrun/*.lua here: run it from the repository root", 0) end
  return out
end

-- "lua/zrun/nn/init.lua" -> "zrun.nn"; "lua/zrun/memory_plan.lua" -> "zrun.memory_plan"
local function module_name(path)
  local m = path:gsub("^lua/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
  return m
end

-- zr.<name> for the submodules zrun loads on first use (the `lazy` table in lua/zrun/init.lua).
local function lazy_names()
  local src = read("lua/zrun/init.lua")
  local body = src:match("local lazy = (%b{})") or ""
  local out = {}
  for k, mod in body:gmatch('([%w_]+)%s*=%s*"(zrun[%w%._]*)"') do out[mod] = "zr." .. k end
  out.zrun = "zr"
  return out
end

-- A comment line as Markdown: "<" escaped (so `checkpoint-<step>` is not read as a tag).
local function prose(s) return (s:gsub("<", "&lt;"):gsub("^>", "\\>")) end

-- Comment lines (without "-- ") as Markdown: lines indented two or more spaces are code examples
-- (an indented code block); a blank line ends a paragraph, or stays inside a code block that goes on.
local function render(comment)
  local out, mode = {}, nil
  for k, l in ipairs(comment) do
    if l:match("^%s*$") then
      local nxt = comment[k + 1]
      if mode == "code" and nxt and nxt:match("^  ") then out[#out + 1] = ""
      else mode = nil end
    else
      local m = l:match("^  ") and "code" or "text"
      if m ~= mode then
        if #out > 0 then out[#out + 1] = "" end
        mode = m
      end
      out[#out + 1] = m == "code" and ("    " .. l) or prose(l)
    end
  end
  return concat(out, "\n")
end

local function is_rule(l) return l:match("^%-%-%s*[%-=]+%s*$") or l:match("^%-%- .-%-%-%-%-%-%-%-%-%s*$") end

-- The comment block right above line i (no blank line between), without divider lines.
local function comment_above(L, i)
  local out = {}
  local j = i - 1
  -- (a one-line local the function uses may sit between: `local COMM_DTYPES = {...}`)
  if L[j] and L[j]:match("^local%s") and L[j - 1] and L[j - 1]:match("^%-%-") then j = j - 1 end
  while j >= 1 and L[j]:match("^%-%-") do
    if not is_rule(L[j]) then table.insert(out, 1, (L[j]:gsub("^%-%-%-? ?", ""))) end
    j = j - 1
  end
  return out
end

local function parse(path, lazy)
  local src = read(path)
  local L = lines_of(src)
  local mod = module_name(path)
  -- the opening comment
  local intro, i = {}, 1
  while L[i] and L[i]:match("^%-%-") do
    if not is_rule(L[i]) then intro[#intro + 1] = (L[i]:gsub("^%-%-%-? ?", "")) end
    i = i + 1
  end
  local ret
  for k = #L, 1, -1 do
    ret = L[k]:match("^return%s+([%w_]+)%s*$")
    if ret then break end
  end
  local access = lazy[mod] or mod
  -- a submodule its parent exposes (zr.nn.Linear, zr.models.llama): by that name
  local parent, leaf = mod:match("^(.*)%.([%w_]+)$")
  if not lazy[mod] and parent and lazy[parent] then
    local init = io.open("lua/" .. parent:gsub("%.", "/") .. "/init.lua", "rb")
    local isrc = init and init:read("*a") or ""
    if init then init:close() end
    local k = isrc:gsub("local%s+[%w_]+%s*=", ""):match("([%w_]+)%s*=%s*require%s*%(?%s*\"" .. mod:gsub("%.", "%%.") .. "\"")
    -- (or one that loads any submodule by name: require("zrun.models." .. k))
    if not k and isrc:find('"' .. parent .. '."%s*%.%.') then k = leaf end
    if k then access = lazy[parent] .. "." .. k end
  end
  -- what the tables are called from outside: the returned one by the module's path, exported
  -- locals by their exported name
  local names = {}
  if ret then names[ret] = access end
  for _, l in ipairs(L) do
    local t, k, v = l:match("^([%w_]+)%.([%w_]+)%s*=%s*([%w_]+)%s*$")
    if t and names[t] and t == ret and v ~= ret and k:match("^%u") then names[v] = access .. "." .. k end
  end
  local fns = {}
  for n, l in ipairs(L) do
    local t, sep, name, params = l:match("^function%s+([%w_]+)([%.:])([%w_]+)%s*(%b())")
    if not t then
      t, name, params = l:match("^([%w_]+)%.([%w_]+)%s*=%s*function%s*(%b())")
      sep = "."
    end
    if t and names[t] and (name:sub(1, 1) ~= "_" or name == "__init") then
      local shown = names[t]
      -- a class by its own name: the returned one by its local name, an exported one by its export
      local cls = t == ret and t or shown:match("([%w_]+)$")
      local sig
      if name == "__init" then sig = (t == ret and t or shown) .. params
      elseif sep == ":" then sig = cls .. ":" .. name .. params
      else sig = shown .. "." .. name .. params end
      local comment = comment_above(L, n)
      -- one-line definitions grouped under one comment share it
      local prev = fns[#fns]
      if #comment == 0 and prev and prev.line == n - 1 then comment = prev.comment end
      fns[#fns + 1] = { sig = sig, comment = comment, line = n }
    end
  end
  return { path = path, mod = mod, access = access, intro = intro, fns = fns }
end

local function generate()
  local lazy = lazy_names()
  local mods, missing = {}, {}
  for _, p in ipairs(files()) do mods[#mods + 1] = parse(p, lazy) end
  local out = {
    "# zrun Lua API reference",
    "",
    "<!-- Generated by `./zrun docs/gen_api.lua` from the comments in lua/zrun/**/*.lua; do not edit:",
    "     change the comment in the code and regenerate (tests/lua/test_docs.lua fails when this file is stale). -->",
    "",
    "Every module of the Lua library, with its opening comment, and each public function with the",
    "comment written above it in the code. `zr` is `require \"zrun\"`; submodules marked `zr.X` load on",
    "first use, the others with `require \"zrun.X\"`. Tensors and ops (`zr.randn`, `zr.linear`, `t:sum`, ...)",
    "are C functions: their comments are in `lua/bind_*.c`. Guides: [first recipe](first_recipe.md),",
    "[migrating from DeepSpeed + Hugging Face](migrating.md), [memory tour](memory_tour.md).",
    "",
  }
  for _, m in ipairs(mods) do
    local label = m.access ~= m.mod and fmt("%s (`%s`)", m.mod, m.access) or m.mod
    out[#out + 1] = fmt("- [%s](#%s) — %d function%s", label, (m.mod:gsub("%.", "")), #m.fns, #m.fns == 1 and "" or "s")
  end
  out[#out + 1] = ""
  for _, m in ipairs(mods) do
    out[#out + 1] = fmt("## %s", m.mod)
    out[#out + 1] = ""
    out[#out + 1] = fmt("`%s`%s", m.path, m.access ~= m.mod and fmt(" · `%s`", m.access) or "")
    out[#out + 1] = ""
    if #m.intro > 0 then
      out[#out + 1] = render(m.intro)
      out[#out + 1] = ""
    end
    for _, f in ipairs(m.fns) do
      out[#out + 1] = fmt("### `%s`", f.sig)
      out[#out + 1] = ""
      if #f.comment > 0 then out[#out + 1] = render(f.comment)
      else
        out[#out + 1] = "*(no comment in the code)*"
        missing[#missing + 1] = fmt("%s:%d %s", m.path, f.line, f.sig)
      end
      out[#out + 1] = ""
    end
  end
  return concat(out, "\n"), missing
end

local text, missing = generate()
if arg and arg[1] == "-" then
  io.write(text)
else
  local f = assert(io.open("docs/api.md", "wb"))
  f:write(text)
  f:close()
  local n = 0
  for _ in text:gmatch("\n### ") do n = n + 1 end
  print(fmt("wrote docs/api.md: %d functions, %d without a comment%s", n, #missing,
    #missing > 0 and (":\n  " .. concat(missing, "\n  ")) or ""))
end
