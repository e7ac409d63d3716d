#!/usr/bin/env bash
# gpu_check.sh: on a machine with an NVIDIA GPU, build every CUDA test with the real nvcc for that
# GPU and run it there, so the emulator's answers are checked against the hardware's. `make
# gpu-check` runs it. The last line is "N passed, N failed".
#
#   bash dev/cuda_emu/gpu_check.sh              (from anywhere)
#   GPU_ARCH=sm_80 bash dev/cuda_emu/gpu_check.sh   another architecture than the local GPU's
#
# What it runs: every test of GPU_TEST_SRCS in dev/cuda_emu/emu.mk, once, with no arguments, from the
# repository root; with mpirun, test_nccl on 2 ranks: on one device (NCCL must refuse it), and on
# one device each when there are 2 GPUs or else as more ranks than devices (cudaSetDevice refuses).
# NCCL is found by find_nccl.sh (toolkit, system package or the nvidia-nccl Python package).
#
# Exit status: 0 every check passed; 1 a build or a check failed; 2 no GPU here: everything was
# built (so the CUDA sources compile and link) but nothing ran.
set -u
cd "$(dirname "$0")/../.."
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-300}   # a test that hangs on the GPU fails instead
NO_GPU_STATUS=2

# the GPUs nvidia-smi lists (0 when it is missing or finds none)
gpu_count=0
if command -v nvidia-smi > /dev/null; then
    gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
fi

# sm_XY of the first GPU, unless GPU_ARCH says; sm_90 (H100) without a GPU
if [ -z "${GPU_ARCH:-}" ]; then
    GPU_ARCH=sm_90
    if [ "$gpu_count" -gt 0 ]; then
        capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
        [ -n "$capability" ] && GPU_ARCH=sm_$capability
    fi
fi

echo "== gpu-check: building every CUDA test with nvcc for $GPU_ARCH"
if ! make -s -f dev/cuda_emu/emu.mk -j"$(nproc)" GPU_ARCH="$GPU_ARCH" emu-nvcc-check; then
    echo "gpu-check: the nvcc build failed (see above)"
    echo "0 passed, 1 failed"
    exit 1
fi
mapfile -t tests < <(make -s -f dev/cuda_emu/emu.mk GPU_ARCH="$GPU_ARCH" gpu-test-list)

if [ "$gpu_count" -eq 0 ]; then
    echo "gpu-check: no GPU here (nvidia-smi is missing or lists none): built ${#tests[@]} tests for $GPU_ARCH, ran none."
    echo "  Run \`make gpu-check\` on a machine with an NVIDIA GPU to check the emulator against it."
    exit "$NO_GPU_STATUS"
fi

source dev/cuda_emu/run_lib.sh
echo "== gpu-check: $gpu_count GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
for test in "${tests[@]}"; do
    run "$(basename "$test") on the GPU" -- "$test"
done

nccl_test=$(printf '%s\n' "${tests[@]}" | grep '/test_nccl$')
if [ -z "$nccl_test" ]; then
    echo "skipped: 2-rank NCCL runs (test_nccl is not among the tests)"
elif ! command -v mpirun > /dev/null; then
    echo "skipped: 2-rank NCCL runs (mpirun not found; install openmpi-bin and libopenmpi-dev)"
else
    run "test_nccl, 2 ranks on device 0: ncclInvalidUsage" -- "${MPIRUN_NP2[@]}" "$nccl_test" same-device
    if [ "$gpu_count" -ge 2 ]; then
        run "test_nccl, 2 ranks, one GPU each" -- "${MPIRUN_NP2[@]}" "$nccl_test"
    else
        run "test_nccl, 2 ranks on 1 GPU: the second rank's cudaSetDevice(1) is refused" \
            -- "${MPIRUN_NP2[@]}" "$nccl_test" more-ranks-than-devices
    fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
