#!/bin/sh
# The GPU measurements recorded in tests/bench/RESULTS.md, in one go (run on the GPU machine from
# the repo root): GPU test suite, Llama-3.2-1B-shaped throughput per ZeRO stage / accumulation /
# offload / checkpointing, GPT-2 124M, memory plan vs measured, the recipe with every config, and
# the transformers load check of zrun-saved model directories (when hfcheck/ is present).
#   sh tests/bench/gpu_session.sh [ZRUN_BINARY] [FUSED_TEST_BINARY] [BENCH_DIR]
# BENCH_DIR holds bench_fused and bench_cuda (make build/bench/bench_fused build/bench/bench_cuda).
# The whole log also goes to $OUT/gpu_session.txt (the device tool's output folder; else $TMPDIR):
# only the tail of stdout comes back inline.
Z=${1:-./zrun}; F=${2:-build/tests/test_fused_kernels}; BD=${3:-build/bench}
export ZRUN_HOME=${ZRUN_HOME:-$PWD} NCCL_NVLS_ENABLE=0
B="$Z tests/bench/bench_llama.lua"
{
echo "### report"; $Z report
echo "### GPU tests"; sh tests/run_cuda.sh "$F" "$Z"
echo "### fused kernels and attention"; "$BD/bench_fused"
echo "### cuBLASLt GEMMs at the Llama-3.2-1B shapes, elementwise kernels"; "$BD/bench_cuda"
echo "### PyTorch SDPA in the same run"; python3 tests/bench/bench_attention_torch.py 2>/dev/null | grep "^B"
echo "### offload step profile"; ZRUN_OFFLOAD_PROFILE=1 $B stage=2 offload=1 steps=3 warmup=1 2>&1 | grep "offload\]"
echo "### Llama-3.2-1B stage 0, phases"; $B breakdown=1
echo "### stage 0"; $B
echo "### stage 0, gradient accumulation 8"; $B gas=8 steps=4
for s in 1 2 3; do echo "### stage $s"; $B stage=$s; done
echo "### stage 2 + optimizer offload"; $B stage=2 offload=1 steps=3 warmup=1
echo "### stage 0 + activation checkpointing"; $B ckpt=1
echo "### GPT-2 124M, B=64 T=1024"; $B model=gpt2 batch=64 seq=1024 steps=5
echo "### plan vs measured by category"; $Z tests/bench/plan_vs_measured.lua
for s in 0 1 2 3; do
  echo "### plan, stage $s"; $Z plan meta-llama/Llama-3.2-1B --micro-batch 4 --seq-len 512 --stage $s --dtype bf16 --device cuda
done
for c in zero0 zero1 zero2 zero3 zero2_offload zero3_offload; do
  echo "### recipe with configs/$c.json"
  $Z recipes/finetune_llama.lua --config configs/$c.json max_steps=10 output_dir=/tmp/zrun_gpu_recipe 2>&1 | tail -2
done
echo "### transformers loads zrun-saved directories"
$Z tests/golden/save_for_hf_check.lua hfcheck && python3 tests/golden/check_hf_save.py hfcheck
echo "### transformers loads zero-to-fp32 output with strict=True"
$Z tests/golden/save_zero_for_hf_check.lua zerocheck && python3 tests/golden/check_zero_to_fp32.py zerocheck
echo "### TensorBoard reads zrun's monitor files"; python3 tests/bench/check_tensorboard.py
} 2>&1 | tee "${OUT:-${TMPDIR:-/tmp}}/gpu_session.txt"
