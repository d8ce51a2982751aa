-- The zrun REPL: readline editing and history (~/.zrun_history), multi-line input (an incomplete
-- statement continues on the next line), results printed (tables pretty-printed, tensors like
-- torch), `zr` preloaded, tab completion of global and field names (zr.<TAB>).
local C = require "zrun._C"
local M = {}

local function is_tensor(v) return C.is_tensor(v) end

-- Pretty-prints a Lua value: tables sorted by key, nested up to `depth`, cycles marked.
function M.pretty(v, depth, indent, seen)
  depth, indent, seen = depth or 3, indent or "", seen or {}
  local t = type(v)
  if t == "string" then return string.format("%q", v) end
  if is_tensor(v) then return tostring(v) end
  if t ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if seen[v] then return "<cycle>" end
  if depth == 0 then return "{...}" end
  seen[v] = true
  local keys, n = {}, #v
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local parts, inner = {}, indent .. "  "
  for i = 1, n do parts[#parts + 1] = M.pretty(v[i], depth - 1, inner, seen) end
  for _, k in ipairs(keys) do
    local ks = (type(k) == "string" and k:match("^[%a_][%w_]*$")) and k or ("[" .. M.pretty(k, 1, "", seen) .. "]")
    parts[#parts + 1] = ks .. " = " .. M.pretty(v[k], depth - 1, inner, seen)
  end
  seen[v] = nil
  if #parts == 0 then return "{}" end
  local one = "{ " .. table.concat(parts, ", ") .. " }"
  if #one <= 80 and not one:find("\n") then return one end
  return "{\n" .. inner .. table.concat(parts, ",\n" .. inner) .. "\n" .. indent .. "}"
end

-- Candidates completing the last identifier path (a.b.c) in `text`.
function M.complete(env, line, text)
  local path = text:match("([%w_%.:]*)$") or ""
  local base, sep, prefix = path:match("^(.-)([%.:])([%w_]*)$")
  local tbl = env
  if base then
    for part in base:gmatch("[^%.:]+") do
      local ok, nxt = pcall(function() return tbl[part] end)
      if not ok or nxt == nil then return {} end
      tbl = nxt
    end
  else
    prefix, base, sep = path, nil, nil
  end
  local out, seen = {}, {}
  local function add_from(t)
    if type(t) ~= "table" then return end
    for k in pairs(t) do
      if type(k) == "string" and not seen[k] and k:sub(1, #prefix) == prefix and k:sub(1, 1) ~= "_" then
        seen[k] = true
        out[#out + 1] = (base and (base .. sep) or "") .. k
      end
    end
  end
  if is_tensor(tbl) then add_from(C.tensor_methods())
  else
    add_from(tbl)
    if type(tbl) == "table" then
      local mt = getmetatable(tbl)
      if mt and type(mt.__index) == "table" then add_from(mt.__index) end
      if tbl == env then add_from(_G) end
      if type(tbl.__lazy_names) == "function" then for _, k in ipairs(tbl.__lazy_names()) do add_from({ [k] = true }) end end
    end
  end
  table.sort(out)
  return out
end

-- Evaluates one chunk: tries "return <line>" first so expressions print their value.
-- Returns "incomplete" when more input is needed.
function M.eval(src, env)
  local fn, err1 = loadstring("return " .. src, "=stdin")
  if not fn then
    local err
    fn, err = loadstring(src, "=stdin")
    if not fn then
      if err:find("<eof>", 1, true) or err1:find("<eof>", 1, true) then return "incomplete" end
      return false, err
    end
  end
  setfenv(fn, env)
  local res = { xpcall(fn, function(e)
    -- keep the user's frames, drop the REPL's own
    local tb = debug.traceback(tostring(e), 2)
    local keep = {}
    for l in tb:gmatch("[^\n]+") do
      if l:find("repl.lua", 1, true) or l:find("xpcall", 1, true) then break end
      keep[#keep + 1] = l
    end
    return table.concat(keep, "\n")
  end) }
  if not res[1] then return false, res[2] end
  return true, res
end

-- The REPL loop (what `zrun` runs without a script): reads chunks at "zr> " (">> " while one is
-- incomplete), evaluates each with `zr` defined (new globals go to _G) and prints its results
-- (strings as text, other values pretty-printed) or "error: ...". History is read from and saved
-- to $HOME/.zrun_history; returns at the end of input (Ctrl-D).
function M.run()
  local zr = require "zrun"
  local env = setmetatable({ zr = zr }, { __index = _G, __newindex = function(t, k, v) rawset(_G, k, v) end })
  local hist = (os.getenv("HOME") or ".") .. "/.zrun_history"
  C.read_history(hist)
  C.set_completer(function(line, text) return M.complete(env, line, text) end)
  if C.isatty(0) then
    io.write(("zrun %s — LuaJIT REPL; `zr` is loaded. Try zr.randn(2,3), zr.memory.stats(). Ctrl-D exits.\n"):format(zr.version))
  end
  local buf = nil
  while true do
    local line = C.readline(buf and ">> " or "zr> ")
    if not line then io.write("\n"); break end
    buf = buf and (buf .. "\n" .. line) or line
    if buf:match("^%s*$") then buf = nil
    else
      local ok, res = M.eval(buf, env)
      if ok == "incomplete" then
        -- keep reading
      else
        C.add_history(buf)
        buf = nil
        if ok then
          for i = 2, table.maxn(res) do -- a string result prints as text (zr.memory.summary_text())
            local v = res[i]
            io.write(type(v) == "string" and v or M.pretty(v), i < table.maxn(res) and "\t" or "\n")
          end
        else
          io.write("error: ", tostring(res), "\n")
        end
      end
    end
  end
  C.write_history(hist)
end

return M
