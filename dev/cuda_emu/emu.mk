# dev/cuda_emu/emu.mk: build CUDA sources for the emulated device (see dev/cuda_emu/README.md).
# The top-level Makefile includes it; it also works alone: make -f dev/cuda_emu/emu.mk emu-test
#
#   make build/emu/path/to/prog     rewrite path/to/prog.cu, compile it with g++, link the emulator
#   make emu-test                   build and run every emulator test (dev/cuda_emu/run_tests.sh)
#   make emu-nvcc-check             compile every CUDA test (GPU_TEST_SRCS) with the real nvcc into
#                                   build/nvcc/$(GPU_ARCH)/; GPU_ARCH=sm_90 unless given
#   make gpu-check                  on a GPU machine: build them for the local GPU and run them
#                                   (dev/cuda_emu/gpu_check.sh); without a GPU it builds, then stops
#
# Variables for building another program the same way:
#   EMU_CXXFLAGS   flags for the rewritten source (force-includes cuda_emu.h)
#   EMU_OBJS       the emulator's objects (runtime, streams, kernels, wmma, cuBLAS(Lt), NCCL)
#   EMU_LDLIBS     what they link against (MPI when mpicxx exists)
#   MPI_CFLAGS, EMU_MPI_LDLIBS      MPI's flags for g++ (dev/cuda_emu/find_mpi.sh), empty without MPI
#   NVCC_MPI_CFLAGS, NVCC_MPI_LIBS  the same flags as nvcc takes them (-Xcompiler, -Xlinker)
#   MPI=0          build without MPI even where mpicxx exists; MPICXX=...: another MPI's C++ wrapper

EMU_DIR := dev/cuda_emu
EMU_BUILD := build/emu
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
EMU_CXX ?= g++

# NCCL across processes goes through MPI; without mpicxx (or with MPI=0) the emulator supports one
# rank. find_mpi.sh asks mpicxx (OpenMPI's --showme, MPICH's -show) and rewrites its flags for nvcc,
# which stops on -pthread and -Wl,... where g++ takes them
MPICXX ?= mpicxx
FIND_MPI = MPICXX=$(MPICXX) bash $(EMU_DIR)/find_mpi.sh
EMU_MPI_WHERE := $(if $(filter 0,$(MPI)),,$(shell $(FIND_MPI) --where 2>/dev/null))
ifneq ($(EMU_MPI_WHERE),)
  # USE_MPI: the programs use MPI themselves; CUDA_EMU_MPI: the emulator's NCCL uses it; the
  # SKIP_MPICXX: no MPI C++ bindings (OpenMPI's, MPICH's)
  MPI_DEFS := -DUSE_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX
  MPI_CFLAGS := $(MPI_DEFS) $(shell $(FIND_MPI) --cflags)
  EMU_MPI_CFLAGS := -DCUDA_EMU_MPI $(MPI_CFLAGS)
  EMU_MPI_LDLIBS := $(shell $(FIND_MPI) --libs)
  NVCC_MPI_CFLAGS := $(MPI_DEFS) $(shell $(FIND_MPI) --nvcc-cflags)
  NVCC_MPI_LIBS := $(shell $(FIND_MPI) --nvcc-libs)
endif

# include/ first: its mma.h (nvcuda::wmma for the emulator) hides the toolkit's, which g++ cannot use
EMU_CXXFLAGS := -std=c++17 -O1 -g -Wall -Wno-unused-function -Wno-unknown-pragmas -I. -I$(EMU_DIR)/include \
                -I$(CUDA_HOME)/include -I$(EMU_DIR) \
                -include cuda_emu.h $(EMU_MPI_CFLAGS)
# -ffp-contract=off: the reference GEMM rounds each product before adding it (no fused multiply-add),
# whatever instructions the compiler may use, so its sums stay bitwise those of the plain loop
EMU_LIB_CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -ffp-contract=off -I$(CUDA_HOME)/include -I$(EMU_DIR) $(EMU_MPI_CFLAGS)
EMU_LDLIBS := -lm $(EMU_MPI_LDLIBS)

EMU_SRCS := $(addprefix $(EMU_DIR)/,emu_fiber.cpp emu_kernel.cpp emu_stream.cpp emu_runtime.cpp \
                                      emu_blas.cpp emu_lt_rules.cpp emu_nccl.cpp emu_mpi.cpp emu_math.cpp emu_wmma.cpp \
                                      emu_ptx.cpp emu_timeline.cpp)
