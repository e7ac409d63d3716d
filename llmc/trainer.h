/*
trainer.h: the training program, written once for every backend: the option checks,
the model from a preset or a file, the memory plan and check, resume, the progress
lines and the JSON log, validation, sampling, checkpoints, stop signals, and the loop.

With --sample it trains nothing: it loads a model file and continues a prompt (the last
section: the prompt through GPT-2's BPE, bpe.h; the next token by sampler.h).

A backend is the model's tensors in some memory and the kernels that compute on them:
train_gpt.c (the CPU, fp32) and train_gpt.cu (CUDA). It defines `struct GPT2` and the
functions declared under "the backend" below, then includes this file; its main() is

    int main(int argc, char** argv) { return train_main(argc, argv); }

The loop calls nothing else of the backend, so every program trains, checkpoints,
resumes, logs and plans memory the same way, and a checkpoint of one resumes in the
other. Reading order: the backend interface, the model from the flags, checkpoints,
sampling and validation, the checks before anything is allocated, then the run in four
parts (set-up, one step, what happens between steps, teardown), --sample, and train_main.
*/
#ifndef LLMC_TRAINER_H
#define LLMC_TRAINER_H

#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include "utils.h"
#include "rand.h"
#include "flags.h"
#include "model_config.h"
#include "opt_layout.h"
#include "schedule.h"
#include "act_policy.h"
#include "memory.h"
#include "planner.h"
#include "plan_search.h"
#include "dataloader.h"
#include "tokenizer.h"
#include "bpe.h"
#include "sampler.h"
#include "checkpoint.h"
#include "distributed.h"
#include "dist_settings.h"
#include "profile.h"
#include "pipeline.h"
#include "relayout.h"

// ----------------------------------------------------------------------------
// the backend: the only functions of the program with external linkage, one definition
// each in train_gpt.c or train_gpt.cu

typedef struct GPT2 GPT2;  // the backend's model: its tensors, in its memory


// what the weights and activations are stored in; master weights, gradients of the weights,
// optimizer state and every sum are fp32 in both
typedef enum { PRECISION_FP32, PRECISION_BF16, NUM_PRECISIONS } Precision;
static const char* PRECISION_NAMES[NUM_PRECISIONS] = {"fp32", "bf16"};

// what a model is allocated for: training (the weights, their gradients, the optimizer state,
// what forward keeps for backward, backward's buffers), or sampling (the weights and what one
// forward computes: no gradients, optimizer state or backward buffers)
typedef enum { MODEL_FOR_TRAINING, MODEL_FOR_SAMPLING } ModelUse;

// everything a backend needs to allocate a model
typedef struct {
    GPT2Config config;
    int B, T;                 // the micro-batch the activations are sized for
    Precision precision;      // --precision
    OptimizerKind optimizer;
    int use_beta1;            // Adafactor keeps a first moment
    QStateFormat state_format;  // --optimizer-state: the moments in fp32, bf16 or 8 bits (llmc/quant_state.h)
    ActPolicy act;            // what forward keeps for backward, and where (--recompute, --offload activations)
    OptOffload offload_optimizer;  // --offload optimizer[,gradients]: master weights, state, the update (and gradients) on the host
    Dist dist;                // this process among the data-parallel ranks (its data-parallel group: the world without --tp)
    Dist world;               // every process: the files each rank writes, rank 0's output
    Dist tensor;              // --tp: this process in its tensor-parallel group, which splits each layer ({0, 1}: none)
    Dist pipeline, pair;      // --pp: this process among the stages (its rank: its stage; {0, 1}: none), and wte's pair
    PpSchedule pp_schedule;   // --pp-schedule (llmc/pipeline.h)
    int pp_held;              // --pp: the micro-batches whose activations this stage holds at once (1 without)
    ZeroStage zero;           // ZERO_1: this rank keeps its blocks of the optimizer state only
    ModelUse use;             // MODEL_FOR_SAMPLING: forward only (--sample)
} ModelSetup;

// the setup's groups of one process in `world` (dist_grid_of_one: no --tp, no --pp, the data group the
// world): a sample's model, and a model a test or tool builds without the trainer's options
static void setup_groups_of_one(ModelSetup* s, Dist world) {
    DistGrid one = dist_grid_of_one(world);
    s->dist = one.data;
    s->world = one.world;
    s->tensor = one.tensor;
    s->pipeline = one.pipeline;
    s->pair = one.pair;
}

// the shapes of this rank's tensors: the model's, or with --tp its slices of them (model_config.h), or
// with --pp its stage's part (llmc/pipeline.h)
static GPT2Config setup_rank_config(const ModelSetup* s) {
    GPT2Config tp = gpt2_rank_config(&s->config, s->tensor.world);
    return pp_stage_config(&tp, s->pipeline.world, s->pipeline.rank);
}

// this rank's optimizer state, in host memory, as the state files hold it (the CPU backend's
// own tensor; a GPU's copy). The weights go through gpt2_params_stream
typedef struct {
    float* opt_state;         // (opt_floats) in opt_layout.h's layout
    size_t opt_floats;
} HostView;

typedef enum { SYNC_TO_HOST, SYNC_FROM_HOST } SyncDirection;

// the fp32 weights a chunk at a time, in model_config.h's order: fn(ctx, offset, chunk, n) for
// consecutive chunks that cover the P weights (chunk holds the n from `offset` on). PARAMS_READ:
// fn reads them, brought up to date first; PARAMS_READ_AGAIN: nothing changed since the last
// PARAMS_READ or gpt2_sync(SYNC_TO_HOST) (a backend that keeps a whole host copy hands it over as
// it is); PARAMS_WRITE: fn fills each chunk and the backend takes it. Every rank calls it alike: under
// --zero 3 (and a GPU's --zero 2 --offload optimizer) each chunk is gathered from the ranks' blocks
// (read) or each rank keeps its blocks (write)
typedef enum { PARAMS_READ, PARAMS_READ_AGAIN, PARAMS_WRITE } ParamsAccess;
typedef void (*ParamChunkFn)(void* ctx, size_t offset, float* chunk, size_t n);

// the backend's name for messages ("the CPU backend"), its default precision, and whether it
// trains in p; a setup it cannot train (a flag it does not implement) stops here with a message
const char* gpt2_backend_name(void);
// the largest --tp the backend splits a layer over (1: none yet), and --pp the stages it runs
int gpt2_tp_max(void);
int gpt2_pp_max(void);
// why the backend cannot run --pp with this schedule, ZeRO stage, --offload optimizer (0 or 1) and --loss-chunk
// (a message and its hint line), or NULL: the trainer stops with it before any work, and --plan's search
// leaves the combination out
const char* gpt2_pp_refusal(PpSchedule schedule, ZeroStage zero, int offload_optimizer, int loss_chunk);
// the highest --zero stage the backend builds (ZeroStage); the trainer refuses the ones above
int gpt2_zero_max_stage(void);
Precision gpt2_default_precision(void);
void gpt2_check_setup(const ModelSetup* s);
// the GPU this rank trains on (the node-local rank's), before anything touches a device; a
// backend without a device does nothing
void gpt2_select_device(const Dist* d);
// several processes that MPI does not join (dist_by_env()): start the carrier of their collectives
// (dist_set_carrier) with method (--dist-init), or stop saying why this backend cannot
void gpt2_dist_start(Dist* d, const char* method);
// the device: memory free for this process's tensors, memory this process has taken since it
// started (cudaMemGetInfo) with *accounted the part the accounting allocator handed out, and
// the peak FLOP/s of precision p (0: unknown); a backend without a device answers 0 to all
// (its "device" categories are host memory)
size_t gpt2_device_free_bytes(void);
size_t gpt2_device_bytes_used(size_t* accounted);
// 1 if the device's work is modelled, not run (the emulated device's CUDA_EMU_EXECUTE=0: what the
// host reads back is zeros): the weights need no initialization nor checksum, and the host memory
// the plan counts is the modelled machine's, not this one's
int gpt2_device_is_modelled(void);
double gpt2_peak_flops(Precision p);
// 1 if the backend's "device" categories are a device's memory (CUDA, with a GPU present or
// not); 0 if they are host memory like the rest (the CPU: one budget covers everything)
int gpt2_has_device(void);
// flash attention (--attention flash) for heads of head_size channels: NULL if the backend runs
// it, else why not (for the message); and whether it is the backend's default (--attention "")
const char* gpt2_flash_refusal(int head_size);
int gpt2_prefers_flash(void);
// the rates of the planner's step-cost model (planner.h: CostModel) in precision p: the GPU's
// where it is known (by its name), else stated defaults
CostModel gpt2_cost_model(Precision p);
// the bytes of the backend's tensors for micro-batches of (B,T), for the memory plan; the head's
// for chunks of loss_chunk tokens (--loss-chunk; 0: the whole batch)
BackendLayout gpt2_layout(const GPT2Config* c, int B, int T, Precision p, const ActPolicy* act);  // act: its flash, loss_chunk, sp
// allocates every tensor of a model (through memory.h, by category); the weights are unset
GPT2* gpt2_create(const ModelSetup* s);
void gpt2_destroy(GPT2* m);
// the host copies of the weights and the optimizer state (none when sampling), and bringing them up to date:
// SYNC_TO_HOST before they are read (checkpoints), SYNC_FROM_HOST after they are written
HostView gpt2_host_view(GPT2* m);
void gpt2_sync(GPT2* m, SyncDirection dir);
void gpt2_params_stream(GPT2* m, ParamsAccess how, ParamChunkFn fn, void* ctx);
// inputs, targets (B,T) token ids, targets may be NULL; returns the mean loss (-1 without targets)
float gpt2_forward(GPT2* m, const int* inputs, const int* targets, int B, int T);
// a training micro-step's forward: gpt2_forward, and with --loss-chunk also the head's part of the
// backward (the logits' gradient into wte's and the final LayerNorm output's, act_policy.h), which
// must happen while each chunk's logits exist; the gpt2_backward after it takes the same loss_scale
float gpt2_forward_train(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale);
// --pp: the activations of the held micro-batch `slot` (of `slots`) in hand for the next forward or
// backward; and a message of the stage's list (llmc/pipeline.h) over the pipeline group: a receive
// (its micro-batch's slot in hand first), a send, or with `next` (a.with_next) the send and the
// receive after it as one exchange. The backend's buffers: the stage input, the stage output, and
// the gradient of either (B*T*C each); MPI on the CPU, the GPU's own collectives there
void gpt2_pp_slot(GPT2* m, int slot);
void gpt2_pp_message(GPT2* m, PpAction a, const PpAction* next, int slots);
// the (Vp) next-token probabilities at position b*T + t of the last forward, in host memory (with
// --loss-chunk only its last chunk's, sampling asks for the last position; none after gpt2_forward_train)
const float* gpt2_probs(GPT2* m, int position);
// before the step's first gpt2_forward_train (with --loss-chunk the forward adds to wte's gradient)
void gpt2_zero_grad(GPT2* m);
// accumulates d(loss_scale * the sum of the position losses of the last forward) into the gradients
void gpt2_backward(GPT2* m, const int* inputs, const int* targets, int B, int T, float loss_scale);
// the next gpt2_backward is the step's last micro-step: a backend may exchange each layer's
// gradients as soon as they are final, overlapping the layers still computing
void gpt2_reduce_during_backward(GPT2* m);
// sums the ranks' gradients: whole (--zero 0) or each rank its blocks (--zero 1); after a
// backward that reduced as it went, only what is left (a GPU: waiting for it)
void gpt2_reduce_grads(GPT2* m);
float gpt2_grad_norm(GPT2* m);
// --offload: the milliseconds of this step the computation stood still waiting for copies to or
// from the host store (the copy time that did not overlap), -1 where nothing is copied or timed
double gpt2_copy_wait_ms(GPT2* m);
// clips the gradients to s->grad_clip given their global norm and takes one optimizer step
void gpt2_update(GPT2* m, const StepConfig* s, float grad_norm);
// --profile (profile.h): begin waits for the device, so that the profiled step's time is its own;
// end waits for it and adds every range's time into the table; timing says how ranges are timed
void gpt2_profile_begin(GPT2* m);
void gpt2_profile_end(GPT2* m);
const char* gpt2_profile_timing(void);
// the machine's limits for --profile's roof column, measured after the profiled step (0: not known)
ProfRoofline gpt2_profile_roofline(void);

// ----------------------------------------------------------------------------
// the model from -e: a preset initialised randomly, or a model file

static int model_is_preset(const TrainOptions* o, GPT2Config* cfg) {
    return gpt2_config_preset(cfg, o->model);
}

// "-x (--steps)", or "--zero" for a flag without a short name
static void flag_display_name(const FlagSpec* f, char* buf, size_t n) {
    if (f->shortname) { snprintf(buf, n, "%s (%s)", f->shortname, f->longname); } else { snprintf(buf, n, "%s", f->longname); }
}

// stops if path, named by flag, is there but is a directory or cannot be read (a missing file
// is the reader's to report, with its hint)
static void check_input_file(const char* short_flag, const char* path, const char* what) {
    char flag[64];
    flag_display_name(find_flag(short_flag, strlen(short_flag)), flag, sizeof(flag));
    struct stat st;
    if (stat(path, &st) != 0) { return; }
    if (S_ISDIR(st.st_mode)) {
        fail("%s '%s' is a directory, where a %s is expected\n  hint: name the file in it: %s '%s/FILE'", flag, path, what, flag, path);
    }
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        fail("%s '%s': %s (a %s this run reads)\n  hint: make it readable (chmod a+r '%s') or use a copy you can read",
             flag, path, errno == EACCES ? "permission denied" : strerror(errno), what, path);
    }
    fclose(f);
}

static void resolve_model_config(const TrainOptions* o, GPT2Config* cfg) {
    if (model_is_preset(o, cfg)) { return; }
    check_input_file("-e", o->model, "model file");
    FILE* f = fopen(o->model, "rb");
    if (f == NULL) {
        char names[GPT2_PRESET_LIST_LEN];
        gpt2_preset_list(names, sizeof(names));
        fail("-e '%s' is neither a preset (%s) nor a readable model file", o->model, names);
    }
    fclose(f);
    int version;
    fclose(model_file_open(o->model, cfg, &version));
}

// ----------------------------------------------------------------------------
// the weights in and out, a chunk at a time (gpt2_params_stream): from the seeded initialisation
// or a model file, to a model file, and their hash and largest |w|

// the largest |w| of the weights, NaN or infinity if one is not finite
static float params_max_abs(const float* params, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(params[i]);
        if (!(a <= m)) { m = a; }  // a NaN sticks
        if (isnan(m)) { break; }
    }
    return m;
}

// the weights' hash, largest |w| (NaN sticks) and the CRC-32 of their bytes (the model file's
// checksum), taken chunk by chunk
typedef struct { uint64_t hash; float max_abs; uint32_t crc; } ParamsDigest;

static void params_digest_more(ParamsDigest* d, const float* chunk, size_t n) {
    d->hash = params_hash_more(d->hash, chunk, n);
    d->crc = crc32_update(d->crc, chunk, n * sizeof(float));
    float m = params_max_abs(chunk, n);
    if (!isnan(d->max_abs) && !(m <= d->max_abs)) { d->max_abs = m; }
}
static void digest_chunk(void* ctx, size_t offset, float* chunk, size_t n) { (void)offset; params_digest_more((ParamsDigest*)ctx, chunk, n); }

// the model's weights now (a collective where the ranks hold blocks of them: every rank calls it)
static ParamsDigest params_digest(GPT2* m, ParamsAccess how) {
    ParamsDigest d = {.hash = FNV64_OFFSET, .max_abs = 0.0f, .crc = 0};
    gpt2_params_stream(m, how, digest_chunk, &d);
    return d;
}

// where the weights come from: the seeded initialisation, or an open model file (each chunk
// checked finite, and hashed as it is read)
typedef struct {
    ParamInit init;
    FILE* f;                  // NULL: the initialisation
    const char* path;
    GPT2Config cfg;
    int version;
    uint64_t hash;            // of what the file held
    uint32_t crc;             // of the bytes it held (model_file_check_sum)
} WeightSource;

static void weights_chunk(void* ctx, size_t offset, float* chunk, size_t n) {
    WeightSource* w = (WeightSource*)ctx;
    if (w->f == NULL) { gpt2_init_params_next(&w->init, chunk, n); return; }
    model_file_read_chunk(w->f, w->path, &w->cfg, w->version, chunk, offset, n);
    w->hash = params_hash_more(w->hash, chunk, n);
    w->crc = crc32_update(w->crc, chunk, n * sizeof(float));  // (fp32 files: the bytes read; bf16 files record no CRC)
}

