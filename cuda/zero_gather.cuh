/*
zero_gather.cuh: ZeRO-1 and 2 in the CUDA model (--zero 1, 2, more than one rank): every rank's
updated blocks of the master weights to the other ranks after the update, group by group on the
comm stream, while the next forward runs the layers already gathered.

A part of train_gpt.cu, included where this section stands there: its functions take the model
(struct Model) and are called at the plain model's named hooks. It does not compile alone.
*/
#ifndef CUDA_ZERO_GATHER_CUH
#define CUDA_ZERO_GATHER_CUH

// ----------------------------------------------------------------------------
// Each rank updates its blocks of every slice (cuda/zero.cuh's layout); the others' blocks of the
// master weights are then stale until they are all-gathered. The update only records where it ends
// (zero_update_done; with AdamW the outer slices and layer 0, updated first, are gathered at once
// while the other layers' update runs: zero_first_updated); the next forward queues the rest of the gathers as it
// begins (outer_weights_ready), as Megatron-LM's overlapped parameter gather does: on the comm stream behind the update, in the order
// the forward reads the weights (the outer slices' rounds: wte and wpe for the encoder; then layer
// 0, 1, ...), each group's working weights (bf16) made from the gathered master in the same pass, an
// event recorded for each (gathered[l]; gathered[L]: the outer slices). The compute stream waits for
// a group's event where it first reads it (weights_of_layer, outer_weights_ready), so layer l's
// forward runs while layer l+1's weights cross the network. Bitwise the same as gathering everything
// before the forward: the same copies, at another place on the timeline. Whatever else reads the
// weights (a checkpoint, the next update) has them gathered and waits for all (zero_gathers_done).

// ZeRO-1 and 2 on the GPU: the update writes this rank's blocks, gathers follow it (not ZeRO-3, whose
// forward gathers the shards layer by layer; not the offloaded optimizer, whose host writes the weights)
template <typename floatX>
static int zero_gathers_after_update(const Model<floatX>* m) {
    return (m->zero == ZERO_1 || m->zero == ZERO_2) && m->offload_opt == OPT_OFFLOAD_NONE;
}

// slice k's working weights (the unpack's second destination: cuda/zero.cuh)
template <typename floatX>
static floatX* working_slice(void* model, int k) {
    Model<floatX>* m = (Model<floatX>*)model;
    return m->weights_memory + m->slices[k].offset;
}

// group g's all-gather on the comm stream, its unpacking writing the master weights and (bf16) the
// working weights in one pass; after a layer's, or the outer slices' last round, its event
template <typename floatX>
static void gather_group(Model<floatX>* m, int g) {
    int L = m->config.num_layers, G = m->shard.num_zero_groups;
    auto master = [m](int k) { return m->master_memory + m->slices[k].offset; };
    floatX* (*working)(void*, int) = (void*)m->weights_memory != (void*)m->master_memory ? working_slice<floatX> : NULL;
    prof_gpu_mark(m->exchange.comm_stream, PROF_STREAM_NCCL, PROF_COLLECTIVE, prof_bytes(m->shard.zero_groups[g].part * m->dist.world * sizeof(float)),
                  "ZeRO all-gather of the updated blocks");
    zero_all_gather(&m->shard.zero_groups[g], m->dist.rank, m->dist.world, master, m->shard.zero_pack, m->exchange.comm, m->exchange.comm_stream,
                    working, m);
    if (g == G - 1 || g < L) { CUDA_CHECK(cudaEventRecord(m->shard.gathered[g < L ? g : L], m->exchange.comm_stream)); }
    prof_gpu_close(m->exchange.comm_stream, PROF_STREAM_NCCL);
}

// the update of what the next forward reads first is queued (the outer slices: wte, wpe, lnfw,
// lnfb; layer 0): with AdamW, whose update makes no NCCL call of its own, their gathers start at once
// on the comm stream, while the other layers' update runs (at d12 wte is a third of the model).
// Adafactor and CAME sum their statistics over the ranks with NCCL on the compute stream inside the
// update, and one communicator must not run two collectives at once: theirs wait for the next forward
template <typename floatX>
static void zero_first_updated(Model<floatX>* m) {
    if (!zero_gathers_after_update(m) || m->exchange.comm == NULL || m->optimizer != OPT_ADAMW) { return; }
    CUDA_CHECK(cudaEventRecord(m->shard.updated, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->exchange.comm_stream, m->shard.updated, 0));
    for (int g = m->config.num_layers; g < m->shard.num_zero_groups; g++) { gather_group(m, g); }
    gather_group(m, 0);
    m->shard.first_queued = 1;
}

// the whole update is queued on the compute stream: the rest of its blocks are to go to every rank
// before the weights are read again; the comm stream's next work waits for it
template <typename floatX>
static void zero_update_done(Model<floatX>* m) {
    CUDA_CHECK(cudaEventRecord(m->shard.updated, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->exchange.comm_stream, m->shard.updated, 0));
    int L = m->config.num_layers;
    m->shard.next_gather = m->shard.first_queued ? (L > 1 ? 1 : -1) : L;  // layer 1, or the outer rounds first
    m->shard.first_queued = 0;
    m->exchange.weight_collectives += m->shard.num_zero_groups;  // counted with the step that made them due
}

// where group g stands in the forward's order: the outer slices' rounds (groups L .. G-1), then
// layer 0, 1, ... (groups 0 .. L-1)
template <typename floatX>
static int gather_position(const Model<floatX>* m, int g) {
    int L = m->config.num_layers, rounds = m->shard.num_zero_groups - L;
    return g >= L ? g - L : rounds + g;
}

// queues the due gathers in the forward's order up to layer `layer`'s (OUTER_GROUP: the outer
// slices'), a few at a time as the forward reaches them: queueing them all at once would hold the
// host (a layer's gather is some twenty CUDA calls) before the encoder
template <typename floatX>
static void zero_gather_upto(Model<floatX>* m, int layer) {
    int L = m->config.num_layers, G = m->shard.num_zero_groups;
    int last = gather_position(m, layer == OUTER_GROUP ? G - 1 : layer);
    while (m->shard.next_gather >= 0 && gather_position(m, m->shard.next_gather) <= last) {
        int g = m->shard.next_gather;
        gather_group(m, g);
        m->shard.next_gather = g == G - 1 ? 0 : g == L - 1 ? -1 : g + 1;
    }
}

// the compute stream waits for the gather of layer l's weights (OUTER_GROUP: the outer slices'),
// queued here if still due, with the next ZERO_GATHER_AHEAD layers' behind it (so that they cross the
// network while l computes, and a layer's unpacking kernels, which share the GPU with l's, are done
// before its forward)
#define ZERO_GATHER_AHEAD 2
template <typename floatX>
static void zero_wait_gathered(Model<floatX>* m, int layer) {
    if (!zero_gathers_after_update(m) || m->exchange.comm == NULL) { return; }
    int L = m->config.num_layers, ahead = (layer == OUTER_GROUP ? -1 : layer) + ZERO_GATHER_AHEAD;
    zero_gather_upto(m, ahead < L ? ahead : L - 1);
    CUDA_CHECK(cudaStreamWaitEvent(m->stream, m->shard.gathered[layer == OUTER_GROUP ? L : layer], 0));
}

// every gather queued, and the compute stream waits for them all (the comm stream runs them in
// order: the last layer's is the last)
template <typename floatX>
static void zero_gathers_done(Model<floatX>* m) {
    zero_wait_gathered(m, m->config.num_layers - 1);
}

#endif // CUDA_ZERO_GATHER_CUH
