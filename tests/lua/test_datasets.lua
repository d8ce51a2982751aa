-- Dataset loading, split slicing, group_texts, the causal-LM collator and the distributed sampler.
local zr = require "zrun"
local T = zr.testing
local D = require "zrun.datasets"

local data = os.getenv("ZRUN_TEST_DATA") or "../shared/data"
local wiki = data .. "/wikitext-2-raw"

T.test("split slicing like HF", function()
  local function s(spec, n) local _, a, b = D.parse_split(spec, n); return { a, b } end
  T.near(s("train[:2000]", 36718), { 1, 2000 })
  T.near(s("train[10%:20%]", 36718), { 3673, 7344 }) -- round(3671.8)=3672 -> rows 3673..7344
  T.near(s("train[-10:]", 100), { 91, 100 })
  T.near(s("train", 7), { 1, 7 })
  T.near(s("train[:500]", 7), { 1, 7 })
  T.raises(function() s("train[a:b]", 7) end, "not an integer")
end)

local tmp = os.tmpname()
T.test("text and jsonl files", function()
  local f = io.open(tmp, "w"); f:write("a b\n\nc\n"); f:close()
  local ds = D.load_dataset(tmp, { format = "wikitext" })
  T.eq(#ds.rows, 3); T.eq(ds.rows[1].text, "a b\n"); T.eq(ds.rows[2].text, "")
  local dt = D.load_dataset(tmp, { format = "text" })
  T.eq(dt.rows[1].text, "a b")
  local j = tmp .. ".jsonl"
  f = io.open(j, "w"); f:write('{"text": "x"}\n{"text": "y z"}\n'); f:close()
  local dj = D.load_dataset(j)
  T.eq(#dj.rows, 2); T.eq(dj.rows[2].text, "y z")
  f = io.open(j, "w"); f:write('{"text": "x"}\n{"txt": 1}\n'); f:close()
  T.raises(function() D.load_dataset(j) end, ":2: no field 'text'")
  os.remove(j)
  T.raises(function() D.load_dataset("/nonexistent/wiki") end, "dataset not found: /nonexistent/wiki")
end)
os.remove(tmp)

if io.open(wiki .. "/wiki.valid.raw") then
  T.test("wikitext validation rows", function()
    local ds = D.load_dataset(wiki, { split = "validation" })
    T.eq(#ds.rows, 3760)
    T.eq(ds.rows[2].text, " = Homarus gammarus = \n")
    T.eq(ds.rows[1].text, "")
    local part = D.load_dataset(wiki, { split = "validation[:2000]" })
    T.eq(#part.rows, 2000)
    T.raises(function() D.load_dataset(wiki, { split = "train" }) end, "looked for")
  end)
else
  T.skip("wikitext validation rows", "data not found at " .. wiki)
end

T.test("group_texts", function()
  local ds = D.Dataset.from_rows({ { input_ids = { 1, 2, 3 } }, { input_ids = { 4, 5 } }, { input_ids = { 6, 7, 8 } } })
  local g = ds:group_texts(3)
  T.eq(#g.rows, 2)
  T.near(g.rows[2].input_ids, { 4, 5, 6 }); T.near(g.rows[2].labels, { 4, 5, 6 })
end)

T.test("causal LM collator pads and masks", function()
  local col = D.causal_lm_collator({ pad_token_id = 9 })
  local b = col({ { input_ids = { 1, 2, 3 } }, { input_ids = { 4 } } })
  T.near(b.input_ids, { 1, 2, 3, 4, 9, 9 })
  T.near(b.attention_mask, { 1, 1, 1, 1, 0, 0 })
  T.near(b.labels, { 1, 2, 3, 4, -100, -100 })
  T.eq(b.input_ids:dtype(), "i64")
end)

T.test("distributed sampler shards and shuffles", function()
  local seen, counts = {}, {}
  for r = 0, 2 do
    local s = D.DistributedSampler.new(10, { rank = r, world_size = 3, seed = 7 })
    local idx = s:indices()
    T.eq(#idx, 4)
    for _, i in ipairs(idx) do seen[i] = (seen[i] or 0) + 1 end
  end
  for i = 1, 10 do assert(seen[i] and seen[i] >= 1, "index " .. i .. " missing") end
  local a = D.DistributedSampler.new(10, { seed = 7 })
  local e0 = table.concat(a:indices(), ",")
  T.eq(table.concat(a:indices(), ","), e0, "same epoch, same order")
  a:set_epoch(1)
  assert(table.concat(a:indices(), ",") ~= e0, "a new epoch reshuffles")
  local d = D.DistributedSampler.new(10, { rank = 2, world_size = 3, drop_last = true, shuffle = false })
  T.near(d:indices(), { 3, 6, 9 })
end)

T.done()
