/*
test_gpt.c: tests of the CPU reference trainer. It includes train_gpt.c (without
its main) and checks it against an independent implementation:
- logits, loss, all 16 gradients and 10 AdamW steps against PyTorch, and 10 steps
  of Adafactor (HF transformers) and CAME (came-pytorch) (dev/reference/tiny_*.bin,
  made by dev/reference/make_reference.py);
- LayerNorm forward and backward, the encoder's backward and the attention bitwise equal to
  llm.c's plain loops (their sums run side by side, by blocks or on transposed keys, in the same order);
- a finite-difference check of the gradient of every parameter tensor;
- model-file round trips (fp32, and bf16 read), tokenizer decoding, the data
  loader walking every token once per epoch, the memory planner against the
  measured allocations (every optimizer, activation policy and ZeRO-1 rank count)
  and the CPU's activation layout against its closed forms;
- every --recompute / --offload policy bitwise equal to plain training;
- --tp's block (cpu/tensor_parallel.h) on 2 and 4 ranks (threads) against the whole block;
- -h against the flag table and the presets; the size and range checks (fail()
  paths run in a forked child);
- the sampler (greedy, temperature, top-k) against weights computed here, and a
  model allocated for sampling (forward only) against one allocated for training.

    make test_gpt && ./test_gpt            # prints "N passed, N failed", exit 1 on failure
    ./test_gpt --write-fixtures DIR        # tiny model, shards, tokenizer, and broken
                                           # variants of each, for tests/test_cli.py
    ./test_gpt --compare-models A B RTOL   # relative L2 distance of two model files
    ./test_gpt --bpe-encode DIR            # llmc/bpe.h on texts from stdin (tests/test_bpe.py)
    ./test_gpt --probs MODEL               # next-token probabilities after ids from stdin (--sample's tests)
    ./test_gpt --relayout-state SRC STEP OUT TP PP RANKS ZERO OPTIMIZER BETA1 FORMAT BT
                                           # a checkpoint's optimizer state on another layout (tests/test_relayout.py)
*/
#define TESTING
#include "train_gpt.c"

#include <sys/stat.h>
#include <sys/wait.h>
#include "llmc/bpe.h"
#include "tests/check.h"
#include "tests/fuzz_corpus.h"

// ----------------------------------------------------------------------------
// checks of what stops the program: fail() exits, so each runs in a child process

#define FAIL_TEXT_LEN 4096

// runs fn(arg) in a forked child (stdout dropped, stderr kept); passes if the child exits
// with status 1 through fail() ("error: ... (at file:line)") and its stderr holds phrase.
// The child runs no OpenMP region (the parent's thread pool is not in the child).
static void check_fails(const char* name, void (*fn)(void*), void* arg, const char* phrase) {
    fflush(stdout);
    fflush(stderr);
    FILE* err = tmpfile();
    if (err == NULL) { fail("tmpfile: %s", strerror(errno)); }
    pid_t pid = fork();
    if (pid < 0) { fail("fork: %s", strerror(errno)); }
    if (pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL) { _exit(3); }
        dup2(fileno(err), 2);
        fn(arg);
        _exit(0);  // returned: nothing stopped it
    }
    int status = 0;
    waitpid(pid, &status, 0);
    char text[FAIL_TEXT_LEN];
    rewind(err);
    size_t n = fread(text, 1, sizeof(text) - 1, err);
    text[n] = '\0';
    fclose(err);
    int exited1 = WIFEXITED(status) && WEXITSTATUS(status) == 1;
    check(exited1 && strstr(text, phrase) != NULL && strstr(text, "(at ") != NULL, name,
          "%s; stderr: %.300s", !WIFEXITED(status) ? "killed by a signal" : exited1 ? "stderr lacks the phrase" : "exit status not 1", text);
}


// largest |a-b| / (atol + rtol |b|) over n values; <= 1 means within tolerance
static double tolerance_ratio(const float* a, const float* b, size_t n, double atol, double rtol, size_t* worst) {
    double r = 0.0;
    *worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(d <= r)) { r = d; *worst = i; }  // NaN counts as worst
    }
    return r;
}

static void check_close(const char* name, const float* got, const float* want, size_t n, double atol, double rtol) {
    size_t w;
    double r = tolerance_ratio(got, want, n, atol, rtol, &w);
    check(r <= 1.0, name, "worst at %zu: got %.9g want %.9g (%.2fx the tolerance atol %g rtol %g)",
          w, n ? got[w] : 0.0f, n ? want[w] : 0.0f, r, atol, rtol);
}

// ----------------------------------------------------------------------------
// models for the tests, made as the trainer makes them (gpt2_create, then the weights)

// one process, micro-batches of (B,T), the given optimizer and activation policy
static ModelSetup test_setup(const GPT2Config* cfg, int B, int T, OptimizerKind opt, int beta1, const ActPolicy* pol) {
    ModelSetup s;
    memset(&s, 0, sizeof(s));
    s.config = *cfg;
    s.B = B;
    s.T = T;
    s.optimizer = opt;
    s.use_beta1 = beta1;
    s.act = *pol;
    Dist world = {0, 1, DIST_WORLD};
    setup_groups_of_one(&s, world);
    s.zero = ZERO_0;
    return s;
}

// the weights of a model file (free() them); its shape into cfg
static float* read_model_file(const char* path, GPT2Config* cfg) {
    int version;
    FILE* f = model_file_open(path, cfg, &version);
    float* params = (float*)malloc_check(gpt2_num_parameters(cfg) * sizeof(float));
    model_file_read_params(f, path, cfg, version, params);
    return params;
}

// a model with GPT-2's initialisation from seed (path NULL) or the weights of a model file
static GPT2* test_model(const ModelSetup* s, const char* path, uint64_t seed) {
    GPT2* m = gpt2_create(s);
    if (path == NULL) {
        gpt2_init_params(m->params_memory, &s->config, seed);
    } else {
        GPT2Config cfg;
        float* params = read_model_file(path, &cfg);
        if (memcmp(&cfg, &s->config, sizeof(cfg)) != 0) { fail("%s: not the shape of the test's setup", path); }
        memcpy(m->params_memory, params, m->num_parameters * sizeof(float));
        free(params);
    }
    return m;
}

// ----------------------------------------------------------------------------
// the PyTorch reference (layout: dev/reference/README.md)

#define REF_DIR "dev/reference/"
#define REF_HINT "regenerate with: python3 dev/reference/make_reference.py"
#define REF_MAGIC 20240327
#define REF_VERSION 2
enum { REF_SLOT_B = 2, REF_SLOT_T = 3, REF_SLOT_STEPS = 4, REF_SLOT_OPTIMIZER = 5,
       REF_SLOT_LR = 8, REF_SLOT_BETA1 = 9, REF_SLOT_BETA2 = 10, REF_SLOT_EPS1 = 11,
       REF_SLOT_WEIGHT_DECAY = 12, REF_SLOT_GRAD_CLIP = 13, REF_SLOT_EXTRA0 = 14, REF_SLOT_EXTRA1 = 15 };
#define REF_MAX_STEPS 64

// the tiny reference model of dev/reference/ for micro-batches of (B,T)
static GPT2* reference_model(int B, int T, OptimizerKind opt, int beta1) {
    GPT2Config cfg;
    free(read_model_file(REF_DIR "tiny_model.bin", &cfg));
    ModelSetup s = test_setup(&cfg, B, T, opt, beta1, &ACT_KEEP_ALL);
    return test_model(&s, REF_DIR "tiny_model.bin", 0);
}

typedef struct {
    int B, T, steps;
    OptimizerKind kind;
    float grad_clip;
    OptimizerHyper hyper;
    int* x; int* y;               // (B,T)
    float* logits;                // (B,T,V)
    float loss;                   // mean cross-entropy of the first forward
    float* grads;                 // (P) of the first backward, padded layout
    float losses[REF_MAX_STEPS];  // loss before each step
    float norms[REF_MAX_STEPS];   // grad norm before clipping
    float* final_params;          // (P) padded layout
} Reference;

static float slot_float(const int* h, int slot) { float f; memcpy(&f, &h[slot], sizeof(f)); return f; }

// the script's hyperparameters are Python doubles written as float32 (0.999 -> 0.999000013);
// the shortest decimal that rounds to the same float gives the double back (0.999), so that
// 1 - beta is what the packages computed (optimizers.h explains why that matters to CAME)
static double slot_decimal(const int* h, int slot) {
    float f = slot_float(h, slot);
    char s[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(s, sizeof(s), "%.*g", digits, f);
        if ((float)strtod(s, NULL) == f) { break; }
    }
    return strtod(s, NULL);
}

// the header's float slots, read as the optimizer of its id (README's slot table)
static OptimizerHyper hyper_from_header(const int* h, OptimizerKind kind) {
    OptimizerHyper o;
    memset(&o, 0, sizeof(o));
    double lr = slot_decimal(h, REF_SLOT_LR), beta1 = slot_decimal(h, REF_SLOT_BETA1), wd = slot_decimal(h, REF_SLOT_WEIGHT_DECAY);
    double beta2 = slot_decimal(h, REF_SLOT_BETA2), eps1 = slot_decimal(h, REF_SLOT_EPS1);
    double extra0 = slot_decimal(h, REF_SLOT_EXTRA0), extra1 = slot_decimal(h, REF_SLOT_EXTRA1);
    if (kind == OPT_ADAMW) {
        AdamWHyper a = {lr, beta1, beta2, eps1, wd};
        o.adamw = a;
    } else if (kind == OPT_ADAFACTOR) {  // lr 0: relative step with scale_parameter
        AdafactorHyper a = {lr, beta1, beta2, eps1, extra0, extra1, wd, lr == 0.0, lr == 0.0};
        o.adafactor = a;
    } else {
        CAMEHyper c = {lr, beta1, beta2, extra0, eps1, extra1, CAME_CLIP_THRESHOLD, wd};
        o.came = c;
    }
    return o;
}

static void reference_read(Reference* r, const char* path, const GPT2Config* cfg) {
    FILE* f = fopen_check(path, "rb");
    int h[FILE_HEADER_INTS];
    file_header_read(f, path, "reference file", REF_MAGIC, REF_HINT, h);
    file_header_check_version(h, path, "reference file", REF_VERSION, REF_HINT);
    r->B = h[REF_SLOT_B]; r->T = h[REF_SLOT_T]; r->steps = h[REF_SLOT_STEPS];
    if (r->steps > REF_MAX_STEPS || h[REF_SLOT_OPTIMIZER] < 0 || h[REF_SLOT_OPTIMIZER] >= NUM_OPTIMIZERS) {
        fail("%s: %d steps of optimizer %d: unexpected\n  hint: %s", path, r->steps, h[REF_SLOT_OPTIMIZER], REF_HINT);
    }
    r->kind = (OptimizerKind)h[REF_SLOT_OPTIMIZER];
    r->grad_clip = slot_float(h, REF_SLOT_GRAD_CLIP);
    r->hyper = hyper_from_header(h, r->kind);
    size_t BT = (size_t)r->B * r->T, P = gpt2_num_parameters(cfg);
    r->x = (int*)malloc_check(BT * sizeof(int));
    r->y = (int*)malloc_check(BT * sizeof(int));
    r->final_params = (float*)malloc_check(P * sizeof(float));
    r->logits = (float*)malloc_check(BT * cfg->vocab_size * sizeof(float));
    r->grads = (float*)malloc_check(P * sizeof(float));
    fread_check(r->x, sizeof(int), BT, f);
    fread_check(r->y, sizeof(int), BT, f);
    fread_check(r->logits, sizeof(float), BT * cfg->vocab_size, f);
    fread_check(&r->loss, sizeof(float), 1, f);
    fread_check(r->grads, sizeof(float), P, f);
    fread_check(r->losses, sizeof(float), r->steps, f);
    fread_check(r->norms, sizeof(float), r->steps, f);
    fread_check(r->final_params, sizeof(float), P, f);
    fclose(f);
}

static void reference_free(Reference* r) { free(r->x); free(r->y); free(r->final_params); free(r->logits); free(r->grads); }


// logits from the probabilities the forward leaves: log p + a per-row constant;
// compare the softmax instead (what the model defines), against the reference's softmax
static void reference_probs(float* probs, const float* logits, int BT, int V) {
    for (int bt = 0; bt < BT; bt++) {
        const float* x = logits + (size_t)bt * V;
        double maxv = x[0], sum = 0.0;
        for (int i = 1; i < V; i++) { if (x[i] > maxv) { maxv = x[i]; } }
        for (int i = 0; i < V; i++) { sum += exp(x[i] - maxv); }
        for (int i = 0; i < V; i++) { probs[(size_t)bt * V + i] = (float)(exp(x[i] - maxv) / sum); }
    }
}

static void test_against_pytorch(void) {
    GPT2Config cfg;
    free(read_model_file(REF_DIR "tiny_model.bin", &cfg));
    Reference r;
    reference_read(&r, REF_DIR "tiny_adamw.bin", &cfg);
    GPT2* m = reference_model(r.B, r.T, OPT_ADAMW, 0);
    const GPT2Config* c = &m->config;
    int BT = r.B * r.T, V = c->vocab_size, Vp = c->padded_vocab_size;

    // forward: the model keeps probabilities (softmax of the logits, in place)
    gpt2_forward(m, r.x, r.y, r.B, r.T);
    float* want_probs = (float*)malloc_check((size_t)BT * V * sizeof(float));
    float* got_probs = (float*)malloc_check((size_t)BT * V * sizeof(float));
    reference_probs(want_probs, r.logits, BT, V);
    for (int bt = 0; bt < BT; bt++) { memcpy(got_probs + (size_t)bt * V, m->acts->logits + (size_t)bt * Vp, V * sizeof(float)); }
    check_close("pytorch: probabilities (softmax of the logits)", got_probs, want_probs, (size_t)BT * V, 1e-7, 1e-5);
    // and the logits themselves, recomputed from the final LayerNorm output
    float* logits = (float*)malloc_check((size_t)BT * Vp * sizeof(float));
    matmul_forward(logits, m->acts->lnf, m->params.wte, NULL, r.B, r.T, c->channels, Vp);
    float* got_logits = (float*)malloc_check((size_t)BT * V * sizeof(float));
    for (int bt = 0; bt < BT; bt++) { memcpy(got_logits + (size_t)bt * V, logits + (size_t)bt * Vp, V * sizeof(float)); }
    check_close("pytorch: logits", got_logits, r.logits, (size_t)BT * V, 1e-5, 1e-5);
    int pad_zero = 1;
    for (int bt = 0; bt < BT; bt++) { for (int i = V; i < Vp; i++) { pad_zero &= logits[(size_t)bt * Vp + i] == 0.0f && m->acts->logits[(size_t)bt * Vp + i] == 0.0f; } }
    check(pad_zero, "pytorch: padded vocabulary columns stay zero", "nonzero logit or probability past V");
    check(fabsf(m->mean_loss - r.loss) <= 1e-5f * fabsf(r.loss), "pytorch: loss", "got %.8f want %.8f", m->mean_loss, r.loss);

    // backward: every parameter tensor's gradient
    gpt2_zero_grad(m);
    gpt2_backward(m, r.x, r.y, r.B, r.T, 1.0f / BT);
    size_t sizes[NUM_PARAMETER_TENSORS], off = 0;
    gpt2_parameter_sizes(sizes, c);
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        char name[64];
        snprintf(name, sizeof(name), "pytorch: gradient of %s", PARAMETER_NAMES[i]);
        // absolute floor: some entries are exactly zero in exact arithmetic (key biases)
        check_close(name, m->grads_memory + off, r.grads + off, sizes[i], 1e-7, 1e-4);
        off += sizes[i];
    }

    // ten AdamW steps on the same batch: losses, norms, final parameters
    float losses[REF_MAX_STEPS], norms[REF_MAX_STEPS];
    for (int s = 0; s < r.steps; s++) {
        gpt2_forward(m, r.x, r.y, r.B, r.T);
        losses[s] = m->mean_loss;
        gpt2_zero_grad(m);
        gpt2_backward(m, r.x, r.y, r.B, r.T, 1.0f / BT);
        norms[s] = gpt2_grad_norm(m);
        StepConfig sc = {r.hyper, r.grad_clip, s + 1};
        gpt2_update(m, &sc, norms[s]);
    }
    check_close("pytorch: AdamW step losses", losses, r.losses, r.steps, 0.0, 2e-6);
    check_close("pytorch: AdamW step gradient norms", norms, r.norms, r.steps, 0.0, 1e-5);
    // the key biases (rows C..2C-1 of qkvb) get an exactly-zero gradient in exact arithmetic
    // (softmax is shift-invariant); fp32 computes rounding noise of ~1e-11 there, which
    // Adam's normalisation turns into steps of up to lr: those entries get a looser floor
    size_t key_bias = (size_t)(m->params.qkvb - m->params_memory), C = c->channels;
    float* got = (float*)malloc_check(m->num_parameters * sizeof(float));
    memcpy(got, m->params_memory, m->num_parameters * sizeof(float));
    int keys_ok = 1;
    for (int l = 0; l < c->num_layers; l++) {
        for (size_t j = C; j < 2 * C; j++) {
            size_t i = key_bias + l * 3 * C + j;
            keys_ok &= fabsf(got[i] - r.final_params[i]) <= r.steps * (float)r.hyper.adamw.lr * 0.01f;
            got[i] = r.final_params[i];  // excluded from the tight check below
        }
    }
    check(keys_ok, "pytorch: key biases after the AdamW steps (within 1% of steps x lr)", "beyond");
    check_close("pytorch: parameters after the AdamW steps", got, r.final_params, m->num_parameters, 1e-6, 1e-4);
    free(got);
    free(want_probs); free(got_probs); free(logits); free(got_logits);
    reference_free(&r);
    gpt2_destroy(m);
}

// ----------------------------------------------------------------------------
// finite differences: for each tensor, the loss's change along a random direction
// against the gradient's projection on it, d/dh L(p + h d) = g . d

#define FD_STEP 1e-3
#define FD_TOLERANCE 2e-2  // relative error allowed between numeric and analytic derivative
#define FD_NOISE 1e-3      // fp32 loss rounding (~1e-6) over the step: the floor of the relative error

static double loss_at(GPT2* m, const int* x, const int* y, int B, int T) {
    gpt2_forward(m, x, y, B, T);
    return m->mean_loss;
}

