#!/bin/sh
# Under torchrun the agent already serves its TCPStore on MASTER_PORT and tells the workers with
# TORCHELASTIC_USE_AGENT_STORE=True: zrun's rendezvous then takes MASTER_PORT + 1. Here a lone
# rank 0 of another world holds MASTER_PORT (as the agent's store would): with the variable the
# job runs on the next port; without it, rank 0 says the port is in use. The holder waits (150 s)
# well past both phases, even on a loaded machine, and is killed at the end. The second phase starts
# rank 0 alone: a rank 1 would connect to the holder (which then completed its world, or refused the
# other WORLD_SIZE, and exited, freeing the port for a late rank 0: a timeout on loaded machines).
cd "$(dirname "$0")/../.." || exit 1
. tests/tcp/tcp_env.sh
tmp=$(mktemp -d); trap 'kill $holder 2>/dev/null; rm -rf "$tmp"' EXIT
port=$(free_port)
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port ZRUN_COMM_TIMEOUT=150 \
  timeout 160 $Z tests/mpi/comm_check.lua >"$tmp/holder.log" 2>&1 &
holder=$!
# the phases start once the holder listens (a loaded machine starts it late: a fixed sleep let the
# second phase's rank 0 take the port first)
i=0
while [ $i -lt 120 ]; do
  if command -v ss >/dev/null 2>&1; then [ -n "$(ss -Htln "sport = :$port" 2>/dev/null)" ] && break
  elif [ $i -ge 6 ]; then break; fi
  sleep 0.5; i=$((i + 1))
done
TORCHELASTIC_USE_AGENT_STORE=True tcp_launch_on $port 2 "$tmp" $Z tests/mpi/comm_check.lua; rc=$?
if [ $rc -eq 0 ] && grep -q "^PASS" "$tmp/0.log"; then echo "PASS torchrun's agent store on MASTER_PORT: the ranks meet on the next port"
else echo "FAIL torchrun's agent store on MASTER_PORT: rc=$rc: $(head -3 "$tmp/0.log")"; fi
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  timeout 30 $Z tests/mpi/comm_check.lua >"$tmp/0.log" 2>&1; rc=$?
if [ $rc -ne 0 ] && grep -q "port $port is in use on rank 0's host" "$tmp/0.log"; then
  echo "PASS MASTER_PORT held and no agent store: rank 0 says the port is in use"
else echo "FAIL MASTER_PORT held and no agent store: rc=$rc: $(head -3 "$tmp/0.log") (holder: $(head -3 "$tmp/holder.log"))"; fi
