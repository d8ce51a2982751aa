# zrun build. `make` builds ./zrun; `make test`, `make run`, `make bench` build then run.
# `make deps` installs missing Debian packages. CUDA=0 disables the CUDA backend; DEPS_PREFIX=dir
# takes headers/static libraries from an unpacked prefix (tools/deps-prefix.sh) instead of /usr.

CC       ?= gcc
BUILD    ?= build
BIN      ?= zrun
NVCC     ?= nvcc
DEPS_PREFIX ?=
MULTIARCH := x86_64-linux-gnu
PREFIX_INC := $(if $(DEPS_PREFIX),-I$(DEPS_PREFIX)/usr/include -I$(DEPS_PREFIX)/usr/include/luajit-2.1 -I$(DEPS_PREFIX)/usr/include/$(MULTIARCH),)
LIBDIRS  := $(if $(DEPS_PREFIX),$(DEPS_PREFIX)/usr/lib/$(MULTIARCH) ,)/usr/lib/$(MULTIARCH) /usr/lib /usr/local/lib
findlib   = $(firstword $(wildcard $(addsuffix /$(1),$(LIBDIRS))))

VERSION  := 0.1.0
NPROC    := $(shell nproc 2>/dev/null || echo 2)
GIT_REV  := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
CFLAGS   ?= -O3 -march=x86-64-v3 -g
CFLAGS   += -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-format-truncation -fopenmp -pthread \
            $(PREFIX_INC) -DZR_VERSION=\"$(VERSION)\" -DZR_GIT_REV=\"$(GIT_REV)\"
# Include paths follow the layers (dependencies point down): kernels/ sees only itself (its
# includes are relative: "../base/dtype.h"); runtime/ names its rooms ("core/tensor.h") and the
# kernels from the root ("kernels/cuda/norm.h"); only lua/ sees Lua and itself.
RUNTIME_INC := -Iruntime -I.
LUA_INC     := $(RUNTIME_INC) -Ilua -I/usr/include/luajit-2.1
LDLIBS   := -lmvec -lm -ldl -lpthread

# --- feature detection (one line per feature) ---
LUAJIT_A := $(call findlib,libluajit-5.1.a)
CJSON_A  := $(call findlib,liblua5.1-cjson.a)
# The OpenMP build of OpenBLAS shares zrun's OpenMP thread pool (the pthreads build competes with it).
BLAS_A   := $(firstword $(call findlib,openblas-openmp/libopenblas.a) $(call findlib,libopenblas.a))
PCRE2_A  := $(call findlib,libpcre2-8.a)
UTF8PROC_A := $(call findlib,libutf8proc.a)
# (the fuzz targets' objects take the same flag: their CFLAGS are their own)
UTF8PROC_FLAGS := $(if $(UTF8PROC_A),-DZR_HAVE_UTF8PROC -DUTF8PROC_STATIC,)
READLINE_A := $(call findlib,libreadline.a)
NCURSES_A  := $(firstword $(call findlib,libtinfo.a) $(call findlib,libncurses.a))
HAVE_NVCC := $(if $(filter 0,$(CUDA)),,$(shell command -v $(NVCC) 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null))
HAVE_MPI  := $(shell command -v mpicc 2>/dev/null)
CUDA_HOME ?= $(if $(HAVE_NVCC),$(patsubst %/bin/nvcc,%,$(firstword $(HAVE_NVCC))),)
HAVE_NCCL := $(if $(HAVE_NVCC),$(firstword $(wildcard /usr/include/nccl.h $(CUDA_HOME)/include/nccl.h $(DEPS_PREFIX)/usr/include/nccl.h)),)

LDLIBS := $(LUAJIT_A) $(CJSON_A) $(LDLIBS)
ifneq ($(BLAS_A),)
  CFLAGS += -DZR_HAVE_OPENBLAS
  LDLIBS += $(BLAS_A)
endif
ifneq ($(PCRE2_A),)
  CFLAGS += -DZR_HAVE_PCRE2
  LDLIBS += $(PCRE2_A)
endif
ifneq ($(UTF8PROC_A),)
  CFLAGS += $(UTF8PROC_FLAGS)
  LDLIBS += $(UTF8PROC_A)
endif
ifneq ($(READLINE_A),)
  CFLAGS += -DZR_HAVE_READLINE
  LDLIBS += $(READLINE_A) $(NCURSES_A)