static void test_finite_differences(void) {
    int B = 2, T = 7, BT = B * T;
    GPT2* m = reference_model(B, T, OPT_ADAMW, 0);
    const GPT2Config* c = &m->config;
    int x[14], y[14];
    uint64_t rng = 7;
    for (int i = 0; i < BT; i++) { x[i] = rand_u32(&rng) % c->vocab_size; y[i] = rand_u32(&rng) % c->vocab_size; }
    gpt2_forward(m, x, y, B, T);
    gpt2_zero_grad(m);
    gpt2_backward(m, x, y, B, T, 1.0f / BT);
    size_t sizes[NUM_PARAMETER_TENSORS], off = 0;
    gpt2_parameter_sizes(sizes, c);
    float* saved = (float*)malloc_check(m->num_parameters * sizeof(float));
    memcpy(saved, m->params_memory, m->num_parameters * sizeof(float));
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        size_t n = sizes[i];
        if (i == 0) { n = (size_t)c->vocab_size * c->channels; }  // padded rows have no gradient
        float* dir = (float*)malloc_check(n * sizeof(float));
        double gd = 0.0, dd = 0.0;
        for (size_t j = 0; j < n; j++) { dir[j] = rand_normal(&rng); gd += (double)m->grads_memory[off + j] * dir[j]; dd += (double)dir[j] * dir[j]; }
        // step so that each entry moves by about 1e-3: small against the weights (curvature),
        // large against fp32 rounding of the loss
        double h = FD_STEP / sqrt(dd / n);
        for (size_t j = 0; j < n; j++) { m->params_memory[off + j] = saved[off + j] + (float)(h * dir[j]); }
        double lp = loss_at(m, x, y, B, T);
        for (size_t j = 0; j < n; j++) { m->params_memory[off + j] = saved[off + j] - (float)(h * dir[j]); }
        double lm = loss_at(m, x, y, B, T);
        memcpy(m->params_memory + off, saved + off, n * sizeof(float));
        double fd = (lp - lm) / (2 * h);
        double err = fabs(fd - gd) / (fabs(gd) + FD_NOISE);
        char name[64];
        snprintf(name, sizeof(name), "finite differences: %s", PARAMETER_NAMES[i]);
        check(err < FD_TOLERANCE, name, "numeric %.6g analytic %.6g (relative error %.3g)", fd, gd, err);
        free(dir);
        off += sizes[i];
    }
    free(saved);
    gpt2_destroy(m);
}

// ----------------------------------------------------------------------------
// model files

static void test_model_files(const char* dir) {
    GPT2Config ca, cb, cc;
    float* a = read_model_file(REF_DIR "tiny_model.bin", &ca);
    size_t P = gpt2_num_parameters(&ca);
    char path[CHECKPOINT_PATH_LEN];
    snprintf(path, sizeof(path), "%s/roundtrip.bin", dir);
    model_file_write(path, &ca, a);
    float* b = read_model_file(path, &cb);
    check(memcmp(&ca, &cb, sizeof(ca)) == 0 && memcmp(a, b, P * sizeof(float)) == 0,
          "model file: write then read gives the same config and weights bitwise", "differs");
    struct stat st;
    snprintf(path, sizeof(path), "%s/roundtrip.bin.tmp", dir);
    check(stat(path, &st) != 0, "model file: no temporary file left after an atomic write", "%s exists", path);
    // bf16 (version 5): the top 16 bits of each weight, read back widened exactly
    snprintf(path, sizeof(path), "%s/bf16.bin", dir);
    FILE* f = fopen_check(path, "wb");
    int h[FILE_HEADER_INTS] = {0};
    h[MODEL_SLOT_MAGIC] = MODEL_MAGIC; h[MODEL_SLOT_VERSION] = MODEL_VERSION_BF16;
    h[MODEL_SLOT_MAX_SEQ_LEN] = ca.max_seq_len; h[MODEL_SLOT_VOCAB_SIZE] = ca.vocab_size;
    h[MODEL_SLOT_NUM_LAYERS] = ca.num_layers; h[MODEL_SLOT_NUM_HEADS] = ca.num_heads;
    h[MODEL_SLOT_CHANNELS] = ca.channels; h[MODEL_SLOT_PADDED_VOCAB] = ca.padded_vocab_size;
    fwrite_check(h, sizeof(int), FILE_HEADER_INTS, f);
    for (size_t i = 0; i < P; i++) {
        uint32_t bits; memcpy(&bits, &a[i], 4);
        uint16_t top = (uint16_t)(bits >> 16);
        fwrite_check(&top, sizeof(top), 1, f);
    }
    fclose(f);
    float* c = read_model_file(path, &cc);
    int same = 1;
    for (size_t i = 0; i < P; i++) {
        uint32_t bits; memcpy(&bits, &a[i], 4);
        bits &= 0xFFFF0000u;
        float want; memcpy(&want, &bits, 4);
        same &= c[i] == want;
    }
    check(same, "model file: bf16 (version 5) weights read as their exact fp32 values", "differs");
    free(a); free(b); free(c);
}

// ----------------------------------------------------------------------------
// tokenizer

static void write_tokenizer(const char* path, int V) {
    FILE* f = fopen_check(path, "wb");
    int h[FILE_HEADER_INTS] = {0};
    h[FILE_SLOT_MAGIC] = TOKENIZER_MAGIC; h[FILE_SLOT_VERSION] = TOKENIZER_VERSION; h[TOKENIZER_SLOT_VOCAB_SIZE] = V;
    h[TOKENIZER_SLOT_VOCAB_SIZE + 1] = V - 1;  // the EOT id, as llm.c writes it (not read here)
    fwrite_check(h, sizeof(int), FILE_HEADER_INTS, f);
    for (int i = 0; i < V; i++) {
        char s[16];
        unsigned char len = (unsigned char)snprintf(s, sizeof(s), "<t%d>", i);
        fwrite_check(&len, 1, 1, f);
        fwrite_check(s, 1, len, f);
    }
    fclose(f);
}

// crc32.h against zlib's CRC-32 (the check value of the standard, which Python's zlib.crc32 gives the
// tests and the export), and a file checked in pieces of every length as checked whole
static void test_crc32(void) {
    check(crc32_update(0, "123456789", 9) == 0xCBF43926u, "crc32: the standard's check value", "0x%08x", crc32_update(0, "123456789", 9));
    check(crc32_update(0, "", 0) == 0, "crc32: of nothing, 0", "0x%08x", crc32_update(0, "", 0));
    unsigned char buf[100];
    for (int i = 0; i < 100; i++) { buf[i] = (unsigned char)(i * 37 + 11); }
    uint32_t whole = crc32_update(0, buf, sizeof(buf)), bad = 0;
    for (int cut = 0; cut <= 100; cut++) { bad += crc32_update(crc32_update(0, buf, (size_t)cut), buf + cut, 100 - (size_t)cut) != whole; }
    check(bad == 0, "crc32: in two pieces (every cut, unaligned tails) as whole", "%u cuts differ", bad);
    buf[57] ^= 0x10;
    check(crc32_update(0, buf, sizeof(buf)) != whole, "crc32: one bit changed changes it", "same 0x%08x", whole);
}

static void test_tokenizer(const char* dir) {
    char path[CHECKPOINT_PATH_LEN];
    snprintf(path, sizeof(path), "%s/tok.bin", dir);
    write_tokenizer(path, 300);
    Tokenizer t;
    tokenizer_init(&t, path);
    check(t.init_ok && t.vocab_size == 300, "tokenizer: header read", "init_ok %d V %u", t.init_ok, t.vocab_size);
    check(strcmp(tokenizer_decode(&t, 0), "<t0>") == 0 && strcmp(tokenizer_decode(&t, 257), "<t257>") == 0,
          "tokenizer: decode gives each token's bytes", "got '%s'", tokenizer_decode(&t, 257));
    check(strcmp(tokenizer_decode(&t, 300), "") == 0, "tokenizer: an id past the vocabulary decodes to nothing", "not empty");
    tokenizer_free(&t);
    Tokenizer none;
    tokenizer_init(&none, "");
    check(!none.init_ok, "tokenizer: empty path turns decoding off", "init_ok set");
}

// the token pieces printed one after another through one Utf8Printer; the bytes printed
// against want (want_len bytes)
static void check_utf8_print(const char* name, const char* const* pieces, int n, const char* want) {
    char* buf = NULL;
    size_t len = 0;
    FILE* out = open_memstream(&buf, &len);
    if (out == NULL) { fail("open_memstream: %s", strerror(errno)); }
    Utf8Printer pr = {{0}, 0, 0};
    for (int i = 0; i < n; i++) { utf8_print(&pr, pieces[i], out); }
    utf8_print_end(&pr, out);
    fclose(out);
    check(len == strlen(want) && memcmp(buf, want, len) == 0, name, "printed %zu bytes '%s', want %zu '%s'", len, buf,
          strlen(want), want);
    free(buf);
}

// samples print as UTF-8: the bytes of consecutive tokens are one stream (GPT-2 splits
// characters across tokens), every valid character whole, a lone invalid byte or a sequence
// cut short as one U+FFFD, a control character as its picture
static void test_utf8_printer(void) {
    const char* cjk[] = {"\xe6", "\x97\xa5", "\xe6\x9c", "\xac", "\xe8\xaa\x9e"};  // 日 本 語, 日 and 本 split
    check_utf8_print("utf-8: CJK split across tokens prints whole", cjk, 5, "日本語");
    const char* emoji[] = {"\xf0", "\x9f", "\x99", "\x82", "!"};  // 🙂 one byte a token
    check_utf8_print("utf-8: an emoji split into four tokens prints whole", emoji, 5, "🙂!");
    const char* combining[] = {"e", "\xcc", "\x81", " U\xcc\x88"};  // e + U+0301, U + U+0308
    check_utf8_print("utf-8: combining marks are printed after their letters", combining, 4, "e\xcc\x81 U\xcc\x88");
    const char* umlaut[] = {"\xc3", "\x9c", "n"};  // Ü in two tokens (llm.c drops the byte 0xC3 of its own token)
    check_utf8_print("utf-8: a two-byte letter in two tokens", umlaut, 3, "Ün");
    const char* lone[] = {"a\xff", "b", "\x80", "c"};
    check_utf8_print("utf-8: lone invalid bytes print as U+FFFD each", lone, 4, "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c");
    const char* cut[] = {"\xe6\x97", "x", "\xf0\x9f\x99"};  // a sequence cut short by ASCII, and one at the end
    check_utf8_print("utf-8: a sequence cut short prints one U+FFFD, then what follows", cut, 3, "\xef\xbf\xbdx\xef\xbf\xbd");
    // overlong NULs (two and three bytes), a surrogate, above U+10FFFF: one U+FFFD a byte
    const char* invalid[] = {"\xc0\x80", "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80"};
    check_utf8_print("utf-8: overlong forms, surrogates and code points past U+10FFFF are not printed raw", invalid, 4,
                     "\xef\xbf\xbd\xef\xbf\xbd" "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                     "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    const char* control[] = {"a\x1b[2J", "\t\n", "\x7f"};  // ESC would steer a terminal
    check_utf8_print("utf-8: control characters print as their pictures, tab and newline as themselves", control, 3,
                     "a\xe2\x90\x9b[2J\t\n\xe2\x90\xa1");
}

// ----------------------------------------------------------------------------
// data loader

// a shard, and beside it its manifest (llmc/manifest.h), a set of one shard: dir/NAME.bin and
// dir/NAME_manifest.txt, a vocabulary of its largest token + 1
static void write_shard(const char* path, const uint16_t* tokens, int n) {
    FILE* f = fopen_check(path, "wb");
    int h[FILE_HEADER_INTS] = {0};
    h[FILE_SLOT_MAGIC] = SHARD_MAGIC; h[FILE_SLOT_VERSION] = SHARD_VERSION; h[SHARD_SLOT_NUM_TOKENS] = n;
    fwrite_check(h, sizeof(int), FILE_HEADER_INTS, f);
    fwrite_check(tokens, sizeof(uint16_t), n, f);
    fclose(f);
    uint32_t crc = crc32_update(crc32_update(0, h, sizeof(h)), tokens, (size_t)n * sizeof(uint16_t));
    Manifest m;
    memset(&m, 0, sizeof(m));
    snprintf(m.tokenizer, sizeof(m.tokenizer), "fixture");
    for (int i = 0; i < n; i++) { m.vocab_size = tokens[i] >= m.vocab_size ? tokens[i] + 1 : m.vocab_size; }
    m.vocab_size += m.vocab_size == 0;
    m.eot = m.vocab_size - 1;
    const char* slash = strrchr(path, '/');
    manifest_add(&m, "train", slash ? slash + 1 : path, n, crc);
    char manifest[CHECKPOINT_PATH_LEN];
    if (snprintf(manifest, sizeof(manifest), "%.*s%s", (int)strlen(path) - 4, path, MANIFEST_SUFFIX) >= (int)sizeof(manifest)) {  // less ".bin"
        fail("path too long: '%s'", path);
    }
    AtomicFile a;
    atomic_open(&a, manifest);
    manifest_write(a.f, &m);
    atomic_commit(&a);
    manifest_free(&m);
}

// over one epoch, every token position of the shards must be an input exactly once,
// except each shard's tail that does not fill a whole step
static void test_dataloader(const char* dir) {
    enum { N0 = 1000, N1 = 777, B = 2, T = 8 };
    uint16_t toks[N0];
    for (int i = 0; i < N0; i++) { toks[i] = (uint16_t)i; }  // token = position: inputs say where they came from
    char p0[1100], p1[1100], pattern[1100];
    snprintf(p0, sizeof(p0), "%s/walk_000.bin", dir);
    snprintf(p1, sizeof(p1), "%s/walk_001.bin", dir);
    snprintf(pattern, sizeof(pattern), "%s/walk_*.bin", dir);
    write_shard(p0, toks, N0);
    for (int i = 0; i < N1; i++) { toks[i] = (uint16_t)(N0 + i); }  // shard 1 continues the numbering
    write_shard(p1, toks, N1);
    for (int procs = 1; procs <= 2; procs++) {
        static int seen[N0 + N1];
        memset(seen, 0, sizeof(seen));
        DataLoader dl[2];
        for (int r = 0; r < procs; r++) { dataloader_init(&dl[r], pattern, B, T, r, procs, 65535); }
        int step_tokens = B * T * procs;
        int steps = (N0 - 1) / step_tokens + (N1 - 1) / step_tokens;
        int targets_ok = 1;
        for (int s = 0; s < steps; s++) {
            for (int r = 0; r < procs; r++) {
                dataloader_next_batch(&dl[r]);
                for (int i = 0; i < B * T; i++) {
                    seen[dl[r].inputs[i]]++;
                    targets_ok &= dl[r].targets[i] == dl[r].inputs[i] + 1;
                }
            }
        }
        int covered0 = (N0 - 1) / step_tokens * step_tokens, covered1 = (N1 - 1) / step_tokens * step_tokens;
        int once = 1;
        for (int i = 0; i < N0 + N1; i++) {
            int in_range = i < covered0 || (i >= N0 && i < N0 + covered1);
            once &= seen[i] == (in_range ? 1 : 0);
        }
        char name[96];
        snprintf(name, sizeof(name), "data loader: %d process(es) see every position once per epoch", procs);
        check(once, name, "a position was skipped or repeated");
        snprintf(name, sizeof(name), "data loader: %d process(es): targets are the next tokens", procs);
        check(targets_ok, name, "target != input + 1");
        dataloader_next_batch(&dl[0]);
        snprintf(name, sizeof(name), "data loader: %d process(es): the next epoch starts at the first shard", procs);
        check(dl[0].epoch == 1 && dl[0].inputs[0] == 0, name, "epoch %d first input %d", dl[0].epoch, dl[0].inputs[0]);
        for (int r = 0; r < procs; r++) { dataloader_free(&dl[r]); }
    }
}

// ----------------------------------------------------------------------------
// memory: the planner's closed forms equal what the trainer allocates

// the activation policies the tests run: every kind of --recompute and --offload, alone
// and together. Segment sizes beyond a model's L are clamped to L; a policy the trainer
// refuses for a model (offload with one segment) is skipped.
static const ActPolicy TEST_POLICIES[] = {
    {0, 0, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 0, 0, 0}, {2, 0, 0, 0, 0, 0, 0}, {3, 0, 0, 0, 0, 0, 0}, {0, 1, 0, 0, 0, 0, 0}, {0, 0, 1, 0, 0, 0, 0}, {0, 1, 1, 0, 0, 0, 0},
    {2, 1, 1, 0, 0, 0, 0}, {0, 0, 0, 1, 0, 0, 0}, {0, 1, 1, 1, 0, 0, 0}, {1, 0, 0, 1, 0, 0, 0}, {2, 0, 1, 1, 0, 0, 0}, {3, 1, 0, 1, 0, 0, 0},
    // flash attention (attn is implied): alone, with gelu, checkpointing and offload
    {0, 0, 1, 0, 1, 0, 0}, {0, 1, 1, 0, 1, 0, 0}, {2, 0, 1, 0, 1, 0, 0}, {0, 0, 1, 1, 1, 0, 0}, {1, 1, 1, 1, 1, 0, 0},
};
#define NUM_TEST_POLICIES ((int)(sizeof(TEST_POLICIES) / sizeof(TEST_POLICIES[0])))

// TEST_POLICIES[i] for a model of L layers; 0 if the trainer would refuse it
static int test_policy(ActPolicy* p, int i, int L) {
    *p = TEST_POLICIES[i];
    if (p->segment > L) { p->segment = L; }
    return !(p->offload && p->segment > 0 && act_num_segments(p, L) == 1);
}

static void policy_name(char* out, size_t n, const ActPolicy* p) {
    int used = snprintf(out, n, "k=%d%s%s%s", p->segment, p->gelu ? " gelu" : "", p->flash ? " flash" : p->attn ? " attn" : "",
                        p->offload ? " offload" : "");
    if (p->loss_chunk > 0) { snprintf(out + used, n - used, " loss-chunk %d", p->loss_chunk); }
}

// the CPU layout that the planner reads against its closed forms (doc/memory.md's memory table):
// A = 4(16BTC + 4BT + B NH T^2) of which GELU 4(4BTC) and attention 4(B NH T^2), R = 4BTC,
// head = 4(BTC + 3BT + BT Vp), backward = 4(13BTC + B NH T^2); flash attention: B NH T
// (the log-sum-exp) in A instead of B NH T^2, which attn recompute does not drop, and no
// attention weights in backward; --loss-chunk K < BT: head = 4(3BT + K(C + Vp))
static void check_layout_closed_form(const GPT2Config* c, int B, int T, int flash, int chunk) {
    size_t F = sizeof(float), BT = (size_t)B * T, BTC = BT * c->channels, att = (size_t)B * c->num_heads * T * T;
    size_t lse = (size_t)B * c->num_heads * T, K = chunk > 0 && (size_t)chunk < BT ? (size_t)chunk : BT;
    const ActPolicy layout_policy = {.flash = flash, .loss_chunk = chunk};
    BackendLayout l = gpt2_layout(c, B, T, PRECISION_FP32, &layout_policy);
    int ok = l.param_bytes == F && l.grad_bytes == F && l.layer == F * (16 * BTC + 4 * BT + (flash ? lse : att)) &&
             l.layer_gelu == F * 4 * BTC && l.layer_att == (flash ? 0 : F * att) && l.residual == F * BTC &&
             l.head == F * (K * c->channels + 3 * BT + K * c->padded_vocab_size) && l.head_rows == (int)K &&
             l.backward == F * (13 * BTC + (flash ? 0 : att));
    char name[128];
    snprintf(name, sizeof(name), "memory: CPU layout equals its closed forms (L=%d C=%d B=%d T=%d%s, loss chunk %d)", c->num_layers,
             c->channels, B, T, flash ? ", flash attention" : "", chunk);
    check(ok, name, "A %zu, gelu %zu, att %zu, R %zu, head %zu, backward %zu", l.layer, l.layer_gelu, l.layer_att, l.residual, l.head, l.backward);
}

// allocates as the trainer does (gpt2_create, one data loader on a real shard, the sampling
// buffer) and compares the plan with the high-water marks, category by category
static void check_plan_equals_allocations(const GPT2Config* cfg, int B, int T, int opt, int beta1, const ActPolicy* pol,
                                          int world, const char* shard) {
    memset(&g_mem, 0, sizeof(g_mem));
    ModelSetup s = test_setup(cfg, B, T, (OptimizerKind)opt, beta1, pol);
    Dist last_rank = {world - 1, world, DIST_WORLD};  // the rank whose blocks are shortest: same state size
    s.dist = last_rank;
    s.zero = world > 1 ? ZERO_1 : ZERO_0;
    GPT2* m = gpt2_create(&s);
    DataLoader dl;
    dataloader_init(&dl, shard, B, T, last_rank.rank, world, cfg->vocab_size);
    int* gen = sample_buffer_alloc(T);
    PlanInputs in = {B, T, 1, opt, beta1, *pol, OPT_OFFLOAD_NONE, world, s.zero, gpt2_layout(cfg, B, T, PRECISION_FP32, pol),
                     QSTATE_FP32, 0, 0};
    MemPlan p = plan_memory(cfg, in);
    int same = 1;
    char detail[256] = "", pn[64];
    for (int i = 0; i < NUM_MEM_CATEGORIES; i++) {
        if (p.bytes[i] != g_mem.peak[i]) {
            same = 0;
            snprintf(detail, sizeof(detail), "%s: planned %zu measured %zu", MEM_CATEGORY_NAMES[i], p.bytes[i], g_mem.peak[i]);
        }
    }
    policy_name(pn, sizeof(pn), pol);
    char name[160];
    snprintf(name, sizeof(name), "memory: plan equals allocations (L=%d C=%d B=%d T=%d, %s%s, %s, %d rank(s))",
             cfg->num_layers, cfg->channels, B, T, OPTIMIZER_NAMES[opt], beta1 ? " + beta1" : "", pn, world);
    check(same, name, "%s", detail);
    mem_free(gen);
    dataloader_free(&dl);
    gpt2_destroy(m);
    check(g_mem.total_current == 0, "memory: everything allocated is freed", "%zu bytes left", g_mem.total_current);
}

#define PLAN_SHARD_TOKENS 1024  // more than one step of the largest test shape on 3 ranks
#define PLAN_SHARD_V 101         // tokens valid for the smallest vocabulary below

static void test_memory_plan(const char* dir) {
    GPT2Config shapes[3] = {
        {16, 101, 128, 2, 4, 48, 1, 1, 0, 0},
        {64, 50257, 50304, 3, 6, 96, 1, 1, 0, 0},
        {32, 300, 384, 1, 1, 8, 1, 1, 0, 0},
    };
    int BTs[3][2] = {{3, 11}, {2, 64}, {5, 1}};
    char shard[CHECKPOINT_PATH_LEN];
    snprintf(shard, sizeof(shard), "%s/plan_shard.bin", dir);
    uint16_t toks[PLAN_SHARD_TOKENS];
    for (int i = 0; i < PLAN_SHARD_TOKENS; i++) { toks[i] = (uint16_t)(i % PLAN_SHARD_V); }
    write_shard(shard, toks, PLAN_SHARD_TOKENS);
    for (int k = 0; k < 6; k++) { check_layout_closed_form(&shapes[k % 3], BTs[k % 3][0], BTs[k % 3][1], k >= 3, 0); }
    for (int k = 0; k < 6; k++) { check_layout_closed_form(&shapes[k % 3], BTs[k % 3][0], BTs[k % 3][1], k >= 3, k < 3 ? 7 : 64); }
    // each shape with each optimizer (Adafactor with and without its first moment), on one
    // process and as one rank of 2 and of 3 with ZeRO-1 (3 cuts V = 101, maxT = 16, C = 8 unevenly) ...
    int opts[4][2] = {{OPT_ADAMW, 0}, {OPT_ADAFACTOR, 0}, {OPT_ADAFACTOR, 1}, {OPT_CAME, 0}};
    for (int run = 0; run < 36; run++) {
        int k = run % 3, opt = opts[(run / 3) % 4][0], beta1 = opts[(run / 3) % 4][1], world = 1 + run / 12;
        check_plan_equals_allocations(&shapes[k], BTs[k][0], BTs[k][1], opt, beta1, &ACT_KEEP_ALL, world, shard);
    }
    // ... and with every activation policy, alone and with ZeRO-1 over 2 ranks; and each again with
    // the loss in chunks of 7 tokens (BT = 33, 128, 5: a chunk that does not divide them, one beyond),
    // each optimizer in turn
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < NUM_TEST_POLICIES; i++) {
            ActPolicy pol;
            if (!test_policy(&pol, i, shapes[k].num_layers)) { continue; }
            if (i > 0) { check_plan_equals_allocations(&shapes[k], BTs[k][0], BTs[k][1], OPT_ADAMW, 0, &pol, 1 + i % 2, shard); }
            pol.loss_chunk = 7;
            int o = i % 4;
            check_plan_equals_allocations(&shapes[k], BTs[k][0], BTs[k][1], opts[o][0], opts[o][1], &pol, 1 + (i / 4) % 2, shard);
        }
    }
}

