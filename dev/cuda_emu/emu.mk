# dev/cuda_emu/emu.mk: build CUDA sources for the emulated device (see dev/cuda_emu/README.md).
# The top-level Makefile includes it; it also works alone: make -f dev/cuda_emu/emu.mk emu-test
#
#   make build/emu/path/to/prog     rewrite path/to/prog.cu, compile it with g++, link the emulator
#   make emu-test                   build and run every emulator test (dev/cuda_emu/run_tests.sh)
#   make emu-nvcc-check             compile every emulator test with the real nvcc into build/nvcc/
#
# Variables for building another program the same way:
#   EMU_CXXFLAGS   flags for the rewritten source (force-includes cuda_emu.h)
#   EMU_OBJS       the emulator's objects (runtime, streams, kernels, cuBLAS(Lt), NCCL)
#   EMU_LDLIBS     what they link against (MPI when mpicxx exists)

EMU_DIR := dev/cuda_emu
EMU_BUILD := build/emu
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
EMU_CXX ?= g++

# NCCL across processes goes through MPI; without mpicxx the emulator supports one rank
EMU_MPICXX := $(shell command -v mpicxx 2>/dev/null)
ifneq ($(EMU_MPICXX),)
  # USE_MPI: the test programs use MPI themselves; CUDA_EMU_MPI: the emulator's NCCL uses it
  MPI_CFLAGS := -DUSE_MPI -DOMPI_SKIP_MPICXX $(shell mpicxx --showme:compile)
  EMU_MPI_CFLAGS := -DCUDA_EMU_MPI $(MPI_CFLAGS)
  EMU_MPI_LDLIBS := $(shell mpicxx --showme:link)
endif

EMU_CXXFLAGS := -std=c++17 -O1 -g -Wall -Wno-unused-function -Wno-unknown-pragmas -I. -I$(CUDA_HOME)/include -I$(EMU_DIR) \
                -include cuda_emu.h $(EMU_MPI_CFLAGS)
# -ffp-contract=off: the reference GEMM rounds each product before adding it (no fused multiply-add),
# whatever instructions the compiler may use, so its sums stay bitwise those of the plain loop
EMU_LIB_CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -ffp-contract=off -I$(CUDA_HOME)/include -I$(EMU_DIR) $(EMU_MPI_CFLAGS)
EMU_LDLIBS := -lm $(EMU_MPI_LDLIBS)

EMU_SRCS := $(addprefix $(EMU_DIR)/,emu_fiber.cpp emu_kernel.cpp emu_stream.cpp emu_runtime.cpp \
                                      emu_blas.cpp emu_nccl.cpp emu_math.cpp)
EMU_OBJS := $(patsubst $(EMU_DIR)/%.cpp,$(EMU_BUILD)/obj/%.o,$(EMU_SRCS))
EMU_HEADERS := $(wildcard $(EMU_DIR)/*.h)

EMU_TEST_SRCS := $(wildcard $(EMU_DIR)/tests/*.cu)
EMU_TESTS := $(patsubst %.cu,$(EMU_BUILD)/%,$(EMU_TEST_SRCS))
EMU_NVCC_TESTS := $(patsubst $(EMU_DIR)/tests/%.cu,build/nvcc/%,$(EMU_TEST_SRCS))

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

# the files each rewritten program was made from (written by rewrite.py)
-include $(shell find $(EMU_BUILD) -name '*.emu.cpp.d' 2>/dev/null)

.PHONY: emu-build-tests emu-test emu-nvcc-check
emu-build-tests: $(EMU_TESTS)

emu-test:
	bash $(EMU_DIR)/run_tests.sh

# the same tests with the real CUDA toolchain: they must stay ordinary CUDA
build/nvcc/%: $(EMU_DIR)/tests/%.cu $(EMU_DIR)/tests/check.h
	@mkdir -p $(@D)
	$(NVCC) -std=c++17 -O1 -arch=sm_90 -I. $(MPI_CFLAGS) $< -o $@ \
		-lcublas -lcublasLt -L$(CUDA_HOME)/lib -lnccl $(EMU_MPI_LDLIBS)

emu-nvcc-check: $(EMU_NVCC_TESTS)
	@echo "nvcc builds every emulator test: $(notdir $(EMU_NVCC_TESTS))"
