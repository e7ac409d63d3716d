/*
test_factored.cu: Adafactor and CAME on the device, cuda/adafactor.cuh and cuda/came.cuh, against
adafactor_update and came_update of cpu/optimizers.h: STEPS steps with a new gradient each, on
matrix slices of odd shapes (rows and columns multiples of nothing; more rows than the 64 row parts;
more columns than one block covers) and on vectors (a 1-row slice, a 1-column slice, one longer
than a block's pass, one shorter than 3 ranks), with and without Adafactor's first moment, weight
decay, the relative step and its scale_parameter, and a clip threshold that clips; one matrix whose
rows are whole 16-byte packs (the vector path), once aligned and once one float off (the element
path). After the last step the parameters and every float of the state are held to TOLERANCE
relative to the CPU's (the sums are in double in another order, so a statistic may round to the
neighbouring float); the same run twice on the device must give the same bits. Prints the worst
error of each case.

Under mpirun every slice is cut over the ranks as ZeRO-1 cuts it (llmc/opt_layout.h): each rank
updates its part on its device, the ranks' sums added by NCCL, against the CPU's update of the same
part with the ranks' sums added by MPI (the trainer's hooks: dist_allreduce_sum_doubles,
dist_allgather_floats_world). With 3 ranks the parts are uneven, and the 2 x 5 matrix and the
2-element vector leave a rank no rows (it still owns a column of the 2 x 5 matrix's statistics).

    make -f dev/cuda_emu/emu.mk build/emu/dev/cuda/test_factored && ./build/emu/dev/cuda/test_factored
    mpirun -np 3 ./build/emu/dev/cuda/test_factored   # ZeRO-1 parts, one emulated device per rank
    mpirun -np 2 ./build/emu/dev/cuda/test_factored tp   # --tp parts: the group's sums (OptComms.tensor)
    ./build/emu/dev/cuda/test_factored sharded        # a sharded slice without a communicator stops with a message

With `tp` the ranks are one tensor-parallel group (--tp, cpu/tensor_parallel.h) and each holds its part
of a tensor split over them as llmc/model_config.h splits it: fcw's rows (a column-parallel matrix:
the column statistics and mean(R) add the group's rows), fcprojw's columns (row-parallel: the row
statistics add the group's columns before their EMA), fcb's elements (a vector: its RMS). Each rank
updates its part on its device, the group's sums added by NCCL, against the CPU's update of the same
part with the group's sums added by MPI (OptShard.tp_sum).
*/
#include "dev/cuda/kernel_test.h"
#include "cpu/optimizers.h"
#include "cuda/adafactor.cuh"
#include "cuda/came.cuh"
#include "llmc/distributed.h"

static const int STEPS = 4;
static const double TOLERANCE = 1e-6;  // relative, per float of the parameters and of the state
static const double STATE_FLOOR = 1e-30;  // |want| below this counts as this (an EMA of zeros)

struct Shape { int rows, cols, offset; };  // offset: floats past a 16-byte aligned start
static const Shape SHAPES[] = {
    {37, 53, 0},    // odd both ways
    {70, 1030, 0},  // more rows than FACTORED_ROW_PARTS, columns past one block (1024)
    {64, 40, 0},    // whole packs: 16-byte loads
    {64, 40, 1},    // the same one float off: element by element
    {2, 5, 0},      // the smallest matrix
    {1, 45, 0},     // a 1-row slice: a vector
    {45, 1, 0},     // a 1-column slice: a vector
    {1, 1030, 3},   // a vector longer than a block's pass
    {1, 2, 0},      // a vector shorter than 3 ranks: one of them holds none of it
};

enum Optimizer { ADAFACTOR, CAME };
struct Case {
    const char* name;
    Optimizer opt;
    AdafactorHyper adafactor;
    CAMEHyper came;
};

