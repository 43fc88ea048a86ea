# qwen35 build. `make help` lists the targets.
#
# Every .c under src/ (one folder per layer, docs/architecture.md) goes into
# libqwen35.a; each kernel file under src/backend/cpu/kernels/ is compiled with
# the flags of its instruction set only, and the one to use is picked at run
# time, so no -march=native is needed.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
CFLAGS  ?=
CFLAGS  += -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Wshadow -Wno-unused-parameter \
           -fno-math-errno -MMD -MP -Iinclude -Isrc -pthread
LDLIBS  += -ljansson -lpcre2-8 -lutf8proc -lcrypto -lcurl -lmicrohttpd -ljpeg -lpng16 -lwebp -lgif -lpthread -lm

ISA_FLAGS_avx2   = -mavx2 -mfma -mf16c
ISA_FLAGS_avx2_ops = $(ISA_FLAGS_avx2)
ISA_FLAGS_avx512 = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c
ISA_FLAGS_avx512bf16 = $(ISA_FLAGS_avx512) -mavx512bf16

# The CUDA backend's host files need the CUDA headers: only with CUDA=1.
# Its layout arithmetic (src/backend/cuda/layout.c) is plain C, always built.
CUDA_HOST_SRC := src/backend/cuda/cuda.c src/backend/cuda/profile.c src/backend/cuda/state.c
LIB_SRC   := $(filter-out $(CUDA_HOST_SRC),$(sort $(shell find src -name '*.c')))
TOOL_SRC  := $(wildcard tools/*.c)
TEST_SRC  := $(wildcard tests/*.c)
# make CUDA=1 BUILD=build-cuda: adds the cuda backend (docs/cuda.md).
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
ifeq ($(CUDA),1)
LIB_SRC   += $(CUDA_HOST_SRC)
CU_SRC    := $(sort $(shell find src -name '*.cu'))
CFLAGS    += -DQ35_CUDA -I$(CUDA_HOME)/include
LDLIBS    += -L$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
NVCCFLAGS ?= -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 \
             -Xcompiler -Wall -Iinclude -Isrc -DQ35_CUDA
endif
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o)
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all test asan bench bench-peer bench-vision-peer quality-peer fuzz clean help gpu-bundle gpu-check stress
all: $(BUILD)/qwen35 $(BUILD)/test_runner

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA_FLAGS_$(basename $(notdir $<))) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

$(BUILD)/libqwen35.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/qwen35: $(TOOL_OBJ) $(BUILD)/libqwen35.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libqwen35.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/test_runner: $(TEST_OBJ) $(BUILD)/libqwen35.a
	$(CC) $(CFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libqwen35.a $(LDFLAGS) $(LDLIBS)

# JSON-schema token masking at the Qwen3.5 vocabulary (ms per masked row).
$(BUILD)/bench_schema: bench/bench_schema.c $(BUILD)/libqwen35.a
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libqwen35.a $(LDFLAGS) $(LDLIBS)

# What choosing a token costs at the Qwen3.5 vocabulary (ms per draw, distribution, logprobs).
$(BUILD)/bench_sampler: bench/bench_sampler.c $(BUILD)/libqwen35.a
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libqwen35.a $(LDFLAGS) $(LDLIBS)

# Kernel microbenchmark (GEMV GB/s, batch cost, prefill GFLOP/s, bfp layouts).
$(BUILD)/bench_kernels: bench/bench_kernels.c $(BUILD)/libqwen35.a
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libqwen35.a $(LDFLAGS) $(LDLIBS)

# Every test: the C unit tests, then the tests that drive the built programs.
test: all
	@scripts/run-tests.sh $(BUILD)

# A 60-second soak of the server with faults (scripts/stress.sh; longer: scripts/stress.sh SECONDS).
stress: $(BUILD)/qwen35
	scripts/stress.sh 60

# The unit tests again under AddressSanitizer and UndefinedBehaviorSanitizer.
asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    LDFLAGS="-fsanitize=address,undefined" build-asan/test_runner build-asan/qwen35
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build-asan/test_runner

bench: all
	@scripts/bench.sh $(BUILD)

# Against llama.cpp (built from the pinned llama-cpp-python sdist under bench-data/peer/, once):
# speed at the 9B shapes (bench-data/peer.json) and quality on the demo model (bench-data/quality.json).
bench-peer: $(BUILD)/qwen35
	@scripts/bench-peer.sh $(BUILD)

# The vision tower against transformers' at the 9B tower shapes, interleaved (bench-data/vision-peer.json).
bench-vision-peer: $(BUILD)/qwen35
	@scripts/bench-vision-peer.sh $(BUILD)

quality-peer: $(BUILD)/qwen35
	@scripts/quality-peer.sh $(BUILD)

# libFuzzer targets (clang): one per parser of untrusted bytes.
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)
fuzz:
	$(MAKE) CC=clang BUILD=build-fuzz OPT="-O1 -fsanitize=fuzzer-no-link,address,undefined" build-fuzz/libqwen35.a
	@for f in $(FUZZ_SRC); do n=$$(basename $$f .c); \
	  echo "clang $$f -> build-fuzz/$$n"; \
	  clang -std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=fuzzer,address,undefined $$f build-fuzz/libqwen35.a $(LDLIBS) -o build-fuzz/$$n || exit 1; done

# What scripts/gpu-check.sh needs on a GPU machine without this machine's
# -dev libraries: the CUDA build's programs and the shared libraries they
# load (build-cuda/lib), to carry along (docs/cuda.md).
gpu-bundle:
	$(MAKE) CUDA=1 BUILD=build-cuda build-cuda/qwen35 build-cuda/test_runner build-cuda/bench_cuda build-cuda/bench_kernels
	scripts/gpu-bundle.sh build-cuda

gpu-check:
	scripts/gpu-check.sh

# GPU speed figures (the cuda backend on a weight cache); CUDA=1 builds only.
$(BUILD)/bench_cuda: bench/bench_cuda.c $(BUILD)/libqwen35.a
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libqwen35.a $(LDFLAGS) $(LDLIBS)

clean:
	rm -rf build build-asan build-fuzz build-cuda

help:
	@echo "make            build build/qwen35 and build/test_runner"
	@echo "make test       run every test (prints 'N passed, N failed')"
	@echo "make asan       unit tests under ASan + UBSan"
	@echo "make stress     a 60-second soak of the server with faults (scripts/stress.sh)"
	@echo "make bench      speed benchmark: tok/s, GB/s, % of measured bandwidth; writes bench.json"
	@echo "make bench-peer qwen35 against llama.cpp Q4_0/Q4_K_M at the 9B shapes, interleaved; writes bench-data/peer.json"
	@echo "make bench-vision-peer the vision tower against transformers at the 9B tower shapes; bench-data/vision-peer.json"
	@echo "make quality-peer llama.cpp's formats and qwen35's policies on the demo model (PPL, KL); bench-data/quality.json"
	@echo "make fuzz       build the libFuzzer targets into build-fuzz/"
	@echo "make CUDA=1 BUILD=build-cuda   the same with the cuda backend (nvcc, sm_90)"
	@echo "make gpu-bundle build-cuda's programs and their shared libraries, to carry to a GPU machine"
	@echo "make gpu-check  scripts/gpu-check.sh: the GPU tests and speed figures (on a GPU machine)"
	@echo "make clean      remove build outputs"

-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_OBJ:.o=.d)
