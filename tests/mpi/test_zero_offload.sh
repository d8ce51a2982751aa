#!/bin/sh
# ZeRO optimizer offload with gradient accumulation and clipping (the host partition's lazy
# zeroing: the first gradient of a step overwrites, later micro-steps add, untouched ranges read
# as zero), with overlap_comm and stage-3 persistent parameters, against the single-process
# reference of tests/mpi/zero_check.lua. The kernels themselves: tests/c/test_offload.c.
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
for np in 1 2 3; do
  for stage in 1 2 3; do
    mpirun $MPI_FLAGS -np $np $Z tests/mpi/zero_check.lua $stage 1 3 0.05 || echo "FAIL stage $stage offload gas=3 clip np=$np: mpirun exited $?"
  done
done
for stage in 1 2 3; do
  mpirun $MPI_FLAGS -np 4 $Z tests/mpi/zero_check.lua $stage 1 2 0.05 0 1 || echo "FAIL stage $stage offload overlap_comm: mpirun exited $?"
done
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zero_check.lua 3 1 2 0.05 5000 || echo "FAIL stage 3 offload persistence: mpirun exited $?"
