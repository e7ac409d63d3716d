# Makefile: each target is a recipe; `make help` lists them.
#
#   make run          build, prepare TinyShakespeare if missing, train the default model (d6)
#   make test         build and run every test; the last line reads "N passed, N failed"
#   make bench        d12 and default-model throughput against OpenBLAS's sgemm (scripts/bench.sh)
#   make bench-flags  each memory flag's step time and memory on d12 (scripts/bench_flags.sh)
#   make USE_BLAS=1   build train_gpt with cblas_sgemm (OpenBLAS) for the matmuls instead of llmc/matmul.h

CC ?= gcc
CFLAGS = -std=c11 -O3 -march=native -fopenmp -D_GNU_SOURCE -Wall -Wextra -Wno-unused-function
LDLIBS = -lm
PYTHON ?= python3
ifeq ($(USE_BLAS),1)
  CFLAGS += -DUSE_BLAS
  LDLIBS += -lopenblas
endif

HEADERS = $(wildcard llmc/*.h)
DATA = data/tinyshakespeare/tiny_shakespeare_train.bin

.PHONY: all run data test bench bench-flags clean help
all: train_gpt

# the CPU trainer
train_gpt: train_gpt.c $(HEADERS)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# the tests: test_gpt.c includes train_gpt.c with TESTING defined (no main)
test_gpt: test_gpt.c train_gpt.c $(HEADERS)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

build/test_matmul: dev/test_matmul.c llmc/matmul.h llmc/utils.h
	@mkdir -p build
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

build/bench_matmul: dev/bench_matmul.c llmc/matmul.h llmc/utils.h
	@mkdir -p build
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS) -lopenblas

# TinyShakespeare token shards and the tokenizer file (GPT-2 BPE, from ../shared/data when present)
$(DATA):
	$(PYTHON) dev/data/tinyshakespeare.py
data: $(DATA)

# the main job: about two minutes on two cores; add flags with ARGS="-e d12 ..."
run: train_gpt $(DATA)
	./train_gpt $(ARGS)

# every suite; scripts/run_tests.sh adds up their "N passed, N failed" lines
test: train_gpt test_gpt build/test_matmul $(EMU_TEST_DEPS)
	bash scripts/run_tests.sh

bench: train_gpt build/bench_matmul $(DATA)
	bash scripts/bench.sh

bench-flags: train_gpt $(DATA)
	bash scripts/bench_flags.sh

clean:
	rm -rf train_gpt test_gpt build

help:
	@sed -n '2,10p' Makefile

# the emulated CUDA device (dev/cuda_emu/README.md)
-include dev/cuda_emu/emu.mk