// ----------------------------------------------------------------------------
// recompute and offload: the same losses, gradients and weights, bit for bit

#define POLICY_STEPS 3
// L=5: uneven segments for k=2 (2,2,1) and k=3 (3,2)
static const GPT2Config POLICY_MODEL = {16, 101, 128, 5, 4, 32, 1, 1, 0, 0};

// POLICY_STEPS AdamW steps of a random POLICY_MODEL on a fixed batch; fills the losses
// (POLICY_STEPS), the last gradients and the final weights (P each)
static void train_with_policy(const ActPolicy* pol, float* losses, float* grads, float* params) {
    GPT2Config cfg = POLICY_MODEL;
    int B = 3, T = 11, BT = B * T;
    ModelSetup setup = test_setup(&cfg, B, T, OPT_ADAMW, 0, pol);
    GPT2* m = test_model(&setup, NULL, 5);
    int x[33], y[33], sample[8] = {0};
    uint64_t rng = 11;
    for (int i = 0; i < BT; i++) { x[i] = rand_u32(&rng) % cfg.vocab_size; y[i] = rand_u32(&rng) % cfg.vocab_size; }
    OptimizerHyper h;
    memset(&h, 0, sizeof(h));
    AdamWHyper a = {1e-2, 0.9, 0.95, 1e-8, 0.1};
    h.adamw = a;
    for (int s = 0; s < POLICY_STEPS; s++) {
        gpt2_forward(m, x, y, B, T);
        losses[s] = m->mean_loss;
        gpt2_zero_grad(m);
        gpt2_backward(m, x, y, B, T, 1.0f / BT);
        memcpy(grads, m->grads_memory, m->num_parameters * sizeof(float));
        StepConfig sc = {h, 1.0f, s + 1};
        gpt2_update(m, &sc, gpt2_grad_norm(m));
        gpt2_forward(m, sample, NULL, 1, 8);  // a sampling forward between steps must not disturb
    }
    memcpy(params, m->params_memory, m->num_parameters * sizeof(float));
    gpt2_destroy(m);
}

static void test_recompute_offload_bitwise(void) {
    size_t P = gpt2_num_parameters(&POLICY_MODEL);
    float want_losses[POLICY_STEPS], got_losses[POLICY_STEPS];
    float* want_g = (float*)malloc_check(P * sizeof(float));
    float* want_p = (float*)malloc_check(P * sizeof(float));
    float* got_g = (float*)malloc_check(P * sizeof(float));
    float* got_p = (float*)malloc_check(P * sizeof(float));
    // plain training with each attention: the stored weights (matmul), then flash
    const ActPolicy plain[2] = {{0, 0, 0, 0, 0, 0, 0}, {0, 0, 1, 0, 1, 0, 0}};
    for (int flash = 0; flash < 2; flash++) {
        train_with_policy(&plain[flash], want_losses, want_g, want_p);
        // TEST_POLICIES of this attention after plain, then one segment of all 5 layers, and k=4 (4,1)
        // with gelu and offload
        const ActPolicy more[2] = {{5, 0, flash, 0, flash, 0, 0}, {4, 1, flash, 1, flash, 0, 0}};
        for (int i = 1; i < NUM_TEST_POLICIES + 2; i++) {
            ActPolicy pol;
            if (i >= NUM_TEST_POLICIES) { pol = more[i - NUM_TEST_POLICIES]; }
            else if (!test_policy(&pol, i, POLICY_MODEL.num_layers) || pol.flash != flash || memcmp(&pol, &plain[flash], sizeof(pol)) == 0) { continue; }
            train_with_policy(&pol, got_losses, got_g, got_p);
            char pn[64], name[192];
            policy_name(pn, sizeof(pn), &pol);
            int same = memcmp(got_losses, want_losses, sizeof(got_losses)) == 0 && memcmp(got_g, want_g, P * sizeof(float)) == 0
                       && memcmp(got_p, want_p, P * sizeof(float)) == 0;
            snprintf(name, sizeof(name), "recompute/offload %s: losses, gradients, weights bitwise equal to plain%s", pn,
                     flash ? " with flash attention" : "");
            check(same, name, "loss %.9g vs %.9g", got_losses[POLICY_STEPS - 1], want_losses[POLICY_STEPS - 1]);
        }
    }
    // flash attention against the stored weights: the same mathematics, sums in another order
    float flash_losses[POLICY_STEPS];
    float* flash_p = (float*)malloc_check(P * sizeof(float));
    train_with_policy(&plain[0], want_losses, want_g, want_p);
    train_with_policy(&plain[1], flash_losses, got_g, flash_p);
    double loss_err = 0.0, dp = 0.0, np = 0.0;
    for (int s = 0; s < POLICY_STEPS; s++) { loss_err = fmax(loss_err, fabs(flash_losses[s] - want_losses[s]) / fabs(want_losses[s])); }
    for (size_t i = 0; i < P; i++) { dp += ((double)flash_p[i] - want_p[i]) * ((double)flash_p[i] - want_p[i]); np += (double)want_p[i] * want_p[i]; }
    // (AdamW divides by sqrt(v): gradients near zero turn rounding into relative updates, so 1e-5 on the weights)
    check(loss_err < 1e-6 && sqrt(dp / np) < 1e-5, "flash attention: 3 steps' losses within 1e-6, weights 1e-5 of the stored-weights attention",
          "losses %.3g, weights %.3g (relative)", loss_err, sqrt(dp / np));
    free(flash_p);
    free(want_g); free(want_p); free(got_g); free(got_p);
}

// ----------------------------------------------------------------------------
// --tp's block (cpu/tensor_parallel.h): N ranks, each a thread of one OpenMP team holding its slices,
// against the whole block: the output, d(input) and every gradient within TP_RTOL (the row-parallel
// sums add the slices' partial products in another order), and the same bits on every rank where
// the ranks hold the same tensors

#include "tests/tp_block.h"

// the group's sum as an all-reduce would make it: every rank's buffer added in rank order (the same
// bits on every rank), between barriers of the team
typedef struct { float* bufs[8]; float* sums[8]; } TpTeam;
static void tp_team_sum(float* buf, size_t n, void* ctx) {
    TpTeam* team = (TpTeam*)ctx;
    int r = omp_get_thread_num(), size = omp_get_num_threads();
    team->bufs[r] = buf;
    #pragma omp barrier
    for (size_t i = 0; i < n; i++) {
        float sum = team->bufs[0][i];
        for (int k = 1; k < size; k++) { sum += team->bufs[k][i]; }
        team->sums[r][i] = sum;
    }
    #pragma omp barrier
    memcpy(buf, team->sums[r], n * sizeof(float));
}

static void test_tensor_parallel_block(void) {
    const GPT2Config* c = &TP_MODEL;
    size_t P = gpt2_num_parameters(c), BTC = (size_t)TP_B * TP_T * c->channels;
    float* whole = (float*)malloc_check(P * sizeof(float));
    float* x = (float*)malloc_check(BTC * sizeof(float));
    float* dy = (float*)malloc_check(BTC * sizeof(float));
    tp_test_inputs(whole, x, dy);
    check(gpt2_tp_refusal(c, 3) != NULL && strstr(gpt2_tp_refusal(c, 3), "4 heads") && gpt2_tp_refusal(c, 2) == NULL && gpt2_tp_refusal(c, 4) == NULL,
          "--tp: 3 ranks refused for 4 heads (whole heads each), 2 and 4 taken", "%s", gpt2_tp_refusal(c, 3) ? gpt2_tp_refusal(c, 3) : "(none)");
    for (int flash = 0; flash < 2; flash++) {
        const ActPolicy pol = {.attn = flash, .flash = flash};
        TpBlock plain;
        tp_block_alloc(&plain, whole, 0, 1, flash);
        tp_block_run(&plain, x, dy, &pol, TP_NONE);
        for (int n = 2; n <= 4; n += 2) {
            TpBlock ranks[4];
            TpTeam team;
            int team_size = 0;
            for (int r = 0; r < n; r++) {
                tp_block_alloc(&ranks[r], whole, r, n, flash);
                team.sums[r] = (float*)malloc_check(BTC * sizeof(float));
            }
            #pragma omp parallel num_threads(n)
            {
                #pragma omp single
                team_size = omp_get_num_threads();
                TensorParallel tp = {omp_get_thread_num(), n, tp_team_sum, &team, NULL, NULL, NULL, NULL, NULL};
                if (team_size == n) { tp_block_run(&ranks[tp.rank], x, dy, &pol, tp); }
            }
            char name[256];
            snprintf(name, sizeof(name), "--tp %d%s: a team of %d threads plays the ranks", n, flash ? " (flash)" : "", n);
            check(team_size == n, name, "OpenMP gave %d threads", team_size);
            if (team_size == n) {
                int same = 1, worst_at = 0, at;
                double worst = 0.0;
                for (int r = 0; r < n; r++) {
                    same &= tp_block_shared_hash(&ranks[r], n) == tp_block_shared_hash(&ranks[0], n);
                    double d = tp_block_grad_dist(&ranks[r], plain.grads, r, n, &at);
                    if (d > worst) { worst = d; worst_at = at; }
                }
                double dout = tp_rel_dist(ranks[0].a.residual3, plain.a.residual3, BTC);
                double dx = tp_rel_dist(ranks[0].bwd.dresidual, plain.bwd.dresidual, BTC);
                snprintf(name, sizeof(name), "--tp %d%s: the block's output, d(input) and every gradient within %g of the plain block's, "
                         "the whole tensors the same bits on every rank", n, flash ? " (flash)" : "", TP_RTOL);
                check(same && dout < TP_RTOL && dx < TP_RTOL && worst < TP_RTOL, name, "same %d, output %.3g, d(input) %.3g, "
                      "gradients %.3g (%s)", same, dout, dx, worst, PARAMETER_NAMES[worst_at]);
            }
            for (int r = 0; r < n; r++) { tp_block_free(&ranks[r]); free(team.sums[r]); }
        }
        tp_block_free(&plain);
    }
    // the split and the join are each other's inverse, for every tensor
    int n = 4;
    GPT2Config rc = gpt2_rank_config(c, n), one = gpt2_rank_config(c, 1);
    float* mine = (float*)malloc_check(gpt2_num_parameters(&rc) * sizeof(float));
    float* joined = (float*)calloc(P, sizeof(float));
    for (int r = 0; r < n; r++) { tp_split_params(mine, whole, c, r, n); tp_join_params(joined, mine, c, r, n); }
    check(memcmp(joined, whole, P * sizeof(float)) == 0 && gpt2_num_parameters(&one) == P,
          "--tp 4: the four ranks' slices joined are the whole model, bit for bit", "%s", "differs");
    free(mine);
    free(whole); free(x); free(dy); free(joined);
}

// ----------------------------------------------------------------------------
// --loss-chunk: the head in chunks against the whole head

#define CHUNK_STEPS 10
#define CHUNK_MICRO 2   // micro-steps per step: wte's gradient adds up over the chunks and the micro-batches
#ifndef CHUNK_LR
#define CHUNK_LR 1e-3f
#endif

typedef struct {
    float losses[CHUNK_STEPS];   // the training losses
    float val_loss;              // a forward with targets, no gradients (validation), after the last step
    float* probs;                // (Vp) of the last position of a forward without targets (sampling)
    float* params;               // (P) after the last step
} ChunkRun;