// the model's weights from the model file at path (its header read: f at the first tensor, cfg its
// shape); closes f and returns the weights' hash
static uint64_t load_model_file(GPT2* m, FILE* f, const char* path, const GPT2Config* cfg, int version) {
    WeightSource w = {.init = gpt2_param_init(cfg, 0), .f = f, .path = path, .cfg = *cfg, .version = version, .hash = FNV64_OFFSET, .crc = 0};
    gpt2_params_stream(m, PARAMS_WRITE, weights_chunk, &w);
    fclose(f);
    model_file_check_sum(path, w.crc);
    return w.hash;
}

// fills the allocated model's weights from -e (seeded initialisation or the file)
static void gpt2_init_weights(GPT2* m, const TrainOptions* o) {
    GPT2Config cfg;
    if (gpt2_device_is_modelled()) {   // nothing computes on them: a d84's 12 billion draws skipped
        printf("the device is modelled, not run (CUDA_EMU_EXECUTE=0): the weights are left uninitialized\n");
        return;
    }
    if (model_is_preset(o, &cfg)) {
        WeightSource w = {.init = gpt2_param_init(&cfg, o->seed), .f = NULL, .path = NULL, .cfg = cfg, .version = 0, .hash = 0, .crc = 0};
        gpt2_params_stream(m, PARAMS_WRITE, weights_chunk, &w);
    } else {
        int version;
        FILE* f = model_file_open(o->model, &cfg, &version);
        load_model_file(m, f, o->model, &cfg, version);
    }
}

// rank 0 writes what it is handed into the model file (the other ranks take part in the gathers)
static void model_file_chunk(void* ctx, size_t offset, float* chunk, size_t n) {
    (void)offset;
    if (ctx != NULL) { atomic_write((AtomicFile*)ctx, chunk, sizeof(float), n); }
}

// ----------------------------------------------------------------------------
// checkpoints: model file + training state + DONE marker (checkpoint.h)

// stops the run unless every rank holds the same weights (costs one pass over them)
static void check_replicas(GPT2* m, Dist dist, int step) {
    uint64_t lo, hi;
    dist_min_max_u64(params_digest(m, PARAMS_READ).hash, &lo, &hi);
    if (lo != hi) {
        fail("replicas: the parameters differ between ranks after step %d (hashes 0x%016llx .. 0x%016llx)\n"
             "  hint: a bug in the data-parallel step; rerun with --check-replicas 1 to find the first bad step",
             step, (unsigned long long)lo, (unsigned long long)hi);
    }
    printf("replicas: parameters identical on %d ranks after step %d (hash 0x%016llx)\n", dist.world, step, (unsigned long long)lo);
}

// whether every rank holds the whole fp32 weights, replicas that --check-replicas can compare: not
// under ZeRO-3 (each rank keeps its blocks), nor under ZeRO-2 with --offload optimizer (each rank's
// host memory keeps its blocks of the master weights: train_gpt.cu's offloaded shard)
static int ranks_hold_replicas(int zero, OptOffload offload_optimizer) {
    return zero < ZERO_3 && !(zero == ZERO_2 && offload_optimizer != OPT_OFFLOAD_NONE);
}

// rank 0 writes the model file (every rank takes part: under ZeRO-3 each slice is gathered), every
// rank its own state file (its data position and, under ZeRO-1, 2 and 3, its blocks of the
// optimizer state); once all have written, rank 0 marks DONE. A
// DONE marker of the same step, left by an earlier write of it, goes first. Returns the
// weights' max |w|; if they are not finite (every rank has the same), nothing is written
static float save_checkpoint(GPT2* m, const ModelSetup* s, const char* dir, int step, const DataLoader* dl, uint64_t rng,
                             uint64_t run_id) {
    // ZeRO-3's ranks hold no replicas (nor the offloaded shard's): the model is gathered from their blocks,
    // the same on every rank
    if (s->world.world > 1 && ranks_hold_replicas(s->zero, s->offload_optimizer)) { check_replicas(m, s->world, step); }
    gpt2_sync(m, SYNC_TO_HOST);  // the weights' and the optimizer state's host copies (a GPU's)
    ParamsDigest d = params_digest(m, PARAMS_READ_AGAIN);
    HostView h = gpt2_host_view(m);
    GPT2Config rank_config = setup_rank_config(s);
    size_t P = gpt2_num_parameters(&rank_config);  // --tp: the rank's slices, which its state is of
    if (!isfinite(d.max_abs)) { return d.max_abs; }
    int rank = s->world.rank;
    if (rank == 0) { checkpoint_mark_writing(dir, step); checkpoint_unmark_done(dir, step); checkpoint_remove_states_from(dir, step, s->world.world); }
    dist_barrier();  // no rank writes a file of this step before its WRITING record, or while an old DONE marker stands
    checkpoint_begin(dir, step, rank);
    char path[CHECKPOINT_PATH_LEN];
    AtomicFile model;
    if (rank == 0) {
        checkpoint_path(path, sizeof(path), dir, "model", step, -1);
        model_file_write_header(&model, path, &s->config, d.crc);
    }
    gpt2_params_stream(m, PARAMS_READ_AGAIN, model_file_chunk, rank == 0 ? &model : NULL);
    if (rank == 0) { atomic_commit(&model); }
    TrainState st = {.num_processes = s->world.world, .rank = rank, .step = step, .data_shard = (int)dl->shard,
                     .data_epoch = dl->epoch, .data_position = dl->position, .rng = rng, .num_params = P,
                     .opt_floats = h.opt_floats, .opt_format = s->state_format, .zero = s->zero, .tp = s->tensor.world, .pp = s->pipeline.world,
                     .run_id = run_id, .model_hash = d.hash, .has_checksum = 0, .checksum = 0, .header_crc = 0};  // (state_file_write computes the checksum)
    checkpoint_path(path, sizeof(path), dir, "state", step, rank);
    state_file_write(path, &st, h.opt_state);
    dist_barrier();
    if (rank == 0) { checkpoint_mark_done(dir, step); checkpoint_unmark_writing(dir, step); }
    checkpoint_end();
    printf("checkpoint: wrote step %d to %s/\n", step, dir);
    return d.max_abs;
}

// how this rank's state of setup s is cut and kept in format f (opt_layout.h)
static OptSharding state_sharding(const ModelSetup* s, QStateFormat f) {
    OptSharding z = OPT_UNSHARDED;
    z.rank = s->dist.rank;
    z.world = zero_shards_state(s->zero) ? s->dist.world : 1;
    z.format = f;
    return z;
}

// stops if the optimizer state read from path (in format f) holds a NaN or infinity, naming the
// slice (tensor and layer, opt_layout.h) whose state holds it (slice_state_check_finite)
static void state_check_finite(const char* path, const ModelSetup* s, QStateFormat f, const float* state) {
    GPT2Config rank_config = setup_rank_config(s);
    ParamSlice* slices = param_slices_alloc(&rank_config);
    OptSharding z = state_sharding(s, f);
    size_t offset;
    for (int k = 0; k < param_slice_count(&rank_config); k++) {
        OptShard sh = slice_shard(&slices[k], &z, &offset);
        slice_state_check_finite(path, &slices[k], &sh, s->optimizer, s->use_beta1, state);
        state += slice_state_floats(s->optimizer, &sh, s->use_beta1);
    }
    free(slices);
}

// stops if the header of the state file at path holds what no run writes: a sampling RNG of 0 (xorshift
// never reaches it), a negative data epoch or shard
static void state_check_values(const char* path, const TrainState* st) {
    if (st->rng == 0 || st->data_epoch < 0 || st->data_shard < 0) {
        fail("state file '%s' is corrupt: sampling RNG 0x%016llx, data epoch %d, shard %d (none can be 0, negative, negative)",
             path, (unsigned long long)st->rng, st->data_epoch, st->data_shard);
    }
}

// the training state read from path against this run (of the same layout: resume_checkpoint): the rank
// that wrote it, its step, the model's parameter count, the ranks, --tp, --pp and ZeRO stage, and its
// values; its data position is checked by state_check_data once the loader is there
static void state_check_run(const char* path, const TrainState* st, const ModelSetup* s, int step) {
    GPT2Config rank_config = setup_rank_config(s);
    size_t P = gpt2_num_parameters(&rank_config);  // --tp: the rank's slices
    if (st->rank != s->world.rank || st->step != step) {
        fail("state file '%s' holds rank %d's state of step %d, but is read as rank %d's of step %d\n"
             "  hint: a state file renamed or copied from another checkpoint; use the checkpoint's own files", path,
             st->rank, st->step, s->world.rank, step);
    }
    if (st->tp != s->tensor.world) {
        fail("state file '%s' holds a rank's optimizer state for its slices of --tp %d; this run has --tp %d\n"
             "  hint: resume with --tp %d (and the same ranks), or start a new run from the checkpoint's model file (-e), whose\n"
             "  optimizer state starts anew", path, st->tp, s->tensor.world, st->tp);
    }
    if (st->pp != s->pipeline.world) {
        fail("state file '%s' holds a rank's optimizer state for its stage of --pp %d; this run has --pp %d\n"
             "  hint: resume with --pp %d (and the same ranks), or start a new run from the checkpoint's model file (-e), whose\n"
             "  optimizer state starts anew", path, st->pp, s->pipeline.world, st->pp);
    }
    if (st->num_params != P) {
        fail("state file '%s' was written for a model of %llu parameters; this model has %zu\n"
             "  hint: resume with the -e that wrote it", path, (unsigned long long)st->num_params, P);
    }
    // --zero 1, 2 and 3 keep the same state in the same layout: each resumes the others' files
    if (st->num_processes != s->world.world || zero_shards_state(st->zero) != zero_shards_state(s->zero)) {
        fail("state file '%s' was written by %d rank(s) with --zero %d; this run has %d with --zero %d\n"
             "  hint: resume with mpirun -np %d and --zero %d", path, st->num_processes, st->zero, s->world.world,
             (int)s->zero, st->num_processes, st->zero);
    }
    state_check_values(path, st);
}

// the data position of a state file against the loader, already at the state's shard: a window start of
// this rank in a round of the windows of the `written_by` data-parallel ranks that wrote the checkpoint
// (B*T each; this run's ranks, but on another layout, llmc/relayout.h), the round starting in the shard
static void state_check_data(const char* path, const TrainState* st, const DataLoader* dl, int written_by) {
    size_t BT = (size_t)dl->B * dl->T, round = BT * written_by, first = (size_t)dl->rank * BT;
    size_t pos = st->data_position;
    if (pos < first || (pos - first) % round != 0 || pos - first > dl->shard_tokens - 1) {
        fail("state file '%s': data position %zu in shard %d ('%s', %zu tokens) is not a window start of rank %d with B*T = %zu and %d\n"
             "  data-parallel rank(s)\n  hint: resume with the -b, -t and -i that wrote it", path, pos, st->data_shard,
             dl->glob.gl_pathv[dl->shard], dl->shard_tokens, dl->rank, BT, written_by);
    }
}

// the state file at path and the model file at model_path are of one checkpoint of one run:
// its run is rank 0's (run_id), and the weights read from the model file (params) hash to
// what the state recorded. A version 2 state has neither (a note says it is not checked)
static void state_check_identity(const char* path, const TrainState* st, uint64_t run_id, const char* model_path,
                                 uint64_t hash) {
    if (st->run_id == 0) {
        printf("note: '%s' is a version %d state file, without a run identity: not checked against '%s'\n",
               path, STATE_VERSION_NO_IDENTITY, model_path);
        return;
    }
    if (st->run_id != run_id) {
        fail("state file '%s' was written by run 0x%016llx, rank 0's state file of the same checkpoint by run 0x%016llx\n"
             "  hint: files of two runs were combined in one folder; use one run's files (each run writes its own -o)",
             path, (unsigned long long)st->run_id, (unsigned long long)run_id);
    }
    if (hash != st->model_hash) {
        fail("model file '%s' is not of the checkpoint of state file '%s' (its weights hash to 0x%016llx, the state recorded 0x%016llx)\n"
             "  hint: files of two runs or of two steps were combined; use one checkpoint's own files",
             model_path, path, (unsigned long long)hash, (unsigned long long)st->model_hash);
    }
}

// the optimizer state of path, written in format st->opt_format, into h.opt_state in this run's
// format: read as it is, or (another format) read and converted, with a note
static void state_read_as(const char* path, TrainState* st, const ModelSetup* s, HostView h) {
    TrainState head;
    state_file_read_header(path, &head);
    QStateFormat from = (QStateFormat)head.opt_format, to = s->state_format;
    if (from == to) {
        state_file_read(path, st, h.opt_state, h.opt_floats);
        state_check_finite(path, s, to, h.opt_state);
        return;
    }
    GPT2Config rank_config = setup_rank_config(s);
    size_t floats = optimizer_state_floats_as(&rank_config, s->optimizer, s->use_beta1, zero_shards_state(s->zero) ? s->dist.world : 1, from);
    float* file_state = (float*)malloc_check((floats > 0 ? floats : 1) * sizeof(float));
    state_file_read(path, st, file_state, floats);
    state_check_finite(path, s, from, file_state);
    OptSharding z_from = state_sharding(s, from), z_to = state_sharding(s, to);
    int bad = opt_state_convert(&rank_config, s->optimizer, s->use_beta1, &z_from, file_state, &z_to, h.opt_state);
    free(file_state);
    if (bad > 0) {
        fail("state file '%s' holds %s optimizer state; this run keeps %s, whose ZeRO cut of %d ranks differs (8-bit state cuts on block\n"
             "  boundaries): a rank's part of slice %d is not the one the file holds\n  hint: resume with --optimizer-state %s (the file's);"
             " a sharded checkpoint converts only where the two cuts agree", path, QSTATE_FORMAT_NAMES[from], QSTATE_FORMAT_NAMES[to],
             s->dist.world, bad - 1, QSTATE_FORMAT_NAMES[from]);
    }
    if (s->world.rank == 0) {
        printf("note: the checkpoint's optimizer state is %s, this run keeps %s: converted (read as fp32, then %s)\n",
               QSTATE_FORMAT_NAMES[from], QSTATE_FORMAT_NAMES[to], to == QSTATE_8BIT ? "quantized block by block"
               : to == QSTATE_BF16 ? "rounded stochastically" : "kept");
    }
}

// moves the data loader to the data position of the state file at path (st: its header), written by
// `written_by` data-parallel ranks
static void state_seek_data(const char* path, const TrainState* st, DataLoader* dl, int written_by) {
    if ((size_t)st->data_shard >= dl->num_shards) {
        fail("state file '%s': data position in shard %d, but only %zu shard(s) match -i\n  hint: resume with the same -i",
             path, st->data_shard, dl->num_shards);
    }
    dataloader_seek(dl, (size_t)st->data_shard, st->data_position, st->data_epoch);
    state_check_data(path, st, dl, written_by);
}

// reads this rank's state file of checkpoint `step` (path) into st and h.opt_state, whose
// weights (read from model_path) hash to model_hash, checks it against the run (run_id: rank 0's)
// and moves the data loader to its position
static void state_load(const char* path, TrainState* st, const ModelSetup* s, int step, uint64_t run_id,
                       const char* model_path, uint64_t model_hash, HostView h, DataLoader* dl) {
    state_read_as(path, st, s, h);
    state_check_run(path, st, s, step);
    state_check_identity(path, st, run_id, model_path, model_hash);
    state_seek_data(path, st, dl, s->dist.world);
}

// ----------------------------------------------------------------------------
// -y 1 on another layout (llmc/relayout.h): each rank's optimizer state assembled from the checkpoint's

// this run's layout and this rank's place in it
static StateLayout run_layout(const ModelSetup* s) {
    StateLayout L = {.model = s->config, .kind = s->optimizer, .use_beta1 = s->use_beta1, .format = s->state_format,
                     .tp = s->tensor.world, .pp = s->pipeline.world, .dp = s->dist.world, .sharded = zero_shards_state(s->zero)};
    return L;
}
static RankPlace run_place(const ModelSetup* s) {
    RankPlace p = {.stage = s->pipeline.rank, .data = s->dist.rank, .tensor = s->tensor.rank};
    return p;
}

// the layout of the checkpoint whose rank 0 wrote st (path): its ranks, --tp, --pp, ZeRO and state format,
// with this run's model and optimizer (the state files' sizes are checked against them as they are read)
static StateLayout checkpoint_layout(const char* path, const TrainState* st, const ModelSetup* s) {
    StateLayout L = run_layout(s);
    L.format = (QStateFormat)st->opt_format;
    L.tp = st->tp;
    L.pp = st->pp;
    L.sharded = zero_shards_state(st->zero);
    long long group = (long long)st->tp * st->pp;
    if (st->num_processes % group != 0 || gpt2_tp_refusal(&s->config, st->tp) != NULL || pp_refusal(s->config.num_layers, st->pp, 1) != NULL) {
        fail("state file '%s' says %d rank(s) of --tp %d --pp %d wrote it, which cannot split this model (L=%d NH=%d): corrupt\n  hint: %s",
             path, st->num_processes, st->tp, st->pp, s->config.num_layers, s->config.num_heads, STATE_REGEN_HINT);
    }
    L.dp = (int)(st->num_processes / group);
    return L;
}

