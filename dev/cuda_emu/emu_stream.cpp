/*
emu_stream.cpp: streams and events. Every piece of device work (a kernel grid, a copy, a memset,
a GEMM, an event record) is an operation queued on a stream; CUDA_EMU_STREAMS decides when it runs:

  inorder, early   at once, when it is enqueued (device work takes no time here, so this is both
                   the in-order and the earliest possible schedule)
  late             only when the host forces it: cudaStreamSynchronize, cudaEventSynchronize,
                   cudaDeviceSynchronize, a synchronous cudaMemcpy, cudaFree, or an operation that
                   depends on it. Forcing one stream runs only that stream and what its waits need;
                   cudaDeviceSynchronize drains the most recently used stream first. So a consumer
                   on stream B that forgot cudaStreamWaitEvent on producer stream A reads stale
                   data, and a host buffer reused before its async copy ran is copied too late.
                   NCCL collectives are the exception: each runs at its call, after the work
                   queued before it on its stream (emu_nccl.cpp says why).
  late-nccl        late, and NCCL collectives wait in their streams like any work. Each also
                   depends on the collective enqueued before it (whatever its stream or
                   communicator), so every rank runs its collectives in the order it issued them,
                   the order the program must issue them in on every rank (real NCCL serializes a
                   communicator's operations the same way). A rank can then wait inside a
                   collective for another rank's collective that is still queued: that rank runs it
                   when it syncs, or at the latest (emu_before_host_wait) before it waits for other
                   ranks on the host (an MPI call, emu_mpi.cpp; the end of a communicator), where a
                   real GPU would have run it meanwhile. So no rank waits for another that waits for
                   it, unless a real GPU would hang too.

Dependencies an operation carries (and so what forcing it runs first):
  - the operations before it on its own stream;
  - the event record a cudaStreamWaitEvent names;
  - the legacy default stream's implicit synchronization: work on stream 0 waits for all earlier
    work on blocking streams, and work on a blocking stream waits for earlier work on stream 0.
  - an NCCL collective: the collective enqueued before it (in late-nccl the only mode where that one
    can still be pending).

The timeline (CUDA_EMU_TIMELINE, emu_timeline.cpp) gets every operation too, with all of the
dependencies above whether or not the emulation ran them already (in inorder mode it always has), and
the host's waits: stream, event and device synchronization, and a query that finds work pending
(counted as the wait of the polling loop that follows it).

Invariant: an operation only ever depends on operations enqueued before it, so running the
dependencies first always terminates.
*/
#include "emu_internal.h"

#include <time.h>
#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

struct emu_op {
    uint64_t seq;                               // enqueue order, over all streams
    const char* what;
    std::function<void()> work;
    std::vector<std::shared_ptr<emu_op>> deps;  // must be done before this runs
    CUstream_st* stream;
    bool done;
};

struct CUstream_st {
    std::deque<std::shared_ptr<emu_op>> queue;  // enqueued, not yet run, in order
    std::shared_ptr<emu_op> last;               // the latest operation enqueued (run or not)
    bool blocking;                              // synchronizes with the legacy default stream
    emu_tl_op* tl_last;                         // the timeline: the latest operation enqueued
};

struct CUevent_st {
    std::shared_ptr<emu_op> record;             // the latest cudaEventRecord on it
    std::shared_ptr<double> time_ms;            // set when that record runs
    bool timing;
    emu_tl_op* tl_record;                       // the timeline: that record
};

static CUstream_st legacy_default_stream = {{}, nullptr, true, nullptr};
static std::vector<CUstream_st*> streams = {&legacy_default_stream};
static uint64_t next_seq = 1;
static std::shared_ptr<emu_op> last_collective;   // the latest NCCL collective enqueued (run or not)
static int running_work = 0;   // > 0 while queued work runs (a host function may call MPI)

static double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// stream 0, cudaStreamLegacy and cudaStreamPerThread are all the legacy default stream here
static CUstream_st* resolve(cudaStream_t s) {
    if (s == 0 || s == cudaStreamLegacy || s == cudaStreamPerThread) { return &legacy_default_stream; }
    return s;
}

static bool pending(const std::shared_ptr<emu_op>& op) { return op && !op->done; }

static void run_until(const std::shared_ptr<emu_op>& target);

