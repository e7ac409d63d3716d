#!/usr/bin/env bash
# run_tests.sh: build and run every test of the emulated CUDA device, under the modes each one is
# for, and add up their "N passed, N failed" lines. The last line is the total; the exit status
# is non-zero if any check failed or any program stopped without its summary line.
#
#   bash dev/cuda_emu/run_tests.sh          (from anywhere; `make emu-test` runs it)
#
# The NCCL test, and test_factored (ZeRO-1 parts), also run as 2 (and 3) MPI processes when mpirun
# exists (skipped, with a note, if not).
set -u
cd "$(dirname "$0")/../.."
make -s -f dev/cuda_emu/emu.mk -j"$(nproc)" emu-build-tests || { echo "0 passed, 1 failed"; exit 1; }

BIN=build/emu/dev/cuda_emu/tests
SMALL_DEVICE=$((64 * 1024 * 1024))   # 64 MiB: out-of-memory tests stay cheap
P2P_HANG_S=5   # a hang that a program must show lasts at least this
source dev/cuda_emu/run_lib.sh   # run, expect_error, MPIRUN_NP2 and the passed/failed counts

run "device: execution model" -- $BIN/test_device
run "device: execution model, shuffled thread order" CUDA_EMU_THREAD_ORDER=shuffle -- $BIN/test_device
run "launches: plain, templates (arguments written out or deduced), overloads, defaults" -- $BIN/test_launch
expect_error "a deduced template launch with more than 48 KiB of dynamic shared memory says to write the arguments out" \
    "write them out at the launch (big_shared_kernel<...><<<...>>>)" $BIN/test_launch deduced-big-shared
run "gemm: cuBLAS and cuBLASLt against a naive loop" -- $BIN/test_gemm
run "wmma: bf16 and half tiles, fp32 accumulators, against a triple loop" -- $BIN/test_wmma
run "wmma, shuffled thread order (another lane completes each collective)" CUDA_EMU_THREAD_ORDER=shuffle -- $BIN/test_wmma
WMMA_TEST=dev/cuda_emu/tests/test_wmma.cu
expect_error "a wmma::mma_sync that half of the warp skips stops the program, naming both calls" \
    "wmma::mma_sync at $WMMA_TEST:[0-9]* (lane 0): lane [0-9]* waits at a different collective, wmma::store_matrix_sync at $WMMA_TEST" \
    $BIN/test_wmma divergent-mma
expect_error "the two halves of a warp at mma_sync on two lines stop the program" \
    "waits at a different collective, wmma::mma_sync at $WMMA_TEST:[0-9]* (every lane of the warp must reach the same wmma call" \
    $BIN/test_wmma split-mma
expect_error "lanes that pass different tiles to one load_matrix_sync stop the program" \
    "every lane of the warp must pass the same tile" $BIN/test_wmma lanes-disagree
expect_error "a bf16 tile with ldm 12 stops the program" "ldm = 12 is not a multiple of 8" $BIN/test_wmma bad-ldm
expect_error "a tile pointer off a 32-byte boundary stops the program" "is not 32-byte aligned" $BIN/test_wmma misaligned
expect_error "wmma in a warp of 16 threads stops the program" "wmma needs all 32 lanes of a warp" $BIN/test_wmma partial-warp
run "ptx: mma.sync, ldmatrix, cp.async against the PTX ISA's lane tables" -- $BIN/test_ptx
run "ptx, shuffled thread order" CUDA_EMU_THREAD_ORDER=shuffle -- $BIN/test_ptx
PTX_TEST=dev/cuda_emu/tests/test_ptx.cu
expect_error "ptx: checks against a wrong lane table fail (the tables can tell a wrong mapping)" \
    "FAIL mma.sync m16n8k16 with A's rows g and g+8 swapped" $BIN/test_ptx wrong-table
expect_error "ptx: ldmatrix.trans checked against the plain table fails" \
    "FAIL ldmatrix .x4.trans against the other transpose's table" $BIN/test_ptx wrong-table
expect_error "ptx: shared memory read after cp.async without wait_group is NaN" \
    "FAIL cp.async read without wait_group (must fail): 256 of 256" $BIN/test_ptx missing-wait
expect_error "ptx: ldmatrix from global memory stops the program" \
    "row address .* is not in shared memory" $BIN/test_ptx ldmatrix-global
