#!/bin/sh
# Pack a CUDA build made on this machine for the device tool (which has no LuaJIT to build with): the stripped zrun
# and the GPU test binaries into .gpu/NAME/, the tests of that build's tree (when TREE is another checkout: a
# worktree with commits not on this one) that differ from this checkout's into .gpu/NAME/tests/, and the real-shape data into .gpu/data/.
# Keep .gpu/ in .git/info/exclude and name it in the device call's carry; then on the device tests/bench/gpu_check.sh.
#   make BUILD=/tmp/b BIN=/tmp/b/zrun /tmp/b/zrun /tmp/b/tests/test_fused_kernels /tmp/b/tests/test_gemm_sm90 [/tmp/b/bench/bench_fused /tmp/b/bench/bench_gemm_sm90]
#   sh tests/bench/gpu_pack.sh NAME BUILD_DIR [TREE]
name=$1; b=$2; tree=$3; data=${ZRUN_TEST_DATA:-../shared/data}
[ -n "$name" ] && [ -x "$b/zrun" ] || { echo "usage: sh tests/bench/gpu_pack.sh NAME BUILD_DIR [TREE] (BUILD_DIR/zrun built)"; exit 2; }
d=.gpu/$name; rm -rf "$d"; mkdir -p "$d" .gpu/data
strip -o "$d/zrun" "$b/zrun" && xz -T2 -6 "$d/zrun" || exit 1
# bench/bench_fused (ab_attention.sh's builds) and bench/bench_gemm_sm90 too where they were built (make BUILD_DIR/bench/...)
bench=; for x in bench/bench_fused bench/bench_gemm_sm90; do [ -x "$b/$x" ] && bench="$bench $x"; done
tar -C "$b" -cJf "$d/tests.tar.xz" tests/test_fused_kernels tests/test_gemm_sm90 $bench || exit 1
if [ -n "$tree" ]; then # only the tests that differ from this checkout's
  (cd "$tree" && find tests -type f) | while read -r f; do
    cmp -s "$tree/$f" "$f" || { mkdir -p "$d/$(dirname "$f")" && cp "$tree/$f" "$d/$f" && echo "tests from $tree: $f"; }
  done
fi
cp "$data/models/llama-3.2-1b/config.json" .gpu/data/llama_config.json
cp "$data/tokenizers/tinyllama-1.1b-chat-v1.0/tokenizer.json" "$data/wikitext-2-raw/wiki.valid.raw" .gpu/data/
du -sh "$d" .gpu/data
