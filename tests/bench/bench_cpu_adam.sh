#!/bin/sh
# CPU AdamW, zrun's host pass (tests/bench/bench_offload.lua in direct mode: the fused kernel alone,
# fp32 master/m/v + bf16 weights written in place, fp32 gradients) against DeepSpeed's
# DeepSpeedCPUAdam (tests/bench/cpu_adam_baseline.py; fp32 params, grads, m, v) on the same
# parameter count and OpenMP threads, with the CPU's stream bandwidth. Run on the GPU machine:
#   sh tests/bench/bench_cpu_adam.sh [N] [THREADS]      (defaults 1.236e9, all cores)
# Prints one table. Bytes per parameter: zrun 30 (p, m, v, g read; p, m, v, bf16 weight written),
# DeepSpeed 28 (p, m, v, g read; p, m, v written). zrun writes the bf16 weights with streaming
# stores; its second row (ZRUN_OFFLOAD_STREAM=0) with normal ones, which also read each line they
# fill (32 B of real traffic per parameter).
N=${1:-1.236e9}
T=${2:-$(nproc)}
Z=${ZRUN_BIN:-./zrun}
PY=${PYTHON:-python3}
export OMP_NUM_THREADS=$T
z=$($Z tests/bench/bench_offload.lua "$N" 2 4 host 2>&1) || { echo "$z"; exit 1; }
z0=$(ZRUN_OFFLOAD_STREAM=0 $Z tests/bench/bench_offload.lua "$N" 2 4 host 2>&1) || { echo "$z0"; exit 1; }
d=$($PY tests/bench/cpu_adam_baseline.py "$N" 4 2>&1 | grep '^deepspeed_cpu_adam' | tail -1)
zn=$(echo "$z" | sed -n 's/^bench_offload: \([0-9]*\) parameters.*/\1/p')
zms=$(echo "$z" | awk '$1 == "step" { print $2 }')
z0ms=$(echo "$z0" | awk '$1 == "step" { print $2 }')
stream=$(echo "$z" | sed -n 's/.*CPU stream (a += b) *\([0-9.]*\) GB\/s.*/\1/p')
echo "CPU AdamW, $T threads ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
printf '%-26s %14s %10s %10s %12s\n' implementation parameters "step ms" "GB/s" "% of stream"
awk -v n="$zn" -v ms="$zms" -v s="$stream" 'BEGIN { g = 30 * n / ms / 1e6;
  printf "%-26s %14d %10.1f %10.1f %11.1f%%\n", "zrun host AdamW (offload)", n, ms, g, 100 * g / s }'
awk -v n="$zn" -v ms="$z0ms" -v s="$stream" 'BEGIN { g = 30 * n / ms / 1e6;
  printf "%-26s %14d %10.1f %10.1f %11.1f%%\n", "  normal stores (STREAM=0)", n, ms, g, 100 * g / s }'
case "$d" in
  *unavailable*) echo "DeepSpeedCPUAdam: ${d#deepspeed_cpu_adam }" ;;
  deepspeed_cpu_adam*) set -- $d
    awk -v n="$2" -v ms="$3" -v s="$stream" 'BEGIN { g = 28 * n / ms / 1e6;
      printf "%-26s %14d %10.1f %10.1f %11.1f%%\n", "DeepSpeedCPUAdam", n, ms, g, 100 * g / s }' ;;
  *) echo "DeepSpeedCPUAdam: no result (python3 with torch and deepspeed needed)" ;;
esac
printf '%-26s %14s %10s %10.1f\n' "CPU stream (a += b)" "" "" "$stream"
