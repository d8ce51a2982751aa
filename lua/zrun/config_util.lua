-- What config.lua, config_auto.lua and config_check.lua share: values (the shortest number text,
-- JSON-like rendering, deep copies), dotted paths ("zero_optimization.stage") into a values tree, and
-- the lists of errors and warnings a config's check collects. No schema and no rules here.
local M = {}
local NULL = require("cjson").null
local floor, abs, huge = math.floor, math.abs, math.huge
local fmt, concat, sort = string.format, table.concat, table.sort
local type, pairs, ipairs, tostring, tonumber = type, pairs, ipairs, tostring, tonumber

-- Values ------------------------------------------------------------------------------------------

-- Shortest decimal that reads back as v; integers without a fraction.
local function fmtnum(v)
  if v ~= v then return "NaN" end
  if v == huge then return "Infinity" elseif v == -huge then return "-Infinity" end
  if floor(v) == v and abs(v) < 2 ^ 53 then return fmt("%d", v) end
  for p = 1, 17 do
    local s = fmt("%." .. p .. "g", v)
    if tonumber(s) == v then return s end
  end
  return fmt("%.17g", v)
end

local function is_array(t)
  local n = 0
  for k in pairs(t) do
    if type(k) ~= "number" then return false end
    n = n + 1
  end
  return n > 0 and n == #t
end

local function is_object(v) return type(v) == "table" and (next(v) == nil or not is_array(v)) end

-- JSON-like rendering for messages and the describe table.
local function show(v)
  if v == nil or v == NULL then return "null" end
  local t = type(v)
  if t == "number" then return fmtnum(v) end
  if t == "string" then return '"' .. v .. '"' end
  if t == "table" then
    if is_array(v) then
      local parts = {}
      for i, x in ipairs(v) do parts[i] = show(x) end
      return "[" .. concat(parts, ", ") .. "]"
    end
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = tostring(k) end
    sort(keys)
    local parts = {}
    for i, k in ipairs(keys) do parts[i] = '"' .. k .. '": ' .. show(v[k]) end
    return "{" .. concat(parts, ", ") .. "}"
  end
  return tostring(v)
end

local function deepcopy(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = deepcopy(x) end
  return out
end

local function join(path, name) return path == "" and name or (path .. "." .. name) end

local function split(path)
  local parts = {}
  for p in path:gmatch("[^.]+") do parts[#parts + 1] = p end
  return parts
end

-- The value at a dotted path of a values tree, or nil where a part is missing.
local function get(vals, path)
  local t = vals
  for _, p in ipairs(split(path)) do
    if type(t) ~= "table" then return nil end
    t = t[p]
  end
  return t
end

local function set(vals, path, v)
  local parts = split(path)
  local t = vals
  for i = 1, #parts - 1 do t = t[parts[i]] end
  t[parts[#parts]] = v
end

-- Messages, formatted as string.format does, into the check's lists (ctx.errors, ctx.warnings).
local function add_error(ctx, ...) ctx.errors[#ctx.errors + 1] = fmt(...) end
local function add_warning(ctx, ...) ctx.warnings[#ctx.warnings + 1] = fmt(...) end

M.fmtnum, M.is_array, M.is_object, M.show, M.deepcopy = fmtnum, is_array, is_object, show, deepcopy
M.join, M.split, M.get, M.set = join, split, get, set
M.add_error, M.add_warning = add_error, add_warning
-- A Lua pattern for one of DeepSpeed's data_types.keep_in_fp32_modules names (a regular expression once
-- its "*" reads ".*", searched anywhere in a buffer's full name): names of letters, digits, "_", "-", "."
-- (any character, as in the regular expression) and "*"; nil and a message for other characters.
function M.name_pattern(name)
  if type(name) ~= "string" or name:find("[^%w_%-%.%*]") then
    return nil, string.format('%s: a name pattern takes letters, digits, "_", "-", "." and "*" only', M.show(name))
  end
  return (name:gsub("%-", "%%-"):gsub("%*", ".*"))
end

-- " (line L, column C)" of cjson's error about text ("... at character N"), or "" when it names no place:
-- a hand-edited JSON file's mistake is found by its line, not its byte.
function M.json_where(text, err)
  local at = tonumber(tostring(err):match("at character (%d+)"))
  if not at then return "" end
  local line, col = 1, at
  for nl in text:sub(1, at - 1):gmatch("()\n") do line, col = line + 1, at - nl end
  return fmt(" (line %d, column %d)", line, col)
end

return M