expect_error "ptx: an ldmatrix row off a 16-byte boundary stops the program" \
    "is not 16-byte aligned: ldmatrix rows" $BIN/test_ptx ldmatrix-misaligned
expect_error "ptx: the halves of a warp at mma.sync on two lines stop the program" \
    "waits at a different collective, mma.sync.m16n8k16 (ptx_mma_bf16_16816) at $PTX_TEST" $BIN/test_ptx mma-split
expect_error "ptx: mma.sync in a warp of 16 threads stops the program" \
    "needs all 32 lanes of a warp" $BIN/test_ptx mma-partial-warp
expect_error "ptx: a cp.async into global memory stops the program" \
    "destination .* is not in shared memory" $BIN/test_ptx cp-async-to-global
expect_error "ptx: a cp.async from shared memory stops the program" \
    "source .* is in shared memory" $BIN/test_ptx cp-async-from-shared
run "cuBLASLt: 288 descriptors answered as cuBLASLt 13.0 on an H100 did" -- $BIN/test_cublaslt_table
# the timeline (emu_timeline.cpp): what an overlap saves, measured with CUDA events as on a GPU
TIMELINE=(CUDA_EMU_TIMELINE=h100 CUDA_EMU_EXECUTE=0)
run "timeline: a copy waited at once costs copy + kernel, an overlapped one the longer (h100, modelled only)" \
    "${TIMELINE[@]}" -- $BIN/test_timeline
run "timeline, late streams (the model follows the program's order, not the emulation's)" \
    "${TIMELINE[@]}" CUDA_EMU_STREAMS=late -- $BIN/test_timeline
SLOW_LINK=build/emu/timeline_slow_link.txt
printf '# a link half as fast\npinned_gb_s 27.5\n' > $SLOW_LINK
echo "== timeline: a constants file's pinned_gb_s is the copies' rate"
out=$(env CUDA_EMU_TIMELINE=$SLOW_LINK CUDA_EMU_EXECUTE=0 $BIN/test_timeline 2>&1)
if echo "$out" | grep -q "copy 2.4[0-9]* ms (27.[0-9] GB/s)"; then
    echo "ok   timeline: a constants file's pinned_gb_s is the copies' rate"; passed=$((passed + 1))
else
    echo "$out"; echo "FAIL timeline: a constants file's pinned_gb_s is the copies' rate (2.4 ms at 27.5 GB/s)"; failed=$((failed + 1))
fi
printf 'pinned_gbs 27.5\n' > $SLOW_LINK
expect_error "timeline: a constants file with an unknown name stops, naming the line" \
    "timeline_slow_link.txt:1: expected 'name value'" env CUDA_EMU_TIMELINE=$SLOW_LINK $BIN/test_timeline
expect_error "timeline: CUDA_EMU_EXECUTE=0 without a timeline stops, naming both" \
    "CUDA_EMU_EXECUTE=0 without CUDA_EMU_TIMELINE" env CUDA_EMU_EXECUTE=0 $BIN/test_timeline
expect_error "timeline: without CUDA_EMU_TIMELINE the test says its events need one" \
    "the events need CUDA_EMU_TIMELINE" $BIN/test_timeline
for mode in inorder early late late-nccl; do
    run "runtime, CUDA_EMU_STREAMS=$mode" CUDA_EMU_STREAMS=$mode CUDA_EMU_MEMORY_BYTES=$SMALL_DEVICE -- $BIN/test_runtime
done
run "runtime, a node of 1 GPU (CUDA_EMU_DEVICES=1)" CUDA_EMU_DEVICES=1 CUDA_EMU_MEMORY_BYTES=$SMALL_DEVICE -- $BIN/test_runtime
expect_error "CUDA_EMU_DEVICES=0 stops the program, naming the setting" \
    "CUDA_EMU_DEVICES='0': expected how many GPUs" env CUDA_EMU_DEVICES=0 $BIN/test_runtime
run "runtime, CUDA_EMU_SMS=132 (an H100's count)" CUDA_EMU_SMS=132 -- $BIN/test_runtime
expect_error "a CUDA_EMU_SMS that is no SM count stops at the first CUDA call" \
    "CUDA_EMU_SMS='0': expected a number of SMs from 1 to" env CUDA_EMU_SMS=0 $BIN/test_runtime