// CHUNK_STEPS steps of optimizer opt (beta1: Adafactor's first moment) of a random POLICY_MODEL
// under pol, CHUNK_MICRO micro-batches of (B,T) a step, as the trainer runs them (zero_grad,
// then forward_train and backward per micro-batch); a sampling forward between steps
static ChunkRun train_chunked(const ActPolicy* pol, int opt, int beta1, int B, int T) {
    GPT2Config cfg = POLICY_MODEL;
    int BT = B * T;
    ModelSetup setup = test_setup(&cfg, B, T, (OptimizerKind)opt, beta1, pol);
    GPT2* m = test_model(&setup, NULL, 5);
    int* x = (int*)malloc_check(CHUNK_MICRO * BT * sizeof(int));
    int* y = (int*)malloc_check(CHUNK_MICRO * BT * sizeof(int));
    uint64_t rng = 11;
    for (int i = 0; i < CHUNK_MICRO * BT; i++) { x[i] = rand_u32(&rng) % cfg.vocab_size; y[i] = rand_u32(&rng) % cfg.vocab_size; }
    TrainOptions o = options_default();
    o.adafactor_beta1 = beta1 ? 0.9f : 0.0f;
    o.eps1 = 1e-12f;
    float scale = 1.0f / (CHUNK_MICRO * BT);
    ChunkRun r;
    for (int s = 0; s < CHUNK_STEPS; s++) {
        gpt2_zero_grad(m);
        double loss = 0.0;
        for (int k = 0; k < CHUNK_MICRO; k++) {
            loss += gpt2_forward_train(m, x + k * BT, y + k * BT, B, T, scale);
            gpt2_backward(m, x + k * BT, y + k * BT, B, T, scale);
        }
        r.losses[s] = (float)(loss / CHUNK_MICRO);
        StepConfig sc = {optimizer_hyper(&o, (OptimizerKind)opt, CHUNK_LR), 1.0f, s + 1};
        gpt2_update(m, &sc, gpt2_grad_norm(m));
        gpt2_forward(m, x, NULL, 1, T);  // a sampling forward between steps must not disturb
    }
    r.val_loss = gpt2_forward(m, x, y, B, T);
    gpt2_forward(m, x, NULL, B, T);
    r.probs = (float*)malloc_check(cfg.padded_vocab_size * sizeof(float));
    memcpy(r.probs, gpt2_probs(m, BT - 1), cfg.padded_vocab_size * sizeof(float));
    r.params = (float*)malloc_check(m->num_parameters * sizeof(float));
    memcpy(r.params, m->params_memory, m->num_parameters * sizeof(float));
    gpt2_destroy(m);
    free(x);
    free(y);
    return r;
}

static void chunk_run_free(ChunkRun* r) { free(r->probs); free(r->params); }

// the largest relative difference of the losses (training and validation), and the relative
// L2 distance of the weights
static void chunk_run_distance(const ChunkRun* a, const ChunkRun* b, double* loss_err, double* weight_err) {
    size_t P = gpt2_num_parameters(&POLICY_MODEL);
    *loss_err = fabs((double)a->val_loss - b->val_loss) / fabs((double)b->val_loss);
    for (int s = 0; s < CHUNK_STEPS; s++) { *loss_err = fmax(*loss_err, fabs((double)a->losses[s] - b->losses[s]) / fabs((double)b->losses[s])); }
    double d2 = 0.0, n2 = 0.0;
    for (size_t i = 0; i < P; i++) { d2 += ((double)a->params[i] - b->params[i]) * ((double)a->params[i] - b->params[i]); n2 += (double)b->params[i] * b->params[i]; }
    *weight_err = sqrt(d2 / n2);
}

static int chunk_run_bitwise(const ChunkRun* a, const ChunkRun* b) {
    size_t P = gpt2_num_parameters(&POLICY_MODEL);
    return memcmp(a->losses, b->losses, sizeof(a->losses)) == 0 && a->val_loss == b->val_loss &&
           memcmp(a->probs, b->probs, POLICY_MODEL.padded_vocab_size * sizeof(float)) == 0 &&
           memcmp(a->params, b->params, P * sizeof(float)) == 0;
}

#define CHUNK_RTOL 1e-6  // the issue's bound: wte's gradient is summed chunk by chunk, in another order

// a model whose head runs in chunks of 4 tokens, after a forward of 11 (chunks 0..3, 4..7, 8..10);
// with targets, a forward without the head's gradients (gpt2_forward, not gpt2_forward_train)
static GPT2* chunked_model_after_forward(int with_targets) {
    GPT2Config cfg = POLICY_MODEL;
    ActPolicy pol = ACT_KEEP_ALL;
    pol.loss_chunk = 4;
    ModelSetup setup = test_setup(&cfg, 1, 11, OPT_ADAMW, 0, &pol);
    GPT2* m = test_model(&setup, NULL, 5);
    int x[11] = {0};
    gpt2_forward(m, x, with_targets ? x : NULL, 1, 11);
    return m;
}

// the probabilities of a position outside the last chunk (in a child: no OpenMP region before fail)
static void probs_outside_chunk(void* arg) { gpt2_probs((GPT2*)arg, 0); }

// a backward after a forward that computed no gradients for the head
static void backward_without_head(void* arg) {
    int x[11] = {0};
    gpt2_backward((GPT2*)arg, x, x, 1, 11, 1.0f / 11);
}

static void test_loss_chunk(void) {
    const int opts[4][2] = {{OPT_ADAMW, 0}, {OPT_ADAFACTOR, 0}, {OPT_ADAFACTOR, 1}, {OPT_CAME, 0}};
    int B = 3, T = 11;  // BT = 33: chunks of 7 (4 of 7, then 5), of 33 and more (one chunk)
    char name[192];
    for (int o = 0; o < 4; o++) {
        ActPolicy whole = ACT_KEEP_ALL, chunked = ACT_KEEP_ALL, one = ACT_KEEP_ALL;
        chunked.loss_chunk = 7;
        one.loss_chunk = 64;
        ChunkRun want = train_chunked(&whole, opts[o][0], opts[o][1], B, T), got = train_chunked(&chunked, opts[o][0], opts[o][1], B, T);
        double le, we;
        chunk_run_distance(&got, &want, &le, &we);
        snprintf(name, sizeof(name), "--loss-chunk 7 of BT=33, %s%s: %d steps of %d micro-batches, losses and weights within %.0e of the whole head",
                 OPTIMIZER_NAMES[opts[o][0]], opts[o][1] ? " + beta1" : "", CHUNK_STEPS, CHUNK_MICRO, CHUNK_RTOL);
        check(le <= CHUNK_RTOL && we <= CHUNK_RTOL, name, "losses %.3g, weights %.3g (relative)", le, we);
        printf("     losses differ by %.3g, weights by %.3g (relative)\n", le, we);
        ChunkRun chunk_one = train_chunked(&one, opts[o][0], opts[o][1], B, T);
        snprintf(name, sizeof(name), "--loss-chunk 64 (one chunk of BT=33), %s%s: losses, probabilities, weights bitwise the whole head's",
                 OPTIMIZER_NAMES[opts[o][0]], opts[o][1] ? " + beta1" : "");
        check(chunk_run_bitwise(&chunk_one, &want), name, "loss %.9g vs %.9g", chunk_one.losses[CHUNK_STEPS - 1], want.losses[CHUNK_STEPS - 1]);
        chunk_run_free(&want); chunk_run_free(&got); chunk_run_free(&chunk_one);
    }
    // the sums are the same additions where every chunk starts at a multiple of the CPU GEMM's K
    // step (MM_KC = 256, cpu/matmul.h): wte's gradient then adds the same partial sums in the same
    // order, and every other sum of the head is a row's. BT = 24 x 16 = 384: chunks of 256 and 128
    {
        ActPolicy whole = ACT_KEEP_ALL, chunked = ACT_KEEP_ALL;
        chunked.loss_chunk = MM_KC;
        ChunkRun want = train_chunked(&whole, OPT_ADAMW, 0, 24, 16), got = train_chunked(&chunked, OPT_ADAMW, 0, 24, 16);
        snprintf(name, sizeof(name), "--loss-chunk %d (the GEMM's K step) of BT=384: losses, probabilities, weights bitwise the whole head's", MM_KC);
        check(chunk_run_bitwise(&got, &want), name, "loss %.9g vs %.9g", got.losses[CHUNK_STEPS - 1], want.losses[CHUNK_STEPS - 1]);
        chunk_run_free(&want); chunk_run_free(&got);
    }
    // with every other memory flag: recompute, offload, flash attention change nothing of a chunked run
    for (int flash = 0; flash < 2; flash++) {
        ActPolicy base = {0, 0, flash, 0, flash, 7, 0};
        ChunkRun want = train_chunked(&base, OPT_ADAMW, 0, B, T);
        const ActPolicy others[3] = {{1, 1, 1, 1, flash, 7, 0}, {2, 0, 1, 0, flash, 7, 0}, {0, 1, flash, 1, flash, 7, 0}};
        for (int i = 0; i < 3; i++) {
            ChunkRun got = train_chunked(&others[i], OPT_ADAMW, 0, B, T);
            char pn[96];
            policy_name(pn, sizeof(pn), &others[i]);
            snprintf(name, sizeof(name), "--loss-chunk with %s: bitwise the chunked run without the other flags", pn);
            check(chunk_run_bitwise(&got, &want), name, "loss %.9g vs %.9g", got.losses[CHUNK_STEPS - 1], want.losses[CHUNK_STEPS - 1]);
            chunk_run_free(&got);
        }
        chunk_run_free(&want);
    }
    GPT2* m = chunked_model_after_forward(0);
    check(gpt2_probs(m, 10) != NULL, "--loss-chunk: the last position's probabilities after a forward in chunks", "none");
    check_fails("--loss-chunk: the probabilities of a position outside the last chunk are refused", probs_outside_chunk, m,
                "holds the probabilities of positions 8..10 only");
    gpt2_destroy(m);
    m = chunked_model_after_forward(1);
    check_fails("--loss-chunk: a backward after a forward without the head's gradients is refused", backward_without_head, m,
                "run the micro-step's forward with gpt2_forward_train");
    gpt2_destroy(m);
}

// ----------------------------------------------------------------------------
// Adafactor and CAME against the PyTorch packages: the reference's training loop through optimizer_step

typedef struct {
    float losses[REF_MAX_STEPS], norms[REF_MAX_STEPS];
    float* params;  // (P) after the last step
} RefRun;

// the trainer's own step (gpt2_update: clip, then the model's optimizer) on the reference batch
static RefRun run_reference(const Reference* r) {
    GPT2* m = reference_model(r->B, r->T, r->kind, r->kind == OPT_ADAFACTOR && r->hyper.adafactor.beta1 > 0.0);
    RefRun out;
    for (int s = 0; s < r->steps; s++) {
        gpt2_forward(m, r->x, r->y, r->B, r->T);
        out.losses[s] = m->mean_loss;
        gpt2_zero_grad(m);
        gpt2_backward(m, r->x, r->y, r->B, r->T, 1.0f / (r->B * r->T));
        out.norms[s] = gpt2_grad_norm(m);
        StepConfig sc = {r->hyper, r->grad_clip, s + 1};
        gpt2_update(m, &sc, out.norms[s]);
    }
    out.params = (float*)malloc_check(m->num_parameters * sizeof(float));
    memcpy(out.params, m->params_memory, m->num_parameters * sizeof(float));
    gpt2_destroy(m);
    return out;
}

// ----------------------------------------------------------------------------
// comparisons

// tolerances: a correct fp32 run can reach about 1e-6 (README: fp32 against fp64 agree to
// 7e-7); measured here, the worst step loss is 2e-7 relative, the worst norm 3e-6 (CAME,
// whose updates are normalised per entry), the worst parameter 2e-7 absolute
#define LOSS_RTOL 1e-6
#define NORM_RTOL 1e-5
#define PARAM_RTOL 2e-6
#define PARAM_ATOL 5e-7  // small entries: parameters are ~0.02, moved by ~1e-3 per step
// the key biases (rows C..2C-1 of each layer's qkvb) have an exactly-zero gradient in exact
// arithmetic; both sides compute rounding noise (~1e-11) there, different noise. Adafactor
// and CAME (eps1 = 1e-12 under g^2) turn it into steps of ~1e-5 lr: their key biases stay in
// the tight check (AdamW's are checked apart in test_against_pytorch).

static void check_padded_rows_zero(const char* file, const float* params, const GPT2Config* c) {
    size_t begin = (size_t)c->vocab_size * c->channels, end = (size_t)c->padded_vocab_size * c->channels;
    int zero = 1;
    for (size_t i = begin; i < end; i++) { zero &= params[i] == 0.0f; }
    char name[128];
    snprintf(name, sizeof(name), "%s: padded wte rows stay zero", file);
    check(zero, name, "a padded row was written");
}

// the tiny model's shape and one reference file of dev/reference/
static void load_optimizer_reference(const char* file, Reference* r, GPT2Config* c) {
    int version;
    fclose(model_file_open(REF_DIR "tiny_model.bin", c, &version));
    char path[256];
    snprintf(path, sizeof(path), REF_DIR "%s", file);
    reference_read(r, path, c);
}

static void test_optimizer_reference(const char* file) {
    GPT2Config c;
    Reference r;
    load_optimizer_reference(file, &r, &c);
    char name[128];
    printf("-- %s: %s, grad_clip %g\n", file, OPTIMIZER_NAMES[r.kind], r.grad_clip);
    RefRun run = run_reference(&r);
    snprintf(name, sizeof(name), "%s: step losses", file);
    check_close(name, run.losses, r.losses, r.steps, 0.0, LOSS_RTOL);
    snprintf(name, sizeof(name), "%s: step gradient norms", file);
    check_close(name, run.norms, r.norms, r.steps, 0.0, NORM_RTOL);
    check_padded_rows_zero(file, run.params, &c);
    snprintf(name, sizeof(name), "%s: parameters after %d steps", file, r.steps);
    check_close(name, run.params, r.final_params, gpt2_num_parameters(&c), PARAM_ATOL, PARAM_RTOL);
    free(run.params);
    reference_free(&r);
}

// ----------------------------------------------------------------------------
// unit checks

// the same steps with one thread and with three must give the same bits
static void test_thread_count(const char* file) {
    GPT2Config c;
    Reference r;
    load_optimizer_reference(file, &r, &c);
    char name[128];
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    RefRun one = run_reference(&r);
    omp_set_num_threads(3);
    RefRun three = run_reference(&r);
    omp_set_num_threads(threads);
    snprintf(name, sizeof(name), "%s: 1 and 3 threads give the same parameters bit for bit", file);
    check(memcmp(one.params, three.params, gpt2_num_parameters(&c) * sizeof(float)) == 0, name, "differs");
    free(one.params); free(three.params);
    reference_free(&r);
}

#define D12_MAX_STATE_FRACTION 0.003  // Adafactor (no beta1) keeps under 0.3% of AdamW's state

static void test_d12_state_size(void) {
    GPT2Config c;
    gpt2_config_preset(&c, "d12");
    size_t adamw = optimizer_state_floats(&c, OPT_ADAMW, 0, 1) * sizeof(float);
    size_t adafactor = optimizer_state_floats(&c, OPT_ADAFACTOR, 0, 1) * sizeof(float);
    size_t adafactor_m = optimizer_state_floats(&c, OPT_ADAFACTOR, 1, 1) * sizeof(float);
    size_t came = optimizer_state_floats(&c, OPT_CAME, 0, 1) * sizeof(float);
    printf("-- d12 optimizer state: AdamW %zu bytes, Adafactor %zu (with beta1 %zu), CAME %zu\n",
           adamw, adafactor, adafactor_m, came);
    check((double)adafactor < D12_MAX_STATE_FRACTION * adamw, "d12: Adafactor (no beta1) state under 0.3% of AdamW's",
          "%zu of %zu bytes (%.3f%%)", adafactor, adamw, 100.0 * adafactor / adamw);
}

// ----------------------------------------------------------------------------

// ----------------------------------------------------------------------------
// -h: generated from the flag table, it lists every flag and every preset

static void test_usage_lists_every_flag(void) {
    FILE* f = tmpfile();
    if (f == NULL) { fail("tmpfile: %s", strerror(errno)); }
    print_usage(f, "train_gpt");
    long n = ftell(f);
    char* text = (char*)malloc_check((size_t)n + 1);
    rewind(f);
    fread_check(text, 1, (size_t)n, f);
    text[n] = '\0';
    fclose(f);
    char missing[512] = "";
    for (int i = 0; i < NUM_FLAGS; i++) {
        char line[64];  // "  -x  --steps " as print_usage lays out a row
        snprintf(line, sizeof(line), "  %-3s %-20s ", FLAGS[i].shortname ? FLAGS[i].shortname : "", FLAGS[i].longname);
        if (strstr(text, line) == NULL) { strncat(missing, FLAGS[i].longname, sizeof(missing) - strlen(missing) - 2); strcat(missing, " "); }
    }
    check(missing[0] == '\0' && NUM_FLAGS >= 30, "-h: one row for every flag of the table, with its short name", "missing: %s", missing);
    int presets = 1;
    for (int i = 0; i < NUM_GPT2_PRESETS; i++) { presets &= strstr(text, GPT2_PRESETS[i].name) != NULL; }
    check(presets, "-h: lists every preset of model_config.h", "a preset is missing");
    free(text);
}

// ----------------------------------------------------------------------------
// sizes: a model file's largest shape has a parameter count that fits in 64 bits, and a
// shape whose memory plan would not is stopped before planning

static const GPT2Config LARGEST_MODEL = {MODEL_LIMIT_SEQ_LEN, MODEL_LIMIT_VOCAB, MODEL_LIMIT_VOCAB,
                                         MODEL_LIMIT_LAYERS, MODEL_LIMIT_CHANNELS, MODEL_LIMIT_CHANNELS, 1, 1, 0, 0};

static void plan_size_of_largest(void* arg) {
    TrainOptions o = options_default();
    o.seq_len = MODEL_LIMIT_SEQ_LEN;
    o.batch_size = INT_MAX / o.seq_len;  // B*T below INT_MAX, B NH T^2 about 2^67
    (void)arg;
    check_plan_size(&LARGEST_MODEL, &o);
}

