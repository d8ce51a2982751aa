-- Small formatters shared by the memory modules (and anything that prints sizes), so that those
-- modules need not require each other:
--   format.human(1536) -> "1.50 KiB"
local M = {}

function M.human(b)
  local units = { "B", "KiB", "MiB", "GiB", "TiB" }
  local i = 1
  while math.abs(b) >= 1024 and i < #units do b = b / 1024; i = i + 1 end
  return i == 1 and ("%d B"):format(b) or ("%.2f %s"):format(b, units[i])
end

return M
