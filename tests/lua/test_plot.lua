-- zrun plot: the SVG's structure read back as a person reads the picture (tick labels name the
-- values at their positions, up is larger, every polyline point lands where its record says), the
-- nice ticks and their labels, the braille / ASCII text chart's orientation and dot layout, and
-- the `zrun plot` command and zr.plot() with their errors.
local zr = require "zrun"
local T = zr.testing
local P = require "zrun.plot"
local svg = require "zrun.plot_svg"
local text = require "zrun.plot_text"
local cjson = require "cjson"

local bin = os.getenv("ZRUN_BIN") or "./zrun"
local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1; echo \"exit=$?\"")
  local out = f:read("*a")
  f:close()
  local code = tonumber(out:match("exit=(%d+)\n$"))
  return out:gsub("exit=%d+\n$", ""), code
end
local function has(out, s, what) if not out:find(s, 1, true) then error(what .. ": '" .. s .. "' not in:\n" .. out, 0) end end

-- 25 logged steps with every metric, an evaluation every 5 steps, the final summary record
local MiB = 2 ^ 20
local function records(with_eval)
  local recs = {}
  for s = 1, 25 do
    recs[#recs + 1] = { step = s, epoch = s / 25, loss = 4 * math.exp(-s / 10) + 0.5, learning_rate = 3e-4 * math.min(1, s / 5),
      tokens_per_s = 11000 + 300 * s + (s % 4) * 900, grad_norm = 1 + (s % 3) * 0.25, memory = 300 * MiB + s * MiB,
      peak_memory = 420 * MiB }
    if with_eval and s % 5 == 0 then
      recs[#recs + 1] = { step = s, eval_loss = 4 * math.exp(-s / 12) + 0.7, eval_perplexity = math.exp(4 * math.exp(-s / 12) + 0.7) }
    end
  end
  recs[#recs + 1] = { step = 25, train_loss = 1.5, train_runtime = 10 }
  return recs
end

-- The label's number: k/M/G suffixes, e-notation; a byte panel's labels are in its unit.
local function label_value(s)
  local num, suf = s:match("^(%-?[%d.e%-]+)([kMG]?)$")
  return tonumber(num) * (({ k = 1e3, M = 1e6, G = 1e9 })[suf] or 1)
end

-- Every panel of an SVG: frame, ticks (value, pixel, label), polylines, markers, resume lines.
local function parse(doc)
  local panels = {}
  for id, body in doc:gmatch('<g class="panel" id="panel%-([%w_]+)">(.-)</g>') do
    local p = { id = id, xt = {}, yt = {}, lines = {}, resumes = {} }
    local x, y, w, h = body:match('<rect class="frame" x="([^"]+)" y="([^"]+)" width="([^"]+)" height="([^"]+)"/>')
    p.frame = { x = tonumber(x), y = tonumber(y), w = tonumber(w), h = tonumber(h) }
    for x1, y1, x2, y2, axis, value, label in body:gmatch('<line class="tick" x1="([^"]+)" y1="([^"]+)" x2="([^"]+)" ' ..
      'y2="([^"]+)"/>\n<text [^>]*class="(%a)tick"[^>]*data%-value="([^"]+)">([^<]*)</text>') do
      local t = { value = tonumber(value), label = label }
      if axis == "y" then t.px = tonumber(y1); assert(y1 == y2, "a y tick is horizontal"); p.yt[#p.yt + 1] = t
      else t.px = tonumber(x1); assert(x1 == x2, "an x tick is vertical"); p.xt[#p.xt + 1] = t end
    end
    for field, pts in body:gmatch('<polyline class="series" data%-field="([%w_]+)"[^>]*points="([^"]*)"') do
      local xy = {}
      for a, b in pts:gmatch("([%d.%-]+),([%d.%-]+)") do xy[#xy + 1] = { tonumber(a), tonumber(b) } end
      p.lines[field] = xy
    end
    for rx in body:gmatch('<line class="resume" x1="([^"]+)"') do p.resumes[#p.resumes + 1] = tonumber(rx) end
    panels[id] = p
    panels[#panels + 1] = p
  end
  return panels
end

-- The data value at pixel px on an axis, read from its first and last ticks (as a person would).
local function invert(ticks, px)
  local a, b = ticks[1], ticks[#ticks]
  return a.value + (px - a.px) * (b.value - a.value) / (b.px - a.px)
end

local FIELDS = { loss = { "loss", "eval_loss" }, learning_rate = { "learning_rate" }, tokens_per_s = { "tokens_per_s" },
  grad_norm = { "grad_norm" }, memory = { "memory", "peak_memory" }, eval_perplexity = { "eval_perplexity" } }

T.test("SVG: each panel's ticks read as its axes, and every point maps back to its record", function()
  local recs = records(true)
  local doc = svg.render({ header = { run_id = "r1", world_size = 2, zero_stage = 3, precision = "bf16" },
    records = recs, resumes = { 10 }, path = "out/a&b" })
  assert(doc:match("^<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d+\" height=\"%d+\""), doc:sub(1, 200))
  assert(doc:match("</svg>\n$"), "the document ends with </svg>")
  T.eq(select(2, doc:gsub("<g ", "")), select(2, doc:gsub("</g>", "")), "groups balanced")
  has(doc, "out/a&amp;b", "text is escaped")
  assert(not doc:find("<script") and not doc:find("href="), "self-contained: no script, no link")
  has(doc, "2 ranks, ZeRO stage 3, bf16", "the subtitle says how it trained")
  local panels = parse(doc)
  local order = {}
  for _, p in ipairs(panels) do order[#order + 1] = p.id end
  T.eq(table.concat(order, ","), "loss,learning_rate,tokens_per_s,grad_norm,memory,eval_perplexity")
  for _, p in ipairs(panels) do
    local f = p.frame
    assert(#p.yt >= 3 and #p.xt >= 3, p.id .. ": at least 3 ticks per axis")
    for i = 2, #p.yt do
      assert(p.yt[i].value > p.yt[i - 1].value and p.yt[i].px < p.yt[i - 1].px, p.id .. ": larger values higher up")
    end
    for i = 2, #p.xt do
      assert(p.xt[i].value > p.xt[i - 1].value and p.xt[i].px > p.xt[i - 1].px, p.id .. ": later steps to the right")
    end
    T.near(p.yt[1].px, f.y + f.h, 1e-9, 0, p.id .. ": the lowest tick on the frame's bottom")
    T.near(p.yt[#p.yt].px, f.y, 1e-9, 0, p.id .. ": the highest on its top")
    T.near(p.xt[1].px, f.x, 1e-9, 0, p.id .. ": the first step tick on the frame's left")
    assert(p.xt[#p.xt].px <= f.x + f.w + 1e-9, p.id .. ": the last step tick inside the frame")
    T.near(invert(p.xt, f.x + f.w), 25, 0.02 * (p.xt[#p.xt].value - p.xt[1].value) / f.w, 0,
      p.id .. ": the frame's right edge is the last step")
    -- the labels say the values at their positions (a byte panel's labels are in one binary unit)
    local unit = p.id == "memory" and p.yt[2].value / label_value(p.yt[2].label) or 1
    if p.id == "memory" then T.eq(unit, MiB, "memory is labelled in MiB") end
    for _, t in ipairs(p.yt) do T.near(label_value(t.label) * unit, t.value, 1e-9, 1e-12, p.id .. " y label " .. t.label) end
    for _, t in ipairs(p.xt) do T.eq(label_value(t.label), t.value, p.id .. " x label") end
    local ylo, yhi = p.yt[1].value, p.yt[#p.yt].value
    for _, field in ipairs(FIELDS[p.id]) do
      local pts = p.lines[field]
      assert(pts, p.id .. ": no polyline for " .. field)
      local k = 0
      for _, r in ipairs(recs) do
        if r[field] then
          k = k + 1
          local x, y = pts[k][1], pts[k][2]
          assert(x >= f.x - 1e-6 and x <= f.x + f.w + 1e-6 and y >= f.y - 1e-6 and y <= f.y + f.h + 1e-6,
            p.id .. ": a point outside the frame")
          -- within 0.02 px (coordinates are written to 0.01 px)
          T.near(invert(p.xt, x), r.step, 0.02 * (p.xt[#p.xt].value - p.xt[1].value) / f.w, 0, field .. " step")
          T.near(invert(p.yt, y), r[field], 0.02 * (yhi - ylo) / f.h, 0, field .. " at step " .. r.step)
        end
      end
      T.eq(#pts, k, p.id .. ": one point per record with " .. field)
    end
    T.eq(#p.resumes, 1, p.id .. ": the resume line")
    T.near(invert(p.xt, p.resumes[1]), 10, 0.02 * (p.xt[#p.xt].value - p.xt[1].value) / f.w, 0, "the resume line at step 10")
  end
  T.eq(select(2, doc:gsub('class="marker"', "")), 10, "markers on the 5 evaluations of each eval series")
end)

T.test("SVG: panels without data are left out; one point still draws", function()
  local panels = parse(svg.render({ records = records(false) }))
  T.eq(#panels, 5)
  assert(not panels.eval_perplexity and not panels.loss.lines.eval_loss, "no evaluation: no eval panel, no eval line")
  local one = svg.render({ records = { { step = 3, loss = 2.5 } } })
  local p = parse(one).loss
  T.near(invert(p.yt, p.lines.loss[1][2]), 2.5, 0, 1e-3)
  has(one, 'class="marker"', "a lone point gets a marker")
  T.raises(function() svg.render({ records = { { run_id = "x" } } }) end, "no logged steps to draw")
end)

T.test("ticks: 1-2-5 steps covering the range; labels with the digits the step needs", function()
  local t, step = P.ticks(0.53, 4.1, 4)
  T.eq(table.concat(t, ","), "0,1,2,3,4,5")
  T.eq(step, 1)
  t = P.ticks(1, 25, 5, true)
  T.eq(table.concat(t, ","), "0,5,10,15,20,25")
  t = P.ticks(3, 3, 5, true)
  assert(t[1] < 3 and t[#t] > 3, "a flat range is widened")
  t = P.ticks(1, 2, 5, true)
  T.eq(table.concat(t, ","), "1,2", "steps are whole")
  T.eq(P.label(0.25, 0.05), "0.25")
  T.eq(P.label(2, 0.5), "2.0")
  T.eq(P.label(3e-4, 1e-4), "3e-4")
  T.eq(P.label(2.5e-5, 5e-6), "2.5e-5")
  T.eq(P.label(15000, 5000), "15k")
  T.eq(P.label(1.5e6, 5e5), "1.5M")
  T.eq(P.label(0, 1), "0")
  T.eq(P.value(3 * MiB, true), "3 MiB")
end)

T.test("text chart: braille dots in the right places, max on top, ASCII on a plain terminal", function()
  -- two cells, 2x4 dots each: a descending diagonal from the top-left to the bottom-right dot
  T.eq(text.canvas({ 1, 2 }, { 2, 1 }, 2, 1)[1], "⠑⢄")
  local rising = text.canvas({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, 10, 4, true)
  T.eq(rising[1], "        **", "the top row holds the largest values, at the right")
  T.eq(rising[4], "**", "the bottom row the smallest, at the left (trailing blanks trimmed)")
  local c = text.chart("loss", { 1, 50 }, { 3.5, 1.25 }, false, { width = 40, ascii = true })
  local lines = {}
  for l in c:gmatch("[^\n]+") do lines[#lines + 1] = l end
  T.eq(lines[1], "loss  (2 points, last 1.25)")
  assert(lines[2]:find("^ 3.5 %+%*"), "the max labels the top row: " .. lines[2])
  assert(lines[5]:find("^1.25 %+") and lines[5]:find("%*$"), "the min the bottom row: " .. lines[5])
  assert(lines[7]:find("^      1 +50 step$"), "the step axis: " .. lines[7])
  local all = text.render({ records = records(true) }, { ascii = true, width = 80 })
  assert(not all:find("[\128-\255]"), "ASCII only")
  for _, t in ipairs { "loss (train)", "loss (eval)", "learning rate", "tokens/s", "gradient norm", "memory (peak)", "eval perplexity" } do
    has(all, t, "a chart per series")
  end
  local wide = text.render({ records = records(true) }, { ascii = false, width = 150 })
  has(wide, "┤", "box drawing on UTF-8")
  local first = wide:match("\n\n([^\n]+)")
  assert(first:find("loss %(train%).*loss %(eval%)"), "two charts side by side on a wide terminal: " .. first)
end)

T.test("zrun plot DIR and zr.plot(): the SVG beside the metrics, the chart, one-line errors", function()
  local dir = os.tmpname()
  os.remove(dir)
  os.execute("mkdir -p " .. dir)
  local f = assert(io.open(dir .. "/metrics.jsonl", "w"))
  f:write(cjson.encode({ run_id = "20260101-000000-1", world_size = 1 }), "\n")
  for _, r in ipairs(records(true)) do f:write(cjson.encode(r), "\n") end
  f:close()
  local out, code = sh("LANG=C " .. bin .. " plot " .. dir)
  T.eq(code, 0, out)
  has(out, "wrote " .. dir .. "/metrics.svg (6 panels, steps 1 to 25)", "says where the SVG is")
  has(out, "zrun run 20260101-000000-1", "the chart's title")
  assert(not out:find("[\128-\255]"), "ASCII when the locale is not UTF-8")
  local s = assert(io.open(dir .. "/metrics.svg")):read("*a")
  T.eq(#parse(s), 6)
  out = sh(bin .. " plot " .. dir .. "/metrics.jsonl --out " .. dir .. "/x.svg --no-text")
  has(out, "wrote " .. dir .. "/x.svg", "--out")
  assert(not out:find("zrun run"), "--no-text")
  out = sh("LANG=C.UTF-8 " .. bin .. " -e 'zr = require \"zrun\"; zr.plot(\"" .. dir .. "\")'")
  has(out, "⣀", "zr.plot(dir) prints the braille chart")
  for cmd, msg in pairs {
    [""] = "zrun plot: which run?",
    [" /nowhere/run"] = "no metrics file /nowhere/run/metrics.jsonl",
    [" " .. dir .. " --bogus"] = "unknown option --bogus",
    [" a b"] = "one run at a time",
    [" " .. dir .. " --width abc"] = "zrun plot: --width must be a whole number of columns >= 20, got abc",
    [" " .. dir .. "/metrics.svg"] = "zrun plot: " .. dir .. "/metrics.svg is a file, not a run: pass the run's output_dir",
  } do
    local o, c = sh(bin .. " plot" .. cmd)
    T.eq(c, 1, cmd)
    has(o, msg, "zrun plot" .. cmd)
    T.eq(select(2, o:gsub("\n", "")), 1, "one line: " .. o)
  end
  f = assert(io.open(dir .. "/metrics.jsonl", "w"))
  f:write(cjson.encode({ run_id = "r" }), "\n")
  f:close()
  has(sh(bin .. " plot " .. dir), "has no logged steps yet", "a run that has not logged")
  has(sh(bin .. " -e 'require(\"zrun\").plot()'"), "no Trainer has run in this session", "zr.plot() with no run")
  os.execute("rm -rf '" .. dir .. "'")
end)

T.done()
