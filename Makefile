# Makefile: each target is a recipe; `make help` lists them.
#
#   make run          build, prepare TinyShakespeare if missing, train the default model (d6)
#   make test         build and run every test; the last line reads "N passed, N failed"
#   make bench        d12 and default-model throughput against OpenBLAS's sgemm (scripts/bench.sh)
#   make bench-flags  each memory flag's step time and memory on d12 (scripts/bench_flags.sh)
#   make bench-timeline  predicted on an H100's timeline (the emulated device, modelled only): each technique's exposed share, d12 and d48, --offload 1 and --zero 1/2/3 on 8 ranks
#   make USE_BLAS=1   build train_gpt with cblas_sgemm (OpenBLAS) for the matmuls instead of cpu/matmul.h
#   make MPI=0        build train_gpt without MPI (default: with mpicc when installed; mpirun -np N ./train_gpt)
#   make build/prepare_tokens  text, folders of .txt/.jsonl, or stdin into token shards (dev/data/prepare_tokens.c)
#   make bench-tokenize  prepare_tokens' MB/s (1 thread and all) against tiktoken's, one thread, on the same text; and a 2 MB word
#   make bench-fuzz   the fuzzer at length: 100,000 cases per target, ASan+UBSan (TARGETS="shard manifest,flags" for some)
#   make check-headers  compile every header alone as C11 and as C++17 (CI runs it)
#   make train_gpt_cu  the CUDA trainer, nvcc for the local GPU (GPU_ARCH=sm_80 ... to choose; default: nvidia-smi's, else sm_90)
#   make build/emu/train_gpt  the same CUDA trainer for the emulated device (dev/cuda_emu): runs on the CPU
#   make cuda-build-check  nvcc builds the CUDA trainer for sm_75, sm_80 and sm_90 with no warnings (CI runs it)
#   make build-check  the CUDA trainer builds with an mpicxx printing flags nvcc refuses, without NCCL, without MPI (CI runs it)
#   make NCCL=0 train_gpt_cu  the CUDA trainer for one GPU, without NCCL (default: with it where find_nccl.sh finds it)

CC ?= gcc
CFLAGS = -std=c11 -O3 -march=native -fno-math-errno -fno-trapping-math -fopenmp -D_GNU_SOURCE -Wall -Wextra -Wno-unused-function
LDLIBS = -lm
PYTHON ?= python3
ifeq ($(USE_BLAS),1)
  CFLAGS += -DUSE_BLAS
  LDLIBS += -lopenblas
endif

# MPI=auto (default): train_gpt is built with mpicc and -DUSE_MPI when mpicc exists, so
# `mpirun -np 2 ./train_gpt --zero 1 ...` trains data-parallel; MPI=0 builds it without.
# build/train_gpt_nompi is always the single-process build (its tests: tests/test_zero.py).
MPI ?= auto
MPICC ?= mpicc
# the CUDA trainers' MPI wrapper: dev/cuda_emu/find_mpi.sh asks it for its flags
MPICXX ?= mpicxx
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