static void config_check_wrapping(void* arg) {
    GPT2Config c = {984263313, 1, 984263312, 178956966, 1, 2147483647, 1, 1, 0, 0};  // the header of issue 12
    (void)arg;
    gpt2_config_check(&c, "wrapping.bin");
}

static void test_sizes(void) {
    const GPT2Config* c = &LARGEST_MODEL;
    double L = c->num_layers, C = c->channels, P = (double)c->padded_vocab_size * C + (double)c->max_seq_len * C
               + L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
    check((double)gpt2_num_parameters(c) == P && P < 0x1p48, "sizes: the largest model file's parameter count is exact in 64 bits",
          "%zu vs %.0f", gpt2_num_parameters(c), P);
    check_fails("sizes: a plan beyond 64-bit sizes is stopped", plan_size_of_largest, NULL, "beyond what this program can count");
    check_fails("sizes: a header whose parameter count wraps is refused by its bounds", config_check_wrapping, NULL,
                "L (layers) = 178956966 is outside 1..1024");
}

// ----------------------------------------------------------------------------
// free space for a checkpoint: checkpoint_bytes is what the files take, and a directory
// without that much free space stops the run before training

static void free_space_for_too_much(void* dir) {
    check_free_space((const char*)dir, (uint64_t)1 << 62, "one checkpoint");
}

static void test_checkpoint_space(const char* dir) {
    GPT2Config cfg = {32, 64, 128, 2, 4, 32, 1, 1, 0, 0};
    size_t P = gpt2_num_parameters(&cfg), opt_floats = optimizer_state_floats(&cfg, OPT_CAME, 0, 1);
    float* zeros = (float*)calloc_check(P > opt_floats ? P : opt_floats, sizeof(float));
    char path[CHECKPOINT_PATH_LEN];
    struct stat model_st, state_st;
    checkpoint_path(path, sizeof(path), dir, "model", 1, -1);
    model_file_write(path, &cfg, zeros);
    stat(path, &model_st);
    TrainState st = {.num_processes = 1, .rank = 0, .step = 1, .rng = 1, .num_params = P, .opt_floats = opt_floats,
                     .tp = 1, .pp = 1, .run_id = 1, .model_hash = 1};
    checkpoint_path(path, sizeof(path), dir, "state", 1, 0);
    state_file_write(path, &st, zeros);
    stat(path, &state_st);
    uint64_t written = (uint64_t)model_st.st_size + 2 * (uint64_t)state_st.st_size;
    check(checkpoint_bytes(&cfg, opt_floats, 2) == written, "checkpoint space: checkpoint_bytes equals the files written (2 ranks)",
          "%llu vs %llu", (unsigned long long)checkpoint_bytes(&cfg, opt_floats, 2), (unsigned long long)written);
    free(zeros);
    check_fails("checkpoint space: a directory without room for a checkpoint is refused", free_space_for_too_much, (void*)dir,
                "MiB free, but one checkpoint needs 4398046511104.0 MiB");
}

// ----------------------------------------------------------------------------
// a checkpoint is never written from non-finite weights (the run then stops, saying why)

static void test_checkpoint_not_finite(const char* dir) {
    GPT2Config cfg = {16, 101, 128, 1, 4, 32, 1, 1, 0, 0};
    ModelSetup setup = test_setup(&cfg, 2, 8, OPT_ADAMW, 0, &ACT_KEEP_ALL);
    GPT2* m = test_model(&setup, NULL, 3);
    DataLoader dl;
    memset(&dl, 0, sizeof(dl));
    char sub[CHECKPOINT_PATH_LEN / 2], path[CHECKPOINT_PATH_LEN];
    snprintf(sub, sizeof(sub), "%.*s/not_finite", (int)sizeof(sub) - 16, dir);
    mkdir(sub, 0755);
    float good = save_checkpoint(m, &setup, sub, 1, &dl, 1, 7);
    m->params_memory[12345] = INFINITY;
    float bad = save_checkpoint(m, &setup, sub, 2, &dl, 1, 7);
    struct stat st;
    checkpoint_path(path, sizeof(path), sub, "model", 2, -1);
    check(isfinite(good) && good > 0.0f && isinf(bad) && stat(path, &st) != 0,
          "checkpoint: written from finite weights (max |w| returned), not from an infinite one", "max |w| %g then %g", good, bad);
    gpt2_destroy(m);
}

// ----------------------------------------------------------------------------
// sampling (--sample): the sampler's choices (sampler.h), and a model allocated for forward only

#define SAMPLER_COINS 20000  // coins (i + 1/2) / SAMPLER_COINS: a histogram of what the sampler picks

// the sampler's picks over a sweep of coins against the weights p^(1/temperature) of the top_k
// largest probabilities (ties: the lower id), computed here in double: each id's count within
// one of its share
static void check_sampler_histogram(const char* name, const float* probs, int n, float temperature, int top_k) {
    int count[8] = {0}, order[8];
    double weight[8] = {0}, total = 0.0;
    Sampler s = sampler_create(n, temperature, top_k);
    for (int i = 0; i < SAMPLER_COINS; i++) { count[sampler_next(&s, probs, (i + 0.5f) / SAMPLER_COINS)]++; }
    sampler_free(&s);
    for (int i = 0; i < n; i++) { order[i] = i; }
    for (int i = 0; i < n; i++) {  // by probability, the lower id first among equals (insertion sort)
        for (int j = i; j > 0 && probs[order[j]] > probs[order[j - 1]]; j--) { int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t; }
    }
    int k = top_k > 0 && top_k < n ? top_k : n;
    for (int i = 0; i < k; i++) { weight[order[i]] = pow(probs[order[i]], 1.0 / temperature); total += weight[order[i]]; }
    int ok = 1, worst = 0;
    for (int i = 0; i < n; i++) {
        double want = SAMPLER_COINS * weight[i] / total;
        ok &= fabs(count[i] - want) <= 1.0;
        if (fabs(count[i] - want) > fabs(count[worst] - SAMPLER_COINS * weight[worst] / total)) { worst = i; }
    }
    check(ok, name, "id %d picked %d times of %d, want %.1f", worst, count[worst], SAMPLER_COINS, SAMPLER_COINS * weight[worst] / total);
}

static void test_sampler(void) {
    const float probs[5] = {0.1f, 0.4f, 0.05f, 0.4f, 0.05f};  // ties: ids 1 and 3 lead, 2 and 4 trail
    int greedy = 1, top1 = 1, same = 1;
    Sampler g = sampler_create(5, 0.0f, 0), plain = sampler_create(5, 1.0f, 0);
    for (int i = 0; i < SAMPLER_COINS; i++) {
        float coin = (i + 0.5f) / SAMPLER_COINS;
        greedy &= sampler_next(&g, probs, coin) == 1;
        same &= sampler_next(&plain, probs, coin) == sample_index(probs, 5, coin);
        const float temperatures[3] = {0.5f, 1.0f, 3.0f};
        for (int t = 0; t < 3; t++) {
            Sampler one = sampler_create(5, temperatures[t], 1);
            top1 &= sampler_next(&one, probs, coin) == 1;
            sampler_free(&one);
        }
    }
    sampler_free(&g);
    sampler_free(&plain);
    check(sample_argmax(probs, 5) == 1, "sampler: argmax takes the first of equal largest probabilities", "got %d", sample_argmax(probs, 5));
    check(greedy, "sampler: temperature 0 is greedy (the first largest, whatever the coin)", "another id picked");
    check(top1, "sampler: top-k 1 is greedy at temperatures 0.5, 1 and 3", "another id picked");
    check(same, "sampler: temperature 1 over every token draws as the training samples (sample_index)", "a pick differs");
    check_sampler_histogram("sampler: temperature 1, every token: picks in proportion to p", probs, 5, 1.0f, 0);
    check_sampler_histogram("sampler: temperature 0.5: in proportion to p^2", probs, 5, 0.5f, 0);
    check_sampler_histogram("sampler: temperature 3: in proportion to p^(1/3)", probs, 5, 3.0f, 0);
    check_sampler_histogram("sampler: top-k 2: the two largest only", probs, 5, 1.0f, 2);
    check_sampler_histogram("sampler: top-k 4, temperature 2: a tie at the cut keeps the lower id", probs, 5, 2.0f, 4);
    check_sampler_histogram("sampler: top-k beyond V is every token", probs, 5, 0.7f, 9);
}

// a model allocated for sampling holds the weights and forward's activations only, and its
// probabilities are bitwise those of the same model allocated for training
static void test_sampling_model(void) {
    GPT2Config cfg = {32, 64, 128, 2, 4, 32, 1, 1, 0, 0};  // maxT, V, Vp, L, NH, C: the fixture's shape
    int T = 8, tokens[8] = {3, 1, 4, 1, 5, 9, 2, 6};
    ModelSetup train = test_setup(&cfg, 1, T, OPT_ADAMW, 0, &ACT_KEEP_ALL), sample = train;
    sample.use = MODEL_FOR_SAMPLING;
    size_t before[NUM_MEM_CATEGORIES];
    memcpy(before, g_mem.current, sizeof(before));
    GPT2* ms = test_model(&sample, NULL, 7);
    size_t grew[NUM_MEM_CATEGORIES];
    for (int c = 0; c < NUM_MEM_CATEGORIES; c++) { grew[c] = g_mem.current[c] - before[c]; }
    check(grew[MEM_PARAMETERS] == gpt2_num_parameters(&cfg) * sizeof(float) && grew[MEM_ACTIVATIONS] > 0 &&
          grew[MEM_GRADIENTS] == 0 && grew[MEM_OPTIMIZER] == 0 && grew[MEM_ACT_GRADIENTS] == 0 && gpt2_host_view(ms).opt_floats == 0,
          "sampling model: weights and activations only (no gradients, optimizer state, backward buffers)",
          "bytes: parameters %zu activations %zu gradients %zu optimizer %zu activation grads %zu", grew[MEM_PARAMETERS],
          grew[MEM_ACTIVATIONS], grew[MEM_GRADIENTS], grew[MEM_OPTIMIZER], grew[MEM_ACT_GRADIENTS]);
    GPT2* mt = test_model(&train, NULL, 7);
    int same = 1;
    for (int t = 1; t <= T; t++) {  // every context length a sample runs
        gpt2_forward(ms, tokens, NULL, 1, t);
        gpt2_forward(mt, tokens, NULL, 1, t);
        same &= memcmp(gpt2_probs(ms, t - 1), gpt2_probs(mt, t - 1), cfg.vocab_size * sizeof(float)) == 0;
    }
    check(same, "sampling model: the probabilities of a training model, bitwise, at every length", "differ");
    gpt2_destroy(ms);
    gpt2_destroy(mt);
}

// ----------------------------------------------------------------------------
// fixtures for the command-line tests (tests/test_cli.py)

#define FIXTURE_V 64      // vocabulary of the fixture model and shards
#define FIXTURE_TOKENS 4096
#define FIXTURE_DEEP_LAYERS 5  // model_deep.bin

static void write_model_variant(const char* dir, const char* name, const GPT2Config* cfg, const float* params,
                                int slot, int value, long truncate_to) {
    char path[CHECKPOINT_PATH_LEN];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    model_file_write(path, cfg, params);
    if (slot >= 0) {
        FILE* f = fopen_check(path, "r+b");
        fseek_check(f, slot * (long)sizeof(int), SEEK_SET);
        fwrite_check(&value, sizeof(int), 1, f);
        fclose(f);
    }
    if (truncate_to > 0 && truncate(path, truncate_to) != 0) { fail("truncate %s", path); }
}

// the fuzzer's small BPE (tests/fuzz_corpus.h): encoder.json with the 256 byte tokens (id = the
// byte), three merges and <|endoftext|>, each key in vocab.bpe's characters (GPT-2's
// bytes_to_unicode: bpe.h), those past ASCII as \u escapes; vocab.bpe with the three merges
static void write_fuzz_bpe(const char* dir) {
    static const char* const merges[][2] = {{"\xc4\xa0", "t"}, {"h", "e"}, {"\xc4\xa0t", "he"}};  // " t", "he", " the"
    static const char* const merged[] = {"\\u0120t", "he", "\\u0120the"};                         // as JSON keys
    int byte_of[BPE_BYTE_CHARS], char_of[BPE_NUM_BYTES];
    bpe_byte_of_char(byte_of);
    for (int c = 0; c < BPE_BYTE_CHARS; c++) { if (byte_of[c] >= 0) { char_of[byte_of[c]] = c; } }
    char path[CHECKPOINT_PATH_LEN];
    snprintf(path, sizeof(path), "%s/%s", dir, FUZZ_BPE_ENCODER_FILE);
    FILE* f = fopen_check(path, "wb");
    fprintf(f, "{");
    for (int b = 0; b < BPE_NUM_BYTES; b++) {
        int c = char_of[b];
        if (c == '"' || c == '\\') { fprintf(f, "\"\\%c\": %d, ", c, b); }
        else if (c < 0x7f) { fprintf(f, "\"%c\": %d, ", c, b); }
        else { fprintf(f, "\"\\u%04x\": %d, ", c, b); }
    }
    for (int i = 0; i < 3; i++) { fprintf(f, "\"%s\": %d, ", merged[i], BPE_NUM_BYTES + i); }
    fprintf(f, "\"<|endoftext|>\": %d}", BPE_NUM_BYTES + 3);
    fclose(f);
    snprintf(path, sizeof(path), "%s/%s", dir, FUZZ_BPE_VOCAB_FILE);
    f = fopen_check(path, "wb");
    fprintf(f, "#version: 0.2\n");
    for (int i = 0; i < 3; i++) { fprintf(f, "%s %s\n", merges[i][0], merges[i][1]); }
    fclose(f);
}

static void write_bytes(const char* path, const void* bytes, size_t n) {
    FILE* f = fopen_check(path, "wb");
    fwrite_check(bytes, 1, n, f);
    fclose_check(f);
}

// the fuzzer's seed files (tests/fuzz_corpus.h): each one that the fuzzer reads whole is
// accepted by its reader; the state resumes the model on the shard
static void write_fuzz_corpus(const char* dir) {
    GPT2Config cfg = FUZZ_CONFIG;
    size_t P = gpt2_num_parameters(&cfg), opt_floats = optimizer_state_floats(&cfg, OPT_ADAMW, 0, 1);
    float* params = (float*)malloc_check(P * sizeof(float));
    float* state = (float*)calloc_check(opt_floats, sizeof(float));
    gpt2_init_params(params, &cfg, 9);
    for (size_t i = 0; i < opt_floats; i++) { state[i] = (float)(i % 7) * 1e-3f; }
    char path[CHECKPOINT_PATH_LEN];
    snprintf(path, sizeof(path), "%s/%s", dir, FUZZ_MODEL_FILE);
    model_file_write(path, &cfg, params);
    TrainState st = {.num_processes = 1, .rank = 0, .step = FUZZ_STEP, .data_position = (uint64_t)FUZZ_STEP * FUZZ_B * FUZZ_T,
                     .rng = 12345, .num_params = P, .opt_floats = opt_floats, .tp = 1, .pp = 1, .run_id = FUZZ_RUN_ID,
                     .model_hash = params_hash(params, P)};
    snprintf(path, sizeof(path), "%s/%s", dir, FUZZ_STATE_FILE);
    state_file_write(path, &st, state);
    uint16_t toks[FUZZ_SHARD_TOKENS];
    for (int i = 0; i < FUZZ_SHARD_TOKENS; i++) { toks[i] = (uint16_t)(i % cfg.vocab_size); }
    snprintf(path, sizeof(path), "%s/%s", dir, FUZZ_SHARD_FILE);
    write_shard(path, toks, FUZZ_SHARD_TOKENS);
    snprintf(path, sizeof(path), "%s/%s", dir, FUZZ_TOKENIZER_FILE);
    write_tokenizer(path, cfg.vocab_size);
    write_fuzz_bpe(dir);
    static RendezvousExchange x;
    RendezvousKeys k;
    uint8_t hello[RENDEZVOUS_HELLO_BYTES], answer[RENDEZVOUS_ANSWER_BYTES(FUZZ_RDV_ID_BYTES)];
    fuzz_rdv_exchange(&k, &x, hello, answer);
    snprintf(path, sizeof(path), "%s/%s", dir, FUZZ_RDV_HELLO_FILE);
    write_bytes(path, hello, sizeof(hello));
    snprintf(path, sizeof(path), "%s/%s", dir, FUZZ_RDV_ANSWER_FILE);
    write_bytes(path, answer, sizeof(answer));
    const char* texts[][2] = {{FUZZ_JSONL_FILE, FUZZ_JSONL_TEXT}, {FUZZ_TEXT_FILE, FUZZ_TEXT_TEXT}};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, texts[i][0]);
        FILE* f = fopen_check(path, "wb");
        fwrite_check(texts[i][1], 1, strlen(texts[i][1]), f);
        fclose(f);
    }
    free(params);
    free(state);
}

