-- Progress of a long loop, as tqdm shows it: on a terminal one bar redrawn in place
-- ("train  42%|████▎     | 420/1000 [01:23<01:55, 5.03it/s, loss=2.3456]"); when stdout is not a
-- terminal (a pipe, a log file, mpirun) a plain line at most every `interval` seconds instead.
-- Only rank 0 shows anything. ZRUN_PROGRESS=bar|lines|off overrides the choice.
--   local bar = zr.progress{ total = #rows, desc = "Tokenize", unit = "rows" }
--   for i = 1, #rows do ...; bar:update(1) end
--   bar:close()
-- While a bar is on the screen, print() clears it, prints, and draws it again below.
local C = require "zrun._C"
local M = {}
local Bar = {}
Bar.__index = Bar
M.Bar = Bar

local fmt, floor, max, min, rep, concat = string.format, math.floor, math.max, math.min, string.rep, table.concat

-- "01:23" or "1:02:03"; "?" when unknown.
function M.hms(s)
  if not s or s ~= s or s == math.huge or s < 0 then return "?" end
  s = floor(s + 0.5)
  if s >= 3600 then return fmt("%d:%02d:%02d", floor(s / 3600), floor(s / 60) % 60, s % 60) end
  return fmt("%02d:%02d", floor(s / 60), s % 60)
end

-- Whether the terminal's character set is UTF-8 (the locale says so), as tools decide it.
function M.utf8_locale()
  local v = os.getenv("LC_ALL")
  if not v or v == "" then v = os.getenv("LC_CTYPE") end
  if not v or v == "" then v = os.getenv("LANG") end
  v = (v or ""):lower()
  return v:find("utf%-?8") ~= nil
end

-- This process's rank from the launcher's environment (asking zr.dist would start MPI).
local function rank0()
  for _, k in ipairs { "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "RANK" } do
    local v = tonumber(os.getenv(k) or "")
    if v then return v == 0 end
  end
  return true
end

-- "bar" on a terminal, "lines" otherwise, "off" on ranks other than 0; ZRUN_PROGRESS overrides.
function M.mode()
  local env = os.getenv("ZRUN_PROGRESS")
  if env == "0" or env == "off" or env == "none" then return "off" end
  if not rank0() then return "off" end
  if env == "bar" or env == "1" then return "bar" end
  if env == "lines" then return "lines" end
  if env and env ~= "" then
    error(fmt("ZRUN_PROGRESS=%s: use bar, lines or off (unset: a bar on a terminal, lines otherwise)", env), 0)
  end
  local term = os.getenv("TERM")
  if C.isatty(1) and term ~= "dumb" then return "bar" end
  return "lines"
end

local active = {} -- the bars on the terminal, innermost last: only the last is drawn
local orig_print

local function out_write(s) io.stdout:write(s); io.stdout:flush() end

-- print() while a bar is shown: clear the bar's line, print, draw the bar again.
local function bar_print(...)
  local top = active[#active]
  if top and top.drawn then top.out("\r\27[K") end
  orig_print(...)
  if top then top:draw(true) end
end

-- opts: total (nil: unknown), desc, unit ("it"), initial (0), mode (default M.mode()), interval
-- (seconds between plain lines, 10), lines (false: no plain lines, for loops that log their own),
-- leave (keep the last bar on screen, default true), delay (seconds before a bar first shows: short
-- loops stay quiet), out (a function writing a string), clock, width (columns; default the
-- terminal's), utf8 (block characters; default from the locale).
function M.new(opts)
  opts = require("zrun.kwargs").check("progress", opts, { "total", "desc", "unit", "initial", "mode", "interval", "lines",
    "leave", "delay", "out", "clock", "width", "utf8" })
  local self = setmetatable({ total = opts.total, desc = opts.desc or "", unit = opts.unit or "it",
    n = opts.initial or 0, initial = opts.initial or 0, mode = opts.mode or M.mode(), interval = opts.interval or 10,
    lines = opts.lines ~= false, leave = opts.leave ~= false, delay = opts.delay or 0, out = opts.out or out_write,
    clock = opts.clock or C.now, width = opts.width, utf8 = opts.utf8, closed = false }, Bar)
  if self.utf8 == nil then self.utf8 = M.utf8_locale() end
  self.t0 = self.clock()
  self.last_draw, self.last_line = -math.huge, self.t0
  if self.mode == "bar" then
    if #active == 0 and not orig_print then orig_print = print; print = bar_print end
    active[#active + 1] = self
    self:draw(true)
  end
  return self
end
setmetatable(M, { __call = function(_, opts) return M.new(opts) end })

local function postfix_text(p)
  if not p then return "" end
  if type(p) ~= "table" then return tostring(p) end
  local keys, parts = {}, {}
  for k in pairs(p) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local v = p[k]
    parts[#parts + 1] = k .. "=" .. (type(v) == "number" and fmt("%.4g", v) or tostring(v))
  end
  return concat(parts, ", ")
end

local function rate_text(rate, unit)
  if not rate or rate <= 0 then return "?" .. unit .. "/s" end
  if rate < 1 then return fmt("%.2fs/%s", 1 / rate, unit) end
  if rate >= 1e5 then return fmt("%.3gM%s/s", rate / 1e6, unit) end
  return fmt(rate >= 100 and "%.0f%s/s" or "%.2f%s/s", rate, unit)
end

-- The numbers a bar or line shows: elapsed, rate (per second, counted from `initial`), ETA.
function Bar:stats()
  local el = self.clock() - self.t0
  local done = self.n - self.initial
  local rate = el > 0 and done > 0 and done / el or nil
  local eta = (rate and self.total) and (self.total - self.n) / rate or nil
  return el, rate, eta
end

-- The bar as one line of at most `width` columns.
function Bar:render(width)
  local el, rate, eta = self:stats()
  local desc = self.desc ~= "" and self.desc .. " " or ""
  local pf = postfix_text(self.postfix)
  local right = fmt(" %s/%s [%s<%s, %s%s]", self.n, self.total or "?", M.hms(el), M.hms(eta), rate_text(rate, self.unit),
    pf ~= "" and ", " .. pf or "")
  if not self.total or self.total <= 0 then return (desc .. right:sub(2)):sub(1, width) end
  local frac = min(max(self.n / self.total, 0), 1)
  local pct = fmt("%3d%%", floor(frac * 100))
  local room = width - #desc - #pct - #right - 2
  if room < 4 then return (desc .. pct .. right):sub(1, width) end
  local bar
  if self.utf8 then
    local blocks = { "▏", "▎", "▍", "▌", "▋", "▊", "▉" }
    local eighths = floor(frac * room * 8 + 1e-9)
    local full, part = floor(eighths / 8), eighths % 8
    bar = rep("█", full) .. (part > 0 and blocks[part] or "") .. rep(" ", room - full - (part > 0 and 1 or 0))
  else
    local full = floor(frac * room + 1e-9)
    bar = rep("#", full) .. rep(" ", room - full)
  end
  return desc .. pct .. "|" .. bar .. "|" .. right
end

-- The plain line for logs: "desc 420/1000 (42%) [01:23<01:55, 5.03it/s, loss=2.346]".
function Bar:line()
  local el, rate, eta = self:stats()
  local pf = postfix_text(self.postfix)
  local pct = self.total and self.total > 0 and fmt(" (%d%%)", floor(100 * self.n / self.total)) or ""
  return fmt("%s%s/%s%s [%s<%s, %s%s]", self.desc ~= "" and self.desc .. " " or "", self.n, self.total or "?", pct,
    M.hms(el), M.hms(eta), rate_text(rate, self.unit), pf ~= "" and ", " .. pf or "")
end

-- Redraws the bar in place: in bar mode, for the innermost open bar only, not before `delay`
-- seconds have passed since it started, and (unless force) at most every 0.1 s. Width: opts.width
-- or the terminal's (80 when unknown), less one column (at least 20).
function Bar:draw(force)
  if self.mode ~= "bar" or self.closed or active[#active] ~= self then return end
  local now = self.clock()
  if not self.drawn and now - self.t0 < self.delay then return end
  if not force and now - self.last_draw < 0.1 then return end
  self.last_draw = now
  local w = self.width or C.terminal_width(1) or 80
  self.out("\r" .. self:render(max(w - 1, 20)) .. "\27[K")
  self.drawn = true
end

-- Advances by k (default 1); postfix: a table shown as k=v after the rate (e.g. {loss = 2.31}).
function Bar:update(k, postfix)
  self.n = self.n + (k or 1)
  if postfix then self.postfix = postfix end
  if self.mode == "bar" then
    self:draw(self.total and self.n >= self.total)
  elseif self.mode == "lines" and self.lines then
    local now = self.clock()
    if now - self.last_line >= self.interval then
      self.last_line, self.printed = now, self.n
      self.out(self:line() .. "\n")
    end
  end
end

-- Replaces the postfix shown after the rate (a table as sorted k=v, numbers %.4g; another value
-- by tostring); a bar is redrawn (as draw() does, at most every 0.1 s), in lines mode the next
-- plain line shows it.
function Bar:set_postfix(p) self.postfix = p; self:draw() end

-- Prints a line above the bar (the bar stays at the bottom).
function Bar:write(s)
  if self.mode == "bar" and self.drawn and active[#active] == self then
    self.out("\r\27[K" .. s .. "\n")
    self:draw(true)
  else
    self.out(s .. "\n")
  end
end

-- Finishes: the last bar stays on screen (leave) or is erased; in lines mode a loop that printed
-- progress lines ends with one more. Restores print() when no bar is left.
function Bar:close()
  if self.closed then return end
  if self.mode == "bar" then
    if active[#active] == self then
      if self.leave and #active == 1 and self.drawn then self:draw(true); self.out("\n")
      elseif self.drawn then self.out("\r\27[K") end
    end
    for i = #active, 1, -1 do if active[i] == self then table.remove(active, i) end end
    self.closed = true
    if #active == 0 then
      if orig_print and print == bar_print then print = orig_print end
      orig_print = nil
    else
      active[#active]:draw(true)
    end
  else
    if self.mode == "lines" and self.lines and self.printed and self.printed ~= self.n then self.out(self:line() .. "\n") end
    self.closed = true
  end
end

local function keep_trace(m)
  local dbg = os.getenv("ZRUN_DEBUG")
  if dbg and dbg ~= "" and dbg ~= "0" and type(m) == "string" then return debug.traceback(m, 2) end
  return m
end

-- Runs fn(...) and closes the bar however fn ends; returns fn's results. An error passes through
-- (with ZRUN_DEBUG=1 carrying the traceback from where it was raised).
function Bar:run(fn, ...)
  local res = { xpcall(fn, keep_trace, ...) }
  self:close()
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2)
end

-- zr.progress.with(opts, function(bar) ... end): a bar around a loop, closed however it ends.
function M.with(opts, fn)
  local bar = M.new(opts)
  return bar:run(fn, bar)
end

return M
