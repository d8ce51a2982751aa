#!/bin/sh
# zrun next to llm.c (karpathy/llm.c's train_gpt2cu) in one run on the GPU machine: GPT-2 124M from
# random init on WikiText-2 (GPT-2 tokens, one llm.c shard), B=64 T=1024 bf16, one table with the
# ratio (issue 18). Run from the repo root after zrun is built; the bundle (tests/bench/llmc_bundle.sh's
# .llmc/, ~5 MB, git-ignored) is carried along; llm.c is built once into build/llmc/ (kept while warm;
# or build it here first, `sh tests/bench/llmc_build.sh` works without a GPU in about a minute, and
# carry build/llmc too: the 2-minute build on the GPU machine is then skipped).
#   sh tests/bench/vs_llmc.sh [ZRUN=./zrun] [BUNDLE=.llmc] [GPT2_TOKENIZER_JSON=BUNDLE/data/gpt2_tokenizer.json]
#        [WIKI_RAW=BUNDLE/data/wiki.valid.raw]
# STEPS measured steps (default 30) after WARMUP (default 3). The logs go to $OUT/vs_llmc/ (the
# device tool's output folder; else a temporary folder, named at the end).
Z=${1:-./zrun}; bundle=${2:-.llmc}
tok=${3:-$bundle/data/gpt2_tokenizer.json}; raw=${4:-$bundle/data/wiki.valid.raw}
steps=${STEPS:-30}; warm=${WARMUP:-3}; B=64; T=1024
here=$(dirname "$0")
export ZRUN_HOME="${ZRUN_HOME:-$PWD}"
die() { echo "vs_llmc: $*" >&2; exit 1; }
[ -f "$bundle/SOURCES" ] || die "no llm.c bundle at $bundle; make it with sh tests/bench/llmc_bundle.sh and carry it"
[ -x "$Z" ] || die "no zrun binary at $Z; build it with make (or pass its path first)"
[ -f "$tok" ] || die "GPT-2 tokenizer.json not found at $tok; pass it third (shared/data/tokenizers/gpt2/tokenizer.json)"
[ -f "$raw" ] || die "WikiText-2 text not found at $raw; pass it fourth (shared/data/wikitext-2-raw/wiki.valid.raw)"
"$Z" -e 'os.exit(require("zrun").cuda.is_available() and 0 or 1)' 2>/dev/null || die "no GPU visible to zrun; run it on the GPU machine"
logs=${OUT:-$(mktemp -d)}/vs_llmc
mkdir -p "$logs" build/llmc || exit 1

# llm.c's binary (built once: about two minutes of nvcc), the data, then both runs
bin=$(timeout 300 sh "$here/llmc_build.sh" "$bundle" build/llmc | tail -n 1)
[ -f build/llmc/build.log ] && cp build/llmc/build.log "$logs/llmc_build.txt"
[ -x "$bin" ] || die "no train_gpt2cu: its build failed (the lines above) or ran past 300 s (its log: $logs/llmc_build.txt)"
shard=$PWD/build/llmc/wiki_gpt2.bin
"$Z" "$here/llmc_data.lua" tokenizer="$tok" text="$raw" out="$shard" min_tokens=$((B * T + 1)) >"$logs/data.txt" 2>&1 ||
  { cat "$logs/data.txt" >&2; die "writing the token shard failed"; }
# -e d12: GPT-2 124M from random init; -d B*T: no accumulation; -r 0: no recomputation; -z 0;
# constant lr 1e-4 (cosine with final fraction 1, no warm-up), weight decay 0.1, as bench_llama.lua;
# validation (one batch) only before step 1 and after the last (outside the timed steps), no samples
( cd build/llmc && timeout 180 "$bin" -i "$shard" -j "$shard" -e d12 -b $B -t $T -d $((B * T)) -x $((steps + warm)) \
    -l 1e-4 -u 0 -q 1.0 -c 0.1 -r 0 -z 0 -v 1000000 -m 1 -s 0 -n 0 ) >"$logs/llmc.txt" 2>&1 ||
  { tail -n 15 "$logs/llmc.txt" >&2; die "train_gpt2cu failed (the log: $logs/llmc.txt)"; }
timeout 180 "$Z" "$here/bench_llama.lua" model=gpt2 batch=$B seq=$T steps="$steps" warmup="$warm" data="$shard" \
  >"$logs/zrun.txt" 2>&1 || { tail -n 15 "$logs/zrun.txt" >&2; die "zrun's bench_llama.lua failed (the log: $logs/zrun.txt)"; }

sh "$here/vs_llmc_table.sh" "$logs/llmc.txt" "$logs/zrun.txt" $B $T "$warm" >"$logs/table.txt"; rc=$?
cat "$logs/table.txt"
echo "logs: $logs"
exit $rc
