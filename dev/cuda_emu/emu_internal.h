/*
emu_internal.h: what the emulator's own source files share; never included by a .cu.

  emu_fail()      stop with "cuda_emu: error: ..." and the file:line of the call
  emu_config      the settings read once from the environment (CUDA_EMU_*), see README.md
  emu_enqueue()   put one piece of device work on a stream (emu_stream.cpp decides when it runs)
  emu_run_grid()  run a kernel launch, block by block (emu_kernel.cpp)
  emu_kernel_fail() stop with a message that names the running kernel and block
  emu_wmma_complete() the work of a wmma collective, for the whole warp (emu_wmma.cpp)
  emu_ptx_complete()  the same for mma.sync and ldmatrix; cp.async's queues (emu_ptx.cpp)
  emu_lt_check_*  the cuBLASLt descriptor rules of the real library (emu_lt_rules.cpp)
  device memory lookups for the runtime's argument checks (emu_runtime.cpp)

Invariant: everything here runs on the host thread that made the CUDA call; the emulator starts no
OS threads of its own.
*/
#ifndef CUDA_EMU_INTERNAL_H
#define CUDA_EMU_INTERNAL_H

#include "cuda_emu.h"

#include <functional>
#include <string>
#include <vector>

[[noreturn]] void emu_fail_at(const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define emu_fail(...) emu_fail_at(__FILE__, __LINE__, __VA_ARGS__)

// ----------------------------------------------------------------------------
// settings from the environment, read once at the first CUDA call

enum emu_stream_mode {
    EMU_STREAMS_INORDER,  // every operation runs when it is enqueued
    EMU_STREAMS_EARLY,    // the same schedule: work takes no time, so enqueue time is the earliest
    EMU_STREAMS_LATE,     // operations wait until the host forces them (sync, event, dependency)
    EMU_STREAMS_LATE_NCCL,// the same, and NCCL collectives wait in their streams too (not run at the call)
};
enum emu_thread_order {
    EMU_ORDER_FORWARD,    // between barriers, threads run 0, 1, 2, ...
    EMU_ORDER_REVERSE,    // ... n-1, n-2, ..., 0
    EMU_ORDER_SHUFFLE,    // a fresh pseudo-random order in every round (seed: CUDA_EMU_SEED)
};
struct emu_settings {
    int device_count;             // CUDA_EMU_DEVICES: GPUs of the emulated node
    size_t device_memory_bytes;   // CUDA_EMU_MEMORY_BYTES
    emu_stream_mode streams;      // CUDA_EMU_STREAMS
    emu_thread_order thread_order;// CUDA_EMU_THREAD_ORDER
    unsigned seed;                // CUDA_EMU_SEED
    int multiprocessors;          // CUDA_EMU_SMS: the SM count kernels size their grids from
    const char* timeline;         // CUDA_EMU_TIMELINE: the GPU modelled (emu_timeline.cpp), NULL: none
    bool execute;                 // CUDA_EMU_EXECUTE: 0 = device work is modelled only, not run
};
const emu_settings& emu_config();

// ----------------------------------------------------------------------------
// streams (emu_stream.cpp)

// what one piece of device work costs the timeline (emu_timeline.cpp prices it)
enum emu_work_kind { EMU_WORK_MARKER, EMU_WORK_KERNEL, EMU_WORK_GEMM, EMU_WORK_COPY, EMU_WORK_MEMSET, EMU_WORK_COLLECTIVE };
enum emu_copy_dir { EMU_COPY_H2D, EMU_COPY_D2H, EMU_COPY_D2D, EMU_COPY_H2H };
enum emu_collective_kind { EMU_ALL_REDUCE, EMU_REDUCE_SCATTER, EMU_ALL_GATHER, EMU_BROADCAST, EMU_REDUCE, EMU_SEND_RECV };
enum emu_peak { EMU_PEAK_FP32, EMU_PEAK_TF32, EMU_PEAK_BF16 };   // which peak a GEMM's types run at
struct emu_work {
    emu_work_kind kind = EMU_WORK_MARKER;     // a marker (event record, wait, host function) takes no time
    double flops = 0.0, bytes = 0.0;          // GEMM: 2mnk a matrix and its operands; copy, memset: bytes;
                                              // collective: the whole buffer (all-gather's output, reduce-scatter's input;
                                              // point to point: the larger direction's)
    size_t threads = 0;                       // kernel: grid x block
    int m = 0, n = 0, k = 0, batch = 1;       // GEMM
    emu_peak peak = EMU_PEAK_FP32;            // GEMM
    emu_copy_dir dir = EMU_COPY_H2D;          // copy
    bool pageable = false;                    // copy: from or to pageable host memory
    emu_collective_kind collective = EMU_ALL_REDUCE;
    int nranks = 1;                           // collective
};

// enqueue work on a stream; `what` names it in messages. Returns after it ran if the mode says so.
void emu_enqueue(cudaStream_t stream, const char* what, std::function<void()> work, const emu_work& cost = emu_work());
// run everything the stream has queued so far (and whatever that depends on)
void emu_stream_drain(cudaStream_t stream);
// run all queued work of every stream
void emu_device_drain();
// an NCCL collective: queued like any work, and also after the collective enqueued before it (any
// stream, any communicator), so that every rank runs its collectives in the order it issued them.
// Runs at once (after its stream's earlier work) unless the mode is late-nccl
void emu_enqueue_collective(cudaStream_t stream, const char* what, std::function<void()> work, const emu_work& cost);
// whether a collective is enqueued and has not run
bool emu_collective_pending();
// late-nccl: the host is about to wait for other ranks (an MPI call, a communicator's end), which may
// wait for this rank's queued collectives: drain the device if one is pending (emu_mpi.cpp, emu_nccl.cpp)
void emu_before_host_wait();

// the key of a stream in the timeline (stream 0 and its aliases are one)
const void* emu_stream_key(cudaStream_t stream);
// the host waits for everything queued on the device so far (the timeline's clock moves with it)
void emu_tl_host_waits_for_device();
// the same for what is queued on one stream so far
void emu_tl_host_waits_for_stream(cudaStream_t stream);

// ----------------------------------------------------------------------------
// the timeline (emu_timeline.cpp)

struct emu_tl_op;   // one operation of the simulation
// the operation queued on `stream` (legacy: the legacy default stream), after deps (nullptr ones skipped)
emu_tl_op* emu_tl_enqueue(const void* stream, bool legacy, const char* what, const emu_work& w,
                          const std::vector<emu_tl_op*>& deps);
// the host waits until op is done on the modelled GPU (nullptr: returns)
void emu_tl_host_wait(emu_tl_op* op);
bool emu_tl_done(const emu_tl_op* op);
double emu_tl_end_ms(const emu_tl_op* op);
// seconds the emulator spent running queued work (not the host's own time)
void emu_tl_emulation_wall(double seconds);
// at the first CUDA call: the model read, the trace of CUDA_EMU_TRACE arranged
void emu_timeline_init();
// the device memory of a timeline setting's GPU (CUDA_EMU_MEMORY_BYTES' default under it)
size_t emu_timeline_memory_bytes(const char* setting);
void emu_timeline_set_rank(int rank);

// ----------------------------------------------------------------------------
// kernels (emu_kernel.cpp)

struct emu_grid {
    emu_launch_site site;
    dim3 grid, block;
    size_t dynamic_shared_bytes;
    std::function<void()> body;   // runs the kernel for the current fiber
};
void emu_run_grid(const emu_grid& g);
// stop: "cuda_emu: error: kernel '...' (launched at file:line), block (x,y,z):" and then detail
[[noreturn]] void emu_kernel_fail(const std::string& detail);

// ----------------------------------------------------------------------------
// nvcuda::wmma (emu_wmma.cpp)

// the wmma collectives: on these, every lane must wait at the same call site (as the hardware's
// .aligned instructions require), not only at the same operation
static inline bool emu_collective_is_wmma(emu_collective op) {
    return op == EMU_WMMA_LOAD || op == EMU_WMMA_STORE || op == EMU_WMMA_MMA;
}
// every lane of `lanes` has posted a wmma collective (posted[l]: lane l's call, see emu_wmma.cpp):
// check that all lanes of the warp are there with the same arguments and do the work for all of them
void emu_wmma_complete(emu_collective op, const uint64_t posted[EMU_WARP_SIZE], unsigned lanes);

// ----------------------------------------------------------------------------
// PTX instructions (emu_ptx.cpp, for cuda/ptx.cuh)

// mma.sync and ldmatrix: like wmma, every lane must wait at the same call site
static inline bool emu_collective_is_ptx(emu_collective op) { return op == EMU_PTX_MMA || op == EMU_PTX_LDMATRIX; }
// every lane of `lanes` has posted (posted[l]: lane l's call): check and do the warp's work
void emu_ptx_complete(emu_collective op, const uint64_t posted[EMU_WARP_SIZE], unsigned lanes);
// a block of n threads starts: no cp.async of the previous block is in flight
void emu_ptx_block_start(int n);
// whether [p, p+bytes) lies in the running block's shared memory (dynamic or a __shared__ static)
bool emu_is_shared_range(const void* p, size_t bytes);
// the running thread's linear index in its block
int emu_current_thread_index();

// ----------------------------------------------------------------------------
// cuBLASLt descriptor rules (emu_lt_rules.cpp): CUBLAS_STATUS_SUCCESS, or the status the real library
// returns for the descriptor, after a one-line note on stderr saying why (once per reason).
// `caller` names the API function in that note.

// whether an algorithm exists for the epilogue with these transposes (cublasLtMatmulAlgoGetHeuristic)
cublasStatus_t emu_lt_check_algorithm(const char* caller, uint32_t epilogue, int32_t transa, int32_t transb);
// whether the bias and aux pointers fit the epilogue (cublasLtMatmul); rows: D's rows, the least aux_ld
cublasStatus_t emu_lt_check_pointers(const char* caller, uint32_t epilogue, const void* bias, const void* aux,
                                     int64_t aux_ld, uint64_t rows);
// whether the operands A, B, C, D are aligned as the algorithm needs (min_alignment: bytes, the
// preference's when the heuristic chose it) and the workspace (if any) at 256 bytes (cublasLtMatmul)
enum { EMU_LT_OPERANDS = 4 };
cublasStatus_t emu_lt_check_alignment(const char* caller, const void* const operands[EMU_LT_OPERANDS],
                                      const uint32_t min_alignment[EMU_LT_OPERANDS], const void* workspace,
                                      size_t workspace_bytes);

// ----------------------------------------------------------------------------
// devices and memory (emu_runtime.cpp)

// the device cudaSetDevice chose for this process (0 until it is called)
int emu_current_device();

// whether [p, p+bytes) lies inside one live cudaMalloc allocation
bool emu_is_device_range(const void* p, size_t bytes);
// whether [p, p+bytes) lies in page-locked host memory (cudaMallocHost, cudaHostAlloc, cudaHostRegister)
bool emu_is_pinned_range(const void* p, size_t bytes);
// set the error that cudaGetLastError() returns next
void emu_set_last_error(cudaError_t e);
// fill pattern of fresh device memory and shared memory: every float, bf16 and half is a NaN
enum { EMU_UNWRITTEN_BYTE = 0xFF };

#endif // CUDA_EMU_INTERNAL_H
