#!/bin/sh
# Runs the fuzz targets built in DIR (build/fuzz/libfuzzer or build/fuzz/replay) and prints one
# PASS/FAIL line each, for tests/run.sh to count:
#   sh tests/fuzz/run.sh build/fuzz/libfuzzer 300 [fuzz_json ...]   # `make fuzz` does this
# libFuzzer: the regression inputs (tests/fuzz/regress/<target>/) and the seed corpus
# (tests/fuzz/corpus/<target>/) run first, then new inputs for SECONDS; what it learns is kept in
# DIR/corpus/<target>/ (not in the repository) and a crash is saved as DIR/crash/<target>-*,
# which belongs in tests/fuzz/regress/<target>/ once fixed. Replay: the seeds and regressions
# only, once each. Both run under AddressSanitizer + UBSan; any report is a failure.
cd "$(dirname "$0")/../.." || exit 1
dir=${1:?usage: run.sh DIR SECONDS [TARGET...]}
secs=${2:-60}
if [ $# -ge 2 ]; then shift 2; else shift $#; fi
kind=$(basename "$dir")
targets=$*
[ -n "$targets" ] || targets=$(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//')
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
log=$(mktemp); trap 'rm -f "$log"' EXIT
status=0
for t in $targets; do
  bin=$dir/$t seeds=tests/fuzz/corpus/$t regress=tests/fuzz/regress/$t
  if [ ! -x "$bin" ]; then echo "SKIP $t: $bin is not built (make fuzz-build FUZZ_KIND=$kind)"; continue; fi
  mkdir -p "$seeds" "$regress"
  n_inputs=$(find "$seeds" "$regress" -type f | wc -l)
  if [ "$kind" = libfuzzer ]; then
    mkdir -p "$dir/corpus/$t" "$dir/crash"
    # -runs=0: run every regression and seed input once, then stop
    if "$bin" -runs=0 -artifact_prefix="$dir/crash/$t-" "$regress" "$seeds" >"$log" 2>&1 &&
       "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
         -artifact_prefix="$dir/crash/$t-" "$dir/corpus/$t" "$seeds" >"$log" 2>&1; then
      runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
      cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
      echo "PASS $t: $n_inputs seed/regression inputs, then ${runs:-?} executions in ${secs} s ($cov, corpus $(ls "$dir/corpus/$t" | wc -l) in $dir/corpus/$t)"
    else
      echo "FAIL $t: $(grep -m1 -E 'ERROR: |runtime error|deadly signal' "$log")"
      grep -E '^(SUMMARY|artifact_prefix|Test unit written)|runtime error' "$log" | head -5 | sed 's/^/    /'
      status=1
    fi
  else
    if "$bin" "$regress" "$seeds" >"$log" 2>&1; then
      echo "PASS $t: $(tail -1 "$log") (seeds and regressions, no libFuzzer: replay driver)"
    else
      echo "FAIL $t: $(grep -m1 -E 'ERROR: |runtime error' "$log" || tail -1 "$log")"
      grep -E '^replay: |SUMMARY' "$log" | tail -2 | sed 's/^/    /'
      status=1
    fi
  fi
done
exit $status