// whether the checkpoint whose rank 0 wrote st is of this run's layout: the same ranks, --tp, --pp, and
// ZeRO's cut of the state (--zero 1, 2 and 3 keep the same state files)
static int state_same_layout(const TrainState* st, const ModelSetup* s) {
    return st->num_processes == s->world.world && st->tp == s->tensor.world && st->pp == s->pipeline.world &&
           zero_shards_state(st->zero) == zero_shards_state(s->zero);
}

// "--tp 2 --pp 1, 2 data-parallel ranks, --zero 1, fp32 state" of a layout
static void layout_describe(const StateLayout* L, int zero, char* out, size_t n) {
    snprintf(out, n, "--tp %d --pp %d, %d data-parallel rank%s, --zero %d, %s state", L->tp, L->pp, L->dp, L->dp > 1 ? "s" : "", zero,
             QSTATE_FORMAT_NAMES[L->format]);
}

// this rank's optimizer state (h) from the checkpoint of `step` in dir, written in another layout, whose
// rank 0 wrote st (path0); st becomes rank 0's header there with this rank's data position, which the loader
// moves to. The data-parallel ranks may be another count: a checkpoint is written between steps, where every
// data-parallel rank's next window is in one round (llmc/dataloader.h: rank d's is d windows after rank 0's),
// so rank d of the new layout goes on d windows after the old rank 0, and each step of the same -d reads the
// same windows as before, each new rank every new count's window (but at a shard's end: llmc/dataloader.h)
static void state_load_relayout(const char* dir, int step, const char* path0, TrainState* st, const ModelSetup* s,
                                const char* model_path, uint64_t model_hash, HostView h, DataLoader* dl) {
    StateLayout from = checkpoint_layout(path0, st, s), to = run_layout(s);
    char was[128], now[128];
    layout_describe(&from, st->zero, was, sizeof(was));
    layout_describe(&to, (int)s->zero, now, sizeof(now));
    RankPlace at = run_place(s);
    if (h.opt_floats != layout_state_floats(&to, at)) {
        fail("relayout: the backend's optimizer state is %zu floats, this rank's layout %zu (a bug)", h.opt_floats, layout_state_floats(&to, at));
    }
    RelayoutCounts n;
    uint64_t run_id = st->run_id;
    *st = relayout_rank_state(dir, step, &from, &to, at, h.opt_state, &n);
    st->data_position += (size_t)at.data * s->B * s->T;
    state_check_values(path0, st);
    state_check_identity(path0, st, run_id, model_path, model_hash);
    state_seek_data(path0, st, dl, from.dp);
    if (s->world.rank == 0) {
        printf("-y 1: the checkpoint of step %d was written with %s; this run has %s: each rank's optimizer state\n"
               "  assembled from the checkpoint's state files (rank 0's slices: %d copied as they were, %d cut anew, %d of these\n"
               "  requantized in 8 bits)\n", step, was, now, n.copied, n.recut, n.requantized);
    }
}

// the step of the newest complete checkpoint of dir (with its DONE marker) whose files are all
// there, whole and of one write (checkpoint_damage: the model file and every rank's state file),
// saying which newer ones it skips and why; stops if there is none, naming the file to put back.
// Rank 0 picks, and every rank resumes its pick (train_setup): ranks never resume different steps
static int resume_pick_step(const char* dir, const GPT2Config* c) {
    int n;
    int* steps = checkpoint_done_steps(dir, &n);  // (at least one: prepare_output_dir)
    if (n == 0) { fail("-y 1: no complete checkpoint (DONE_* marker) in '%s'\n  hint: check -o, or start without -y", dir); }
    char why[CHECKPOINT_PATH_LEN + 256], newest_why[CHECKPOINT_PATH_LEN + 256], path[CHECKPOINT_PATH_LEN], fix[CHECKPOINT_PATH_LEN + 128];
    int step = -1;
    for (int i = 0; i < n && step < 0; i++) {
        int bad = checkpoint_damage(dir, steps[i], c, why, sizeof(why));
        if (bad == CKPT_WHOLE) { step = steps[i]; continue; }
        printf("-y 1: skipped the checkpoint of step %d in %s/: %s\n", steps[i], dir, why);
        if (i == 0) {
            snprintf(newest_why, sizeof(newest_why), "%s", why);
            checkpoint_path(path, sizeof(path), dir, bad == CKPT_MODEL_FILE ? "model" : "state", steps[0], bad == CKPT_MODEL_FILE ? -1 : bad);
            if (bad == CKPT_MODEL_FILE) { snprintf(fix, sizeof(fix), "put the model file of step %d back from a copy, as '%s'", steps[0], path); }
            else { snprintf(fix, sizeof(fix), "put rank %d's state file of step %d back from a copy, as '%s'", bad, steps[0], path); }
        }
        if (i + 1 == n) {
            fail("-y 1: none of the %d complete checkpoint(s) in '%s' has all its files whole; the newest, of step %d: %s\n"
                 "  hint: %s, or start over there with --overwrite 1 (which removes every checkpoint there); nothing was removed",
                 n, dir, steps[0], newest_why, fix);
        }
    }
    if (step != steps[0]) {
        printf("-y 1: resuming from the newest whole checkpoint, of step %d; the skipped ones' files stay until this run writes\n"
               "  a checkpoint of the same step over them (copy them elsewhere first to keep them)\n", step);
    }
    free(steps);
    return step;
}

// loads checkpoint `step` of dir into the model; returns its step and the run's identity
// (from the state files)
static int resume_checkpoint(GPT2* m, const ModelSetup* s, const char* dir, int step, DataLoader* dl, uint64_t* rng, uint64_t* run_id) {
    HostView h = gpt2_host_view(m);
    char path[CHECKPOINT_PATH_LEN], model_path[CHECKPOINT_PATH_LEN];
    checkpoint_path(model_path, sizeof(model_path), dir, "model", step, -1);
    GPT2Config cfg;
    int version;
    FILE* f = model_file_open(model_path, &cfg, &version);
    if (memcmp(&cfg, &s->config, sizeof(cfg)) != 0) { fail("checkpoint '%s' has another model shape than -e\n  hint: resume with the same -e", model_path); }
    uint64_t model_hash = load_model_file(m, f, model_path, &cfg, version);
    // rank 0's state file exists for any number of ranks: it says how many wrote the checkpoint, and how
    TrainState st;
    char path0[CHECKPOINT_PATH_LEN];
    checkpoint_path(path0, sizeof(path0), dir, "state", step, 0);
    state_file_read_header(path0, &st);
    *run_id = st.run_id;
    if (state_same_layout(&st, s)) {  // each rank reads its own file
        checkpoint_path(path, sizeof(path), dir, "state", step, s->world.rank);
        state_load(path, &st, s, step, *run_id, model_path, model_hash, h, dl);
    } else {
        state_load_relayout(dir, step, path0, &st, s, model_path, model_hash, h, dl);
    }
    gpt2_sync(m, SYNC_FROM_HOST);
    *rng = st.rng;
    printf("resumed from %s/ at step %d\n", dir, step);
    return step;
}

// ----------------------------------------------------------------------------
// stop signals: SIGINT, SIGTERM and SIGUSR1. The first asks for a checkpoint at the next safe
// point: after the current micro-step (a step cut short is dropped: its batches are read again
// on resume), and a validation under way is cut short. A second one exits at once, saying what
// the newest complete checkpoint is. Under mpirun: OpenMPI forwards SIGUSR1 to every rank,
// while SIGINT/SIGTERM to mpirun kill the ranks (no time to checkpoint)

static volatile sig_atomic_t g_stop_requested = 0;  // the first stop signal's number, 0 = none
#define EXIT_NOW_TEXT_LEN (PATH_MAX_LEN + 256)
static char g_exit_now_text[2][EXIT_NOW_TEXT_LEN];  // what a second signal prints: two, so the
static volatile sig_atomic_t g_exit_now_which = 0;  // handler never reads the one being written

static void on_stop_signal(int sig) {
    if (!g_stop_requested) { g_stop_requested = sig; return; }
    const char* text = g_exit_now_text[g_exit_now_which];
    ssize_t written = write(STDERR_FILENO, text, strlen(text));  // both async-signal-safe
    (void)written;
    _exit(128 + sig);
}

// what a second stop signal says from now on: the newest complete checkpoint of this run
static void set_exit_now_text(const char* out_dir, int ckpt_step) {
    int next = !g_exit_now_which;
    char saved[PATH_MAX_LEN + 96];
    if (out_dir == NULL) { snprintf(saved, sizeof(saved), "nothing was saved (-o \"\")"); }
    else if (ckpt_step < 0) { snprintf(saved, sizeof(saved), "this run has no complete checkpoint in '%s' yet", out_dir); }
    else { snprintf(saved, sizeof(saved), "the newest complete checkpoint in '%s' is of step %d (resume it with -y 1)", out_dir, ckpt_step); }
    snprintf(g_exit_now_text[next], EXIT_NOW_TEXT_LEN, "\nerror: a second stop signal: exiting at once, without a checkpoint; %s\n", saved);
    g_exit_now_which = next;
}

static void install_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

// ----------------------------------------------------------------------------
// sampling and validation

// the sampling RNG of a run with this --seed (the training samples' and --sample's)
static uint64_t sample_rng_seed(uint64_t seed) { return RNG_SEED_MIX ^ (seed + 1); }

// prints one token: its text (UTF-8, a character split across tokens held for the next: pr),
// or without a tokenizer (-k "" or none there) its id
static void print_token(const Tokenizer* tok, Utf8Printer* pr, int id) {
    if (tok->init_ok) { utf8_print(pr, tokenizer_decode(tok, (uint32_t)id), stdout); } else { printf("%d ", id); }
    fflush(stdout);
}

// generates n tokens after <|endoftext|> and prints them, one forward each over the window
// (T): the text so far, its last T tokens once it is longer (the window slides by one)
static void sample_tokens(GPT2* m, const GPT2Config* c, int* window, int T, int n, const Tokenizer* tok, uint64_t* rng) {
    window[0] = c->vocab_size > GPT2_EOT ? GPT2_EOT : c->vocab_size - 1;  // a smaller vocabulary: its last id, where GPT-2 keeps EOT
    int len = 1;
    Utf8Printer pr = {{0}, 0, 0};
    for (int i = 0; i < n; i++) {
        gpt2_forward(m, window, NULL, 1, len);
        int next = sample_index(gpt2_probs(m, len - 1), c->vocab_size, rand_uniform(rng));
        print_token(tok, &pr, next);
        if (len == T) { memmove(window, window + 1, (size_t)(T - 1) * sizeof(int)); len--; }
        window[len++] = next;
    }
    utf8_print_end(&pr, stdout);
    printf("\n");
}

// the mean loss over `steps` batches of val, and over the ranks (each validates its own part);
// NaN if a stop signal cut it short (on any rank). The ranks agree before each batch whether to go
// on: under --zero 3 a forward gathers weights, so every rank must run as many as the others
static float validation_loss(GPT2* m, DataLoader* val, int steps, Dist data) {
    dataloader_reset(val);
    double sum = 0.0;
    int done = 0;
    for (; done < steps && !dist_any(g_stop_requested); done++) {
        dataloader_next_batch(val);
        sum += gpt2_forward(m, val->inputs, val->targets, val->B, val->T);
    }
    dist_allreduce_doubles_over(&sum, 1, data);  // --tp: the ranks of a tensor group computed the same loss
    if (dist_any(done < steps)) { return NAN; }
    return (float)(sum / steps / data.world);
}

// ----------------------------------------------------------------------------
// the checks before anything is allocated

// --zero against the build and the number of data-parallel ranks (world: this run's, or --plan-ranks', over --tp)
static void check_zero_option(const TrainOptions* o, int world) {
    if (o->zero < ZERO_0 || o->zero > ZERO_3) {
        fail("--zero %d: unknown; choose 0 (every rank keeps the whole optimizer state), 1 (ZeRO-1: the state is sharded over the ranks),\n"
             "  2 (ZeRO-2: the state and the gradients are sharded) or 3 (ZeRO-3: the weights too)", o->zero);
    }
    if (o->zero > gpt2_zero_max_stage()) {
        fail("--zero %d: %s builds ZeRO stages up to %d, not %d yet\n"
             "  hint: use --zero %d, or the CPU trainer ./train_gpt, which has every stage", o->zero, gpt2_backend_name(),
             gpt2_zero_max_stage(), o->zero, gpt2_zero_max_stage());
    }
    if (zero_shards_state(o->zero) && world < 2) {
        if (!dist_built_with_mpi() && !o->plan_only) {
            fail("--zero %d shards the optimizer state across MPI ranks, but this train_gpt was built without MPI, so it needs mpirun\n"
                 "  hint: build with MPI (make, with mpicc installed) and launch with mpirun -np 2 ./train_gpt --zero %d ...", o->zero, o->zero);
        }
        if (o->tp > 1) {
            fail("--zero %d shards the optimizer state across the data-parallel ranks, but --tp %d takes every rank of this run into one\n"
                 "  tensor-parallel group: there is %d data-parallel rank\n  hint: launch 2 x %d ranks (mpirun -np %d), or use --zero 0",
                 o->zero, o->tp, world, o->tp, 2 * o->tp);
        }
        fail("--zero %d shards the optimizer state across ranks, but this run has %d rank\n"
             "  hint: launch with mpirun -np 2 (or more) ./train_gpt ..., use --zero 0, or --plan --plan-ranks N", o->zero, world);
    }
    int offload_acts;
    OptOffload offload_opt;
    offload_parse(o->offload, &offload_acts, &offload_opt);
    if (o->check_replicas && !ranks_hold_replicas(o->zero, offload_opt)) {
        fail("--check-replicas with --zero %d%s: the ranks hold no replicas of the weights to compare, each keeps its own blocks%s\n"
             "  hint: drop --check-replicas (--zero 0 and 1, and 2 without --offload optimizer, keep whole replicas and can check them)",
             o->zero, o->zero == ZERO_2 ? " --offload optimizer" : "", o->zero == ZERO_2 ? " of the fp32 master weights in host memory" : "");
    }
    if (o->plan_ranks < 0) { fail("--plan-ranks %d: the number of ranks must be >= 1, or 0 for this run's", o->plan_ranks); }
    if (o->plan_ranks != 0 && !o->plan_only) {
        fail("--plan-ranks %d plans for other ranks than this run's, so it only goes with --plan\n"
             "  hint: add --plan, or launch the ranks with mpirun -np %d", o->plan_ranks, o->plan_ranks);
    }
}

// -d against B*T and the ranks; returns the gradient accumulation steps of each rank.
// In 64 bits: B, T and the ranks are ints whose products need not be; tokens per step are
// an int (-d, and the layers' loops over B*T)
#define MAX_STEP_TOKENS INT_MAX
static int check_batch_options(const TrainOptions* o, int world) {
    int64_t BT = (int64_t)o->batch_size * o->seq_len;
    if (BT > MAX_STEP_TOKENS) {
        fail("-b %d -t %d: a micro-batch of B*T = %lld tokens is more than %d\n  hint: lower -b or -t",
             o->batch_size, o->seq_len, (long long)BT, MAX_STEP_TOKENS);
    }
    int64_t step_tokens = BT * world;  // one micro-batch on every rank (< 2^62)
    char what[128];
    if (world == 1) { snprintf(what, sizeof(what), "B*T = %lld", (long long)BT); }
    else { snprintf(what, sizeof(what), "B*T times the ranks = %lld x %d = %lld", (long long)BT, world, (long long)step_tokens); }
    if (step_tokens > MAX_STEP_TOKENS) {
        fail("-b %d -t %d: one micro-batch on every rank, %s tokens, is more than %d\n  hint: lower -b or -t, or the ranks",
             o->batch_size, o->seq_len, what, MAX_STEP_TOKENS);
    }
    int64_t total = o->total_batch_size == -1 ? step_tokens : o->total_batch_size;
    if (total < 1 || total % step_tokens != 0) {
        char hint[96];
        if (2 * step_tokens <= MAX_STEP_TOKENS) { snprintf(hint, sizeof(hint), "%lld, %lld, ...", (long long)step_tokens, 2 * (long long)step_tokens); }
        else { snprintf(hint, sizeof(hint), "%lld", (long long)step_tokens); }
        fail("-d %d: the total batch (tokens per step) must be a positive multiple of %s\n"
             "  hint: use -d %s or -d -1", o->total_batch_size, what, hint);
    }
    return (int)(total / step_tokens);
}

