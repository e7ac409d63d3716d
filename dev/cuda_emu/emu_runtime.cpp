/*
emu_runtime.cpp: the CUDA runtime API of the emulated device (everything but streams and events,
which are in emu_stream.cpp), and the settings read from the environment.

Device memory is host memory with accounting: cudaMalloc fails with cudaErrorMemoryAllocation
once the live allocations would pass CUDA_EMU_MEMORY_BYTES, and cudaMemGetInfo reports against
that size. Fresh device memory is filled with EMU_UNWRITTEN_BYTE (every float/bf16 a NaN), so a
kernel that reads memory nobody wrote produces NaNs instead of plausible zeros.

Copies follow CUDA's rules on when the host may touch its buffer again:
  - cudaMemcpy returns after the copy (it is forced, with everything it depends on);
  - cudaMemcpyAsync from/to page-locked memory (cudaMallocHost) is queued like a kernel: the host
    must not reuse the buffer before the stream is synchronized (CUDA_EMU_STREAMS=late catches it);
  - cudaMemcpyAsync from pageable memory stages the data at once (the host may reuse it), and
    into pageable memory returns after the copy, as the CUDA documentation describes.

CUDA_EMU_EXECUTE=0 (with the timeline: emu_timeline.cpp): no kernel, GEMM, memset, device copy or
collective runs; device memory is address space that nothing touches (mmap'd without backing, not
filled), and a copy from the device writes zeros (pinned buffers by dropping their pages: they read
as zeros and hold no memory). So the host reads zeros back, and a large model's step plays in seconds.
*/
#include "emu_internal.h"

#include <stdarg.h>
#include <sys/mman.h>
#include <unistd.h>
#include <map>
#include <string>
#include <vector>

void emu_fail_at(const char* file, int line, const char* fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "cuda_emu: error: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  (at %s:%d)\n", file, line);
    exit(EXIT_FAILURE);
}

// ----------------------------------------------------------------------------
// settings

static const int DEFAULT_DEVICE_COUNT = 8;  // a node of 8 GPUs: multi-rank tests give each rank its own
static const size_t DEFAULT_DEVICE_MEMORY_BYTES = (size_t)8 << 30;  // 8 GiB
static const unsigned DEFAULT_SEED = 1234;
// a grid sized "SMs x blocks per SM" costs the emulator one fiber per thread: 6 SMs keep that cheap
// while still running several blocks per kernel, and 6, like an H100's 132, is no power of two, so
// code that assumes a power-of-two grid fails here too
static const int DEFAULT_MULTIPROCESSORS = 6;
static const int MAX_MULTIPROCESSORS = 1024;

static const char* env_or(const char* name, const char* fallback) {
    const char* v = getenv(name);
    return (v != nullptr && v[0] != '\0') ? v : fallback;
}

