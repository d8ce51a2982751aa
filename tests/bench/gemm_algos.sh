#!/bin/sh
# Which cuBLASLt algorithm is fastest when the H200 is hot (at its 700 W cap), for zrun's GEMMs: runs
# bench_gemm_algos on the heuristic's top 8 for Llama-3.2-1B at 4x512 tokens (llama2k), at 4x2048 =
# 16x512 (llama8k) and GPT-2 124M at 64x1024 (gpt2), then llama2k again with 8 enumerated
# configurations added (llama2k_enum: last, as an odd configuration is the likeliest to fault),
# about 5 minutes in all. Each is its own process: one that fails leaves the others' results.
#   make build/bench/bench_gemm_algos && sh tests/bench/gemm_algos.sh build/bench/bench_gemm_algos [OUTDIR] [OPTIONS]
# Full tables go to OUTDIR/gemm_algos_<run>.txt (default: .), the summary to stdout; OPTIONS (any of
# bench_gemm_algos --help) are added to every run. How to read it:
#   summary: one line per product: the heuristic's first choice (F: what ZRUN_GEMM_AUTOTUNE=0 runs),
#     the autotuner's pick (P: the fastest short timing, 1 warm-up + best of 3, of the top 8 after an
#     idle pause, i.e. at the boost clock: what runtime/cuda/blas_plan.c keeps), and the candidate
#     fastest sustained (B: back to back on a hot GPU, two rounds of opposite order), in TFLOP/s as
#     F, P and B measure when rerun head to head afterwards (the best of many noisy rates is biased
#     up; the rerun is not), with B/F and P/F. "h3" is the heuristic's rank 3, "e5" an enumerated
#     configuration, then B's configuration: a<algo id> tile stages c<cluster> k<split-K> s<swizzle>.
#   mix: the micro-batch's GEMM time with F, P and B for every product (count-weighted: 16 or 12
#     layers, one head): what picking by sustained speed would save per micro-batch.
#   In the tables: round1/round2 differ by the noise (and drift) of the measurement; a best/first
#   within that spread is no gain. MHz, W: NVML's mean SM clock and board power during the
#   candidate's sustained runs; pJ/FLOP from the energy counter (lower = more work under the cap).
set -u
BIN=${1:?usage: gemm_algos.sh path/to/bench_gemm_algos [OUTDIR] [OPTIONS]}
shift
OUTDIR=.
case "${1:-}" in -*|'') ;; *) OUTDIR=$1; shift ;; esac
[ -x "$BIN" ] || { echo "gemm_algos.sh: $BIN is not an executable (build it: make build/bench/bench_gemm_algos)"; exit 1; }
mkdir -p "$OUTDIR" || exit 1
fail=0
run() { # name, options...
  name=$1
  shift
  out="$OUTDIR/gemm_algos_$name.txt"
  echo "== $name"
  "$BIN" "$@" >"$out" 2>&1
  rc=$?
  grep -E '^(device|heat|summary|mix):' "$out"
  if [ $rc -ne 0 ]; then
    echo "gemm_algos.sh: $name failed (exit $rc): $(tail -n 1 "$out")"
    fail=1
  fi
}
run llama2k --set llama2k --top 8 --secs 0.25 --reheat 0.3 "$@"
run llama8k --set llama8k --top 8 --secs 0.25 --reheat 0.3 "$@"
run gpt2 --set gpt2 --top 8 --secs 0.25 --reheat 0.3 "$@"
run llama2k_enum --set llama2k --top 8 --enum 8 --secs 0.25 --reheat 0.3 "$@"
echo "full tables: $OUTDIR/gemm_algos_{llama2k,llama8k,gpt2,llama2k_enum}.txt"
exit $fail