// stops if the memory plan of this shape could overflow 64-bit sizes: a bound on every byte
// count the planner and the backend compute (8 bytes an element, every layer keeping every
// activation, twice over), in floating point, far below 2^63
#define PLAN_BYTES_LIMIT 0x1p62
static void check_plan_size(const GPT2Config* c, const TrainOptions* o) {
    double L = c->num_layers, C = c->channels, NH = c->num_heads, Vp = c->padded_vocab_size;
    double B = o->batch_size, T = o->seq_len, BT = B * T, P = (double)gpt2_num_parameters(c);
    double elements = 4.0 * P + (L + 3.0) * (32.0 * BT * C + 4.0 * BT + B * NH * T * T) + 2.0 * BT * Vp;
    double bytes = 2.0 * 8.0 * elements;
    if (!(bytes < PLAN_BYTES_LIMIT)) {
        fail("-b %d -t %d with L=%d C=%d NH=%d Vp=%d: the memory sizes reach %.3g bytes, beyond what this program can count (2^62)\n"
             "  hint: lower -b or -t", o->batch_size, o->seq_len, c->num_layers, c->channels, c->num_heads, c->padded_vocab_size, bytes);
    }
}

// stops unless v is a finite number in the range lo..hi, each end open or closed ("[0, 1)")
typedef enum { END_CLOSED, END_OPEN } RangeEnd;
static void check_float_range(const char* flag, float v, double lo, RangeEnd lo_end, double hi, RangeEnd hi_end, const char* why) {
    int ok = isfinite(v) && (lo_end == END_OPEN ? v > lo : v >= lo) && (hi_end == END_OPEN ? v < hi : v <= hi);
    if (ok) { return; }
    char hi_text[32];
    if (isinf(hi)) { snprintf(hi_text, sizeof(hi_text), "inf"); } else { snprintf(hi_text, sizeof(hi_text), "%g", hi); }
    fail("%s %g: must be a finite number in %c%g, %s%c (%s)", flag, v, lo_end == END_OPEN ? '(' : '[', lo, hi_text,
         hi_end == END_OPEN ? ')' : ']', why);
}

// every floating-point hyperparameter: finite and in its range
static void check_hyperparameters(const TrainOptions* o) {
    check_float_range("-l (--lr)", o->learning_rate, 0.0, END_CLOSED, INFINITY, END_OPEN, "the peak learning rate");
    check_float_range("-q (--final-lr-frac)", o->final_lr_frac, 0.0, END_CLOSED, 1.0, END_CLOSED, "the schedule ends at lr times this");
    check_float_range("-c (--weight-decay)", o->weight_decay, 0.0, END_CLOSED, INFINITY, END_OPEN, "decoupled weight decay");
    check_float_range("--beta1", o->beta1, 0.0, END_CLOSED, 1.0, END_OPEN, "AdamW's first-moment decay");
    check_float_range("--beta2", o->beta2, 0.0, END_CLOSED, 1.0, END_OPEN, "AdamW's second-moment decay");
    check_float_range("--eps", o->eps, 0.0, END_OPEN, INFINITY, END_OPEN,
                      "AdamW divides by sqrt(v) + eps: with 0, a weight that never gets a gradient becomes 0/0 = NaN");
    check_float_range("--grad-clip", o->grad_clip, 0.0, END_CLOSED, INFINITY, END_OPEN, "0 turns clipping off");
    check_float_range("--adafactor-beta1", o->adafactor_beta1, 0.0, END_CLOSED, 1.0, END_OPEN, "0 keeps no first moment");
    check_float_range("--eps1", o->eps1, 0.0, END_OPEN, INFINITY, END_OPEN, "it keeps the second moment of a zero gradient positive");
}

// the flags that only some optimizers read (optimizer_hyper, schedule.h): given with another,
// each would show as set in the configuration and change nothing
static const struct { const char* flag; const char* readers; } OPTIMIZER_OWN_FLAGS[] = {
    {"--beta1", "adamw"}, {"--beta2", "adamw"}, {"--eps", "adamw"},
    {"--relative-step", "adafactor"}, {"--adafactor-beta1", "adafactor"}, {"--eps1", "adafactor or came"},
};
// what Adafactor's relative step replaces: the scheduled learning rate
static const char* const RELATIVE_STEP_REPLACES[] = {"--lr", "--warmup", "--final-lr-frac"};

// --optimizer-state: a known format, a first moment for it to hold, and (to train) a backend that keeps it
static void check_state_format(const TrainOptions* o) {
    int f = qstate_format_from_name(o->optimizer_state);
    if (f < 0) {
        fail("--optimizer-state '%s': unknown; choose fp32 (the default), bf16 (half the moments' memory) or 8bit (about a quarter)",
             o->optimizer_state);
    }
    if (f == QSTATE_FP32) { return; }
    if (strcmp(o->optimizer, "adafactor") == 0 && !(o->adafactor_beta1 > 0.0f)) {
        fail("--optimizer-state %s: Adafactor with --adafactor-beta1 0 keeps no first moment, and its factored second moments stay\n"
             "  fp32: the flag would change nothing\n  hint: add --adafactor-beta1 0.9 (a first moment, kept in %s), or drop --optimizer-state",
             o->optimizer_state, o->optimizer_state);
    }
}

// stops on a flag given that the chosen optimizer (or --relative-step) does not read
static void check_optimizer_flags(const TrainOptions* o) {
    for (size_t i = 0; i < sizeof(OPTIMIZER_OWN_FLAGS) / sizeof(OPTIMIZER_OWN_FLAGS[0]); i++) {
        const char* readers = OPTIMIZER_OWN_FLAGS[i].readers;
        int reads = strstr(readers, o->optimizer) != NULL && o->optimizer[0] != '\0';
        if (flag_given(o, OPTIMIZER_OWN_FLAGS[i].flag) && !reads) {
            fail("%s is read by --optimizer %s only; this run's optimizer, %s, does not read it\n"
                 "  hint: drop %s, or add --optimizer %.*s", OPTIMIZER_OWN_FLAGS[i].flag, readers, o->optimizer,
                 OPTIMIZER_OWN_FLAGS[i].flag, (int)strcspn(readers, " "), readers);
        }
    }
    for (size_t i = 0; i < sizeof(RELATIVE_STEP_REPLACES) / sizeof(RELATIVE_STEP_REPLACES[0]) && o->relative_step; i++) {
        const FlagSpec* f = find_flag(RELATIVE_STEP_REPLACES[i], strlen(RELATIVE_STEP_REPLACES[i]));
        if (o->given[f - FLAGS]) {
            char name[64];
            flag_display_name(f, name, sizeof(name));
            fail("%s: --relative-step steps by min(1e-2, 1/sqrt(t)) x RMS(param), without the learning-rate schedule that %s sets\n"
                 "  hint: drop %s, or drop --relative-step to train with -l's schedule", name, name, name);
        }
    }
}

// --sp: with --tp, and B*T rows that split over its ranks (and T too when the run draws samples: a
// sample's forward of 1..T tokens is padded to a multiple of --tp within T)
static void check_sp_option(const TrainOptions* o) {
    if (!o->sp) { return; }
    if (o->tp < 2) {
        fail("--sp splits the residual stream over the ranks of a tensor-parallel group, but this run has --tp %d\n"
             "  hint: add --tp N (N ranks a group), or drop --sp", o->tp);
    }
    long long BT = (long long)o->batch_size * o->seq_len;
    if (BT % o->tp != 0) {
        fail("--sp: the B*T = %lld rows of a micro-batch do not split over --tp %d ranks\n  hint: a -b or -t that makes B*T a multiple of %d",
             BT, o->tp, o->tp);
    }
    if (o->sample_every > 0 && o->seq_len % o->tp != 0) {
        fail("--sp with samples (-s %d): a sample's forward pads its tokens to a multiple of --tp %d within -t %d, which is not one\n"
             "  hint: -t a multiple of %d, or -s 0 (sample from a checkpoint with --sample)", o->sample_every, o->tp, o->seq_len, o->tp);
    }
}

// --tp against the backend, the ranks (world: this run's, or --plan-ranks) and the model: the ranks
// must split into groups of --tp, and each rank of a group take whole heads
static void check_tp_option(const TrainOptions* o, const GPT2Config* c, int world) {
    if (o->tp < 1) { fail("--tp %d: the ranks each layer is split over, at least 1 (1: none)", o->tp); }
    check_sp_option(o);
    if (o->tp == 1) { return; }
    if (o->tp > gpt2_tp_max()) {
        fail("--tp %d: %s does not split layers over ranks yet\n  hint: the CPU trainer (./train_gpt) has --tp; or use --zero over the ranks",
             o->tp, gpt2_backend_name());
    }
    if (world % o->tp != 0) {
        fail("--tp %d: %d rank(s) do not split into tensor-parallel groups of %d\n"
             "  hint: launch a multiple of %d ranks (mpirun -np %d)%s", o->tp, world, o->tp, o->tp, o->tp,
             o->plan_only ? ", or --plan --plan-ranks N with N a multiple of --tp" : "");
    }
    const char* why = gpt2_tp_refusal(c, o->tp);
    if (why != NULL) { fail("%s\n  hint: a --tp that divides both NH = %d and Vp = %d", why, c->num_heads, c->padded_vocab_size); }
}

// --pp against the backend, the ranks (world: this run's, or --plan-ranks), the model's layers, and
// what it does not compose with yet; --pp-schedule a schedule's name, and given only with --pp
static void check_pp_option(const TrainOptions* o, const GPT2Config* c, int world) {
    PpSchedule sch = pp_schedule_parse(o->pp_schedule);  // stops on an unknown name
    if (o->pp < 1) { fail("--pp %d: the stages the layers are split into, at least 1 (1: none)", o->pp); }
    if (o->pp == 1) {
        if (flag_given(o, "--pp-schedule") || sch != PP_1F1B) {  // (--plan's search sets it without giving it)
            fail("--pp-schedule %s orders the micro-batches of a pipeline's stages, but this run has --pp 1\n  hint: add --pp N, or drop --pp-schedule",
                 o->pp_schedule);
        }
        return;
    }
    if (o->pp > gpt2_pp_max()) {
        fail("--pp %d: %s does not split the layers into stages yet\n  hint: the CPU trainer (./train_gpt) has --pp; or use --zero over the ranks",
             o->pp, gpt2_backend_name());
    }
    const char* why = pp_refusal(c->num_layers, o->pp, 1);
    if (why != NULL) { fail("%s", why); }
    int offload_acts;
    OptOffload offload_opt;
    offload_parse(o->offload, &offload_acts, &offload_opt);
    why = gpt2_pp_refusal(sch, (ZeroStage)o->zero, offload_opt != OPT_OFFLOAD_NONE, o->loss_chunk);
    if (why != NULL) { fail("--pp %d on %s: %s", o->pp, gpt2_backend_name(), why); }
    if (!o->plan_only && world > 1 && dist_by_env()) {
        fail("--pp %d: the stages pass their activations as MPI messages, but these ranks were started by %s without MPI\n"
             "  hint: launch with mpirun -np %d (a train_gpt built with MPI: make, with mpicc installed)", o->pp, dist_source(), world);
    }
    if (world % (o->tp * o->pp) != 0) {
        fail("--pp %d: %d rank(s) do not split into %d stages%s\n  hint: launch a multiple of %d ranks (mpirun -np %d)%s", o->pp, world, o->pp,
             o->tp > 1 ? " of --tp's groups" : "", o->tp * o->pp, o->tp * o->pp,
             o->plan_only ? ", or --plan --plan-ranks N with N a multiple of it" : "");
    }
}

// checks the options against each other, the model and the number of data-parallel ranks (world:
// with --tp, the ranks over --tp); returns the gradient accumulation steps of each rank
static int check_options(const TrainOptions* o, const GPT2Config* c, int world) {
    check_zero_option(o, world);
    if (o->batch_size < 1) { fail("-b %d: the batch size must be >= 1", o->batch_size); }
    if (o->seq_len < 1) { fail("-t %d: the sequence length must be >= 1", o->seq_len); }
    if (o->seq_len > c->max_seq_len) {
        fail("-t %d is longer than the model's context maxT=%d\n  hint: use -t %d or less", o->seq_len, c->max_seq_len, c->max_seq_len);
    }
    int accum = check_batch_options(o, world);
    check_plan_size(c, o);
    check_hyperparameters(o);
    const struct { const char* flag; int value; } counts[] = {
        {"-u (--warmup)", o->warmup_steps}, {"-v (--val-every)", o->val_every}, {"-m (--val-steps)", o->val_steps},
        {"-s (--sample-every)", o->sample_every}, {"-n (--checkpoint-every)", o->checkpoint_every},
        {"--keep-checkpoints", o->keep_checkpoints}, {"--profile", o->profile},
    };
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        if (counts[i].value < 0) { fail("%s %d: must be >= 0", counts[i].flag, counts[i].value); }
    }
    if (o->max_steps < -1 || o->max_steps == 0) { fail("-x %d: the number of steps must be >= 1, or -1 for one epoch", o->max_steps); }
    if (o->max_steps > 0 && o->profile > o->max_steps) {
        fail("--profile %d: past the run's last step (-x %d)\n  hint: name a step from 2 to %d (the first holds the warm-up)",
             o->profile, o->max_steps, o->max_steps);
    }
    if (o->gen_tokens < 1) { fail("-g %d: a sample needs at least one token", o->gen_tokens); }
    if (!(o->peak_tflops >= 0.0f) || isinf(o->peak_tflops)) { fail("--peak-tflops %g: a peak in TFLOP/s, > 0, or 0 for the GPU's own", o->peak_tflops); }
    if (optimizer_from_name(o->optimizer) < 0) { fail("--optimizer '%s': unknown; choose adamw, adafactor or came", o->optimizer); }
    check_optimizer_flags(o);
    check_state_format(o);
    if (o->resume && o->out_dir[0] == '\0') { fail("-y 1 needs the output directory to resume from (-o)"); }
    if (o->overwrite && o->resume) { fail("-y 1 continues the run in -o, --overwrite 1 removes it: choose one"); }
    if (o->overwrite && o->out_dir[0] == '\0') { fail("--overwrite 1 starts over in the output directory, but -o is \"\" (none)"); }
    return accum;
}

static void fitting_flags_hint(const TrainOptions* o, const DistGrid* grid, MemBudget budget, char* out, size_t n);

// stops before allocating anything if the plan cannot fit in the memory this machine has
// available (on the CPU the "device" and the host store share it), for every rank on it; with
// a GPU, its categories against the GPU's free memory, naming the flags that would fit it
static void check_memory_fits(const MemPlan* plan, const ActPolicy* act, int local_ranks, const TrainOptions* o,
                              const DistGrid* grid) {
    double gpu_free = (double)gpt2_device_free_bytes(), device = (double)(plan_total(plan) - plan_host_bytes(plan->bytes));
    if (gpu_free > 0.0 && device > gpu_free) {
        size_t host_avail = mem_available();
        MemBudget budget = {(size_t)gpu_free, host_avail > 0 ? host_avail / (size_t)local_ranks : SIZE_MAX, 0};
        char hint[512];
        fitting_flags_hint(o, grid, budget, hint, sizeof(hint));
        fail("this run needs %.1f MiB of GPU memory (the memory plan's device total) but the GPU has %.1f MiB free\n"
             "  hint: %s", device / MIB, gpu_free / MIB, hint);
    }
    if (gpt2_device_is_modelled()) { return; }   // the host memory is the modelled machine's: not checked here
    double avail = (double)mem_available();
    double host = (double)plan->bytes[MEM_OFFLOADED] * local_ranks;
    double total = (gpu_free > 0.0 ? (double)plan_host_bytes(plan->bytes) : (double)plan_total(plan)) * local_ranks;
    if (avail == 0.0) { return; }  // unknown (not Linux)
    if (act->offload && host > avail) {
        fail("--offload 1: the host store for the offloaded activations needs %.1f MiB (%d rank(s) on this machine), but only %.1f MiB of host memory is available\n"
             "  hint: --recompute sqrt offloads only the segment inputs; or lower -b or -t (see --plan)", host / MIB, local_ranks, avail / MIB);
    }
    if (total > avail) {
        fail("this run needs %.1f MiB (the memory plan, %d rank(s) on this machine) but only %.1f MiB is available\n"
             "  hint: see --plan; lower -b or -t, --recompute sqrt, --optimizer adafactor, --zero 1", total / MIB, local_ranks, avail / MIB);
    }
}

// ----------------------------------------------------------------------------
// memory budgets: --max-memory and --max-host-memory, per rank. --plan searches the memory
// flags for the fastest combination within them (plan_search.h); a run refuses to start when
// its plan exceeds one (before allocating anything)

typedef struct {
    MemBudget budget;
    char device_from[96], host_from[96];  // where each came from, in words
} BudgetSource;

