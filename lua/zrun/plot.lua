-- `zrun plot RUN_DIR` and zr.plot(): a run's curves from its metrics.jsonl (loss, learning rate,
-- tokens/s, gradient norm, memory; eval loss and perplexity when logged) as one self-contained SVG
-- (zrun.plot_svg) and a compact text chart for the terminal (zrun.plot_text). This file holds what
-- both share: the panels, the series taken from the records, and nice axis ticks.
--   zrun plot output                      -- writes output/metrics.svg, prints the text chart
--   zr.plot()  /  trainer:plot()          -- in the REPL: the latest Trainer's run
local M = {}

local fmt, floor, ceil, log10, abs, max, min = string.format, math.floor, math.ceil, math.log10, math.abs, math.max, math.min

-- The panels, in order. A panel whose series have no finite value is left out.
M.PANELS = {
  { key = "loss", title = "loss", ylabel = "loss (nats)",
    series = { { field = "loss", label = "train" }, { field = "eval_loss", label = "eval", markers = true } } },
  { key = "learning_rate", title = "learning rate", ylabel = "lr", series = { { field = "learning_rate" } } },
  { key = "tokens_per_s", title = "tokens/s", ylabel = "tokens/s", series = { { field = "tokens_per_s" } } },
  { key = "grad_norm", title = "gradient norm", ylabel = "norm", series = { { field = "grad_norm" } } },
  { key = "memory", title = "memory", ylabel = "bytes", bytes = true,
    series = { { field = "memory", label = "current" }, { field = "peak_memory", label = "peak" } } },
  { key = "eval_perplexity", title = "eval perplexity", ylabel = "perplexity",
    series = { { field = "eval_perplexity", markers = true } } },
}

local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end

