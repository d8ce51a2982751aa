#!/bin/sh
# zrun's LoRA next to Hugging Face PEFT's (torch eager, the Trainer's loop: tests/bench/lora_torch.py) in the same run
# on this GPU, one table with ratios: Llama-3.2-1B's shape (random init, written by transformers, bf16), LoRA r 16,
# alpha 32, dropout 0.05 on all linear layers and on PEFT's default q_proj/v_proj, micro-batch 4 x 1024, 8
# micro-batches a step, 16 steps, AdamW on the adapters. zrun trains on WikiText-2's paragraphs in 1024-token rows
# (recipes/sft_llama.lua packing_strategy=wrapped, through tests/bench/sft_real_shape.sh), torch on random token
# rows: a rate, not a curve (tests/golden/check_peft.py holds the curves). Tokens per second over all 16 steps.
#   sh tests/bench/vs_peft.sh [ZRUN_BIN]
# Needs the shared data (ZRUN_TEST_DATA, default ../shared/data: Llama-3.2-1B's config, TinyLlama's tokenizer.json,
# WikiText-2) and python3 with torch, transformers and peft (PYTHONPATH may name a copy of peft, accelerate, psutil).
Z=${1:-./zrun}
D=${ZRUN_TEST_DATA:-../shared/data}
cfg=$D/models/llama-3.2-1b/config.json tok=$D/tokenizers/tinyllama-1.1b-chat-v1.0/tokenizer.json
raw=$D/wikitext-2-raw/wiki.valid.raw
for f in "$cfg" "$tok" "$raw"; do
  [ -f "$f" ] || { echo "vs_peft: SKIP, $f is missing (set ZRUN_TEST_DATA to the shared data)"; exit 0; }
done
python3 -c "import torch, transformers, peft" 2>/dev/null ||
  { echo "vs_peft: SKIP, python3 here cannot import torch, transformers and peft"; exit 0; }
W=${WORK:-/tmp/vs_peft}
out=$(mktemp); trap 'rm -f "$out"' EXIT
WORK=$W ZRUN_BIN=$Z sh tests/bench/sft_real_shape.sh "$cfg" "$tok" "$raw" 16 configs/zero2.json \
  "packing=true packing_strategy=wrapped use_peft=true lora_target_modules=all-linear learning_rate=2e-4" \
  "packing=true packing_strategy=wrapped use_peft=true learning_rate=2e-4" > "$out" 2>&1
zr=$(sed -n 's/.* of training: \([0-9,]*\) tokens\/s trained on/\1/p' "$out" | tr -d ,)
set -- $zr
if [ $# -ne 2 ]; then echo "vs_peft: zrun's runs gave no rate; its output:"; cat "$out"; exit 1; fi
printf '%-34s %14s %14s %8s\n' "LoRA r 16, 4 x 1024 x 8, 16 steps" "zrun tok/s" "PEFT tok/s" "ratio"
for t in all-linear q_proj,v_proj; do
  z=$1; shift
  p=$(python3 tests/bench/lora_torch.py "$W/model" targets=$t 2>/dev/null | sed -n 's/.*all 16 steps: \([0-9,]*\) tokens\/s.*/\1/p' | tr -d ,)
  if [ -z "$p" ]; then printf '%-34s %14s %14s %8s\n' "targets $t" "$z" "failed" "-"; continue; fi
  printf '%-34s %14s %14s %7.2fx\n' "targets $t" "$z" "$p" "$(echo "$z $p" | awk '{print $1 / $2}')"
done