// lr, beta1, decay_rate, eps1, eps2, clip_threshold, weight_decay, scale_parameter, relative_step
static const AdafactorHyper AF_RELATIVE = {0.0, 0.0, ADAFACTOR_DECAY_RATE, 1e-30, ADAFACTOR_EPS2, 1.0, 0.0, 1, 1};
static const AdafactorHyper AF_BETA1_WD = {1e-2, 0.9, ADAFACTOR_DECAY_RATE, 1e-30, ADAFACTOR_EPS2, 1.0, 0.1, 0, 0};
static const AdafactorHyper AF_BETA1_RELATIVE_CLIP = {0.0, 0.9, ADAFACTOR_DECAY_RATE, 1e-30, ADAFACTOR_EPS2, 0.5, 0.0, 1, 1};
static const AdafactorHyper AF_SCALED_WD = {3e-2, 0.0, ADAFACTOR_DECAY_RATE, 1e-30, ADAFACTOR_EPS2, 1.0, 0.1, 1, 0};
// lr, beta1, beta2, beta3, eps1, eps2, clip_threshold, weight_decay
static const CAMEHyper CAME_PLAIN = {1e-2, CAME_BETA1, CAME_BETA2, CAME_BETA3, 1e-30, CAME_EPS2, CAME_CLIP_THRESHOLD, 0.0};
static const CAMEHyper CAME_WD = {1e-2, CAME_BETA1, CAME_BETA2, CAME_BETA3, 1e-30, CAME_EPS2, 0.5, 0.1};

static const Case CASES[] = {
    {"adafactor relative step (no beta1)", ADAFACTOR, AF_RELATIVE, {}},
    {"adafactor beta1 0.9, weight decay, scheduled lr", ADAFACTOR, AF_BETA1_WD, {}},
    {"adafactor beta1 0.9, relative step, clip 0.5", ADAFACTOR, AF_BETA1_RELATIVE_CLIP, {}},
    {"adafactor scale_parameter with lr, weight decay", ADAFACTOR, AF_SCALED_WD, {}},
    {"came", CAME, {}, CAME_PLAIN},
    {"came weight decay, clip 0.5", CAME, {}, CAME_WD},
};

// this process's part of slice (rows, cols): the whole slice, or under mpirun (d.world > 1) rank
// d.rank's ZeRO-1 part, whose sums cross the ranks by the CPU trainer's MPI hooks (the device's by
// NCCL); *offset: floats from the slice's start to the part's
static OptShard slice_part(int rows, int cols, const Dist& d, size_t* offset) {
    ParamSlice s = param_slice_alone(0, rows, cols);
    OptSharding z = {d.rank, d.world, dist_allreduce_sum_doubles, dist_allgather_floats_world, 0};
    return slice_shard(&s, d.world > 1 ? &z : &OPT_UNSHARDED, offset);
}

static size_t state_floats(const Case& c, const OptShard* sh) {
    return c.opt == ADAFACTOR ? slice_state_floats(OPT_ADAFACTOR, sh, c.adafactor.beta1 > 0.0)
                              : slice_state_floats(OPT_CAME, sh, 0);
}

// step t's gradient of the part (n floats from offset) of a slice (rows, cols): uniform, each row
// scaled differently (so that the factored scales matter)
static std::vector<float> gradient(int rows, int cols, int t, size_t offset, size_t n) {
    std::vector<float> g = random_vector((size_t)rows * cols, 100 + t);
    for (int i = 0; i < rows; i++) {
        float scale = 1e-3f * (1 + (i * 7) % 13);
        for (int j = 0; j < cols; j++) { g[(size_t)i * cols + j] *= scale; }
    }
    return std::vector<float>(g.begin() + offset, g.begin() + offset + n);
}

// largest |got - want| / max(|want|, STATE_FLOOR); NaN counts as infinitely far
static double worst_rel(const std::vector<float>& got, const std::vector<float>& want) {
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); i++) {
        double d = fabs((double)got[i] - want[i]) / fmax(fabs((double)want[i]), STATE_FLOOR);
        if (!(d <= worst)) { worst = isnan(d) ? INFINITY : d; }
    }
    return worst;
}

// one update on the device; comms: the ranks' communicators (OPT_NO_COMMS: one process)
static void device_step(const Case& c, float* param, const float* grad, float* state, const OptShard* sh, int t,
                        void* scratch, OptComms comms) {
    if (c.opt == ADAFACTOR) {
        adafactor_update_cuda(param, grad, state, sh, &c.adafactor, t, scratch, comms, 0);
    } else {
        came_update_cuda(param, grad, state, sh, &c.came, scratch, comms, 0);
    }
}