EMU_OBJS := $(patsubst $(EMU_DIR)/%.cpp,$(EMU_BUILD)/obj/%.o,$(EMU_SRCS))
EMU_HEADERS := $(wildcard $(EMU_DIR)/*.h $(EMU_DIR)/include/*.h)
# the CPU headers the library includes (emu_blas.cpp: the CPU's GELU for the GELU epilogues, and what it
# includes): a change there must rebuild the library, or its GELU differs from the tests' (seen: stale bits)
EMU_HEADERS += $(EMU_DIR)/../../cpu/gelu.h $(EMU_DIR)/../../cpu/vecmath.h $(EMU_DIR)/../../llmc/model_config.h

EMU_TEST_SRCS := $(wildcard $(EMU_DIR)/tests/*.cu)
EMU_TESTS := $(patsubst %.cu,$(EMU_BUILD)/%,$(EMU_TEST_SRCS))

# the CUDA tests that nvcc builds (emu-nvcc-check) and gpu-check runs on a GPU, each with no
# arguments from the repository root (gpu_check.sh adds the multi-rank runs). One line per folder:
GPU_TEST_SRCS := $(EMU_TEST_SRCS)
GPU_TEST_SRCS += $(wildcard dev/cuda/test_*.cu)   # the CUDA backend's kernels against cpu/layers.h
GPU_ARCH ?= sm_90
GPU_TESTS := $(patsubst %.cu,build/nvcc/$(GPU_ARCH)/%,$(GPU_TEST_SRCS))

# kept between builds (make would delete them as intermediates of the pattern rule below)
.PRECIOUS: $(EMU_BUILD)/obj/%.o
$(EMU_BUILD)/obj/%.o: $(EMU_DIR)/%.cpp $(EMU_HEADERS)
	@mkdir -p $(@D)
	$(EMU_CXX) $(EMU_LIB_CXXFLAGS) -c $< -o $@

# any CUDA program: rewrite (line numbers kept, local includes followed), then compile as C++
$(EMU_BUILD)/%: %.cu $(EMU_DIR)/rewrite.py $(EMU_OBJS) $(EMU_HEADERS)
	@mkdir -p $(@D)
	python3 $(EMU_DIR)/rewrite.py $< $@.emu.cpp -I . -MT $@
	$(EMU_CXX) $(EMU_CXXFLAGS) -x c++ $@.emu.cpp -x none $(EMU_OBJS) $(EMU_LDLIBS) -o $@

# the same program with the headers under $(EMU_PLANTED)/include found ahead of the repository's:
# run_tests.sh copies a header there with a bug planted and expects the program's checks to fail.
# Always rebuilt (FORCE): what is planted changes between runs.
EMU_PLANTED := $(EMU_BUILD)/planted
$(EMU_PLANTED)/%: %.cu $(EMU_DIR)/rewrite.py $(EMU_OBJS) $(EMU_HEADERS) FORCE
	@mkdir -p $(@D)
	python3 $(EMU_DIR)/rewrite.py $< $@.emu.cpp -I $(EMU_PLANTED)/include -I .
	$(EMU_CXX) $(EMU_CXXFLAGS) -x c++ $@.emu.cpp -x none $(EMU_OBJS) $(EMU_LDLIBS) -o $@
FORCE:

# the files each rewritten program was made from (written by rewrite.py)
-include $(shell find $(EMU_BUILD) -name '*.emu.cpp.d' -not -path '$(EMU_PLANTED)/*' 2>/dev/null)

.PHONY: emu-build-tests emu-test emu-nvcc-check gpu-check gpu-test-list
emu-build-tests: $(EMU_TESTS)

emu-test:
	bash $(EMU_DIR)/run_tests.sh

# The same tests with the real CUDA toolchain: they must stay ordinary CUDA. NCCL is wherever
# find_nccl.sh finds it (toolkit, system package, nvidia-nccl Python package), asked once per make
# run and only when a test is built (the $(eval ...) keeps the answer).
NVCC_NCCL_CFLAGS = $(eval NVCC_NCCL_CFLAGS := $(shell CUDA_HOME=$(CUDA_HOME) bash $(EMU_DIR)/find_nccl.sh --cflags 2>/dev/null))$(NVCC_NCCL_CFLAGS)
NVCC_NCCL_LIBS = $(eval NVCC_NCCL_LIBS := $(shell CUDA_HOME=$(CUDA_HOME) bash $(EMU_DIR)/find_nccl.sh --libs 2>/dev/null))$(NVCC_NCCL_LIBS)
build/nvcc/$(GPU_ARCH)/%: %.cu
	@mkdir -p $(@D)
	@test -n "$(NVCC_NCCL_LIBS)" || { CUDA_HOME=$(CUDA_HOME) bash $(EMU_DIR)/find_nccl.sh --where; exit 1; }
	$(NVCC) -std=c++17 -O1 -arch=$(GPU_ARCH) -MMD -MP -I. $(NVCC_NCCL_CFLAGS) $(NVCC_MPI_CFLAGS) $< -o $@ \
		-lcublas -lcublasLt $(NVCC_NCCL_LIBS) $(NVCC_MPI_LIBS)

# the headers each test was built from (nvcc -MMD)
-include $(wildcard $(addsuffix .d,$(GPU_TESTS)))

emu-nvcc-check: $(GPU_TESTS)
	@echo "nvcc builds every CUDA test for $(GPU_ARCH) ($(shell CUDA_HOME=$(CUDA_HOME) bash $(EMU_DIR)/find_nccl.sh --where)): $(notdir $(GPU_TESTS))"

# the binaries gpu-check runs, one per line
gpu-test-list:
	@printf '%s\n' $(GPU_TESTS)

gpu-check:
	bash $(EMU_DIR)/gpu_check.sh
