#!/bin/sh
# GPU test suite (run on a machine with an NVIDIA GPU, from the repo root): the fused-kernel
# tests, the Hopper GEMM's tests, every zrun op on CUDA against its CPU twin (tests/ops/test_*_cuda.lua), the backend beyond
# single ops (tests/cuda/test_cuda.lua), the Trainer over padded rows (tests/cuda/test_trainer_cuda.lua), and with 2+ GPUs and mpirun the multi-GPU ZeRO equivalence
# test (it needs a zrun built with MPI), and the memory plan's time-line peak on the GPU(s). Ends with
# "N passed, N failed".
fused=${1:-build/tests/test_fused_kernels}; zrun=${2:-./zrun}; gemm=${3:-$(dirname "$fused")/test_gemm_sm90}
out=$(mktemp); trap 'rm -f "$out"' EXIT
pass=0; fail=0
run_one() { # command...
  "$@" >"$out" 2>&1; rc=$?
  cat "$out"
  p=$(grep -c '^PASS ' "$out"); f=$(grep -c '^FAIL ' "$out")
  [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { echo "FAIL $*: exited with status $rc"; f=1; }
  pass=$((pass + p)); fail=$((fail + f))
}
run_one $fused
run_one $gemm
for t in tests/ops/test_*_cuda.lua tests/cuda/test_cuda.lua tests/cuda/test_trainer_cuda.lua tests/cuda/test_packed_cuda.lua tests/cuda/test_peft_cuda.lua tests/cuda/test_generate_cuda.lua tests/cuda/test_gemma3_cuda.lua tests/cuda/test_unpad_cuda.lua; do run_one $zrun "$t"; done
# the products again through each of our Hopper GEMMs wherever it takes them, and with both in the autotuning (the runtime's default: cuBLASLt only)
# (auto: tuned at each shape's first run, so the tests' products meet ours; and the cuBLASLt autotuner's
# switch of algorithm at a shape's second run)
for k in pingpong wide auto; do
  for t in tests/ops/test_matmul_cuda.lua tests/ops/test_linear_gelu_cuda.lua tests/ops/test_linear_multi_cuda.lua; do
    run_one env ZRUN_GEMM_SM90=$k ZRUN_GEMM_AUTOTUNE=1 $zrun "$t"
  done
done
for t in tests/ops/test_matmul_cuda.lua tests/ops/test_linear_multi_cuda.lua; do run_one env ZRUN_GEMM_AUTOTUNE=2 $zrun "$t"; done
tune_at() { # a shape is autotuned at its ZRUN_GEMM_AUTOTUNE-th run (default 8), not before, once
  count() { ZRUN_GEMM_AUTOTUNE=$1 ZRUN_GEMM_TUNE_LOG=1 $zrun -e "local zr = require 'zrun'
    local a = zr.randn({1024, 1024}, {device = 'cuda', dtype = 'bf16'})
    for i = 1, $2 do local c = a:matmul(a) end" 2>&1 | grep -c 'gemm tune:'; }
  got="$(count 3 2) $(count 3 3) $(count 3 9) $(count '' 7) $(count '' 8) $(count 0 9) $(count 1 1)"
  if [ "$got" = "0 1 1 0 1 0 1" ]; then echo "PASS a GEMM shape is autotuned once, at its ZRUN_GEMM_AUTOTUNE-th run (default 8)"
  else echo "FAIL autotuning runs (AUTOTUNE=3: 2, 3, 9 runs; default: 7, 8; 0: 9; 1: 1): got $got, want 0 1 1 0 1 0 1"; fi
}
run_one tune_at
family_tune() { # shapes a token count apart (m 1000..1020, one family) are not autotuned: each keeps the heuristic's
  # choice, even a shape run 8 times once another of its family ran (m 1008 after 1000); alone, 8 runs tune it
  count() { # the m values run in order: "tunings worst-relative-error"
    ZRUN_GEMM_TUNE_LOG=1 $zrun -e "local zr = require 'zrun'
    local w = zr.randn({1024, 1024}):to('bf16')
    local wc, wf, worst = w:to('cuda'), w:to('f32'), 0
    for _, m in ipairs({$1}) do
      local x = zr.randn({m, 1024}):to('bf16')
      local ref = x:to('f32'):matmul(wf)
      local y = x:to('cuda'):matmul(wc):to('cpu'):to('f32')
      worst = math.max(worst, (y - ref):abs():max():item() / ref:abs():max():item())
    end
    print(('worst %.3g'):format(worst))" 2>&1 | awk '/gemm tune:/ { n++ } /^worst / { w = $2 } END { print n + 0, w }'
  }
  mixed=$(count "1000, 1001, 1003, 1004, 1008, 1009, 1011, 1012, 1019, 1020")
  after=$(count "1000, 1008, 1008, 1008, 1008, 1008, 1008, 1008, 1008")
  alone=$(count "1008, 1008, 1008, 1008, 1008, 1008, 1008, 1008")
  if [ "${mixed% *}" = 0 ] && [ "${after% *}" = 0 ] && [ "${alone% *}" = 1 ] &&
    awk "BEGIN { exit !(${mixed#* } < 0.01 && ${after#* } < 0.01 && ${alone#* } < 0.01) }"; then
    echo "PASS a GEMM family of token counts is not autotuned (mixed: $mixed, 8 runs after another: $after); one shape alone is, at its 8th run ($alone)"
  else echo "FAIL GEMM family tuning (tunings, worst relative error): mixed '$mixed' (want 0), 8 runs after another '$after' (want 0), alone '$alone' (want 1), errors < 0.01"; fi
}
run_one family_tune
bad_env() { # VAR FIRST: VAR=bogus must be refused, naming the values it takes (FIRST the first)
  if env "$1=bogus" $zrun tests/ops/test_matmul_cuda.lua 2>&1 | grep -q "$1=bogus: use $2"; then
    echo "PASS $1=bogus is refused with the values it takes"
  else echo "FAIL $1=bogus: no refusal naming its values"; fi
}
run_one bad_env ZRUN_GEMM_SM90 0
run_one bad_env ZRUN_GEMM_TUNE_LOG 1
run_one bad_env ZRUN_GEMM_AUTOTUNE 0
auto_off() {
  if ZRUN_GEMM_AUTOTUNE=0 ZRUN_GEMM_SM90=auto $zrun tests/ops/test_matmul_cuda.lua 2>&1 | grep -q 'ZRUN_GEMM_SM90=auto with ZRUN_GEMM_AUTOTUNE=0'; then
    echo "PASS ZRUN_GEMM_SM90=auto with the autotuner off is refused"
  else echo "FAIL ZRUN_GEMM_SM90=auto with ZRUN_GEMM_AUTOTUNE=0: not refused"; fi
}
run_one auto_off
run_one env ZRUN_BIN=$zrun sh tests/cuda/test_zero_multi_gpu.sh
run_one env ZRUN_BIN=$zrun sh tests/cuda/test_zenflow_multi_gpu.sh
run_one env ZRUN_BIN=$zrun sh tests/cuda/test_comm_timeout_gpu.sh
run_one env ZRUN_BIN=$zrun sh tests/cuda/test_offload_pipeline.sh
run_one env ZRUN_BIN=$zrun sh tests/cuda/test_tcp_gpu.sh
run_one env ZRUN_BIN=$zrun sh tests/cuda/test_plan_timeline_gpu.sh
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