endif
ifneq ($(HAVE_MPI),)
  MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
  MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
  CFLAGS += -DZR_HAVE_MPI $(MPI_CFLAGS)
  LDLIBS += $(MPI_LIBS)
endif

# Sources: the runtime's rooms, the kernels' base, the CPU kernels (each compiled twice: f32 and
# f64), the CUDA kernels, the Lua bindings.
RUNTIME_SRC := $(wildcard runtime/*/*.c)
KBASE_SRC   := $(wildcard kernels/base/*.c)
KCPU_SRC    := $(wildcard kernels/cpu/*.c)
LUA_SRC     := $(filter-out lua/main.c,$(wildcard lua/*.c))
CUDA_SRC    := $(wildcard kernels/cuda/*.cu)

OBJ := $(RUNTIME_SRC:%.c=$(BUILD)/%.o) $(KBASE_SRC:%.c=$(BUILD)/%.o) \
       $(KCPU_SRC:%.c=$(BUILD)/%_f32.o) $(KCPU_SRC:%.c=$(BUILD)/%_f64.o)

ifneq ($(HAVE_NVCC),)
  CFLAGS += -DZR_HAVE_CUDA -I$(CUDA_HOME)/include
  NVFLAGS := -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
             -DZR_HAVE_CUDA --expt-relaxed-constexpr -Xcompiler -fPIC,-Wall
  OBJ += $(CUDA_SRC:%.cu=$(BUILD)/%.cu.o)
  LDLIBS += -L$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart_static -lrt -lstdc++
  ifneq ($(HAVE_NCCL),)
    CFLAGS += -DZR_HAVE_NCCL
    LDLIBS += -lnccl
  endif
endif

# Build-flag stamp: $(BUILD)/flags holds the compiler and the feature flags this build dir was
# compiled with (not the git revision). When they change (CUDA=0 after a CUDA build, MPI installed
# or removed, another CC or CFLAGS) the file is rewritten and, being newer than every object, makes
# all of them rebuild, instead of linking objects compiled for the other set of features.
FLAGS_STAMP := $(BUILD)/flags
BUILD_FLAGS := CC=$(CC) CFLAGS=$(filter-out -DZR_GIT_REV=%,$(CFLAGS)) NVCC=$(if $(HAVE_NVCC),$(NVCC) $(NVFLAGS)) LDLIBS=$(LDLIBS)
ifneq ($(filter-out clean deps features,$(or $(MAKECMDGOALS),all)),)
  FLAGS_OLD := $(shell cat $(FLAGS_STAMP) 2>/dev/null)
  ifneq ($(strip $(FLAGS_OLD)),$(strip $(BUILD_FLAGS)))
    $(shell mkdir -p $(BUILD) && printf '%s\n' '$(BUILD_FLAGS)' > $(FLAGS_STAMP))
    $(if $(FLAGS_OLD),$(info build flags changed since the last build in $(BUILD)/: rebuilding everything))
  endif
endif

# One line per file ("CC runtime/core/tensor.c"); V=1 prints the full commands instead.
V ?= 0
quiet = $(if $(filter 1,$(V)),,@echo "$(1) $(2)";)

.DEFAULT_GOAL := all
.PHONY: all deps test run bench clean features check-luajit test-cuda test-asan fuzz fuzz-build
check-luajit:
	@test -n "$(LUAJIT_A)" || { echo "LuaJIT static library (libluajit-5.1.a) not found: run 'make deps' or pass DEPS_PREFIX=dir"; exit 1; }

all: features $(BIN)

features:
	@echo "zrun $(VERSION): features"
	@echo "  luajit    $(LUAJIT_A)"
	@echo "  cjson     $(or $(CJSON_A),MISSING (lua-cjson-dev))"
	@echo "  openblas  $(or $(BLAS_A),missing: matmul uses the built-in kernel (libopenblas-dev))"
	@echo "  pcre2     $(or $(PCRE2_A),missing: tokenizers unavailable (libpcre2-dev))"
	@echo "  utf8proc  $(or $(UTF8PROC_A),missing: tokenizers with NFC/NFKC/Lowercase normalizers refused (libutf8proc-dev))"
	@echo "  readline  $(or $(READLINE_A),missing: plain REPL (libreadline-dev))"
	@echo "  mpi       $(or $(HAVE_MPI),missing: single process only (libopenmpi-dev))"
	@echo "  cuda      $(or $(HAVE_NVCC),off)"
	@echo "  nccl      $(or $(HAVE_NCCL),off)"

$(BUILD)/runtime/%.o: runtime/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(call quiet,CC,$<)$(CC) $(CFLAGS) $(RUNTIME_INC) -MMD -MP -c $< -o $@
$(BUILD)/lua/%.o: lua/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(call quiet,CC,$<)$(CC) $(CFLAGS) $(LUA_INC) -MMD -MP -c $< -o $@
$(BUILD)/kernels/base/%.o: kernels/base/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(call quiet,CC,$<)$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/kernels/cpu/%_f32.o: kernels/cpu/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(call quiet,CC,$< (f32))$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/kernels/cpu/%_f64.o: kernels/cpu/%.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(call quiet,CC,$< (f64))$(CC) $(CFLAGS) -DZR_REAL_F64 -MMD -MP -c $< -o $@
# The optimizer kernels take sqrt of values that are never negative; without errno GCC vectorises it.
$(BUILD)/kernels/cpu/optim_f32.o $(BUILD)/kernels/cpu/optim_f64.o $(BUILD)/kernels/cpu/offload_f32.o $(BUILD)/kernels/cpu/offload_f64.o: CFLAGS += -fno-math-errno
$(BUILD)/%.cu.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(call quiet,NVCC,$<)$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@
# The wgmma kernels (attention, GEMMs) need the Hopper-specific target (they run on compute capability 9.0 only).
$(patsubst %.cu,$(BUILD)/%.cu.o,$(wildcard kernels/cuda/*_sm90.cu kernels/cuda/*_sm90_*.cu)): NVFLAGS := $(subst compute_90,compute_90a,$(subst sm_90,sm_90a,$(NVFLAGS)))

$(BUILD)/libzrun.a: $(OBJ)
	@rm -f $@
	$(call quiet,AR,$@)ar rcs $@ $^

LUAOBJ := $(LUA_SRC:%.c=$(BUILD)/%.o) $(BUILD)/lua/main.o
$(BIN): $(BUILD)/libzrun.a $(LUAOBJ) | check-luajit
	$(call quiet,LD,$@)$(CC) $(CFLAGS) -rdynamic -o $@ $(LUAOBJ) $(BUILD)/libzrun.a $(LDLIBS)

# C unit tests: one binary per tests/c/test_*.c, linked against the runtime.
TEST_SRC := $(wildcard tests/c/test_*.c)
TEST_BIN := $(TEST_SRC:tests/c/%.c=$(BUILD)/tests/%)
$(BUILD)/tests/%: tests/c/%.c $(BUILD)/libzrun.a $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(call quiet,CC,$<)$(CC) $(CFLAGS) $(RUNTIME_INC) -Itests/c -MMD -MP -o $@ $< $(BUILD)/libzrun.a $(LDLIBS)

BENCH_SRC := $(wildcard tests/bench/bench_*.c)
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/bench/%)
$(BUILD)/bench/%: tests/bench/%.c $(BUILD)/libzrun.a $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(call quiet,CC,$<)$(CC) $(CFLAGS) $(RUNTIME_INC) -o $@ $< $(BUILD)/libzrun.a $(LDLIBS)

DEB_PKGS := luajit libluajit-5.1-dev lua-cjson-dev libopenmpi-dev openmpi-bin libpcre2-dev libutf8proc-dev libreadline-dev libopenblas-dev libopenblas-openmp-dev
test: DEB_PKGS += clang
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null \
	    || { echo "make deps: apt-get install$$missing failed"; exit 1; }; \
	else echo "make deps: all Debian packages present"; fi

test: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all $(TEST_BIN)
	@$(MAKE) --no-print-directory -j$(NPROC) FUZZ_KIND=$(FUZZ_FOUND) fuzz-build
	@BUILD=$(BUILD) ZRUN_BIN=$(abspath $(BIN)) FUZZ_BIN_DIR=$(BUILD)/fuzz/$(FUZZ_FOUND) \
	  FUZZ_SECONDS=$(FUZZ_TEST_SECONDS) sh tests/run.sh

run: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	./$(BIN) recipes/finetune_llama.lua

bench: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all $(BENCH_BIN) $(if $(HAVE_NVCC),$(BUILD)/bench/bench_fused)
	@BUILD=$(BUILD) ZRUN_BIN=$(abspath $(BIN)) sh tests/bench/run.sh

# AddressSanitizer + UBSan, any report fatal: the fuzz targets' objects and `make test-asan`'s build.
SAN_CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all

# Fuzzing (tests/fuzz/): the JSON, safetensors and tokenizer code in objects of their own, built
# with AddressSanitizer + UBSan. Where clang has libFuzzer, `make fuzz` fuzzes each target for
# FUZZ_SECONDS and `make test` for FUZZ_TEST_SECONDS; elsewhere the targets are linked to
# tests/fuzz/replay.c and replay the seed corpus and the regression inputs. FUZZ_KIND=replay
# builds that driver even where clang is. The probe runs only in the recipes that need it.
FUZZ_SECONDS      ?= 300
FUZZ_TEST_SECONDS ?= 6
FUZZ_KIND         ?= replay
FUZZ_FOUND = $(eval FUZZ_FOUND := $(shell command -v clang >/dev/null 2>&1 && \
               printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' \
               | clang -x c -fsanitize=fuzzer,address,undefined - -o /dev/null 2>/dev/null && echo libfuzzer || echo replay))$(FUZZ_FOUND)
FUZZ_DIR    := $(BUILD)/fuzz/$(FUZZ_KIND)
FUZZ_CC     := $(if $(filter libfuzzer,$(FUZZ_KIND)),clang,$(CC))
# no -fopenmp (one thread is what a fuzzer wants); gcc's omp.h serves clang when libomp-dev is absent
FUZZ_CFLAGS := $(SAN_CFLAGS) -std=gnu11 -fsanitize=float-cast-overflow $(PREFIX_INC) $(UTF8PROC_FLAGS) $(RUNTIME_INC) -idirafter $(shell $(CC) -print-file-name=include) \
               $(if $(filter libfuzzer,$(FUZZ_KIND)),-fsanitize=fuzzer-no-link)
FUZZ_LIB_SRC := $(wildcard runtime/core/*.c runtime/ops/*.c runtime/io/*.c runtime/tokenizer/*.c kernels/base/*.c)
FUZZ_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ_DIR)/%.o) $(KCPU_SRC:%.c=$(FUZZ_DIR)/%_f32.o) $(KCPU_SRC:%.c=$(FUZZ_DIR)/%_f64.o)
FUZZ_BIN := $(patsubst tests/fuzz/%.c,$(FUZZ_DIR)/%,$(wildcard tests/fuzz/fuzz_*.c))
$(FUZZ_DIR)/kernels/cpu/%_f32.o: kernels/cpu/%.c
	@mkdir -p $(dir $@)
	$(call quiet,CC,$< (fuzz f32))$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
$(FUZZ_DIR)/kernels/cpu/%_f64.o: kernels/cpu/%.c
	@mkdir -p $(dir $@)
	$(call quiet,CC,$< (fuzz f64))$(FUZZ_CC) $(FUZZ_CFLAGS) -DZR_REAL_F64 -MMD -MP -c $< -o $@
$(FUZZ_DIR)/%.o: %.c
	@mkdir -p $(dir $@)
	$(call quiet,CC,$< (fuzz))$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@
$(FUZZ_DIR)/libzrun_fuzz.a: $(FUZZ_OBJ)
	@rm -f $@
	$(call quiet,AR,$@)ar rcs $@ $^
$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(FUZZ_DIR)/libzrun_fuzz.a
	$(call quiet,CC,$<)$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $< $(if $(filter libfuzzer,$(FUZZ_KIND)),-fsanitize=fuzzer,tests/fuzz/replay.c) \
	  $(FUZZ_DIR)/libzrun_fuzz.a $(or $(PCRE2_A),-lpcre2-8) $(UTF8PROC_A) -lgomp -lmvec -lm -lpthread
fuzz-build: $(FUZZ_BIN)
fuzz: DEB_PKGS += clang
fuzz: deps
	@$(MAKE) --no-print-directory -j$(NPROC) FUZZ_KIND=$(FUZZ_FOUND) fuzz-build
	@sh tests/fuzz/run.sh $(BUILD)/fuzz/$(FUZZ_FOUND) $(FUZZ_SECONDS)

# CUDA tests (GPU machine): every op against its CPU twin, and the fused kernels against host
# references; both print "N passed, N failed".
FUSED_TEST := $(BUILD)/tests/test_fused_kernels
$(FUSED_TEST): tests/cuda/test_fused_kernels.cu tests/cuda/cu_check.h
# The fused-kernel benchmark (GPU machine): make build/bench/bench_fused && build/bench/bench_fused
$(BUILD)/bench/bench_fused: tests/bench/bench_fused.cu tests/cuda/cu_check.h
# Our Hopper GEMMs (kernels/cuda/gemm_sm90.cu, gemm_sm90_wide.cu; GPU machine): the test against host references and
# cuBLASLt ("N passed, N failed"), the benchmark against cuBLASLt on Llama-3.2-1B's and GPT-2's products.
GEMM_SM90_TEST := $(BUILD)/tests/test_gemm_sm90
$(GEMM_SM90_TEST): tests/cuda/test_gemm_sm90.cu tests/cuda/cu_check.h
$(BUILD)/bench/bench_gemm_sm90: tests/bench/bench_gemm_sm90.cu tests/cuda/cu_check.h
# each one .cu linked against libzrun and cuBLASLt
$(FUSED_TEST) $(BUILD)/bench/bench_fused $(GEMM_SM90_TEST) $(BUILD)/bench/bench_gemm_sm90: $(BUILD)/libzrun.a
	@mkdir -p $(dir $@)
	$(call quiet,NVCC,$(filter %.cu,$^))$(NVCC) $(NVFLAGS) $(RUNTIME_INC) -o $@ $(filter %.cu,$^) $(BUILD)/libzrun.a -lcublasLt -lcublas -lpthread
# Which cuBLASLt algorithm is fastest sustained (GPU machine; tests/bench/gemm_algos.sh runs it). No
# libzrun: cuBLASLt only. The tile/stages/cluster names come from this CUDA's cublasLt.h enums.
$(BUILD)/bench/bench_gemm_algos_names.h: $(CUDA_HOME)/include/cublasLt.h
	@mkdir -p $(dir $@)
	@{ echo 'struct IdName { int id; const char *name; };'; \
	  for e in MATMUL_TILE:tile MATMUL_STAGES:stages CLUSTER_SHAPE:cluster; do \
	    echo "static const IdName $${e#*:}_names[] = {"; \
	    sed -n "s/^ *CUBLASLT_$${e%:*}_\([0-9A-Za-z]*\) *= *\([0-9][0-9]*\).*/  {\2, \"\1\"},/p" $<; \
	    echo '};'; \
	  done; } > $@
$(BUILD)/bench/bench_gemm_algos: tests/bench/bench_gemm_algos.cu tests/bench/bench_gemm_algos.h \
                                 $(BUILD)/bench/bench_gemm_algos_names.h
	$(call quiet,NVCC,$<)$(NVCC) $(NVFLAGS) -I$(BUILD)/bench -o $@ $< -lcublasLt -lcublas -ldl
# The GPU timeline recorder (GPU machine; LD_PRELOAD it, then tests/bench/timeline_gaps.lua): CUPTI only.
$(BUILD)/bench/libgpu_timeline.so: tests/bench/gpu_timeline.c
	@mkdir -p $(dir $@)
	$(call quiet,CC,$<)$(CC) -O2 -shared -fPIC -I$(CUDA_HOME)/include -o $@ $< -L$(CUDA_HOME)/lib64 -lcupti
test-cuda: all $(FUSED_TEST) $(GEMM_SM90_TEST)
	@sh tests/run_cuda.sh $(FUSED_TEST) ./$(BIN) $(GEMM_SM90_TEST)

# The whole CPU suite under AddressSanitizer + UBSan: zrun and the C tests built again in
# $(BUILD)-asan (CUDA off, -O1), then tests/run.sh with them; any report ends its test as a failure.
# About 20 minutes on 2 cores: not part of `make test`. Leak checks are off (objects the Lua heap
# still holds at exit look leaked: LuaJIT's own mmap'd heap is not scanned). Session 35's run found
# an empty directory's NULL list given to qsort, and two tolerances that held only with fused
# multiply-adds.
ASAN_BUILD := $(BUILD)-asan
test-asan: deps
	@CFLAGS="$(SAN_CFLAGS)" $(MAKE) --no-print-directory -j$(NPROC) CUDA=0 BUILD=$(ASAN_BUILD) \
	  BIN=$(ASAN_BUILD)/zrun $(ASAN_BUILD)/zrun $(TEST_SRC:tests/c/%.c=$(ASAN_BUILD)/tests/%)
	@ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 ZRUN_HOME=$(CURDIR) BUILD=$(ASAN_BUILD) \
	  ZRUN_BIN=$(abspath $(ASAN_BUILD)/zrun) sh tests/run.sh

clean:
	rm -rf build build-asan zrun

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
