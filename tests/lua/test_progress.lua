-- zrun.progress: the bar's text (counts, percent, elapsed<ETA, rate, postfix) on a fake clock, the
-- plain lines' pacing, the choice by terminal (a pipe gets lines, a pty a bar), the Trainer's bar,
-- and through tmux: on a real terminal the bar redraws in place while print()ed lines stack above it.
local zr = require "zrun"
local T = zr.testing
local progress = require "zrun.progress"

local bin = os.getenv("ZRUN_BIN") or "./zrun"
local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("*a")
  f:close()
  return out
end
local function has(out, s, what) if not out:find(s, 1, true) then error(what .. ": '" .. s .. "' not in:\n" .. out, 0) end end

-- a bar on a fake clock writing into a table
local function fake(opts)
  local t, buf = { now = 0 }, {}
  opts.clock = function() return t.now end
  opts.out = function(s) buf[#buf + 1] = s end
  local bar = progress.new(opts)
  return bar, t, buf
end

T.test("the bar: percent, counts, elapsed<ETA, rate, postfix; its width; blocks or #", function()
  local bar, t = fake { total = 100, desc = "train", mode = "off", width = 90, utf8 = false }
  t.now = 10
  bar:update(42, { loss = 2.34567 })
  local s = bar:render(90)
  T.eq(#s, 90, "the line fills the width it is given")
  has(s, "train  42%|", "description and percent")
  has(s, "| 42/100 [00:10<00:14, 4.20it/s, loss=2.346]", "counts, elapsed, ETA (58 left at 4.2/s), rate, postfix")
  local hashes = select(2, s:gsub("#", ""))
  local room = 90 - #"train " - #" 42%" - #" 42/100 [00:10<00:14, 4.20it/s, loss=2.346]" - 2
  T.eq(hashes, math.floor(0.42 * room), "the filled part is 42% of the bar")
  bar.utf8 = true
  has(bar:render(90), "█", "block characters on a UTF-8 terminal")
  -- slow loops show seconds per step; a resumed run counts its rate from where it started
  local slow, t2 = fake { total = 10, initial = 4, mode = "off", utf8 = false }
  t2.now = 6
  slow:update(2)
  has(slow:render(80), "6/10 [00:06<00:12, 3.00s/it]", "rate and ETA from the 2 steps this run did")
  T.eq(progress.hms(3725), "1:02:05")
  T.eq(progress.hms(nil), "?")
end)

T.test("plain lines: one per interval, one at the end, none for a short loop", function()
  local bar, t, buf = fake { total = 50, desc = "Map", unit = "rows", mode = "lines", interval = 10 }
  for i = 1, 50 do t.now = i * 0.5; bar:update(1) end -- 25 s
  bar:close()
  T.eq(#buf, 3, "at 10 s, at 20 s and the end:\n" .. table.concat(buf))
  T.eq(buf[1], "Map 20/50 (40%) [00:10<00:15, 2.00rows/s]\n")
  T.eq(buf[3], "Map 50/50 (100%) [00:25<00:00, 2.00rows/s]\n")
  for _, l in ipairs(buf) do assert(not l:find("[\r\27]"), "a plain line has no control characters") end
  local quick, t2, b2 = fake { total = 5, mode = "lines", interval = 10 }
  for i = 1, 5 do t2.now = i * 0.1; quick:update(1) end
  quick:close()
  T.eq(#b2, 0, "a loop shorter than the interval prints nothing")
  local tr, t3, b3 = fake { total = 5, mode = "lines", interval = 1, lines = false }
  for i = 1, 5 do t3.now = i * 5; tr:update(1) end
  tr:close()
  T.eq(#b3, 0, "lines = false: the loop logs its own lines (the Trainer)")
end)

T.test("bar mode: redraws in place with \\r, a delay keeps short loops quiet, print() goes above the bar", function()
  local bar, t, buf = fake { total = 3, desc = "d", mode = "bar", width = 60, utf8 = false }
  t.now = 1; bar:update(1)
  t.now = 2; bar:update(1)
  local text = table.concat(buf)
  T.eq(select(2, text:gsub("\r", "")), 3, "drawn at the start and at each update: " .. text:gsub("[\r\27]", "^"))
  assert(not text:find("\n"), "no newline while the bar runs")
  print("hello") -- clears the bar, prints, draws it again
  local last = buf[#buf]
  has(last, "2/3", "the bar is drawn again after print")
  t.now = 3; bar:update(1)
  bar:close()
  T.eq(buf[#buf], "\n", "the finished bar stays, its line ended")
  T.eq(print, _G.print)
  local quiet, t2, b2 = fake { total = 3, mode = "bar", delay = 0.5 }
  t2.now = 0.2; quiet:update(3)
  quiet:close()
  T.eq(#b2, 0, "finished before the delay: nothing drawn")
end)

T.test("the mode follows stdout: lines in a pipe, a bar on a pty, ZRUN_PROGRESS overrides", function()
  local probe = bin .. " -e 'print(require(\"zrun.progress\").mode())'"
  T.eq(sh("env -u ZRUN_PROGRESS " .. probe .. " | cat"), "lines\n")
  T.eq(sh("ZRUN_PROGRESS=bar " .. probe .. " | cat"), "bar\n")
  T.eq(sh("ZRUN_PROGRESS=off " .. probe .. " | cat"), "off\n")
  has(sh("ZRUN_PROGRESS=maybe " .. probe), "ZRUN_PROGRESS=maybe: use bar, lines or off", "a bad value is one line")
  if sh("command -v script") ~= "" then
    has(sh("env -u ZRUN_PROGRESS TERM=xterm script -qfec \"" .. probe:gsub('"', '\\"') .. "\" /dev/null"), "bar",
      "a pseudo-terminal gets the bar")
  end
end)

T.test("the Trainer: its log lines in a pipe; a bar with step/total and loss when asked for", function()
  local script = os.tmpname()
  local out = os.tmpname()
  os.remove(out)
  local f = assert(io.open(script, "w"))
  f:write(([[
local zr = require "zrun"
local tok = zr.tokenizers.ByteTokenizer.new()
local rows = {}
for line in io.lines("recipes/data/sample.txt") do rows[#rows + 1] = { input_ids = tok:encode(line) } end
zr.manual_seed(1)
local t = zr.Trainer { model = zr.models.llama.LlamaForCausalLM(zr.models.llama.config("zrun/tiny-llama")),
  train_dataset = zr.datasets.Dataset.from_rows(rows):group_texts(16),
  args = { output_dir = %q, per_device_train_batch_size = 2, max_steps = 4, logging_steps = 2, save_strategy = "no" } }
t:train()
]]):format(out))
  f:close()
  local plain = sh("env -u ZRUN_PROGRESS " .. bin .. " " .. script .. " | cat")
  has(plain, "step 4/4 | loss ", "the log line")
  assert(not plain:find("[\r\27]"), "no control characters in a pipe:\n" .. plain)
  local bar = sh("ZRUN_PROGRESS=bar COLUMNS=100 " .. bin .. " " .. script .. " | cat")
  has(bar, "\r\27[K", "the bar clears its line before a log line")
  has(bar, " 4/4 [", "the bar counts optimizer steps")
  has(bar, "loss=", "the bar shows the last logged loss")
  has(bar, "step 2/4 | loss ", "the log lines still print")
  os.remove(script)
  os.execute("rm -rf '" .. out .. "'")
end)

T.test("a dataset map that takes a while shows a bar; a quick one stays quiet", function()
  local code = [[local zr = require "zrun"
local ds = zr.datasets.Dataset.from_rows({ {}, {}, {}, {}, {}, {}, {}, {} })
ds:map(function() return {} end, { desc = "Quick" })
ds:map(function(r) local t = zr.now(); while zr.now() - t < 0.1 do end; return r end, { desc = "Tokenize" })]]
  local out = sh("ZRUN_PROGRESS=bar " .. bin .. " -e '" .. code:gsub("'", "'\\''") .. "' | cat")
  has(out, "Tokenize 100%|", "the slow map's bar")
  has(out, "8/8 [", "its count of rows")
  assert(not out:find("Quick"), "the quick map drew nothing:\n" .. out)
end)

if sh("command -v tmux") == "" then
  T.skip("the bar on a real terminal (tmux)", "tmux is not installed")
else
  T.test("on a terminal (tmux) the bar redraws in place; print()ed lines stack above it", function()
    local sock = "zrun-progress-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e6))
    local tm = "tmux -L " .. sock .. " "
    local cmd = ("env -u ZRUN_PROGRESS LANG=C.UTF-8 TERM=xterm %s tests/lua/progress_demo.lua 30 0.04; sleep 30"):format(bin)
    sh(tm .. "new-session -d -x 100 -y 20 '" .. cmd .. "'")
    local function pane() return sh(tm .. "capture-pane -p -t 0") end
    local mid, final
    local t0 = zr.now()
    while zr.now() - t0 < 10 do
      local p = pane()
      if not mid and p:find("demo +%d+%%|") and not p:find("finished") then mid = p end
      if p:find("finished") then final = p; break end
      os.execute("sleep 0.1")
    end
    sh(tm .. "kill-server")
    assert(mid, "the bar never showed while the loop ran")
    assert(final, "the demo did not finish within 10 s")
    local _, bars = final:gsub("demo +%d+%%|", "")
    T.eq(bars, 1, "one bar line on the screen (redrawn in place):\n" .. final)
    has(final, "demo 100%|", "the finished bar")
    has(final, "| 30/30 [", "its count")
    has(final, "█", "block characters on a UTF-8 terminal")
    local barline = final:match("(demo 100%%|[^\n]*)")
    T.eq(#barline - select(2, barline:gsub("[\128-\191]", "")), 99, "the bar fills the 100-column terminal but its last column")
    for _, k in ipairs { 10, 20, 30 } do
      local _, c = final:gsub("log line " .. k .. "\n", "")
      T.eq(c, 1, "'log line " .. k .. "' printed once, on its own line:\n" .. final)
    end
    local lines = {}
    for l in final:gmatch("[^\n]+") do lines[#lines + 1] = l end
    T.eq(lines[1], "log line 10")
    assert(lines[4]:find("^demo 100%%|"), "the bar sits under the printed lines:\n" .. final)
    T.eq(lines[5], "finished")
    -- the same program in a pipe: plain lines, no control characters
    local piped = sh("env -u ZRUN_PROGRESS " .. bin .. " tests/lua/progress_demo.lua 30 0.04 | cat")
    assert(not piped:find("[\r\27]"), "control characters in piped output:\n" .. piped)
    has(piped, "demo 30/30 (100%)", "the last plain line")
    has(piped, "log line 20\n", "the printed lines")
  end)
end

T.done()
