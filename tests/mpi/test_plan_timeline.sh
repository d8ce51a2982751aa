#!/bin/sh
# The memory plan's time-line peak against the measured peak of every rank at 1, 2 and 4 ranks
# (tests/mpi/plan_timeline_check.lua).
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
for np in 1 2 4; do
  mpirun $MPI_FLAGS -np $np $Z tests/mpi/plan_timeline_check.lua || echo "FAIL plan time-line np=$np: exit $?"
done
