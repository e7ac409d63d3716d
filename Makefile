# Makefile: each target is a recipe; `make help` lists them.
#
#   make run          build, prepare TinyShakespeare if missing, train the default model (d6)
#   make test         build and run every test; the last line reads "N passed, N failed"
#   make bench        d12 and default-model throughput against OpenBLAS's sgemm (scripts/bench.sh)
#   make bench-flags  each memory flag's step time and memory on d12 (scripts/bench_flags.sh)
#   make USE_BLAS=1   build train_gpt with cblas_sgemm (OpenBLAS) for the matmuls instead of llmc/matmul.h
#   make MPI=0        build train_gpt without MPI (default: with mpicc when installed; mpirun -np N ./train_gpt)

CC ?= gcc
CFLAGS = -std=c11 -O3 -march=native -fopenmp -D_GNU_SOURCE -Wall -Wextra -Wno-unused-function
LDLIBS = -lm
PYTHON ?= python3
ifeq ($(USE_BLAS),1)
  CFLAGS += -DUSE_BLAS
  LDLIBS += -lopenblas
endif

# MPI=auto (default): train_gpt is built with mpicc and -DUSE_MPI when mpicc exists, so
# `mpirun -np 2 ./train_gpt --zero 1 ...` trains data-parallel; MPI=0 builds it without.
# build/train_gpt_nompi is always the single-process build (its tests: scripts/test_zero.sh).
MPI ?= auto
MPICC ?= mpicc
ifeq ($(MPI),auto)
  MPI := $(if $(shell command -v $(MPICC) 2>/dev/null),1,0)
endif
ifeq ($(MPI),1)
  TRAIN_CC = $(MPICC)
  TRAIN_DEFS = -DUSE_MPI
else
  TRAIN_CC = $(CC)
  TRAIN_DEFS =
endif

HEADERS = $(wildcard llmc/*.h)
DATA = data/tinyshakespeare/tiny_shakespeare_train.bin

.PHONY: all run data test bench bench-flags clean help
all: train_gpt

# the CPU trainer (with MPI when available: see MPI above)
train_gpt: train_gpt.c $(HEADERS)
	$(TRAIN_CC) $(CFLAGS) $(TRAIN_DEFS) $< -o $@ $(LDLIBS)

# the same trainer without MPI: one process, whatever mpicc is installed
build/train_gpt_nompi: train_gpt.c $(HEADERS)
	@mkdir -p build
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
test: train_gpt test_gpt build/test_matmul build/train_gpt_nompi $(EMU_TEST_DEPS)
	$(PYTHON) tests/run_tests.py

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
