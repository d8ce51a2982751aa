#!/bin/sh
# ZenFlow (zero_optimization.zenflow) over several ranks: np=2 and np=4 against the np=1 run, at stages
# 1 and 2, with and without overlap_step; a resume from a checkpoint at np=2 (tests/mpi/zenflow_check.lua).
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
for stage in 1 2; do
  for ov in 0 1; do
    ref="$D/ref_${stage}_$ov.safetensors"
    if ! mpirun $MPI_FLAGS -np 1 $Z tests/mpi/zenflow_check.lua ref $stage $ov "$ref"; then
      echo "FAIL zenflow stage $stage overlap_step=$ov np=1 reference: mpirun exited $?"; continue
    fi
    mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zenflow_check.lua cmp $stage $ov "$ref" ||
      echo "FAIL zenflow stage $stage overlap_step=$ov np=2: mpirun exited $?"
  done
done
mpirun $MPI_FLAGS -np 4 $Z tests/mpi/zenflow_check.lua cmp 1 1 "$D/ref_1_1.safetensors" ||
  echo "FAIL zenflow stage 1 overlap_step np=4: mpirun exited $?"
mpirun $MPI_FLAGS -np 4 $Z tests/mpi/zenflow_check.lua cmp 2 0 "$D/ref_2_0.safetensors" ||
  echo "FAIL zenflow stage 2 np=4: mpirun exited $?"
for stage in 1 2; do
  mkdir "$D/ckpt$stage"
  mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zenflow_check.lua resume $stage "$D/ckpt$stage" ||
    echo "FAIL zenflow stage $stage np=2 resume: mpirun exited $?"
done
