#!/bin/sh
# Collective deadlines through NCCL (runtime/zero/comm_nccl.c's watchdog): tests/mpi/test_comm_timeout.sh
# with one GPU per rank. Run on the GPU machine with 2+ GPUs: sh tests/cuda/test_comm_timeout_gpu.sh
# NVLink multicast stays off (the machine's notes require it). Part of tests/run_cuda.sh.
n=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$n" -ge 2 ] || { echo "SKIP NCCL collective deadlines: needs 2 or more GPUs (found $n)"; exit 0; }
command -v mpirun >/dev/null || { echo "SKIP NCCL collective deadlines: mpirun not found"; exit 0; }
ZRUN_CHECK_DEVICE=cuda NCCL_NVLS_ENABLE=0 exec sh "$(dirname "$0")/../mpi/test_comm_timeout.sh"
