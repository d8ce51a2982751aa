#!/bin/sh
# Per-rank memory equals the sharding formula at every stage (tests/mpi/memory_check.lua), and the
# fine-tuning recipe runs with every shipped ZeRO config on 2 and 4 ranks (built-in fallback data).
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
for np in 1 2 4; do
  for stage in 0 1 2 3; do
    mpirun $MPI_FLAGS -np $np $Z tests/mpi/memory_check.lua $stage || echo "FAIL memory formula stage $stage np=$np: exit $?"
  done
done
mpirun $MPI_FLAGS -np 2 $Z tests/mpi/memory_check.lua 3 5000 || echo "FAIL memory formula stage 3 persistence: exit $?"
for np in 2 4; do
  for c in zero1 zero2 zero3 zero2_offload zero3_offload; do
    out=$(mpirun $MPI_FLAGS -np $np $Z recipes/finetune_llama.lua --config configs/$c.json max_steps=4 output_dir=/tmp/zrun_recipe_$$ 2>&1)
    if [ $? -eq 0 ] && echo "$out" | grep -q "done: 4 steps"; then echo "PASS finetune_llama with configs/$c.json np=$np"
    else echo "FAIL finetune_llama with configs/$c.json np=$np: $(echo "$out" | tail -3)"; fi
  done
done
rm -rf /tmp/zrun_recipe_$$
