#!/bin/sh
# ZenFlow over several GPUs of one host (NCCL collectives, one GPU per rank) against the one-GPU run:
# tests/mpi/test_zenflow.sh with ZRUN_CHECK_DEVICE=cuda. Run on the GPU machine:
#   sh tests/cuda/test_zenflow_multi_gpu.sh   (needs 2 GPUs; the np=4 runs need 4). Part of tests/run_cuda.sh.
export ZRUN_CHECK_DEVICE=cuda NCCL_NVLS_ENABLE=0
NP=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$NP" -ge 2 ] || { echo "SKIP multi-GPU ZenFlow: needs 2 or more GPUs (found $NP)"; exit 0; }
command -v mpirun >/dev/null || { echo "SKIP multi-GPU ZenFlow: mpirun not found"; exit 0; }
ZENFLOW_MAX_NP=$NP sh "$(dirname "$0")/../mpi/test_zenflow.sh"
