#!/bin/sh
# ZeRO stages 0-3, with and without optimizer offload, on 1, 2 and 4 CPU ranks, against a
# single-process reference (tests/mpi/zero_check.lua); also accumulation + clipping.
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
for np in 1 2 4; do
  for stage in 0 1 2 3; do
    for off in 0 1; do
      [ "$stage" = 0 ] && [ "$off" = 1 ] && continue
      mpirun $MPI_FLAGS -np $np $Z tests/mpi/zero_check.lua $stage $off 1 0 || echo "FAIL stage $stage offload $off np=$np: mpirun exited $?"
    done
  done
done
for stage in 1 2 3; do
  mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zero_check.lua $stage 0 3 0.05 || echo "FAIL stage $stage gas=3 clip: mpirun exited $?"
done
# stage 3 with small parameters kept whole (DeepSpeed's stage3_param_persistence_threshold)
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zero_check.lua 3 0 2 0.05 5000 || echo "FAIL stage 3 persistence: mpirun exited $?"
# stage 3 prefetch: off, a small bucket, a small stage3_max_live_parameters, on 3 ranks
# (stage3_max_reuse_distance 0 there, so that only prefetching makes parameters live ahead of use)
mpirun $MPI_FLAGS -np 3 $Z tests/mpi/zero_check.lua 3 0 1 0 0 0 0 1e9 0 0 || echo "FAIL stage 3 prefetch off: mpirun exited $?"
mpirun $MPI_FLAGS -np 3 $Z tests/mpi/zero_check.lua 3 0 2 0.05 0 0 5000 1e9 0 0 || echo "FAIL stage 3 prefetch 5000: mpirun exited $?"
mpirun $MPI_FLAGS -np 3 $Z tests/mpi/zero_check.lua 3 0 1 0 0 0 5e7 30000 0 0 || echo "FAIL stage 3 max_live: mpirun exited $?"
mpirun $MPI_FLAGS -np 3 $Z tests/mpi/zero_check.lua 3 0 1 0 0 0 5e7 1e9 0 0 || echo "FAIL stage 3 default prefetch: mpirun exited $?"
# stage3_max_reuse_distance: modules whose backward comes soon keep their parameters from forward
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zero_check.lua 3 0 2 0.05 0 0 0 1e9 0 60000 || echo "FAIL stage 3 reuse: mpirun exited $?"
# gradient checkpointing: recomputation inside backward gathers again (no prefetch there)
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zero_check.lua 3 0 2 0.05 0 0 20000 1e9 1 || echo "FAIL stage 3 checkpointing: mpirun exited $?"
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zero_check.lua 2 0 1 0 0 0 5e7 1e9 1 || echo "FAIL stage 2 checkpointing: mpirun exited $?"
# a tiny GPT-2 (zr.mlp_gelu and zr.add_layer_norm run with the ZeRO-3 hooks around them, as Llama's
# fused ops in the runs above): stage 3 with prefetch, a small live bound, checkpointing; stage 2
for a in "3 0 1 0" "3 0 2 0.05 0 0 5000 1e9 0 0" "3 0 1 0 0 0 5e7 30000 0 0" "3 0 2 0.05 0 0 20000 1e9 1" "2 0 2 0.05"; do
  ZERO_CHECK_MODEL=gpt2 mpirun $MPI_FLAGS -np 3 $Z tests/mpi/zero_check.lua $a || echo "FAIL gpt2 zero_check $a: mpirun exited $?"
done
# overlap_comm: a bucket's reduce-scatter in flight while the next bucket fills (two buffer sets)
for stage in 1 2 3; do
  mpirun $MPI_FLAGS -np 4 $Z tests/mpi/zero_check.lua $stage 0 2 0.05 0 1 || echo "FAIL stage $stage overlap_comm: mpirun exited $?"
done
# gradient buckets in the communication dtype (bf16 model: bf16 buckets by default, vs fp32)
for stage in 1 2 3; do
  mpirun $MPI_FLAGS -np 2 $Z tests/mpi/comm_dtype_check.lua $stage || echo "FAIL comm dtype stage $stage: mpirun exited $?"
done
mpirun $MPI_FLAGS -np 3 $Z tests/mpi/comm_dtype_check.lua 2 1 || echo "FAIL comm dtype overlap_comm np=3: mpirun exited $?"
# Lion, Adagrad and SGD: every partitioned stage (with and without offload) matches stage 0
for np in 2 3; do
  for stage in 1 2 3; do
    for off in 0 1; do
      mpirun $MPI_FLAGS -np $np $Z tests/mpi/optim_check.lua $stage $off || echo "FAIL optimizers stage $stage offload $off np=$np: mpirun exited $?"
    done
  done
done
# Lamb: one trust ratio per parameter tensor, so every stage and world size (with and without
# offload) matches 1 rank at stage 0, whose weights the first run writes
LAMB_REF=$(mktemp)
mpirun $MPI_FLAGS -np 1 $Z tests/mpi/lamb_check.lua 0 0 "$LAMB_REF" || echo "FAIL Lamb reference run: mpirun exited $?"
for np in 1 2 3; do
  for stage in 0 1 2 3; do
    for off in 0 1; do
      { [ "$stage" = 0 ] && { [ "$off" = 1 ] || [ "$np" = 1 ]; }; } && continue
      mpirun $MPI_FLAGS -np $np $Z tests/mpi/lamb_check.lua $stage $off "$LAMB_REF" || echo "FAIL Lamb stage $stage offload $off np=$np: mpirun exited $?"
    done
  done
done
rm -f "$LAMB_REF"
# a training forward's out.logits, made again on read (the loss took the logits over in place)
for stage in 0 3; do
  mpirun $MPI_FLAGS -np 2 $Z tests/mpi/lazy_logits_check.lua $stage || echo "FAIL lazy logits stage $stage: mpirun exited $?"
done
