#!/bin/sh
# Runs every C unit test (build/tests/test_*), op test (tests/ops/test_*.lua; the CUDA-vs-CPU
# twins tests/ops/test_*_cuda.lua are tests/run_cuda.sh's), Lua test (tests/lua/test_*.lua), TCP
# launch test (tests/tcp/test_*.sh: ranks started as torchrun starts them) and MPI test from the
# repo root, echoes their PASS/FAIL/SKIP lines and ends with "N passed, N failed". A test program
# that exits non-zero without reporting a failure counts as one failure. The FAIL lines are repeated,
# each with its test's name, just above the count, so that a log's tail (CI shows only the tail) says
# which test failed; above them, the five slowest test programs (for keeping CI's time in hand).
cd "$(dirname "$0")/.." || exit 1
out=$(mktemp) failed=$(mktemp) times=$(mktemp); trap 'rm -f "$out" "$failed" "$times"' EXIT
pass=0; fail=0; skip=0
run_one() { # name, command...
  name=$1; shift
  t0=$(date +%s)
  "$@" >"$out" 2>&1; rc=$?
  echo "$(($(date +%s) - t0)) $name" >>"$times"
  p=$(grep -c '^PASS ' "$out"); f=$(grep -c '^FAIL ' "$out"); s=$(grep -c '^SKIP ' "$out")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then echo "FAIL $name: exited with status $rc" >>"$out"; f=1; fi
  if [ "$p" -eq 0 ] && [ "$f" -eq 0 ] && [ "$s" -eq 0 ]; then echo "FAIL $name: reported no test" >>"$out"; f=1; fi
  cat "$out"
  grep '^FAIL ' "$out" | cut -c1-400 | sed "s|^|  $name: |" >>"$failed"
  pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
}
data=${ZRUN_TEST_DATA:-../shared/data}
if [ -d "$data" ]; then echo "test data: $data"; else echo "test data: not found at $data (tests that need it are skipped; set ZRUN_TEST_DATA)"; fi
BUILD=${BUILD:-build}
ZRUN_BIN=${ZRUN_BIN:-./zrun}
export ZRUN_BIN
for t in "$BUILD"/tests/test_*; do [ -x "$t" ] && run_one "$t" "$t"; done
# the fuzz targets under ASan + UBSan (`make test` builds them and names their folder)
[ -n "$FUZZ_BIN_DIR" ] && run_one tests/fuzz sh tests/fuzz/run.sh "$FUZZ_BIN_DIR" "${FUZZ_SECONDS:-6}"
for t in tests/ops/test_*.lua; do
  case "$t" in *_cuda.lua) ;; *) run_one "$t" "$ZRUN_BIN" "$t" ;; esac
done
for t in tests/lua/test_*.lua; do [ -f "$t" ] && run_one "$t" "$ZRUN_BIN" "$t"; done
for t in tests/tcp/test_*.sh; do [ -f "$t" ] && run_one "$t" sh "$t"; done
if [ -n "$ZRUN_MPI_TESTS" ] || command -v mpirun >/dev/null 2>&1; then
  for t in tests/mpi/test_*.sh; do [ -f "$t" ] && run_one "$t" sh "$t"; done
fi
echo "slowest: $(sort -rn "$times" | head -5 | awk '{printf "%s%s (%d s)", (NR > 1 ? ", " : ""), $2, $1}')"
if [ -s "$failed" ]; then echo "the failures again, each after its test:"; cat "$failed"; fi
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
