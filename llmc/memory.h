/*
memory.h: every large allocation of the trainer goes through one accounting
allocator, by category, with high-water marks; and the process's resident set
size read from the OS, to check the accounting against reality.

    float* p = (float*)mem_alloc(MEM_PARAMETERS, n * sizeof(float));   // 64-byte aligned
    ...
    mem_free(p);
    size_t peak = g_mem.peak[MEM_PARAMETERS];

Where the bytes come from is the backend's choice, per category: host memory by
default (the CPU trainer), device memory for the categories a GPU holds, pinned
host memory for what it copies asynchronously (mem_set_allocator). The accounting
is the same for all, so one memory table serves every backend.

The planner (planner.h) predicts the same numbers from closed-form formulas; the
trainer prints both side by side, and test_gpt.c checks they agree exactly.
Failure: out of memory stops with the category, the size and where the memory
comes from, and a hint (--plan).
*/
#ifndef LLMC_MEMORY_H
#define LLMC_MEMORY_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "utils.h"

typedef enum {
    MEM_PARAMETERS,       // the weights
    MEM_GRADIENTS,        // one gradient per weight
    MEM_OPTIMIZER,        // optimizer state (AdamW: m and v)
    MEM_ACTIVATIONS,      // what forward keeps for backward, and the logits
    MEM_ACT_GRADIENTS,    // backward's working buffers (one layer's worth, reused)
    MEM_SCRATCH,          // data loader batches, sampling buffer; a GPU's reduction and attention scratch
    MEM_OFFLOADED,        // the host store of offloaded activations (--offload activations)
    MEM_OPT_HOST,         // --offload optimizer: master weights, gradients, optimizer state and their staging, in host memory
    MEM_HOST_COPIES,      // a GPU backend's host copies of the weights and optimizer state (checkpoints)
    NUM_MEM_CATEGORIES
} MemCategory;

static const char* MEM_CATEGORY_NAMES[NUM_MEM_CATEGORIES] = {
    "parameters", "gradients", "optimizer state", "activations", "activation grads", "scratch",
    "offloaded (host)", "optimizer (host)", "host copies",
};
// the same categories as keys of the JSON log (log.jsonl's "memory" record)
static const char* MEM_CATEGORY_KEYS[NUM_MEM_CATEGORIES] = {
    "parameters", "gradients", "optimizer_state", "activations", "activation_grads", "scratch",
    "offloaded_host", "optimizer_host", "host_copies",
};
// the categories that live in host memory on a GPU; the rest is "device" (what a GPU holds)
static int mem_category_on_host(int cat) { return cat == MEM_OFFLOADED || cat == MEM_OPT_HOST || cat == MEM_HOST_COPIES; }

typedef struct {
    size_t current[NUM_MEM_CATEGORIES];  // bytes live now
    size_t peak[NUM_MEM_CATEGORIES];     // high-water mark of each category
    size_t total_current, total_peak;    // all categories together
} MemStats;

static MemStats g_mem;  // one accounting per process

#define MEM_ALIGN 64  // a cache line, and the widest vector load (AVX-512)

// where one category's bytes come from: alloc returns NULL when out of memory
typedef struct {
    void* (*alloc)(size_t bytes);
    void (*release)(void* p);
    const char* where;  // "host memory", "device memory", ... for messages
} MemAllocator;