static void write_fixtures(const char* dir) {
    mkdir(dir, 0755);
    // heads of hs = 16: the GPU's flash attention runs them (model_hs8.bin's it does not)
    GPT2Config cfg = {32, FIXTURE_V, 128, 2, 2, 32, 1, 1, 0, 0};  // maxT, V, Vp, L, NH, C
    float* params = (float*)malloc_check(gpt2_num_parameters(&cfg) * sizeof(float));
    gpt2_init_params(params, &cfg, 42);
    write_model_variant(dir, "model.bin", &cfg, params, -1, 0, 0);
    write_model_variant(dir, "model_badmagic.bin", &cfg, params, MODEL_SLOT_MAGIC, 12345, 0);
    write_model_variant(dir, "model_badversion.bin", &cfg, params, MODEL_SLOT_VERSION, 4, 0);
    write_model_variant(dir, "model_badheads.bin", &cfg, params, MODEL_SLOT_NUM_HEADS, 5, 0);  // C=32 not divisible by 5
    write_model_variant(dir, "model_truncated.bin", &cfg, params, -1, 0, 5000);
    write_model_variant(dir, "model_hs8.bin", &cfg, params, MODEL_SLOT_NUM_HEADS, 4, 0);  // 4 heads of 8 channels
    free(params);
    // five layers: offload and checkpointing move blocks and segment inputs both ways (two slots
    // cannot hold them all), in uneven segments (k=2: 2,2,1)
    GPT2Config deep = cfg;
    deep.num_layers = FIXTURE_DEEP_LAYERS;
    params = (float*)malloc_check(gpt2_num_parameters(&deep) * sizeof(float));
    gpt2_init_params(params, &deep, 43);
    write_model_variant(dir, "model_deep.bin", &deep, params, -1, 0, 0);
    free(params);
    uint16_t toks[FIXTURE_TOKENS];
    uint64_t rng = 3;
    for (int i = 0; i < FIXTURE_TOKENS; i++) { toks[i] = (uint16_t)(rand_u32(&rng) % FIXTURE_V); }
    char path[CHECKPOINT_PATH_LEN];
    snprintf(path, sizeof(path), "%s/train.bin", dir); write_shard(path, toks, FIXTURE_TOKENS);
    snprintf(path, sizeof(path), "%s/val.bin", dir); write_shard(path, toks, FIXTURE_TOKENS / 4);
    snprintf(path, sizeof(path), "%s/shard_small.bin", dir); write_shard(path, toks, 10);
    toks[100] = FIXTURE_V;  // one token outside the vocabulary
    snprintf(path, sizeof(path), "%s/shard_bigtoken.bin", dir); write_shard(path, toks, FIXTURE_TOKENS);
    toks[100] = 0;
    const struct { const char* name; int slot, value; } bad[] = {
        {"shard_badmagic.bin", 0, 1}, {"shard_badversion.bin", 1, 7}, {"shard_badcount.bin", 2, FIXTURE_TOKENS + 5},
    };
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, bad[i].name);
        write_shard(path, toks, FIXTURE_TOKENS);
        FILE* f = fopen_check(path, "r+b");
        fseek_check(f, bad[i].slot * (long)sizeof(int), SEEK_SET);
        fwrite_check(&bad[i].value, sizeof(int), 1, f);
        fclose(f);
    }
    snprintf(path, sizeof(path), "%s/tokenizer.bin", dir); write_tokenizer(path, FIXTURE_V);
    write_fuzz_corpus(dir);
    printf("fixtures written to %s\n", dir);
}

// ----------------------------------------------------------------------------
// comparing two model files (tests/test_zero.py: one rank against several)

// 1 if parameter i is a key bias (rows C..2C-1 of a layer's qkvb): its gradient is exactly
// zero in exact arithmetic (softmax is shift-invariant), so fp32 computes rounding noise there,
// which depends on the order of the sums; Adafactor and CAME normalise that noise into steps
// of about lr, so two correct runs that add in another order differ there by ~lr per step
static int is_key_bias(const GPT2Config* c, size_t i) {
    size_t sizes[NUM_PARAMETER_TENSORS], begin = 0, C = c->channels;
    gpt2_parameter_sizes(sizes, c);
    for (int t = 0; strcmp(PARAMETER_NAMES[t], "qkvb") != 0; t++) { begin += sizes[t]; }
    if (i < begin || i >= begin + c->num_layers * 3 * C) { return 0; }
    size_t j = (i - begin) % (3 * C);
    return j >= C && j < 2 * C;
}

// prints how far model file b is from a: the relative L2 distance ||a - b|| / ||a|| over all
// parameters but the key biases (reported apart), and the largest entrywise difference with
// its tensor; returns 0 if the relative distance is at most rtol, 1 otherwise
static int compare_models(const char* path_a, const char* path_b, double rtol) {
    GPT2Config ca, cb;
    float* a = read_model_file(path_a, &ca);
    float* b = read_model_file(path_b, &cb);
    if (memcmp(&ca, &cb, sizeof(ca)) != 0) { fail("'%s' and '%s' have different model shapes", path_a, path_b); }
    size_t sizes[NUM_PARAMETER_TENSORS], off = 0, worst_i = 0;
    gpt2_parameter_sizes(sizes, &ca);
    double diff2 = 0.0, norm2 = 0.0, worst = 0.0, worst_key = 0.0;
    for (size_t i = 0; i < gpt2_num_parameters(&ca); i++) {
        double d = fabs((double)a[i] - b[i]);
        if (is_key_bias(&ca, i)) { worst_key = fmax(worst_key, d); continue; }
        diff2 += d * d;
        norm2 += (double)a[i] * a[i];
        if (d > worst) { worst = d; worst_i = i; }
    }
    int t = 0;
    while (t < NUM_PARAMETER_TENSORS - 1 && worst_i >= off + sizes[t]) { off += sizes[t]; t++; }
    double rel = norm2 > 0.0 ? sqrt(diff2 / norm2) : sqrt(diff2);
    printf("models: relative L2 distance %.3e (tolerance %.1e), largest difference %.3e in %s[%zu]; "
           "key biases (not compared) differ by up to %.3e\n", rel, rtol, worst, PARAMETER_NAMES[t], worst_i - off, worst_key);
    free(a);
    free(b);
    return rel <= rtol ? 0 : 1;
}

// ----------------------------------------------------------------------------
// a checkpoint's optimizer state on another layout (llmc/relayout.h), for tests/test_relayout.py

// the places of whole tensor i of layer `layer` that one field of kind k stands for: its elements, rows or columns
static size_t whole_places(const GPT2Config* model, int i, StateFieldKind k) {
    size_t rows, cols;
    gpt2_tensor_shape(i, model, &rows, &cols);
    return k == FIELD_ROWS ? rows : k == FIELD_COLS ? cols : rows * cols;
}

// counts into count[] (whole_places of it) how often the parts of the ranks of layout L that relayout_gather
// reads hold each place of field f of tensor i of `layer` (the data-parallel ranks' blocks, or without ZeRO the
// first's whole state; of a field the --tp group holds whole, its first rank's); returns the entries whose
// place does not map back to them (0: every one does)
static size_t count_places(const StateLayout* L, int i, int layer, int f, int* count) {
    size_t wrong = 0;
    int stage = layout_stage_of(L, i, layer), datas = L->sharded ? L->dp : 1, tensors = PARAMETER_TP_SPLIT[i] != TP_WHOLE ? L->tp : 1;
    for (int d = 0; d < datas; d++) {
        for (int t = 0; t < tensors; t++) {
            RankPlace at = {.stage = stage, .data = d, .tensor = t};
            LayoutRank r = layout_rank_open(L, at);
            int k = layout_slice_index(&r, i, layer);
            PartPlace p = part_place(&r, k);
            StateField fields[MAX_STATE_FIELDS];
            slice_state_fields(L->kind, &r.parts[k], L->use_beta1, fields);
            if (field_cut_by_group(&p, fields[f].kind) || p.tp_rank == 0) {
                for (size_t e = 0; e < state_field_used(&fields[f], &r.parts[k]); e++) {
                    int row, col;
                    part_entry_place(&p, fields[f].kind, e, &row, &col);
                    size_t cols = whole_places(&L->model, i, FIELD_COLS), at_place = fields[f].kind == FIELD_ROWS ? (size_t)row
                                  : fields[f].kind == FIELD_COLS ? (size_t)col : (size_t)row * cols + col;
                    count[at_place]++;
                    wrong += part_place_entry(&p, fields[f].kind, row, col) != (long)e;
                }
            }
            layout_rank_close(&r);
        }
    }
    return wrong;
}

// llmc/relayout.h's places, on every layout of a small model (--tp 1, 2, 4; --pp 1, 3; 1 or 3 data-parallel
// ranks, ZeRO's cut or not; CAME, whose state has every kind of field): every entry of every rank's part maps
// to a place of its whole tensor and back to itself, and the ranks' parts hold every place once (but wte's
// padded rows on --tp 1, which holds none of them)
// opt_layout.h's weight_runs: the runs of a model's weights (a slice each, or a gap no slice holds: wte's
// padded rows) cover [0, P) in order, each float once, for one process, --tp 2 and every stage of --pp 3
// (whose absent tensors are slices of no weights: a gap before one is still one run)
static void test_weight_runs(void) {
    GPT2Config model = {16, 64, 80, 5, 4, 32, 1, 1, 0, 0};  // maxT, V, Vp, L, NH, C: Vp > V, wte's padded rows a gap
    for (int tp = 1; tp <= 2; tp++) {
        for (int stages = 1; stages <= 3; stages += 2) {
            for (int st = 0; st < stages; st++) {
                GPT2Config rank = gpt2_rank_config(&model, tp), c = pp_stage_config(&rank, stages, st);
                ParamSlice* s = param_slices_alloc(&c);
                WeightRun* runs = (WeightRun*)malloc_check((size_t)(param_slice_count(&c) + 1) * sizeof(WeightRun));
                int n = weight_runs(&c, s, runs);
                size_t at = 0, bad = 0;
                for (int k = 0; k < n; k++) {
                    bad += runs[k].offset != at || runs[k].n == 0;
                    at = runs[k].offset + runs[k].n;
                }
                char name[128];
                snprintf(name, sizeof(name), "weight runs: --tp %d, stage %d of %d: the weights in order, each float once", tp, st, stages);
                check(bad == 0 && at == gpt2_num_parameters(&c), name, "%zu runs out of place, %zu of %zu floats covered", bad, at,
                      gpt2_num_parameters(&c));
                free(runs);
                free(s);
            }
        }
    }
}

static void test_relayout_places(void) {
    GPT2Config model = {16, 64, 80, 3, 4, 32, 1, 1, 0, 0};  // maxT, V, Vp, L, NH, C: Vp/4 = 20 rows a rank, 16 of them padded
    const int tps[] = {1, 2, 4}, pps[] = {1, 3}, dps[] = {1, 3};
    for (int a = 0; a < 3; a++) {
        for (int b = 0; b < 2; b++) {
            for (int c = 0; c < 2; c++) {
                for (int sharded = 0; sharded < 2; sharded++) {
                    StateLayout L = {.model = model, .kind = OPT_CAME, .use_beta1 = 0, .format = QSTATE_FP32, .tp = tps[a], .pp = pps[b],
                                     .dp = dps[c], .sharded = sharded};
                    size_t wrong = 0, missed = 0, twice = 0;
                    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
                        int layers = PARAMETER_IS_PER_LAYER[i] ? model.num_layers : 1;
                        for (int l = 0; l < layers; l++) {
                            int layer = PARAMETER_IS_PER_LAYER[i] ? l : OUTER_GROUP;
                            LayoutRank r0 = layout_rank_open(&L, (RankPlace){layout_stage_of(&L, i, layer), 0, 0});
                            StateField fields[MAX_STATE_FIELDS];
                            int n = slice_state_fields(L.kind, &r0.parts[layout_slice_index(&r0, i, layer)], 0, fields);
                            layout_rank_close(&r0);
                            for (int f = 0; f < n; f++) {
                                size_t places = whole_places(&model, i, fields[f].kind);
                                int* count = (int*)calloc_check(places, sizeof(int));
                                wrong += count_places(&L, i, layer, f, count);
                                size_t cols = whole_places(&model, i, FIELD_COLS);
                                for (size_t x = 0; x < places; x++) {
                                    int padded = i == 0 && L.tp == 1 && fields[f].kind != FIELD_COLS &&
                                                 (fields[f].kind == FIELD_ROWS ? x : x / cols) >= (size_t)model.vocab_size;
                                    missed += count[x] == 0 && !padded;
                                    twice += count[x] > 1 || (padded && count[x] != 0);
                                }
                                free(count);
                            }
                        }
                    }
                    char name[160];
                    snprintf(name, sizeof(name), "relayout places: --tp %d --pp %d, %d data-parallel rank(s)%s: every entry at one place of "
                             "its tensor, every place held once", L.tp, L.pp, L.dp, sharded ? ", ZeRO" : "");
                    check(wrong == 0 && missed == 0 && twice == 0, name, "%zu entries that do not map back, %zu places held by none, %zu by "
                          "more than one", wrong, missed, twice);
                }
            }
        }
    }
}

// --relayout-state SRC STEP OUT TP PP RANKS ZERO OPTIMIZER BETA1 FORMAT BT: the optimizer state of the checkpoint of
// STEP in SRC moved onto RANKS ranks of --tp TP --pp PP --zero ZERO (--optimizer OPTIMIZER, --adafactor-beta1 BETA1,
// --optimizer-state FORMAT) as -y 1 moves it (relayout_rank_state), written as OUT/state_STEP_r.bin for every rank r
// with the header that -y 1 then reads (data rank d's position d windows of BT tokens after the old rank 0's): layout B's checkpoint of layout A's state (beside A's model file and DONE
// marker, which the test copies), and with 1 1 1 0 ... fp32 the whole model's state in one file, the same for the
// checkpoints of any two layouts that hold the same state
static int relayout_state_tool(char** argv) {
    const char *src = argv[2], *out = argv[4];
    int step = atoi(argv[3]), kind = optimizer_from_name(argv[9]), format = qstate_format_from_name(argv[11]);
    if (kind < 0 || format < 0) { fail("--relayout-state: optimizer '%s' or state format '%s' unknown", argv[9], argv[11]); }
    char path[CHECKPOINT_PATH_LEN];
    checkpoint_path(path, sizeof(path), src, "model", step, -1);
    GPT2Config cfg;
    int version;
    fclose(model_file_open(path, &cfg, &version));
    TrainState head;
    checkpoint_path(path, sizeof(path), src, "state", step, 0);
    state_file_read_header(path, &head);
    int use_beta1 = kind == OPT_ADAFACTOR && atof(argv[10]) > 0.0;
    StateLayout from = {.model = cfg, .kind = (OptimizerKind)kind, .use_beta1 = use_beta1, .format = (QStateFormat)head.opt_format,
                        .tp = head.tp, .pp = head.pp, .dp = head.num_processes / (head.tp * head.pp), .sharded = zero_shards_state(head.zero)};
    int zero = atoi(argv[8]), ranks = atoi(argv[7]);
    StateLayout to = from;
    to.format = (QStateFormat)format;
    to.tp = atoi(argv[5]);
    to.pp = atoi(argv[6]);
    to.dp = ranks / (to.tp * to.pp);
    to.sharded = zero_shards_state(zero);
    if (to.dp < 1 || layout_world(&to) != ranks) { fail("--relayout-state: %d ranks do not split into --tp %d --pp %d", ranks, to.tp, to.pp); }
    mkdir(out, 0755);
    for (int r = 0; r < ranks; r++) {
        RankPlace at = {.stage = r / (to.tp * to.dp), .data = r / to.tp % to.dp, .tensor = r % to.tp};
        size_t floats = layout_state_floats(&to, at);
        float* state = (float*)malloc_check((floats > 0 ? floats : 1) * sizeof(float));
        RelayoutCounts n;
        TrainState st = relayout_rank_state(src, step, &from, &to, at, state, &n);
        st.data_position += (size_t)at.data * (size_t)atol(argv[12]);
        GPT2Config rank_config = layout_rank_config(&to, at);
        st.num_processes = ranks;
        st.rank = r;
        st.tp = to.tp;
        st.pp = to.pp;
        st.zero = zero;
        st.opt_format = format;
        st.opt_floats = floats;
        st.num_params = gpt2_num_parameters(&rank_config);
        checkpoint_path(path, sizeof(path), out, "state", step, r);
        state_file_write(path, &st, state);
        printf("rank %d: %d slices copied, %d cut anew (%d requantized), %zu entries without an old place\n", r, n.copied, n.recut,
               n.requantized, n.no_place);
        free(state);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the encoder and the probabilities for the end-to-end tests of --sample (tests/test_bpe.py,
// tests/test_cli.py)

// --bpe-encode DIR: GPT-2's BPE (llmc/bpe.h, files from DIR) on the texts of stdin, each a line
// with its length in bytes, then that many bytes; prints each one's ids on a line, word by word
// (the pre-tokenizer's words: "64|127 244|16"), after checking that bpe_encode gives them all
// and that a word merged by heap gets the ids of the quadratic scan (up to BPE_SCAN_CHECK_MAX bytes)
#define BPE_SCAN_CHECK_MAX 100000
static int bpe_encode_stdin(const char* dir) {
    Bpe bpe;
    bpe_load(&bpe, dir);
    size_t len;
    while (scanf("%zu", &len) == 1 && getchar() == '\n') {
        char* text = (char*)malloc_check(len + 1);
        int* ids = (int*)malloc_check((len + 1) * sizeof(int));
        int* word_ids = (int*)malloc_check((len + 1) * sizeof(int));
        int* scan_ids = (int*)malloc_check((len + 1) * sizeof(int));
        fread_check(text, 1, len, stdin);
        size_t n = bpe_encode(&bpe, text, len, ids), done = 0;
        const unsigned char* s = (const unsigned char*)text;
        for (size_t i = 0, end; i < len; i = end) {
            end = bpe_word_end(s, len, i);
            size_t k = bpe_encode_word(&bpe, s + i, end - i, word_ids);
            if (end - i >= BPE_HEAP_MIN_BYTES && end - i <= BPE_SCAN_CHECK_MAX) {  // the heap's ids against the scan's
                for (size_t j = 0; j < end - i; j++) { scan_ids[j] = bpe.byte_id[s[i + j]]; }
                size_t m = bpe_merge_scan(&bpe, scan_ids, end - i);
                if (m != k || memcmp(scan_ids, word_ids, k * sizeof(int)) != 0) { fail("--bpe-encode: the heap's merges differ from the scan's on a word of %zu bytes", end - i); }
            }
            for (size_t j = 0; j < k; j++) {
                printf(j ? " %d" : i ? "|%d" : "%d", word_ids[j]);
                if (done + j >= n || ids[done + j] != word_ids[j]) { fail("--bpe-encode: bpe_encode differs from its words at id %zu", done + j); }
            }
            done += k;
        }
        if (done != n) { fail("--bpe-encode: bpe_encode gave %zu ids, its words %zu", n, done); }
        printf("\n");
        free(text);
        free(ids);
        free(word_ids);
        free(scan_ids);
    }
    bpe_free(&bpe);
    return 0;
}

// --probs MODEL: for each line of token ids on stdin, the next-token probabilities after them
// (V numbers on a line): a forward of the CPU backend over just those tokens (B = 1)
static int probs_stdin(const char* path) {
    GPT2Config cfg;
    free(read_model_file(path, &cfg));
    ModelSetup s = test_setup(&cfg, 1, cfg.max_seq_len, OPT_ADAMW, 0, &ACT_KEEP_ALL);
    s.use = MODEL_FOR_SAMPLING;
    GPT2* m = test_model(&s, path, 0);
    int* ids = (int*)malloc_check((size_t)cfg.max_seq_len * sizeof(int));
    char* line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, stdin) != -1) {
        int n = 0, used;
        for (char* p = line; n < cfg.max_seq_len && sscanf(p, "%d%n", &ids[n], &used) == 1; p += used) {
            if (ids[n] < 0 || ids[n] >= cfg.vocab_size) { fail("--probs: id %d is outside the vocabulary of %d", ids[n], cfg.vocab_size); }
            n++;
        }
        if (n == 0) { fail("--probs: a line without token ids"); }
        gpt2_forward(m, ids, NULL, 1, n);
        const float* probs = gpt2_probs(m, n - 1);
        for (int i = 0; i < cfg.vocab_size; i++) { printf(i ? " %.9g" : "%.9g", probs[i]); }
        printf("\n");
    }
    free(line);
    free(ids);
    gpt2_destroy(m);
    return 0;
}

// ----------------------------------------------------------------------------

// ----------------------------------------------------------------------------
// the layers that sum side by side (cpu/layernorm_sums.h: LN_ROWS rows at once; the encoder's parameter
// gradients: blocks of channels) against the plain loops of llm.c's CPU trainer, one row or one column at a
// time: bitwise, on shapes with partial groups and blocks; LayerNorm's parameter gradients (parts of
// LN_PART_ROWS rows, then the parts) to float rounding

static void llmc_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* w, const float* b, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float* x = inp + (size_t)i * C;
        float m = 0.0f, v = 0.0f;
        for (int c = 0; c < C; c++) { m += x[c]; }
        m /= C;
        for (int c = 0; c < C; c++) { float d = x[c] - m; v += d * d; }
        float s = 1.0f / sqrtf(v / C + LAYERNORM_EPS);
        for (int c = 0; c < C; c++) { out[(size_t)i * C + c] = (x[c] - m) * s * w[c] + b[c]; }
        mean[i] = m;
        rstd[i] = s;
    }
}

