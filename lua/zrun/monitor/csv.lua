-- DeepSpeed's csvMonitor: one file per tag in OUTPUT_PATH/JOB_NAME, named after the tag with "/" and
-- " " turned into "_" ("Train_Samples_lr.csv"), a header row "step,<last part of the tag>" the first
-- time this run writes the tag, then "step,value" rows appended. Rows end in "\r\n" (Python's
-- csv.writer) and values are printed as Python's repr of a float ("0.0001", "1e-05", "65536.0").
local M = {}
local fmt, floor, abs, huge = string.format, math.floor, math.abs, math.huge

-- Python's repr(float): the shortest digits that read back as x; fixed notation for decimal
-- exponents -4..15 (always with a fraction: "2.0"), else "1e-05" / "1.5e+16".
function M.py_float(x)
  if x ~= x then return "nan" end
  if x == huge then return "inf" elseif x == -huge then return "-inf" end
  if x == 0 then return 1 / x < 0 and "-0.0" or "0.0" end
  local s
  for p = 1, 17 do
    s = fmt("%." .. (p - 1) .. "e", x)
    if tonumber(s) == x then break end
  end
  local sign, d1, rest, e = s:match("^(-?)(%d)%.?(%d*)e([-+]%d+)$")
  local digits, exp = (d1 .. rest):gsub("0+$", ""), tonumber(e)
  if digits == "" then digits = "0" end
  if exp < -4 or exp >= 16 then
    local mant = digits:sub(1, 1) .. (#digits > 1 and "." .. digits:sub(2) or "")
    return fmt("%s%se%s%02d", sign, mant, exp < 0 and "-" or "+", abs(exp))
  end
  local body
  if exp < 0 then
    body = "0." .. string.rep("0", -exp - 1) .. digits
  elseif #digits <= exp + 1 then
    body = digits .. string.rep("0", exp + 1 - #digits) .. ".0"
  else
    body = digits:sub(1, exp + 1) .. "." .. digits:sub(exp + 2)
  end
  return sign .. body
end

-- A value as Python's csv.writer prints it: a Python int as an integer, a float as its repr.
local function cell(v, is_int)
  if is_int then return fmt("%d", v) end
  return M.py_float(v)
end

local Writer = {}
Writer.__index = Writer

-- A writer of DeepSpeed's csv_monitor files under log_dir (one CSV per tag).
function M.new(log_dir)
  require("zrun")._C.makedirs(log_dir)
  return setmetatable({ log_dir = log_dir, started = {} }, Writer)
end

-- One event (tag, value, step); is_int: the value is a Python int in DeepSpeed (the initial loss scale).
function Writer:write(tag, value, step, is_int)
  local header = tag:match("([^/]*)$")
  local name = tag:gsub("/", "_"):gsub(" ", "_")
  local path = self.log_dir .. "/" .. name .. ".csv"
  local f, err = io.open(path, "ab")
  if not f then error("csv_monitor: cannot write " .. tostring(err), 0) end
  if not self.started[name] then
    self.started[name] = true
    f:write("step,", header, "\r\n")
  end
  f:write(fmt("%d", floor(step)), ",", cell(value, is_int), "\r\n")
  f:close()
end

return M
