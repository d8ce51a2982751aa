#!/bin/sh
# ZeRO equivalence on several GPUs of one host: every stage, offload, accumulation + clipping and
# overlap_comm with NCCL collectives, one GPU per rank, against the single-process reference that
# tests/mpi/zero_check.lua computes on each rank's GPU; Lamb against 1 GPU (tests/mpi/lamb_check.lua). Run on the GPU machine:
#   sh tests/cuda/test_zero_multi_gpu.sh [NP]   (NP defaults to the number of GPUs; needs NP >= 2)
# Ends with "N passed, N failed" (a SKIP line with fewer than 2 GPUs). NVLink multicast stays off
# (the machine's notes require it). Part of tests/run_cuda.sh.
. "$(dirname "$0")/../mpi/mpi_env.sh"
export ZRUN_CHECK_DEVICE=cuda NCCL_NVLS_ENABLE=0
Z=${ZRUN_BIN:-./zrun}
NP=${1:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "$NP" -ge 2 ] || { echo "SKIP multi-GPU ZeRO equivalence: needs 2 or more GPUs (found $NP)"; exit 0; }
command -v mpirun >/dev/null || { echo "SKIP multi-GPU ZeRO equivalence: mpirun not found"; exit 0; }
out=$(mktemp); trap 'rm -f "$out" "$out.r"' EXIT
run() { # args for zero_check.lua
  mpirun $MPI_FLAGS -np "$NP" -x ZRUN_HOME -x ZRUN_CHECK_DEVICE -x NCCL_NVLS_ENABLE $Z tests/mpi/zero_check.lua "$@" >>"$out" 2>&1 ||
    echo "FAIL zero_check.lua $*: mpirun exited $?" >>"$out"
}
for stage in 0 1 2 3; do run $stage 0 1 0; done
for stage in 1 2 3; do run $stage 1 1 0; done          # optimizer offload to the CPU
for stage in 1 2 3; do run $stage 0 3 0.05; done       # accumulation 3 + clipping
for stage in 1 2 3; do run $stage 0 2 0.05 0 1; done   # overlap_comm
run 3 0 2 0.05 0 0 5000 1e9 0 0                       # stage 3, small prefetch bucket
for stage in 2 3; do                                   # bf16 model: bf16 buckets (default) vs fp32
  mpirun $MPI_FLAGS -np "$NP" -x ZRUN_HOME -x ZRUN_CHECK_DEVICE -x NCCL_NVLS_ENABLE $Z tests/mpi/comm_dtype_check.lua $stage 1 >>"$out" 2>&1 ||
    echo "FAIL comm_dtype_check.lua $stage: mpirun exited $?" >>"$out"
done
for stage in 1 2 3; do                                 # data_types.grad_accum_dtype bf16 vs fp32
  mpirun $MPI_FLAGS -np "$NP" -x ZRUN_HOME -x ZRUN_CHECK_DEVICE -x NCCL_NVLS_ENABLE $Z tests/mpi/grad_accum_check.lua $stage >>"$out" 2>&1 ||
    echo "FAIL grad_accum_check.lua $stage: mpirun exited $?" >>"$out"
done
for clip in 0 0.05; do                                # bf16 master and moments: DeepSpeed's step, stages alike
  mpirun $MPI_FLAGS -np "$NP" -x ZRUN_HOME -x ZRUN_CHECK_DEVICE -x NCCL_NVLS_ENABLE $Z tests/mpi/bf16_master_check.lua $clip >>"$out" 2>&1 ||
    echo "FAIL bf16_master_check.lua $clip: mpirun exited $?" >>"$out"
done
# Lamb: 1 GPU at stage 0 writes the reference; NP GPUs at every stage (and with offload) match it
# (the per-parameter trust-ratio sums all-reduced with NCCL)
lref=$(mktemp)
mpirun $MPI_FLAGS -np 1 -x ZRUN_HOME -x ZRUN_CHECK_DEVICE -x NCCL_NVLS_ENABLE $Z tests/mpi/lamb_check.lua 0 0 "$lref" >>"$out" 2>&1 ||
  echo "FAIL lamb_check.lua reference: mpirun exited $?" >>"$out"
for a in "0 0" "1 0" "2 0" "3 0" "1 1" "2 1" "3 1"; do
  mpirun $MPI_FLAGS -np "$NP" -x ZRUN_HOME -x ZRUN_CHECK_DEVICE -x NCCL_NVLS_ENABLE $Z tests/mpi/lamb_check.lua $a "$lref" >>"$out" 2>&1 ||
    echo "FAIL lamb_check.lua $a: mpirun exited $?" >>"$out"
done
rm -f "$lref"
# the main recipe as users run it: a plain "cuda" device, one GPU per rank picked from the local rank
for c in zero2 zero3; do
  if mpirun $MPI_FLAGS -np "$NP" -x ZRUN_HOME -x NCCL_NVLS_ENABLE $Z recipes/finetune_llama.lua --config configs/$c.json \
      max_steps=4 output_dir="${TMPDIR:-/tmp}/zrun_multi_gpu_$c" >"$out.r" 2>&1 &&
    grep -q "device cuda" "$out.r" && grep -q "done: 4 steps" "$out.r"; then
    echo "PASS recipe with configs/$c.json np=$NP " >>"$out"
  else
    echo "FAIL recipe with configs/$c.json np=$NP:" >>"$out"; tail -5 "$out.r" >>"$out"
  fi
done
rm -f "$out.r"
# a zrun built without MPI would run NP independent world-size-1 checks: count those as failures
grep '^PASS ' "$out" | grep -v "np=$NP " | sed 's/^PASS /FAIL (world size is not '"$NP"': is zrun built with MPI?) /' >>"$out"
cat "$out"
p=$(grep '^PASS ' "$out" | grep -c "np=$NP "); f=$(grep -c '^FAIL ' "$out")
echo "$p passed, $f failed"
[ "$f" -eq 0 ]