static void llmc_layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                                    const float* w, const float* mean, const float* rstd, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float *dy = dout + (size_t)i * C, *x = inp + (size_t)i * C;
        float dm = 0.0f, dnm = 0.0f;
        for (int c = 0; c < C; c++) { float dn = w[c] * dy[c]; dm += dn; dnm += dn * (x[c] - mean[i]) * rstd[i]; }
        dm /= C;
        dnm /= C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - mean[i]) * rstd[i];
            dinp[(size_t)i * C + c] += (w[c] * dy[c] - dm - norm * dnm) * rstd[i];
        }
    }
    for (int c = 0; c < C; c++) {  // the sums over rows, in row order, one channel at a time
        float sw = 0.0f, sb = 0.0f;
        for (int i = 0; i < N; i++) { sw += (inp[(size_t)i * C + c] - mean[i]) * rstd[i] * dout[(size_t)i * C + c]; sb += dout[(size_t)i * C + c]; }
        dw[c] += sw;
        db[c] += sb;
    }
}

static void llmc_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
    for (int bt = 0; bt < B * T; bt++) {
        for (int c = 0; c < C; c++) {
            dwte[(size_t)inp[bt] * C + c] += dout[(size_t)bt * C + c];
            dwpe[(size_t)(bt % T) * C + c] += dout[(size_t)bt * C + c];
        }
    }
}

#define ORDER_V 5   // the encoder's vocabulary: fewer tokens than positions, so tokens repeat
#define LN_PARAM_ATOL 1e-6
#define LN_PARAM_RTOL 1e-5

static void check_layer_orders(int B, int T, int C) {
    int N = B * T;
    size_t n = (size_t)N * C, m = (size_t)(N + ORDER_V) * C;  // m: room for any of the tensors
    float* buf = (float*)calloc(20 * m, sizeof(float));
    float *x = buf, *dy = x + m, *out = dy + m, *want_out = out + m, *dx = want_out + m, *want_dx = dx + m;
    float *dwte = want_dx + m, *want_dwte = dwte + m, *dwpe = want_dwte + m, *want_dwpe = dwpe + m;
    float *w = want_dwpe + m, *b = w + m, *dw = b + m, *want_dw = dw + m, *db = want_dw + m, *want_db = db + m;
    float *mean = want_db + m, *rstd = mean + m, *want_mean = rstd + m, *want_rstd = want_mean + m;
    int* tok = (int*)malloc_check((size_t)N * sizeof(int));
    uint64_t rng = 42;
    for (size_t i = 0; i < n; i++) { x[i] = 3.0f * rand_uniform(&rng) - 1.0f; dy[i] = rand_uniform(&rng) - 0.5f; }
    for (int c = 0; c < C; c++) { w[c] = rand_uniform(&rng) + 0.5f; b[c] = rand_uniform(&rng) - 0.5f; }
    for (int i = 0; i < N; i++) { tok[i] = (i * 3) % ORDER_V; }
    layernorm_forward(out, mean, rstd, x, w, b, B, T, C);
    llmc_layernorm_forward(want_out, want_mean, want_rstd, x, w, b, N, C);
    layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, B, T, C);
    llmc_layernorm_backward(want_dx, want_dw, want_db, dy, x, w, want_mean, want_rstd, N, C);
    encoder_backward(dwte, dwpe, dy, tok, B, T, C);
    llmc_encoder_backward(want_dwte, want_dwpe, dy, tok, B, T, C);
    char name[160];
    snprintf(name, sizeof(name), "layer orders (B=%d, T=%d, C=%d): LayerNorm and the encoder bitwise as llm.c's loops", B, T, C);
    int same = memcmp(out, want_out, n * sizeof(float)) == 0 && memcmp(mean, want_mean, N * sizeof(float)) == 0 &&
               memcmp(rstd, want_rstd, N * sizeof(float)) == 0 && memcmp(dx, want_dx, n * sizeof(float)) == 0 &&
               memcmp(dwte, want_dwte, (size_t)ORDER_V * C * sizeof(float)) == 0 &&
               memcmp(dwpe, want_dwpe, (size_t)T * C * sizeof(float)) == 0;
    check(same, name, "differs (out %d, mean %d, rstd %d, dx %d, dwte %d, dwpe %d)",
          memcmp(out, want_out, n * 4) != 0, memcmp(mean, want_mean, N * 4) != 0, memcmp(rstd, want_rstd, N * 4) != 0,
          memcmp(dx, want_dx, n * 4) != 0, memcmp(dwte, want_dwte, (size_t)ORDER_V * C * 4) != 0, memcmp(dwpe, want_dwpe, (size_t)T * C * 4) != 0);
    // LayerNorm's parameter gradients add a part's rows, then the parts (LN_PART_ROWS): llm.c's sums in another order
    snprintf(name, sizeof(name), "layer orders (B=%d, T=%d, C=%d): LayerNorm's dweight and dbias as llm.c's loops, to float rounding", B, T, C);
    size_t worst_w, worst_b;
    double rw = tolerance_ratio(dw, want_dw, C, LN_PARAM_ATOL, LN_PARAM_RTOL, &worst_w);
    double rb = tolerance_ratio(db, want_db, C, LN_PARAM_ATOL, LN_PARAM_RTOL, &worst_b);
    check(rw <= 1.0 && rb <= 1.0, name, "dweight %.2fx the tolerance at %zu, dbias %.2fx at %zu", rw, worst_w, rb, worst_b);
    free(buf);
    free(tok);
}

// the attention one key and one channel at a time (llm.c's loops, its softmax with expf included; cpu/layers.h
// runs each head's products through cpu/matmul_small.h with fused multiply-adds, and the softmax with exp_vec):
// out (B,T,C), att (B,NH,T,T)
static void llmc_attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) for (int h = 0; h < NH; h++) for (int t = 0; t < T; t++) {
        const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
        float* a = att + (((size_t)b * NH + h) * T + t) * T;
        float maxv = -INFINITY, sum = 0.0f;
        for (int u = 0; u <= t; u++) {
            const float* k = qkv + ((size_t)b * T + u) * C3 + C + h * hs;
            float d = 0.0f;
            for (int i = 0; i < hs; i++) { d += q[i] * k[i]; }
            a[u] = d * scale;
            if (a[u] > maxv) { maxv = a[u]; }
        }
        for (int u = 0; u <= t; u++) { a[u] = expf(a[u] - maxv); sum += a[u]; }
        for (int u = 0; u < T; u++) { a[u] = u <= t ? a[u] / sum : 0.0f; }
    }
    for (int b = 0; b < B; b++) for (int h = 0; h < NH; h++) for (int t = 0; t < T; t++) {
        const float* a = att + (((size_t)b * NH + h) * T + t) * T;
        float* o = out + ((size_t)b * T + t) * C + h * hs;
        for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
        for (int u = 0; u <= t; u++) {
            const float* v = qkv + ((size_t)b * T + u) * C3 + 2 * C + h * hs;
            for (int i = 0; i < hs; i++) { o[i] += a[u] * v[i]; }
        }
    }
}

// dqkv (B,T,3C) += from dout (B,T,C); datt (B,NH,T,T) scratch
static void llmc_attention_backward(float* dqkv, float* datt, const float* dout, const float* qkv, const float* att,
                                    int B, int T, int C, int NH) {
    int C3 = 3 * C, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++) for (int h = 0; h < NH; h++) for (int t = 0; t < T; t++) {
        const float* a = att + (((size_t)b * NH + h) * T + t) * T;
        float* da = datt + (((size_t)b * NH + h) * T + t) * T;
        const float* dy = dout + ((size_t)b * T + t) * C + h * hs;
        for (int u = 0; u <= t; u++) {
            const float* v = qkv + ((size_t)b * T + u) * C3 + 2 * C + h * hs;
            float* dv = dqkv + ((size_t)b * T + u) * C3 + 2 * C + h * hs;
            float d = 0.0f;
            for (int i = 0; i < hs; i++) { d += v[i] * dy[i]; dv[i] += a[u] * dy[i]; }
            da[u] = d;
        }
        float dot = 0.0f;
        for (int u = 0; u <= t; u++) { dot += a[u] * da[u]; }
        for (int u = 0; u <= t; u++) { da[u] = a[u] * (da[u] - dot); }
        const float* q = qkv + ((size_t)b * T + t) * C3 + h * hs;
        float* dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
        for (int u = 0; u <= t; u++) {
            const float* k = qkv + ((size_t)b * T + u) * C3 + C + h * hs;
            float* dk = dqkv + ((size_t)b * T + u) * C3 + C + h * hs;
            float g = da[u] * scale;
            for (int i = 0; i < hs; i++) { dq[i] += g * k[i]; dk[i] += g * q[i]; }
        }
    }
}

// the attention (forward: the weights, zero after t, and the output; backward: dqkv =, over what it held) against
// llm.c's loops (which add into zeros),
// within the float sums' rounding; and the weights alone (--recompute attn) bitwise the forward's
#define ATT_ATOL 5e-7
#define ATT_RTOL 5e-6
static void check_attention_against_llmc(int B, int T, int C, int NH) {
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float* buf = (float*)calloc(3 * nq + 3 * no + 5 * na, sizeof(float));
    float *qkv = buf, *dqkv = qkv + nq, *want_dqkv = dqkv + nq, *out = want_dqkv + nq, *want_out = out + no, *dout = want_out + no;
    float *att = dout + no, *want_att = att + na, *datt = want_att + na, *want_datt = datt + na, *att_alone = want_datt + na;
    uint64_t rng = 7;
    for (size_t i = 0; i < nq; i++) { qkv[i] = 2.0f * rand_uniform(&rng) - 1.0f; dqkv[i] = rand_uniform(&rng) - 0.5f; want_dqkv[i] = 0.0f; }
    for (size_t i = 0; i < no; i++) { dout[i] = rand_uniform(&rng) - 0.5f; }
    for (size_t i = 0; i < na; i++) { att[i] = datt[i] = att_alone[i] = 1.0f; }  // every weight written, zeros after t included
    attention_forward(out, att, qkv, B, T, C, NH);
    llmc_attention_forward(want_out, want_att, qkv, B, T, C, NH);
    attention_weights_forward(att_alone, qkv, B, T, C, NH);
    attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    llmc_attention_backward(want_dqkv, want_datt, dout, qkv, att, B, T, C, NH);  // from the same weights
    char name[160];
    snprintf(name, sizeof(name), "attention (B=%d, T=%d, C=%d, NH=%d): the weights as llm.c's loops", B, T, C, NH);
    check_close(name, att, want_att, na, ATT_ATOL, ATT_RTOL);
    snprintf(name, sizeof(name), "attention (B=%d, T=%d, C=%d, NH=%d): the output as llm.c's loops", B, T, C, NH);
    check_close(name, out, want_out, no, ATT_ATOL, ATT_RTOL);
    snprintf(name, sizeof(name), "attention (B=%d, T=%d, C=%d, NH=%d): dqkv = as llm.c's loops", B, T, C, NH);
    check_close(name, dqkv, want_dqkv, nq, ATT_ATOL, ATT_RTOL);
    snprintf(name, sizeof(name), "attention (B=%d, T=%d, C=%d, NH=%d): attention_weights_forward bitwise the forward's weights", B, T, C, NH);
    check(memcmp(att, att_alone, na * sizeof(float)) == 0, name, "differs");
    free(buf);
}

// cpu/matmul_small.h: each element of c is its own sum over k in increasing order, one fmaf a step, then
// times alpha (and added to c by one more): bitwise that, whatever the tile and vector width; nothing of c
// outside (rows, cols) is touched; and its transpose and copy exact
#define SMM_SENTINEL 12345.0f
typedef struct { int rows, cols, k0, k1, transposed; SmmMode mode; float alpha; } SmmCase;

static void check_small_matmul(const SmmCase* sc) {
    int K = sc->k1 + 3, lda = sc->transposed ? sc->rows + 5 : K + 2, ldb = sc->cols + 7, ldc = sc->cols + 9;
    size_t na = (size_t)(sc->transposed ? K : sc->rows) * lda, nb = (size_t)K * ldb, nc = (size_t)(sc->rows + 1) * ldc;
    float* buf = (float*)malloc_check((na + nb + 2 * nc) * sizeof(float));
    float *a = buf, *b = a + na, *c = b + nb, *want = c + nc;
    uint64_t rng = 13;
    for (size_t i = 0; i < na; i++) { a[i] = rand_uniform(&rng) - 0.5f; }
    for (size_t i = 0; i < nb; i++) { b[i] = rand_uniform(&rng) - 0.5f; }
    for (size_t i = 0; i < nc; i++) { c[i] = want[i] = (size_t)i % (size_t)ldc < (size_t)sc->cols && i < (size_t)sc->rows * ldc ? rand_uniform(&rng) : SMM_SENTINEL; }
    int a_rs = sc->transposed ? 1 : lda, a_ks = sc->transposed ? lda : 1;
    smm(c, ldc, a, a_rs, a_ks, b, ldb, sc->rows, sc->cols, sc->k0, sc->k1, sc->alpha, sc->mode);
    for (int r = 0; r < sc->rows; r++) {
        for (int j = 0; j < sc->cols; j++) {
            float acc = 0.0f, *w = want + (size_t)r * ldc + j;
            for (int k = sc->k0; k < sc->k1; k++) { acc = fmaf(a[(size_t)r * a_rs + (size_t)k * a_ks], b[(size_t)k * ldb + j], acc); }
            *w = sc->mode == SMM_ADD ? fmaf(sc->alpha, acc, *w) : sc->alpha * acc;
        }
    }
    char name[160];
    snprintf(name, sizeof(name), "smm: %d x %d, k in [%d, %d), a%s, %s: bitwise the fmaf sums in k order, nothing else of c touched",
             sc->rows, sc->cols, sc->k0, sc->k1, sc->transposed ? " transposed" : "", sc->mode == SMM_ADD ? "+=" : "=");
    check(memcmp(c, want, nc * sizeof(float)) == 0, name, "differs");
    free(buf);
}

static void test_small_matmul(void) {
    const SmmCase cases[] = {
        {7, 70, 3, 41, 0, SMM_WRITE, 0.5f},    // a partial tile of SMM_ROWS rows; two column tiles, the last partial
        {4, 16, 0, 64, 1, SMM_ADD, 1.0f},      // a transposed, as the attention's dv and dk; a whole vector
        {13, 129, 5, 9, 1, SMM_ADD, -2.0f},    // three column tiles (64 + 64 + 1 with AVX-512)
        {1, 1, 0, 1, 0, SMM_WRITE, 1.0f},      // one element, one step
        {3, 20, 6, 6, 0, SMM_WRITE, 1.0f},     // no k at all: c = 0
        {5, 33, 2, 2, 1, SMM_ADD, 1.0f},       // no k, +=: c unchanged
    };
    for (int i = 0; i < (int)(sizeof(cases) / sizeof(cases[0])); i++) { check_small_matmul(&cases[i]); }
    int rows = 19, cols = 37, lds = cols + 3, ldd = rows + 5;  // partial 8 x 8 blocks both ways
    float* buf = (float*)calloc((size_t)rows * lds + 2 * (size_t)cols * ldd + (size_t)rows * lds, sizeof(float));
    float *src = buf, *t = src + (size_t)rows * lds, *back = t + (size_t)cols * ldd, *copy = back + (size_t)cols * ldd;
    uint64_t rng = 17;
    for (int i = 0; i < rows * lds; i++) { src[i] = rand_uniform(&rng); }
    smm_transpose(t, ldd, src, lds, rows, cols);
    smm_copy(copy, lds, src, lds, rows, cols);
    int same = 1;
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
            same &= t[(size_t)j * ldd + i] == src[(size_t)i * lds + j] && copy[(size_t)i * lds + j] == src[(size_t)i * lds + j];
        }
    }
    check(same, "smm_transpose, smm_copy: 19 x 37, every element in its place", "differs");
    free(buf);
}

// the GELU's spans (16 lanes a step with AVX-512, 8 with AVX2) and the vector exps against the one-element
// functions they mirror (cpu/gelu.h, cpu/vecmath.h): bitwise, on a sweep through exp's clamps and GELU's
// tails, an odd count (a scalar tail), and the values at the edges (infinities, NaN, signed zeros,
// denormals); each vector width this machine has, so that an AVX-512 machine checks the AVX2 code too
#define SPAN_LO (-100.0f)    // past both clamps of exp's argument (-2u < -87 and > 88)
#define SPAN_STEP 1.0e-3f