// one update on the CPU (the reference)
static void cpu_step(const Case& c, float* param, const float* grad, float* state, const OptShard* sh, int t) {
    if (c.opt == ADAFACTOR) {
        adafactor_update(param, grad, state, sh, &c.adafactor, t);
    } else {
        came_update(param, grad, state, sh, &c.came);
    }
}

struct DeviceRun { std::vector<float> param, state; };

// STEPS steps on the device from param0 (the part sh) and a zero state, grads[t - 1] step t's
// gradient of the part, buffers `misalign` floats off alignment
static DeviceRun run_device(const Case& c, int misalign, const OptShard* sh, const std::vector<std::vector<float>>& grads,
                            const std::vector<float>& param0, OptComms comms) {
    size_t n = param0.size(), ns = state_floats(c, sh);
    float *bp = device_alloc<float>(n + 4), *bg = device_alloc<float>(n + 4), *bs = device_alloc<float>(ns + 4);
    float *d_param = bp + misalign, *d_grad = bg + misalign, *d_state = bs + misalign;
    void* scratch = device_alloc<char>(factored_scratch_bytes(sh));
    upload_into(d_param, param0);
    CUDA_CHECK(cudaMemset(d_state, 0, ns * sizeof(float)));
    for (int t = 1; t <= STEPS; t++) {
        upload_into(d_grad, grads[t - 1]);
        device_step(c, d_param, d_grad, d_state, sh, t, scratch, comms);
    }
    DeviceRun r = {download(d_param, n), download(d_state, ns)};
    for (void* p : {(void*)bp, (void*)bg, (void*)bs, scratch}) { CUDA_CHECK(cudaFree(p)); }
    return r;
}

// the slice s, whole or (mpirun) this rank's part, on the CPU and twice on the device
static void test_case(const Case& c, const Shape& s, const Dist& d, ncclComm_t comm) {
    size_t offset;
    OptShard sh = slice_part(s.rows, s.cols, d, &offset);
    size_t n = (size_t)sh.rows * sh.cols;
    std::vector<float> whole0 = random_vector((size_t)s.rows * s.cols, 7);
    std::vector<float> param0(whole0.begin() + offset, whole0.begin() + offset + n), param = param0;
    std::vector<float> state(state_floats(c, &sh), 0.0f);
    std::vector<std::vector<float>> grads;
    for (int t = 1; t <= STEPS; t++) {
        grads.push_back(gradient(s.rows, s.cols, t, offset, n));
        cpu_step(c, param.data(), grads.back().data(), state.data(), &sh, t);
    }
    OptComms comms = {comm, NULL};
    DeviceRun a = run_device(c, s.offset, &sh, grads, param0, comms), b = run_device(c, s.offset, &sh, grads, param0, comms);
    double ep = worst_rel(a.param, param), es = worst_rel(a.state, state);
    char shape[96], name[320];
    snprintf(shape, sizeof shape, "%d x %d%s%s", s.rows, s.cols, sh.factored ? "" : ", a vector", s.offset ? ", unaligned" : "");
    if (d.world > 1) {
        size_t len = strlen(shape);
        snprintf(shape + len, sizeof shape - len, ", rank %d's part of %d: %d x %d", d.rank, d.world, sh.rows, sh.cols);
    }
    snprintf(name, sizeof name, "%s (%s): %d steps vs cpu/optimizers.h: params %.1e, state %.1e <= %.0e", c.name, shape,
             STEPS, ep, es, TOLERANCE);
    check(ep <= TOLERANCE && es <= TOLERANCE, name, "%s", "over the tolerance");
    snprintf(name, sizeof name, "%s (%s): the same run twice, bitwise", c.name, shape);
    check(a.param == b.param && a.state == b.state, name, "%s", "the two runs differ");
}

// ----------------------------------------------------------------------------
// --tp (the `tp` argument under mpirun): the world is one tensor-parallel group

