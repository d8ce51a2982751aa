#!/bin/sh
# Builds llm.c's train_gpt2cu (bf16, cuDNN flash attention, one GPU: no NCCL, no MPI) with llm.c's
# own Makefile from the bundle of tests/bench/llmc_bundle.sh, into BUILD_DIR; a binary built from
# the same bundle (its SOURCES file) is reused. Prints the binary's path as its last line.
#   sh tests/bench/llmc_build.sh [BUNDLE=.llmc] [BUILD_DIR=build/llmc]
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), GPU_COMPUTE_CAPABILITY
# (default: nvidia-smi's, else 90 for the H200), JOBS (make -j, default 16).
bundle=$(cd "${1:-.llmc}" 2>/dev/null && pwd) ||
  { echo "llmc_build: no bundle at ${1:-.llmc}; make it with sh tests/bench/llmc_bundle.sh" >&2; exit 1; }
bd=${2:-build/llmc}
fe=$bundle/cudnn-frontend/include
[ -f "$bundle/llm.c/train_gpt2.cu" ] && [ -f "$fe/cudnn_frontend.h" ] && [ -f "$bundle/SOURCES" ] ||
  { echo "llmc_build: $bundle lacks llm.c/train_gpt2.cu, cudnn-frontend/include or SOURCES; remake it with sh tests/bench/llmc_bundle.sh" >&2; exit 1; }
mkdir -p "$bd" && bd=$(cd "$bd" && pwd) || exit 1
bin=$bd/train_gpt2cu
if [ -x "$bin" ] && cmp -s "$bundle/SOURCES" "$bd/SOURCES"; then echo "$bin"; exit 0; fi

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "llmc_build: nvcc not found (not on PATH, not at $nvcc); install the CUDA toolkit or set NVCC" >&2; exit 1; }
cuda=$(cd "$(dirname "$nvcc")/.." && pwd)
# the first folder of the list that holds the file
first() { f=$1; shift; for d in "$@"; do [ -e "$d/$f" ] && { echo "$d"; return 0; }; done; return 1; }
libdirs=$(echo "${LIBRARY_PATH:-}" | tr ':' ' ')
libdirs="$libdirs /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib $cuda/lib64 $cuda/lib $cuda/lib64/stubs $cuda/targets/x86_64-linux/lib/stubs"
cudnn_inc=$(first cudnn.h /usr/include/x86_64-linux-gnu /usr/include "$cuda/include") ||
  { echo "llmc_build: cudnn.h not found (in /usr/include[/x86_64-linux-gnu] or $cuda/include); install cuDNN 9's headers" >&2; exit 1; }
# shellcheck disable=SC2086
cudnn_lib=$(first libcudnn.so $libdirs) ||
  { echo "llmc_build: libcudnn.so not found (in $libdirs); install cuDNN 9 or add its folder to LIBRARY_PATH" >&2; exit 1; }
# llm.c links NVML (-lnvidia-ml) for its GPU-utilisation report; the driver ships only the .so.1
mkdir -p "$bd/lib"
# shellcheck disable=SC2086
if ! nvml=$(first libnvidia-ml.so $libdirs); then
  if so1=$(first libnvidia-ml.so.1 $libdirs); then ln -sf "$so1/libnvidia-ml.so.1" "$bd/lib/libnvidia-ml.so"
  else # no driver here (a build machine without a GPU): link against an empty stub of the same soname;
    # train_gpt2cu calls no NVML function (its NVML code is in an unused utilisation report), so the
    # binary does not load it; carry build/llmc to the GPU machine to skip the build there
    echo "llmc_build: no NVML (libnvidia-ml.so.1) in $libdirs: linking against an empty stub" >&2
    printf 'int llmc_build_nvml_stub(void) { return 0; }\n' > "$bd/lib/stub.c"
    gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o "$bd/lib/libnvidia-ml.so" "$bd/lib/stub.c" ||
      { echo "llmc_build: could not build the NVML stub (gcc)" >&2; exit 1; }
  fi
  nvml=$bd/lib
fi
# flags for the folders found; none for the compilers' own (-I/usr/include breaks #include_next)
own() { case $1 in /usr/include | /usr/include/x86_64-linux-gnu | /usr/lib/x86_64-linux-gnu | /usr/lib64 | /usr/lib) return 0 ;; esac; return 1; }
incs="-I$fe"; own "$cudnn_inc" || incs="$incs -I$cudnn_inc"
libs=""; own "$nvml" || libs="-L$nvml"
own "$cudnn_lib" || libs="$libs -L$cudnn_lib -Xlinker -rpath=$cudnn_lib"
cc=${GPU_COMPUTE_CAPABILITY:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')}
cc=${cc:-90}

# a fresh copy of the sources: llm.c's Makefile writes build/ beside them and wants cudnn-frontend/
rm -rf "$bd/src" "$bin" "$bd/SOURCES"
mkdir -p "$bd/src" && cp -R "$bundle/llm.c/." "$bd/src/" && ln -s "$bundle/cudnn-frontend" "$bd/src/cudnn-frontend" || exit 1
# llm.c predates CUDA 13, whose cudaMemAdvise takes a cudaMemLocation instead of a device number
# (its one call: the managed-memory fallback after an out-of-memory, where the memory prefers the host)
rt=$(first cuda_runtime_api.h "$cuda/include" "$cuda/targets/x86_64-linux/include")/cuda_runtime_api.h
if grep -q 'cudaMemAdvise(.*struct cudaMemLocation location)' "$rt" 2>/dev/null; then
  sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    "$bd/src/llmc/cuda_utils.cuh"
fi
echo "llmc_build: make train_gpt2cu (sm_$cc, cuDNN from $cudnn_lib, $nvcc) in $bd/src" >&2
# NVCC_INCLUDES/NVCC_LDLIBS replace the Makefile's (its additions to them are MPI's and NCCL's,
# both off here): the frontend and cuDNN headers, cuDNN's and NVML's folders, cuDNN's as rpath.
# shellcheck disable=SC2086
( cd "$bd/src" && make -j"${JOBS:-16}" train_gpt2cu NVCC="$nvcc" USE_CUDNN=1 PRECISION=BF16 \
    NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY="$cc" CUDNN_FRONTEND_PATH="$fe" \
    NVCC_INCLUDES="$incs" NVCC_LDLIBS="$libs" ) >"$bd/build.log" 2>&1 ||
  { tail -n 20 "$bd/build.log" >&2; echo "llmc_build: building train_gpt2cu failed (the log: $bd/build.log)" >&2; exit 1; }
mv "$bd/src/train_gpt2cu" "$bin" && cp "$bundle/SOURCES" "$bd/SOURCES" || exit 1
echo "$bin"
