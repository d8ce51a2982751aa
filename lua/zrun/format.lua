-- Small formatters shared by the memory modules (and anything that prints sizes), so that those
-- modules need not require each other:
--   format.human(1536) -> "1.50 KiB"
local M = {}

-- Bytes in binary units with two decimals ("1.50 GiB"), whole bytes below 1 KiB ("512 B").
function M.human(b)
  local units = { "B", "KiB", "MiB", "GiB", "TiB" }
  local i = 1
  while math.abs(b) >= 1024 and i < #units do b = b / 1024; i = i + 1 end
  return i == 1 and ("%d B"):format(b) or ("%.2f %s"):format(b, units[i])
end

return M
