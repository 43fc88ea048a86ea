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
LDLIBS  += -ljansson -lpcre2-8 -lutf8proc -lcrypto -lcurl -lmicrohttpd -lpthread -lm

ISA_FLAGS_avx2   = -mavx2 -mfma -mf16c
ISA_FLAGS_avx2_ops = $(ISA_FLAGS_avx2)
ISA_FLAGS_avx512 = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mfma -mf16c
ISA_FLAGS_avx512bf16 = $(ISA_FLAGS_avx512) -mavx512bf16

LIB_SRC   := $(sort $(shell find src -name '*.c'))
TOOL_SRC  := $(wildcard tools/*.c)
TEST_SRC  := $(wildcard tests/*.c)
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ  := $(TOOL_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ  := $(TEST_SRC:%.c=$(BUILD)/%.o)

.PHONY: all test asan bench fuzz clean help
all: $(BUILD)/qwen35 $(BUILD)/test_runner

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA_FLAGS_$(basename $(notdir $<))) -c $< -o $@

$(BUILD)/libqwen35.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/qwen35: $(TOOL_OBJ) $(BUILD)/libqwen35.a
	$(CC) $(CFLAGS) -o $@ $(TOOL_OBJ) $(BUILD)/libqwen35.a $(LDFLAGS) $(LDLIBS)

$(BUILD)/test_runner: $(TEST_OBJ) $(BUILD)/libqwen35.a
	$(CC) $(CFLAGS) -o $@ $(TEST_OBJ) $(BUILD)/libqwen35.a $(LDFLAGS) $(LDLIBS)

# Kernel microbenchmark (GEMV GB/s, batch cost, prefill GFLOP/s, bfp layouts).
$(BUILD)/bench_kernels: bench/bench_kernels.c $(BUILD)/libqwen35.a
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libqwen35.a $(LDFLAGS) $(LDLIBS)

# Every test: the C unit tests, then the tests that drive the built programs.
test: all
	@scripts/run-tests.sh $(BUILD)

# The unit tests again under AddressSanitizer and UndefinedBehaviorSanitizer.
asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" \
	    LDFLAGS="-fsanitize=address,undefined" build-asan/test_runner build-asan/qwen35
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 build-asan/test_runner

bench: all
	@scripts/bench.sh $(BUILD)

# libFuzzer targets (clang): one per parser of untrusted bytes.
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)
fuzz:
	$(MAKE) CC=clang BUILD=build-fuzz OPT="-O1 -fsanitize=fuzzer-no-link,address,undefined" build-fuzz/libqwen35.a
	@for f in $(FUZZ_SRC); do n=$$(basename $$f .c); \
	  echo "clang $$f -> build-fuzz/$$n"; \
	  clang -std=c11 -D_GNU_SOURCE -g -O1 -Iinclude -Isrc -fsanitize=fuzzer,address,undefined $$f build-fuzz/libqwen35.a $(LDLIBS) -o build-fuzz/$$n || exit 1; done

clean:
	rm -rf build build-asan build-fuzz

help:
	@echo "make            build build/qwen35 and build/test_runner"
	@echo "make test       run every test (prints 'N passed, N failed')"
	@echo "make asan       unit tests under ASan + UBSan"
	@echo "make bench      speed benchmark: tok/s, GB/s, % of measured bandwidth; writes bench.json"
	@echo "make fuzz       build the libFuzzer targets into build-fuzz/"
	@echo "make clean      remove build outputs"

-include $(LIB_OBJ:.o=.d) $(TOOL_OBJ:.o=.d) $(TEST_OBJ:.o=.d)
