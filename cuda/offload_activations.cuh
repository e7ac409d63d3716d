/*
offload_activations.cuh: activation offload and checkpointing in the CUDA model (--offload
activations, --recompute): the copy stream that moves blocks and segment inputs to pinned host
memory and back, ordered by events; the schedule is llmc/act_policy.h's.

A part of train_gpt.cu, included where this section stands there: its functions take the model
(struct Model) and are called at the plain model's named hooks. It does not compile alone.
*/
#ifndef CUDA_OFFLOAD_ACTIVATIONS_CUH
#define CUDA_OFFLOAD_ACTIVATIONS_CUH

// ----------------------------------------------------------------------------
// offload: the copy stream moves a slot's block (or a segment input) to the pinned host store
// after its forward and back before its backward, while the compute stream goes on. Events order
// the two: a copy waits for the compute work before it (compute_done), the compute stream waits
// for a slot's copy to the host before it writes the slot again (slot_saved), and for a copy
// from the host before it reads what came back (slot_loaded, staging_loaded). The schedule
// (act_policy.h) keeps three slots so that a block can come back while the layer before it in
// backward computes, and leaves the last three layers in their slots.

// the compute stream waits for a copy (event e on the copy stream). The wait is framed by two
// timing events, so that the time it stalled the compute stream (the copy that did not overlap)
// can be added up after the step (gpt2_copy_wait_ms); past OFFLOAD_MAX_WAITS a step's waits are
// not timed
template <typename floatX>
static void compute_waits_for_copy(Model<floatX>* m, cudaEvent_t e) {
    int w = m->offload.waits < OFFLOAD_MAX_WAITS ? m->offload.waits++ : -1;
    prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_COPY_WAIT, prof_bytes(0.0), "compute waits for the copy stream");
    if (w >= 0) { CUDA_CHECK(cudaEventRecord(m->offload.wait_marks[2 * w], m->stream)); }
    CUDA_CHECK(cudaStreamWaitEvent(m->stream, e, 0));
    if (w >= 0) { CUDA_CHECK(cudaEventRecord(m->offload.wait_marks[2 * w + 1], m->stream)); }
}

// the milliseconds the compute stream stood still waiting for copies since the last call
template <typename floatX>
static double copy_wait_ms(Model<floatX>* m) {
    double total = 0.0;
    for (int w = 0; w < m->offload.waits; w++) {
        float ms;
        WATCHED_WAIT(cudaEventSynchronize(m->offload.wait_marks[2 * w + 1]), "a timed wait");
        CUDA_CHECK(cudaEventElapsedTime(&ms, m->offload.wait_marks[2 * w], m->offload.wait_marks[2 * w + 1]));
        total += ms;
    }
    m->offload.waits = 0;
    return total;
}

// the copy stream waits for everything queued on the compute stream so far
template <typename floatX>
static void copy_after_compute(Model<floatX>* m) {
    CUDA_CHECK(cudaEventRecord(m->offload.compute_done, m->stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->offload.copy_stream, m->offload.compute_done, 0));
}

// checkpointing + offload: queues the copy of segment s's input from the host store into its
// staging buffer, unless it holds it or is being filled with it: after the compute work queued so
// far (the buffer's last reader, the segment two after s)
template <typename floatX>
static void fetch_segment_input(Model<floatX>* m, int s, size_t bytes) {
    int b = s % ACT_STAGING_BUFFERS;
    if (m->acts->offload.staging_segment[b] == s) { return; }
    copy_after_compute(m);
    prof_gpu_mark(m->offload.copy_stream, PROF_STREAM_COPY, PROF_OFFLOAD_COPY, prof_bytes((double)bytes), "from the host");
    CUDA_CHECK(cudaMemcpyAsync(m->acts->staging[b], m->acts->seg_inputs[s], bytes, cudaMemcpyHostToDevice, m->offload.copy_stream));
    prof_gpu_close(m->offload.copy_stream, PROF_STREAM_COPY);
    CUDA_CHECK(cudaEventRecord(m->acts->offload.staging_loaded[b], m->offload.copy_stream));
    m->acts->offload.staging_segment[b] = s;
}

