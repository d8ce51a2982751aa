-- A run's curves as one self-contained SVG (no script, no external font or style sheet): small
-- multiples on a grid, each with a frame, nice ticks on both axes, grid lines, axis labels, the
-- series as polylines and a legend with the last values. Every panel shares the step axis.
-- Coordinates are absolute (no transforms), so a point's pixel maps back to its data through the
-- tick labels (tests/lua/test_plot.lua does exactly that).
local P = require "zrun.plot"
local M = {}

local fmt, concat, max, floor = string.format, table.concat, math.max, math.floor

M.PANEL_W, M.PANEL_H = 340, 240              -- one panel's cell
M.LEFT, M.RIGHT, M.TOP, M.BOTTOM = 64, 16, 46, 42 -- the plot area's margins inside the cell
M.PAD, M.HEAD = 16, 58                       -- the page's padding and title block
local COLORS = { "#1f6fb4", "#d9480f", "#2f9e44", "#7048e8" }
local FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"

local function esc(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end
local function n2(v) return fmt("%.2f", v) end

local function text(out, x, y, s, attrs)
  out[#out + 1] = fmt('<text x="%s" y="%s"%s>%s</text>', n2(x), n2(y), attrs or "", esc(s))
end
local function line(out, x1, y1, x2, y2, class)
  out[#out + 1] = fmt('<line class="%s" x1="%s" y1="%s" x2="%s" y2="%s"/>', class, n2(x1), n2(y1), n2(x2), n2(y2))
end

-- The layout: columns and rows for n panels, the page size.
function M.layout(n)
  local cols = n >= 5 and 3 or (n >= 2 and 2 or 1)
  local rows = math.ceil(n / cols)
  return cols, rows, 2 * M.PAD + cols * M.PANEL_W, M.HEAD + M.PAD + rows * M.PANEL_H
end

local function panel(out, p, cx, cy, xt, xlo, xhi, resumes)
  local x0, y0 = cx + M.LEFT, cy + M.TOP
  local w, h = M.PANEL_W - M.LEFT - M.RIGHT, M.PANEL_H - M.TOP - M.BOTTOM
  local div, ylabel = 1, p.ylabel
  if p.bytes then
    local top = 0
    for _, s in ipairs(p.series) do for _, v in ipairs(s.ys) do top = max(top, math.abs(v)) end end
    div, ylabel = P.byte_unit(top)
    ylabel = "memory (" .. ylabel .. ")"
  end
  local lo, hi = math.huge, -math.huge
  for _, s in ipairs(p.series) do
    for _, v in ipairs(s.ys) do lo, hi = math.min(lo, v / div), max(hi, v / div) end
  end
  local yt, ystep = P.ticks(lo, hi, 5)
  local ylo, yhi = yt[1], yt[#yt]
  local function px(x) return x0 + (x - xlo) / (xhi - xlo) * w end
  local function py(y) return y0 + h - (y - ylo) / (yhi - ylo) * h end

  out[#out + 1] = fmt('<g class="panel" id="panel-%s">', p.key)
  text(out, x0, cy + 18, p.title, ' class="title"')
  -- legend under the title: a swatch and the last value per series
  local lx = x0
  for si, s in ipairs(p.series) do
    local label = (s.label and s.label .. " " or "last ") .. P.value(s.ys[#s.ys], p.bytes)
    out[#out + 1] = fmt('<line class="swatch" x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s"/>', n2(lx), n2(cy + 32),
      n2(lx + 14), n2(cy + 32), COLORS[si])
    text(out, lx + 19, cy + 36, label, ' class="legend"')
    lx = lx + 19 + #label * 6.4 + 16
  end
  out[#out + 1] = fmt('<rect class="frame" x="%s" y="%s" width="%s" height="%s"/>', n2(x0), n2(y0), n2(w), n2(h))
  for _, v in ipairs(yt) do
    local y = py(v)
    if v ~= ylo and v ~= yhi then line(out, x0, y, x0 + w, y, "grid") end
    line(out, x0 - 4, y, x0, y, "tick")
    text(out, x0 - 7, y + 4, P.label(v, ystep, max(math.abs(ylo), math.abs(yhi))),
      fmt(' class="ytick" text-anchor="end" data-value="%.17g"', v * div))
  end
  local xstep = xt[2] and xt[2] - xt[1] or 1
  for _, v in ipairs(xt) do
    local x = px(v)
    if v ~= xlo and v ~= xhi then line(out, x, y0, x, y0 + h, "grid") end
    line(out, x, y0 + h, x, y0 + h + 4, "tick")
    text(out, x, y0 + h + 17, P.label(v, xstep), fmt(' class="xtick" text-anchor="middle" data-value="%.17g"', v))
  end
  text(out, x0 + w / 2, y0 + h + 34, "step", ' class="xlabel" text-anchor="middle"')
  local ly = y0 + h / 2
  text(out, cx + 14, ly, ylabel, fmt(' class="ylabel" text-anchor="middle" transform="rotate(-90 %s %s)"', n2(cx + 14), n2(ly)))
  for _, r in ipairs(resumes or {}) do
    if r >= xlo and r <= xhi then
      out[#out + 1] = fmt('<line class="resume" x1="%s" y1="%s" x2="%s" y2="%s">' ..
        '<title>resumed from the checkpoint of step %d</title></line>',
        n2(px(r)), n2(y0), n2(px(r)), n2(y0 + h), r)
    end
  end
  for si, s in ipairs(p.series) do
    local pts = {}
    for k = 1, #s.xs do pts[k] = n2(px(s.xs[k])) .. "," .. n2(py(s.ys[k] / div)) end
    out[#out + 1] = fmt('<polyline class="series" data-field="%s" stroke="%s" points="%s"/>', s.field, COLORS[si],
      concat(pts, " "))
    if s.markers or #s.xs == 1 then
      for k = 1, #s.xs do
        out[#out + 1] = fmt('<circle class="marker" cx="%s" cy="%s" r="2.6" fill="%s"/>', n2(px(s.xs[k])),
          n2(py(s.ys[k] / div)), COLORS[si])
      end
    end
  end
  out[#out + 1] = "</g>"
end

-- The SVG document for run ({header=, records=, resumes=, path=}).
function M.render(run)
  local panels, xmin, xmax = P.panels(run.records)
  if #panels == 0 then error("zrun plot: no logged steps to draw (records need a step and a loss)", 0) end
  local cols, _, W, H = M.layout(#panels)
  -- the step axis starts at a tick and ends at the last step (no empty stretch after it)
  local ticks = P.ticks(xmin, xmax, 5, true)
  local xlo, xhi = ticks[1], xmax > ticks[1] and xmax or ticks[#ticks]
  local xt = {}
  for _, v in ipairs(ticks) do if v <= xhi then xt[#xt + 1] = v end end
  local h = run.header or {}
  local title = "zrun run " .. (h.run_id or "") .. (run.path and " — " .. run.path or "")
  local out = {
    fmt('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s">', W, H, W, H, FONT),
    "<title>" .. esc(title) .. "</title>",
    "<style>text{fill:#222;font-size:11px}.title{font-size:13px;font-weight:bold}.legend{fill:#444}" ..
      ".head{font-size:17px;font-weight:bold}.sub{fill:#555;font-size:12px}" ..
      ".frame{fill:none;stroke:#888;stroke-width:1}.grid{stroke:#e6e6e6;stroke-width:1}.tick,.swatch{stroke-width:1}" ..
      ".tick{stroke:#888}.swatch{stroke-width:2.5}.resume{stroke:#999;stroke-width:1;stroke-dasharray:4 3}" ..
      ".series{fill:none;stroke-width:1.6;stroke-linejoin:round;stroke-linecap:round}</style>",
    fmt('<rect class="background" width="%d" height="%d" fill="#fff"/>', W, H),
  }
  text(out, M.PAD, 28, title, ' class="head"')
  text(out, M.PAD, 47, P.subtitle(run), ' class="sub"')
  for i, p in ipairs(panels) do
    local c, r = (i - 1) % cols, floor((i - 1) / cols)
    panel(out, p, M.PAD + c * M.PANEL_W, M.HEAD + r * M.PANEL_H, xt, xlo, xhi, run.resumes)
  end
  out[#out + 1] = "</svg>\n"
  return concat(out, "\n")
end

return M
