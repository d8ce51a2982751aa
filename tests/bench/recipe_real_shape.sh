#!/bin/sh
# The recipe on a real-shaped model (random-init Llama-3.2-1B written by transformers, WikiText-2
# validation split) with each ZeRO config given, a few steps, printing the loss lines: the check a
# session that touches training runs on the GPU machine.
#   sh tests/bench/recipe_real_shape.sh LLAMA_CONFIG_JSON TOKENIZER_JSON WIKITEXT_RAW STEPS CONFIG...
# PRECISION (default bf16) is the recipe's precision=: configs whose bf16/fp16 "enabled" is "auto"
# (configs/zero3.json, ...) would otherwise train in f32 (HF's bf16 argument defaults to false).
# The "training:" line of each run says the precision it ran in.
cfg=$1; tok=$2; data=$3; steps=$4; shift 4
Z=${ZRUN_BIN:-./zrun}; W=${WORK:-/tmp/recipe_real_shape}
rm -rf "$W"; mkdir -p "$W"
python3 tests/bench/make_random_llama.py "$cfg" "$tok" "$W/model" 0 2>&1 | grep -v Writing
for c in "$@"; do
  echo "### recipe with $c"
  t0=$(date +%s.%N)
  $Z recipes/finetune_llama.lua --config "$c" precision="${PRECISION:-bf16}" model="$W/model" data="$data" max_steps="$steps" logging_steps=1 \
    eval_steps=100000 save_strategy=no output_dir="$W/out" > "$W/log" 2>&1; rc=$?
  echo "exit $rc after $(echo "$t0 $(date +%s.%N)" | awk '{ printf "%.1f", $2 - $1 }') s (the whole run: start-up, load, steps, evaluation)"
  grep -E "training:|offload_optimizer|rror|perplexity" "$W/log" | head -5; grep -E "loss" "$W/log" | sed -n '1p;$p'
done
