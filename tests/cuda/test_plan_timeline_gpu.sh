#!/bin/sh
# The memory plan's peak total (its time-line maximum) against the measured GPU and host peaks,
# on one GPU and, with 2+ GPUs and mpirun, on every GPU of the host (one rank each):
# tests/mpi/plan_timeline_check.lua with ZRUN_CHECK_DEVICE=cuda (each case prints the gap by category
# at the peak; `zrun tests/cuda/plan_gap_gpu.lua stage=.. B=.. T=..` shows one case as a table).
# Part of tests/run_cuda.sh.
. "$(dirname "$0")/../mpi/mpi_env.sh"
export ZRUN_CHECK_DEVICE=cuda NCCL_NVLS_ENABLE=0
Z=${ZRUN_BIN:-./zrun}
$Z tests/mpi/plan_timeline_check.lua || echo "FAIL plan time-line on one GPU: exit $?"
NP=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$NP" -ge 2 ] && command -v mpirun >/dev/null; then
  mpirun $MPI_FLAGS -np "$NP" -x ZRUN_HOME -x ZRUN_CHECK_DEVICE -x NCCL_NVLS_ENABLE $Z \
    tests/mpi/plan_timeline_check.lua || echo "FAIL plan time-line on $NP GPUs: mpirun exited $?"
else
  echo "SKIP plan time-line on several GPUs: needs 2 or more GPUs and mpirun (found $NP)"
fi