// one budget flag's bytes: a size, or free: the GPU's free memory (device) or the host's
// available memory; omitted: free for --plan's search (search = 1), no limit for a run
static size_t resolve_budget_flag(uint64_t v, const char* flag, int device, int search, char* from, size_t n) {
    char arg[32];
    bytes_to_arg(v, arg, sizeof(arg));
    if (v == BYTES_NONE && !search) { snprintf(from, n, "no %s", flag); return SIZE_MAX; }
    if (v != BYTES_NONE && v != BYTES_FREE) { snprintf(from, n, "%s %s", flag, arg); return (size_t)v; }
    const char* omitted = v == BYTES_NONE ? " omitted" : " free";
    size_t free_now = device ? gpt2_device_free_bytes() : mem_available();
    if (free_now == 0 && device) {
        fail("%s%s: no GPU to ask for its free memory\n  hint: give the GPU's budget, e.g. --max-memory 80GiB (an H100) or 24GiB", flag, omitted);
    }
    if (free_now == 0) { fail("%s%s: the host's available memory is unknown (no /proc/meminfo)\n  hint: give it, e.g. %s 64GiB", flag, omitted, flag); }
    snprintf(from, n, "%s%s: the %s now", flag, omitted, device ? "GPU's free memory" : "host's available memory");
    return free_now;
}

// the budgets of the flags; returns 0 when neither flag is given (no budget: --plan prints the
// memory table, a run is not limited beyond what the machine has)
static int resolve_budgets(const TrainOptions* o, int search, BudgetSource* b) {
    int has_device = gpt2_has_device();
    if (!has_device && o->max_host_memory != BYTES_NONE) {
        fail("--max-host-memory: %s keeps every category in host memory, so --max-memory is its one budget\n"
             "  hint: --max-memory SIZE (or free: the host's available memory)", gpt2_backend_name());
    }
    if (o->max_memory == BYTES_NONE && o->max_host_memory == BYTES_NONE) { return 0; }
    b->budget.shared = !has_device;
    b->budget.device = resolve_budget_flag(o->max_memory, "--max-memory", has_device, search, b->device_from, sizeof(b->device_from));
    b->budget.host = has_device ? resolve_budget_flag(o->max_host_memory, "--max-host-memory", 0, search, b->host_from, sizeof(b->host_from))
                                : SIZE_MAX;
    if (!has_device) { snprintf(b->host_from, sizeof(b->host_from), "in the --max-memory budget"); }
    return 1;
}

// a run with --max-memory or --max-host-memory: stops before allocating if its plan exceeds one
static void check_memory_budget(const MemPlan* plan, const TrainOptions* o) {
    BudgetSource b;
    if (!resolve_budgets(o, 0, &b)) { return; }
    BudgetFit fit = plan_fit(plan, &b.budget);
    char need[32], have[32];
    if (!fit.device_ok) {
        size_t bytes = b.budget.shared ? fit.device + fit.host : fit.device;
        format_bytes(need, sizeof(need), (double)bytes);
        format_bytes(have, sizeof(have), (double)b.budget.device);
        fail("this run's memory plan needs %s of %s, more than the budget %s (%s)\n"
             "  hint: add --plan to these flags: it lists every combination of the memory flags with what it needs, and the fastest that fits",
             need, b.budget.shared ? "memory (device + host total)" : "device memory (the device total)", have, b.device_from);
    }
    if (!fit.host_ok) {
        format_bytes(need, sizeof(need), (double)fit.host);
        format_bytes(have, sizeof(have), (double)b.budget.host);
        fail("this run's memory plan needs %s of host memory (the host total), more than the budget %s (%s)\n"
             "  hint: add --plan to these flags: it lists every combination of the memory flags with what it needs, and the fastest that fits",
             need, have, b.host_from);
    }
}

// ----------------------------------------------------------------------------
// the run

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

// training FLOPs per token: 6 per parameter (forward 2, backward 4) plus attention's score and
// value products over the causal half of the T x T square, 6 L T C: llm.c's count (gpt2_estimate_mfu),
// so that an MFU here compares with llm.c's (PaLM and nanoGPT count the whole square, 12 L T C)
static double flops_per_token(const GPT2Config* c, int T) {
    return 6.0 * gpt2_num_parameters(c) + 6.0 * c->num_layers * T * c->channels;
}

// what the run knows when its loss or gradient norm turns non-finite, to say what is true:
// the last finite step, where the numbers first jumped, the weights it started from and the
// newest checkpoint's (max |w|, params_max_abs)
#define LOSS_JUMP_NATS 1.0f    // a loss this far above the lowest so far is a jump
#define NORM_JUMP_FACTOR 10.0f // so is a gradient norm this many times the lowest so far
typedef struct {
    int last_step;              // the last step with a finite loss and norm; 0: none yet
    float last_loss, last_norm, last_lr;
    float min_loss, min_norm;   // over the finite steps
    int jump_step;              // the first step whose loss or norm jumped; 0: none
    float jump_loss, jump_norm; // its loss and norm
    float jump_min_loss, jump_min_norm;  // the lowest before it
    float start_max_abs;        // the weights the run started from (-e, or the checkpoint of -y 1)
    int ckpt_step;              // the newest checkpoint of this run in -o (written, or resumed from); -1: none
    float ckpt_max_abs;         // its weights
} TrainingHealth;

// after a step with a finite loss and norm
static void health_record(TrainingHealth* h, int step, float loss, float norm, float lr) {
    if (h->last_step > 0 && h->jump_step == 0 && (loss > h->min_loss + LOSS_JUMP_NATS || norm > NORM_JUMP_FACTOR * h->min_norm)) {
        h->jump_step = step;
        h->jump_loss = loss;
        h->jump_norm = norm;
        h->jump_min_loss = h->min_loss;
        h->jump_min_norm = h->min_norm;
    }
    if (h->last_step == 0 || loss < h->min_loss) { h->min_loss = loss; }
    if (h->last_step == 0 || norm < h->min_norm) { h->min_norm = norm; }
    h->last_step = step;
    h->last_loss = loss;
    h->last_norm = norm;
    h->last_lr = lr;
}

// everything one training run holds
typedef struct {
    const TrainOptions* o;
    ModelSetup setup;         // config, (B,T), optimizer, activation policy, ranks
    MemPlan plan;
    int accum;                // micro-steps per optimizer step on each rank
    int max_steps, start_step;
    int has_val, has_out;
    GPT2* model;
    DataLoader train, val;
    Tokenizer tok;
    int* gen_tokens;          // (T) the window of the sample being generated
    uint64_t sample_rng;
    TrainingHealth health;    // for the message when the loss or the norm turns non-finite
    uint64_t run_id;          // this run's identity, in every state file it writes (fresh: random; -y 1: the checkpoint's)
    FILE* log;                // OUT/log.jsonl on rank 0, else NULL
    double peak_flops;        // per rank, for MFU: --peak-tflops, or the device's; 0 = unknown
    int log_has_start_val;    // -y 1: the log holds the validation of the resumed step already
    int complete;             // -y 1: the checkpoint is of the last step (-x): nothing to train
    int out_lock;             // rank 0: the output directory, locked while this run uses it; else -1
    size_t rss_at_start;      // the fixed overhead, before any tensor
    PpAction* pp_actions;     // --pp: this stage's list for a step (llmc/pipeline.h), pp_num_actions of them; else NULL
    int pp_num_actions;
    int plan_stage;           // the pipeline stage r->plan is of: this rank's, or (--plan) the largest (0 without --pp)
    int data_ranks;           // the data-parallel ranks planned for: the ranks over --tp and --pp
    int* pp_tokens;           // --pp: (accum, 2, B*T) the step's micro-batches' inputs and targets, kept for their backward
} Run;

static void print_config(const Run* r) {
    const TrainOptions* o = r->o;
    const GPT2Config* c = &r->setup.config;
    size_t P = gpt2_num_parameters(c);
    printf("+-----------------------+----------------------------------------------------+\n");
    printf("| model shape           | L=%d C=%d NH=%d V=%d Vp=%d maxT=%d\n", c->num_layers, c->channels,
           c->num_heads, c->vocab_size, c->padded_vocab_size, c->max_seq_len);
    printf("| parameters            | %zu (%.1fM)\n", P, P / 1e6);
    printf("| gradient accumulation | %d micro-steps of B*T = %d tokens\n", r->accum, o->batch_size * o->seq_len);
    if (r->setup.tensor.world > 1) {
        GPT2Config rank_config = setup_rank_config(&r->setup);
        printf("| tensor parallel       | --tp %d: groups of %d adjacent ranks split each layer; a rank holds %zu parameters (%.1fM)\n",
               r->setup.tensor.world, r->setup.tensor.world, gpt2_num_parameters(&rank_config), gpt2_num_parameters(&rank_config) / 1e6);
    }
    if (r->setup.pipeline.world > 1) {
        char split[PP_DESCRIBE_LEN], sched[PP_DESCRIBE_LEN];
        pp_split_describe(c->num_layers, r->setup.pipeline.world, split, sizeof(split));
        pp_schedule_describe(r->setup.pp_schedule, r->setup.pipeline.world, r->accum, sched, sizeof(sched));
        printf("| pipeline stages       | --pp %d: %s\n", r->setup.pipeline.world, split);
        printf("| pipeline schedule     | %s\n", sched);
    }
    printf("| data parallel         | %d rank(s) from %s, --zero %d%s\n", r->setup.dist.world, dist_source(),
           (int)r->setup.zero, r->setup.zero == ZERO_1 ? ": each rank keeps its blocks of the optimizer state"
                               : r->setup.zero == ZERO_2 ? ": each rank keeps its blocks of the optimizer state and of the gradients"
                               : r->setup.zero == ZERO_3 ? ": each rank keeps its blocks of the optimizer state, the gradients and the weights" : "");
    printf("| backend               | %s, %s, %s attention\n", gpt2_backend_name(), PRECISION_NAMES[r->setup.precision],
           r->setup.act.flash ? "flash" : "matmul");
    printf("| OpenMP threads        | %d\n", num_threads());
    printf("| run id                | 0x%016llx%s\n", (unsigned long long)r->run_id, r->o->resume ? " (the checkpoint's)" : "");
    for (int i = 0; i < NUM_FLAGS; i++) {
        char v[PATH_MAX_LEN + 8];
        flag_value_string(&FLAGS[i], o, v, sizeof(v));
        printf("| %-21s | %s\n", FLAGS[i].longname + 2, v);
    }
    printf("+-----------------------+----------------------------------------------------+\n");
}

// --precision: a name, or "" for the backend's default
static Precision precision_from_flag(const char* name) {
    if (name[0] == '\0') { return gpt2_default_precision(); }
    for (int p = 0; p < NUM_PRECISIONS; p++) {
        if (strcmp(name, PRECISION_NAMES[p]) == 0) { return (Precision)p; }
    }
    fail("--precision '%s': unknown; choose fp32 or bf16 (or \"\" for %s's default, %s)", name, gpt2_backend_name(),
         PRECISION_NAMES[gpt2_default_precision()]);
    return PRECISION_FP32;
}

// --attention: 1 for flash attention, 0 for matmul; "" is the backend's default where it runs
// this model's heads (flash on a GPU), else matmul
static int attention_from_flag(const char* name, const GPT2Config* c) {
    int head_size = c->channels / c->num_heads;
    const char* refusal = gpt2_flash_refusal(head_size);
    if (name[0] == '\0') { return gpt2_prefers_flash() && refusal == NULL; }
    if (strcmp(name, "matmul") == 0) { return 0; }
    if (strcmp(name, "flash") != 0) {
        fail("--attention '%s': unknown; choose flash or matmul (or \"\" for %s's default)", name, gpt2_backend_name());
    }
    if (refusal != NULL) {
        fail("--attention flash: %s (heads of C/NH = %d/%d = %d channels)\n  hint: --attention matmul", refusal,
             c->channels, c->num_heads, head_size);
    }
    return 1;
}

// the shape, optimizer, activation policy and ranks of the run, and its memory plan; for
// --plan, world is --plan-ranks (a laptop plans for a cluster)
// the plan of pipeline stage `stage` of the setup (the whole model without --pp: stage 0 of 1), and
// *held, the micro-batches whose activations it holds at once
static MemPlan plan_stage(const Run* r, int stage, int* held) {
    const TrainOptions* o = r->o;
    const ModelSetup* s = &r->setup;
    ModelSetup st = *s;
    st.pipeline.rank = stage;
    st.pipeline.world = o->pp;
    *held = pp_stage_held(st.pp_schedule, o->pp, stage, r->accum);
    GPT2Config rank_config = setup_rank_config(&st);  // --tp, --pp: what each rank holds and computes
    PlanInputs in = {.B = s->B, .T = s->T, .num_loaders = 1 + r->has_val, .optimizer = s->optimizer, .use_beta1 = s->use_beta1,
                     .act = s->act, .offload_optimizer = s->offload_optimizer, .world = r->data_ranks, .zero = o->zero,
                     .layout = gpt2_layout(&rank_config, s->B, s->T, s->precision, &s->act),
                     .state_format = s->state_format, .pp_held = *held, .pp_micro = o->pp > 1 ? r->accum : 0};
    return plan_memory(&rank_config, in);
}

static void plan_run(Run* r, const DistGrid* grid, int world) {
    const TrainOptions* o = r->o;
    ModelSetup* s = &r->setup;
    resolve_model_config(o, &s->config);
    check_tp_option(o, &s->config, world);
    check_pp_option(o, &s->config, world);
    r->data_ranks = world / (o->tp * o->pp);  // --tp, --pp: the data-parallel ranks, across the tensor groups of a stage
    r->accum = check_options(o, &s->config, r->data_ranks);
    s->B = o->batch_size;
    s->T = o->seq_len;
    s->optimizer = (OptimizerKind)optimizer_from_name(o->optimizer);
    s->use_beta1 = s->optimizer == OPT_ADAFACTOR && o->adafactor_beta1 > 0.0f;
    s->state_format = (QStateFormat)qstate_format_from_name(o->optimizer_state);
    int offload_acts;
    offload_parse(o->offload, &offload_acts, &s->offload_optimizer);
    s->act = act_policy_parse(o->recompute, offload_acts, s->config.num_layers, attention_from_flag(o->attention, &s->config));
    act_policy_set_loss_chunk(&s->act, o->loss_chunk);
    s->act.sp = o->sp;  // --sp: the residual stream a rank's rows (cpu/tensor_parallel.h)
    s->precision = precision_from_flag(o->precision);
    s->dist = grid->data;
    s->world = grid->world;
    s->tensor = grid->tensor;
    s->tensor.world = o->tp;  // (--plan --plan-ranks: the layout planned, no group made)
    s->pipeline = grid->pipeline;
    s->pair = grid->pair;
    s->pp_schedule = pp_schedule_parse(o->pp_schedule);
    s->zero = (ZeroStage)o->zero;
    gpt2_check_setup(s);
    r->has_val = o->val_data[0] != '\0' && o->val_steps > 0;
    r->has_out = o->out_dir[0] != '\0';
    // the plan of this rank's stage, or planned for ranks not started (--plan) the largest stage's
    int planned_here = grid->pipeline.world == o->pp;
    for (int stage = 0; stage < o->pp; stage++) {
        if (planned_here && stage != grid->pipeline.rank) { continue; }
        int held;
        MemPlan plan = plan_stage(r, stage, &held);
        if (stage == 0 || planned_here || plan_total(&plan) > plan_total(&r->plan)) {
            r->plan = plan;
            s->pp_held = held;
            r->plan_stage = stage;
        }
    }
    if (!planned_here) { s->pipeline = grid->pipeline; }  // (--plan: no stage of its own)
}

// the sampling buffer: one int per position (the planner's scratch row counts it)
static int* sample_buffer_alloc(int T) { return (int*)mem_alloc(MEM_SCRATCH, (size_t)T * sizeof(int)); }

// -x, or (-x -1) the steps of one epoch of the training shards
static int steps_to_train(const Run* r) {
    if (r->o->max_steps != -1) { return r->o->max_steps; }
    size_t step_tokens = (size_t)r->setup.B * r->setup.T * r->accum * r->setup.dist.world;
    int steps = (int)(r->train.epoch_tokens / step_tokens);
    return steps < 1 ? 1 : steps;
}

// after a resume from step `step`, log.jsonl keeps the lines of steps up to it (each line
// starts {"step": N) and drops the later ones, which the resumed run logs again: a run that
// stopped without a checkpoint of its last steps (a crash) had logged them already. Returns
// whether it holds a validation of `step` (a stop signal skips one)
static int log_truncate_after(const char* path, int step) {
    FILE* in = fopen(path, "rb");
    if (in == NULL) { return 0; }  // no log yet (-o of a checkpoint copied without it)
    AtomicFile out;
    atomic_open(&out, path);
    char* line = NULL;
    size_t cap = 0;
    int dropped = 0, val_at_step = 0;
    while (getline(&line, &cap, in) != -1) {
        int n;
        if (sscanf(line, "{\"step\": %d", &n) == 1 && n > step) { dropped++; continue; }
        if (sscanf(line, "{\"step\": %d", &n) == 1 && n == step && strstr(line, "\"val_loss\"") != NULL) { val_at_step = 1; }
        atomic_write(&out, line, 1, strlen(line));
    }
    free(line);
    fclose(in);
    atomic_commit(&out);
    if (dropped > 0) { printf("%s: dropped %d line(s) after step %d, which this run logs again\n", path, dropped, step); }
    return val_at_step;
}