struct TpShape { int tensor, rows, cols; };  // the whole tensor; model_config.h's split of `tensor` cuts it
static const TpShape TP_SHAPES[] = {
    {10, 72, 45},    // fcw's rows (column-parallel): column sums and mean(R) over the group
    {10, 66, 1030},  // rows past the 64 row parts on 1 rank, columns past one block
    {12, 37, 1032},  // fcprojw's columns (row-parallel): each row's sum over the group's columns
    {12, 64, 48},    // whole packs
    {11, 1, 1032},   // fcb's elements (a vector): the RMS over the group
};

// rank's part of a whole (rows, cols) tensor split over n ranks as PARAMETER_TP_SPLIT[tensor] says: a
// block of rows (or of a vector's elements), or every row's block of columns
static std::vector<float> tp_part(const std::vector<float>& whole, const TpShape& t, int rank, int n, int* rows, int* cols) {
    int by_cols = PARAMETER_TP_SPLIT[t.tensor] == TP_COLUMNS || t.rows == 1;
    *rows = by_cols ? t.rows : t.rows / n;
    *cols = by_cols ? t.cols / n : t.cols;
    std::vector<float> part((size_t)*rows * *cols);
    for (int i = 0; i < *rows; i++) {
        for (int j = 0; j < *cols; j++) {
            size_t from = by_cols ? (size_t)i * t.cols + (size_t)rank * *cols + j : ((size_t)rank * *rows + i) * t.cols + j;
            part[(size_t)i * *cols + j] = whole[from];
        }
    }
    return part;
}

// this rank's part of the split tensor t, its sums over the group by MPI (the CPU's) and NCCL (the
// device's), against each other
static void test_tp_case(const Case& c, const TpShape& t, const Dist& d, ncclComm_t comm) {
    int rows, cols;
    std::vector<float> param0 = tp_part(random_vector((size_t)t.rows * t.cols, 7), t, d.rank, d.world, &rows, &cols);
    ParamSlice s = param_slice_alone(t.tensor, rows, cols);
    s.tp = d.world;  // the group holds the tensor's other parts
    s.whole_rows = t.rows;
    s.whole = (size_t)t.rows * t.cols;
    OptSharding z = OPT_UNSHARDED;
    z.tp_sum = dist_allreduce_sum_doubles;  // the world is the group
    size_t offset;
    OptShard sh = slice_shard(&s, &z, &offset);
    std::vector<float> param = param0, state(state_floats(c, &sh), 0.0f);
    std::vector<std::vector<float>> grads;
    for (int step = 1; step <= STEPS; step++) {
        int r, k;
        grads.push_back(tp_part(gradient(t.rows, t.cols, step, 0, (size_t)t.rows * t.cols), t, d.rank, d.world, &r, &k));
        cpu_step(c, param.data(), grads.back().data(), state.data(), &sh, step);
    }
    OptComms comms = {NULL, comm};
    DeviceRun a = run_device(c, 0, &sh, grads, param0, comms), b = run_device(c, 0, &sh, grads, param0, comms);
    double ep = worst_rel(a.param, param), es = worst_rel(a.state, state);
    char name[320];
    snprintf(name, sizeof name, "%s (--tp %d, %s %d x %d, rank %d's part %d x %d): %d steps vs cpu/optimizers.h: params %.1e, "
             "state %.1e <= %.0e", c.name, d.world, t.rows == 1 ? "a vector" : PARAMETER_TP_SPLIT[t.tensor] == TP_COLUMNS ?
             "row-parallel" : "column-parallel", t.rows, t.cols, d.rank, rows, cols, STEPS, ep, es, TOLERANCE);
    check(ep <= TOLERANCE && es <= TOLERANCE, name, "%s", "over the tolerance");
    snprintf(name, sizeof name, "%s (--tp %d, %d x %d): the same run twice, bitwise", c.name, d.world, t.rows, t.cols);
    check(a.param == b.param && a.state == b.state, name, "%s", "the two runs differ");
}

