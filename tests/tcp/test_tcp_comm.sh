#!/bin/sh
# Collectives over the TCP backend on 2, 3 and 4 ranks started as torchrun starts them (variables
# set by hand; no MPI involved): the MPI tests' checks (tests/mpi/comm_check.lua) and awkward sizes
# and dtypes (tcp_check.lua); then a failing rank stops every rank instead of hanging them.
cd "$(dirname "$0")/../.." || exit 1
. tests/tcp/tcp_env.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for n in 2 3 4; do
  for check in tests/mpi/comm_check.lua tests/tcp/tcp_check.lua; do
    tcp_launch $n "$tmp" $Z $check; rc=$?
    sed "s/^PASS /PASS np=$n: /" "$tmp/0.log"
    if [ $rc -ne 0 ]; then echo "FAIL $check on $n TCP ranks: exit $rc: $(cat "$tmp"/*.log | grep -v '^PASS' | head -5)"; fi
  done
done
tcp_launch 3 "$tmp" $Z tests/mpi/abort_check.lua; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "\[rank 1\] .*deliberate failure on rank 1" "$tmp/1.log" &&
   ! grep -q "passed the barrier" "$tmp"/*.log; then
  echo "PASS failing rank stops every TCP rank"
else
  echo "FAIL failing rank stops every TCP rank: rc=$rc: $(cat "$tmp"/*.log | head -5)"
fi
