#!/bin/sh
# The head_dim-64 Hopper attention forward's variants side by side, one bench_fused through its BENCH_ATTN_FWD_*
# knobs (bench_fused.cu, attn_knobs), in tests/bench/ab_attention.sh's alternating rounds: base (the default: 192-query
# tiles where T > 128, started before row 0), r128 (128-query tiles), head (tiles from row 0); the head_dim-64 rows
# alone (BENCH_ATTN_DH=64: the variants change nothing else).
#   sh tests/bench/ab_fwd_variants.sh [--sustained] ROUNDS BENCH_FUSED
die() { echo "ab_fwd_variants.sh: $*" >&2; exit 1; }
mode=
if [ "${1:-}" = --sustained ]; then mode=--sustained; shift; fi
[ $# -eq 2 ] || die "give ROUNDS and one BENCH_FUSED (got $# arguments)"
rounds=$1; b=$2
[ -x "$b" ] || die "no executable at $b (build it: make BUILD=DIR DIR/bench/bench_fused)"
case $b in /*) ;; *) b=$PWD/$b ;; esac
w=$(mktemp -d) || exit 1
trap 'rm -rf "$w"' EXIT
variant() { # NAME ENV-ASSIGNMENTS...: a wrapper running the bench with them
  n=$1; shift
  printf '#!/bin/sh\nexec env %s "%s" "$@"\n' "$*" "$b" > "$w/$n" && chmod +x "$w/$n"
}
variant base BENCH_ATTN_DH=64 BENCH_ATTN_FWD_ROWS=0
variant r128 BENCH_ATTN_DH=64 BENCH_ATTN_FWD_ROWS=128
variant head BENCH_ATTN_DH=64 BENCH_ATTN_FWD_TAIL=0
sh "$(dirname "$0")/ab_attention.sh" $mode "$rounds" base="$w/base" r128="$w/r128" head="$w/head"
