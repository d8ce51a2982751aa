-- A run's curves as text for the terminal: one small chart per series, drawn in braille dots
-- (2x4 dots a character) when the terminal is UTF-8, in '*' on plain ASCII otherwise. The top
-- row is the series' maximum, the bottom row its minimum, the left column its first step.
local P = require "zrun.plot"
local M = {}

local fmt, floor, max, min, rep, concat, char = string.format, math.floor, math.max, math.min, string.rep, table.concat,
  string.char

-- UTF-8 of the braille character with dot bits `bits` (U+2800 + bits).
local function braille(bits) return char(0xE2, 0xA0 + floor(bits / 64), 0x80 + bits % 64) end
-- bit of the dot at column c (0, 1) and row r (0..3) of a cell
local DOT = { [0] = { [0] = 0x01, 0x02, 0x04, 0x40 }, [1] = { [0] = 0x08, 0x10, 0x20, 0x80 } }

-- The canvas for xs, ys: cols x rows characters, `sub_x` x `sub_y` dots each; returns the rows as
-- strings. Consecutive points are joined (Bresenham) so the curve reads as a line.
function M.canvas(xs, ys, cols, rows, ascii)
  local sx, sy = ascii and 1 or 2, ascii and 1 or 4
  local W, H = cols * sx, rows * sy
  local xlo, xhi, ylo, yhi = math.huge, -math.huge, math.huge, -math.huge
  for k = 1, #xs do
    xlo, xhi, ylo, yhi = min(xlo, xs[k]), max(xhi, xs[k]), min(ylo, ys[k]), max(yhi, ys[k])
  end
  local dots = {}
  local function set(x, y) dots[y * W + x] = true end
  local function at(k)
    local x = xhi > xlo and floor((xs[k] - xlo) / (xhi - xlo) * (W - 1) + 0.5) or 0
    local y = yhi > ylo and floor((yhi - ys[k]) / (yhi - ylo) * (H - 1) + 0.5) or floor((H - 1) / 2)
    return x, y
  end
  local px, py = at(1)
  set(px, py)
  for k = 2, #xs do
    local x, y = at(k)
    local dx, dy = math.abs(x - px), -math.abs(y - py)
    local stx, sty = px < x and 1 or -1, py < y and 1 or -1
    local err = dx + dy
    while true do
      set(px, py)
      if px == x and py == y then break end
      local e2 = 2 * err
      if e2 >= dy then err, px = err + dy, px + stx end
      if e2 <= dx then err, py = err + dx, py + sty end
    end
  end
  local lines = {}
  for r = 0, rows - 1 do
    local cells = {}
    for c = 0, cols - 1 do
      if ascii then
        cells[#cells + 1] = dots[r * W + c] and "*" or " "
      else
        local bits = 0
        for dc = 0, 1 do
          for dr = 0, 3 do
            if dots[(r * 4 + dr) * W + c * 2 + dc] then bits = bits + DOT[dc][dr] end
          end
        end
        cells[#cells + 1] = bits > 0 and braille(bits) or " "
      end
    end
    lines[#lines + 1] = (concat(cells):gsub("%s+$", ""))
  end
  return lines
end

-- The chart of one series: a title line, `rows` rows with the max/min labels on the axis, the
-- step axis. opts: width (columns of the whole chart, default 72), rows (4), ascii.
function M.chart(title, xs, ys, bytes, opts)
  opts = opts or {}
  local rows, width = opts.rows or 4, opts.width or 72
  local hi, lo = -math.huge, math.huge
  for _, v in ipairs(ys) do hi, lo = max(hi, v), min(lo, v) end
  local top, bottom = P.value(hi, bytes), P.value(lo, bytes)
  local lw = max(#top, #bottom)
  local cols = max(width - lw - 2, 10)
  local canvas = M.canvas(xs, ys, cols, rows, opts.ascii)
  local tee, bar, corner, dash = "┤", "│", "└", "─"
  if opts.ascii then tee, bar, corner, dash = "+", "|", "+", "-" end
  local out = { fmt("%s  (%d points, last %s)", title, #xs, P.value(ys[#ys], bytes)) }
  for r = 1, rows do
    local label = r == 1 and top or (r == rows and bottom or "")
    out[#out + 1] = fmt("%" .. lw .. "s %s%s", label, (r == 1 or r == rows) and tee or bar, canvas[r])
  end
  out[#out + 1] = rep(" ", lw + 1) .. corner .. rep(dash, cols)
  local first, last = fmt("%d", xs[1]), fmt("%d step", xs[#xs])
  out[#out + 1] = rep(" ", lw + 2) .. first .. rep(" ", max(1, cols - #first - #last)) .. last
  return concat(out, "\n")
end

-- Display columns of a UTF-8 string (every character here is one column wide).
local function columns(s) return #s - select(2, s:gsub("[\128-\191]", "")) end

-- Every series of the run as a chart, two side by side when the width allows. opts: ascii
-- (default: not a UTF-8 locale), width (default the terminal's, else 80), rows.
function M.render(run, opts)
  opts = opts or {}
  local total = opts.width or require("zrun._C").terminal_width(1) or 80
  local two = total >= 2 * 56 + 3
  local o = { width = two and min(floor((total - 3) / 2), 72) or min(total, 72), rows = opts.rows, ascii = opts.ascii }
  if o.ascii == nil then o.ascii = not require("zrun.progress").utf8_locale() end
  local panels = P.panels(run.records)
  if #panels == 0 then return "(no logged steps to draw yet)\n" end
  local h = run.header or {}
  local out = { fmt("zrun run %s%s", h.run_id or "", run.path and " (" .. run.path .. ")" or "") }
  local sub = P.subtitle(run)
  if sub ~= "" then out[#out + 1] = sub end
  local charts = {}
  for _, p in ipairs(panels) do
    for _, s in ipairs(p.series) do
      local title = p.title .. (#p.series > 1 and " (" .. s.label .. ")" or "")
      local lines = {}
      for l in (M.chart(title, s.xs, s.ys, p.bytes, o) .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
      charts[#charts + 1] = lines
    end
  end
  local step = two and 2 or 1
  for i = 1, #charts, step do
    out[#out + 1] = ""
    local a, b = charts[i], two and charts[i + 1]
    for k = 1, #a do
      local l = a[k]
      if b and b[k] then l = l .. rep(" ", o.width + 3 - columns(l)) .. b[k] end
      out[#out + 1] = (l:gsub("%s+$", ""))
    end
  end
  return concat(out, "\n") .. "\n"
end

return M
