/*
offload_optimizer.cuh: optimizer offload in the CUDA model (--offload optimizer[,gradients]; with
--zero 2 or 3 the offloaded shard): gradients down, the host's step (cpu/host_step.h), new weights up.

A part of train_gpt.cu, included where this section stands there: its functions take the model
(struct Model) and are called at the plain model's named hooks. It does not compile alone.
*/
#ifndef CUDA_OFFLOAD_OPTIMIZER_CUH
#define CUDA_OFFLOAD_OPTIMIZER_CUH

// ----------------------------------------------------------------------------
// optimizer offload (--offload optimizer; ZeRO-Offload, Ren et al. 2021): the fp32 master
// weights, the step's gradients and the optimizer state are pinned host memory; the GPU keeps
// the working weights and the gradients of the step, which build up there over the micro-steps
// as in plain training. The last micro-step's backward sends each layer's gradients down on
// grad_stream as soon as they are final, overlapping the layers still computing. The step is
// the CPU reference's own code (cpu/host_step.h: MPI sums, norm, clipping, the update), made by
// the next forward a group at a time (wte, wpe, lnf; then each layer: "the deferred update" below),
// each group's new weights going up, rounded to floatX, through two pinned staging buffers in turn.
//
// --offload optimizer,gradients: the GPU keeps only the gradients of the outer tensors (wte, wpe, lnfw,
// lnfb: wte's builds up over the whole backward) and of two layers. Every micro-step's backward
// sends each layer's gradients down through the staging buffers, and the CPU adds them into the
// step's gradients while the GPU computes the next layer.

// a gradient group's pieces: layer l's slices of the per-layer tensors, or (l = OUTER_GROUP)
// wte, wpe, lnfw, lnfb whole; one after another in a group buffer (on the GPU and in staging),
// each at host_offset floats in the model's order
typedef struct { size_t host_offset, n; } GradPiece;

static int grad_group_pieces(const GPT2Config* c, int l, GradPiece pieces[NUM_PARAMETER_TENSORS]) {
    size_t sizes[NUM_PARAMETER_TENSORS], offset = 0;
    gpt2_parameter_sizes(sizes, c);
    int n = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        int per_layer = PARAMETER_IS_PER_LAYER[i];
        if (per_layer == (l != OUTER_GROUP)) {
            size_t each = per_layer ? sizes[i] / c->num_layers : sizes[i];
            GradPiece piece = {offset + (per_layer ? (size_t)l * each : 0), each};
            pieces[n++] = piece;
        }
        offset += sizes[i];
    }
    return n;
}

// layer gradients packed in a group buffer p: the per-layer tensors' slices in model order
static LayerParams<float> packed_layer_grads(float* p, const GPT2Config* c) {
    GradPiece pieces[NUM_PARAMETER_TENSORS];
    LayerParams<float> g;
    float** ptrs[] = {&g.ln1w, &g.ln1b, &g.qkvw, &g.qkvb, &g.attprojw, &g.attprojb,
                      &g.ln2w, &g.ln2b, &g.fcw, &g.fcb, &g.fcprojw, &g.fcprojb};
    int n = grad_group_pieces(c, 0, pieces);
    for (int i = 0; i < n; i++) { *ptrs[i] = p; p += pieces[i].n; }
    return g;
}

// layer l's gradient buffer on the GPU, zeroed. The layer that used it last (l + 2) has left it:
// the CPU took l + 2's gradients (waiting for their copy) right after it queued l + 1's backward,
// before it queues this
template <typename floatX>
static LayerParams<float> layer_grads_on_device(Model<floatX>* m, int l) {
    int b = l % 2;
    CUDA_CHECK(cudaMemsetAsync(m->opt_offload.grad_layers[b], 0, layer_weights(&m->config) * sizeof(float), m->stream));
    return packed_layer_grads(m->opt_offload.grad_layers[b], &m->config);
}

// queues the copy of a group's n gradients at src (GPU) into opt_staging[b], after everything the
// compute stream has queued so far
template <typename floatX>
static void send_grads_down(Model<floatX>* m, const float* src, size_t n, int b) {
    CUDA_CHECK(cudaEventRecord(m->opt_offload.grads_ready, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->opt_offload.grad_stream, m->opt_offload.grads_ready, 0));
    prof_gpu_mark(m->opt_offload.grad_stream, PROF_STREAM_GRADS, PROF_OFFLOAD_COPY, prof_bytes(n * sizeof(float)), "gradients to the host");
    CUDA_CHECK(cudaMemcpyAsync(m->opt_offload.opt_staging[b], src, n * sizeof(float), cudaMemcpyDeviceToHost, m->opt_offload.grad_stream));
    prof_gpu_close(m->opt_offload.grad_stream, PROF_STREAM_GRADS);
    CUDA_CHECK(cudaEventRecord(m->opt_offload.grads_down[b], m->opt_offload.grad_stream));
}

