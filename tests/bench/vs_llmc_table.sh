#!/bin/sh
# The table of tests/bench/vs_llmc.sh from its two logs: llm.c's train_gpt2cu step lines ("step
# N/M | loss L (..z)| norm .. | lr .. | X ms | ..") and zrun's bench_llama.lua output. tokens/s is
# B*T over the median step time after the warm-up steps, the same statistic for both.
#   sh tests/bench/vs_llmc_table.sh LLMC_LOG ZRUN_LOG B T WARMUP    (exit 1: a log without steps, or a loss that did not fall)
[ $# -eq 5 ] || { echo "usage: sh tests/bench/vs_llmc_table.sh LLMC_LOG ZRUN_LOG B T WARMUP" >&2; exit 2; }
for f in "$1" "$2"; do [ -f "$f" ] || { echo "vs_llmc_table: no log at $f" >&2; exit 1; }; done
awk -v B="$3" -v T="$4" -v W="$5" -v llmc_log="$1" '
function median(a, n,   i, j, t) { # the ceil(n/2)-th smallest, as bench_llama.lua takes it
  for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
  return a[int((n + 1) / 2)]
}
FILENAME == llmc_log && /^step +[0-9]+\/[0-9]+ \| loss / {
  split($0, f, "|"); split(f[1], s, /[ \/]+/); step = s[2] + 0
  split(f[2], l, " "); loss = l[2]
  for (i = 3; i <= length(f); i++) if (f[i] ~ / ms *$/) { split(f[i], m, " "); ms = m[1] }
  if (step == 1) lfirst = loss
  llast = loss; lsteps = step
  if (step > W) lt[++ln] = ms
  next
}
FILENAME != llmc_log && /^step [0-9]+ loss / { if (zfirst == "") { zfirst = $4; zfs = $2 } zlast = $4; zsteps = $2; next }
FILENAME != llmc_log && /^optimizer step time \(median\)/ { zms = $5; next }
END {
  if (ln == 0) { print "vs_llmc_table: no timed step lines (\"step N/M | loss ... | X ms\") in " llmc_log > "/dev/stderr"; exit 1 }
  if (zms == "" || zlast == "") { print "vs_llmc_table: no \"step N loss\" / \"optimizer step time (median)\" lines in zrun'"'"'s log" > "/dev/stderr"; exit 1 }
  lms = median(lt, ln)
  printf "GPT-2 124M from random init, B=%d T=%d, bf16, AdamW, %d steps timed after %d warm-ups, same GPU, same run\n", B, T, ln, W
  printf "%-14s %12s %10s   %s\n", "tool", "tokens/s", "ms/step", "loss (first -> last step)"
  printf "%-14s %12.0f %10.2f   %.4f -> %.4f (step %d)\n", "llm.c", B * T * 1000 / lms, lms, lfirst, llast, lsteps
  printf "%-14s %12.0f %10.2f   %.4f -> %.4f (step %d)\n", "zrun", B * T * 1000 / zms, zms, zfirst, zlast, zsteps
  printf "%-14s %12.3f\n", "zrun / llm.c", lms / zms
  bad = 0
  if (!(llast + 0 < lfirst + 0)) { print "CHECK: llm.c'"'"'s loss did not fall"; bad = 1 }
  if (!(zlast + 0 < zfirst + 0)) { print "CHECK: zrun'"'"'s loss did not fall"; bad = 1 }
  exit bad
}' "$1" "$2" || exit 1
cat <<'EOF'
Same: GPT-2 124M (tied head, vocabulary padded for the GEMMs), bf16 weights with fp32 master weights and
AdamW (lr 1e-4 constant, betas 0.9/0.95, eps 1e-8, weight decay 0.1, gradient clipping 1.0), no
recomputation, no dropout, no accumulation, one GPU; each tool's own attention (llm.c: cuDNN's).
Differs: llm.c decays only the 2-D weights (zrun: every parameter); llm.c's init scales the residual
projections by 1/sqrt(2L) (zrun: transformers' normal(0, 0.02)); llm.c scores T targets per row (the
token after the row too), zrun T-1 (transformers' labels shift); llm.c visits the shard's B*T windows
shuffled and reads each from the file inside its timed step (zrun: in order, held on the GPU); llm.c
times a step with CUDA events, zrun with the host clock around the step and loss:item().
EOF
