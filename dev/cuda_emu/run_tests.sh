#!/usr/bin/env bash
# run_tests.sh: build and run every test of the emulated CUDA device, under the modes each one is
# for, and add up their "N passed, N failed" lines. The last line is the total; the exit status
# is non-zero if any check failed or any program stopped without its summary line.
#
#   bash dev/cuda_emu/run_tests.sh          (from anywhere; `make emu-test` runs it)
#
# The NCCL test also runs as 2 MPI processes when mpirun exists (skipped, with a note, if not).
set -u
cd "$(dirname "$0")/../.."
make -s -f dev/cuda_emu/emu.mk -j"$(nproc)" emu-build-tests || { echo "0 passed, 1 failed"; exit 1; }

BIN=build/emu/dev/cuda_emu/tests
SMALL_DEVICE=$((64 * 1024 * 1024))   # 64 MiB: out-of-memory tests stay cheap
passed=0
failed=0

# run one test program: run LABEL ENV... -- COMMAND...; its output is shown, its summary counted
run() {
    local label=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    echo "== $label"
    local out
    out=$(env "${envs[@]}" "$@" 2>&1)
    local status=$?
    echo "$out"
    local summary
    summary=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
    if [ -z "$summary" ]; then
        echo "FAIL $label: stopped (exit $status) without a summary line"
        failed=$((failed + 1))
        return
    fi
    passed=$((passed + $(echo "$summary" | cut -d' ' -f1)))
    failed=$((failed + $(echo "$summary" | cut -d' ' -f3)))
    if [ "$status" -ne 0 ] && [ "$(echo "$summary" | cut -d' ' -f3)" -eq 0 ]; then
        echo "FAIL $label: exit $status with no failed check"
        failed=$((failed + 1))
    fi
}

# a program that must stop with an error whose message contains PATTERN: expect_error LABEL PATTERN COMMAND...
expect_error() {
    local label=$1 pattern=$2; shift 2
    echo "== $label"
    local out
    out=$("$@" 2>&1)
    local status=$?
    if [ "$status" -ne 0 ] && echo "$out" | grep -q "$pattern"; then
        echo "ok   $label"
        passed=$((passed + 1))
    else
        echo "$out"
        echo "FAIL $label: exit $status, message without '$pattern'"
        failed=$((failed + 1))
    fi
}

run "device: execution model" -- $BIN/test_device
run "device: execution model, shuffled thread order" CUDA_EMU_THREAD_ORDER=shuffle -- $BIN/test_device
run "launches: plain, templates (arguments written out or deduced), overloads, defaults" -- $BIN/test_launch
expect_error "a deduced template launch with more than 48 KiB of dynamic shared memory says to write the arguments out" \
    "write them out at the launch (big_shared_kernel<...><<<...>>>)" $BIN/test_launch deduced-big-shared
run "gemm: cuBLAS and cuBLASLt against a naive loop" -- $BIN/test_gemm
for mode in inorder early late; do
    run "runtime, CUDA_EMU_STREAMS=$mode" CUDA_EMU_STREAMS=$mode CUDA_EMU_MEMORY_BYTES=$SMALL_DEVICE -- $BIN/test_runtime
done
run "runtime, CUDA_EMU_SMS=132 (an H100's count)" CUDA_EMU_SMS=132 -- $BIN/test_runtime
expect_error "a CUDA_EMU_SMS that is no SM count stops at the first CUDA call" \
    "CUDA_EMU_SMS='0': expected a number of SMs from 1 to" env CUDA_EMU_SMS=0 $BIN/test_runtime
run "layers vs llmc/cpu_layers.h" -- $BIN/test_layers
run "layers, reverse thread order, late streams" CUDA_EMU_THREAD_ORDER=reverse CUDA_EMU_STREAMS=late -- $BIN/test_layers
run "catches, default modes" -- $BIN/test_catches
run "catches, CUDA_EMU_THREAD_ORDER=reverse CUDA_EMU_STREAMS=late" \
    CUDA_EMU_THREAD_ORDER=reverse CUDA_EMU_STREAMS=late -- $BIN/test_catches
run "catches, CUDA_EMU_THREAD_ORDER=shuffle CUDA_EMU_STREAMS=late" \
    CUDA_EMU_THREAD_ORDER=shuffle CUDA_EMU_STREAMS=late -- $BIN/test_catches
expect_error "a barrier one thread skipped stops the program, naming the kernel" \
    "kernel 'deadlock_kernel' (launched at" $BIN/test_catches deadlock
expect_error "two halves of a warp at different shuffles stop the program, naming both" \
    "__shfl_down_sync at dev/cuda_emu/tests/test_catches.cu:[0-9]* (lane [0-9]*): lane 0 waits at a different collective, __shfl_xor_sync at dev/cuda_emu/tests/test_catches.cu" \
    $BIN/test_catches shuffle-mismatch
expect_error "a shuffle whose mask names a lane that returned stops the program" \
    "lane 0 of the mask has already exited" $BIN/test_catches shuffle-exited
run "nccl, 1 rank" -- $BIN/test_nccl
if command -v mpirun > /dev/null; then
    MPIRUN=(mpirun --oversubscribe -np 2)
    [ "$(id -u)" -eq 0 ] && MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np 2)
    run "nccl, 2 ranks (mpirun -np 2)" -- "${MPIRUN[@]}" $BIN/test_nccl
    run "nccl, 2 ranks, late streams" -- "${MPIRUN[@]}" -x CUDA_EMU_STREAMS=late $BIN/test_nccl
else
    echo "skipped: nccl with 2 ranks (mpirun not found; install openmpi-bin and libopenmpi-dev)"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
