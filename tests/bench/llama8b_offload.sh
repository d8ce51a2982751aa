#!/bin/sh
# Issue 17's 8B run: a Llama-3-8B-shaped model (random init, bf16) full fine-tuned on one GPU with
# ZeRO-2 + optimizer offload (tests/bench/llama3_8b_h200.json's settings), a few steps of
# micro-batch 4 x 512 x 8, with the host's peak (used memory sampled each second) and the plan next
# to the measurement. Run on the GPU machine from the repo root after `make`:
#   sh tests/bench/llama8b_offload.sh [ZRUN_BINARY] [STEPS]
Z=${1:-./zrun}; STEPS=${2:-3}
export ZRUN_HOME=${ZRUN_HOME:-$PWD}
used() { free -b | awk '/^Mem:/ { print $3 }'; }
base=$(used); peak=$base
echo "### plan"; $Z plan meta-llama/Meta-Llama-3-8B --config tests/bench/llama3_8b_h200.json --seq-len 512 \
  --gpu-memory 141GB --host-memory 128GB 2>&1 | tail -22
echo "### run"
ZRUN_OFFLOAD_PROFILE=1 $Z tests/bench/bench_llama.lua model=meta-llama/Meta-Llama-3-8B stage=2 offload=1 gas=8 \
  steps="$STEPS" warmup=1 > /tmp/llama8b.log 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do u=$(used); [ "$u" -gt "$peak" ] && peak=$u; sleep 1; done
wait $pid; rc=$?
grep -E "step [0-9]+ loss|tokens/s|peak|offload|rror" /tmp/llama8b.log | tail -16
echo "exit $rc; host memory used above the start: peak $(awk -v p=$peak -v b=$base 'BEGIN { printf "%.2f GiB", (p - b) / 2^30 }')"