// the CPU waits for group l's gradients in opt_staging[b] and takes them into the step's: the
// step's first micro-batch copies, later ones add (where plain training adds inside the GPU's
// kernels, so a sum of micro-batches may round differently: tests/test_cuda_matrix.py, 1e-6)
template <typename floatX>
static void take_grads(Model<floatX>* m, int l, int b) {
    WATCHED_WAIT(cudaEventSynchronize(m->opt_offload.grads_down[b]), "the gradients' copy to the host");
    GradPiece pieces[NUM_PARAMETER_TENSORS];
    int n = grad_group_pieces(&m->config, l, pieces);
    const float* src = m->opt_offload.opt_staging[b];
    for (int i = 0; i < n; i++) {
        float* dst = m->opt_offload.host_grads + pieces[i].host_offset;
        size_t len = pieces[i].n;
        if (m->opt_offload.first_micro_step) {
            memcpy(dst, src, len * sizeof(float));
        } else {
            #pragma omp parallel for
            for (size_t j = 0; j < len; j++) { dst[j] += src[j]; }
        }
        src += len;
    }
}

// n new master weights (host, at src) up to floatX ones on the GPU (at dst), rounded on the CPU, in
// chunks through the staging buffers in turn (a chunk waits for the upload that used its buffer
// last); queued on the compute stream, so the next forward runs after them
template <typename floatX>
static void upload_weights(Model<floatX>* m, const float* src, floatX* dst, size_t count) {
    for (size_t done = 0; done < count; done += m->opt_offload.opt_staging_floats) {
        size_t n = count - done < m->opt_offload.opt_staging_floats ? count - done : m->opt_offload.opt_staging_floats;
        int b = m->opt_offload.next_staging;
        m->opt_offload.next_staging ^= 1;
        WATCHED_WAIT(cudaEventSynchronize(m->opt_offload.staged_up[b]), "a staging buffer's copy to the device");
        floatX* staged = (floatX*)m->opt_offload.opt_staging[b];
        #pragma omp parallel for
        for (size_t j = 0; j < n; j++) { staged[j] = from_float<floatX>(src[done + j]); }
        CUDA_CHECK(cudaMemcpyAsync(dst + done, staged, n * sizeof(floatX), cudaMemcpyHostToDevice, m->stream));
        CUDA_CHECK(cudaEventRecord(m->opt_offload.staged_up[b], m->stream));
    }
}

// group l's new master weights (layer l's slices, or OUTER_GROUP's tensors) up to the GPU's working
// weights: rounded to floatX on the CPU into one staging buffer (a group fits: the buffers hold
// max(Pl, Pr) floats), which waits for the upload that used it last, then a copy per tensor on the
// compute stream, behind the kernels already queued there
template <typename floatX>
static void upload_group(Model<floatX>* m, int l) {
    GradPiece pieces[NUM_PARAMETER_TENSORS];
    int n = grad_group_pieces(&m->config, l, pieces);
    int b = m->opt_offload.next_staging;
    m->opt_offload.next_staging ^= 1;
    WATCHED_WAIT(cudaEventSynchronize(m->opt_offload.staged_up[b]), "a staging buffer's copy to the device");
    floatX* staged = (floatX*)m->opt_offload.opt_staging[b];
    for (int i = 0; i < n; i++) {  // the master weights and the working weights share the model's layout
        const float* src = m->master_memory + pieces[i].host_offset;
        #pragma omp parallel for
        for (size_t j = 0; j < pieces[i].n; j++) { staged[j] = from_float<floatX>(src[j]); }
        CUDA_CHECK(cudaMemcpyAsync(m->weights_memory + pieces[i].host_offset, staged, pieces[i].n * sizeof(floatX),
                                   cudaMemcpyHostToDevice, m->stream));
        staged += pieces[i].n;
    }
    CUDA_CHECK(cudaEventRecord(m->opt_offload.staged_up[b], m->stream));
}

// every group's new weights up (a load, or the update under ZeRO-1)
template <typename floatX>
static void upload_all(Model<floatX>* m) {
    upload_group(m, OUTER_GROUP);
    for (int l = 0; l < m->config.num_layers; l++) { upload_group(m, l); }
}

