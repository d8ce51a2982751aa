#!/bin/sh
# The fine-tuning recipe (built-in tiny Llama, CPU) on 2 ranks joined over TCP, as torchrun starts
# them, learns exactly as under `mpirun -np 2` at ZeRO stages 0-3: the same logged loss at every step
# (with 2 ranks a sum is a+b either way; other world sizes reduce in another order). Without mpirun
# the comparison is skipped and only the learning is checked.
cd "$(dirname "$0")/../.." || exit 1
. tests/tcp/tcp_env.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ARGS="max_steps=6 logging_steps=1 gradient_accumulation_steps=2 learning_rate=3e-3 save_strategy=no"
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | tr '\n' ' '; }
for stage in 0 1 2 3; do
  c=configs/zero$stage.json
  tcp_launch 2 "$tmp" $Z recipes/finetune_llama.lua --config $c $ARGS output_dir="$tmp/tcp$stage"; rc=$?
  if [ $rc -ne 0 ]; then echo "FAIL stage $stage over TCP: exit $rc: $(tail -n 2 "$tmp"/0.log "$tmp"/1.log)"; continue; fi
  $Z tests/mpi/learn_check.lua "$tmp/tcp$stage/metrics.jsonl" "recipe learns over TCP: zero$stage np=2" 0.5
  if ! command -v mpirun >/dev/null 2>&1; then echo "SKIP stage $stage: TCP vs mpirun (no mpirun here)"; continue; fi
  . tests/mpi/mpi_env.sh
  log=$(timeout 300 mpirun $MPI_FLAGS -np 2 $Z recipes/finetune_llama.lua --config $c $ARGS output_dir="$tmp/mpi$stage" 2>&1) ||
    { echo "FAIL stage $stage under mpirun: $(echo "$log" | tail -2)"; continue; }
  a=$(losses "$tmp/tcp$stage") b=$(losses "$tmp/mpi$stage")
  if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS zero$stage: TCP and mpirun -np 2 log the same losses ($a)"
  else echo "FAIL zero$stage: TCP logs $a but mpirun -np 2 logs $b"; fi
done
