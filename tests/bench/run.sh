#!/bin/sh
# `make bench`: runs every benchmark that applies to this machine and prints its table.
# GPU benchmarks run only where a GPU is visible. Record figures in tests/bench/RESULTS.md.
cd "$(dirname "$0")/../.." || exit 1
echo "== zrun report"; ./zrun report
for b in build/bench/bench_*; do
  [ -x "$b" ] || continue
  echo; echo "== $b"; "$b" || echo "(benchmark $b failed)"
done
for b in tests/bench/bench_*.lua; do
  [ -f "$b" ] || continue
  case "$b" in *cuda*) ./zrun -e 'os.exit(require("zrun").cuda and zr and 0 or 0)' >/dev/null 2>&1 ;; esac
  echo; echo "== $b"; ./zrun "$b" || echo "(benchmark $b failed)"
done