run "layers vs cpu/layers.h" -- $BIN/test_layers
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
run "nccl, 1 rank, late-nccl streams" CUDA_EMU_STREAMS=late-nccl -- $BIN/test_nccl
expect_error "late-nccl: a stream that clears a collective's input or reads its output without waiting gets wrong sums" \
    "FAIL missing wait: the all-reduce's output, copied without waiting for it" env CUDA_EMU_STREAMS=late-nccl $BIN/test_nccl missing-waits
run "nccl: a non-blocking communicator (ncclCommInitRankConfig, blocking = 0), 1 rank" -- $BIN/test_nccl_config
# ranks that disagree on nranks must stay in progress, not hang in the call: a hang is stopped and counted
run "nccl: 2 processes that disagree on nranks stay ncclInProgress until ncclCommAbort" -- timeout 60 $BIN/test_nccl_config mismatch
run "nccl: the trainer's nccl_comm_create with nranks 2 and 3 stops after LLMC_DIST_TIMEOUT" \
    -- timeout 60 $BIN/test_nccl_config trainer-mismatch
expect_error "a CUDA_EMU_NCCL_STALL that is not RANK:N stops at the first collective, naming the setting" \
    "CUDA_EMU_NCCL_STALL='x': expected RANK:N" env CUDA_EMU_NCCL_STALL=x $BIN/test_nccl
if command -v mpirun > /dev/null; then
    MPIRUN=("${MPIRUN_NP2[@]}")
    run "nccl, 2 ranks (mpirun -np 2), one device each" -- "${MPIRUN[@]}" $BIN/test_nccl
    run "nccl, 2 ranks, late streams" -- "${MPIRUN[@]}" -x CUDA_EMU_STREAMS=late $BIN/test_nccl
    # a queued collective that one rank synchronizes while the other waits in MPI: a hang would be the
    # emulator's (emu_mpi.cpp), so it is stopped and counted as failed
    run "nccl, 2 ranks, late-nccl streams (collectives queued; one rank in MPI_Barrier while the other syncs)" \
        -- timeout 120 "${MPIRUN[@]}" -x CUDA_EMU_STREAMS=late-nccl $BIN/test_nccl
    run "nccl, 3 ranks, late-nccl streams (a ring of ncclSend and ncclRecv over 3)" \
        -- timeout 120 "${MPIRUN_NP3[@]}" -x CUDA_EMU_STREAMS=late-nccl $BIN/test_nccl
    # point to point: two ranks that each send to the other first, outside a group, wait for each other as on a GPU
    label="nccl: an exchange of 2 ranks outside a group hangs, as on a GPU (stopped after $P2P_HANG_S s)"
    echo "== $label"
    timeout $P2P_HANG_S "${MPIRUN[@]}" $BIN/test_nccl p2p-no-group > /dev/null 2>&1
    status=$?
    if [ $status -eq 124 ]; then echo "ok   $label"; passed=$((passed + 1)); else echo "FAIL $label: exit $status"; failed=$((failed + 1)); fi
    run "nccl, 2 ranks on one device: ncclInvalidUsage" -- "${MPIRUN[@]}" $BIN/test_nccl same-device
    run "nccl, 2 ranks on a node of 1 GPU: the second rank's cudaSetDevice(1) is refused" \
        -- "${MPIRUN[@]}" -x CUDA_EMU_DEVICES=1 $BIN/test_nccl more-ranks-than-devices
else
    echo "skipped: nccl with 2 ranks (mpirun not found; install openmpi-bin and libopenmpi-dev)"
fi

