#!/bin/sh
# Side by side on the GPU machine (issue 13's proof): a random-init Llama-3.2-1B-shaped model
# written by transformers, fine-tuned on WikiText-2 for 50 steps with zrun's recipe (bf16, ZeRO-2,
# micro-batch 4 x 512, 8 micro-batches) and with the Hugging Face Trainer (tests/bench/
# hf_finetune.py) on the same token blocks in the same order (the recipe's dump_blocks) with the
# same hyperparameters. Two runs: the shipped configs/ds_config.json (lr 2e-5, WarmupDecayLR =
# HF's linear schedule, warmup 5%) and a from-scratch learning rate (3e-4, constant after 10% warmup,
# a config with "auto" values). Prints both loss curves, the eval perplexity before/after and
# tokens/s next to bench_llama.lua at the same shape (tests/bench/compare_curves.lua).
#   sh tests/bench/finetune_vs_hf.sh LLAMA_CONFIG_JSON TOKENIZER_JSON WIKITEXT_RAW [STEPS]
# Work files go under $WORK (default /tmp/finetune_vs_hf); summaries also to $OUT when set.
cfg=$1; tok=$2; data=$3; steps=${4:-50}
Z=${ZRUN_BIN:-./zrun}
W=${WORK:-/tmp/finetune_vs_hf}
R=${OUT:-$W}
rm -rf "$W"; mkdir -p "$W"
python3 tests/bench/make_random_llama.py "$cfg" "$tok" "$W/model" 0 2>&1 | grep -v Writing
$Z tests/bench/bench_llama.lua stage=2 gas=8 steps=4 > "$W/bench.log" 2>&1; grep "tokens/s" "$W/bench.log"
cat > "$W/ds_auto.json" <<'J'
{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
 "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
 "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true}}
J
run() { # name config hf_lr hf_warmup hf_sched [recipe args...]
  name=$1; conf=$2; lr=$3; wr=$4; sched=$5; shift 5
  echo "### $name: zrun recipe"
  $Z recipes/finetune_llama.lua --config "$conf" model="$W/model" data="$data" max_steps=$steps logging_steps=1 \
    eval_steps=100000 save_strategy=no output_dir="$W/$name" dump_blocks="$W/$name.blocks.safetensors" "$@" \
    > "$W/$name.zrun.log" 2>&1
  grep -E "eval|done|training rows|split|Error|error" "$W/$name.zrun.log" | head -8
  echo "### $name: Hugging Face Trainer"
  PYTHONUNBUFFERED=1 python3 tests/bench/hf_finetune.py "$W/model" "$W/$name.blocks.safetensors" "$W/$name.hf.json" \
    "$lr" "$wr" "$sched" > "$W/$name.hf.log" 2>&1; grep "^hf:" "$W/$name.hf.log" || tail -5 "$W/$name.hf.log"
  $Z tests/bench/compare_curves.lua "$W/$name/metrics.jsonl" "$W/$name.hf.json" "$W/$name.zrun.log" "$W/bench.log" \
    | tee "$R/$name.compare.txt"
}
run seed_config configs/ds_config.json 2e-5 0.05 linear
run lr3e-4 "$W/ds_auto.json" 3e-4 0.1 constant_with_warmup precision=bf16 learning_rate=3e-4 warmup_ratio=0.1 \
  lr_scheduler_type=constant_with_warmup per_device_train_batch_size=4 gradient_accumulation_steps=8
