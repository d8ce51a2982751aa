#!/bin/sh
# Deadlines and the debug check of the collectives (runtime/zero/comm_watch.c) on CPU ranks: a rank
# that never arrives (blocking, async, inside ZeRO training), a rank that calls another collective,
# a shape mismatch (ZRUN_COMM_DEBUG=1). Each must end every rank soon after the 2 s deadline, with
# exactly one line naming the culprit. A rank late by less than the deadline, and the debug check
# on a correct program, change nothing. With ZRUN_CHECK_DEVICE=cuda the same runs on one GPU per
# rank through NCCL (tests/cuda/test_comm_timeout_gpu.sh).
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
export ZRUN_COMM_TIMEOUT=2
D="" MAX=12 NP3=3 # in the expected lines: the device; seconds allowed; ranks for the 3-rank cases
if [ "$ZRUN_CHECK_DEVICE" = cuda ]; then # NCCL set-up, the watchdog's tick and longer answers add time
  D=", cuda:[0-9]*" MAX=40 NP3=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$NP3" -gt 3 ] && NP3=3
fi
# name, grep pattern of the one expected line, mpirun arguments...
expect_stop() {
  name=$1 pat=$2; shift 2
  t0=$(date +%s)
  out=$(timeout 90 mpirun $MPI_FLAGS "$@" 2>&1); rc=$?
  el=$(($(date +%s) - t0))
  n=$(echo "$out" | grep -c -- "$pat")
  lines=$(echo "$out" | grep -c "comm timeout\|comm error\|comm mismatch")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" -eq 1 ] && [ "$lines" -eq 1 ] && [ $el -le $MAX ]; then
    echo "PASS $name (every rank ended after ${el} s)"
  else
    echo "FAIL $name: exit $rc after ${el} s (at most $MAX), $n of $lines line(s) match '$pat': $(echo "$out" | grep '^\[rank' | head -3)"
  fi
}
expect_ok() {
  name=$1; shift
  out=$(timeout 90 mpirun $MPI_FLAGS "$@" 2>&1); rc=$?
  if [ $rc -eq 0 ] && echo "$out" | grep -q "completed"; then echo "PASS $name"
  else echo "FAIL $name: exit $rc: $(echo "$out" | head -3)"; fi
}
H=tests/mpi/hang_check.lua
expect_stop "a rank that never arrives is named ($NP3 ranks: one line)" \
  "^\[rank 0\] comm timeout: all_reduce #[0-9]* (f32 (4), sum$D) did not complete within 2 s (ZRUN_COMM_TIMEOUT); not arrived: rank 1 (no answer" \
  -np $NP3 $Z $H absent
expect_stop "rank 0 stuck: the lowest waiting rank reports, the others defer" \
  "^\[rank 1\] comm timeout: all_reduce #[0-9]* (f32 (4), sum$D) .*not arrived: rank 0 (no answer" -np $NP3 $Z $H absent 0
expect_stop "a rank that ended its program early is named" \
  "^\[rank 0\] comm timeout: all_reduce #[0-9]* (f32 (4), sum$D) .*not arrived: rank 1 (no answer" -np 2 $Z $H exit
expect_stop "an async handle waits under the deadline too" \
  "^\[rank 0\] comm timeout: all_reduce #[0-9]* (f32 (4), sum$D) .*not arrived: rank 1 (no answer" -np 2 $Z $H async
expect_stop "ZeRO stage 2: the bucket, its parameter and the step are named" \
  "^\[rank 0\] comm timeout: reduce_scatter #[0-9]* (f32 ([0-9]*) from [0-9]*, sum$D, grad bucket lm_head.weight, step 2) .*not arrived: rank 1 (no answer" \
  -np 2 $Z $H engine
# Blocking MPI collectives are always compared (zr_watch_arrive); NCCL ones only in debug mode.
[ "$ZRUN_CHECK_DEVICE" = cuda ] && export ZRUN_COMM_DEBUG=1
expect_stop "a rank calling another collective is named" \
  "^\[rank 0\] comm mismatch: collective #[0-9]* differs between ranks: rank 1 calls all_gather #[0-9]* (f32 (4) into 8$D), but rank 0 calls all_reduce #[0-9]* (f32 (4), sum$D)" \
  -np 2 $Z $H collective
expect_stop "a shape mismatch is named" \
  "^\[rank 0\] comm mismatch: collective #[0-9]* differs between ranks: rank 1 calls all_reduce #[0-9]* (f32 (5), sum$D), but ranks* 0[,2]* calls* all_reduce #[0-9]* (f32 (4), sum$D)" \
  -np $NP3 $Z $H shape
export ZRUN_COMM_DEBUG=1
expect_stop "debug: an asynchronous collective's shape mismatch is named" \
  "^\[rank 0\] comm mismatch: collective #[0-9]* differs between ranks: rank 1 calls all_reduce #[0-9]* (f32 (5), sum$D), but rank 0 calls all_reduce #[0-9]* (f32 (4), sum$D)" \
  -np 2 $Z $H async_shape
expect_ok "debug: a correct program completes under the check" -np $NP3 $Z $H ok
out=$(timeout 90 mpirun $MPI_FLAGS -np 1 $Z $H ok : -np 1 env ZRUN_COMM_DEBUG=0 $Z $H ok 2>&1); rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q "ZRUN_COMM_DEBUG is on for rank 0 but off for rank 1: set it for every rank"; then
  echo "PASS debug mode must be the same on every rank"
else echo "FAIL debug mode must be the same on every rank: exit $rc: $(echo "$out" | head -3)"; fi
unset ZRUN_COMM_DEBUG
expect_ok "a rank 1 s late, inside the 2 s deadline, is no fault" -np 2 $Z $H late
out=$(ZRUN_COMM_TIMEOUT=soon $Z $H ok 2>&1)
if echo "$out" | grep -q "ZRUN_COMM_TIMEOUT must be a number of seconds >= 0 (0: no deadline), got 'soon'"; then
  echo "PASS a malformed ZRUN_COMM_TIMEOUT is refused"
else echo "FAIL a malformed ZRUN_COMM_TIMEOUT is refused: $out"; fi
# (a negative one meant no deadline, silently, as 0 does)
out=$(ZRUN_COMM_TIMEOUT=-5 $Z $H ok 2>&1)
if echo "$out" | grep -q "ZRUN_COMM_TIMEOUT must be a number of seconds >= 0 (0: no deadline), got '-5'"; then
  echo "PASS a negative ZRUN_COMM_TIMEOUT is refused"
else echo "FAIL a negative ZRUN_COMM_TIMEOUT is refused: $out"; fi