// run the first queued operation of a stream, after whatever it depends on
static void run_front(CUstream_st* s) {
    std::shared_ptr<emu_op> op = s->queue.front();
    for (auto& d : op->deps) { run_until(d); }
    s->queue.pop_front();
    std::function<void()> work = std::move(op->work);
    running_work++;
    if (emu_timeline_on()) {   // the emulator's own time is not the host's (emu_timeline.cpp)
        double t0 = now_ms();
        work();
        emu_tl_emulation_wall((now_ms() - t0) * 1e-3);
    } else {
        work();
    }
    running_work--;
    op->done = true;
}

static void run_until(const std::shared_ptr<emu_op>& target) {
    while (pending(target)) { run_front(target->stream); }
}

static bool deferred(emu_stream_mode m) { return m == EMU_STREAMS_LATE || m == EMU_STREAMS_LATE_NCCL; }

const void* emu_stream_key(cudaStream_t stream) { return resolve(stream); }

// the timeline's operation for what is being enqueued on s, with the dependencies that enqueue()
// gives the emulated one, whether or not those ran already
static void timeline_enqueue(CUstream_st* s, const char* what, const emu_work& cost, emu_tl_op* after) {
    if (!emu_timeline_on()) { return; }
    std::vector<emu_tl_op*> deps = {s->tl_last, after};
    if (s == &legacy_default_stream) {
        for (CUstream_st* other : streams) {
            if (other != s && other->blocking) { deps.push_back(other->tl_last); }
        }
    } else if (s->blocking) {
        deps.push_back(legacy_default_stream.tl_last);
    }
    s->tl_last = emu_tl_enqueue(s, s == &legacy_default_stream, what, cost, deps);
}

// enqueue, optionally also after one more operation (the record a stream waits for, or the
// collective before a collective); returns the operation
static std::shared_ptr<emu_op> enqueue(cudaStream_t stream, const char* what, std::function<void()> work,
                                       std::shared_ptr<emu_op> after, const emu_work& cost = emu_work(),
                                       emu_tl_op* tl_after = nullptr) {
    CUstream_st* s = resolve(stream);
    timeline_enqueue(s, what, cost, tl_after);
    auto op = std::make_shared<emu_op>(emu_op{next_seq++, what, std::move(work), {}, s, false});
    if (pending(after)) { op->deps.push_back(after); }
    if (s == &legacy_default_stream) {
        for (CUstream_st* other : streams) {
            if (other != s && other->blocking && pending(other->last)) { op->deps.push_back(other->last); }
        }
    } else if (s->blocking && pending(legacy_default_stream.last)) {
        op->deps.push_back(legacy_default_stream.last);
    }
    s->queue.push_back(op);
    s->last = op;
    if (!deferred(emu_config().streams)) { run_until(op); }
    return op;
}

void emu_enqueue(cudaStream_t stream, const char* what, std::function<void()> work, const emu_work& cost) {
    enqueue(stream, what, std::move(work), nullptr, cost);
}

void emu_enqueue_collective(cudaStream_t stream, const char* what, std::function<void()> work, const emu_work& cost) {
    last_collective = enqueue(stream, what, std::move(work), last_collective, cost);
    if (emu_config().streams != EMU_STREAMS_LATE_NCCL) { run_until(last_collective); }
}

bool emu_collective_pending() { return pending(last_collective); }

void emu_before_host_wait() {
    // from inside queued work (a cudaLaunchHostFunc calling MPI) the device is running already
    if (running_work > 0 || !pending(last_collective)) { return; }
    emu_device_drain();
}

void emu_stream_drain(cudaStream_t stream) {
    run_until(resolve(stream)->last);
}

void emu_tl_host_waits_for_stream(cudaStream_t stream) {
    if (emu_timeline_on()) { emu_tl_host_wait(resolve(stream)->tl_last); }
}

void emu_tl_host_waits_for_device() {
    if (!emu_timeline_on()) { return; }
    for (CUstream_st* s : streams) { emu_tl_host_wait(s->tl_last); }
}

void emu_device_drain() {
    // most recently used stream first: the order most likely to expose a missing wait
    std::vector<CUstream_st*> order = streams;
    std::sort(order.begin(), order.end(), [](CUstream_st* a, CUstream_st* b) {
        uint64_t sa = a->last ? a->last->seq : 0, sb = b->last ? b->last->seq : 0;
        return sa > sb;
    });
    for (CUstream_st* s : order) { run_until(s->last); }
}