static void* mem_host_alloc(size_t bytes) {
    return aligned_alloc(MEM_ALIGN, (bytes + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN);
}
static void mem_host_release(void* p) { free(p); }
static const MemAllocator MEM_HOST = {mem_host_alloc, mem_host_release, "host memory"};

// each category's allocator; a NULL alloc means MEM_HOST
static MemAllocator g_mem_allocators[NUM_MEM_CATEGORIES];

// the backend's choice for one category, before its first allocation (mem_alloc_from takes
// another allocator for one block: a GPU's device scratch counted as scratch, say)
static void mem_set_allocator(MemCategory cat, MemAllocator a) { g_mem_allocators[cat] = a; }

static const MemAllocator* mem_allocator_of(MemCategory cat) {
    return g_mem_allocators[cat].alloc != NULL ? &g_mem_allocators[cat] : &MEM_HOST;
}

// the live blocks (the memory itself may be a device's, so sizes are kept here)
#define MEM_MAX_BLOCKS 64  // a run makes about fifteen allocations
typedef struct { void* p; size_t bytes; MemCategory category; const MemAllocator* from; } MemBlock;
static MemBlock g_mem_blocks[MEM_MAX_BLOCKS];

// bytes counted in category cat, from allocator a (a category's own: mem_alloc)
static void* mem_alloc_from_at(MemCategory cat, const MemAllocator* a, size_t bytes, const char* file, int line) {
    void* p = a->alloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        fail_at(file, line, "out of %s allocating %.1f MiB of %s (%.1f MiB already in use)\n"
                "  hint: run with --plan to see what this model, batch and flags need",
                a->where, bytes / 1048576.0, MEM_CATEGORY_NAMES[cat], g_mem.total_current / 1048576.0);
    }
    int slot = 0;
    while (slot < MEM_MAX_BLOCKS && g_mem_blocks[slot].p != NULL) { slot++; }
    if (slot == MEM_MAX_BLOCKS) { fail_at(file, line, "more than %d live allocations: raise MEM_MAX_BLOCKS", MEM_MAX_BLOCKS); }
    MemBlock b = {p, bytes, cat, a};
    g_mem_blocks[slot] = b;
    g_mem.current[cat] += bytes;
    if (g_mem.current[cat] > g_mem.peak[cat]) { g_mem.peak[cat] = g_mem.current[cat]; }
    g_mem.total_current += bytes;
    if (g_mem.total_current > g_mem.total_peak) { g_mem.total_peak = g_mem.total_current; }
    return p;
}
#define mem_alloc_from(cat, allocator, bytes) mem_alloc_from_at(cat, allocator, bytes, __FILE__, __LINE__)
#define mem_alloc(cat, bytes) mem_alloc_from_at(cat, mem_allocator_of(cat), bytes, __FILE__, __LINE__)

// zero-filled; only for categories in host memory (a device's memory is zeroed by its backend)
static void* mem_calloc_at(MemCategory cat, size_t bytes, const char* file, int line) {
    void* p = mem_alloc_from_at(cat, mem_allocator_of(cat), bytes, file, line);
    memset(p, 0, bytes);
    return p;
}
#define mem_calloc(cat, bytes) mem_calloc_at(cat, bytes, __FILE__, __LINE__)

// the bytes of the live blocks that came from allocator a (a GPU's device memory, say)
static size_t mem_live_bytes_from(const MemAllocator* a) {
    size_t n = 0;
    for (int i = 0; i < MEM_MAX_BLOCKS; i++) {
        if (g_mem_blocks[i].p != NULL && g_mem_blocks[i].from->alloc == a->alloc) { n += g_mem_blocks[i].bytes; }
    }
    return n;
}

static void mem_free(void* p) {
    if (p == NULL) { return; }
    for (int i = 0; i < MEM_MAX_BLOCKS; i++) {
        MemBlock* b = &g_mem_blocks[i];
        if (b->p != p) { continue; }
        g_mem.current[b->category] -= b->bytes;
        g_mem.total_current -= b->bytes;
        b->from->release(p);
        b->p = NULL;
        return;
    }
    fail("mem_free: %p was not allocated by mem_alloc", p);
}

// a "Name:   N kB" field of a /proc file (Linux), in bytes; 0 where unknown.
// /proc/self/status: "VmRSS" is the resident set size, "VmHWM" its high-water mark;
// /proc/meminfo: "MemAvailable" is what can be allocated without swapping.
static size_t mem_proc_field(const char* file, const char* field) {
    FILE* f = fopen(file, "r");
    if (f == NULL) { return 0; }
    char line[256];
    size_t kib = 0, n = strlen(field);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, field, n) == 0 && line[n] == ':') { kib = strtoull(line + n + 1, NULL, 10); break; }
    }
    fclose(f);
    return kib * 1024;
}
static size_t mem_rss_now(void) { return mem_proc_field("/proc/self/status", "VmRSS"); }
static size_t mem_rss_peak(void) { return mem_proc_field("/proc/self/status", "VmHWM"); }
static size_t mem_available(void) { return mem_proc_field("/proc/meminfo", "MemAvailable"); }

#endif // LLMC_MEMORY_H
