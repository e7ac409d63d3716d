/*
zero_exchange.cuh: the gradients' exchange of the CUDA model over NCCL (more than one rank; --zero 1
and 2): each layer's reduction handed to the comm stream as soon as its gradients are final.

A part of train_gpt.cu, included where this section stands there: its functions take the model
(struct Model) and are called at the plain model's named hooks. It does not compile alone.
*/
#ifndef CUDA_ZERO_EXCHANGE_CUH
#define CUDA_ZERO_EXCHANGE_CUH

// ----------------------------------------------------------------------------
// ZeRO (cuda/zero.cuh): a group is one layer's 12 slices, or a round of the outer slices (wte, wpe,
// lnfw, lnfb); each exchange of a group is one NCCL collective through the pack. ZeRO-1 reduce-scatters
// the gradients of the last micro-step's backward (the sums into this rank's blocks of the model's
// gradients); ZeRO-2 every micro-step's, from the working buffer, the sums added to the gradient
// shard; both then all-gather the updated master weights, group by group (cuda/zero_gather.cuh).

// the groups of `layer` [*g0, *g1): layer l's one, OUTER_GROUP the outer slices' rounds, ALL_SLICES every one
template <typename floatX>
static void zero_group_range(const Model<floatX>* m, int layer, int* g0, int* g1) {
    int L = m->config.num_layers;
    *g0 = layer >= 0 ? layer : layer == OUTER_GROUP ? L : 0;
    *g1 = layer >= 0 ? layer + 1 : m->shard.num_zero_groups;
}

// the gradients of the slices of `layer` (or ALL_SLICES) summed over the ranks on `stream`: whole
// on every rank (--zero 0, an all-reduce per slice), or (--zero 1) each group's reduce-scattered
// through the pack and this rank's sums unpacked into its blocks
template <typename floatX>
static void reduce_slices(Model<floatX>* m, int layer, cudaStream_t stream) {
    if (m->zero == ZERO_1) {
        int g0, g1, rank = m->dist.rank;
        zero_group_range(m, layer, &g0, &g1);
        auto grads = [m](int k) { return m->grads_memory + m->slices[k].offset; };
        for (int g = g0; g < g1; g++) {
            zero_pack_cuda(&m->shard.zero_groups[g], 0, m->dist.world, grads, m->shard.zero_pack, stream);
            zero_reduce_scatter(&m->shard.zero_groups[g], rank, m->shard.zero_pack, m->exchange.comm, stream);
            zero_unpack_cuda(&m->shard.zero_groups[g], rank, rank + 1, grads, m->shard.zero_pack, stream);
            m->exchange.grad_collectives++;
        }
        return;
    }
    NCCL_CHECK(ncclGroupStart());
    for_each_slice(&m->config, layer, [m, stream](size_t off, size_t n) {
        NCCL_CHECK(ncclAllReduce(m->grads_memory + off, m->grads_memory + off, n, ncclFloat, ncclSum, m->exchange.comm, stream));
    });
    NCCL_CHECK(ncclGroupEnd());
}

