#!/bin/sh
# Ranks started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set by
# hand), one GPU per rank: each takes the GPU of its LOCAL_RANK, the NCCL unique id travels over the
# TCP backend, NCCL carries the GPU tensors; the recipe learns at ZeRO 2 and 3; a rank that never
# arrives in an NCCL collective stops every rank with one line naming it (rank 0 asks the others).
# Run on the GPU machine with 2+ GPUs: sh tests/cuda/test_tcp_gpu.sh (part of tests/run_cuda.sh).
# NVLink multicast stays off.
cd "$(dirname "$0")/../.." || exit 1
n=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$n" -ge 2 ] || { echo "SKIP torchrun-style launch on GPUs: needs 2 or more GPUs (found $n)"; exit 0; }
. tests/tcp/tcp_env.sh
export NCCL_NVLS_ENABLE=0 ZRUN_CHECK_DEVICE=cuda
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tcp_launch 2 "$tmp" $Z -e 'local zr = require "zrun"; local d = zr.dist
  local t = zr.full({ 1000 }, d.rank() + 1, { device = "cuda" })
  d.all_reduce(t, "sum"); d.barrier()
  print(("rank %d gpu %d sum %g"):format(d.rank(), zr.cuda.current_device(), t:cpu()[1000]))'; rc=$?
if [ $rc -eq 0 ] && grep -q "^rank 0 gpu 0 sum 3$" "$tmp/0.log" && grep -q "^rank 1 gpu 1 sum 3$" "$tmp/1.log"; then
  echo "PASS NCCL over a torchrun-style launch: one GPU per LOCAL_RANK, the id over TCP"
else echo "FAIL NCCL over a torchrun-style launch: exit $rc: $(cat "$tmp"/*.log | head -4)"; fi
tcp_launch 2 "$tmp" $Z tests/mpi/hang_check.lua ok; rc=$?
if [ $rc -eq 0 ] && grep -q completed "$tmp/0.log"; then echo "PASS hang_check ok on GPUs over TCP"
else echo "FAIL hang_check ok on GPUs over TCP: exit $rc: $(cat "$tmp"/*.log | head -4)"; fi
for stage in 2 3; do
  tcp_launch 2 "$tmp" $Z recipes/finetune_llama.lua --config configs/zero$stage.json max_steps=12 logging_steps=1 \
    gradient_accumulation_steps=2 learning_rate=3e-3 save_strategy=no output_dir="$tmp/out$stage"; rc=$?
  if [ $rc -ne 0 ]; then echo "FAIL recipe zero$stage on GPUs over TCP: exit $rc: $(tail -3 "$tmp"/0.log)"; continue; fi
  $Z tests/mpi/learn_check.lua "$tmp/out$stage/metrics.jsonl" "recipe learns on 2 GPUs over TCP: zero$stage" 1.0
done
t0=$(date +%s)
ZRUN_COMM_TIMEOUT=2 tcp_launch 2 "$tmp" $Z tests/mpi/hang_check.lua absent; rc=$?
el=$(($(date +%s) - t0)) lines=$(cat "$tmp"/*.log | grep -c "comm timeout\|comm error")
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $el -le 40 ] && [ "$lines" -eq 1 ] &&
   grep -q "^\[rank 0\] comm timeout: all_reduce #[0-9]* (f32 (4), sum, cuda:[0-9]*) .*not arrived: rank 1 (no answer" "$tmp"/*.log; then
  echo "PASS an NCCL collective a rank never joins stops both ranks (${el} s)"
else echo "FAIL an NCCL collective a rank never joins: exit $rc after ${el} s: $(cat "$tmp"/*.log | head -4)"; fi
