#!/bin/sh
# Where the training step's time goes on a GPU (issue 18's profile): per-op CUDA-event profile of
# the Llama-3.2-1B step (breakdown=2), the phase split (breakdown=1), stage 3 against stage 0 on one
# GPU, and the attention kernels next to PyTorch's SDPA backends. Run on the GPU machine from the
# repo root after `make`; the whole log goes to $OUT/profile_step.txt.
#   sh tests/bench/profile_step.sh [ZRUN_BINARY] [BENCH_DIR]
Z=${1:-./zrun}; BD=${2:-build/bench}
export ZRUN_HOME=${ZRUN_HOME:-$PWD} NCCL_NVLS_ENABLE=0
B="$Z tests/bench/bench_llama.lua"
{
echo "### attention: zrun (bench_fused) then PyTorch SDPA"; "$BD/bench_fused" attention | sed -n '/^attention/,$p'
python3 tests/bench/bench_attention_torch.py 2>/dev/null
echo "### stage 0 gas 8 (fp32 accumulation), phases"; $B gas=8 steps=4 breakdown=1
echo "### stage 0 gas 8, per-op profile"; $B gas=8 steps=2 breakdown=2
echo "### stage 0 gas 1"; $B
echo "### stage 3 gas 1"; $B stage=3
echo "### stage 3 gas 1, phases"; $B stage=3 breakdown=1
echo "### stage 3 gas 1, per-op profile"; $B stage=3 steps=2 breakdown=2
} 2>&1 | tee "${OUT:-${TMPDIR:-/tmp}}/profile_step.txt"
