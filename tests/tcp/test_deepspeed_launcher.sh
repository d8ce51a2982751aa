#!/bin/sh
# The README's `deepspeed --num_gpus N --no_python ./zrun recipe.lua` (and accelerate's, below): DeepSpeed's launcher
# (deepspeed/launcher/launch.py) sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK,
# CROSS_SIZE, MASTER_ADDR and MASTER_PORT (no LOCAL_WORLD_SIZE) and appends --local_rank=<LOCAL_RANK>
# right after the script. Two ranks started that way train the recipe and learn; a --local_rank that
# contradicts LOCAL_RANK, or a non-zero one without a launcher, is one line naming the fix.
cd "$(dirname "$0")/../.." || exit 1
. tests/tcp/tcp_env.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ds_launch() { # ds_launch N DIR SCRIPT ARGS...: as launch.py starts the ranks of one node
  port=$(free_port) n=$1 dir=$2 script=$3; shift 3
  pids="" i=0
  while [ $i -lt $n ]; do
    RANK=$i LOCAL_RANK=$i WORLD_SIZE=$n LOCAL_SIZE=$n CROSS_RANK=0 CROSS_SIZE=1 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port timeout ${TCP_TIMEOUT:-120} $Z "$script" --local_rank=$i "$@" >"$dir/$i.log" 2>&1 &
    pids="$pids $!"; i=$((i + 1))
  done
  rc=0
  for p in $pids; do wait $p; r=$?; [ $rc -eq 0 ] && rc=$r; done
  return $rc
}
ds_launch 2 "$tmp" recipes/finetune_llama.lua --config configs/zero2.json max_steps=6 logging_steps=1 \
  gradient_accumulation_steps=2 learning_rate=3e-3 save_strategy=no output_dir="$tmp/ds"; rc=$?
if [ $rc -eq 0 ]; then
  $Z tests/mpi/learn_check.lua "$tmp/ds/metrics.jsonl" "recipe learns under DeepSpeed's launcher (--local_rank=N appended): zero2 np=2" 0.5
else echo "FAIL DeepSpeed's launcher: exit $rc: $(tail -n 2 "$tmp"/0.log "$tmp"/1.log)"; fi
# accelerate launch with a DeepSpeed accelerate config (TRL's deepspeed_zero3.yaml): torchrun's variables
# and the plugin's; no --config: the recipe trains under accelerate's ZeRO-3 bf16 config
ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_ZERO_STAGE=3 ACCELERATE_MIXED_PRECISION=bf16 \
  ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL=true tcp_launch 2 "$tmp" $Z recipes/finetune_llama.lua max_steps=6 \
  logging_steps=1 gradient_accumulation_steps=2 learning_rate=3e-3 save_strategy=no output_dir="$tmp/acc"; rc=$?
if [ $rc -eq 0 ] && grep -q "ZeRO stage 3, bf16" "$tmp/0.log"; then
  $Z tests/mpi/learn_check.lua "$tmp/acc/metrics.jsonl" "recipe learns under accelerate launch's DeepSpeed settings: zero3 bf16 np=2" 0.5
else echo "FAIL accelerate launch with DeepSpeed: exit $rc: $(tail -n 3 "$tmp"/0.log)"; fi
out=$(RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) timeout 30 $Z recipes/finetune_llama.lua \
  --local_rank=0 max_steps=1 2>&1); rc=$?
case "$out" in
  *"--local_rank=0 disagrees with the launcher's LOCAL_RANK=1; zrun takes each process's GPU from the launcher's LOCAL_RANK"*)
    [ $rc -ne 0 ] && echo "PASS --local_rank against LOCAL_RANK: refused in one line" || echo "FAIL disagreeing --local_rank: exit 0";;
  *) echo "FAIL disagreeing --local_rank: rc=$rc: $out";;
esac
out=$(timeout 30 $Z recipes/finetune_llama.lua --local_rank 3 max_steps=1 2>&1); rc=$?
case "$out" in
  *"--local_rank=3 without a launcher; zrun takes each process's GPU"*)
    [ $rc -ne 0 ] && echo "PASS --local_rank 3 without a launcher: refused in one line" || echo "FAIL --local_rank 3 alone: exit 0";;
  *) echo "FAIL --local_rank 3 alone: rc=$rc: $out";;
esac
