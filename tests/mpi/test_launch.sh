#!/bin/sh
# Mixed launches under mpirun: torchrun's WORLD_SIZE disagreeing with mpirun's world is refused
# with the reason (every rank exits, none hangs); agreeing with it, the job runs.
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
out=$(WORLD_SIZE=3 timeout 60 mpirun $MPI_FLAGS -np 2 $Z -e 'require("zrun").dist.barrier(); print("joined")' 2>&1); rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && ! echo "$out" | grep -q joined &&
   echo "$out" | grep -q "mixed launch: openmpi started this process as OMPI_COMM_WORLD_SIZE=2 but WORLD_SIZE=3"; then
  echo "PASS mixed launch refused"
else
  echo "FAIL mixed launch refused: rc=$rc, output: $(echo "$out" | head -5)"
fi
out=$(WORLD_SIZE=2 timeout 60 mpirun $MPI_FLAGS -np 2 $Z -e 'local d = require("zrun").dist; d.barrier(); print("joined " .. d.rank() .. "/" .. d.world_size())' 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q "joined 1/2"; then
  echo "PASS agreeing WORLD_SIZE under mpirun runs"
else
  echo "FAIL agreeing WORLD_SIZE under mpirun runs: rc=$rc, output: $(echo "$out" | head -5)"
fi
