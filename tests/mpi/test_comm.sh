#!/bin/sh
# Collectives on 2 and 4 CPU ranks through the MPI backend (oversubscribed: CI has 2 cores).
. "$(dirname "$0")/mpi_env.sh"
for n in 2 4; do
  echo "# np=$n"
  mpirun $MPI_FLAGS -np $n ${ZRUN_BIN:-./zrun} tests/mpi/comm_check.lua || exit 1
done
# A failing rank stops the job with its rank in the message instead of hanging the others.
out=$(timeout 60 mpirun $MPI_FLAGS -np 3 ${ZRUN_BIN:-./zrun} tests/mpi/abort_check.lua 2>&1); rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q "\[rank 1\] .*deliberate failure on rank 1"; then
  echo "PASS failing rank aborts every rank"
else
  echo "FAIL failing rank aborts every rank: rc=$rc, output: $(echo "$out" | head -5)"
fi
