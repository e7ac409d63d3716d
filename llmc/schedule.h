/*
schedule.h: what each optimizer step is told: the learning rate of the step (linear
warmup, then cosine decay) and the optimizer's hyperparameters from the flags. Shared by
every backend, so a step is configured the same on the CPU and on a GPU.

    float lr = learning_rate_at(&opt, step, max_steps);
    StepConfig sc = {optimizer_hyper(&opt, OPT_ADAMW, lr), opt.grad_clip, step + 1};
*/
#ifndef LLMC_SCHEDULE_H
#define LLMC_SCHEDULE_H

#include <math.h>
#include <string.h>
#include "flags.h"
#include "opt_layout.h"

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

typedef struct {
    OptimizerHyper hyper;  // of the model's optimizer (opt_layout.h)
    float grad_clip;       // clip the global gradient norm to this; 0 = off
    int t;                 // optimizer step, from 1
} StepConfig;

// the optimizer's hyperparameters from the flags, at this step's scheduled learning rate.
// Adafactor and CAME take their papers' defaults for what the flags do not set.
static OptimizerHyper optimizer_hyper(const TrainOptions* o, OptimizerKind kind, float lr) {
    OptimizerHyper h;
    memset(&h, 0, sizeof(h));
    if (kind == OPT_ADAMW) {
        AdamWHyper a = {.lr = lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .weight_decay = o->weight_decay};
        h.adamw = a;
    } else if (kind == OPT_ADAFACTOR) {
        // --relative-step: lr = min(1e-2, 1/sqrt(t)) * max(eps2, RMS(p)) and -l is ignored;
        // otherwise the scheduled -l (as HF Trainer uses Adafactor)
        int rel = o->relative_step;
        AdafactorHyper a = {.lr = rel ? 0.0 : lr, .beta1 = o->adafactor_beta1, .decay_rate = ADAFACTOR_DECAY_RATE,
                            .eps1 = o->eps1, .eps2 = ADAFACTOR_EPS2, .clip_threshold = ADAFACTOR_CLIP_THRESHOLD,
                            .weight_decay = o->weight_decay, .scale_parameter = rel, .relative_step = rel};
        h.adafactor = a;
    } else {
        CAMEHyper c = {.lr = lr, .beta1 = CAME_BETA1, .beta2 = CAME_BETA2, .beta3 = CAME_BETA3, .eps1 = o->eps1,
                       .eps2 = CAME_EPS2, .clip_threshold = CAME_CLIP_THRESHOLD, .weight_decay = o->weight_decay};
        h.came = c;
    }
    return h;
}

// warmup (linear from lr/warmup) then cosine decay to lr * final_frac at max_steps
static float learning_rate_at(const TrainOptions* o, int step, int max_steps) {
    if (step < o->warmup_steps) { return o->learning_rate * (step + 1) / o->warmup_steps; }
    if (max_steps <= o->warmup_steps) { return o->learning_rate; }
    float ratio = (float)(step - o->warmup_steps) / (float)(max_steps - o->warmup_steps);
    float coeff = 0.5f * (1.0f + cosf((float)M_PI * ratio));
    float min_lr = o->learning_rate * o->final_lr_frac;
    return min_lr + coeff * (o->learning_rate - min_lr);
}

#endif // LLMC_SCHEDULE_H
