#!/bin/sh
# Issue 17's GPU measurements in one go (run on the GPU machine from the repo root after `make`):
# stage 3 against stage 0 on one GPU, stage 2 + optimizer offload with device and host gradients
# (ZRUN_OFFLOAD_PROFILE lines), CPU AdamW against DeepSpeedCPUAdam when deepspeed imports.
# The whole log also goes to $OUT/offload_session.txt.
#   sh tests/bench/offload_session.sh [ZRUN_BINARY]
Z=${1:-./zrun}
export ZRUN_HOME=${ZRUN_HOME:-$PWD} NCCL_NVLS_ENABLE=0
B="$Z tests/bench/bench_llama.lua"
pick() { grep -E "tokens/s|peak total|offload\]|offload_optimizer|step time|Error|error" ; }
{
echo "### stage 0 gas 8"; $B gas=8 steps=4 2>&1 | pick
echo "### stage 3 gas 8 (one process: resident)"; $B stage=3 gas=8 steps=4 2>&1 | pick
echo "### stage 0 gas 1"; $B 2>&1 | pick
echo "### stage 3 gas 1"; $B stage=3 2>&1 | pick
echo "### stage 2 + offload gas 8, device gradients"; ZRUN_OFFLOAD_PROFILE=1 $B stage=2 offload=1 gas=8 steps=3 warmup=2 2>&1 | pick
echo "### stage 2 + offload gas 8, host gradients"; ZRUN_OFFLOAD_GRADS=host ZRUN_OFFLOAD_PROFILE=1 $B stage=2 offload=1 gas=8 steps=3 warmup=2 2>&1 | pick
echo "### stage 2 + offload gas 1, device gradients"; ZRUN_OFFLOAD_PROFILE=1 $B stage=2 offload=1 steps=3 warmup=2 2>&1 | pick
echo "### CPU AdamW vs DeepSpeedCPUAdam"; sh tests/bench/bench_cpu_adam.sh 1.236e9 2>&1 | tail -8
} 2>&1 | tee "${OUT:-${TMPDIR:-/tmp}}/offload_session.txt"
