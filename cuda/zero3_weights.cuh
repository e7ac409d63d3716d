/*
zero3_weights.cuh: ZeRO-3 in the CUDA model (--zero 3): the weights gathered layer by layer on the comm
stream, two layer buffers, the next layer prefetched while one computes.

A part of train_gpt.cu, included where this section stands there: its functions take the model
(struct Model) and are called at the plain model's named hooks. It does not compile alone.
*/
#ifndef CUDA_ZERO3_WEIGHTS_CUH
#define CUDA_ZERO3_WEIGHTS_CUH

// ----------------------------------------------------------------------------
// ZeRO-3: a rank keeps its shards of the weights (fp32 master, floatX working: half the bytes in bf16,
// and what is gathered); the kernels read a working copy. The outer tensors (wte, wpe, lnfw, lnfb) are gathered
// once a step, before the encoder (with AdamW already during the update: zero3_first_updated); each layer before its forward, its backward and each recompute,
// into buffer l % 2, on the comm stream: one ncclAllGather of the floatX shard's layer part into the
// pack, then the unpack into the buffer (cuda/zero.cuh). While layer l computes, the next layer the
// schedule needs is gathered into the other buffer (the forward: l + 1; the backward: l - 1, or the
// first layer of the segment recomputed next). Events order the two streams: the compute stream
// waits for a buffer's gather (gathered[b]) before it reads it; the comm stream waits for a buffer's
// last reader (released[b], recorded after each layer's kernels) before it overwrites it, and at the
// step's first gather for the update that wrote the shard (compute_mark). The update moves the shards
// only; the gathered copies are stale after it (buf_layer, outer_gathered).

// the comm stream waits for everything queued on the compute stream so far
template <typename floatX>
static void comm_after_compute(Model<floatX>* m) {
    CUDA_CHECK(cudaEventRecord(m->zero3.compute_mark, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->exchange.comm_stream, m->zero3.compute_mark, 0));
}

// queues the gather of wte, wpe, lnfw, lnfb into the working copy on the comm stream, after the compute
// stream's work so far (the update that wrote the shard; the last readers of the outer tensors)
template <typename floatX>
static void zero3_queue_outer(Model<floatX>* m) {
    comm_after_compute(m);
    prof_gpu_mark(m->exchange.comm_stream, PROF_STREAM_NCCL, PROF_COLLECTIVE, prof_bytes(outer_weights(&m->config) * sizeof(floatX)),
                  "ZeRO-3: wte, wpe, lnf all-gather");
    auto outer = [m](int k) { return param_tensor(&m->weights, m->slices[k].tensor); };
    for (int g = m->config.num_layers; g < m->shard.num_zero_groups; g++) {
        zero_gather_shard(&m->shard.zero_groups[g], m->dist.world, m->weights_memory, outer, (floatX*)m->shard.zero_pack, m->exchange.comm, m->exchange.comm_stream);
        m->exchange.weight_collectives++;
    }
    prof_gpu_close(m->exchange.comm_stream, PROF_STREAM_NCCL);
    CUDA_CHECK(cudaEventRecord(m->zero3.outer_ready, m->exchange.comm_stream));
    m->zero3.outer_gathered = 1;
}

// wte, wpe, lnfw, lnfb in the working copy before the encoder: gathered once a step (here, or during
// the update: zero3_first_updated), the compute stream waiting for them
template <typename floatX>
static void zero3_gather_outer(Model<floatX>* m) {
    if (m->zero != ZERO_3) { return; }
    if (!m->zero3.outer_gathered) { zero3_queue_outer(m); }
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_COLLECTIVE, prof_bytes(0.0), "compute waits for the ZeRO-3 outer tensors");
    CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->zero3.outer_ready, 0));
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
}