-- The panels with data: each {key, title, ylabel, bytes, series = {{field, label, markers, xs, ys}}},
-- and the step range over all of them (xmin, xmax).
function M.panels(records)
  local out, xmin, xmax = {}, math.huge, -math.huge
  for _, p in ipairs(M.PANELS) do
    local panel = { key = p.key, title = p.title, ylabel = p.ylabel, bytes = p.bytes, series = {} }
    for _, s in ipairs(p.series) do
      local xs, ys = {}, {}
      for _, r in ipairs(records) do
        local v = r[s.field]
        if finite(r.step) and finite(v) then
          xs[#xs + 1], ys[#ys + 1] = r.step, v
        end
      end
      if #xs > 0 then
        panel.series[#panel.series + 1] = { field = s.field, label = s.label, markers = s.markers, xs = xs, ys = ys }
        for _, x in ipairs(xs) do xmin, xmax = min(xmin, x), max(xmax, x) end
      end
    end
    if #panel.series > 0 then out[#out + 1] = panel end
  end
  return out, xmin, xmax
end

-- Nice ticks covering [lo, hi]: about n steps of 1, 2 or 5 x 10^k. Returns the ticks (first <= lo,
-- last >= hi) and the step. A flat range is widened around its value.
function M.ticks(lo, hi, n, integer)
  n = n or 5
  if hi < lo then lo, hi = hi, lo end
  if hi - lo < 1e-12 * max(abs(lo), abs(hi), 1e-300) then
    local d = abs(lo) > 0 and abs(lo) * 0.1 or 1
    if integer then d = max(1, ceil(d)) end
    lo, hi = lo - d, hi + d
  end
  local raw = (hi - lo) / n
  local e = floor(log10(raw))
  local f = raw / 10 ^ e
  local nice = f <= 1 and 1 or f <= 2 and 2 or f <= 5 and 5 or 10
  local step = nice * 10 ^ e
  if integer and step < 1 then step = 1 end
  local first, last = floor(lo / step + 1e-9), ceil(hi / step - 1e-9)
  local t = {}
  for k = first, last do
    local v = k * step
    if abs(v) < step * 1e-9 then v = 0 end
    t[#t + 1] = v
  end
  return t, step
end

local BYTE_UNITS = { { 2 ^ 40, "TiB" }, { 2 ^ 30, "GiB" }, { 2 ^ 20, "MiB" }, { 2 ^ 10, "KiB" }, { 1, "B" } }
-- The unit that shows bytes up to `top` best: divisor, name.
function M.byte_unit(top)
  for _, u in ipairs(BYTE_UNITS) do if top >= u[1] then return u[1], u[2] end end
  return 1, "B"
end

-- A tick label: as few digits as the step needs; k/M suffixes for large values, e-notation for small
-- (with the exponent of `top`, the axis' largest magnitude, so an axis' labels share it).
function M.label(v, step, top)
  if v == 0 then return "0" end
  local a = abs(v)
  if a >= 1e4 then
    local div, suf = 1e3, "k"
    if a >= 1e6 then div, suf = 1e6, "M" end
    if a >= 1e9 then div, suf = 1e9, "G" end
    local d = max(0, -floor(log10(step / div) + 1e-9))
    return fmt("%." .. fmt("%d", d) .. "f%s", v / div, suf)
  end
  if (top or a) < 1e-2 then
    local e = floor(log10(top or a) + 1e-9)
    local d = max(0, e - floor(log10(step) + 1e-9))
    return fmt("%." .. fmt("%d", min(d, 6)) .. "fe%d", v / 10 ^ e, e)
  end
  local d = max(0, -floor(log10(step) + 1e-9))
  return fmt("%." .. fmt("%d", min(d, 8)) .. "f", v)
end

-- A value as text with 4 significant digits (bytes in their unit).
function M.value(v, bytes)
  if bytes then
    local div, unit = M.byte_unit(abs(v))
    return fmt("%.4g %s", v / div, unit)
  end
  local a = abs(v)
  if a >= 1e9 then return fmt("%.4gG", v / 1e9) elseif a >= 1e6 then return fmt("%.4gM", v / 1e6)
  elseif a >= 1e4 then return fmt("%.4gk", v / 1e3) end
  return fmt("%.4g", v)
end

-- The run to draw from x: a run folder or metrics file (string), a Trainer, or a list of records.
-- Returns {header=, records=, resumes=, path=}.
function M.run_of(x)
  if x == nil then
    local T = package.loaded["zrun.trainer"]
    x = T and (T.last[1] or T.last_output_dir)
    if not x then
      error("zr.plot(): no Trainer has run in this session; pass a run's output_dir: zr.plot(\"output\")", 0)
    end
  end
  if type(x) == "string" then return require("zrun.metrics").load(x) end
  if type(x) == "table" and x.state and x.state.log_history then
    local dir = x.args and x.args.output_dir
    local header = dir and require("zrun.metrics").read_header(dir .. "/metrics.jsonl") or nil
    return { header = header, records = x.state.log_history, resumes = {}, path = dir }
  end
  if type(x) == "table" then return { records = x, resumes = {} } end
  error("zr.plot(x): x is a run's output_dir, a metrics.jsonl, a Trainer or a list of records, got " .. type(x), 0)
end

-- The title line: the run id, where, and how it trained.
function M.subtitle(run)
  local h = run.header or {}
  local parts = {}
  if h.model then parts[#parts + 1] = h.model end
  if h.world_size then parts[#parts + 1] = h.world_size .. (h.world_size == 1 and " rank" or " ranks") end
  if h.zero_stage then parts[#parts + 1] = "ZeRO stage " .. h.zero_stage end
  if h.precision then parts[#parts + 1] = h.precision end
  if h.start_time then parts[#parts + 1] = "started " .. h.start_time end
  for _, s in ipairs(run.resumes or {}) do parts[#parts + 1] = "resumed at step " .. s end
  return table.concat(parts, ", ")
end

-- Draws x (see run_of): prints the text chart; opts.svg = path writes the SVG too; opts.ascii.
function M.show(x, opts)
  opts = require("zrun.kwargs").check("plot", opts, { "svg", "width", "rows", "ascii" })
  local run = M.run_of(x)
  io.stdout:write(require("zrun.plot_text").render(run, opts))
  if opts.svg then
    M.write(opts.svg, require("zrun.plot_svg").render(run, opts))
    print("wrote " .. opts.svg)
  end
end

-- Writes text to the file path (replacing it); raises "zrun plot: cannot write ..." when it
-- cannot be opened.
function M.write(path, text)
  local f, err = io.open(path, "wb")
  if not f then error(fmt("zrun plot: cannot write %s (%s): pass --out to a writable place", path, err), 0) end
  f:write(text)
  f:close()
end

local USAGE = "usage: zrun plot RUN_DIR|metrics.jsonl [--out FILE.svg] [--ascii] [--no-text] [--width COLUMNS]"

-- `zrun plot`: the SVG next to the metrics (or --out), then the text chart.
function M.main(args)
  local path, out, ascii, text, width
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--out" or a == "-o" then out, i = args[i + 1], i + 1
    elseif a == "--ascii" then ascii = true
    elseif a == "--no-text" then text = false
    elseif a == "--width" then
      width, i = tonumber(args[i + 1]), i + 1
      if not width or width < 20 or width % 1 ~= 0 then -- (was: a bad value drew at the default width, silently)
        error(fmt("zrun plot: --width must be a whole number of columns >= 20, got %s", tostring(args[i])), 0)
      end
    elseif a == "-h" or a == "--help" then print(USAGE); return 0
    elseif a:sub(1, 1) == "-" then error(fmt("zrun plot: unknown option %s (%s)", a, USAGE), 0)
    elseif path then error(fmt("zrun plot: one run at a time, got %s and %s (%s)", path, a, USAGE), 0)
    else path = a end
    i = i + 1
  end
  if not path then error("zrun plot: which run? " .. USAGE:gsub("^usage: ", "") .. " (e.g. zrun plot output)", 0) end
  local run = M.run_of(path)
  local panels = M.panels(run.records)
  if #panels == 0 then
    error(fmt("zrun plot: %s has no logged steps yet (the Trainer logs every logging_steps; wait, or set logging_steps lower)",
      run.path), 0)
  end
  if not out then out = (run.path:match("^(.*)%.jsonl$") or run.path) .. ".svg" end
  M.write(out, require("zrun.plot_svg").render(run))
  if text ~= false then io.stdout:write(require("zrun.plot_text").render(run, { ascii = ascii, width = width })) end
  print(fmt("wrote %s (%d panels, steps %s to %s): open it in a browser", out, #panels,
    tostring(panels[1].series[1].xs[1]), tostring(panels[1].series[1].xs[#panels[1].series[1].xs])))
  return 0
end

setmetatable(M, { __call = function(_, x, opts) return M.show(x, opts) end })
return M