// a new run's identity: 64 random bits from the OS (the clock and the process id if it has
// none), never 0; rank 0 draws it and every rank takes rank 0's
static uint64_t new_run_id(int rank) {
    uint64_t id = 0;
    FILE* f = rank == 0 ? fopen("/dev/urandom", "rb") : NULL;
    if (f != NULL) {
        if (fread(&id, sizeof(id), 1, f) != 1) { id = 0; }
        fclose(f);
    }
    if (rank == 0 && id == 0) {
        uint64_t x = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(now_seconds() * 1e9);
        rand_u32(&x);
        id = x;
    }
    uint64_t lo, hi;
    dist_min_max_u64(rank == 0 ? id : 0, &lo, &hi);  // the others give 0: the maximum is rank 0's
    return hi;
}

// the files a training run reads, each with the flag that names it: -e (a model file), -k, and
// every shard that -i and -j match (the paths point into o and into the globs)
typedef struct {
    InputFile* files;
    int n;
    glob_t shards[2];  // -i's and -j's matches
} RunInputs;

static RunInputs run_inputs(const TrainOptions* o) {
    RunInputs in;
    memset(&in, 0, sizeof(in));
    const char* patterns[2] = {o->train_data, o->val_data};
    size_t max = 2;
    for (int k = 0; k < 2; k++) {  // none: the data loader says so
        if (patterns[k][0] != '\0' && glob(patterns[k], 0, NULL, &in.shards[k]) == 0) { max += in.shards[k].gl_pathc; }
    }
    in.files = (InputFile*)malloc_check(max * sizeof(InputFile));
    GPT2Config preset;
    InputFile model = {"-e", "model file", o->model}, tokenizer = {"-k", "tokenizer file", o->tokenizer};
    if (!model_is_preset(o, &preset)) { in.files[in.n++] = model; }
    if (o->tokenizer[0] != '\0') { in.files[in.n++] = tokenizer; }
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < in.shards[k].gl_pathc; i++) {
            InputFile shard = {k == 0 ? "-i" : "-j", "token shard", in.shards[k].gl_pathv[i]};
            in.files[in.n++] = shard;
        }
    }
    return in;
}

static void run_inputs_free(RunInputs* in) {
    for (int k = 0; k < 2; k++) { globfree(&in->shards[k]); }  // a glob_t zeroed or filled: either frees
    free(in->files);
}

// --keep-checkpoints: the newest K complete checkpoints up to `written` (the one just written) stay,
// and so does one this run reads (-e)
static void prune_checkpoints(const TrainOptions* o, int written) {
    RunInputs in = run_inputs(o);
    int spare = checkpoint_input_step(o->out_dir, in.files, in.n);
    run_inputs_free(&in);
    int spared;
    int pruned = checkpoint_prune(o->out_dir, o->keep_checkpoints, written, spare, &spared);
    if (pruned > 0) { printf("checkpoint: removed %d older checkpoint(s) (--keep-checkpoints %d)\n", pruned, o->keep_checkpoints); }
    static int said = 0;  // once a run
    if (spared && !said) {
        printf("checkpoint: kept step %d beyond --keep-checkpoints %d: this run started from it (-e)\n", spare, o->keep_checkpoints);
        said = 1;
    }
}

// the output directory before anything is allocated (rank 0; the other ranks wait): for -y 1
// there already, created, locked for this run, rid of the temporary files and incomplete
// checkpoints a crash left, for a fresh run free of an earlier run's checkpoints and log
// (refused, or with --overwrite 1 removed), and with room for one checkpoint. No file the run
// reads is ever removed
static void prepare_output_dir(Run* r) {
    const TrainOptions* o = r->o;
    r->out_lock = -1;
    if (!r->has_out) { return; }
    if (r->setup.world.rank == 0) {
        struct stat st;
        if (o->resume && stat(o->out_dir, &st) != 0) {
            fail("-y 1: output directory '%s': %s, so there is no run to resume\n  hint: check -o, or start without -y", o->out_dir,
                 strerror(errno));
        }
        ensure_output_dir(o->out_dir);
        r->out_lock = output_dir_lock(o->out_dir);
        output_dir_remove_stale_tmp(o->out_dir);
        OutputDirContents c = output_dir_contents(o->out_dir);  // complete checkpoints only
        if (o->resume && c.files == 0) {
            fail("-y 1: no complete checkpoint (DONE_* marker) in '%s'%s\n  hint: %s", o->out_dir,
                 c.has_log ? ": its log.jsonl is of a run stopped before its first checkpoint, which cannot be resumed" : "",
                 c.has_log ? "start over there with --overwrite 1 (removes log.jsonl) instead of -y, or choose another -o"
                           : "check -o, or start without -y");
        }
        if (!o->resume && !o->overwrite && c.files == 0 && c.has_log) {
            fail("output directory '%s' holds the log.jsonl of a run stopped before its first checkpoint: nothing to resume\n"
                 "  hint: start over there with --overwrite 1 (removes that log.jsonl), or choose another -o", o->out_dir);
        }
        if (!o->resume && !o->overwrite && c.files > 0) {
            fail("output directory '%s' holds an earlier run (%d checkpoint file(s), the newest of step %d%s)\n"
                 "  hint: resume it with -y 1, choose another -o, or start over there with --overwrite 1 (removes its checkpoints and log.jsonl)",
                 o->out_dir, c.files, c.newest_step, c.has_log ? ", and log.jsonl" : "");
        }
        char foreign[CHECKPOINT_PATH_LEN + 256];  // the directory and a file name in it
        int foreign_step = 0;
        if (output_dir_foreign_file(o->out_dir, foreign, sizeof(foreign), &foreign_step)) {
            fail("'%s' is named like a file of checkpoint %d, but this trainer has no record of writing it (neither DONE_%08d nor "
                 "WRITING_%08d is beside it): it is not removed, and this run could write over it\n"
                 "  hint: move it out of '%s' (a model file to start from can be given to -e from anywhere), or choose another -o",
                 foreign, foreign_step, foreign_step, foreign_step, o->out_dir);
        }
        // from here the run goes on: what it removes, no run could resume from, or --overwrite asked for
        RunInputs in = run_inputs(o);
        output_dir_spare_inputs(o->out_dir, DIR_FILES_INCOMPLETE, in.files, in.n, "removing an incomplete checkpoint (no DONE marker)");
        output_dir_remove(o->out_dir, DIR_FILES_INCOMPLETE, 1);
        if (!o->resume && (c.files > 0 || c.has_log)) {
            output_dir_spare_inputs(o->out_dir, DIR_FILES_EARLIER_RUN, in.files, in.n, "--overwrite 1");
            printf("--overwrite 1: removed %d file(s) of an earlier run from %s/\n", output_dir_remove(o->out_dir, DIR_FILES_EARLIER_RUN, 0),
                   o->out_dir);
        }
        run_inputs_free(&in);
        // room for one checkpoint (the model file and every rank's state file), before any training
        const ModelSetup* s = &r->setup;
        GPT2Config rank_config = setup_rank_config(s);
        size_t opt_floats = optimizer_state_floats_as(&rank_config, s->optimizer, s->use_beta1, zero_shards_state(s->zero) ? s->dist.world : 1,
                                                      s->state_format);
        char what[128];
        snprintf(what, sizeof(what), "one checkpoint (the model file and %d state file(s))", s->world.world);
        check_free_space(o->out_dir, checkpoint_bytes(&s->config, opt_floats, s->world.world), what);
    }
    dist_barrier();  // the other ranks write their state files into it
}

// -y 1 from the checkpoint of `step` against the steps to train (-x): past them, it stops
// (training on would never meet the end); at them, the run is complete: it says so, and
// returns 0 (nothing to train, nothing written); else sets the start step and returns 1
static int resume_within_steps(Run* r, int step) {
    if (step > r->max_steps) {
        fail("-y 1: the checkpoint to resume in '%s' is of step %d, past the %d steps to train (-x %d)\n"
             "  hint: -x %d or more to train it on", r->o->out_dir, step, r->max_steps, r->o->max_steps, step + 1);
    }
    r->start_step = step;
    r->complete = step == r->max_steps;
    if (r->complete) {
        printf("-y 1: the run in %s/ is complete: its checkpoint is of step %d, the last of -x %d; nothing to train\n"
               "  (-x %d or more trains it on)\n", r->o->out_dir, step, r->max_steps, step + 1);
    }
    return !r->complete;
}

// every file the run reads: a directory or an unreadable file stops the run, naming the flag,
// before -o is touched
static void check_input_files(const TrainOptions* o) {
    RunInputs in = run_inputs(o);
    for (int i = 0; i < in.n; i++) { check_input_file(in.files[i].flag, in.files[i].path, in.files[i].what); }
    run_inputs_free(&in);
}

// --profile N: step N must be one this run trains
static void check_profile_step(const Run* r) {
    int n = r->o->profile;
    if (n < 0 || (n > 0 && (n <= r->start_step || n > r->max_steps))) {
        fail("--profile %d: this run trains steps %d to %d, so it would profile nothing\n"
             "  hint: name a step in that range (after the first: its time holds the warm-up), or 0 for none",
             n, r->start_step + 1, r->max_steps);
    }
}

// --profile: after the profiled step, its table on stdout and, beside log.jsonl, OUT/profile.json (rank 0)
static void profile_report(const Run* r) {
    if (r->setup.world.rank != 0) { return; }
    prof_set_roofline(gpt2_profile_roofline());
    prof_print(stdout);
    if (r->o->profile == r->start_step + 1) { printf("  (the run's first step: its time holds the warm-up)\n"); }
    if (!r->has_out) { printf("  (no -o: profile.json not written)\n"); return; }
    char path[CHECKPOINT_PATH_LEN];
    snprintf(path, sizeof(path), "%s/profile.json", r->o->out_dir);
    AtomicFile f;
    atomic_open(&f, path);
    prof_write_json(f.f);
    atomic_commit(&f);
    printf("  (written to %s)\n", path);
}

// allocates and loads everything; the model's weights from -e or, with -y 1, the checkpoint
static void train_setup(Run* r) {
    const TrainOptions* o = r->o;
    const ModelSetup* s = &r->setup;
    check_input_files(o);
    gpt2_select_device(&s->world);
    check_memory_budget(&r->plan, o);
    DistGrid grid = {s->world, s->dist, s->tensor, s->pipeline, s->pair};
    check_memory_fits(&r->plan, &s->act, dist_local_ranks(), o, &grid);
    prepare_output_dir(r);
    // the fixed overhead, measured before any tensor exists: code, libraries, the OpenMP
    // threads' stacks (started by a first parallel region), the tokenizer
    #pragma omp parallel
    { (void)0; }
    tokenizer_init(&r->tok, o->tokenizer);
    r->rss_at_start = mem_rss_now();
    r->model = gpt2_create(s);
    gpt2_init_weights(r->model, o);
    ShardManifestRule rule = o->no_manifest ? SHARDS_WITHOUT_MANIFEST : SHARDS_NEED_MANIFEST;  // --no-manifest: llm.c's shards
    dataloader_init_rule(&r->train, o->train_data, s->B, s->T, s->dist.rank, s->dist.world, s->config.vocab_size, rule);
    if (r->has_val) { dataloader_init_rule(&r->val, o->val_data, s->B, s->T, s->dist.rank, s->dist.world, s->config.vocab_size, rule); }
    r->gen_tokens = sample_buffer_alloc(s->T);
    if (s->pipeline.world > 1) {  // --pp: this stage's list of a step, and the step's tokens (planned: scratch)
        r->pp_actions = (PpAction*)malloc_check((size_t)PP_MAX_ACTIONS(r->accum) * sizeof(PpAction));  // a few bytes an action: not counted
        r->pp_num_actions = pp_schedule(s->pp_schedule, s->pipeline.world, s->pipeline.rank, r->accum, r->pp_actions);
        pp_pair_exchanges(r->pp_actions, r->pp_num_actions);
        r->pp_tokens = (int*)mem_alloc(MEM_SCRATCH, (size_t)r->accum * 2 * s->B * s->T * sizeof(int));
    }
    r->max_steps = steps_to_train(r);
    r->sample_rng = sample_rng_seed(o->seed);
    r->run_id = o->resume ? 0 : new_run_id(s->world.rank);
    if (o->resume) {
        int step = s->world.rank == 0 ? resume_pick_step(o->out_dir, &s->config) : -1;
        dist_broadcast_bytes(&step, sizeof(step), 0);  // rank 0's pick, on every rank
        if (!resume_within_steps(r, step)) { return; }
    }
    r->start_step = o->resume ? resume_checkpoint(r->model, s, o->out_dir, r->start_step, &r->train, &r->sample_rng, &r->run_id) : 0;
    if (r->run_id == 0) { r->run_id = new_run_id(s->world.rank); }  // resumed from a version 2 state: one from now on
    check_profile_step(r);
    r->health.start_max_abs = gpt2_device_is_modelled() ? 0.0f : params_digest(r->model, PARAMS_READ).max_abs;
    r->health.ckpt_step = o->resume ? r->start_step : -1;
    r->health.ckpt_max_abs = r->health.start_max_abs;
    set_exit_now_text(r->has_out ? o->out_dir : NULL, r->health.ckpt_step);
    install_stop_signals();  // from here a signal stops the run at the next safe point
    print_config(r);
    printf("memory plan (bytes by category; measured after the first step):\n");
    print_memory_table(&r->plan, NULL);
    r->log = NULL;
    if (r->has_out && s->world.rank == 0) {
        char path[CHECKPOINT_PATH_LEN];
        snprintf(path, sizeof(path), "%s/log.jsonl", o->out_dir);
        if (o->resume) { r->log_has_start_val = log_truncate_after(path, r->start_step); }
        r->log = fopen_check(path, "a");  // a fresh run finds none (prepare_output_dir)
    }
    r->peak_flops = o->peak_tflops > 0.0f ? o->peak_tflops * 1e12 : gpt2_peak_flops(s->precision);
}

// stops the run at `step` (1-based), whose loss or norm (or weights, what) are not finite,
// saying what is true: the weights now, the last finite step and where the numbers first
// jumped, the newest checkpoint and whether it holds good weights, or that the file the run
// started from is the cause
static void fail_not_finite(Run* r, int step, const char* what, const char* then) {
    const TrainingHealth* h = &r->health;
    float now = params_digest(r->model, PARAMS_READ).max_abs;
    char history[320], ckpt[PATH_MAX_LEN + 256], hint[PATH_MAX_LEN + 192];
    if (h->last_step == 0) {
        snprintf(history, sizeof(history), "it is the first step of this run, from weights with max |w| = %.3g", h->start_max_abs);
    } else {
        int n = snprintf(history, sizeof(history), "the last finite step is %d (loss %.6f, norm %.4g, lr %.3g); ", h->last_step,
                         h->last_loss, h->last_norm, h->last_lr);
        if (h->jump_step > 0) {
            snprintf(history + n, sizeof(history) - n, "the loss or norm first jumped at step %d (loss %.6f, norm %.4g; lowest before: %.6f, %.4g)",
                     h->jump_step, h->jump_loss, h->jump_norm, h->jump_min_loss, h->jump_min_norm);
        } else {
            snprintf(history + n, sizeof(history) - n, "no jump before it (the loss within %.0f nat of its lowest, the norm within %.0fx): step %d's update made the weights diverge",
                     LOSS_JUMP_NATS, NORM_JUMP_FACTOR, h->last_step);
        }
    }
    const char* dir = r->has_out ? r->o->out_dir : NULL;
    if (dir == NULL) {
        snprintf(ckpt, sizeof(ckpt), "no checkpoint was written (-o \"\")");
    } else if (h->ckpt_step < 0) {
        snprintf(ckpt, sizeof(ckpt), "no checkpoint of this run is in '%s' yet", dir);
    } else if (h->ckpt_step == h->last_step && h->ckpt_step > r->start_step) {
        snprintf(ckpt, sizeof(ckpt), "the newest checkpoint in '%s', of step %d, holds the weights that give this (max |w| = %.3g; the run started from %.3g): "
                 "do not resume from it", dir, h->ckpt_step, h->ckpt_max_abs, h->start_max_abs);
    } else if (h->jump_step > 0 && h->ckpt_step >= h->jump_step) {
        snprintf(ckpt, sizeof(ckpt), "the newest checkpoint in '%s', of step %d, was written after the jump at step %d (max |w| = %.3g; the run started from %.3g)",
                 dir, h->ckpt_step, h->jump_step, h->ckpt_max_abs, h->start_max_abs);
    } else {
        snprintf(ckpt, sizeof(ckpt), "the newest checkpoint in '%s', of step %d, was written before any jump (max |w| = %.3g; the run started from %.3g)",
                 dir, h->ckpt_step, h->ckpt_max_abs, h->start_max_abs);
    }
    GPT2Config preset;
    if (h->last_step == 0 && (r->o->resume || !model_is_preset(r->o, &preset))) {
        snprintf(hint, sizeof(hint), "the weights loaded from %s '%s' give it at the first step, before any update: the file is the cause, not the training",
                 r->o->resume ? "the checkpoint in" : "the model file", r->o->resume ? r->o->out_dir : r->o->model);
    } else {
        snprintf(hint, sizeof(hint), "lower the learning rate (-l), keep --grad-clip on");
    }
    fail("%s at step %d; %s (the weights have max |w| = %.3g)\n  %s\n  %s\n  hint: %s", what, step, then, now, history, ckpt, hint);
}

