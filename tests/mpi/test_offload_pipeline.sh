#!/bin/sh
# ZeRO optimizer offload's step pipeline (runtime/zero/offload.h) on the CPU, with chunks of 777
# elements that cut parameters: gradients kept on the "device" vs sent to the host, bit for bit
# (tests/mpi/offload_pipeline_check.lua), at stages 1-3, 1 and 2 ranks, accumulation 1 and 4;
# bf16/fp16 gradient accumulation (device mode against fp32, and the 16-bit host partition against
# the device mode bit for bit); and the device mode against the independent
# single-process reference of tests/mpi/zero_check.lua.
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
export ZRUN_OFFLOAD_CHUNK=777
for np in 1 2; do
  for stage in 1 2 3; do
    for gas in 1 4; do
      mpirun $MPI_FLAGS -np $np $Z tests/mpi/offload_pipeline_check.lua $stage $gas || echo "FAIL offload pipeline stage $stage np=$np gas=$gas: mpirun exited $?"
    done
    ZRUN_OFFLOAD_GRADS=device mpirun $MPI_FLAGS -np $np $Z tests/mpi/zero_check.lua $stage 1 3 0.05 || echo "FAIL stage $stage offload device grads np=$np: mpirun exited $?"
  done
done
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/offload_pipeline_check.lua 2 4 bf16 || echo "FAIL offload pipeline bf16 grads stage 2: mpirun exited $?"
mpirun $MPI_FLAGS -np 1 $Z tests/mpi/offload_pipeline_check.lua 3 1 bf16 || echo "FAIL offload pipeline bf16 grads stage 3: mpirun exited $?"
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/offload_pipeline_check.lua 3 2 bf16 || echo "FAIL offload pipeline bf16 grads stage 3 np=2: mpirun exited $?"
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/offload_pipeline_check.lua 1 2 fp16 || echo "FAIL offload pipeline fp16 grads stage 1: mpirun exited $?"