// how many lanes of the vector functions of width w (8 or 16) differ from the scalar ones over x (n)
static int vector_exp_mismatches(const float* x, size_t n, int w) {
    int bad = 0;
    for (size_t i = 0; i + (size_t)w <= n; i += (size_t)w) {
        float e[16], g[16];
#if defined(__AVX512F__)
        if (w == 16) {
            _mm512_storeu_ps(e, exp_vec16(clamp_vec16(_mm512_loadu_ps(x + i), EXP_VEC_MIN, EXP_VEC_MAX)));
            _mm512_storeu_ps(g, gelu_exp16(_mm512_loadu_ps(x + i)));
        }
#endif
#if defined(__AVX2__) && defined(__FMA__)
        if (w == 8) {
            _mm256_storeu_ps(e, exp_vec8(clamp_vec8(_mm256_loadu_ps(x + i), EXP_VEC_MIN, EXP_VEC_MAX)));
            _mm256_storeu_ps(g, gelu_exp8(_mm256_loadu_ps(x + i)));
        }
#endif
        for (int k = 0; k < w; k++) {
            float we = exp_vec(clamp_vec(x[i + k], EXP_VEC_MIN, EXP_VEC_MAX)), wg = gelu_exp(x[i + k]);
            bad += memcmp(&e[k], &we, sizeof(float)) != 0;
            bad += memcmp(&g[k], &wg, sizeof(float)) != 0;
        }
    }
    return bad;
}

static void test_vector_spans(void) {
    size_t n = (size_t)((-2.0f * SPAN_LO) / SPAN_STEP) + 3;  // 3: a partial vector at the end
    float edges[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-40f, -1e-40f, EXP_VEC_MIN, EXP_VEC_MAX};
    size_t ne = sizeof(edges) / sizeof(edges[0]), total = n + ne;
    float* buf = (float*)malloc_check(6 * total * sizeof(float));
    float *x = buf, *got = x + total, *want = got + total, *dout = want + total, *dgot = dout + total, *dwant = dgot + total;
    for (size_t i = 0; i < n; i++) { x[i] = SPAN_LO + SPAN_STEP * (float)i; }
    memcpy(x + n, edges, sizeof(edges));
    uint64_t rng = 11;
    for (size_t i = 0; i < total; i++) { dout[i] = rand_uniform(&rng) - 0.5f; dgot[i] = dwant[i] = rand_uniform(&rng); }
    gelu_span(got, x, total);
    for (size_t i = 0; i < total; i++) { want[i] = gelu_elem(x[i]); }
    check(memcmp(got, want, total * sizeof(float)) == 0, "gelu_span: bitwise gelu_elem on a sweep of [-100, 100] and the edge values", "differs");
    gelu_grad_span(dgot, x, dout, total);
    for (size_t i = 0; i < total; i++) { dwant[i] = fmaf(gelu_grad_elem(x[i]), dout[i], dwant[i]); }
    check(memcmp(dgot, dwant, total * sizeof(float)) == 0, "gelu_grad_span: bitwise gelu_grad_elem on the same inputs (one FMA)", "differs");
#if defined(__AVX512F__)
    int bad16 = vector_exp_mismatches(x, total, 16);
    check(bad16 == 0, "exp_vec16, gelu_exp16: bitwise exp_vec and gelu_exp on the same inputs", "%d lanes differ", bad16);
#endif
#if defined(__AVX2__) && defined(__FMA__)
    int bad8 = vector_exp_mismatches(x, total, 8);
    check(bad8 == 0, "exp_vec8, gelu_exp8: bitwise exp_vec and gelu_exp on the same inputs", "%d lanes differ", bad8);
#endif
    free(buf);
}

// exp_vec, the GELU and its derivative against the same functions in double (an independent reference):
// exp within EXP_ULPS units in the last place over [-87, 88]; the GELU within GELU_ATOL + GELU_RTOL |gelu|
// over [-100, 100] (far below 0 gelu is x exp(-2u), relative error that of exp's argument), its derivative
// within GELU_GRAD_ATOL + GELU_GRAD_RTOL |gelu'|
#define EXP_ULPS 1.05
#define GELU_ATOL 1e-7
#define GELU_RTOL 1e-6
#define GELU_GRAD_ATOL 3e-7
#define GELU_GRAD_RTOL 6e-6
static void test_vector_math_accuracy(void) {
    double worst_ulps = 0.0;
    for (float x = EXP_VEC_MIN; x <= EXP_VEC_MAX; x += 1e-3f) {
        double e = exp((double)x), ulp = (double)nextafterf((float)e, INFINITY) - (double)(float)e;
        worst_ulps = fmax(worst_ulps, fabs((double)exp_vec(x) - e) / ulp);
    }
    check(worst_ulps <= EXP_ULPS, "exp_vec: within 1.05 ulp of exp over [-87, 88]", "%.3f ulp", worst_ulps);
    size_t n = (size_t)((-2.0f * SPAN_LO) / SPAN_STEP);
    float* buf = (float*)malloc_check(4 * n * sizeof(float));
    float *got = buf, *want = got + n, *dgot = want + n, *dwant = dgot + n;
    for (size_t i = 0; i < n; i++) {
        double x = SPAN_LO + SPAN_STEP * (double)i, u = GELU_SCALE * (x + GELU_CUBIC * x * x * x);
        double s = 1.0 / (1.0 + exp(-2.0 * u));  // 0.5 (1 + tanh(u)), without its cancellation
        want[i] = (float)(x * s);
        dwant[i] = (float)(s + 2.0 * x * s * (1.0 - s) * GELU_SCALE * (1.0 + 3.0 * GELU_CUBIC * x * x));
        got[i] = gelu_elem((float)x);
        dgot[i] = gelu_grad_elem((float)x);
    }
    check_close("gelu_elem: GELU in double over [-100, 100]", got, want, n, GELU_ATOL, GELU_RTOL);
    check_close("gelu_grad_elem: its derivative in double over [-100, 100]", dgot, dwant, n, GELU_GRAD_ATOL, GELU_GRAD_RTOL);
    free(buf);
}

// the softmax's rows (cpu/layers.h: the exponentials and their lane sums in one pass, 16 lanes with AVX-512,
// two vectors of 8 with AVX2) against the same arithmetic one element at a time: the max, exp_vec (0 below
// EXP_VEC_MIN), the sum in SOFTMAX_LANES lanes then pairwise (lane k + lane k + 8, then + 4, + 2, + 1), one
// multiplication by its inverse: bitwise
static void check_softmax_rows(int BT, int V, int Vp) {
    size_t n = (size_t)BT * Vp;
    float* buf = (float*)malloc_check(3 * n * sizeof(float));
    float *logits = buf, *got = logits + n, *want = got + n;
    uint64_t rng = 5;
    for (size_t i = 0; i < n; i++) { logits[i] = 200.0f * rand_uniform(&rng) - 100.0f; }  // differences past -87 too
    softmax_forward(got, logits, 1, BT, V, Vp);
    for (int r = 0; r < BT; r++) {
        const float* x = logits + (size_t)r * Vp;
        float* p = want + (size_t)r * Vp;
        float maxv = -INFINITY, lane[SOFTMAX_LANES] = {0.0f};
        for (int i = 0; i < V; i++) { maxv = x[i] > maxv ? x[i] : maxv; }
        for (int i = 0; i < V; i++) {
            float d = x[i] - maxv;
            p[i] = d < EXP_VEC_MIN ? 0.0f : exp_vec(clamp_vec(d, EXP_VEC_MIN, 0.0f));
            lane[i % SOFTMAX_LANES] += p[i];
        }
        for (int w = SOFTMAX_LANES / 2; w >= 1; w /= 2) {
            for (int k = 0; k < w; k++) { lane[k] += lane[k + w]; }
        }
        for (int i = 0; i < V; i++) { p[i] *= 1.0f / lane[0]; }
        for (int i = V; i < Vp; i++) { p[i] = 0.0f; }
    }
    char name[128];
    snprintf(name, sizeof(name), "softmax rows (BT=%d, V=%d, Vp=%d): bitwise the one-element arithmetic", BT, V, Vp);
    check(memcmp(got, want, n * sizeof(float)) == 0, name, "differs");
    free(buf);
}

// the softmax backward's dot product (cpu/layers.h softmax_row_dot: 16 lanes with AVX-512, two vectors of 8
// with AVX2) against its arithmetic one element at a time: lane i % SOFTMAX_LANES takes fmaf(a[i], b[i], lane),
// then the lanes pairwise; bitwise, for n from 1 to past two blocks of 16 (tails of every length), rows
// longer than n whose entries past n count for nothing
#define DOT_ROW 40
static void test_softmax_row_dot(void) {
    float a[DOT_ROW], b[DOT_ROW];
    uint64_t rng = 19;
    for (int i = 0; i < DOT_ROW; i++) { a[i] = rand_uniform(&rng) - 0.5f; b[i] = 3.0f * rand_uniform(&rng) - 1.5f; }
    int bad = 0;
    for (int n = 1; n <= DOT_ROW; n++) {
        float lane[SOFTMAX_LANES] = {0.0f};
        for (int i = 0; i < n; i++) { lane[i % SOFTMAX_LANES] = fmaf(a[i], b[i], lane[i % SOFTMAX_LANES]); }
        for (int w = SOFTMAX_LANES / 2; w >= 1; w /= 2) {
            for (int k = 0; k < w; k++) { lane[k] += lane[k + w]; }
        }
        float got = softmax_row_dot(a, b, n, DOT_ROW);
        bad += memcmp(&got, &lane[0], sizeof(float)) != 0;
    }
    check(bad == 0, "softmax_row_dot: bitwise the lanes' fmaf sums, then pairwise, for n = 1..40", "%d lengths differ", bad);
}

// the factored optimizers' sums (cpu/optimizers.h: OPT_ROWS rows side by side, by blocks of columns;
// OPT_SIDE parts of the clip's sum side by side) against the same sums one row and one part at a time:
// the second moment's and CAME's residual statistics, their column sums by parts (double), the first
// moment and the clip divisor, bitwise
static double ref_clip_sum_squares(const float* g, const OptWorkspace* w, const OptShard* sh) {
    double total = 0.0;
    for (int p = 0; p < OPT_PARTS; p++) {
        size_t b, e;
        opt_part((size_t)sh->rows, p, &b, &e);
        double s = 0.0;
        for (size_t i = b; i < e; i++) {
            for (int j = 0; j < sh->cols; j++) { float u = (w->scale_row[i] * w->scale_col[j]) * g[i * sh->cols + j]; s += (double)u * u; }
        }
        total += s;
    }
    return total;
}

// one row at a time: row_stat = ema(row means), w->col_parts the column sums of each part, of
// x = g^2 + eps (M == NULL) or CAME's residual (M updated)
static void ref_factored_stat(float* row_stat, float* M, const float* g, const OptShard* sh, const OptWorkspace* sw,
                              double* col_parts, float eps, float clip, OptEma e1, OptEma ema) {
    int cols = sh->cols;
    for (int p = 0; p < OPT_PARTS; p++) {
        double* col_sum = col_parts + (size_t)p * cols;
        for (int j = 0; j < cols; j++) { col_sum[j] = 0.0; }
        size_t b, e;
        opt_part((size_t)sh->rows, p, &b, &e);
        for (size_t i = b; i < e; i++) {
            double row_sum = 0.0;
            for (int j = 0; j < cols; j++) {
                size_t k = i * cols + j;
                float x;
                if (M == NULL) {
                    x = g[k] * g[k] + eps;
                } else {
                    float u = (sw->scale_row[i] * sw->scale_col[j]) * g[k] / clip;
                    M[k] = opt_ema(M[k], u, e1);
                    float d = u - M[k];
                    x = d * d + eps;
                }
                row_sum += x;
                col_sum[j] += x;
            }
            row_stat[i] = opt_ema(row_stat[i], (float)(row_sum / cols), ema);
        }
    }
}

static void check_factored_sums(int rows, int cols) {
    ParamSlice slice = param_slice_alone(10, rows, cols);
    size_t offset = 0, n = (size_t)rows * cols;
    OptShard sh = slice_shard(&slice, &OPT_UNSHARDED, &offset);
    float* buf = (float*)calloc(4 * n + 4 * (size_t)(rows + cols), sizeof(float));
    float *g = buf, *M = g + n, *want_M = M + n, *R = want_M + n, *Cc = R + rows, *want_R = Cc + cols;
    uint64_t rng = 3;
    for (size_t i = 0; i < n; i++) {  // magnitudes over 6 decades: the double sums' order shows in their bits
        g[i] = (rand_uniform(&rng) - 0.5f) * powf(10.0f, -6.0f * rand_uniform(&rng));
        M[i] = want_M[i] = 1e-3f * (rand_uniform(&rng) - 0.5f);
    }
    OptWorkspace w = opt_workspace_alloc(&sh), want = opt_workspace_alloc(&sh);
    OptEma ema = opt_ema_coeffs(0.9), e1 = opt_ema_coeffs(0.8);
    float eps = 1e-12f, clip = 1.7f;
    opt_ema_grad_sq_factored(R, Cc, g, &sh, eps, ema, &w);
    ref_factored_stat(want_R, NULL, g, &sh, NULL, want.col_parts, eps, clip, e1, ema);
    size_t parts_bytes = (size_t)OPT_PARTS * cols * sizeof(double);
    int same_g2 = memcmp(R, want_R, rows * sizeof(float)) == 0 && memcmp(w.col_parts, want.col_parts, parts_bytes) == 0;
    for (int i = 0; i < rows; i++) { w.scale_row[i] = want.scale_row[i] = 0.5f + rand_uniform(&rng); }
    for (int j = 0; j < cols; j++) { w.scale_col[j] = want.scale_col[j] = 0.5f + rand_uniform(&rng); }
    double got_clip = opt_clip_sum_squares(g, &w, &sh), want_clip = ref_clip_sum_squares(g, &want, &sh);
    CAMEHyper h = {.beta1 = 0.8, .beta3 = 0.9, .eps2 = eps};
    came_moment_and_residual(M, R, Cc, g, &sh, clip, &h, &w);
    ref_factored_stat(want_R, want_M, g, &sh, &want, want.col_parts, eps, clip, e1, ema);
    int same_res = memcmp(M, want_M, n * sizeof(float)) == 0 && memcmp(R, want_R, rows * sizeof(float)) == 0 &&
                   memcmp(w.col_parts, want.col_parts, parts_bytes) == 0;
    char name[160];
    snprintf(name, sizeof(name), "optimizer sums (%d x %d): G's and CAME's residual statistics, the clip's sum bitwise one row and part at a time", rows, cols);
    check(same_g2 && same_res && got_clip == want_clip, name, "differs (second moment %d, residual %d, clip's sum %.17g vs %.17g)",
          !same_g2, !same_res, got_clip, want_clip);
    opt_workspace_free(&w);
    opt_workspace_free(&want);
    free(buf);
}

static void test_layer_orders(void) {
    check_layer_orders(3, 5, 37);    // 15 rows: a partial group of LN_ROWS; 37 channels: a partial vector block
    check_layer_orders(2, 8, 136);   // two whole channel blocks and a partial one
    check_layer_orders(1, 1, 7);     // one row, fewer channels than a vector block
    check_layer_orders(3, 37, 40);   // 111 rows: 4 parts of LN_PART_ROWS, the last partial (and its last group)
    check_attention_against_llmc(2, 19, 40, 2);   // hs = 20, T = 19: partial vectors, and a partial block of SMM_ROWS rows
    check_attention_against_llmc(1, 5, 16, 2);    // hs = 8: less than a vector
    check_attention_against_llmc(1, 70, 160, 2);  // hs = 80, T = 70: past one tile's SMM_COLS columns both ways
}

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "--write-fixtures") == 0) { write_fixtures(argv[2]); return 0; }
    if (argc == 5 && strcmp(argv[1], "--compare-models") == 0) { return compare_models(argv[2], argv[3], atof(argv[4])); }
    if (argc == 3 && strcmp(argv[1], "--bpe-encode") == 0) { return bpe_encode_stdin(argv[2]); }
    if (argc == 3 && strcmp(argv[1], "--probs") == 0) { return probs_stdin(argv[2]); }
    if (argc == 13 && strcmp(argv[1], "--relayout-state") == 0) { return relayout_state_tool(argv); }
    char dir[] = "/tmp/test_gpt_XXXXXX";
    if (mkdtemp(dir) == NULL) { fail("mkdtemp: %s", strerror(errno)); }
    test_against_pytorch();
    test_small_matmul();
    test_layer_orders();
    test_vector_spans();
    test_vector_math_accuracy();
    check_softmax_rows(3, 37, 48);      // two whole blocks of 16 and a tail of 5; padding after V
    check_softmax_rows(2, 16, 16);      // one whole block, no tail, no padding
    check_softmax_rows(2, 7, 8);        // only the tail
    test_softmax_row_dot();
    check(OPT_PARTS % OPT_SIDE == 0, "optimizer sums: the clip's groups of OPT_SIDE parts cover OPT_PARTS", "%d %% %d != 0", OPT_PARTS, OPT_SIDE);
    check_factored_sums(301, 300);      // parts of 4 and 5 rows (a partial group of OPT_ROWS), a partial column block
    check_factored_sums(37, 5);         // parts of 0 and 1 rows: the clip's groups have no common row
    test_finite_differences();
    test_model_files(dir);
    test_tokenizer(dir);
    test_crc32();
    test_utf8_printer();
    test_dataloader(dir);
    test_memory_plan(dir);
    test_recompute_offload_bitwise();
    test_tensor_parallel_block();
    test_weight_runs();
    test_relayout_places();
    test_loss_chunk();
    const char* files[] = {"tiny_adafactor.bin", "tiny_adafactor_beta1.bin", "tiny_came.bin", "tiny_came_wd.bin"};
    for (int i = 0; i < (int)(sizeof(files) / sizeof(files[0])); i++) { test_optimizer_reference(files[i]); }
    test_thread_count("tiny_adafactor_beta1.bin");
    test_thread_count("tiny_came.bin");
    test_d12_state_size();
    test_usage_lists_every_flag();
    test_sizes();
    test_checkpoint_space(dir);
    test_checkpoint_not_finite(dir);
    test_sampler();
    test_sampling_model();
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) { printf("note: could not remove %s\n", dir); }
    return check_summary();
}