static emu_settings read_settings() {
    emu_settings s;
    s.device_count = DEFAULT_DEVICE_COUNT;
    const char* devices = getenv("CUDA_EMU_DEVICES");
    if (devices != nullptr && devices[0] != '\0') {
        char* end;
        long n = strtol(devices, &end, 10);
        if (*end != '\0' || n < 1 || n > INT32_MAX) {
            emu_fail("CUDA_EMU_DEVICES='%s': expected how many GPUs the emulated node has, 1 or more", devices);
        }
        s.device_count = (int)n;
    }
    s.device_memory_bytes = DEFAULT_DEVICE_MEMORY_BYTES;
    const char* mem = getenv("CUDA_EMU_MEMORY_BYTES");
    if (mem != nullptr && mem[0] != '\0') {
        char* end;
        s.device_memory_bytes = strtoull(mem, &end, 10);
        if (*end != '\0') { emu_fail("CUDA_EMU_MEMORY_BYTES='%s' is not a number of bytes", mem); }
    }
    std::string streams = env_or("CUDA_EMU_STREAMS", "inorder");
    if (streams == "inorder") { s.streams = EMU_STREAMS_INORDER; }
    else if (streams == "early") { s.streams = EMU_STREAMS_EARLY; }
    else if (streams == "late") { s.streams = EMU_STREAMS_LATE; }
    else if (streams == "late-nccl") { s.streams = EMU_STREAMS_LATE_NCCL; }
    else { emu_fail("CUDA_EMU_STREAMS='%s': expected inorder, early, late or late-nccl", streams.c_str()); }
    std::string order = env_or("CUDA_EMU_THREAD_ORDER", "forward");
    if (order == "forward") { s.thread_order = EMU_ORDER_FORWARD; }
    else if (order == "reverse") { s.thread_order = EMU_ORDER_REVERSE; }
    else if (order == "shuffle") { s.thread_order = EMU_ORDER_SHUFFLE; }
    else { emu_fail("CUDA_EMU_THREAD_ORDER='%s': expected forward, reverse or shuffle", order.c_str()); }
    const char* sms = env_or("CUDA_EMU_SMS", nullptr);
    s.multiprocessors = DEFAULT_MULTIPROCESSORS;
    if (sms != nullptr) {
        char* end;
        long n = strtol(sms, &end, 10);
        if (*end != '\0' || n < 1 || n > MAX_MULTIPROCESSORS) {
            emu_fail("CUDA_EMU_SMS='%s': expected a number of SMs from 1 to %d (an H100 has 132)", sms,
                     MAX_MULTIPROCESSORS);
        }
        s.multiprocessors = (int)n;
    }
    s.seed = (unsigned)strtoul(env_or("CUDA_EMU_SEED", "0"), nullptr, 10);
    if (s.seed == 0) { s.seed = DEFAULT_SEED; }  // xorshift needs a non-zero state
    s.timeline = env_or("CUDA_EMU_TIMELINE", nullptr);
    if (s.timeline != nullptr && (mem == nullptr || mem[0] == '\0')) {
        s.device_memory_bytes = emu_timeline_memory_bytes(s.timeline);   // the modelled GPU's memory
    }
    std::string execute = env_or("CUDA_EMU_EXECUTE", "1");
    if (execute != "0" && execute != "1") { emu_fail("CUDA_EMU_EXECUTE='%s': expected 1 (run the device's work) or 0 (model it only)", execute.c_str()); }
    s.execute = execute == "1";
    if (!s.execute && s.timeline == nullptr) {
        emu_fail("CUDA_EMU_EXECUTE=0 without CUDA_EMU_TIMELINE: nothing would run and nothing be modelled\n"
                 "  hint: CUDA_EMU_TIMELINE=h100 CUDA_EMU_EXECUTE=0 (dev/cuda_emu/README.md)");
    }
    return s;
}

const emu_settings& emu_config() {
    static emu_settings settings = read_settings();
    static bool started = false;
    if (!started) {   // after the settings exist: the timeline reads them
        started = true;
        emu_timeline_init();
    }
    return settings;
}

bool emu_device_executes() { return emu_config().execute; }

// ----------------------------------------------------------------------------
// errors

static cudaError_t last_error = cudaSuccess;

void emu_set_last_error(cudaError_t e) { last_error = e; }

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

static cudaError_t record(cudaError_t e) {
    if (e != cudaSuccess) { last_error = e; }
    return e;
}

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
        default: return "cudaErrorUnknown";
    }
}

const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidDevicePointer: return "invalid device pointer";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
        default: return "unknown error (emulated device)";
    }
}

// ----------------------------------------------------------------------------
// devices and properties: CUDA_EMU_DEVICES of them, each shaped like an H100 where programs look.
// They share one memory (CUDA_EMU_MEMORY_BYTES is per process, not per device) and one set of
// streams; what tells them apart is the current device, which NCCL reads (emu_nccl.cpp).