# the CUDA backend's kernels (dev/cuda/test_*.cu) against cpu/layers.h: in the default modes, and
# with the thread order and stream timing that expose a missing barrier or a missing wait
KERNEL_TESTS=$(ls dev/cuda/test_*.cu 2>/dev/null | sed 's|^\(.*\)\.cu$|build/emu/\1|')
if [ -n "$KERNEL_TESTS" ]; then
    if make -s -f dev/cuda_emu/emu.mk -j"$(nproc)" $KERNEL_TESTS; then
        for t in $KERNEL_TESTS; do
            run "$(basename "$t"): kernels vs cpu/layers.h" -- "$t"
            run "$(basename "$t"), reverse thread order, late streams" \
                CUDA_EMU_THREAD_ORDER=reverse CUDA_EMU_STREAMS=late -- "$t"
        done
        KBIN=build/emu/dev/cuda
        expect_error "cuda/common.cuh: a failing CUDA call names the call and the error" \
            "cudaMalloc(.*) failed: cudaErrorMemoryAllocation" $KBIN/test_encoder out-of-memory
        expect_error "cuda/common.cuh: ... and gives a hint" "hint: the GPU is out of memory" $KBIN/test_encoder out-of-memory
        expect_error "cuda/matmul.cuh: a refused cuBLASLt call names the call and the status" \
            "failed: CUBLAS_STATUS_INVALID_VALUE" $KBIN/test_matmul bad-leading-dimension
        expect_error "cuda/attention.cuh: C not divisible by NH stops with a message" \
            "C=30 is not divisible by NH=4" $KBIN/test_attention indivisible-heads
        expect_error "cuda/flash_attention.cuh: a head size that is no multiple of 16 stops with a message" \
            "flash attention needs a head size that is a multiple of 16" $KBIN/test_flash_attention head-size
        run "test_flash_attention, shuffled thread order" CUDA_EMU_THREAD_ORDER=shuffle -- $KBIN/test_flash_attention
        # planted: the kernels' cp.async.wait_group 1 removed; the copies still in flight read as NaN
        PLANT=build/emu/planted/include
        rm -rf "$PLANT" && mkdir -p "$PLANT/cuda" && cp cuda/*.cuh "$PLANT/cuda/" && ln -s "$PWD/llmc" "$PLANT/llmc"  # ../llmc from cuda/
        sed 's|ptx_cp_async_wait<1>();|/* planted: no wait */|' cuda/flash_attention.cuh > "$PLANT/cuda/flash_attention.cuh"
        if cmp -s cuda/flash_attention.cuh "$PLANT/cuda/flash_attention.cuh"; then
            echo "FAIL planting a missing cp.async wait: cuda/flash_attention.cuh has no ptx_cp_async_wait<1>() to remove"
            failed=$((failed + 1))
        elif make -s -f dev/cuda_emu/emu.mk build/emu/planted/dev/cuda/test_flash_attention; then
            expect_error "flash attention forward without its cp.async wait fails (planted)" \
                "FAIL flash attention bf16: forward out" build/emu/planted/dev/cuda/test_flash_attention
            expect_error "flash attention backward without its cp.async waits fails (planted)" \
                "FAIL flash attention bf16: backward dqkv" build/emu/planted/dev/cuda/test_flash_attention
        else
            echo "FAIL building test_flash_attention with a planted missing cp.async wait"
            failed=$((failed + 1))
        fi
        expect_error "cuda/adafactor.cuh: a slice sharded over 2 processes without a communicator stops with a message" \
            "a slice shared by 2 processes (ZeRO-1) and no NCCL communicator" $KBIN/test_factored sharded
        # ZeRO-1 parts of every slice, the ranks' sums by NCCL against the CPU's by MPI: even parts, and
        # uneven ones (3 ranks, one of them with no rows of some slices) under the late stream order
        if command -v mpirun > /dev/null; then
            run "test_factored, 2 ranks (mpirun -np 2): ZeRO-1 parts vs cpu/optimizers.h" -- "${MPIRUN_NP2[@]}" $KBIN/test_factored
            run "test_factored, 3 ranks (uneven parts), late streams" -- "${MPIRUN_NP3[@]}" -x CUDA_EMU_STREAMS=late $KBIN/test_factored
            run "test_factored, 3 ranks (uneven parts), late-nccl streams" \
                -- timeout 300 "${MPIRUN_NP3[@]}" -x CUDA_EMU_STREAMS=late-nccl $KBIN/test_factored
            # --tp parts (fcw's rows, fcprojw's columns, fcb's elements): the group's sums by NCCL against the CPU's by MPI
            run "test_factored tp, 2 ranks: --tp parts vs cpu/optimizers.h" -- "${MPIRUN_NP2[@]}" $KBIN/test_factored tp
            run "test_factored tp, 3 ranks, late-nccl streams" \
                -- timeout 300 "${MPIRUN_NP3[@]}" -x CUDA_EMU_STREAMS=late-nccl $KBIN/test_factored tp
        else
            echo "skipped: test_factored with 2 and 3 ranks (mpirun not found)"
        fi
    else
        echo "FAIL building the kernel tests of dev/cuda"
        failed=$((failed + 1))
    fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