// the scratch the trainer keeps covers every slice of a model, whole and every ZeRO-1 part of 2..8 ranks
static void test_model_scratch() {
    GPT2Config c = {32, 64, 64, 2, 4, 32, 1, 1, 0, 0};  // max_seq_len, vocab_size, padded_vocab_size, layers, heads, channels, tp, pp, stage, first layer
    ParamSlice* s = param_slices_alloc(&c);
    size_t most = factored_model_scratch_bytes(&c), offset;
    bool covers = true;
    for (int world = 1; world <= 8; world++) {
        for (int rank = 0; rank < world; rank++) {
            OptSharding z = {rank, world, NULL, NULL, 0};
            for (int k = 0; k < param_slice_count(&c); k++) {
                OptShard sh = slice_shard(&s[k], &z, &offset);
                covers = covers && factored_scratch_bytes(&sh) <= most;
            }
        }
    }
    free(s);
    check(covers && most > 0, "factored_model_scratch_bytes covers every slice of the tiny model, whole and its ZeRO-1 parts",
          "%zu bytes", most);
}

// GPT-2 d12's fcw slice (3072 x 768) on a GPU
static void bench_factored() {
#ifdef CUDA_EMU
    const int rows = 96, cols = 32;
#else
    const int rows = 3072, cols = 768;
#endif
    size_t offset, n = (size_t)rows * cols;
    Dist one = {0, 1, DIST_WORLD};
    OptShard sh = slice_part(rows, cols, one, &offset);
    float *d_p = upload<float>(random_vector(n, 1)), *d_g = upload<float>(random_vector(n, 2));
    float* d_state = upload<float>(std::vector<float>(n + came_state_floats(&sh), 0.0f));
    void* scratch = device_alloc<char>(factored_scratch_bytes(&sh));
    // bytes: Adafactor reads g three times (sums, RMS(U), update) and p twice (RMS(p), update),
    // writes p; CAME also reads and writes M twice. FLOPs: roughly 30 and 50 per element
    char name[2][64];
    snprintf(name[0], sizeof name[0], "adafactor_update (%d x %d)", rows, cols);
    snprintf(name[1], sizeof name[1], "came_update (%d x %d)", rows, cols);
    bench(name[0], 4.0 * 6 * n, 30.0 * n, [&] { adafactor_update_cuda(d_p, d_g, d_state, &sh, &AF_RELATIVE, 2, scratch, OPT_NO_COMMS, 0); });
    bench(name[1], 4.0 * 9 * n, 50.0 * n, [&] { came_update_cuda(d_p, d_g, d_state, &sh, &CAME_PLAIN, scratch, OPT_NO_COMMS, 0); });
    for (void* p : {(void*)d_p, (void*)d_g, (void*)d_state, scratch}) { CUDA_CHECK(cudaFree(p)); }
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "sharded") == 0) {  // run_tests.sh: the message
        ParamSlice s = param_slice_alone(0, 8, 4);
        OptSharding z = {0, 2, NULL, NULL, 0};
        size_t offset;
        OptShard sh = slice_shard(&s, &z, &offset);
        adafactor_update_cuda(NULL, NULL, NULL, &sh, &AF_RELATIVE, 1, NULL, OPT_NO_COMMS, 0);
        return 0;
    }
    Dist d;
    dist_init(&d, &argc, &argv);  // mpirun: one rank per emulated device, NCCL among them
    CUDA_CHECK(cudaSetDevice(dist_local_rank()));
    ncclComm_t comm = d.world > 1 ? nccl_init(&d) : NULL;
    // one report per run: rank 0's lines, and at the end the totals of all ranks
    if (d.rank != 0 && freopen("/dev/null", "w", stdout) == NULL) { return EXIT_FAILURE; }
    int tp = argc > 1 && strcmp(argv[1], "tp") == 0;
    for (const Case& c : CASES) {
        if (tp) {
            for (const TpShape& t : TP_SHAPES) { test_tp_case(c, t, d, comm); }
        } else {
            for (const Shape& s : SHAPES) { test_case(c, s, d, comm); }
        }
    }
    test_model_scratch();
    if (d.world == 1 && !tp) { bench_factored(); }
    if (comm != NULL) { NCCL_CHECK(ncclCommDestroy(comm)); }
    if (d.rank != 0 && g_checks_failed > 0) { fprintf(stderr, "rank %d: %d check(s) failed\n", d.rank, g_checks_failed); }
    double counts[2] = {(double)g_checks_passed, (double)g_checks_failed};
    dist_allreduce_sum_doubles(counts, 2);
    g_checks_passed = (int)counts[0];
    g_checks_failed = (int)counts[1];
    dist_finalize();
    return check_summary();
}