HEADERS = $(wildcard llmc/*.h cpu/*.h)
# the manifest is written last (llmc/manifest.h): a folder made before it existed, or cut short, is made again
DATA = data/tinyshakespeare/tiny_shakespeare_manifest.txt

# the MPI setting that train_gpt was built with, rewritten whenever it changes (mpicc installed
# since the last build, or MPI=0 given), so that a change rebuilds train_gpt
MPI_STAMP = build/mpi_setting
MPI_SETTING = MPI=$(MPI) CC=$(TRAIN_CC)
$(shell mkdir -p build && if [ "$$(cat $(MPI_STAMP) 2>/dev/null)" != "$(MPI_SETTING)" ]; then echo "$(MPI_SETTING)" > $(MPI_STAMP); fi)

.PHONY: all run data test bench bench-flags bench-timeline bench-tokenize bench-fuzz check-headers cuda-build-check build-check clean help
all: train_gpt

# the CPU trainer (with MPI when available: see MPI above)
train_gpt: train_gpt.c $(HEADERS) $(MPI_STAMP)
	$(TRAIN_CC) $(CFLAGS) $(TRAIN_DEFS) $< -o $@ $(LDLIBS)

# the same trainer without MPI: one process, whatever mpicc is installed
build/train_gpt_nompi: train_gpt.c $(HEADERS)
	@mkdir -p build
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# the CUDA trainer (train_gpt.cu over cuda/*.cuh and the shared llmc/), for the GPU of this
# machine: GPU_ARCH from nvidia-smi when there is one (e.g. sm_90 for an H100), else sm_90
CUDA_HEADERS = $(wildcard cuda/*.cuh)
GPU_ARCH ?= $(or $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '. ' | sed 's/^/sm_/'),sm_90)
NVCC_FLAGS = -O3 -std=c++17 -I. -Xcompiler -fopenmp,-Wall,-Wno-unused-function,-Wno-unknown-pragmas

# NCCL=auto (default): the CUDA trainer links NCCL where dev/cuda_emu/find_nccl.sh finds it (NCCL_HOME,
# the toolkit, a system package, the nvidia-nccl Python package), and is a one-GPU trainer built with
# -DNO_NCCL where it finds none (cuda/nccl.cuh: several ranks then stop, naming the rebuild);
# NCCL=0 builds it without NCCL anyway, NCCL=1 stops the build where there is none.
# FIND_NCCL: the finder (tests/test_build.py hands it one that finds nothing). Asked once per make
# run, when a CUDA trainer is built.
NCCL ?= auto
FIND_NCCL ?= CUDA_HOME=$(CUDA_HOME) bash dev/cuda_emu/find_nccl.sh
TRAINER_NCCL = $(eval TRAINER_NCCL := $(if $(filter 0,$(NCCL)),,$(shell $(FIND_NCCL) --libs 2>/dev/null)))$(TRAINER_NCCL)
TRAINER_NCCL_CFLAGS = $(if $(TRAINER_NCCL),$(shell $(FIND_NCCL) --cflags 2>/dev/null),-DNO_NCCL)
TRAINER_NCCL_SAYS = $(if $(TRAINER_NCCL),$(shell $(FIND_NCCL) --where 2>/dev/null),$(if $(filter 0,$(NCCL)),NCCL=0,no NCCL found \
    (NCCL_HOME$(,) $(CUDA_HOME)$(,) /usr/include$(,) the nvidia-nccl Python package)): a one-GPU trainer$(,) \
    several ranks stop with a message; for several GPUs install NCCL (pip install nvidia-nccl-cu13$(,) libnccl-dev$(,) \
    or NCCL_HOME=DIR) and make -B train_gpt_cu)
TRAINER_MPI_SAYS = $(if $(EMU_MPI_WHERE),$(EMU_MPI_WHERE),no MPI ($(if $(filter 0,$(MPI)),MPI=0,$(strip \
    $(shell $(FIND_MPI) --where 2>&1 >/dev/null | head -n1)))): one process; mpirun or srun with \
    several stops at start-up)
, := ,
# says what the CUDA trainer $$@ is built with (NCCL=1 without NCCL: stops)
define say_cuda_trainer
	@if [ "$(NCCL)" = 1 ] && [ -z "$(TRAINER_NCCL)" ]; then $(FIND_NCCL) --where; exit 1; fi
	@echo "$@: $(TRAINER_NCCL_SAYS)"
	@echo "$@: $(TRAINER_MPI_SAYS)"
endef
# the command that builds the CUDA trainer $$@ from $$< for the architecture $(1), with nvcc flags $(2)
# (MPI's: the mpicxx flags rewritten for nvcc by dev/cuda_emu/find_mpi.sh)
nvcc_trainer = $(NVCC) $(NVCC_FLAGS) -arch=$(1) $(TRAINER_NCCL_CFLAGS) $(NVCC_MPI_CFLAGS) $(2) $< -o $@ \
               -lcublasLt -lcublas -lgomp $(TRAINER_NCCL) $(NVCC_MPI_LIBS)

# the NCCL and MPI settings the CUDA trainers were built with, rewritten whenever they change, so
# that a change rebuilds them (as MPI_STAMP does for train_gpt)
CUDA_STAMP = build/cuda_setting
CUDA_SETTING = NCCL=$(NCCL) MPI=$(MPI) MPICXX=$(MPICXX) FIND_NCCL=$(FIND_NCCL)
$(shell mkdir -p build && if [ "$$(cat $(CUDA_STAMP) 2>/dev/null)" != "$(CUDA_SETTING)" ]; then echo "$(CUDA_SETTING)" > $(CUDA_STAMP); fi)

train_gpt_cu: train_gpt.cu $(HEADERS) $(CUDA_HEADERS) $(CUDA_STAMP)
	$(say_cuda_trainer)
	$(call nvcc_trainer,$(GPU_ARCH))

# the same trainer in a folder of its own, with no warnings (tests/test_build.py builds it there with
# other MPI and NCCL settings)
build/variants/%/train_gpt_cu: train_gpt.cu $(HEADERS) $(CUDA_HEADERS)
	@mkdir -p $(@D)
	$(say_cuda_trainer)
	$(call nvcc_trainer,$(GPU_ARCH),--Werror all-warnings)

# nvcc builds the CUDA trainer for Turing (sm_75: a T4; there bf16's flash attention is refused at run
# time, cuda/ptx.cuh), Ampere (sm_80) and Hopper (sm_90) without a warning (CI runs it); -warn-spills
# makes a kernel that spills registers to local memory one of them
CUDA_CHECK_ARCHS = sm_75 sm_80 sm_90
cuda-build-check: $(foreach a,$(CUDA_CHECK_ARCHS),build/nvcc/$(a)/train_gpt_cu)
	@echo "nvcc builds train_gpt.cu for $(CUDA_CHECK_ARCHS) with no warnings and no register spills"
build/nvcc/%/train_gpt_cu: train_gpt.cu $(HEADERS) $(CUDA_HEADERS) $(CUDA_STAMP)
	@mkdir -p $(@D)
	$(call nvcc_trainer,$*,--Werror all-warnings -Xptxas -warn-spills)

# the builds users' boxes need, each built for real (nvcc for GPU_ARCH and the emulated device) and
# run where it can: an mpicxx printing flags nvcc does not take, no NCCL, no MPI (tests/test_build.py;
# CI runs it; a few minutes)
build-check: test_gpt
	$(PYTHON) tests/test_build.py ./test_gpt

# the tests: test_gpt.c includes train_gpt.c with TESTING defined (no main)
test_gpt: test_gpt.c train_gpt.c tests/check.h tests/fuzz_corpus.h $(HEADERS)
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# sanitizer builds (AddressSanitizer + UndefinedBehaviorSanitizer, any report aborts): the fuzzer
# of the readers and the flag parser (./build/fuzz ./test_gpt [CASES]), the C unit tests, and
# build/prepare_tokens (tests/test_prepare.py feeds it mutated text and JSON Lines)
SANITIZE = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
SAN_CFLAGS = -std=c11 -I. -march=native -fopenmp -D_GNU_SOURCE -Wall -Wextra -Wno-unused-function $(SANITIZE)
build/fuzz: tests/fuzz.c tests/check.h tests/fuzz_corpus.h train_gpt.c dev/data/text_input.h $(HEADERS)
	@mkdir -p build
	$(CC) $(SAN_CFLAGS) $< -o $@ $(LDLIBS)
build/prepare_tokens_asan: dev/data/prepare_tokens.c dev/data/text_input.h $(HEADERS)
	@mkdir -p build
	$(CC) $(SAN_CFLAGS) $< -o $@ $(LDLIBS)
build/test_gpt_asan: test_gpt.c train_gpt.c tests/check.h tests/fuzz_corpus.h $(HEADERS)
	@mkdir -p build
	$(CC) $(SAN_CFLAGS) $< -o $@ $(LDLIBS)

# the test-only fault injection that tests/test_checkpoint_ranks.py preloads into the trainer's ranks
# (LD_PRELOAD): SIGKILL at a chosen point of a file's write (tests/fault_inject.c)
build/fault_inject.so: tests/fault_inject.c
	@mkdir -p build
	$(CC) -std=c11 -O2 -Wall -Wextra -shared -fPIC $< -o $@ -ldl

# one rank of a rendezvous (llmc/rendezvous.h) without the trainer, for tests/test_rendezvous.py's hostile
# peers (milliseconds a case); built with the sanitizers, so a memory error in the parsing aborts
build/rendezvous_peer: tests/rendezvous_peer.c llmc/rendezvous.h llmc/rendezvous_proto.h llmc/hmac_sha256.h llmc/utils.h
	@mkdir -p build
	$(CC) $(SAN_CFLAGS) $< -o $@ $(LDLIBS)

build/test_matmul: tests/test_matmul.c cpu/matmul.h llmc/utils.h
	@mkdir -p build
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# the grid of tensor- and data-parallel groups (llmc/distributed.h) and --tp's block over MPI: tests/test_zero.py runs it on 4 ranks
build/test_dist_grid: tests/test_dist_grid.c tests/check.h tests/tp_block.h train_gpt.c $(HEADERS) $(MPI_STAMP)
	@mkdir -p build
	$(TRAIN_CC) $(CFLAGS) $(TRAIN_DEFS) $< -o $@ $(LDLIBS)

# optimizer state in 8 bits and bf16 (llmc/quant_state.h, cpu/optimizers_lowp.h) against the test's own references
build/test_quant_state: tests/test_quant_state.c tests/check.h $(HEADERS)
	@mkdir -p build
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# pipeline parallelism's schedules (llmc/pipeline.h) and their simulation with blocking messages (llmc/pipeline_sim.h):
# every N in 1..8 stages, m in 1..16 micro-batches, both schedules; --print 1f1b 4 8 prints a timeline (scripts/plot_pipeline.py)
build/test_pipeline: tests/test_pipeline.c tests/check.h llmc/pipeline.h llmc/pipeline_sim.h llmc/utils.h
	@mkdir -p build
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# the per-element layers one at a time against the triad (dev/bench_layers.c), with the trainer's flags:
# -std=c11 contracts no multiply-add into an FMA, so its numbers are the step's kernels'
build/bench_layers: dev/bench_layers.c $(HEADERS)
	@mkdir -p build
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

# one AdamW step of d6's size in fp32, bf16 and 8-bit state, and the 8-bit one by binary search (before
# cpu/quant_state_fast.h), checked byte for byte, then timed against the triad
build/bench_quant_state: dev/bench_quant_state.c $(HEADERS)
	@mkdir -p build
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS)

build/bench_matmul: dev/bench_matmul.c $(HEADERS)
	@mkdir -p build
	$(CC) $(CFLAGS) $< -o $@ $(LDLIBS) -lopenblas

# text into token shards with GPT-2's BPE on every core (llmc/bpe.h; dev/data/prepare_tokens.c says how)
build/prepare_tokens: dev/data/prepare_tokens.c dev/data/text_input.h $(HEADERS)
	@mkdir -p build
	$(CC) $(CFLAGS) -I. $< -o $@ $(LDLIBS)

# TinyShakespeare token shards and the tokenizer file (GPT-2 BPE, from ../shared/data when present),
# made by build/prepare_tokens (built first; order-only: a newer tool does not remake the data)
$(DATA): | build/prepare_tokens
	$(PYTHON) dev/data/tinyshakespeare.py
data: $(DATA)

# the main job: about a minute on two cores; add flags with ARGS="-e d12 ..."
run: train_gpt $(DATA)
	./train_gpt $(ARGS)

# the emulated CUDA trainer without MPI (its own emulator objects: those of build/emu use MPI), which
# tests/test_launch.py starts as srun and torchrun do: a make of its own, always asked (its pattern
# rule there knows what the program depends on)
ifneq ($(EMU_BUILD),build/emu_nompi)
.PHONY: build/emu_nompi/train_gpt
build/emu_nompi/train_gpt:
	$(MAKE) MPI=0 EMU_BUILD=build/emu_nompi $@
endif

# every suite; tests/run_tests.py adds up their "N passed, N failed" lines (", N skipped" when any was)
test: train_gpt test_gpt build/test_matmul build/test_quant_state build/test_pipeline build/test_dist_grid build/fault_inject.so build/rendezvous_peer build/train_gpt_nompi build/fuzz build/test_gpt_asan build/emu/train_gpt build/emu_nompi/train_gpt build/prepare_tokens build/prepare_tokens_asan
	$(PYTHON) tests/run_tests.py

bench: train_gpt build/bench_matmul $(DATA)
	bash scripts/bench.sh

bench-flags: train_gpt $(DATA)
	bash scripts/bench_flags.sh

# the share of each technique's copies and collectives the compute stream does not hide, on the
# emulated device's timeline of an H100 (scripts/bench_timeline.py; doc/timeline.md): predicted, not
# measured; ARGS="--only d12" for one model
bench-timeline: build/emu/train_gpt $(DATA)
	$(PYTHON) scripts/bench_timeline.py $(ARGS)

# prepare_tokens' MB/s on 1 thread and all, beside tiktoken's on one thread, same text (100 MB of
# TinyShakespeare; ARGS="--mb 20" or "--input FILE"), then 2 MB of letters without white space, one
# word BPE merges whole (ARGS="--long-mb 20"): dev/data/bench_tokenize.py
bench-tokenize: build/prepare_tokens
	$(PYTHON) dev/data/bench_tokenize.py $(ARGS)

# the fuzzer of the readers at length (tests/fuzz.c; make test runs 4,000 cases per target): CASES per
# target (default 100,000), every target or those of TARGETS, the names it prints, comma-separated
# (make bench-fuzz TARGETS="prepare_tokens JSON Lines,prepare_tokens text"); prints each target's
# cases and time, and the total
CASES ?= 100000
bench-fuzz: build/fuzz test_gpt
	FUZZ_TARGETS="$(TARGETS)" ./build/fuzz ./test_gpt $(CASES)

# every header alone, as C11 and as C++17 (the CUDA program includes the shared ones)
SHARED_HEADERS = $(wildcard llmc/*.h)
CPU_HEADERS = $(wildcard cpu/*.h)
HEADER_CHECK = -fsyntax-only -Wall -Wextra -Werror -Wno-unused-function -fopenmp -D_GNU_SOURCE -I.
check-headers:
	@for h in $(SHARED_HEADERS) $(CPU_HEADERS); do \
	    echo '#include "'$$h'"' | $(CC) -x c -std=c11 $(HEADER_CHECK) - || exit 1; \
	    echo '#include "'$$h'"' | $(CXX) -x c++ -std=c++17 $(HEADER_CHECK) - || exit 1; \
	done
	@if [ "$(MPI)" = 1 ]; then \
	    echo '#include "llmc/distributed.h"' | $(MPICC) -x c -std=c11 -DUSE_MPI $(HEADER_CHECK) - || exit 1; \
	    echo '#include "llmc/distributed.h"' | $(CXX) -x c++ -std=c++17 $(MPI_CFLAGS) $(HEADER_CHECK) - || exit 1; \
	fi
	@echo "every header compiles alone as C11 and C++17 (distributed.h also with MPI: MPI=$(MPI)): $(SHARED_HEADERS) $(CPU_HEADERS)"

clean:
	rm -rf train_gpt train_gpt_cu test_gpt build

help:
	@sed -n 's/^#   make/make/p' Makefile

# the emulated CUDA device (dev/cuda_emu/README.md)
-include dev/cuda_emu/emu.mk

# the emulated trainer follows NCCL=0 too (the emulator's NCCL stands in for the real one otherwise)
$(EMU_BUILD)/train_gpt: $(CUDA_STAMP)
$(EMU_BUILD)/train_gpt: EMU_CXXFLAGS += $(if $(filter 0,$(NCCL)),-DNO_NCCL)