// OPT_OFFLOAD_STATE, the last micro-step: group l's final gradients (OUTER_GROUP: wte, wpe, lnfw,
// lnfb) straight into the host's, after everything the compute stream has queued so far
template <typename floatX>
static void send_final_grads(Model<floatX>* m, int l) {
    CUDA_CHECK(cudaEventRecord(m->opt_offload.grads_ready, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->opt_offload.grad_stream, m->opt_offload.grads_ready, 0));
    GradPiece pieces[NUM_PARAMETER_TENSORS];
    int n = grad_group_pieces(&m->config, l, pieces);
    for (int i = 0; i < n; i++) {
        size_t off = pieces[i].host_offset;
        prof_gpu_mark(m->opt_offload.grad_stream, PROF_STREAM_GRADS, PROF_OFFLOAD_COPY, prof_bytes(pieces[i].n * sizeof(float)), "gradients to the host");
        CUDA_CHECK(cudaMemcpyAsync(m->opt_offload.host_grads + off, m->grads_memory + off, pieces[i].n * sizeof(float),
                                   cudaMemcpyDeviceToHost, m->opt_offload.grad_stream));
    }
    prof_gpu_close(m->opt_offload.grad_stream, PROF_STREAM_GRADS);
}

// ----------------------------------------------------------------------------
// the offloaded shard (--offload optimizer with --zero 2 or 3, ZeRO-Offload's way with a sharded
// model): each rank offloads its own shard. The GPU reduce-scatters every micro-step's gradients
// into its fp32 gradient shard, as ZeRO-2 does (NCCL, during the backward); in the step's last
// backward each layer's part of the shard goes down to the host as soon as it is final (on the comm
// stream, while the layers below compute: zero2_reduce), and the CPU takes the step on this rank's
// blocks alone, as the CPU backend's ZeRO-3 does (cpu/host_step.h: the norm's parts added over the
// ranks, the update of the compact shards of the master weights and of the state, nothing gathered
// on the host). The new weights go up, rounded to floatX, into a floatX shard on the GPU (ZeRO-3:
// its working shard) from which ZeRO-2 gathers the whole working weights (a collective per group)
// and ZeRO-3 each layer when it is needed. The host holds 1/N of the master weights and of the
// gradients, the GPU no fp32 master; checkpoints move the weights a slice at a time, gathered on
// the host (host_zero3_stream).

template <typename floatX>
static int offloads_shard(const Model<floatX>* m) { return m->offload_opt != OPT_OFFLOAD_NONE && zero_shards_grads(m->zero); }

// the host arrays of the step (cpu/host_step.h). The offloaded shard is ZeRO-3 to the host (compact
// shards, nothing gathered there) under either stage: the GPU gathers the weights
template <typename floatX>
static HostStep host_step_of(Model<floatX>* m) {
    HostStep h = {.config = &m->config, .dist = m->dist, .zero = offloads_shard(m) ? ZERO_3 : m->zero, .optimizer = m->optimizer,
                  .num_parameters = m->num_parameters, .params = m->master_memory, .grads = m->opt_offload.host_grads,
                  .state = m->opt_memory, .format = m->state_format, .pack = NULL,  // the exchange a slice at a time: no pack in host memory
                  .pipeline = m->pipeline};
    return h;
}

// ----------------------------------------------------------------------------
// the deferred update (--offload optimizer without --zero, or with --zero 2). The host's step is the
// slow part (d12 on an H100 box: 45 ms of host memory traffic, against a 10 ms forward), and the GPU
// has nothing to do while it runs: the next forward reads what it writes. So model_update only
// records the step (its norm, t, hyperparameters), and the next forward makes it a group at a time,
// just before it reads the group (offload_update_upto, at the hooks outer_weights_ready and
// forward_layers): wte, wpe and lnf before the encoder, layer l's slices before l's block (and l + 1's
// first: l's last kernel computes l + 1's ln1), each group's new weights up behind the kernels already
// queued (the offloaded shard under --zero 2: the group's part of the shard up, then its all-gather
// into the working weights: upload_shard_group). The GPU then runs layer l
// while the host updates layer l + 1. Each slice's update reads only its own gradients and state, so
// this is bit for bit the update at once (cpu/host_step.h's host_update_layer). Whatever else reads
// the weights or the state (a checkpoint, the host view, model_sync) first finishes it
// (offload_update_finish). Under --zero 3 the forward gathers each layer from the shard on the comm
// stream, the next one while a layer computes: so layer l + 1's group is updated and up before layer
// l's kernels are queued, and the comm stream waits for its upload (the event `uploaded`), not for l's
// kernels. Not under --zero 1, whose host exchange follows the whole update.

template <typename floatX>
static int defers_update(const Model<floatX>* m) {
    return m->offload_opt != OPT_OFFLOAD_NONE && (!zero_shards_state(m->zero) || offloads_shard(m));
}

