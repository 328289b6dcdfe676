# Fuzzing (included by the Makefile). Two builds of each tests/fuzz/fuzz_NAME.c harness:
#  - $(BUILD)/fuzz/fuzz_NAME: any compiler, with tests/fuzz/driver.c as main; `make test` runs the
#    committed corpus and every regression input through it (tests/test_fuzz_regressions.sh), so
#    the sanitizer build (make test-asan) runs them too.
#  - build-fuzz/fuzz_NAME: clang's libFuzzer with ASan + UBSan, for `make fuzz-ci` (bounded, in
#    `make check`) and `make fuzz FUZZ_TIME=3600` (by hand).
FUZZ_NAMES  = $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_DRV_BIN = $(patsubst %,$(BUILD)/fuzz/fuzz_%,$(FUZZ_NAMES))
FUZZ_DEFS   = -DREPO_ROOT='"$(CURDIR)"'
FUZZ_HDRS   = $(wildcard tests/fuzz/*.h)

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/driver.c $(FUZZ_HDRS) $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(FUZZ_DEFS) -o $@ $(filter %.c %.o,$^) $(LDLIBS) $(TOKLIBS) $(JSONLIBS) $(CUDA_LIBS)

# The libFuzzer build: the library sources again, instrumented, CPU only.
FUZZ_CC    = clang
FUZZ_SAN   = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS = -std=c11 -D_GNU_SOURCE -g -O1 -fopenmp -Wall -Wextra -Wno-pass-failed $(FUZZ_SAN) $(FUZZ_DEFS)
FUZZ_SRC   = $(MODEL_SRC) $(ATTN_SRC) kernels/no_cuda.c $(TOK_SRC) $(filter-out weights/export.c,$(WEIGHTS_SRC))
FUZZ_OBJ   = $(patsubst %.cc,build-fuzz/obj/%.o,$(patsubst %.c,build-fuzz/obj/%.o,$(FUZZ_SRC)))
FUZZ_BIN   = $(patsubst %,build-fuzz/fuzz_%,$(FUZZ_NAMES))

build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<

build-fuzz/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	$(FUZZ_CC)++ -std=c++17 -g -O1 $(FUZZ_SAN) -fsanitize=fuzzer-no-link -MMD -MP -c -o $@ $<

build-fuzz/obj/tests/fuzz/fuzz_%.o: $(FUZZ_HDRS)
# Linked by clang++: the SentencePiece shim is C++ and UBSan's C++ runtime must come with it.
build-fuzz/fuzz_%: build-fuzz/obj/tests/fuzz/fuzz_%.o $(FUZZ_OBJ)
	$(FUZZ_CC)++ $(FUZZ_SAN) -fsanitize=fuzzer -fopenmp -o $@ $^ -lm $(TOKLIBS) $(JSONLIBS) $(BLASLIBS)

FUZZ_TIME ?= 30
.PHONY: fuzz-build fuzz-ci fuzz
fuzz-build: $(FUZZ_BIN)
# CI: each harness for FUZZ_CI_TIME seconds from the committed corpus (a few minutes in all).
FUZZ_CI_TIME ?= 25
fuzz-ci: fuzz-build
	bash tests/fuzz/run_fuzz.sh $(FUZZ_CI_TIME) $(FUZZ_NAMES)
# By hand: make fuzz FUZZ_TIME=3600 [FUZZ_NAMES=gguf]; new corpus entries stay in build-fuzz/corpus/.
fuzz: fuzz-build
	FUZZ_KEEP=1 bash tests/fuzz/run_fuzz.sh $(FUZZ_TIME) $(FUZZ_NAMES)

-include $(shell find build-fuzz -name '*.d' 2>/dev/null)
.SECONDARY: $(FUZZ_OBJ) $(patsubst %,build-fuzz/obj/tests/fuzz/fuzz_%.o,$(FUZZ_NAMES))
