#!/bin/sh
# Side by side on the GPU machine (issue 13's proof): a random-init Llama-3.2-1B-shaped model
# written by transformers, fine-tuned on WikiText-2 for 50 steps with zrun's recipe (configs/
# ds_config.json: bf16, ZeRO-2, micro-batch 4 x 512, 8 micro-batches, WarmupDecayLR) and with the
# Hugging Face Trainer on the same token blocks in the same order with the same hyperparameters.
# Prints both loss curves, the eval perplexity before/after and tokens/s, next to bench_llama.lua
# at the same shape. Needs python3 + torch + transformers (tests/bench/hf_finetune.py).
#   sh tests/bench/finetune_vs_hf.sh LLAMA_CONFIG_JSON TOKENIZER_JSON WIKITEXT_RAW [STEPS]
# Everything it writes goes under $WORK (default /tmp/finetune_vs_hf); the summary also to
# $OUT/finetune_vs_hf.txt when $OUT is set.
set -e
cfg=$1; tok=$2; data=$3; steps=${4:-50}
Z=${ZRUN_BIN:-./zrun}
W=${WORK:-/tmp/finetune_vs_hf}
rm -rf "$W"; mkdir -p "$W"
python3 tests/bench/make_random_llama.py "$cfg" "$tok" "$W/model" 0
# zrun: the recipe as a user runs it; dump_data writes the packed blocks and the order it trains on
$Z recipes/finetune_llama.lua --config configs/ds_config.json model="$W/model" data="$data" max_steps=$steps \
  logging_steps=1 output_dir="$W/zrun" dump_data="$W/data.json" 2>&1 | tee "$W/zrun.log"
python3 tests/bench/hf_finetune.py "$W/model" "$W/data.json" "$W/hf.json" 2>&1 | grep -v Warning | tee "$W/hf.log"
$Z tests/bench/bench_llama.lua stage=2 gas=8 steps=4 2>&1 | tee "$W/bench.log"
$Z tests/bench/compare_curves.lua "$W/zrun/metrics.jsonl" "$W/hf.json" "$W/zrun.log" "$W/bench.log" |
  tee "${OUT:-$W}/finetune_vs_hf.txt"
