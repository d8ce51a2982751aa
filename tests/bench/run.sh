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
# zrun next to PyTorch (Llama training eager / torch.compile, attention vs SDPA), one table with
# ratios, on a machine with a GPU (the PyTorch columns only where torch is importable)
if "$Z" -e 'os.exit(require("zrun").cuda.is_available() and 0 or 1)' 2>/dev/null; then
  echo; echo "== tests/bench/vs_torch.sh (zrun and PyTorch in the same run)"
  sh tests/bench/vs_torch.sh "" "$Z" "$BUILD/bench"
  # the ceiling those rows sit under: cuBLAS's GEMM rate at the clock a sustained run gets (the H200
  # holds its power limit by lowering the SM clock), Llama-3.2-1B's products (RESULTS.md, session 11)
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo; echo "== tests/bench/gemm_sustained.py (cuBLAS under sustained load, through torch)"
    python3 tests/bench/gemm_sustained.py 3 || echo "(tests/bench/gemm_sustained.py failed)"
  else
    echo; echo "== tests/bench/gemm_sustained.py: SKIP, python3 here has no torch with CUDA"
  fi
  # zrun's LoRA next to Hugging Face PEFT's (where python3 imports peft; it says SKIP otherwise)
  echo; echo "== tests/bench/vs_peft.sh (zrun's LoRA and PEFT's in the same run)"
  sh tests/bench/vs_peft.sh "$Z" || echo "(tests/bench/vs_peft.sh failed)"
  # zrun next to llm.c (GPT-2 124M), where the llm.c bundle is here (sh tests/bench/llmc_bundle.sh)
  if [ -f .llmc/SOURCES ]; then
    echo; echo "== tests/bench/vs_llmc.sh (zrun and llm.c in the same run)"
    sh tests/bench/vs_llmc.sh "$Z" .llmc || echo "(tests/bench/vs_llmc.sh failed)"
  else
    echo; echo "== tests/bench/vs_llmc.sh: SKIP, no llm.c bundle in .llmc/ (sh tests/bench/llmc_bundle.sh makes it)"
  fi
fi
for b in tests/bench/bench_*.lua; do
  [ -f "$b" ] || continue
  echo; echo "== $b"; "$Z" "$b" || echo "(benchmark $b failed)"
done
