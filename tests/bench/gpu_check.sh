#!/bin/sh
# On the device machine, from the repo root, for builds packed by tests/bench/gpu_pack.sh: unpadded SFT on a
# random-init Llama-3.2-1B (tests/bench/sft_real_shape.sh: the loss, tokens/s, the allocator's counters) with each
# build on one model, then the GPU suite (tests/run_cuda.sh) with SUITE's build and its tests. Logs go to $OUT as they
# are written (sft.log, suite_NAME.log), so a call cut off at its limit still returns what ran.
#   SUITE=NAME STEPS=100 sh tests/bench/gpu_check.sh NAME...
export ZRUN_HOME=$PWD NCCL_NVLS_ENABLE=0; O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader | tee "$O/gpu.txt"
D=.gpu/data; A="$D/llama_config.json $D/tokenizer.json $D/wiki.valid.raw ${STEPS:-100} configs/zero2.json packing=false"
keep=0
for v in "$@"; do
  mkdir -p "/tmp/z_$v" && xz -dc ".gpu/$v/zrun.xz" > "/tmp/z_$v/zrun" && chmod +x "/tmp/z_$v/zrun" || exit 1
  echo "## $v" >> "$O/sft.log"
  # shellcheck disable=SC2086 (A's words are separate arguments)
  KEEP_MODEL=$keep ZRUN_BIN="/tmp/z_$v/zrun" sh tests/bench/sft_real_shape.sh $A >> "$O/sft.log" 2>&1; keep=1
done
cat "$O/sft.log"
[ -n "$SUITE" ] || exit 0
R=/tmp/suite_$SUITE; rm -rf "$R"; cp -r . "$R" && cd "$R" || exit 1
[ -d ".gpu/$SUITE/tests" ] && cp -r ".gpu/$SUITE/tests/." tests/
xz -dc ".gpu/$SUITE/zrun.xz" > zrun && chmod +x zrun && mkdir -p build && tar -C build -xJf ".gpu/$SUITE/tests.tar.xz"
sh tests/run_cuda.sh build/tests/test_fused_kernels ./zrun build/tests/test_gemm_sm90 > "$O/suite_$SUITE.log" 2>&1
grep -E '^FAIL' "$O/suite_$SUITE.log" | head -20; tail -1 "$O/suite_$SUITE.log"