enum {
    EMU_SHARED_PER_BLOCK = 48 * 1024,         // without opting in
    EMU_SHARED_PER_BLOCK_OPTIN = 227 * 1024,  // with cudaFuncAttributeMaxDynamicSharedMemorySize
    EMU_MAX_GRID_X = 2147483647,
    EMU_MAX_GRID_YZ = 65535,
    EMU_MAX_BLOCK_Z = 64,
    EMU_COMPUTE_MAJOR = 9,
    EMU_COMPUTE_MINOR = 0,
};

static int current_device = 0;

int emu_current_device() { return current_device; }

static bool valid_device(int device) { return device >= 0 && device < emu_config().device_count; }

cudaError_t cudaGetDeviceCount(int* count) { *count = emu_config().device_count; return cudaSuccess; }
cudaError_t cudaGetDevice(int* device) { *device = current_device; return cudaSuccess; }
cudaError_t cudaSetDevice(int device) {
    if (!valid_device(device)) { return record(cudaErrorInvalidDevice); }
    current_device = device;
    return cudaSuccess;
}
cudaError_t cudaDeviceReset(void) { emu_device_drain(); emu_tl_host_waits_for_device(); return cudaSuccess; }
cudaError_t cudaDeviceSetLimit(enum cudaLimit, size_t) { return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
    if (!valid_device(device)) { return record(cudaErrorInvalidDevice); }
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "cuda_emu device %d (CPU, dev/cuda_emu)", device);
    prop->totalGlobalMem = emu_config().device_memory_bytes;
    prop->sharedMemPerBlock = EMU_SHARED_PER_BLOCK;
    prop->sharedMemPerBlockOptin = EMU_SHARED_PER_BLOCK_OPTIN;
    prop->sharedMemPerMultiprocessor = EMU_SHARED_PER_BLOCK_OPTIN;
    prop->warpSize = EMU_WARP_SIZE;
    prop->maxThreadsPerBlock = EMU_MAX_THREADS_PER_BLOCK;
    prop->maxThreadsPerMultiProcessor = 2 * EMU_MAX_THREADS_PER_BLOCK;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = EMU_MAX_THREADS_PER_BLOCK;
    prop->maxThreadsDim[2] = EMU_MAX_BLOCK_Z;
    prop->maxGridSize[0] = EMU_MAX_GRID_X;
    prop->maxGridSize[1] = prop->maxGridSize[2] = EMU_MAX_GRID_YZ;
    prop->multiProcessorCount = emu_config().multiprocessors;
    prop->major = EMU_COMPUTE_MAJOR;
    prop->minor = EMU_COMPUTE_MINOR;
    prop->regsPerBlock = 65536;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) { return e; }
    switch (attr) {
        case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
        case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
        case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
        case cudaDevAttrWarpSize: *value = p.warpSize; break;
        default: *value = 0; break;
    }
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// kernels: configuration checks at launch, then the grid is queued on its stream

static std::map<const void*, int> max_dynamic_shared;  // kernel -> opted-in bytes

cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > EMU_SHARED_PER_BLOCK_OPTIN) { return record(cudaErrorInvalidValue); }
        max_dynamic_shared[func] = value;
    }
    return cudaSuccess;
}

