-- Writes a chat dataset (JSON lines of {"messages": [...]}) from a text file, for SFT runs at real
-- shape (tests/bench/finetune_vs_hf.sh's sft_chat_deepspeed): each line of at least 8 words becomes a
-- user turn "Continue: <its first half>" and an assistant turn with the second half; every third row
-- gets a system turn, and every fifth a second user / assistant exchange (the next line's halves).
--   zrun tests/bench/make_chat_data.lua TEXT_FILE OUT.jsonl [max_rows=3000]
local cjson = require "cjson"
local src, out, max_rows = arg[1], arg[2], tonumber(arg[3] or "3000")
if not src or not out then io.stderr:write("usage: zrun tests/bench/make_chat_data.lua TEXT_FILE OUT.jsonl [max_rows]\n"); os.exit(2) end
local halves = {}
for line in io.lines(src) do
  local words = {}
  for w in line:gmatch("%S+") do words[#words + 1] = w end
  if #words >= 8 and not line:match("^%s*=") then
    local h = math.floor(#words / 2)
    halves[#halves + 1] = { table.concat(words, " ", 1, h), table.concat(words, " ", h + 1) }
  end
end
local f = assert(io.open(out, "w"))
local n, i = 0, 1
while i <= #halves and n < max_rows do
  local m = {}
  if n % 3 == 0 then m[#m + 1] = { role = "system", content = "You continue the text you are given." } end
  m[#m + 1] = { role = "user", content = "Continue: " .. halves[i][1] }
  m[#m + 1] = { role = "assistant", content = halves[i][2] }
  if n % 5 == 0 and halves[i + 1] then
    i = i + 1
    m[#m + 1] = { role = "user", content = "Continue: " .. halves[i][1] }
    m[#m + 1] = { role = "assistant", content = halves[i][2] }
  end
  f:write(cjson.encode({ messages = m }), "\n")
  n, i = n + 1, i + 1
end
f:close()
print(("make_chat_data: %d conversations from %s -> %s"):format(n, src, out))