// validation, a sample and a checkpoint as due before step `step` (0-based: the steps done;
// cut_short: a stop signal cut the next step short); returns 1 when the run ends here (the
// last step, or a stop signal). A pending stop skips the validation; the sample is drawn (its
// RNG is in the checkpoint, so a resumed run draws what an unstopped run would)
static int between_steps(Run* r, int step, int cut_short) {
    const TrainOptions* o = r->o;
    int last = step >= r->max_steps && !cut_short;  // (never past it: resume_within_steps)
    if (r->has_val && o->val_every > 0 && (step % o->val_every == 0 || last) && !dist_any(g_stop_requested)) {
        float vl = validation_loss(r->model, &r->val, o->val_steps, r->setup.dist);
        if (isnan(vl)) {
            printf("step %5d | validation cut short by the stop signal (not logged)\n", step);
        } else {
            printf("step %5d | val loss %.6f\n", step, vl);
            // a resumed step's validation is in the log if the run did it before its checkpoint
            if (r->log && !(step == r->start_step && r->log_has_start_val)) {
                fprintf(r->log, "{\"step\": %d, \"val_loss\": %.6f}\n", step, vl);
                fflush(r->log);
            }
        }
    }
    if (o->sample_every > 0 && step > r->start_step && !cut_short && (step % o->sample_every == 0 || last)) {
        printf("---- sample at step %d ----\n", step);
        sample_tokens(r->model, &r->setup.config, r->gen_tokens, r->setup.T, r->o->gen_tokens, &r->tok, &r->sample_rng);
        printf("---------------------------\n");
    }
    int stop = dist_any(g_stop_requested);  // all ranks stop at the same step
    int periodic = o->checkpoint_every > 0 && step > r->start_step && step % o->checkpoint_every == 0;
    // a stop before the first step of a resumed run: the checkpoint it resumed from holds this very
    // state. Not written again: a rewrite takes its DONE marker away until the new one, and a kill
    // then (the grace time of a preemption running out) would lose the run's only checkpoint
    int resumed_here = o->resume && step == r->start_step;
    if (r->has_out && (last || stop || periodic) && !resumed_here) {
        float max_abs = save_checkpoint(r->model, &r->setup, o->out_dir, step, &r->train, r->sample_rng, r->run_id);
        if (!isfinite(max_abs)) { fail_not_finite(r, step, "the weights are not finite after the update", "the checkpoint was not written"); }
        r->health.ckpt_step = step;
        r->health.ckpt_max_abs = max_abs;
        set_exit_now_text(o->out_dir, step);
        if (r->setup.world.rank == 0 && o->keep_checkpoints > 0) { prune_checkpoints(o, step); }
    }
    if (stop) {
        char during[64] = "";
        if (cut_short) { snprintf(during, sizeof(during), " step %d was cut short and dropped;", step + 1); }
        if (r->has_out && resumed_here) {
            printf("stopped by signal after step %d;%s checkpoint %d, which this run resumed from, is in %s/ (not written again): "
                   "resume with the same flags and -y 1\n", step, during, step, o->out_dir);
        } else if (r->has_out) {
            printf("stopped by signal after step %d;%s wrote checkpoint %d to %s/: resume with the same flags and -y 1\n",
                   step, during, step, o->out_dir);
        } else {
            printf("stopped by signal after step %d;%s nothing was saved (-o \"\")\n", step, during);
        }
    }
    return last || stop;
}

// a stdout whose reader went away (`| head -1`: SIGPIPE is ignored, train_main) gets a note on
// stderr, once: the run goes on, and log.jsonl holds every step
static void stdout_check_open(const Run* r) {
    static int said = 0;
    if (said || !ferror(stdout)) { return; }
    said = 1;
    fprintf(stderr, "note: standard output is closed (its reader went away): training goes on without progress lines%s\n",
            r->log ? "; log.jsonl in -o records every step" : "");
}

// --pp: the stages hold different layers, so each plans and measures its own memory (rank 0's
// table is stage 0's): every stage's planned and measured totals gathered to rank 0, a line each,
// and log.jsonl's "memory_stages" record (its categories, as "memory" has them, for each stage)
static void log_stage_memory(Run* r, int step) {
    const ModelSetup* s = &r->setup;
    int stages = s->pipeline.world, n = 2 * (NUM_MEM_CATEGORIES + 1);
    double* all = (double*)calloc_check((size_t)stages * n, sizeof(double));
    double* mine = all + (size_t)s->pipeline.rank * n;
    for (int k = 0; k < NUM_MEM_CATEGORIES; k++) {
        mine[k] = (double)r->plan.bytes[k];
        mine[NUM_MEM_CATEGORIES + 1 + k] = (double)g_mem.peak[k];
    }
    mine[NUM_MEM_CATEGORIES] = (double)plan_total(&r->plan);
    mine[n - 1] = (double)g_mem.total_peak;
    dist_allreduce_doubles_over(all, (size_t)stages * n, s->pipeline);  // each stage fills its own row
    printf("memory of each pipeline stage (planned vs measured; the table above is stage 0's):\n");
    if (r->log) { fprintf(r->log, "{\"step\": %d, \"memory_stages\": [", step + 1); }
    for (int st = 0; st < stages; st++) {
        const double* row = all + (size_t)st * n;
        char part[PP_STAGE_DESCRIBE_LEN];
        pp_stage_describe(pp_stage(s->config.num_layers, stages, st), part, sizeof(part));
        printf("  stage %d (%s): planned %.2f MiB, measured %.2f MiB\n", st, part, row[NUM_MEM_CATEGORIES] / MIB, row[n - 1] / MIB);
        if (r->log) {
            size_t planned[NUM_MEM_CATEGORIES], measured[NUM_MEM_CATEGORIES];
            for (int k = 0; k < NUM_MEM_CATEGORIES; k++) { planned[k] = (size_t)row[k]; measured[k] = (size_t)row[NUM_MEM_CATEGORIES + 1 + k]; }
            fprintf(r->log, "%s{\"planned\": ", st ? ", " : "");
            json_memory_object(r->log, planned, (size_t)row[NUM_MEM_CATEGORIES]);
            fprintf(r->log, ", \"measured\": ");
            json_memory_object(r->log, measured, (size_t)row[n - 1]);
            fprintf(r->log, "}");
        }
    }
    if (r->log) { fprintf(r->log, "]}\n"); fflush(r->log); }
    free(all);
}

// the progress line and log.jsonl's record of one step; after the first, the measured memory
static void log_step(Run* r, int step, double loss, float norm, float lr, double seconds) {
    const ModelSetup* s = &r->setup;
    double tokens = (double)s->B * s->T * r->accum * s->dist.world;
    double flops = flops_per_token(&s->config, s->T) * tokens / seconds;   // all ranks
    double mfu = r->peak_flops > 0.0 ? flops / (r->peak_flops * s->world.world) : -1.0;  // every rank's peak (--tp's too)
    double wait_ms = gpt2_copy_wait_ms(r->model);
    char extra[80] = "";
    if (mfu >= 0.0) { snprintf(extra, sizeof(extra), " | MFU %5.1f%%", 100.0 * mfu); }
    if (wait_ms >= 0.0) { snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra), " | copy wait %.1f ms", wait_ms); }
    printf("step %5d/%d | loss %.6f | norm %7.4f | lr %.2e | %8.1f ms | %7.0f tok/s | %6.1f GFLOP/s%s\n",
           step + 1, r->max_steps, loss, norm, lr, seconds * 1e3, tokens / seconds, flops / 1e9, extra);
    stdout_check_open(r);
    if (r->log) {
        fprintf(r->log, "{\"step\": %d, \"loss\": %.6f, \"grad_norm\": %.6f, \"lr\": %.6e, \"ms\": %.3f, \"tokens_per_s\": %.1f",
                step + 1, loss, norm, lr, seconds * 1e3, tokens / seconds);
        if (mfu >= 0.0) { fprintf(r->log, ", \"mfu\": %.4f", mfu); }
        if (wait_ms >= 0.0) { fprintf(r->log, ", \"copy_wait_ms\": %.3f", wait_ms); }
        fprintf(r->log, "}\n");
        fflush(r->log);
    }
    if (step == r->start_step) {
        printf("memory after the first step (planned vs measured high-water marks):\n");
        print_memory_table(&r->plan, &g_mem);
        size_t accounted = 0, used = gpt2_device_bytes_used(&accounted);
        if (used > 0) {
            printf("GPU memory taken since start-up (cudaMemGetInfo): %.2f MiB = %.2f MiB of the table's blocks in GPU memory\n"
                   "  + %.2f MiB of cuBLAS and allocation rounding\n", used / MIB, accounted / MIB, ((double)used - (double)accounted) / MIB);
        }
        if (r->log) { log_memory_json(r->log, step + 1, &r->plan, &g_mem); fflush(r->log); }
        if (r->setup.pipeline.world > 1) { log_stage_memory(r, step); }
    }
}

// --pp: a step's micro-steps as this stage's list (llmc/pipeline.h) says: the step's micro-batches read
// first (every stage reads them all, so that each sees micro-batch i as i), then each forward and
// backward on its micro-batch's activations (the stage holds several), the activations and their
// gradients passed to the neighbouring stages, a send and the receive after it from the same
// neighbour as one exchange. Returns the sum of the micro-batches' losses (the last stage's; 0 on the
// others). A stop signal is taken between steps only: a stage waiting in a message would not reach it
static double pp_micro_steps(Run* r) {
    const ModelSetup* s = &r->setup;
    int B = s->B, T = s->T, stage = s->pipeline.rank;
    size_t BT = (size_t)B * T;
    DataLoader* dl = &r->train;
    for (int micro = 0; micro < r->accum; micro++) {
        dataloader_next_batch(dl);
        memcpy(r->pp_tokens + (size_t)micro * 2 * BT, dl->inputs, BT * sizeof(int));
        memcpy(r->pp_tokens + ((size_t)micro * 2 + 1) * BT, dl->targets, BT * sizeof(int));
    }
    float loss_scale = 1.0f / ((float)B * T * r->accum * s->dist.world);
    double loss = 0.0;
    for (int k = 0; k < r->pp_num_actions; k++) {
        PpAction a = r->pp_actions[k];
        const int* inputs = r->pp_tokens + (size_t)a.micro * 2 * BT;
        const int* targets = inputs + BT;
        if (a.op == PP_FORWARD || a.op == PP_BACKWARD) { gpt2_pp_slot(r->model, pp_act_slot(a.micro, s->pp_held)); }
        if (a.op == PP_FORWARD) {
            float l = gpt2_forward_train(r->model, inputs, targets, B, T, loss_scale);
            if (stage == s->pipeline.world - 1) { loss += l; }
        } else if (a.op == PP_BACKWARD) {
            if (a.micro == r->accum - 1) { gpt2_reduce_during_backward(r->model); }  // the list's last backward (pipeline.h)
            gpt2_backward(r->model, inputs, targets, B, T, loss_scale);
        } else {  // a send followed by a receive from the same neighbour: one exchange
            gpt2_pp_message(r->model, a, a.with_next ? &r->pp_actions[++k] : NULL, s->pp_held);
        }
    }
    return loss;
}

// one optimizer step (0-based `step`): accum micro-steps on every rank, then the update.
// Returns 0 if a stop signal cut it short after a micro-step: nothing was updated, and the
// data loader is back where the step began
static int train_step(Run* r, int step) {
    const ModelSetup* s = &r->setup;
    int B = s->B, T = s->T, world = s->dist.world;
    int profiling = r->o->profile == step + 1;
    if (profiling) {
        gpt2_profile_begin(r->model);
        prof_begin(step + 1, gpt2_backend_name(), gpt2_profile_timing());
    }
    double t0 = now_seconds();
    gpt2_zero_grad(r->model);
    double loss = 0.0;
    DataLoader* dl = &r->train;
    size_t shard = dl->shard, position = dl->position;
    int epoch = dl->epoch;
    if (s->pipeline.world > 1) { loss = pp_micro_steps(r); }  // --pp: the stage's list of the step's micro-batches
    for (int micro = 0; micro < r->accum && s->pipeline.world == 1; micro++) {
        dataloader_next_batch(dl);
        float loss_scale = 1.0f / ((float)B * T * r->accum * world);
        loss += gpt2_forward_train(r->model, dl->inputs, dl->targets, B, T, loss_scale);
        if (micro == r->accum - 1) { gpt2_reduce_during_backward(r->model); }
        gpt2_backward(r->model, dl->inputs, dl->targets, B, T, loss_scale);
        if (micro + 1 < r->accum && dist_any(g_stop_requested)) {  // all ranks agree
            if (profiling) { prof_end(0.0); }  // the step is dropped, and its profile with it
            dataloader_seek(dl, shard, position, epoch);
            return 0;
        }
    }
    gpt2_reduce_grads(r->model);
    dist_allreduce_doubles_over(&loss, 1, s->dist);  // --tp: the ranks of a tensor group computed the same loss
    dist_allreduce_doubles_over(&loss, 1, s->pipeline);  // --pp: the last stage's (the others add 0)
    loss /= r->accum * world;
    float norm = gpt2_grad_norm(r->model);
    float lr = learning_rate_at(r->o, step, r->max_steps);
    if (!isfinite(loss) || !isfinite(norm)) {
        char what[128];
        snprintf(what, sizeof(what), "the loss (%f) or gradient norm (%f) is not finite", loss, norm);
        fail_not_finite(r, step + 1, what, "the weights were not updated");
    }
    health_record(&r->health, step + 1, (float)loss, norm, lr);
    StepConfig sc = {optimizer_hyper(r->o, s->optimizer, lr), r->o->grad_clip, step + 1};
    gpt2_update(r->model, &sc, norm);
    if (profiling) {
        gpt2_profile_end(r->model);
        prof_end(now_seconds() - t0);
    }
    if (r->o->check_replicas && s->world.world > 1) { check_replicas(r->model, s->world, step + 1); }
    log_step(r, step, loss, norm, lr, now_seconds() - t0);
    if (profiling) { profile_report(r); }
    return 1;
}

// the end-of-run replica check, the memory summary, and everything freed
static void train_teardown(Run* r, int step) {
    if (r->setup.world.world > 1 && !r->has_out && ranks_hold_replicas(r->setup.zero, r->setup.offload_optimizer)) { check_replicas(r->model, r->setup.world, step); }  // with -o, the last checkpoint checked
    size_t peak = mem_rss_peak();
    printf("peak RSS %.1f MiB = accounted tensors %.1f MiB + fixed overhead %.1f MiB (code, libraries, thread\n"
           "  stacks, tokenizer: measured before the first tensor) + %.1f MiB other (malloc arenas, stdio, page rounding)\n",
           peak / MIB, g_mem.total_peak / MIB, r->rss_at_start / MIB,
           ((double)peak - (double)g_mem.total_peak - (double)r->rss_at_start) / MIB);
    if (r->log) { fclose(r->log); }
    if (r->out_lock >= 0) { close(r->out_lock); }
    mem_free(r->gen_tokens);
    mem_free(r->pp_tokens);
    free(r->pp_actions);
    dataloader_free(&r->train);
    if (r->has_val) { dataloader_free(&r->val); }
    tokenizer_free(&r->tok);
    gpt2_destroy(r->model);
}

// --plan with a budget: one candidate's options planned as a run would plan them
typedef struct { const DistGrid* grid; int world; } PlanContext;
static void plan_options(const TrainOptions* o, void* ctx, MemPlan* plan, int* accum) {
    const PlanContext* pc = (const PlanContext*)ctx;
    Run r;
    memset(&r, 0, sizeof(r));
    r.o = o;
    plan_run(&r, pc->grid, pc->world);
    *plan = r.plan;
    *accum = r.accum;
}

// the cost model of the backend, or with --peak-tflops the achieved rate taken from it
static CostModel cost_model_of(const TrainOptions* o, Precision p) {
    CostModel m = gpt2_cost_model(p);
    if (o->peak_tflops > 0.0f) {
        m.flops = COST_ASSUMED_MFU * o->peak_tflops * 1e12;
        snprintf(m.flops_note, sizeof(m.flops_note), "%.0f%% of --peak-tflops %g", 100.0 * COST_ASSUMED_MFU, o->peak_tflops);
    }
    return m;
}

