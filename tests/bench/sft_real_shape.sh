#!/bin/sh
# TRL-style SFT on a real-shaped model (random-init Llama written by transformers) over WikiText-2's
# paragraphs as {"text": ...} rows, bf16 under a ZeRO config, once per variant of SFTConfig arguments
# (e.g. "packing=false", "packing=true" (bfd, TRL's default), "packing=true packing_strategy=wrapped"):
# the loss lines, the tokens trained on (num_tokens: padding left out) per second of training, and the CUDA caching
# allocator's counters at the end (tests/bench/alloc_counters.lua: cudaMalloc calls, reserved against the peak).
#   sh tests/bench/sft_real_shape.sh LLAMA_CONFIG_JSON TOKENIZER_JSON WIKITEXT_RAW STEPS CONFIG VARIANT...
# Needs python3 with transformers (the model) on the machine. ZRUN_BIN picks the zrun (default ./zrun); with
# KEEP_MODEL=1 an earlier run's model and rows in WORK (default /tmp/sft_real_shape) are used again (another build's rows).
cfg=$1; tok=$2; data=$3; steps=$4; ds=$5; shift 5
Z=${ZRUN_BIN:-./zrun}; W=${WORK:-/tmp/sft_real_shape}
if [ "${KEEP_MODEL:-0}" = 1 ] && [ -f "$W/model/config.json" ]; then echo "model: $W/model again"; else
rm -rf "$W"; mkdir -p "$W"
python3 tests/bench/make_random_llama.py "$cfg" "$tok" "$W/model" 0 2>&1 | grep -v Writing
fi
python3 - "$data" "$W/rows.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        s = line.strip()
        if len(s.split()) >= 8 and not s.startswith("="):
            out.write(json.dumps({"text": s}) + "\n")
PY
echo "rows: $(wc -l < "$W/rows.jsonl") paragraphs of WikiText-2 (validation split)"
for v in "$@"; do
  echo "### sft_llama.lua with $v ($ds, bf16, $steps steps)"
  rm -rf "$W/out"
  # shellcheck disable=SC2086 (the variant's words are separate arguments)
  $Z tests/bench/alloc_counters.lua recipes/sft_llama.lua --config "$ds" precision=bf16 model="$W/model" data="$W/rows.jsonl" max_steps="$steps" \
    logging_steps=1 eval_strategy=no save_strategy=no gradient_checkpointing=false output_dir="$W/out" $v > "$W/log" 2>&1
  echo "exit $?"
  grep -E "training:|rows \(|rror|done:|allocator:" "$W/log" | head -6; grep -E "^step" "$W/log" | sed -n '1p;$p'
  python3 - "$W/out/metrics.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
tok = [r["num_tokens"] for r in recs if "num_tokens" in r and "loss" in r]
rt = [r["train_runtime"] for r in recs if "train_runtime" in r]
if tok and rt:
    print(f"num_tokens {tok[-1]:.0f} in {rt[-1]:.2f} s of training: {tok[-1] / rt[-1]:,.0f} tokens/s trained on")
# the second half of the logged steps (past the warm-up: cuBLASLt's kernel loading, the GEMM families' tuning), in the
# collated batches' tokens (padding included) a second, as the step lines print them
tps = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r and "loss" in r]
if len(tps) >= 4:
    half = tps[len(tps) // 2:]
    print(f"steady: {sum(half) / len(half):,.0f} collated tokens/s over the last {len(half)} logged steps")
PY
done
