#!/bin/sh
# ZenFlow (zero_optimization.zenflow) over several ranks: np=2 and np=4 against the np=1 run, at stages
# 1 and 2, with and without overlap_step, in f32 and bf16; resumes at np=2 from np=1's checkpoint and
# from np=2's own, with and without overlap_step (tests/mpi/zenflow_check.lua).
# On GPUs: tests/cuda/test_zenflow_multi_gpu.sh runs this with ZRUN_CHECK_DEVICE=cuda (ZENFLOW_MAX_NP: the
# GPUs there are; the np=4 runs need 4).
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
X=""
[ -n "$ZRUN_CHECK_DEVICE" ] && X="-x ZRUN_HOME -x ZRUN_CHECK_DEVICE -x NCCL_NVLS_ENABLE"
MPI_FLAGS="$MPI_FLAGS $X"
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
    mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zenflow_check.lua cmp_resumed $stage $ov "$ref" ||
      echo "FAIL zenflow stage $stage overlap_step=$ov np=2 resumed from np=1's checkpoint: mpirun exited $?"
  done
done
if [ "${ZENFLOW_MAX_NP:-4}" -ge 4 ]; then
  mpirun $MPI_FLAGS -np 4 $Z tests/mpi/zenflow_check.lua cmp 1 1 "$D/ref_1_1.safetensors" ||
    echo "FAIL zenflow stage 1 overlap_step np=4: mpirun exited $?"
  mpirun $MPI_FLAGS -np 4 $Z tests/mpi/zenflow_check.lua cmp 2 0 "$D/ref_2_0.safetensors" ||
    echo "FAIL zenflow stage 2 np=4: mpirun exited $?"
fi
for stage in 1 2; do # bf16 weights: .grad in bf16 at several ranks (widened), f32 at one
  ref="$D/ref_${stage}_bf16.safetensors"
  mpirun $MPI_FLAGS -np 1 $Z tests/mpi/zenflow_check.lua ref $stage 0 "$ref" bf16 &&
    mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zenflow_check.lua cmp $stage 0 "$ref" bf16 ||
    echo "FAIL zenflow stage $stage bf16 np=2: mpirun exited $?"
done
for stage in 1 2; do
  for ov in 0 1; do
    mkdir "$D/ckpt${stage}_$ov"
    mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zenflow_check.lua resume $stage "$D/ckpt${stage}_$ov" $ov ||
      echo "FAIL zenflow stage $stage overlap_step=$ov np=2 resume: mpirun exited $?"
  done
done
mkdir "$D/ckpt_bf16" # overlap_step's pending weights in bf16 (saved widened to f32)
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zenflow_check.lua resume 2 "$D/ckpt_bf16" 1 bf16 ||
  echo "FAIL zenflow stage 2 overlap_step bf16 np=2 resume: mpirun exited $?"
for stage in 1 2; do # update_interval "auto": the same windows as np=1 (rank 0's verdict), resumes
  for ov in 0 1; do
    ref="$D/ref_${stage}_${ov}_auto.safetensors"
    mpirun $MPI_FLAGS -np 1 $Z tests/mpi/zenflow_check.lua ref $stage $ov "$ref" auto &&
      mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zenflow_check.lua cmp $stage $ov "$ref" auto ||
      echo "FAIL zenflow stage $stage overlap_step=$ov update_interval auto np=2: mpirun exited $?"
    mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zenflow_check.lua cmp_resumed $stage $ov "$ref" auto ||
      echo "FAIL zenflow stage $stage overlap_step=$ov update_interval auto np=2 resumed from np=1: mpirun exited $?"
    mkdir "$D/ckpt${stage}_${ov}_auto"
    mpirun $MPI_FLAGS -np 2 $Z tests/mpi/zenflow_check.lua resume $stage "$D/ckpt${stage}_${ov}_auto" $ov auto ||
      echo "FAIL zenflow stage $stage overlap_step=$ov update_interval auto np=2 resume: mpirun exited $?"
  done
done