// ZeRO-2, every micro-step, after layer l's backward (OUTER_GROUP: after the encoder's, the outer slices'
// rounds): the comm stream waits for the compute stream, packs the working gradients rank by rank,
// reduce-scatters them and adds this rank's sums to the shard, while the compute stream goes on
// with the next layer. The compute stream clears the working gradients (the layer's, or the whole
// buffer after the outer slices') for their next use, but only once the comm stream has packed them
// (working_taken): the next layer's backward writes the same place. The offloaded shard's last
// backward also copies each group's final sums to the host, behind them on the comm stream
template <typename floatX>
static void zero2_reduce(Model<floatX>* m, int layer) {
    int g0, g1, rank = m->dist.rank;
    zero_group_range(m, layer, &g0, &g1);
    CUDA_CHECK(cudaEventRecord(m->exchange.grads_final, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->exchange.comm_stream, m->exchange.grads_final, 0));
    size_t n = layer == OUTER_GROUP ? outer_weights(&m->config) : layer_weights(&m->config);
    prof_gpu_mark(m->exchange.comm_stream, PROF_STREAM_NCCL, PROF_COLLECTIVE, prof_bytes(n * sizeof(float)), "ZeRO-2 reduce-scatter, during backward");
    auto working = [m](int k) { return param_tensor(&m->grads, m->slices[k].tensor); };
    for (int g = g0; g < g1; g++) {
        const ZeroGroup* zg = &m->shard.zero_groups[g];
        zero_pack_cuda(zg, 0, m->dist.world, working, m->shard.zero_pack, m->exchange.comm_stream);
        CUDA_CHECK(cudaEventRecord(m->shard.working_taken, m->exchange.comm_stream));
        zero_reduce_scatter(zg, rank, m->shard.zero_pack, m->exchange.comm, m->exchange.comm_stream);
        zero_add_cuda(m->grads_memory + zg->shard_at, m->shard.zero_pack + (size_t)rank * zg->part, zg->part, m->exchange.comm_stream);
        if (offloads_shard(m) && m->exchange.reduce_in_backward) {  // the step's last: the group's shard is final, down it goes
            CUDA_CHECK(cudaMemcpyAsync(m->opt_offload.host_grads + zg->shard_at, m->grads_memory + zg->shard_at, zg->part * sizeof(float),
                                       cudaMemcpyDeviceToHost, m->exchange.comm_stream));
        }
        m->exchange.grad_collectives++;
    }
    prof_gpu_close(m->exchange.comm_stream, PROF_STREAM_NCCL);
    float* first = layer == OUTER_GROUP ? m->shard.grad_working : m->grads.ln1w;  // the layer: its 12 tensors, ln1w first
    size_t floats = layer == OUTER_GROUP ? model_shard_layout(m).working : layer_weights(&m->config);
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_ZEROING, prof_bytes(floats * sizeof(float)), "ZeRO-2 working gradients, once packed");
    CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->shard.working_taken, 0));
    CUDA_CHECK(cudaMemsetAsync(first, 0, floats * sizeof(float), m->stream));
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
}

// the last micro-step's backward hands each layer's gradients to the communication stream as
// soon as they are final, so that their reduction overlaps the layers still computing: the
// comm stream waits for the compute stream up to here, then reduces
template <typename floatX>
static void reduce_now_final(Model<floatX>* m, int layer) {
    CUDA_CHECK(cudaEventRecord(m->exchange.grads_final, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->exchange.comm_stream, m->exchange.grads_final, 0));
    size_t n = layer == OUTER_GROUP ? outer_weights(&m->config) : layer_weights(&m->config);
    prof_gpu_mark(m->exchange.comm_stream, PROF_STREAM_NCCL, PROF_COLLECTIVE, prof_bytes(n * sizeof(float)), "NCCL gradient sums, during backward");
    reduce_slices(m, layer, m->exchange.comm_stream);
    prof_gpu_close(m->exchange.comm_stream, PROF_STREAM_NCCL);
}

// the gradients of all ranks' micro-batches, summed (the loss scale already divides by the
// ranks): after a backward that reduced as it went (ZeRO-2: every backward), the compute stream
// only waits for that
template <typename floatX>
static void model_reduce_grads(Model<floatX>* m) {
    if (m->offload_opt != OPT_OFFLOAD_NONE && !offloads_shard(m)) {  // the gradients are (or are on their way) in host memory
        if (m->opt_offload.send_in_backward) { WATCHED_WAIT(cudaStreamSynchronize(m->opt_offload.grad_stream), "the gradients' stream"); }
        m->opt_offload.send_in_backward = 0;
        HostStep h = host_step_of(m);
        if (m->dist.world > 1) { prof_mark(PROF_COLLECTIVE, prof_bytes(m->num_parameters * sizeof(float)), "MPI gradient sums, on the host"); }
        host_reduce_grads(&h);
        prof_close();
        return;
    }
    if (m->exchange.comm == NULL) { return; }
    if (m->exchange.reduce_in_backward || zero_shards_grads(m->zero)) {
        CUDA_CHECK(cudaEventRecord(m->exchange.reduced, m->exchange.comm_stream));
        prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_COLLECTIVE, prof_bytes(0.0), "compute waits for the NCCL stream");
        CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->exchange.reduced, 0));
        prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
        m->exchange.reduce_in_backward = 0;
        if (offloads_shard(m)) { WATCHED_WAIT(cudaEventSynchronize(m->exchange.reduced), "the gradients' reduction"); }  // the shard's copies to the host too
        return;
    }
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_COLLECTIVE, prof_bytes(m->num_parameters * sizeof(float)), "NCCL gradient sums");
    reduce_slices(m, ALL_SLICES, m->stream);
    prof_gpu_close(m->stream, PROF_STREAM_COMPUTE);
}

#endif // CUDA_ZERO_EXCHANGE_CUH
