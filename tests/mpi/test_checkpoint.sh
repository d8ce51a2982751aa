#!/bin/sh
# Checkpoints under mpirun (tests/mpi/checkpoint_check.lua): save after 3 steps, resume in a
# fresh process, and compare with the uninterrupted 6-step run — bitwise for stages 0-3 on 2
# ranks (stage 2 also with accumulation); resharding 4 -> 2, 2 -> 4 and 2 -> 1 ranks, with stage
# changes, restores the gathered fp32 state bitwise and continues the loss curve (2e-5); and
# zero-to-fp32 output equals the gathered master weights.
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
CK=tests/mpi/checkpoint_check.lua
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
run() { # np, args...
  np=$1; shift
  mpirun $MPI_FLAGS -np "$np" $Z $CK "$@" || echo "FAIL checkpoint_check np=$np $*: mpirun exited $?"
}
# same world size and stage: bitwise resume; a tag saved into twice holds the second save whole
for sg in "0 1" "1 1" "2 1" "2 2" "3 1"; do
  set -- $sg
  W2="$W/gas$2"; mkdir -p "$W2"
  run 2 full "$1" "$2" "$W2"
  run 2 first "$1" "$2" "$W2"
  run 2 resume "$1" "$2" "$W2" "s$1_np2" 1
  run 2 twice "$1" "$2" "$W2"
done
# resharding and stage changes
run 4 full 2 1 "$W/gas1"
run 4 first 2 1 "$W/gas1"
run 2 resume 2 1 "$W/gas1" s2_np4 0
run 2 resume 3 1 "$W/gas1" s2_np4 0
run 4 resume 3 1 "$W/gas1" s1_np2 0
run 1 resume 0 1 "$W/gas1" s3_np2 0
run 1 resume 1 1 "$W/gas1" s2_np4 0
# a damaged checkpoint: rank 1's file truncated (every rank sees it against the manifest), from
# another save (the manifest's size patched to match: only the ranks reading it can tell), missing
mkdir -p "$W/bad/ckpt_s2_np2"
cp -r "$W/gas1/ckpt_s2_np2/global_step3" "$W/bad/ckpt_s2_np2/"
echo global_step3 > "$W/bad/ckpt_s2_np2/latest"
f="$W/bad/ckpt_s2_np2/global_step3/zero_pp_rank_1_mp_rank_00_optim_states.safetensors"
head -c 100000 "$f" > "$f.tmp" && mv "$f.tmp" "$f"
run 2 badload 2 1 "$W/bad" s2_np2 "$f: 100000 bytes, but zrun_manifest.json says"
run 4 badload 2 1 "$W/bad" s2_np2 "$f: 100000 bytes, but zrun_manifest.json says"
cp "$W/gas2/ckpt_s2_np2/global_step3/zero_pp_rank_1_mp_rank_00_optim_states.safetensors" "$f"
m="$W/bad/ckpt_s2_np2/global_step3/zrun_manifest.json"
sed "s/\(\"zero_pp_rank_1_mp_rank_00_optim_states.safetensors\": \)[0-9]*/\1$(wc -c < "$f")/" "$m" > "$m.new" && mv "$m.new" "$m"
run 2 badload 2 1 "$W/bad" s2_np2 "failed on rank 1: $f: written by save"
run 4 badload 2 1 "$W/bad" s2_np2 ": $f: written by save"
rm "$f"
run 2 badload 2 1 "$W/bad" s2_np2 "$f: missing, but zrun_manifest.json lists it"
# zero-to-fp32 on a 4-rank stage-2 and a 2-rank stage-3 checkpoint
for src in s2_np4 s3_np2; do
  out="$W/fp32_$src.safetensors"
  if $Z zero-to-fp32 --help >/dev/null 2>&1; then
    $Z zero-to-fp32 "$W/gas1/ckpt_$src" "$out" || echo "FAIL zero-to-fp32 $src: exited $?"
  else
    $Z -e "require('zrun.zero_to_fp32').main({'$W/gas1/ckpt_$src', '$out'})" || echo "FAIL zero-to-fp32 $src: exited $?"
  fi
  $Z $CK fp32 "$out" "$src" "$W/gas1" || echo "FAIL checkpoint_check fp32 $src: exited $?"
done
