#!/bin/sh
# ZeRO equivalence on several GPUs of one host: every stage, offload, accumulation + clipping and
# overlap_comm with NCCL collectives, one GPU per rank, against the single-process reference that
# tests/mpi/zero_check.lua computes on each rank's GPU. Run on the GPU machine:
#   sh tests/mpi/test_zero_gpu.sh [NP]        (NP defaults to the number of GPUs; needs NP >= 2)
# Ends with "N passed, N failed". NVLink multicast stays off (the machine's notes require it).
. "$(dirname "$0")/mpi_env.sh"
export ZRUN_CHECK_DEVICE=cuda NCCL_NVLS_ENABLE=0
Z=${ZRUN_BIN:-./zrun}
NP=${1:-$(nvidia-smi -L 2>/dev/null | wc -l)}
[ "$NP" -ge 2 ] || { echo "test_zero_gpu: needs 2 or more GPUs (found $NP)"; echo "0 passed, 0 failed"; exit 0; }
out=$(mktemp); trap 'rm -f "$out"' EXIT
run() { # args for zero_check.lua
  mpirun $MPI_FLAGS -np "$NP" -x ZRUN_HOME -x ZRUN_CHECK_DEVICE -x NCCL_NVLS_ENABLE $Z tests/mpi/zero_check.lua "$@" >>"$out" 2>&1 ||
    echo "FAIL zero_check.lua $*: mpirun exited $?" >>"$out"
}
for stage in 0 1 2 3; do run $stage 0 1 0; done
for stage in 1 2 3; do run $stage 1 1 0; done          # optimizer offload to the CPU
for stage in 1 2 3; do run $stage 0 3 0.05; done       # accumulation 3 + clipping
for stage in 1 2 3; do run $stage 0 2 0.05 0 1; done   # overlap_comm
run 3 0 2 0.05 0 0 5000 1e9 0 0                       # stage 3, small prefetch bucket
cat "$out"
p=$(grep -c '^PASS ' "$out"); f=$(grep -c '^FAIL ' "$out")
echo "$p passed, $f failed"
[ "$f" -eq 0 ]
