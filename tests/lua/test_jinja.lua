-- zrun.jinja against jinja2 itself: tests/golden/jinja/cases.json holds what jinja2 renders (in the
-- environment transformers builds for chat templates) for each case's template and context; the
-- TinyLlama chat template from the shared data; the API's errors; render speed.
-- Regenerate the golden file with: python3 tests/golden/make_jinja_golden.py
local zr = require "zrun"
local T = zr.testing
local jinja = require "zrun.jinja"
local cjson = require "cjson"

local home = ZRUN_HOME or "."
local golden = cjson.decode(T.read_file(home .. "/tests/golden/jinja/cases.json"))
local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"

local function show(s) return ("%q"):format(s) end

-- The spans as "s-e s-e" for messages.
local function spans_text(spans)
  local parts = {}
  for i, p in ipairs(spans) do parts[i] = p[1] .. "-" .. p[2] end
  return "[" .. table.concat(parts, " ") .. "]"
end

local function check_case(c)
  local ok, text, spans = pcall(jinja.render, c.template, c.context)
  if c.error then
    if ok then error("expected the error " .. show(c.error) .. ", rendered " .. show(text)) end
    if c.error_kind == "raise" then
      T.eq(text, "chat template: " .. c.error, "raise_exception message")
    elseif c.error_kind == "syntax" then
      local want = c.error_line ~= cjson.null and ("chat template line " .. c.error_line .. ": ") or "chat template line "
      if text:sub(1, #want) ~= want then error(("jinja2 says %s at line %s; we say %s"):format(show(c.error), tostring(c.error_line), show(text))) end
    else
      local want = c.lua_error ~= cjson.null and c.lua_error or c.error
      if not text:find(want, 1, true) then error(("jinja2 says %s; we say %s (expected it to contain %s)"):format(show(c.error), show(text), show(want))) end
    end
    return
  end
  if not ok then error("jinja2 renders " .. show(c.text) .. "; we fail: " .. tostring(text)) end
  if c.date_format then
    local today = os.date(c.date_format)
    text = text:gsub(today:gsub("%p", "%%%0"), "<DATE>")
  end
  if text ~= c.text then error("rendered " .. show(text) .. "\n    jinja2 " .. show(c.text)) end
  T.eq(spans_text(spans), spans_text(c.spans), "generation spans (bytes)")
end

for _, c in ipairs(golden.cases) do
  T.test("jinja2 golden: " .. c.name, function() check_case(c) end)
end

-- SHA-256 of a string as hex (to tell when the shared data's template changed).
local function sha256(msg)
  local bit = require "bit"
  local band, bxor, bnot, rshift, ror, tobit = bit.band, bit.bxor, bit.bnot, bit.rshift, bit.ror, bit.tobit
  local K = { 0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1,
    0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d,
    0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3,
    0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3,
    0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb,
    0xbef9a3f7, 0xc67178f2 }
  local H = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 }
  for i = 1, 64 do K[i] = tobit(K[i]) end
  for i = 1, 8 do H[i] = tobit(H[i]) end
  local bits = #msg * 8
  local hi, lo = math.floor(bits / 2 ^ 32), bits % 2 ^ 32
  local function be32(x) return string.char(math.floor(x / 2 ^ 24) % 256, math.floor(x / 2 ^ 16) % 256, math.floor(x / 2 ^ 8) % 256, x % 256) end
  msg = msg .. "\128" .. ("\0"):rep((55 - #msg) % 64) .. be32(hi) .. be32(lo)
  local w = {}
  for chunk = 1, #msg, 64 do
    for i = 0, 15 do
      local a, b, c, d = msg:byte(chunk + 4 * i, chunk + 4 * i + 3)
      w[i] = tobit(((a * 256 + b) * 256 + c) * 256 + d)
    end
    for i = 16, 63 do
      local s0 = bxor(ror(w[i - 15], 7), ror(w[i - 15], 18), rshift(w[i - 15], 3))
      local s1 = bxor(ror(w[i - 2], 17), ror(w[i - 2], 19), rshift(w[i - 2], 10))
      w[i] = tobit(w[i - 16] + s0 + w[i - 7] + s1)
    end
    local a, b, c, d, e, f, g, h = unpack(H)
    for i = 0, 63 do
      local S1 = bxor(ror(e, 6), ror(e, 11), ror(e, 25))
      local ch = bxor(band(e, f), band(bnot(e), g))
      local t1 = tobit(h + S1 + ch + K[i + 1] + w[i])
      local S0 = bxor(ror(a, 2), ror(a, 13), ror(a, 22))
      local maj = bxor(band(a, b), band(a, c), band(b, c))
      h, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + S0 + maj)
    end
    for i, v in ipairs({ a, b, c, d, e, f, g, h }) do H[i] = tobit(H[i] + v) end
  end
  local out = {}
  for i = 1, 8 do out[i] = bit.tohex(H[i], 8) end
  return table.concat(out)
end

T.test("sha256 helper", function()
  T.eq(sha256(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
  T.eq(sha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
  T.eq(sha256(("a"):rep(64)), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb")
end)

local tiny = golden.tinyllama
local tiny_path = tiny and tiny ~= cjson.null and (data .. "/" .. tiny.path)
local tiny_file = tiny_path and io.open(tiny_path, "rb")
if not tiny_file then
  T.skip("TinyLlama chat template renders as jinja2 does", data .. " not found")
else
  local template = cjson.decode(tiny_file:read("*a")).chat_template
  tiny_file:close()
  T.test("TinyLlama chat template renders as jinja2 does", function()
    local sum = sha256(template)
    if sum ~= tiny.sha256 then
      error(("the chat template in %s changed (sha256 %s, the golden file has %s): rerun tests/golden/make_jinja_golden.py")
        :format(tiny_path, sum, tiny.sha256))
    end
    for i, r in ipairs(tiny.renders) do
      local text, spans = jinja.render(template, r.context)
      if text ~= r.text then error(("conversation %d: rendered %s, jinja2 %s"):format(i, show(text), show(r.text))) end
      T.eq(#spans, 0, "no generation blocks")
    end
  end)
end

T.test("API: compile once, render many; spans are byte offsets", function()
  local tpl = jinja.compile("{% for m in messages %}{{ m.role }}: {% generation %}{{ m.content }}{% endgeneration %}{{ '\n' }}{% endfor %}")
  local text, spans = tpl:render({ messages = { { role = "a", content = "héllo" }, { role = "b", content = "x" } } })
  T.eq(text, "a: héllo\nb: x\n")
  T.eq(spans_text(spans), "[3-9 13-14]")
  T.eq(text:sub(spans[1][1] + 1, spans[1][2]), "héllo")
  local t2, s2 = tpl:render({ messages = {} })
  T.eq(t2, ""); T.eq(#s2, 0)
  T.eq(select(2, jinja.render("plain", {})).n, nil, "spans is a plain array")
  T.eq(jinja.render("{{ x }}", { x = "cached" }), "cached")
  T.eq(jinja.render("{{ x }}", { x = "again" }), "again")
end)

T.test("API: none is cjson.null or nil; a key left out is undefined", function()
  T.eq(jinja.none, cjson.null)
  local tpl = "{{ tools is defined }} {{ tools is none }} {{ tools }}"
  T.eq(jinja.render(tpl, { tools = cjson.null }), "True True None")
  T.eq(jinja.render(tpl, {}), "False False ")
  T.eq(jinja.render("{{ f(2) }} {{ g() is none }}", { f = function(x) return x * 3 end, g = function() end }), "6 True")
  T.eq(jinja.render("{{ 4 / 2 }} {{ 3 }} {{ 2.5 }} {{ x }} {{ y }}", { x = 1e20, y = 0.1 }), "2.0 3 2.5 100000000000000000000 0.1")
  T.eq(jinja.render("{{ {'b': 1, 'a': 2} | tojson }} {{ d | tojson }}", { d = { b = 1, a = 2 } }), '{"b": 1, "a": 2} {"a": 2, "b": 1}')
  T.eq(jinja.render("{{ d }}", { d = {} }), "[]", "an empty Lua table is an empty list (documented limitation)")
  local tool = jinja.set_key_order({ type = "function", ["function"] = jinja.set_key_order({ name = "f", parameters = jinja.set_key_order({}, {}) }, { "name", "parameters" }) }, { "type", "function" })
  T.eq(jinja.render("{{ t | tojson }} {{ t | tojson(sort_keys=true) }} {{ t.function.items() | list }}", { t = tool }),
    '{"type": "function", "function": {"name": "f", "parameters": {}}} {"function": {"name": "f", "parameters": {}}, "type": "function"} '
    .. "[('name', 'f'), ('parameters', {})]")
  T.raises(function() jinja.set_key_order({ a = 1 }, { "b" }) end, "key b is not in the table")
  -- JSON decoded as json.loads gives it (a dataset's tools): key order, {} a mapping, 1.0 a float with floats
  local src = '{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}, ' ..
    '"x": [1.0, 2, 1e3, -0.5, null, true, "a\\u00e9\\n\\"q\\""], "b": 1, "b": 3}'
  T.eq(jinja.tojson(jinja.json_decode(src, true)), '{"type": "function", "function": {"name": "f", "parameters": ' ..
    '{"type": "object", "properties": {}}}, "x": [1.0, 2, 1000.0, -0.5, null, true, "a\195\169\\n\\"q\\""], "b": 3}')
  T.eq(jinja.tojson(jinja.json_decode("[1.0, {}, []]")), "[1, {}, []]", "floats = false: Lua numbers")
  T.raises(function() jinja.json_decode('{"a": 1,}') end, "json: expected a string key at byte 9")
  T.raises(function() jinja.json_decode('{"a": 1} x') end, "json: extra data at byte 10")
end)

T.test("errors: one line, naming the template line", function()
  local err = T.raises(function() jinja.compile("a\nb\n{% if x %}\n") end, "chat template line 3: unexpected end of template")
  T.eq(err:find("\n"), nil, "one line")
  T.raises(function() jinja.compile("{{ x | foo }}") end, "chat template line 1: unknown filter 'foo'")
  T.raises(function() jinja.compile("{{ x is foo }}") end, "chat template line 1: unknown test 'foo'")
  -- inside an if, an unknown filter is an error only when it runs (as in jinja2)
  T.eq(jinja.render("{% if false %}{{ x | foo }}{% endif %}ok", {}), "ok")
  T.raises(function() jinja.render("{% if true %}{{ x | foo }}{% endif %}", {}) end, "unknown filter 'foo'")
  T.raises(function() jinja.render("x\n\n{{ s() }}", { s = "str" }) end, "chat template line 3: 'str' object is not callable")
  T.raises(function() jinja.render("{{ 'a' ~ }}", {}) end, "chat template line 1: unexpected end of tag")
  T.raises(function() jinja.render("{% for %}", {}) end, "chat template line 1: expected a name")
  T.raises(function() jinja.render("{% endfor %}", {}) end, "unexpected {% endfor %}")
  T.raises(function() jinja.render("{{ (1 }}", {}) end, "chat template line 1:")
  T.raises(function() jinja.render("{# never closed", {}) end, "missing end of comment tag")
  T.raises(function() jinja.compile(nil) end, "needs the template text")
  local ok, msg = pcall(jinja.render, "\n\n{{ raise_exception('Roles must alternate') }}", {})
  T.eq(ok, false)
  T.eq(msg, "chat template: Roles must alternate", "raise_exception: exactly the message")
  T.raises(function() jinja.render("{{ range(1000000) }}", {}) end, "range too big")
end)

T.test("strftime_now renders today's date", function()
  local s = jinja.render("{{ strftime_now('%d %B %Y') }}", {})
  T.eq(s, os.date("%d %B %Y"))
  assert(#s > 0)
end)

T.test("speed: a 20-message conversation renders in well under a millisecond", function()
  local tpl
  for _, c in ipairs(golden.cases) do if c.name == "chatml_tools_1" then tpl = jinja.compile(c.template) end end
  local msgs = {}
  for i = 1, 20 do msgs[i] = { role = i % 2 == 1 and "user" or "assistant", content = ("message %d, some text of a typical length."):format(i) } end
  local ctx = { messages = msgs, tools = cjson.null, add_generation_prompt = false }
  for _ = 1, 50 do tpl:render(ctx) end
  local n, t0 = 500, os.clock()
  for _ = 1, n do tpl:render(ctx) end
  local per = (os.clock() - t0) / n
  print(("    %.1f us per render (20 messages, ChatML with generation blocks)"):format(per * 1e6))
  assert(per < 1e-3, ("%.3f ms per render"):format(per * 1e3))
end)

T.done()
