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
  -- HF: int(round(pct * n / 100)), Python's round: a half to the even row (75% of 6 = 4.5 -> 4 rows, not 5)
  T.near(s("train[:75%]", 6), { 1, 4 }); T.near(s("train[:25%]", 6), { 1, 2 }); T.near(s("train[25%:75%]", 6), { 3, 4 })
  T.near(s("train[-25%:]", 6), { 5, 6 }); T.near(s("train[-15%:]", 10), { 9, 10 }) -- (-1.5 -> -2)
  T.near(s("train[-5%:]", 10), { 1, 10 }) -- (-0.5 -> -0 = 0: every row, as HF)
  T.near(s("train[75%:]", 36718), { 27539, 36718 }) -- (wikitext-2 train: 27538.5 -> 27538)
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
  -- HF reads in text mode (universal newlines): ["a b", "c", "", "d", "e"], no "\r" left in a row
  f = io.open(tmp, "wb"); f:write("a b\r\nc\r\n\r\nd\re\r\n"); f:close()
  local dc = D.load_dataset(tmp, { format = "text" })
  T.eq(#dc, 5); T.eq(dc[1].text, "a b"); T.eq(dc[3].text, ""); T.eq(dc[4].text, "d"); T.eq(dc[5].text, "e")
  local dw = D.load_dataset(tmp, { format = "wikitext" })
  T.eq(dw[1].text, "a b\n"); T.eq(dw[3].text, ""); T.eq(#dw, 5)
  local j = tmp .. ".jsonl"
  f = io.open(j, "w"); f:write('{"text": "x"}\n{"text": "y z"}\n'); f:close()
  local dj = D.load_dataset(j)
  T.eq(#dj.rows, 2); T.eq(dj.rows[2].text, "y z")
  f = io.open(j, "w"); f:write('{"text": "x"}\n{"txt": 1}\n'); f:close()
  T.raises(function() D.load_dataset(j) end, ":2: no field 'text'")
  -- a chat template sees the rows as json.loads gives them to TRL: objects in their key order, {} a mapping
  local line = '{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", ' ..
    '"function": {"name": "now", "arguments": {}}}]}], "z": {"b": 1, "a": 2}}'
  for _, file in ipairs { { j, line .. "\n" }, { tmp .. ".json", "[" .. line .. "]" } } do
    f = io.open(file[1], "w"); f:write(file[2]); f:close()
    local r = D.load_dataset(file[1]).rows[1]
    T.eq(zr.jinja.tojson(r.messages[1].tool_calls[1]), '{"type": "function", "function": {"name": "now", "arguments": {}}}')
    T.eq(zr.jinja.tojson(r.z), '{"b": 1, "a": 2}')
  end
  os.remove(tmp .. ".json")
  -- rows of plain messages are read by cjson alone (their fields are read by key); a tools list of flat
  -- objects still keeps its order
  f = io.open(j, "w")
  f:write('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "b", "description": "a"}]}\n')
  f:close()
  local dt2 = D.load_dataset(j)
  T.eq(dt2.rows[1].messages[1].content, "hi")
  T.eq(zr.jinja.tojson(dt2.rows[2].tools[1]), '{"name": "b", "description": "a"}')
  f = io.open(j, "w"); f:write('{"text": "x", "v": NaN}\n'); f:close()
  T.eq(#D.load_dataset(j).rows, 1, "what only cjson reads (NaN) is still read")
  os.remove(j)
  T.raises(function() D.load_dataset("/nonexistent/wiki") end, "dataset not found: /nonexistent/wiki")
end)
os.remove(tmp)

T.test(".json files as HF's json builder reads them: a list of rows, field's list, or JSON Lines", function()
  local function write(name, text) local p = tmp .. name; local f = io.open(p, "w"); f:write(text); f:close(); return p end
  -- alpaca_data.json's shape: one list over several lines (it was read as one text row a line)
  local a = write("a.json", '[\n {"instruction": "a", "output": "b"},\n {"instruction": "c", "output": "d"}\n]\n')
  local da = D.load_dataset(a, { text_field = "output" })
  T.eq(#da, 2); T.eq(da[2].instruction, "c")
  T.raises(function() D.load_dataset(a) end, "a.json: row 1: no field 'text'")
  local o = write("o.json", '{"version": 2, "data": [{"text": "x"}, {"text": "y"}, {"text": "z"}]}')
  T.eq(#D.load_dataset(o, { field = "data" }), 3)
  T.raises(function() D.load_dataset(o) end, "holds one JSON object, not rows: pass field")
  T.raises(function() D.load_dataset(o, { field = "rows" }) end, "no field 'rows' at the top level")
  T.raises(function() D.load_dataset(o, { field = "version" }) end, "field 'version' is not a list of rows")
  local l = write("l.json", '{"text": "a"}\n{"text": "b"}\n')
  T.eq(D.load_dataset(l)[2].text, "b", "JSON Lines in a .json file")
  T.raises(function() D.load_dataset(write("n.json", "[1, 2]")) end, "row 1: a row must be a JSON object")
  T.raises(function() D.load_dataset(l .. "x", { field = "data" }) end, "dataset not found")
  T.raises(function() D.load_dataset(write("t.txt", "x\n"), { field = "data" }) end, "field is read from .json files")
  for _, n in ipairs { "a.json", "o.json", "l.json", "n.json", "t.txt" } do os.remove(tmp .. n) end
end)

T.test(".csv files as HF's csv builder (pandas) reads them: quoting, line breaks, numeric columns, empty fields", function()
  local p = tmp .. ".csv"
  local f = io.open(p, "wb")
  f:write('\239\187\191prompt,completion,n\r\n"Say ""hi"", please",hello,1\r\nmulti,"line\nvalue",2.5\n\nplain,x,\n')
  f:close()
  local ds = D.load_dataset(p)
  T.eq(#ds, 3, "the blank line is no row")
  T.eq(ds[1].prompt, 'Say "hi", please'); T.eq(ds[2].completion, "line\nvalue")
  T.eq(ds[1].n, 1); T.eq(ds[2].n, 2.5, "a numeric column holds numbers"); T.eq(ds[3].n, nil, "an empty field is absent")
  f = io.open(p, "wb"); f:write("text,id,h\nhello,a1,0x10\nworld,7,0x11\n"); f:close()
  local dt = D.load_dataset(p)
  T.eq(dt[2].id, "7", "a column with one non-number stays text"); T.eq(dt[1].text, "hello")
  T.eq(dt[1].h, "0x10", "hexadecimal is text to pandas")
  -- datasets 5.2 (pandas 3.1): [{'text': 'x', 'n': 1.0, 'b': True, 'm': None, 'e': 'True'},
  --   {'text': 'y', 'n': 2.0, 'b': None, 'm': 'a', 'e': '1'}, {'text': 'z', 'n': None, 'b': False, 'm': None, 'e': 'yes'}]
  -- (zrun read True / False and quoted numbers as text, and a quoted "" or NA as a value)
  f = io.open(p, "wb"); f:write('text,n,b,m,e\nx,"1",True,"",True\ny,2,,a,1\nz,NA,"false",null,yes\n'); f:close()
  local dv = D.load_dataset(p)
  T.eq(dv[1].n, 1, "a quoted number is a number"); T.eq(dv[2].n, 2); T.eq(dv[3].n, nil, "NA is missing")
  T.eq(dv[1].b, true, "True / false: booleans"); T.eq(dv[2].b, nil); T.eq(dv[3].b, false)
  T.eq(dv[1].m, nil, 'a quoted "" is missing'); T.eq(dv[2].m, "a"); T.eq(dv[3].m, nil, "null is missing")
  T.eq(dv[1].e, "True", "a column with one non-boolean stays text"); T.eq(dv[2].e, "1")
  f = io.open(p, "wb"); f:write("text,id\nhello\n"); f:close()
  T.raises(function() D.load_dataset(p) end, "record 2 has 1 fields but the header names 2 columns")
  f = io.open(p, "wb"); f:write('text\n"open\n'); f:close()
  T.raises(function() D.load_dataset(p) end, "is never closed")
  f = io.open(p, "wb"); f:write("a,b\n1,2\n"); f:close()
  T.raises(function() D.load_dataset(p) end, "row 1: no field 'text'")
  os.remove(p)
  f = io.open(tmp .. ".parquet", "wb"); f:write("PAR1\0\1"); f:close()
  T.raises(function() D.load_dataset(tmp .. ".parquet") end, "not .parquet; convert it first") -- (it was read as text lines)
  os.remove(tmp .. ".parquet")
end)

T.test("split strings as HF's: parts joined with +, whole percentages within 100%, no rows an error", function()
  local p = tmp .. "s.txt"
  local f = io.open(p, "w"); f:write("a b\n\nc\nd e f\n"); f:close()
  local function texts(split)
    local t = {}
    for i, r in ipairs(D.load_dataset(p, { format = "text", split = split })) do t[i] = r.text end
    return table.concat(t, "|")
  end
  -- datasets 5.2, load_dataset("text", data_files=p, split=...)["text"]
  T.eq(texts("train+train"), "a b||c|d e f|a b||c|d e f") -- (was: the first part alone)
  T.eq(texts("train[:1]+train[-1:]"), "a b|d e f")
  T.eq(texts("train[10:5]+train"), "a b||c|d e f", "an empty part of a sum")
  T.eq(texts("train[:100%]"), "a b||c|d e f"); T.eq(texts("train[-100%:]"), "a b||c|d e f")
  -- HF: ValueError: Instruction "train[10:5]" corresponds to no data! (zrun returned no rows)
  T.raises(function() texts("train[10:5]") end, "has no rows")
  T.raises(function() texts("train[4:]") end, "has no rows")
  T.raises(function() texts("train[:10%]") end, "has no rows: it selects none of the file's 4 rows; widen the slice")
  -- an empty file is said to be one (no slice would help)
  local e = tmp .. "empty.jsonl"
  f = io.open(e, "w"); f:close()
  T.raises(function() D.load_dataset(e, { split = "train[:5%]" }) end, e .. " has no rows (an empty file?): pass a dataset file")
  -- HF: Percent slice boundaries must be > -100 and < 100 (zrun clamped to every row)
  T.raises(function() texts("train[:200%]") end, "within -100% and 100%")
  T.raises(function() texts("train[:-101%]") end, "within -100% and 100%")
  -- HF: Unrecognized instruction format (zrun read 10.5% of 4 rows as none; the rounding suffix as every row)
  T.raises(function() texts("train[:10.5%]") end, "not an integer or a whole percentage")
  T.raises(function() texts("train[:50%](pct1_dropremainder)") end, "expected a name or name[start:end]")
  -- HF's builders with data_files (datasets 5.2: load_dataset("text", data_files=...)): a file or a list is the
  -- train split, {split = files} names them; zrun refused data_files
  local function rows_of(builder, o)
    local t = {}
    for i, r in ipairs(D.load_dataset(builder, o)) do t[i] = r.text end
    return table.concat(t, "|")
  end
  T.eq(rows_of("text", { data_files = p }), "a b||c|d e f")
  T.eq(rows_of("text", { data_files = { p, p } }), "a b||c|d e f|a b||c|d e f")
  T.eq(rows_of("text", { data_files = { train = p, validation = { p, p } }, split = "validation[:5]" }), "a b||c|d e f|a b")
  T.raises(function() rows_of("text", { data_files = p, split = "validation" }) end,
    [=[Unknown split "validation". Should be one of ['train']]=])
  local j = tmp .. "s.jsonl"
  f = io.open(j, "w"); f:write('{"text": "x", "n": 1}\n{"text": "y", "n": 2}\n'); f:close()
  T.eq(rows_of("json", { data_files = j }), "x|y")
  T.raises(function() D.load_dataset("json") end, 'load_dataset("json", { data_files = "train.json" })')
  T.raises(function() D.load_dataset("parquet", { data_files = j }) end, "zrun reads no parquet files")
  T.raises(function() D.load_dataset("text", { data_files = j .. "x" }) end, "dataset not found")
  os.remove(p); os.remove(j)
end)

if io.open(wiki .. "/wiki.valid.raw") then
  T.test("wikitext validation rows", function()
    local ds = D.load_dataset(wiki, { split = "validation" })
    T.eq(#ds.rows, 3760)
    T.eq(ds.rows[2].text, " = Homarus gammarus = \n")
    T.eq(ds.rows[1].text, "")
    local part = D.load_dataset(wiki, { split = "validation[:2000]" })
    T.eq(#part.rows, 2000)
    T.raises(function() D.load_dataset(wiki, { split = "train" }) end, "looked for")
    -- datasets 5.2 (text builder on wiki.valid.raw, split="validation[:2000]+validation[-5:]"): 2005 rows
    local sum = D.load_dataset(wiki, { split = "validation[:2000]+validation[-5:]" })
    T.eq(#sum, 2005); T.eq(sum[2001].text, ds[3756].text)
    T.raises(function() D.load_dataset(wiki, { split = "validation+train" }) end, "no 'train' split")
  end)
else
  T.skip("wikitext validation rows", "data not found at " .. wiki)
end

T.test("group_texts", function()
  local ds = D.Dataset.from_rows({ { input_ids = { 1, 2, 3 } }, { input_ids = { 4, 5 } }, { input_ids = { 6, 7, 8 } } })
  local g = ds:group_texts(3)
  T.eq(#g.rows, 2)
  T.near(g.rows[2].input_ids, { 4, 5, 6 }); T.near(g.rows[2].labels, { 4, 5, 6 })
  -- as run_clm's map(group_texts, batched=True) runs it: each batch of 1000 rows cut on its own, its tail
  -- dropped; 2,500 rows of 3 tokens in blocks of 7: 1000 x 3 = 3000 tokens -> 428 blocks (4 dropped), twice,
  -- then 500 x 3 = 1500 -> 214 (2 dropped): 1070 blocks; one stream would give 7500 // 7 = 1071
  local rows = {}
  for i = 1, 2500 do rows[i] = { input_ids = { i, i, i } } end
  local many = D.Dataset.from_rows(rows)
  T.eq(#many:group_texts(7).rows, 1070, "per 1000-row batch")
  T.eq(many:group_texts(7).rows[429].input_ids[1], 1001, "the second batch starts its own block")
  T.eq(#many:group_texts(7, nil, false).rows, 1071, "batch_size false: one stream")
  T.eq(#many:group_texts(7, nil, 500).rows, 5 * 214, "batch_size 500")
  T.raises(function() many:group_texts(7, nil, 0) end, "batch_size must be a positive integer or false")
end)

local BATCH_SIZES_ONE_BATCH = { -1, false, 0 } -- (0 last: before the fix it looped forever)
T.test("map's columns as HF's: kept (default), or all but remove_columns; batched too", function()
  local ds = D.Dataset.from_rows { { text = "ab", id = 1 }, { text = "cde", id = 2 } }
  local function n(r) return { n = #r.text } end
  -- datasets 5.2: Dataset.from_dict({"text": ["ab", "cde"], "id": [1, 2]}).map(lambda r: {"n": len(r["text"])})[0]
  -- -> {'text': 'ab', 'id': 1, 'n': 2} (zrun's default was fn's row alone, {n = 2})
  T.same(ds:map(n)[1], { text = "ab", id = 1, n = 2 }, "the default: fn's columns added to the row's")
  T.same(ds:map(n, { remove_columns = ds.column_names })[1], { n = 2 }, "remove_columns = ds.column_names: fn's row")
  T.same(ds.column_names, { "id", "text" }); T.eq(ds.num_rows, 2) -- (HF: ['text', 'id'], 2; zrun's sorted, nil before)
  T.same(ds:map(n, { keep = true })[2], { text = "cde", id = 2, n = 3 })
  T.same(ds:map(n, { remove_columns = false })[2], { text = "cde", id = 2, n = 3 })
  T.same(ds:map(n, { remove_columns = { "text" } })[1], { id = 1, n = 2 }, "HF: the other columns stay")
  T.same(ds:map(function(r) return { text = r.text:upper() } end, { remove_columns = "text" })[1], { id = 1, text = "AB" },
    "removed before fn's columns are added")
  T.raises(function() ds:map(n, { remove_columns = { "txt" } }) end, "column to remove 'txt' is not in the dataset")
  -- fn returning nothing (a function called for its side effects) leaves the rows as they are (HF); it emptied them
  local seen = 0
  local same = ds:map(function() seen = seen + 1 end)
  T.eq(#same, 2); T.eq(seen, 2); T.same(same[2], { text = "cde", id = 2 })
  T.same(ds:map(function() end, { remove_columns = { "id" } })[1], { text = "ab" })
  T.same(ds:map(function() end, { batched = true })[2], { text = "cde", id = 2 }, "batched")
  -- batched: kept columns need one output row per input row
  local function nb(rows) local o = {}; for i, r in ipairs(rows) do o[i] = n(r) end; return o end
  T.same(ds:map(nb, { batched = true, keep = true })[1], { text = "ab", id = 1, n = 2 }, "batched keep (it was dropped)")
  local function split(rows) return { { x = 1 }, { x = 2 }, { x = 3 } } end
  -- datasets 5.2: a batched map returning another number of rows with the columns kept (the default) raises
  -- ArrowInvalid "Column 2 named x expected length 2 but got length 3"
  T.raises(function() ds:map(split, { batched = true }) end, "returned 3 rows for 2 and the input's columns are kept")
  T.eq(#ds:map(split, { batched = true, remove_columns = { "text", "id" } }), 3)
  T.raises(function() ds:map(split, { batched = true, remove_columns = { "text" } }) end,
    "returned 3 rows for 2 and the input's columns are kept")
  -- datasets 5.2: batch_size=None, 0 or -1: one batch of every row (zrun: -1 gave no rows, false 1000 a batch, 0 looped forever)
  local big = {}
  for i = 1, 2500 do big[i] = { i = i } end
  big = D.Dataset.from_rows(big)
  local function count(rows) return { { j = #rows } } end
  for _, bs in ipairs(BATCH_SIZES_ONE_BATCH) do
    local m = big:map(count, { batched = true, batch_size = bs, remove_columns = { "i" } })
    T.eq(#m, 1, "batch_size " .. tostring(bs)); T.eq(m[1].j, 2500)
  end
  T.eq(#big:map(count, { batched = true, remove_columns = { "i" } }), 3, "the default: 1000 rows a batch")
  T.raises(function() big:map(count, { batched = true, batch_size = 2.5 }) end, "batch_size must be an integer")
end)

T.test("HF's column methods: remove_columns, select_columns, rename_column(s), add_column, to_list, concatenate_datasets", function()
  local ds = D.Dataset.from_rows { { text = "ab", id = 1 }, { text = "cde", id = 2 } }
  -- datasets 5.2 on Dataset.from_dict({"text": ["ab", "cde"], "id": [1, 2]}) (zrun had none of these methods)
  T.same(ds:remove_columns("id"):to_list(), { { text = "ab" }, { text = "cde" } })
  T.same(ds:select_columns { "id" }[2], { id = 2 })
  T.same(ds:rename_column("id", "k")[1], { text = "ab", k = 1 })
  T.same(ds:rename_columns { id = "text", text = "id" }[1], { id = "ab", text = 1 }, "a swap")
  T.same(ds:add_column("n", { 5, 6 })[2], { text = "cde", id = 2, n = 6 })
  T.same(ds[1], { text = "ab", id = 1 }, "the dataset itself is unchanged")
  local c = D.concatenate_datasets { ds, ds:select { 1 } }
  T.eq(#c, 3); T.eq(c[3].id, 1)
  -- HF: ValueError "Column name ['x'] not in the dataset", "New column name text already in the dataset"
  T.raises(function() ds:remove_columns { "x" } end, "column 'x' is not in the dataset; its columns: id, text")
  T.raises(function() ds:select_columns { "x" } end, "column 'x' is not in the dataset")
  T.raises(function() ds:rename_column("x", "k") end, "column 'x' is not in the dataset")
  T.raises(function() ds:rename_column("id", "text") end, "new column name 'text' is already in the dataset")
  T.raises(function() ds:add_column("n", { 5 }) end, "needs one value for each of the 2 rows")
end)

T.test("filter's options as HF's: batched passes lists of rows and takes a boolean a row; others refused", function()
  local ds = D.Dataset.from_rows { { text = "ab" }, { text = "" }, { text = "cde" }, { text = "" }, { text = "f" } }
  local function nonempty(rows) local o = {}; for i, r in ipairs(rows) do o[i] = #r.text > 0 end; return o end
  -- HF: ds.filter(lambda b: [len(t) > 0 for t in b["text"]], batched=True) -> ['ab', 'cde', 'f'] (every row was kept)
  local f = ds:filter(nonempty, { batched = true })
  T.eq(#f, 3); T.eq(f[2].text, "cde"); T.eq(f[3].text, "f")
  T.eq(#ds:filter(nonempty, { batched = true, batch_size = 2 }), 3, "batch_size")
  local starts = {}
  ds:filter(function(rows, s) starts[#starts + 1] = s; return nonempty(rows) end, { batched = true, batch_size = 2 })
  T.eq(table.concat(starts, ","), "1,3,5", "the index of each batch's first row")
  T.raises(function() ds:filter(function() return true end, { batched = true }) end, "must return a list of 5 booleans")
  -- datasets 5.2: batch_size=0 or None: every row in one batch (ds.filter(..., batched=True, batch_size=0) keeps 10 of 10)
  starts = {}
  T.eq(#ds:filter(function(rows, s) starts[#starts + 1] = s; return nonempty(rows) end, { batched = true, batch_size = 0 }), 3)
  T.eq(table.concat(starts, ","), "1", "batch_size = 0: one batch (it was refused)")
  T.raises(function() ds:filter(function() return true end, { num_proc = 4 }) end, "Dataset:filter: unknown option 'num_proc'")
  T.eq(#ds:filter(function(r, i) return i % 2 == 1 end), 3, "fn(row, i) without options")
end)

T.test("the collator as transformers' DataCollatorForLanguageModeling(tokenizer, mlm=False)", function()
  local tok = zr.tokenizers.ByteTokenizer.new()
  local c = D.causal_lm_collator { tokenizer = tok, mlm = false }
  local b = c { { input_ids = { 5, 6, 7 } }, { input_ids = { 5 } } }
  T.eq(b.input_ids:flat_table()[5], tok:pad_id(), "padded with the tokenizer's pad token")
  T.eq(b.labels:flat_table()[5], -100)
  T.raises(function() D.causal_lm_collator { tokenizer = tok, mlm = true } end, "mlm = true (masked language modeling) is not implemented")
  local nopad = setmetatable({}, { __index = { pad_id = function() return nil end } })
  T.raises(function() D.causal_lm_collator { tokenizer = nopad } end, "the tokenizer has no pad token")
end)

T.test("the collator keeps rows' own attention_mask as transformers' tokenizer.pad does; TRL's (mask_pad_token false) not", function()
  -- rows tokenized with padding: transformers 5.17's DataCollatorForLanguageModeling(tokenizer, mlm=False) gives
  -- attention_mask [[1,1,0,0],[1,1,1,0]], labels [[5,6,-100,-100],[3,4,5,-100]]; TRL 1.10's DataCollatorForLanguageModeling
  -- builds its mask from ones: [[1,1,1,1],[1,1,1,1]]
  local rows = { { input_ids = { 5, 6, 0, 0 }, attention_mask = { 1, 1, 0, 0 } }, { input_ids = { 3, 4, 5 }, attention_mask = { 1, 1, 1 } } }
  local b = D.causal_lm_collator { pad_token_id = 0 }(rows)
  T.eq(table.concat(b.attention_mask:flat_table(), ","), "1,1,0,0,1,1,1,0")
  T.eq(table.concat(b.labels:flat_table(), ","), "5,6,-100,-100,3,4,5,-100")
  local trl = D.causal_lm_collator { pad_token_id = 0, mask_pad_token = false }(rows)
  T.eq(table.concat(trl.attention_mask:flat_table(), ","), "1,1,1,1,1,1,1,0")
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

T.test("#ds, ds[i] and tostring: one way to count rows, for every dataset and loader", function()
  local rows = {}
  for i = 1, 10 do rows[i] = { text = "line " .. i, id = i } end
  local ds = D.Dataset.from_rows(rows)
  T.eq(#ds, 10, "#ds"); T.eq(ds:len(), 10); T.eq(ds[3].id, 3, "ds[i]"); T.eq(ds(4).id, 4); T.eq(#ds.rows, 10)
  rows[11] = { text = "late" }
  T.eq(#ds, 10, "from_rows copies the list")
  T.eq(#ds:filter(function(r) return r.id % 2 == 0 end), 5)
  -- datasets 5.2: Dataset.from_dict({"i": range(10)}).select([3, 1, 1])["i"] -> [3, 1, 1]; select([10]): IndexError
  -- (zrun: "bad argument #1 to 'min'")
  local picked = ds:select { 4, 2, 2 }
  T.eq(#picked, 3); T.eq(picked[1].id, 4); T.eq(picked[3].id, 2)
  T.raises(function() ds:select { 11 } end, "index 11 out of range for dataset of size 10")
  T.raises(function() ds:select(3) end, "takes two row numbers, or select{indices}")
  T.eq(#ds:select(2, 4), 3); T.eq(#ds:map(function(r) return { n = r.id } end), 10)
  T.eq(tostring(ds), "Dataset({\n    features: ['id', 'text'],\n    num_rows: 10\n})")
  local td = zr.data.TensorDataset(zr.randn(7, 3), zr.zeros(7))
  T.eq(#td, 7, "#TensorDataset"); T.eq(td:len(), 7)
  local dl = zr.data.DataLoader { dataset = td, batch_size = 2 }
  T.eq(#dl, 4, "#DataLoader: batches per epoch"); T.eq(dl.batch_size, 2)
  dl.batch_size = 3
  T.eq(#dl, 3, "fields write through")
  T.eq(#zr.data.DataLoader { dataset = ds, batch_size = 4, collate_fn = function(b) return b end }, 3)
  T.eq(#D.DistributedSampler.new(10, { world_size = 3 }), 4, "#sampler")
  assert(tostring(td):find("TensorDataset of 7", 1, true), tostring(td))
end)

T.test("shuffle(seed): a permutation of the rows, the same for the same seed", function()
  local rows = {}
  for i = 1, 50 do rows[i] = { id = i } end
  local ds = D.Dataset.from_rows(rows)
  local a, b, c = ds:shuffle(42), ds:shuffle { seed = 42 }, ds:shuffle(7)
  local seen, same, moved = {}, true, false
  for i = 1, 50 do
    seen[a[i].id] = true
    same = same and a[i].id == b[i].id
    moved = moved or a[i].id ~= c[i].id
  end
  for i = 1, 50 do assert(seen[i], "row " .. i .. " lost") end
  assert(same and moved, "same seed, same order; another seed, another order")
  T.eq(ds[1].id, 1, "the dataset itself is unchanged")
  zr.manual_seed(3); local x = ds:shuffle()[1].id
  zr.manual_seed(3); T.eq(ds:shuffle()[1].id, x, "no seed: the global generator, repeatable after manual_seed")
  T.raises(function() ds:shuffle(-1) end, "seed must be a non-negative integer")
  -- HF's order (datasets 5.2: Dataset.from_dict({"id": range(1, 1001)}).shuffle(seed=...)["id"], numpy's
  -- default_rng(seed).permutation); zrun's own generator gave another
  rows = {}
  for i = 1, 1000 do rows[i] = { id = i } end
  local big = D.Dataset.from_rows(rows)
  local function ids(d, i, j) local t = {}; for k = i, j do t[#t + 1] = d[k].id end; return table.concat(t, ",") end
  T.eq(ids(big:shuffle(1234), 1, 8), "315,768,540,44,559,710,738,68")
  T.eq(ids(big:shuffle(2 ^ 33 + 1), 996, 1000), "162,45,172,440,963", "a seed of two 32-bit words")
  T.eq(ids(D.Dataset.from_rows { { id = 0 }, { id = 1 }, { id = 2 }, { id = 3 }, { id = 4 }, { id = 5 }, { id = 6 },
    { id = 7 }, { id = 8 }, { id = 9 } }:shuffle(42), 1, 10), "5,6,0,7,3,2,4,9,1,8")
end)

T.test("train_test_split: HF's sizes (fraction rounds test up, train down) and order", function()
  local rows = {}
  for i = 1, 10 do rows[i] = { id = i } end
  local ds = D.Dataset.from_rows(rows)
  local function ids(d) local t = {}; for i = 1, #d do t[i] = d[i].id end; return table.concat(t, ",") end
  local s = ds:train_test_split { test_size = 0.25, seed = 1 }
  T.eq(#s.test, 3, "ceil(0.25 * 10)"); T.eq(#s.train, 7)
  local all = {}
  for _, d in ipairs { s.train, s.test } do for i = 1, #d do assert(not all[d[i].id]); all[d[i].id] = true end end
  T.eq(ids(ds:train_test_split { test_size = 0.25, seed = 1 }.test), ids(s.test), "the same seed, the same split")
  -- HF's rows (datasets 5.2: Dataset.from_dict({"id": range(1, 11)}).train_test_split(...)): the permutation is numpy's
  T.eq(ids(s.train), "1,2,3,6,10,7,4"); T.eq(ids(s.test), "9,5,8", "test = the first n_test of the permutation")
  s = ds:train_test_split { test_size = 3, seed = 0 }
  T.eq(ids(s.train), "8,4,6,10,1,9,2"); T.eq(ids(s.test), "5,7,3")
  s = ds:train_test_split { train_size = 0.33, seed = 1 }
  T.eq(ids(s.train), "10,7,4"); T.eq(ids(s.test), "9,5,8,1,2,3,6")
  s = ds:train_test_split { test_size = 0.5, train_size = 0.2, seed = 3 }
  T.eq(ids(s.train), "5,8"); T.eq(ids(s.test), "10,7,1,3,2")
  T.eq(#ds:train_test_split().test, 3, "default test_size 0.25")
  T.eq(#ds:train_test_split(4).test, 4, "a count")
  s = ds:train_test_split { train_size = 0.55, shuffle = false }
  T.eq(ids(s.train), "1,2,3,4,5", "floor(0.55 * 10), first without shuffle"); T.eq(ids(s.test), "6,7,8,9,10")
  s = ds:train_test_split { train_size = 3, test_size = 2, shuffle = false }
  T.eq(ids(s.train), "1,2,3"); T.eq(ids(s.test), "4,5")
  T.raises(function() ds:train_test_split { test_size = 10 } end, "test_size=10 must be smaller than the number of rows (10)")
  T.raises(function() ds:train_test_split { test_size = 1.5 } end, "test_size must be a fraction in (0, 1)")
  T.raises(function() ds:train_test_split { test_size = 6, train_size = 5 } end, "is more than the 10 rows")
  T.raises(function() ds:train_test_split { test_sise = 0.1 } end, "unknown option 'test_sise'")
end)

T.done()