// after layer l's forward, what the schedule (act_policy.h) keeps: the next segment's input in
// GPU memory, or (offload) that input or l's whole block copied to the host store
template <typename floatX>
static void store_after_forward(Model<floatX>* m, int l, size_t BTC) {
    int L = m->config.num_layers, slot = act_slot_of(&m->act, L, l);
    ActStore st = act_after_forward(&m->act, L, l);
    LayerActs<floatX>* la = act_layer(m, l);
    if (m->act.offload && m->act.segment == 0) { m->acts->offload.slot_layer[slot] = l; }  // stored or not (the last layers)
    size_t bytes = BTC * sizeof(floatX);
    if (st.segment_input >= 0 && !m->act.offload) {
        prof_gpu_mark(m->stream, PROF_STREAM_COMPUTE, PROF_OFFLOAD_COPY, prof_bytes(2.0 * bytes), "segment input, on the GPU");
        CUDA_CHECK(cudaMemcpyAsync(m->acts->seg_inputs[st.segment_input], la->residual3, bytes, cudaMemcpyDeviceToDevice, m->stream));
        return;
    }
    if (st.segment_input < 0 && st.offload_layer < 0) { return; }
    copy_after_compute(m);
    prof_gpu_mark(m->offload.copy_stream, PROF_STREAM_COPY, PROF_OFFLOAD_COPY,
                  prof_bytes(st.segment_input >= 0 ? (double)bytes : (double)m->offload.layer_bytes), "to the host");
    if (st.segment_input >= 0) {
        int* held = &m->acts->offload.staging_segment[st.segment_input % ACT_STAGING_BUFFERS];
        if (*held == st.segment_input) { *held = -1; }  // last step's copy of it is stale
        CUDA_CHECK(cudaMemcpyAsync(m->acts->seg_inputs[st.segment_input], la->residual3, bytes, cudaMemcpyDeviceToHost, m->offload.copy_stream));
    } else {
        CUDA_CHECK(cudaMemcpyAsync(m->acts->offload.host_store + (size_t)l * m->offload.layer_bytes, la->ln1, m->offload.layer_bytes, cudaMemcpyDeviceToHost,
                                   m->offload.copy_stream));
    }
    prof_gpu_close(m->offload.copy_stream, PROF_STREAM_COPY);
    CUDA_CHECK(cudaEventRecord(m->acts->offload.slot_saved[slot], m->offload.copy_stream));
    m->acts->offload.slot_saving[slot] = 1;
    if (st.segment_input == act_num_segments(&m->act, L) - 1) {  // the backward reads it first: it comes
        fetch_segment_input(m, st.segment_input, bytes);         // back at once, behind the last segment's forward
    }
}


// before layer l's forward writes its slot: the compute stream waits for the copy of what the slot
// held to the host, if one is queued that it has not waited for
template <typename floatX>
static void wait_slot_saved(Model<floatX>* m, int l) {
    int slot = act_slot_of(&m->act, m->config.num_layers, l);
    if (!m->acts->offload.slot_saving[slot]) { return; }
    compute_waits_for_copy(m, m->acts->offload.slot_saved[slot]);
    m->acts->offload.slot_saving[slot] = 0;
}

// offload: queues the copy of layer l's block from the host store into its slot, unless the slot
// holds it or is being filled with it: after the compute work queued so far (the slot's last
// reader, a later layer's backward)
template <typename floatX>
static void fetch_layer(Model<floatX>* m, int l) {
    int slot = act_slot_of(&m->act, m->config.num_layers, l);
    if (m->acts->offload.slot_layer[slot] == l) { return; }
    copy_after_compute(m);
    prof_gpu_mark(m->offload.copy_stream, PROF_STREAM_COPY, PROF_OFFLOAD_COPY, prof_bytes((double)m->offload.layer_bytes), "from the host");
    CUDA_CHECK(cudaMemcpyAsync(m->acts->slots[slot].ln1, m->acts->offload.host_store + (size_t)l * m->offload.layer_bytes, m->offload.layer_bytes,
                               cudaMemcpyHostToDevice, m->offload.copy_stream));
    prof_gpu_close(m->offload.copy_stream, PROF_STREAM_COPY);
    CUDA_CHECK(cudaEventRecord(m->acts->offload.slot_loaded[slot], m->offload.copy_stream));
    m->acts->offload.slot_layer[slot] = l;
}

// before layer l's backward, as the schedule (act_policy.h) says: a segment input back from the
// host, a segment's forward again, blocks back from the host (l's, and its input's layer l-1).
// What l needs was queued one layer (or segment) earlier where the schedule allows, so that its
// copy ran while the layers after it computed; the compute stream waits for it here, and the next
// copy is queued before l's kernels, to run while they do. (The first step's first waits, and
// those of a model of a few layers, find nothing queued early: they copy and wait at once.)
template <typename floatX>
static void prepare_backward(Model<floatX>* m, int l, int B, int T) {
    int L = m->config.num_layers;
    ActBackwardPlan bp = act_before_backward(&m->act, L, l);
    if (bp.restore_segment >= 0) {
        size_t bytes = tp_rows_cuda(&m->tp, (size_t)B * T) * m->config.channels * sizeof(floatX);  // --sp: a rank's rows
        fetch_segment_input(m, bp.restore_segment, bytes);
        if (bp.prefetch_segment >= 0) { fetch_segment_input(m, bp.prefetch_segment, bytes); }
        compute_waits_for_copy(m, m->acts->offload.staging_loaded[bp.restore_segment % ACT_STAGING_BUFFERS]);
    }
    if (bp.recompute_segment >= 0) {
        forward_layers(m, bp.recompute_first, bp.recompute_last, segment_input(m, bp.recompute_segment), B, T, 0);
    }
    for (int i = 0; i < 2; i++) {
        if (bp.fetch[i] >= 0) { fetch_layer(m, bp.fetch[i]); }
    }
    if (bp.prefetch >= 0) { fetch_layer(m, bp.prefetch); }  // into the slot l+1's backward, queued, is done with
    for (int i = 0; i < 2; i++) {  // l's block and l-1's output (l's input) must be back before l's backward
        if (bp.fetch[i] >= 0) { compute_waits_for_copy(m, m->acts->offload.slot_loaded[act_slot_of(&m->act, L, bp.fetch[i])]); }
    }
}

#endif // CUDA_OFFLOAD_ACTIVATIONS_CUH