// the step's update is due: recorded for the next forward; under --zero 2 its gathers are counted with
// the step that made them due (print_zero_collectives), under --zero 3 the gathered copies are stale
template <typename floatX>
static void defer_update(Model<floatX>* m, const StepConfig* s, float grad_norm) {
    m->opt_offload.step = *s;
    m->opt_offload.grad_norm = grad_norm;
    m->opt_offload.next_group = 0;
    m->opt_offload.deferred = 1;
    if (offloads_shard(m)) {
        if (m->zero == ZERO_2) { m->exchange.weight_collectives += m->shard.num_zero_groups; } else { zero3_invalidate(m); }
        print_zero_collectives(m, s->t);
    }
}

// the offloaded shard's groups of `layer` (layer l's one, OUTER_GROUP the outer slices' rounds): their
// part of the host's master shard up to the GPU's floatX shard; ZeRO-2 then all-gathers them into the
// working weights on the compute stream, ZeRO-3's comm stream waits for them before its next gather
template <typename floatX>
static void upload_shard_group(Model<floatX>* m, int layer) {
    int g0, g1;
    zero_group_range(m, layer, &g0, &g1);
    const ZeroGroup* first = &m->shard.zero_groups[g0];
    const ZeroGroup* last = &m->shard.zero_groups[g1 - 1];
    size_t at = first->shard_at, n = last->shard_at + last->part - at;  // the groups' parts lie one after another in the shard
    floatX* shard = m->zero == ZERO_3 ? m->weights_memory : m->weight_shard;
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_OFFLOAD_COPY, prof_bytes(n * sizeof(floatX)), "weight shard from the host");
    upload_weights(m, m->master_memory + at, shard + at, n);
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
    if (m->zero == ZERO_3) {
        if (m->exchange.comm == NULL) { return; }
        CUDA_CHECK(cudaEventRecord(m->opt_offload.uploaded, m->stream));
        CUDA_CHECK(cudaStreamWaitEvent(m->exchange.comm_stream, m->opt_offload.uploaded, 0));
        return;
    }
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_COLLECTIVE, prof_bytes(n * m->dist.world * sizeof(floatX)),
                  "NCCL all-gather of the new weights");
    auto weights = [m](int k) { return m->weights_memory + m->slices[k].offset; };
    for (int g = g0; g < g1; g++) {
        zero_gather_shard(&m->shard.zero_groups[g], m->dist.world, shard, weights, (floatX*)m->shard.zero_pack, m->exchange.comm, m->stream);
    }
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
}

// the whole shard up (a checkpoint's load), group by group; ZeRO-3's gathered copies are stale
template <typename floatX>
static void upload_shard(Model<floatX>* m) {
    upload_shard_group(m, OUTER_GROUP);
    for (int l = 0; l < m->config.num_layers; l++) { upload_shard_group(m, l); }
    if (m->zero == ZERO_3) { zero3_invalidate(m); }
}

// the deferred update made and sent up for every group the forward reads up to `layer`'s
// (OUTER_GROUP: the outer slices only)
template <typename floatX>
static void offload_update_upto(Model<floatX>* m, int layer) {
    OptOffloadState* o = &m->opt_offload;
    const GPT2Config* c = &m->config;
    int last = layer == OUTER_GROUP ? 0 : 1 + layer;
    while (o->deferred && o->next_group <= last) {
        int l = o->next_group == 0 ? OUTER_GROUP : o->next_group - 1;
        HostStep h = host_step_of(m);
        int shard = offloads_shard(m);
        size_t n = l == OUTER_GROUP ? outer_weights(c) : layer_weights(c);
        size_t state = optimizer_state_floats_of(c, m->optimizer, o->step.hyper.adafactor.beta1 > 0.0, shard ? m->dist.world : 1,
                                                 m->state_format, l);
        prof_mark_beside(PROF_OPTIMIZER, prof_optimizer(shard ? n / m->dist.world : n, state, sizeof(floatX)), "%s on the host, %s, then up",
                  OPTIMIZER_NAMES[m->optimizer], l == OUTER_GROUP ? "wte, wpe, lnf" : "a layer");
        host_update_layer(&h, &o->step, o->grad_norm, l);
        prof_close();
        if (shard) { upload_shard_group(m, l); } else { upload_group(m, l); }
        o->next_group++;
        o->deferred = o->next_group <= c->num_layers;
    }
}

// whatever the next forward has not made of the deferred update, made now
template <typename floatX>
static void offload_update_finish(Model<floatX>* m) {
    offload_update_upto(m, m->config.num_layers - 1);
}

#endif // CUDA_OFFLOAD_OPTIMIZER_CUH
