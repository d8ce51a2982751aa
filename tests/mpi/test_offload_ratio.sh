#!/bin/sh
# Partial optimizer offload (offload_optimizer.ratio) on the CPU: ratios 0, 0.3 and 1 at stages
# 1-3, 1 and 2 ranks, accumulation 1 and 4, against ratio 1 and no offload, and a checkpoint saved
# at one ratio loaded at another (tests/mpi/offload_ratio_check.lua); Lion, Adagrad and SGD across
# the split; bf16 weights (the device part's cast against the pipeline's). 777-element pipeline
# chunks cut parameters and the split alike.
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
export ZRUN_OFFLOAD_CHUNK=777
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
for np in 1 2; do
  for stage in 1 2 3; do
    for gas in 1 4; do
      for ratio in 0 0.3 1; do
        mpirun $MPI_FLAGS -np $np $Z tests/mpi/offload_ratio_check.lua $stage $gas $ratio "$work" ||
          echo "FAIL offload ratio $ratio stage $stage np=$np gas=$gas: mpirun exited $?"
      done
    done
  done
done
for opt in lion adagrad sgd; do
  mpirun $MPI_FLAGS -np 2 $Z tests/mpi/offload_ratio_check.lua 2 2 0.5 "$work" $opt ||
    echo "FAIL offload ratio 0.5 $opt stage 2 np=2: mpirun exited $?"
done
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/offload_ratio_check.lua 2 2 0.3 "$work" adamw bf16 ||
  echo "FAIL offload ratio 0.3 bf16 stage 2 np=2: mpirun exited $?"
mpirun $MPI_FLAGS -np 1 $Z tests/mpi/offload_ratio_check.lua 3 1 0.3 "$work" adamw bf16 ||
  echo "FAIL offload ratio 0.3 bf16 stage 3 np=1: mpirun exited $?"
