#!/bin/sh
# zrun next to PyTorch on the GPU machine, in one table with ratios (issue 18's comparisons):
# Llama training throughput per shape (zrun bench_llama.lua vs tests/bench/llama_torch.py, eager
# and torch.compile, same config, same accumulation, same run), and attention forward+backward
# (bench_fused's attention rows vs PyTorch SDPA's best backend, in bursts and --sustained at the power
# cap; head_dim 64, issue 18's shapes, 128, Qwen3-0.6B's and Llama-3-8B's heads, and 96, Phi-3-mini's). Without torch
# only zrun's side runs.
#   sh tests/bench/vs_torch.sh [CONFIG_JSON] [ZRUN] [BENCH_DIR]
# CONFIG_JSON (for PyTorch; zrun uses its built-in meta-llama/Llama-3.2-1B, the same fields)
# defaults to shared/data's Llama-3.2-1B config.json; where that file is absent, zrun's built-in
# config is written out for PyTorch (hf.save_config of lua/zrun/models/configs.lua's entry). VS_TORCH_SHAPES picks the rows (default
# "4x512x8,16x512x8,4x2048x8": batch x seq x micro-batches per step), VS_TORCH_MODES the PyTorch
# columns (default "eager,compile"; torch.compile's warm-up takes minutes per shape). VS_TORCH_ROUNDS
# (default 1) runs each row's zrun and PyTorch measurements that many times, alternating, and prints
# the medians with every round's figures below the row: a ratio target near its bound needs it, as
# either side moves by about 1% from one process to the next. VS_TORCH_SHAPES=none: the attention
# table alone.
C=${1:-}; C=${C:-${ZRUN_TEST_DATA:-../shared/data}/models/llama-3.2-1b/config.json}; Z=${2:-./zrun}; BD=${3:-build/bench}
PY=${PYTHON:-python3}
have_torch=0
$PY -c "import torch, transformers, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && have_torch=1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
[ $have_torch = 0 ] && echo "(no torch + transformers with CUDA for $PY here: zrun's side only)"
if [ $have_torch = 1 ] && [ "${VS_TORCH_SHAPES:-}" != none ] && [ ! -f "$C" ]; then
  $Z -e 'require("zrun.hf").save_config(arg[1], require("zrun.models.configs")["meta-llama/Llama-3.2-1B"])' "$tmp" ||
    { echo "vs_torch.sh: no config at $C, and zrun could not write its built-in one" >&2; exit 1; }
  echo "(PyTorch's model: no $C here, so zrun's built-in meta-llama/Llama-3.2-1B config)"
  C=$tmp/config.json
fi
rounds=${VS_TORCH_ROUNDS:-1}
case $rounds in ''|*[!0-9]*|0) echo "vs_torch.sh: VS_TORCH_ROUNDS=$rounds: use a count of 1 or more" >&2; exit 1 ;; esac
median() { # the median of the numbers among the arguments ("-" where none)
  printf '%s\n' "$@" | awk '$1 ~ /^[0-9.]+$/ { v[++n] = $1 } END {
    if (!n) { print "-"; exit }
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    print (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }'
}
shapes=$(echo "${VS_TORCH_SHAPES:-4x512x8,16x512x8,4x2048x8}" | tr ',' ' ')
[ "$shapes" = none ] && shapes=
[ -n "$shapes" ] && printf '%-30s %12s %12s %12s %10s %10s\n' "Llama training (tokens/s)" zrun "torch eager" "torch.compile" "× eager" "× compile"
for shape in $shapes; do
  set -- $(echo "$shape" | tr 'x' ' ')
  [ $# = 3 ] || { echo "vs_torch.sh: VS_TORCH_SHAPES entry '$shape' is not BATCHxSEQxGAS (e.g. 16x512x8)" >&2; exit 1; }
  zs= es= cs= i=0
  while [ $i -lt "$rounds" ]; do
    z=$($Z tests/bench/bench_llama.lua batch=$1 seq=$2 gas=$3 steps=4 2>&1 | awk '$1 == "tokens/s" { print $2 }')
    e=- c=-
    if [ $have_torch = 1 ]; then
      $PY tests/bench/llama_torch.py "$C" --batch $1 --seq $2 --gas $3 --steps 4 --modes "${VS_TORCH_MODES:-eager,compile}" >"$tmp/t" 2>&1
      e=$(awk '$2 == "eager" && $3 == "tokens/s" { print $4 }' "$tmp/t"); c=$(awk '$2 == "compile" && $3 == "tokens/s" { print $4 }' "$tmp/t")
      grep "failed" "$tmp/t" >&2
      [ -z "$e$c" ] && echo "vs_torch.sh: tests/bench/llama_torch.py gave no tokens/s for $shape: $(tail -n 1 "$tmp/t")" >&2
    fi
    zs="$zs ${z:--}" es="$es ${e:--}" cs="$cs ${c:--}" i=$((i + 1))
  done
  z=$(median $zs) e=$(median $es) c=$(median $cs)
  awk -v n="B=$1 T=$2 gas $3" -v z="${z:--}" -v e="${e:--}" -v c="${c:--}" 'BEGIN {
    r1 = (z + 0 > 0 && e + 0 > 0) ? sprintf("%.2f", z / e) : "-"; r2 = (z + 0 > 0 && c + 0 > 0) ? sprintf("%.2f", z / c) : "-"
    printf "%-30s %12s %12s %12s %10s %10s\n", n, z, e, c, r1, r2 }'
  if [ "$rounds" -gt 1 ]; then printf '  %s rounds, medians above: zrun%s; eager%s; compile%s\n' "$rounds" "$zs" "$es" "$cs"; fi
