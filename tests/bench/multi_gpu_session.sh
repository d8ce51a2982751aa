#!/bin/sh
# The multi-GPU measurements in one go, on a machine with 2+ GPUs (run from the repo root with a
# zrun built with MPI, e.g. `make BUILD=/tmp/zgm` on the dev machine): the ZeRO equivalence and
# recipe test, then Llama-3.2-1B-shaped throughput per GPU at stages 1-3 with overlap_comm, one
# micro-batch and 8, on NP GPUs against one GPU (phases synced: forward / backward / step ms).
#   sh tests/bench/multi_gpu_session.sh [ZRUN_BINARY] [NP]
Z=${1:-./zrun}; NP=${2:-$(nvidia-smi -L 2>/dev/null | wc -l)}
export ZRUN_HOME=${ZRUN_HOME:-$PWD} NCCL_NVLS_ENABLE=0
. "$(dirname "$0")/../mpi/mpi_env.sh"
B="tests/bench/bench_llama.lua breakdown=1"
echo "### multi-GPU tests"; ZRUN_BIN=$Z sh tests/cuda/test_zero_multi_gpu.sh "$NP" | grep -v '^PASS'
for s in 1 2 3; do
  for g in 1 8; do
    echo "### stage $s overlap_comm gas=$g: 1 GPU, then $NP"
    $Z $B stage=$s overlap=1 gas=$g steps=4 2>&1 | grep -E "tokens/s|phases"
    mpirun $MPI_FLAGS -np "$NP" -x ZRUN_HOME -x NCCL_NVLS_ENABLE $Z $B stage=$s overlap=1 gas=$g steps=4 2>&1 |
      grep -E "tokens/s|phases" | head -2
  done
done
