-- tests/bench/sass_loops.lua on nvdisasm -c output written by hand (its form: ".type" and a
-- "name:" line a function, ".L_x_N:" labels on lines of their own, "/*addr*/ text ;" a SASS line,
-- branches to "`(.L_x_N)"): the wgmma loops found with their counts (nested ones each, loops without
-- HGMMA and forward branches left out), the kernel filter, list=1, and the refusals.
local zr = require "zrun"
local T = zr.testing
local fmt = string.format

local ZRUN = os.getenv("ZRUN_BIN") or arg[-1]
local tmp = os.tmpname()

-- one function: an outer loop (0x20 .. 0xb0) around an inner one (0x40 .. 0x90) with 2 HGMMA, a
-- loop without HGMMA (0xc0 .. 0xd0) and a forward branch; a second function with no loop
local SASS = [[
	.text.x
        .type           _Z6kern_aILi4EEvv,@function
_Z6kern_aILi4EEvv:
.text._Z6kern_aILi4EEvv:
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/               @P0 BRA `(.L_x_9) ;
.L_x_1:
        /*0020*/                   UMOV UR4, 0x1 ;
        /*0030*/                   ISETP.NE.AND P0, PT, R0, RZ, PT ;
.L_x_0:
        /*0040*/                   UIADD3 UR8, UR4, 0x2, URZ ;
        /*0050*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0060*/                   UIADD3 UR8, UR4, 0x202, URZ ;
        /*0070*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR8], R88, gsb0 ;
        /*0080*/                   UISETP.NE.AND UP0, UPT, UR4, 0x4, UPT ;
        /*0090*/              @!UP0 BRA `(.L_x_0) ;
        /*00a0*/                   STG.E desc[UR6][R2.64], R24 ;
        /*00b0*/              @!P0 BRA `(.L_x_1) ;
.L_x_2:
        /*00c0*/                   IADD3 R1, R1, 0x1, RZ ;
        /*00d0*/               @P1 BRA `(.L_x_2) ;
.L_x_9:
        /*00e0*/                   EXIT ;
        .type           _Z6kern_bv,@function
_Z6kern_bv:
.text._Z6kern_bv:
        /*0000*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0010*/                   EXIT ;
]]
local function write(text)
  local f = assert(io.open(tmp, "wb"))
  f:write(text)
  f:close()
end
local function run(args) return T.run(fmt("'%s' tests/bench/sass_loops.lua %s %s", ZRUN, tmp, args or "")) end

T.test("sass_loops.lua: each loop that issues HGMMA, nested ones too, with its opcode counts", function()
  write(SASS)
  local out, rc = run()
  assert(rc == 0, out)
  assert(out:find("_Z6kern_aILi4EEvv: 15 instructions", 1, true), out)
  assert(out:find("loop 00040-00090: 6 instructions, 2 HGMMA (HGMMA 2, UIADD3 2, BRA 1, UISETP 1)", 1, true), out)
  assert(out:find("loop 00020-000b0: 10 instructions, 2 HGMMA (BRA 2, HGMMA 2, UIADD3 2, ISETP 1, STG 1, " ..
    "UISETP 1, UMOV 1)", 1, true), out)
  assert(not out:find("000c0", 1, true), "the loop without HGMMA is listed:\n" .. out)
  assert(not out:find("kern_bv", 1, true), "a function without a loop is listed:\n" .. out)
  assert(not out:find("    00040 ", 1, true), "instructions listed without list=1:\n" .. out)
end)

T.test("sass_loops.lua: kernel= filters, top= cuts the opcodes, list=1 prints the innermost loop", function()
  write(SASS)
  local out, rc = run("kernel=ILi4E top=2 list=1")
  assert(rc == 0, out)
  assert(out:find("6 instructions, 2 HGMMA (HGMMA 2, UIADD3 2)", 1, true), out)
  assert(out:find("    00050 HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24\n", 1, true), out)
  assert(out:find("    00090 @!UP0 BRA `(.L_x_0)", 1, true), out)
  assert(not out:find("    00030 ", 1, true), "list=1 printed the outer loop:\n" .. out)
end)

T.test("sass_loops.lua refuses what it cannot read, in one line", function()
  write(SASS)
  local out, rc = run("kernel=nothing")
  assert(rc ~= 0 and out:find("no function matching 'nothing' with a loop that issues HGMMA", 1, true), out)
  write("not nvdisasm output\n")
  out, rc = run()
  assert(rc ~= 0 and out:find("no function with a loop that issues HGMMA", 1, true), out)
  out, rc = T.run(fmt("'%s' tests/bench/sass_loops.lua %s.missing", ZRUN, tmp))
  assert(rc ~= 0 and out:find("cannot open", 1, true), out)
  out, rc = T.run(fmt("'%s' tests/bench/sass_loops.lua", ZRUN))
  assert(rc ~= 0 and out:find("usage:", 1, true), out)
  write(SASS)
  out, rc = run("list=2")
  assert(rc ~= 0 and out:find("list=2; use 1 (print the innermost loop) or 0", 1, true), out)
  out, rc = run("top=0")
  assert(rc ~= 0 and out:find("top=0; list at least 1 opcode", 1, true), out)
end)

os.remove(tmp)
T.done()
