#!/bin/sh
# `make bench`: runs every benchmark that applies to this machine and prints its table.
# GPU benchmarks say so and stop where no GPU is visible. Record figures in tests/bench/RESULTS.md.
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
Z=${ZRUN_BIN:-./zrun}
echo "== zrun report"; "$Z" report
for b in "$BUILD"/bench/bench_*; do
  [ -x "$b" ] || continue
  echo; echo "== $b"; "$b" || echo "(benchmark $b failed)"
done
# PyTorch's scaled_dot_product_attention at bench_fused's attention shapes, in the same run
if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo; echo "== tests/bench/bench_attention_torch.py (PyTorch SDPA, same shapes as bench_fused)"
  python3 tests/bench/bench_attention_torch.py 2>/dev/null || echo "(PyTorch attention benchmark failed)"
fi
for b in tests/bench/bench_*.lua; do
  [ -f "$b" ] || continue
  echo; echo "== $b"; "$Z" "$b" || echo "(benchmark $b failed)"
done
