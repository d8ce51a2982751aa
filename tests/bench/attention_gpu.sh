#!/bin/sh
# Attention on the GPU machine, in one call: builds the standalone CUDA kernel test and bench_fused,
# runs the attention test against its host reference, bench_fused's attention rows and PyTorch's
# SDPA backends (bench_attention_torch.py) side by side. Outputs go to $OUT (or ./attn_out).
#   sh tests/bench/attention_gpu.sh [DEPS_PREFIX]
# ATTN_NCU=1 also profiles the Hopper forward and backward kernels at T=2048 with ncu.
# ATTN_ENV="A=1 B=2": the test and bench once more under each setting (environment A/B).
set -u
D=${1:-.deps}; O=${OUT:-attn_out}; mkdir -p "$O"
export LD_LIBRARY_PATH=$PWD/$D/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ZRUN_HOME=$PWD
make -j16 DEPS_PREFIX="$D" build/tests/test_fused_kernels build/bench/bench_fused >"$O/build.log" 2>&1 ||
  { tail -30 "$O/build.log"; echo "attention_gpu.sh: build failed (log above)"; exit 1; }
# each setting of ATTN_ENV (none: the defaults alone)
for e in "" ${ATTN_ENV:-}; do
  echo "== ${e:-default}"
  # a kernel that hangs (a barrier protocol gone wrong) ends the run, not the lease: rc=124
  timeout 300 env $e build/tests/test_fused_kernels >"$O/test_${e:-default}.log" 2>&1; echo "test_fused_kernels rc=$?"
  grep -E "attention|passed|failed|FAIL" "$O/test_${e:-default}.log" | grep -vE "^  attention( \(mma.sync\))? (f16|bf16 B1 Hq1)" | tail -12
  timeout 300 env $e build/bench/bench_fused attention | grep "^B" | tee -a "$O/bench.txt"
done
python3 tests/bench/bench_attention_torch.py 2>/dev/null | grep -E "cudnn|default" | tee "$O/torch.txt"
for e in "" ${ATTN_ENV:-}; do echo "== ${e:-default}"; timeout 300 env $e build/bench/bench_fused attention | grep "^B" | tee -a "$O/bench.txt"; done
if [ "${ATTN_NCU:-0}" = 1 ]; then # T=2048: after T=512's 23 + 23 (f+b) launches of each kernel
  for k in "attn_fwd_sm90 49" "attn_bwd_sm90 49"; do set -- $k; f="$O/ncu_$1.txt"
    ncu --clock-control none -k regex:$1 --launch-skip $2 --launch-count 1 --kill on \
      --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats \
      --section InstructionStats build/bench/bench_fused attention >"$f" 2>&1
    grep -vE "^ *-+$|^==PROF==|^attention|^B[0-9]" "$f" | grep -E "[0-9]" | head -70
  done
fi