done
[ -x "$BD/bench_fused" ] || exit 0
# attention f+b, zrun against SDPA's best backend: short bursts (the boost clock), then --sustained (each shape after
# 2 s of f+b, timed over 0.25 s windows: the power cap's rate, which a training step runs at)
attn_table() {
"$BD/bench_fused" attention $1 | sed -n '/^attention/,$p' >"$tmp/za"
[ $have_torch = 1 ] && { $PY tests/bench/bench_attention_torch.py $1 && $PY tests/bench/bench_attention_torch.py $1 --dh 128 &&
  $PY tests/bench/bench_attention_torch.py $1 --dh 96; } >"$tmp/ta" 2>/dev/null
echo
printf '%-30s %12s %12s %12s %10s\n' "attention f+b (ms)${1:+ $1}" zrun "torch best" "backend" "× best"
# rows: the GQA shapes at B=4, then GPT-2 124M's (B=64, 12 heads, T=1024), then head_dim 128 (Qwen3-0.6B's heads,
# Llama-3-8B's), then Phi-3-mini's head_dim 96; a key is the start of both scripts' row (the first such row:
# bench_fused's default grid)
for row in "B4 T512 H32/8 Dh64|causal GQA B4 H32/8 Dh64 T=512" "B4 T2048 H32/8 Dh64|causal GQA B4 H32/8 Dh64 T=2048" \
           "B4 T8192 H32/8 Dh64|causal GQA B4 H32/8 Dh64 T=8192" "B64 T1024 H12|causal B64 H12 Dh64 T=1024" \
           "B4 T512 H16/8 Dh128|causal GQA B4 H16/8 Dh128 T=512" "B4 T2048 H32/8 Dh128|causal GQA B4 H32/8 Dh128 T=2048" \
           "B1 T8192 H32/8 Dh128|causal GQA B1 H32/8 Dh128 T=8192" "B2 T4096 H32|causal B2 H32 Dh96 T=4096"; do
  key=${row%%|*}; name=${row#*|}
  z=$(awk -v t="$key" 'index($0, t) == 1 { k = 0; for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) n[++k] = $i; if (k >= 3) { print n[3]; exit } }' "$tmp/za")
  b=$(awk -v t="$key" 'index($0, t) == 1 && NF == 11 && $8 ~ /^[0-9.]+$/ { if (best == "" || $8 + 0 < best + 0) { best = $8; be = $5 } } END { print best, be }' "$tmp/ta" 2>/dev/null)
  set -- $b
  awk -v n="$name" -v z="${z:--}" -v b="${1:--}" -v be="${2:--}" 'BEGIN {
    r = (z + 0 > 0 && b + 0 > 0) ? sprintf("%.2f", b / z) : "-"; printf "%-30s %12s %12s %12s %10s\n", n, z, b, be, r }'
done
}
attn_table ""
attn_table --sustained