void emu_enqueue_kernel(const emu_launch_site& site, const emu_launch_config& config, const void* kernel,
                        std::function<void()> body) {
    const dim3& g = config.grid;
    const dim3& b = config.block;
    size_t threads = (size_t)b.x * b.y * b.z;
    size_t shared_limit = EMU_SHARED_PER_BLOCK;
    auto opted = max_dynamic_shared.find(kernel);
    if (opted != max_dynamic_shared.end()) { shared_limit = (size_t)opted->second; }
    // more threads than a block may have: cudaErrorInvalidValue, as CUDA 13 reported it on an H100
    // (the documentation and older CUDA say cudaErrorInvalidConfiguration)
    if (threads > EMU_MAX_THREADS_PER_BLOCK) {
        record(cudaErrorInvalidValue);
        return;
    }
    // the other configuration errors as the documentation gives them (not yet measured on CUDA 13:
    // test_runtime prints what a GPU answers)
    if (threads == 0 || b.z > EMU_MAX_BLOCK_Z ||
        g.x == 0 || g.y == 0 || g.z == 0 || g.x > EMU_MAX_GRID_X || g.y > EMU_MAX_GRID_YZ || g.z > EMU_MAX_GRID_YZ) {
        record(cudaErrorInvalidConfiguration);
        return;
    }
    if (kernel == nullptr && config.dynamic_shared_bytes > shared_limit) {
        emu_fail("kernel '%s' (launched at %s:%d) asks for %zu bytes of dynamic shared memory (more than the %d a "
                 "kernel gets without cudaFuncSetAttribute), and its template arguments are deduced at this launch, "
                 "so the emulator cannot tell which instantiation opted in: write them out at the launch "
                 "(%s<...><<<...>>>)",
                 site.kernel, site.file, site.line, config.dynamic_shared_bytes, (int)EMU_SHARED_PER_BLOCK, site.kernel);
    }
    if (config.dynamic_shared_bytes > shared_limit) {
        record(cudaErrorInvalidValue);  // what CUDA reports for too much dynamic shared memory
        return;
    }
    emu_work cost;
    cost.kind = EMU_WORK_KERNEL;
    cost.threads = (size_t)g.x * g.y * g.z * threads;
    if (!emu_config().execute) {   // modelled, not run
        emu_enqueue(config.stream, site.kernel, [] {}, cost);
        return;
    }
    emu_grid grid{site, g, b, config.dynamic_shared_bytes, std::move(body)};
    emu_enqueue(config.stream, site.kernel, [grid] { emu_run_grid(grid); }, cost);
}

// ----------------------------------------------------------------------------
// memory

static const size_t DEVICE_ALIGNMENT = 256;  // what cudaMalloc guarantees
static std::map<uintptr_t, size_t> device_allocations;  // start -> bytes
static std::map<uintptr_t, size_t> pinned_allocations;  // page-locked host ranges
static std::map<uintptr_t, size_t> untouched_pinned;    // CUDA_EMU_EXECUTE=0: those cudaHostAlloc mmap'd
static size_t device_bytes_used = 0;

// CUDA_EMU_EXECUTE=0: memory that nothing touches costs no RAM (pages come at first touch, zeros)
static void* untouched_alloc(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
}
static void untouched_free(void* p, size_t bytes) { munmap(p, bytes); }

static bool in_ranges(const std::map<uintptr_t, size_t>& ranges, const void* p, size_t bytes) {
    uintptr_t a = (uintptr_t)p;
    auto it = ranges.upper_bound(a);
    if (it == ranges.begin()) { return false; }
    --it;
    return a + bytes <= it->first + it->second;
}