// ----------------------------------------------------------------------------
// streams

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
    CUstream_st* s = new CUstream_st{{}, nullptr, (flags & cudaStreamNonBlocking) == 0, nullptr};
    streams.push_back(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
    (void)priority;  // one emulated queue has no priorities
    return cudaStreamCreateWithFlags(stream, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    CUstream_st* s = resolve(stream);
    if (s == &legacy_default_stream) { return cudaErrorInvalidResourceHandle; }
    run_until(s->last);  // CUDA finishes the queued work of a destroyed stream
    emu_tl_host_waits_for_stream(s);
    streams.erase(std::find(streams.begin(), streams.end(), s));
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    emu_stream_drain(stream);
    emu_tl_host_waits_for_stream(stream);
    return cudaSuccess;
}

// not ready while work is queued; asking makes it run, so a polling loop ends
cudaError_t cudaStreamQuery(cudaStream_t stream) {
    CUstream_st* s = resolve(stream);
    if (emu_timeline_on() && !emu_tl_done(s->tl_last) && s->tl_last != nullptr) {
        emu_tl_host_wait(s->tl_last);   // the polling loop's wait
        run_until(s->last);
        return cudaErrorNotReady;
    }
    if (!pending(s->last)) { return cudaSuccess; }
    run_until(s->last);
    return cudaErrorNotReady;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    (void)flags;
    if (event == nullptr) { return cudaErrorInvalidResourceHandle; }
    std::shared_ptr<emu_op> record = event->record;  // the record as of now, as CUDA captures it
    if (!pending(record)) {
        timeline_enqueue(resolve(stream), "cudaStreamWaitEvent", emu_work(), event->tl_record);  // the emulation has nothing to wait for
        return cudaSuccess;
    }
    enqueue(stream, "cudaStreamWaitEvent", [] {}, record, emu_work(), event->tl_record);
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
    emu_enqueue(stream, "cudaLaunchHostFunc", [fn, user_data] { fn(user_data); });
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    emu_device_drain();
    emu_tl_host_waits_for_device();
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
    *event = new CUevent_st{nullptr, std::make_shared<double>(0.0), (flags & cudaEventDisableTiming) == 0, nullptr};
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    delete event;  // a pending record keeps its own reference to the time slot
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (event == nullptr) { return cudaErrorInvalidResourceHandle; }
    std::shared_ptr<double> slot = std::make_shared<double>(0.0);
    event->time_ms = slot;
    emu_enqueue(stream, "cudaEventRecord", [slot] { *slot = now_ms(); });
    event->record = resolve(stream)->last;
    event->tl_record = resolve(stream)->tl_last;
    return cudaSuccess;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
    (void)flags;
    return cudaEventRecord(event, stream);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (event == nullptr) { return cudaErrorInvalidResourceHandle; }
    run_until(event->record);
    if (emu_timeline_on()) { emu_tl_host_wait(event->tl_record); }
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (event == nullptr) { return cudaErrorInvalidResourceHandle; }
    if (emu_timeline_on() && event->tl_record != nullptr && !emu_tl_done(event->tl_record)) {
        emu_tl_host_wait(event->tl_record);   // the polling loop's wait
        run_until(event->record);
        return cudaErrorNotReady;
    }
    if (!pending(event->record)) { return cudaSuccess; }
    run_until(event->record);
    return cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (start == nullptr || end == nullptr || !start->timing || !end->timing) { return cudaErrorInvalidResourceHandle; }
    if (!start->record || !end->record) { return cudaErrorInvalidResourceHandle; }
    if (pending(start->record) || pending(end->record)) { return cudaErrorNotReady; }
    if (emu_timeline_on()) {   // the modelled GPU's times
        if (!emu_tl_done(start->tl_record) || !emu_tl_done(end->tl_record)) { return cudaErrorNotReady; }
        *ms = (float)(emu_tl_end_ms(end->tl_record) - emu_tl_end_ms(start->tl_record));
        return cudaSuccess;
    }
    *ms = (float)(*end->time_ms - *start->time_ms);
    return cudaSuccess;
}