// for the message of a run that does not fit: the memory flags of --plan's search that would fit
// the budget (the fastest combination), or what else to change when none does
static void fitting_flags_hint(const TrainOptions* o, const DistGrid* grid, MemBudget budget, char* out, size_t n) {
    PlanContext ctx = {grid, grid->world.world};
    PlanSearch s = {.base = o, .world = grid->world.world, .budget = budget, .device_from = "the GPU's free memory",
                    .host_from = "the host's available memory", .cost = cost_model_of(o, precision_from_flag(o->precision)),
                    .prog = "", .plan = plan_options, .ctx = &ctx};
    char flags[256];
    if (!plan_search_fastest(&s, flags, sizeof(flags))) {
        int fp32 = precision_from_flag(o->precision) == PRECISION_FP32 && gpt2_default_precision() == PRECISION_BF16;
        snprintf(out, n, "no combination of --optimizer, --recompute and --offload fits (--plan --max-memory free lists them);\n"
                 "  lower -b or -t%s", fp32 ? ", or --precision bf16" : "");
    } else {
        snprintf(out, n, "these flags fit it (the fastest in --plan's search of the memory flags): %s\n"
                 "  (--plan --max-memory free lists every combination)", flags);
    }
}

// --plan: the memory table of these flags, or with a budget the search of the memory flags
static void print_plan(const Run* r, const DistGrid* grid, int world, const char* prog) {
    const TrainOptions* o = r->o;
    const GPT2Config* c = &r->setup.config;
    BudgetSource b;
    if (resolve_budgets(o, 1, &b)) {
        printf("memory budget search for L=%d C=%d NH=%d Vp=%d, B=%d T=%d (%s, %s), per rank of %d:\n", c->num_layers,
               c->channels, c->num_heads, c->padded_vocab_size, r->setup.B, r->setup.T, PRECISION_NAMES[r->setup.precision],
               gpt2_backend_name(), world);
        PlanContext ctx = {grid, world};
        PlanSearch s = {.base = o, .world = world, .budget = b.budget, .device_from = b.device_from, .host_from = b.host_from,
                        .cost = cost_model_of(o, r->setup.precision), .prog = prog, .plan = plan_options, .ctx = &ctx};
        plan_search(&s);
        return;
    }
    char part[64] = "";
    if (o->tp > 1) { snprintf(part, sizeof(part), " (--tp %d: its slices)", o->tp); }
    if (o->pp > 1) { snprintf(part, sizeof(part), " (--pp %d: stage %d's, the largest)", o->pp, r->plan_stage); }
    printf("memory plan for L=%d C=%d NH=%d Vp=%d, B=%d T=%d (%s, %s, %s), per rank of %d%s, --zero %d:\n", c->num_layers,
           c->channels, c->num_heads, c->padded_vocab_size, r->setup.B, r->setup.T, o->optimizer,
           PRECISION_NAMES[r->setup.precision], gpt2_backend_name(), world, part, o->zero);
    print_memory_table(&r->plan, NULL);
    if (o->pp > 1) {  // every stage's total, and the schedule's bubble
        char sched[PP_DESCRIBE_LEN];
        pp_schedule_describe(r->setup.pp_schedule, o->pp, r->accum, sched, sizeof(sched));
        printf("pipeline: %s\n", sched);
        for (int stage = 0; stage < o->pp; stage++) {
            int held;
            MemPlan plan = plan_stage(r, stage, &held);
            char what[PP_STAGE_DESCRIBE_LEN];
            pp_stage_describe(pp_stage(c->num_layers, o->pp, stage), what, sizeof(what));
            printf("  stage %d (%s): %.2f MiB, activations %.2f MiB (%d micro-batch%s)\n", stage, what, plan_total(&plan) / MIB,
                   plan.bytes[MEM_ACTIVATIONS] / MIB, held, held == 1 ? "" : "es");
        }
    }
}

// plans, then (unless --plan) trains: the whole program after the flags
static int run_training(const TrainOptions* o, const Dist* dist, const char* prog) {
    Run r;
    memset(&r, 0, sizeof(r));
    r.o = o;
    int world = o->plan_only && o->plan_ranks > 0 ? o->plan_ranks : dist->world;
    DistGrid grid = dist_grid_of_one(*dist);  // the world, before --tp and --pp split it
    plan_run(&r, &grid, world);  // checks --tp and --pp against the ranks and the model
    if (o->plan_only) {  // nothing allocated: any model can be planned on a laptop
        print_plan(&r, &grid, world, prog);
        return 0;
    }
    if (o->tp > 1 || o->pp > 1) {  // the stages, their tensor-parallel groups and the data-parallel groups across them
        grid = dist_grid(*dist, o->tp, o->pp);
        plan_run(&r, &grid, world);  // this rank's part: its slices, its stage
    }
    train_setup(&r);
    int step = r.start_step, done = 1;
    while (!r.complete && !between_steps(&r, step, !done)) {
        done = train_step(&r, step);
        step += done;
    }
    train_teardown(&r, step);
    return 0;
}

// ----------------------------------------------------------------------------
// --sample: a model file continues a prompt, and nothing is trained or written (no -o, no log,
// no checkpoint). The model is allocated for forward only (MODEL_FOR_SAMPLING) at B = 1 and
// T = -t; once the text is longer than T, the model sees its last T tokens (the window slides)

// the flags --sample reads besides its own; any other flag given with it is a training flag
static const char* const SAMPLE_READS[] = {"--model", "--tokenizer", "--seq", "--gen-tokens", "--seed", "--precision", "--attention",
                                           "--loss-chunk"};
// --sample's own flags, --sample first: without --sample they are refused (the training samples
// draw at temperature 1 from every token, after <|endoftext|>)
static const char* const SAMPLE_OWN[] = {"--sample", "--temperature", "--top-k", "--bpe"};
#define SAMPLE_LIST_LEN(list) ((int)(sizeof(list) / sizeof((list)[0])))

static int name_in(const char* name, const char* const* list, int n) {
    for (int i = 0; i < n; i++) {
        if (strcmp(name, list[i]) == 0) { return 1; }
    }
    return 0;
}

// appends to buf "-e, -k, ...": the flags named in list, by the short name where there is one
static void append_flag_names(char* buf, size_t n, const char* const* list, int count) {
    for (int i = 0; i < count; i++) {
        const FlagSpec* f = find_flag(list[i], strlen(list[i]));
        if (f == NULL) { fail("no flag %s in the table (llmc/flags.h)", list[i]); }
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", len ? ", " : "", f->shortname ? f->shortname : f->longname);
    }
}

// the flags on the command line against the mode: with --sample only what it reads, and one
// process; without it none of --sample's own
static void check_mode_flags(const TrainOptions* o, int world) {
    int sampling = flag_given(o, "--sample");
    char reads[256] = "";  // what --sample reads besides the prompt, for the message
    append_flag_names(reads, sizeof(reads), SAMPLE_READS, SAMPLE_LIST_LEN(SAMPLE_READS));
    append_flag_names(reads, sizeof(reads), SAMPLE_OWN + 1, SAMPLE_LIST_LEN(SAMPLE_OWN) - 1);
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagSpec* f = &FLAGS[i];
        if (!o->given[i]) { continue; }
        char name[64];
        flag_display_name(f, name, sizeof(name));
        int own = name_in(f->longname, SAMPLE_OWN, SAMPLE_LIST_LEN(SAMPLE_OWN));
        if (sampling && !own && !name_in(f->longname, SAMPLE_READS, SAMPLE_LIST_LEN(SAMPLE_READS))) {
            fail("%s is a training flag, and --sample trains nothing\n  hint: drop it; besides the prompt, --sample reads %s", name, reads);
        }
        if (!sampling && own) {
            fail("%s goes with --sample (the training samples draw at temperature 1 from every token)\n"
                 "  hint: drop it, or sample from a model file: -e out/model_00000200.bin --sample \"PROMPT\"", name);
        }
    }
    if (sampling && world > 1) {
        fail("--sample runs in one process, but this run has %d ranks\n  hint: run it without mpirun", world);
    }
}

// -e and the sampling flags against the model: a model file (a preset would be random weights)
static void sample_check_options(const TrainOptions* o, GPT2Config* c) {
    if (model_is_preset(o, c)) {
        fail("--sample continues the prompt with a trained model, but -e '%s' is a preset (random weights)\n"
             "  hint: -e out/model_00000200.bin: a model file that a training run wrote to its -o", o->model);
    }
    resolve_model_config(o, c);
    if (o->sample[0] == '\0') { fail("--sample \"\": the prompt is empty\n  hint: give the text to continue, e.g. --sample \"ROMEO:\""); }
    if (o->seq_len < 1 || o->seq_len > c->max_seq_len) {
        fail("-t %d: with --sample, the window of tokens the model sees, 1..%d (the model's maxT)\n"
             "  hint: the -t the model was trained with", o->seq_len, c->max_seq_len);
    }
    if (o->gen_tokens < 1 || o->gen_tokens > INT_MAX - PATH_MAX_LEN) {  // the prompt's tokens (< PATH_MAX_LEN: at most its bytes) and -g's in an int
        fail("-g %d: --sample generates 1..%d tokens", o->gen_tokens, INT_MAX - PATH_MAX_LEN);
    }
    check_float_range("--temperature", o->temperature, 0.0, END_CLOSED, INFINITY, END_OPEN, "0 = greedy");
    if (o->top_k < 0) { fail("--top-k %d: must be >= 0 (0 = every token)", o->top_k); }
}

// the folder of the BPE files: --bpe as given; without it data/gpt2 (where
// dev/data/tinyshakespeare.py downloads them when ../shared/data/gpt2 lacks them), and if that
// has none, ../shared/data/gpt2
#define SAMPLE_SHARED_BPE_DIR "../shared/data/gpt2"
static const char* sample_bpe_dir(const TrainOptions* o) {
    const char* dirs[2] = {o->bpe_dir, SAMPLE_SHARED_BPE_DIR};
    int tries = flag_given(o, "--bpe") ? 1 : 2;
    for (int i = 0; i < tries; i++) {
        char path[PATH_MAX_LEN + 32];
        snprintf(path, sizeof(path), "%s/%s", dirs[i], BPE_ENCODER_JSON);
        if (access(path, R_OK) == 0) { return dirs[i]; }
    }
    if (tries == 1) { fail("--bpe '%s': no %s there\n  hint: %s", o->bpe_dir, BPE_ENCODER_JSON, BPE_FILES_HINT); }
    fail("--sample: GPT-2's %s and %s are in neither %s/ nor %s/\n  hint: --bpe DIR; %s", BPE_ENCODER_JSON, BPE_VOCAB_BPE,
         o->bpe_dir, SAMPLE_SHARED_BPE_DIR, BPE_FILES_HINT);
    return NULL;
}

// the prompt in GPT-2's tokens, into a buffer with room for the -g tokens that follow; their
// number into *n
static int* sample_prompt_tokens(const TrainOptions* o, const GPT2Config* c, int* n) {
    size_t len = strlen(o->sample), bad = bpe_utf8_error(o->sample, len);
    if (bad < len) {
        fail("--sample: the prompt is not UTF-8 text (byte 0x%02x at offset %zu)\n  hint: give the prompt in UTF-8",
             (unsigned char)o->sample[bad], bad);
    }
    Bpe bpe;
    bpe_load(&bpe, sample_bpe_dir(o));
    int* tokens = (int*)malloc_check((len + (size_t)o->gen_tokens) * sizeof(int));
    *n = (int)bpe_encode(&bpe, o->sample, len, tokens);
    bpe_free(&bpe);
    for (int i = 0; i < *n; i++) {
        if (tokens[i] >= c->vocab_size) {
            fail("--sample: the prompt's token %d is id %d, outside the model's vocabulary of V=%d tokens\n"
                 "  hint: the prompt is in GPT-2's tokens (V=%d): a model trained on another vocabulary cannot read it",
                 i, tokens[i], c->vocab_size, GPT2_VOCAB_SIZE);
        }
    }
    return tokens;
}

// continues tokens[0..p) by n tokens, printing each as it comes: one forward each, over the
// last T tokens of the text
static void sample_continue(GPT2* m, int* tokens, int p, int n, int T, Sampler* sampler, uint64_t* rng, const Tokenizer* tok,
                            Utf8Printer* pr) {
    for (int t = p; t < p + n; t++) {
        int start = t > T ? t - T : 0;
        gpt2_forward(m, tokens + start, NULL, 1, t - start);
        tokens[t] = sampler_next(sampler, gpt2_probs(m, t - start - 1), rand_uniform(rng));
        print_token(tok, pr, tokens[t]);
    }
}

// the whole program with --sample
static int run_sampling(const TrainOptions* o, const Dist* dist) {
    ModelSetup s;
    memset(&s, 0, sizeof(s));
    sample_check_options(o, &s.config);
    s.B = 1;
    s.T = o->seq_len;
    s.precision = precision_from_flag(o->precision);
    s.act = ACT_KEEP_ALL;
    s.act.flash = attention_from_flag(o->attention, &s.config);
    act_policy_set_loss_chunk(&s.act, o->loss_chunk);
    setup_groups_of_one(&s, *dist);  // sampling is one process's: no --tp, no --pp
    s.use = MODEL_FOR_SAMPLING;
    gpt2_check_setup(&s);
    int p;
    int* tokens = sample_prompt_tokens(o, &s.config, &p);
    gpt2_select_device(&s.dist);
    GPT2* m = gpt2_create(&s);
    gpt2_init_weights(m, o);
    Tokenizer tok;
    if (o->tokenizer[0] != '\0') { check_input_file("-k", o->tokenizer, "tokenizer file"); }
    tokenizer_init(&tok, o->tokenizer);
    Sampler sampler = sampler_create(s.config.vocab_size, o->temperature, o->top_k);
    uint64_t rng = sample_rng_seed(o->seed);
    const GPT2Config* c = &s.config;
    printf("sample: %s (L=%d C=%d NH=%d V=%d maxT=%d), %s, %s\n", o->model, c->num_layers, c->channels, c->num_heads,
           c->vocab_size, c->max_seq_len, gpt2_backend_name(), PRECISION_NAMES[s.precision]);
    printf("sample: window -t %d, -g %d tokens, temperature %g%s, top-k %d%s, seed %llu\n", s.T, o->gen_tokens, o->temperature,
           o->temperature == 0.0f ? " (greedy)" : "", o->top_k, sampler.top_k == 0 ? " (every token)" : "", (unsigned long long)o->seed);
    if (p > s.T) { printf("note: the prompt is %d tokens, more than the window -t %d: the model sees its last %d\n", p, s.T, s.T); }
    printf("---- the prompt (%d tokens), then %d generated ----\n", p, o->gen_tokens);
    Utf8Printer pr = {{0}, 0, 0};  // the prompt and its continuation: one text
    for (int i = 0; i < p; i++) { print_token(&tok, &pr, tokens[i]); }
    double t0 = now_seconds();
    sample_continue(m, tokens, p, o->gen_tokens, s.T, &sampler, &rng, &tok, &pr);
    utf8_print_end(&pr, stdout);
    double seconds = now_seconds() - t0;
    printf("\n----\nsample: %d tokens in %.2f s (%.1f tokens/s)\n", o->gen_tokens, seconds, o->gen_tokens / seconds);
    sampler_free(&sampler);
    tokenizer_free(&tok);
    gpt2_destroy(m);
    free(tokens);
    return 0;
}

// the main() of every backend's program
static int train_main(int argc, char** argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    // a reader of stdout that goes away (`| head`) must not end the run: its writes then fail
    // (EPIPE, noted once: stdout_check_open) and the training, its checkpoints and log.jsonl go on
    signal(SIGPIPE, SIG_IGN);
    Dist dist;
    dist_init(&dist, &argc, &argv);
    // rank 0 speaks for the job: the other ranks' stdout is dropped (their errors still reach stderr)
    if (dist.rank != 0 && freopen("/dev/null", "w", stdout) == NULL) { fail("cannot silence stdout of rank %d", dist.rank); }
    TrainOptions opt = options_default();
    int rc = 0;
    if (!parse_flags(&opt, argc, argv)) {
        check_mode_flags(&opt, dist.world);
        SettingsDigest settings;
        settings_digest(&settings, &opt, dist.world, gpt2_backend_name());
        dist_set_settings_hash(settings.hash);   // the rendezvous refuses another job's peer
        if (dist_by_env() && !opt.plan_only) { gpt2_dist_start(&dist, opt.dist_init); }
        else if (opt.dist_init[0] != '\0' && !opt.plan_only) {
            fail("--dist-init %s: this run is %s, which needs no meeting\n  hint: --dist-init goes with srun or torchrun-style "
                 "variables (RANK, WORLD_SIZE, LOCAL_RANK) in a build of the CUDA trainer; drop it", opt.dist_init, dist_source());
        }
        if (!opt.plan_only) { settings_check_ranks(&settings, &opt, dist.rank, dist.world, gpt2_backend_name()); }
        rc = flag_given(&opt, "--sample") ? run_sampling(&opt, &dist) : run_training(&opt, &dist, argv[0]);
    }
    dist_finalize();
    return rc;
}

#endif // LLMC_TRAINER_H