bool emu_is_device_range(const void* p, size_t bytes) { return in_ranges(device_allocations, p, bytes); }
bool emu_is_pinned_range(const void* p, size_t bytes) { return in_ranges(pinned_allocations, p, bytes); }

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    size_t rounded = (bytes + DEVICE_ALIGNMENT - 1) / DEVICE_ALIGNMENT * DEVICE_ALIGNMENT;
    if (rounded == 0) { *ptr = nullptr; return cudaSuccess; }
    if (device_bytes_used + rounded > emu_config().device_memory_bytes) {
        *ptr = nullptr;
        return record(cudaErrorMemoryAllocation);
    }
    void* p = emu_config().execute ? aligned_alloc(DEVICE_ALIGNMENT, rounded) : untouched_alloc(rounded);
    if (p == nullptr) { return record(cudaErrorMemoryAllocation); }
    if (emu_config().execute) { memset(p, EMU_UNWRITTEN_BYTE, rounded); }
    device_allocations[(uintptr_t)p] = rounded;
    device_bytes_used += rounded;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    if (ptr == nullptr) { return cudaSuccess; }
    auto it = device_allocations.find((uintptr_t)ptr);
    if (it == device_allocations.end()) { return record(cudaErrorInvalidDevicePointer); }
    emu_device_drain();  // cudaFree waits for the device, so queued work still sees the memory
    emu_tl_host_waits_for_device();
    device_bytes_used -= it->second;
    if (emu_config().execute) { free(ptr); } else { untouched_free(ptr, it->second); }
    device_allocations.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream) {
    (void)stream;
    return cudaMalloc(ptr, bytes);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
    if (ptr != nullptr && device_allocations.count((uintptr_t)ptr) == 0) { return record(cudaErrorInvalidDevicePointer); }
    emu_enqueue(stream, "cudaFreeAsync", [ptr] {
        auto it = device_allocations.find((uintptr_t)ptr);
        device_bytes_used -= it->second;
        if (emu_config().execute) { free(ptr); } else { untouched_free(ptr, it->second); }
        device_allocations.erase(it);
    });
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *total_bytes = emu_config().device_memory_bytes;
    *free_bytes = *total_bytes - device_bytes_used;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
    (void)flags;
    size_t rounded = (bytes + DEVICE_ALIGNMENT - 1) / DEVICE_ALIGNMENT * DEVICE_ALIGNMENT;
    if (rounded == 0) { rounded = DEVICE_ALIGNMENT; }
    // CUDA_EMU_EXECUTE=0: whole pages of its own, so that a copy from the device can drop them
    void* p = emu_config().execute ? aligned_alloc(DEVICE_ALIGNMENT, rounded) : untouched_alloc(rounded);
    if (p == nullptr) { return record(cudaErrorMemoryAllocation); }
    pinned_allocations[(uintptr_t)p] = rounded;
    if (!emu_config().execute) { untouched_pinned[(uintptr_t)p] = rounded; }
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaHostAlloc(ptr, bytes, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* ptr) {
    if (ptr == nullptr) { return cudaSuccess; }
    auto it = pinned_allocations.find((uintptr_t)ptr);
    if (it == pinned_allocations.end()) { return record(cudaErrorInvalidValue); }
    size_t bytes = it->second;
    pinned_allocations.erase(it);
    untouched_pinned.erase((uintptr_t)ptr);
    emu_device_drain();
    emu_tl_host_waits_for_device();
    if (emu_config().execute) { free(ptr); } else { untouched_free(ptr, bytes); }
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void* ptr, size_t bytes, unsigned int flags) {
    (void)flags;
    pinned_allocations[(uintptr_t)ptr] = bytes;
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
    return pinned_allocations.erase((uintptr_t)ptr) ? cudaSuccess : record(cudaErrorInvalidValue);
}

// the pointer checks CUDA does for an explicit copy kind (cudaMemcpyDefault infers, so anything goes)
static cudaError_t check_copy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
    bool dst_device = emu_is_device_range(dst, bytes), src_device = emu_is_device_range(src, bytes);
    switch (kind) {
        case cudaMemcpyHostToDevice: return dst_device ? cudaSuccess : cudaErrorInvalidValue;
        case cudaMemcpyDeviceToHost: return src_device ? cudaSuccess : cudaErrorInvalidValue;
        case cudaMemcpyDeviceToDevice: return dst_device && src_device ? cudaSuccess : cudaErrorInvalidValue;
        case cudaMemcpyHostToHost: return cudaSuccess;
        case cudaMemcpyDefault: return cudaSuccess;
    }
    return cudaErrorInvalidValue;
}

