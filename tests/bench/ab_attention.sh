#!/bin/sh
# Attention kernels A/B on the GPU machine: `bench_fused attention` of two or more builds, run in
# turn ROUNDS times (A B .. A B ..: the clock the power cap leaves drifts within a call, so
# alternating spreads it over every build), then per shape the median fwd / bwd / f+b ms of each
# build and its f+b and bwd against the first build's (< 1: faster). The rows of the default grid
# only (bench_fused's "tile/block" rows are left out).
#   sh tests/bench/ab_attention.sh [--sustained] ROUNDS NAME=BENCH_FUSED NAME=BENCH_FUSED [...]
# e.g. sh tests/bench/ab_attention.sh 3 main=/tmp/m/bench_fused try=/tmp/t/bench_fused
# --sustained: `bench_fused attention --sustained`, the rate at the power cap, which training runs at
# (session 35: at T = 2048 ours ran 6% slower there than in bursts, and PyTorch's SDPA 5-10% faster).
die() { echo "ab_attention.sh: $*" >&2; exit 1; }
mode=
if [ "${1:-}" = --sustained ]; then mode=--sustained; shift; fi
rounds=$1
case $rounds in ''|*[!0-9]*|0) die "ROUNDS='$rounds': give a count of 1 or more first, then two or more NAME=BENCH_FUSED" ;; esac
shift
[ $# -ge 2 ] || die "give two or more builds as NAME=BENCH_FUSED after ROUNDS (got $#)"
names=""
for a in "$@"; do
  n=${a%%=*}; b=${a#*=}
  case $a in *=*) ;; *) die "'$a' is not NAME=BENCH_FUSED" ;; esac
  case $n in ''|*[!A-Za-z0-9_.-]*) die "'$n' is not a name (letters, digits, _ . -)" ;; esac
  case " $names " in *" $n "*) die "the name '$n' is given twice" ;; esac
  [ -x "$b" ] || die "$n: no executable at $b (build it: make BUILD=DIR DIR/bench/bench_fused)"
  names="$names $n"
done
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
r=1
while [ "$r" -le "$rounds" ]; do
  for a in "$@"; do
    n=${a%%=*}; b=${a#*=}
    "$b" attention $mode > "$tmp/out" 2>&1
    # shape (4 fields), then fwd, bwd, f+b ms
    awk -v n="$n" '/ Dh[0-9]+ / && !/tile\/block/ && $5 ~ /^[0-9.]+$/ && $6 ~ /^[0-9.]+$/ && $7 ~ /^[0-9.]+$/ {
      print n, $1 " " $2 " " $3 " " $4, $5, $6, $7 }' OFS='\t' "$tmp/out" > "$tmp/rows"
    [ -s "$tmp/rows" ] || die "$n: no attention rows in its output (round $r): $(head -c 300 "$tmp/out")"
    cat "$tmp/rows" >> "$tmp/all"
    # each run's rows as they come (a call cut off by its time limit keeps the rounds it ran)
    sed "s/^/# round $r: /" "$tmp/rows"
  done
  r=$((r + 1))
done
echo "attention${mode:+ $mode} (ms, median of $rounds alternating rounds; vs: against $(echo $names | cut -d' ' -f1))"
awk -F'\t' -v order="$names" '
  function median(s,   v, k, i, j, t) {
    k = split(s, v, " ")
    for (i = 2; i <= k; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return (k % 2) ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
  }
  { key = $1 SUBSEP $2; if (!($2 in seen)) { seen[$2] = 1; shapes[++ns] = $2 }
    f[key] = f[key] " " $3; b[key] = b[key] " " $4; fb[key] = fb[key] " " $5 }
  END {
    nb = split(order, nm, " ")
    printf "%-26s %-10s %8s %8s %8s %9s %9s\n", "shape", "build", "fwd", "bwd", "f+b", "f+b vs", "bwd vs"
    for (s = 1; s <= ns; s++) {
      k0 = nm[1] SUBSEP shapes[s]; fb0 = median(fb[k0]); b0 = median(b[k0])
      for (i = 1; i <= nb; i++) {
        k = nm[i] SUBSEP shapes[s]
        if (!(k in fb)) { printf "%-26s %-10s %8s\n", shapes[s], nm[i], "missing"; continue }
        mf = median(f[k]); mb = median(b[k]); mfb = median(fb[k])
        printf "%-26s %-10s %8.3f %8.3f %8.3f %9.3f %9.3f\n", shapes[s], nm[i], mf, mb, mfb,
          (fb0 > 0 ? mfb / fb0 : 0), (b0 > 0 ? mb / b0 : 0)
      }
    }
  }' "$tmp/all"