// queues layer l's gather into buffer l % 2 on the comm stream, unless the buffer holds l already
// (or is being gathered into): after the buffer's last reader queued so far
template <typename floatX>
static void zero3_gather_layer(Model<floatX>* m, int l) {
    int b = l % 2;
    if (m->zero3.buf_layer[b] == l) { return; }
    CUDA_CHECK(cudaStreamWaitEvent(m->exchange.comm_stream, m->zero3.released[b], 0));
    prof_gpu_mark(m->exchange.comm_stream, PROF_STREAM_NCCL, PROF_COLLECTIVE, prof_bytes(layer_weights(&m->config) * sizeof(floatX)),
                  "ZeRO-3: layer %d all-gather", l);
    auto layer = [m, b](int k) { return param_tensor(&m->zero3.layer_buf[b], m->slices[k].tensor); };
    zero_gather_shard(&m->shard.zero_groups[l], m->dist.world, m->weights_memory, layer, (floatX*)m->shard.zero_pack, m->exchange.comm, m->exchange.comm_stream);
    prof_gpu_close(m->exchange.comm_stream, PROF_STREAM_NCCL);
    CUDA_CHECK(cudaEventRecord(m->zero3.gathered[b], m->exchange.comm_stream));
    m->zero3.buf_layer[b] = l;
    m->exchange.weight_collectives++;
}

// layer l's weights for the kernels queued next: the model's (ZeRO-1 and 2: once the update's gather of
// them is done), or (ZeRO-3) buffer l % 2, gathered (or its prefetch) awaited by the compute stream
template <typename floatX>
static LayerParams<floatX> weights_of_layer(Model<floatX>* m, int l) {
    if (m->zero != ZERO_3) {
        zero_wait_gathered(m, l);  // ZeRO-1, 2: the update's gather of l (cuda/zero_gather.cuh)
        return layer_params(&m->weights, l, &m->config);
    }
    zero3_gather_layer(m, l);
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_COLLECTIVE, prof_bytes(0.0), "compute waits for layer %d's gather", l);
    CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->zero3.gathered[l % 2], 0));
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
    return layer_params(&m->zero3.layer_buf[l % 2], 0, &m->config);
}

// ZeRO-3: the kernels queued so far are layer l's buffer's last readers; then the gather of layer
// `next` (-1: none) may start in the other buffer, or in this one once they are done
template <typename floatX>
static void zero3_release(Model<floatX>* m, int l, int next) {
    if (m->zero != ZERO_3) { return; }
    CUDA_CHECK(cudaEventRecord(m->zero3.released[l % 2], m->stream));
    if (next >= 0) { zero3_gather_layer(m, next); }
}

// the update of what the next forward reads first is queued (the outer slices and layer 0, which lead
// the shard: shard_block_offsets): with AdamW, whose update makes no NCCL call of its own, their working
// shard is made from the master and their gathers start at once, while the other layers' update
// runs (as cuda/zero_gather.cuh's zero_first_updated for ZeRO-1 and 2); returns the shard's floats
// made, which the update's own conversion then skips
template <typename floatX>
static size_t zero3_first_updated(Model<floatX>* m) {
    if (m->zero != ZERO_3 || m->exchange.comm == NULL || m->optimizer != OPT_ADAMW) { return 0; }
    size_t first = m->shard.zero_groups[0].shard_at + m->shard.zero_groups[0].part;
    if ((void*)m->weights_memory != (void*)m->master_memory) { copy_to_floatX_cuda(m->weights_memory, m->master_memory, first, m->stream); }
    zero3_invalidate(m);
    long counted = m->exchange.weight_collectives;
    zero3_queue_outer(m);
    zero3_gather_layer(m, 0);
    m->exchange.next_weight_collectives = m->exchange.weight_collectives - counted;  // the next forward's, counted with its step
    m->exchange.weight_collectives = counted;
    return first;
}

// the gathered copies are stale: the shard has moved on (the update, a checkpoint's load)
template <typename floatX>
static void zero3_invalidate(Model<floatX>* m) {
    m->zero3.outer_gathered = 0;
    m->zero3.buf_layer[0] = m->zero3.buf_layer[1] = -1;
}

#endif // CUDA_ZERO3_WEIGHTS_CUH