// CUDA_EMU_EXECUTE=0: a copy from the device leaves zeros (whole pages of a cudaHostAlloc buffer
// dropped: they read as zeros and hold no memory; the rest, and other memory, cleared)
static void zero_host(void* dst, size_t bytes) {
    uintptr_t a = (uintptr_t)dst, end = a + bytes, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t first = (a + page - 1) / page * page, last = end / page * page;
    if (in_ranges(untouched_pinned, dst, bytes) && last > first) {   // our own mmap'd pages (not a registered buffer's)
        memset(dst, 0, first - a);
        madvise((void*)first, last - first, MADV_DONTNEED);
        memset((void*)last, 0, end - last);
    } else {
        memset(dst, 0, bytes);
    }
}

// a copy's direction and cost on the timeline
static emu_work copy_cost(size_t bytes, bool src_device, bool dst_device, bool pageable) {
    emu_work w;
    w.kind = EMU_WORK_COPY;
    w.bytes = (double)bytes;
    w.pageable = pageable;
    w.dir = src_device ? (dst_device ? EMU_COPY_D2D : EMU_COPY_D2H) : (dst_device ? EMU_COPY_H2D : EMU_COPY_H2H);
    return w;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream) {
    if (bytes == 0) { return cudaSuccess; }
    cudaError_t e = check_copy(dst, src, bytes, kind);
    if (e != cudaSuccess) { return record(e); }
    bool src_device = emu_is_device_range(src, bytes), dst_device = emu_is_device_range(dst, bytes);
    bool src_pageable = !src_device && !emu_is_pinned_range(src, bytes);
    bool dst_pageable = !dst_device && !emu_is_pinned_range(dst, bytes);
    emu_work cost = copy_cost(bytes, src_device, dst_device, (src_pageable && dst_device) || (dst_pageable && src_device));
    if (!emu_config().execute && (src_device || dst_device)) {   // modelled; what the host gets back is zeros
        bool to_host = src_device && !dst_device;
        emu_enqueue(stream, "cudaMemcpyAsync", [dst, bytes, to_host] { if (to_host) { zero_host(dst, bytes); } }, cost);
        if (dst_pageable) { emu_stream_drain(stream); }
        if (cost.pageable) { emu_tl_host_waits_for_stream(stream); }   // the host waits for a pageable copy
        return cudaSuccess;
    }
    if (src_pageable) {
        // staged now: the host may reuse its buffer as soon as the call returns
        auto staged = std::make_shared<std::vector<char>>((const char*)src, (const char*)src + bytes);
        emu_enqueue(stream, "cudaMemcpyAsync", [dst, staged] { memcpy(dst, staged->data(), staged->size()); }, cost);
    } else {
        emu_enqueue(stream, "cudaMemcpyAsync", [dst, src, bytes] { memcpy(dst, src, bytes); }, cost);
    }
    if (dst_pageable) { emu_stream_drain(stream); }  // returns after the copy into pageable memory
    // on the timeline the host waits for a pageable copy either way: CUDA stages it through a pinned
    // buffer while the call returns only when the last of it is staged
    if (cost.pageable) { emu_tl_host_waits_for_stream(stream); }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind kind) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, 0);
    if (e == cudaSuccess) {
        emu_stream_drain(0);
        emu_tl_host_waits_for_stream(0);
    }
    return e;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) { return cudaSuccess; }
    if (!emu_is_device_range(dst, bytes)) { return record(cudaErrorInvalidValue); }
    emu_work cost;
    cost.kind = EMU_WORK_MEMSET;
    cost.bytes = (double)bytes;
    if (!emu_config().execute) {
        emu_enqueue(stream, "cudaMemsetAsync", [] {}, cost);
        return cudaSuccess;
    }
    emu_enqueue(stream, "cudaMemsetAsync", [dst, value, bytes] { memset(dst, value, bytes); }, cost);
    return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
    return cudaMemsetAsync(dst, value, bytes, 0);  // asynchronous for device memory, as in CUDA
}

// ----------------------------------------------------------------------------
// profiler: no profiler attaches to the emulated device (NVTX ranges need nothing here: the nvtx3
// headers are a library of their own that does nothing without a tool)

cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t cudaProfilerStop(void) { return cudaSuccess; }
