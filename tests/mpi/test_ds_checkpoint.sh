#!/bin/sh
# DeepSpeed's own ZeRO checkpoints (tests/golden/torch_files) loaded by every rank of a zrun engine
# under mpirun (tests/mpi/ds_checkpoint_check.lua): saved by 2 or 3 ranks at ZeRO-2 / ZeRO-3 or in bf16
# with BF16_Optimizer, saved without ZeRO by one process (FP16_Optimizer in bf16, the fp32 optimizer's own state),
# or made universal by ds_to_universal.py (from ZeRO-2 and ZeRO-3), loaded on 2 ranks at zrun stages 1-3 and
# on 4 ranks; each rank's parameters equal the saved weights and training goes on (the loss falls).
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
for c in "ds_zero2 2 2" "ds_zero2 3 2" "ds_zero2_aligned 1 2" "ds_zero3 3 2" "ds_zero3 2 4" "ds_universal 3 2" "ds_universal3 2 2" \
    "ds_bf16_nozero 2 2" "ds_nozero_bf16 3 2" "ds_nozero_fp32 1 4"; do
  set -- $c
  mpirun $MPI_FLAGS -np "$3" $Z tests/mpi/ds_checkpoint_check.lua "$1" "$2" 2>&1 | grep -v '^\[zrun\]' \
    || echo "FAIL ds_checkpoint_check $1 stage $2 np $3: mpirun exited"
done
