#!/bin/sh
# bf16_master_weights_and_grads + bf16_optimizer_states at stages 1-3 and with optimizer offload on
# 2 and 3 CPU ranks: each step against DeepSpeed's restated step, the stages bit-identical
# (tests/mpi/bf16_master_check.lua), with and without gradient clipping.
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
for np in 2 3; do
  for clip in 0 0.05; do
    mpirun $MPI_FLAGS -np $np $Z tests/mpi/bf16_master_check.lua $clip || echo "FAIL bf16 master np=$np clip $clip: mpirun exited $?"
  done
done
