#!/bin/sh
# The Trainer on 2 MPI ranks (tests/mpi/trainer_check.lua): it learns at ZeRO stages 2 and 3,
# resuming checkpoint-4 in a fresh process continues the uninterrupted loss curve bit for bit, and
# evaluation over ranks weights every token once (odd row count, stage 3 gathering in lockstep; padded rows and a
# padding-free collator), and
# early stopping with save_strategy "best" stops every rank at the same step, and padded rows give the
# losses and gradients of one process (average_tokens_across_devices), also where an epoch ends in a
# completed last round and a shorter step; and, against transformers' and TRL's runs on 2 processes, each rank's
# train_loss, SFTTrainer's metrics where a loader ends in a completed round, and evaluation with dataloader_drop_last.
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
CK=tests/mpi/trainer_check.lua
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
for stage in 2 3; do
  for ref in tokens_ref epoch_end_ref; do
    $Z $CK $ref $stage "$W" >"$W/out" 2>&1 || echo "FAIL trainer_check $ref stage $stage: $(tail -3 "$W/out")"
  done
  for mode in full resume eval early tokens epoch_end; do
    if mpirun $MPI_FLAGS -np 2 $Z $CK $mode $stage "$W" >"$W/out" 2>&1; then grep '^PASS \|^FAIL ' "$W/out"
    else grep '^FAIL ' "$W/out" ||
      echo "FAIL trainer_check $mode stage $stage: mpirun exited with an error: $(grep -v '^step ' "$W/out" | tail -3)"; fi
  done
done
# transformers' Trainer on 2 processes (tests/golden/trainer_epochs_2ranks.json): the same steps, rows and losses;
# train_loss with steps after the last log (each process's own); TRL's SFTTrainer: its evaluations' batch statistics;
# the rows an evaluation reads with dataloader_drop_last
for mode in hf_epochs train_loss sft_eval hf_eval; do
  if mpirun $MPI_FLAGS -np 2 $Z $CK $mode 0 "$W" >"$W/out" 2>&1; then grep '^PASS \|^FAIL ' "$W/out"
  else grep '^FAIL ' "$W/out" || echo "FAIL trainer_check $mode: mpirun exited with an error: $(grep -v '^step ' "$W/out" | tail -3)"; fi
done
