#!/bin/sh
# Faults on ranks joined over TCP, under a 2 s ZRUN_COMM_TIMEOUT (tests/mpi/hang_check.lua's cases):
# a rank that never arrives, ends early or is killed, rank 0 stuck, a rank calling another collective
# or another shape. Each must end every rank soon, with exactly one line naming the culprit. Then
# the rendezvous: a port in use, a rank that never joins, ranks that disagree on WORLD_SIZE.
cd "$(dirname "$0")/../.." || exit 1
. tests/tcp/tcp_env.sh
export ZRUN_COMM_TIMEOUT=2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
H=tests/mpi/hang_check.lua
# name, grep pattern of the one expected line, seconds allowed, ranks, hang_check arguments...
expect_stop() {
  name=$1 pat=$2 max=$3 n=$4; shift 4
  rm -f "$tmp"/*.log
  t0=$(date +%s)
  tcp_launch $n "$tmp" $Z $H "$@"; rc=$?
  el=$(($(date +%s) - t0))
  m=$(cat "$tmp"/*.log | grep -c -- "$pat")
  lines=$(cat "$tmp"/*.log | grep -c "comm timeout\|comm error\|comm mismatch")
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$m" -eq 1 ] && [ "$lines" -eq 1 ] && [ $el -le $max ]; then
    echo "PASS $name (every rank ended after ${el} s)"
  else
    echo "FAIL $name: exit $rc after ${el} s (at most $max), $m of $lines line(s) match '$pat': $(cat "$tmp"/*.log | head -3)"
  fi
}
expect_stop "a rank that never arrives is named (3 ranks, one line)" \
  "^\[rank 0\] comm timeout: all_reduce #[0-9]* (f32 (4), sum) did not complete within 2 s (ZRUN_COMM_TIMEOUT); not arrived: rank 1 (no answer: busy outside any collective, or stuck); stopping all ranks$" 8 3 absent
expect_stop "rank 0 stuck: rank 1 names it, rank 0's stop thread ends it" \
  "^\[rank 1\] comm timeout: all_reduce #[0-9]* (f32 (4), sum) .*; not arrived: rank 0 (no answer within" 8 3 absent 0
expect_stop "a rank that ended its program early is named at once" \
  "^\[rank 0\] comm error: all_reduce #[0-9]* (f32 (4), sum) failed after 0.[0-9] s: a rank has left the job; not arrived: rank 1 (it ended its program without calling it)" 3 2 exit
expect_stop "an async handle waits under the deadline too" \
  "^\[rank 0\] comm timeout: all_reduce #[0-9]* (f32 (4), sum) .*not arrived: rank 1 (no answer" 8 2 async
expect_stop "ZeRO stage 2: the bucket, its parameter and the step are named" \
  "^\[rank 0\] comm timeout: reduce_scatter #[0-9]* (f32 ([0-9]*) from [0-9]*, sum, grad bucket lm_head.weight, step 2) .*not arrived: rank 1 (no answer" 15 2 engine
expect_stop "a rank calling another collective is named" \
  "^\[rank 0\] comm mismatch: collective #[0-9]* differs between ranks: rank 1 calls all_gather #[0-9]* (f32 (4) into 8), but rank 0 calls all_reduce #[0-9]* (f32 (4), sum); stopping all ranks" 3 2 collective
expect_stop "a shape mismatch is named" \
  "^\[rank 0\] comm mismatch: collective #[0-9]* differs between ranks: rank 1 calls all_reduce #[0-9]* (f32 (5), sum), but ranks 0,2 call all_reduce #[0-9]* (f32 (4), sum)" 3 3 shape
export ZRUN_COMM_DEBUG=1 # (compares asynchronous collectives too)
expect_stop "debug: an asynchronous collective's shape mismatch is named" \
  "^\[rank 0\] comm mismatch: collective #[0-9]* differs between ranks: rank 1 calls all_reduce #[0-9]* (f32 (5), sum), but rank 0 calls all_reduce #[0-9]* (f32 (4), sum)" 3 2 async_shape
unset ZRUN_COMM_DEBUG
for mode in late ok; do
  tcp_launch 2 "$tmp" $Z $H $mode; rc=$?
  if [ $rc -eq 0 ] && grep -q "completed" "$tmp/0.log"; then echo "PASS $mode: completes"; else echo "FAIL $mode: exit $rc: $(cat "$tmp"/*.log | head -3)"; fi
done

# a rank killed (no goodbye) while the others wait: named at once, long before the deadline
port=$(free_port)
for r in 0 1 2; do
  # (no timeout wrapper, so that the kill reaches zrun itself; the 60 s deadline bounds them)
  RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZRUN_COMM_TIMEOUT=60 $Z $H absent >"$tmp/k$r.log" 2>&1 &
  eval pid$r=$!
done
t0=$(date +%s); sleep 2
kill -9 $pid1
wait $pid0; rc0=$?; wait $pid2; rc2=$?; wait $pid1 2>/dev/null
el=$(($(date +%s) - t0))
if [ $rc0 -ne 0 ] && [ $rc0 -ne 124 ] && [ $rc2 -ne 0 ] && [ $rc2 -ne 124 ] && [ $el -le 10 ] &&
   grep -q "^\[rank 0\] comm error: all_reduce #2 .*not arrived: rank 1 (closed its connections without a goodbye: crashed or killed)" "$tmp/k0.log" &&
   [ "$(cat "$tmp"/k*.log | grep -c 'comm ')" -eq 1 ]; then
  echo "PASS a killed rank is named at once (${el} s)"
else
  echo "FAIL a killed rank is named at once: exit $rc0/$rc2 after ${el} s: $(cat "$tmp"/k*.log | head -3)"
fi

# a rank stopped (SIGSTOP) amid a loop of 80 MB all-reduces (mostly in the ring transfer): rank 0 asks the others and names it,
# whether it was stopped in the ring transfer or before arriving; SIGCONT lets it take the stop
port=$(free_port)
for r in 0 1 2; do
  RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZRUN_COMM_TIMEOUT=2 $Z -e 'local zr = require "zrun"
    local t = zr.ones(20000000); for _ = 1, 100000 do zr.dist.all_reduce(t, "sum") end' >"$tmp/s$r.log" 2>&1 &
  eval pid$r=$!
done
sleep 2; kill -STOP $pid2; sleep 5; kill -CONT $pid2
wait $pid0; rc0=$?; wait $pid1; rc1=$?; wait $pid2; rc2=$?
if [ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] && [ $rc2 -ne 0 ] && [ "$(cat "$tmp"/s*.log | grep -c 'comm ')" -eq 1 ] &&
   grep -q "^\[rank 0\] comm timeout: all_reduce #[0-9]* (f32 (20000000), sum) .*not arrived: rank 2 (no answer" "$tmp/s0.log"; then
  echo "PASS a rank stopped amid the collectives is named"
else
  echo "FAIL a rank stopped amid the collectives is named: exit $rc0/$rc1/$rc2: $(cat "$tmp"/s*.log | head -3)"
fi

# rendezvous: name, pattern expected in rank R's log, seconds allowed, rank, then one "RANK WORLD_SIZE" per process
expect_refused() {
  name=$1 pat=$2 max=$3 who=$4; shift 4
  port=${PORT:-$(free_port)} pids=""
  rm -f "$tmp"/*.log
  t0=$(date +%s)
  for spec in "$@"; do
    set -- $spec
    RANK=$1 WORLD_SIZE=$2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 $Z -e 'require("zrun").dist.barrier(); print("joined")' >"$tmp/$1.$2.log" 2>&1 &
    pids="$pids $!"
  done
  ok=1; for p in $pids; do wait $p; r=$?; { [ $r -eq 0 ] || [ $r -eq 124 ]; } && ok=0; done
  el=$(($(date +%s) - t0))
  if [ $ok -eq 1 ] && [ $el -le $max ] && grep -q -- "$pat" "$tmp/$who.log" && [ "$(wc -l < "$tmp/$who.log")" -eq 1 ] &&
     ! grep -q joined "$tmp"/*.log; then
    echo "PASS $name (${el} s)"
  else
    echo "FAIL $name: after ${el} s (at most $max): $(cat "$tmp"/*.log | head -4)"
  fi
}
blocker=$(free_port)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$blocker ZRUN_COMM_TIMEOUT=30 timeout 30 $Z -e 'require("zrun").dist.barrier()' >/dev/null 2>&1 &
bpid=$!; sleep 1 # a rank 0 holding the port, waiting for its rank 1
PORT=$blocker expect_refused "a port in use: rank 0 says so in one line" \
  "^zrun: torchrun rendezvous: port $blocker is in use on rank 0's host .*choose a free port for every rank" 4 0.2 "0 2"
kill $bpid 2>/dev/null; wait $bpid 2>/dev/null
expect_refused "a rank that never joins is named by rank 0" \
  "^zrun: torchrun rendezvous: rank 2 of WORLD_SIZE=3 did not join rank 0 at MASTER_ADDR:MASTER_PORT=127.0.0.1:[0-9]* within 2 s" 5 0.3 "0 3" "1 3"
expect_refused "rank 0 never starts: rank 1 says whom it could not reach" \
  "^zrun: torchrun rendezvous: rank 1 could not reach rank 0 at MASTER_ADDR:MASTER_PORT=127.0.0.1:[0-9]* within 2 s (Connection refused)" 5 1.2 "1 2"
expect_refused "ranks that disagree on WORLD_SIZE hear why" \
  "^zrun: torchrun rendezvous: rank 1 was started with WORLD_SIZE=3 but rank 0 with WORLD_SIZE=2: start every rank with the same WORLD_SIZE (rank 0's verdict)" 5 1.3 "0 2" "1 3"
