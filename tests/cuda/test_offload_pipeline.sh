#!/bin/sh
# ZeRO optimizer offload's step pipeline on one GPU (runtime/zero/offload.h): gradients kept on
# the GPU until the step vs sent to the host during backward vs no offload, after 3 steps of a
# tiny Llama, at stages 1-3, accumulation 1 and 4, default chunks and 777-element chunks that cut
# parameters; bf16 gradient accumulation on the device; both places against the independent
# reference of tests/mpi/zero_check.lua. Partial offload (offload_optimizer.ratio 0, 0.3, 1, 0.5):
# the device part on the GPU's optimizer kernels while the host part runs the pipeline, against
# ratio 1 and no offload, and checkpoints across ratios (tests/mpi/offload_ratio_check.lua). Stage 3
# offload_param, its shard pinned or pageable, prefetched or not (tests/cuda/offload_param_check.lua). Run on
# the GPU machine:
#   sh tests/cuda/test_offload_pipeline.sh        (ends with "N passed, N failed"; part of run_cuda.sh)
export ZRUN_CHECK_DEVICE=cuda
Z=${ZRUN_BIN:-./zrun}
out=$(mktemp); work=$(mktemp -d); trap 'rm -f "$out"; rm -rf "$work"' EXIT
run() { # script args...
  "$Z" "$@" >>"$out" 2>&1 || echo "FAIL $*: exited $?" >>"$out"
}
for stage in 1 2 3; do
  for gas in 1 4; do
    run tests/mpi/offload_pipeline_check.lua $stage $gas                   # device vs host gradients
    ZRUN_OFFLOAD_CHUNK=777 run tests/mpi/offload_pipeline_check.lua $stage $gas
    run tests/mpi/offload_pipeline_check.lua $stage $gas none              # device vs no offload
  done
  ZRUN_OFFLOAD_CHUNK=777 run tests/mpi/offload_pipeline_check.lua $stage 4 bf16
  for place in device host; do ZRUN_OFFLOAD_GRADS=$place run tests/mpi/zero_check.lua $stage 1 3 0.05; done
  for gas in 1 4; do
    for ratio in 0 0.3 1; do run tests/mpi/offload_ratio_check.lua $stage $gas $ratio "$work"; done
  done
  ZRUN_OFFLOAD_CHUNK=777 run tests/mpi/offload_ratio_check.lua $stage 4 0.5 "$work" adamw bf16
done
for opt in lion adagrad sgd; do run tests/mpi/offload_ratio_check.lua 2 2 0.5 "$work" $opt; done
run tests/cuda/offload_param_check.lua                                     # stage 3 offload_param: pinned vs pageable
grep -E '^(PASS|FAIL)' "$out"
grep -q '^FAIL' "$out" && { cat "$out" | grep -v '^PASS' | tail -40; }
echo "$(grep -c '^PASS' "$out") passed, $(grep -c '^FAIL' "$out") failed"
! grep -q '^FAIL' "$out"
