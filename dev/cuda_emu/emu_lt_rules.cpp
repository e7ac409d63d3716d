/*
emu_lt_rules.cpp: which cuBLASLt matmul descriptors the real library refuses, and where. cuBLASLt
of CUDA 13.0 on an H100 (driver 580) answered 288 descriptors; the answers are the test data
tests/data/cublaslt_h100_cuda13.0_driver580.txt, and tests/test_cublaslt_table.cu runs the same
descriptors here and compares. The rules below give every one of those answers.

cublasLtMatmulAlgoGetHeuristic (and cublasLtMatmul again) looks at the epilogue and the transposes:
  1. a bias-gradient epilogue that reduces an operand over k has an algorithm only when that operand
     is stored with the bias elements as its rows: BGRADA needs op(A) = N (A stored m x k), BGRADB
     needs op(B) = T (B stored n x k). Otherwise CUBLAS_STATUS_NOT_SUPPORTED and no algorithm.
cublasLtMatmul alone looks at the pointers (the heuristic accepts any), the bias pointer first:
  2. a bias pointer where the epilogue neither adds a bias nor writes its gradient: INVALID_VALUE
  3. no bias pointer where the epilogue adds a bias or writes its gradient: INVALID_VALUE
  4. no aux pointer where the epilogue reads aux (DGELU): INVALID_VALUE
  5. no aux pointer where the epilogue writes aux (GELU_AUX, GELU_AUX_BIAS): NOT_SUPPORTED
  6. an aux pointer on an activation epilogue that does not write aux (GELU, GELU_BIAS): NOT_SUPPORTED;
     the epilogues without an activation (DEFAULT, BIAS, BGRADA, BGRADB) ignore it
  7. (the emulator's own check) aux used with CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD below D's rows:
     INVALID_VALUE
cublasLtMatmul also looks at the alignment of the pointers (cublasLt.h: a heuristic's algorithm
"will fail if buffers are not correctly aligned"; the status is the emulator's choice):
  8. an operand A, B, C or D whose address is not a multiple of the alignment the algorithm was
     chosen for (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default 256; no algorithm given: 256):
     INVALID_VALUE
  9. a workspace (workspaceSizeInBytes > 0) whose address is not a multiple of 256: INVALID_VALUE
Measured on the GPU: the epilogues DEFAULT, BIAS, GELU, GELU_BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU,
BGRADA and BGRADB with both pointers set or neither, fp32 and bf16, the four transposes, odd and
multiple-of-8 leading dimensions (type and leading dimension changed no answer). Extrapolated from
the rules, not measured: one pointer set without the other, RELU and RELU_BIAS (ruled like GELU and
GELU_BIAS), DGELU_BGRAD.

The real library says nothing about why it refuses; the emulator prints one line to stderr per
distinct reason (once per process, so a test that refuses on purpose stays readable).
*/
#include "emu_internal.h"

#include <stdarg.h>
#include <set>
#include <string>

enum lt_bias_use { BIAS_UNUSED, BIAS_ADDED, BIAS_GRADIENT };
enum lt_aux_use { AUX_UNUSED, AUX_READ, AUX_WRITTEN };
enum lt_activation { NO_ACTIVATION, GELU_ACTIVATION, RELU_ACTIVATION };   // forward activations only
enum lt_reduced_operand { REDUCES_NO_OPERAND, REDUCES_A, REDUCES_B };

// what an epilogue does besides D = alpha op(A) op(B) + beta C (cublasLt.h)
struct lt_epilogue_use {
    uint32_t epilogue;
    const char* name;
    lt_bias_use bias;             // CUBLASLT_MATMUL_DESC_BIAS_POINTER: read, written, or not used
    lt_aux_use aux;               // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: read, written, or not used
    lt_activation activation;     // applied to the result
    lt_reduced_operand reduces;   // the operand whose k-sums are the bias gradient
};

static const lt_epilogue_use EPILOGUES[] = {
    {CUBLASLT_EPILOGUE_DEFAULT, "DEFAULT", BIAS_UNUSED, AUX_UNUSED, NO_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_BIAS, "BIAS", BIAS_ADDED, AUX_UNUSED, NO_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_RELU, "RELU", BIAS_UNUSED, AUX_UNUSED, RELU_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_RELU_BIAS, "RELU_BIAS", BIAS_ADDED, AUX_UNUSED, RELU_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_GELU, "GELU", BIAS_UNUSED, AUX_UNUSED, GELU_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_GELU_BIAS, "GELU_BIAS", BIAS_ADDED, AUX_UNUSED, GELU_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_GELU_AUX, "GELU_AUX", BIAS_UNUSED, AUX_WRITTEN, GELU_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "GELU_AUX_BIAS", BIAS_ADDED, AUX_WRITTEN, GELU_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_DGELU, "DGELU", BIAS_UNUSED, AUX_READ, NO_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_DGELU_BGRAD, "DGELU_BGRAD", BIAS_GRADIENT, AUX_READ, NO_ACTIVATION, REDUCES_NO_OPERAND},
    {CUBLASLT_EPILOGUE_BGRADA, "BGRADA", BIAS_GRADIENT, AUX_UNUSED, NO_ACTIVATION, REDUCES_A},
    {CUBLASLT_EPILOGUE_BGRADB, "BGRADB", BIAS_GRADIENT, AUX_UNUSED, NO_ACTIVATION, REDUCES_B},
};

static const lt_epilogue_use* find_epilogue(uint32_t epilogue) {
    for (const lt_epilogue_use& e : EPILOGUES) {
        if (e.epilogue == epilogue) { return &e; }
    }
    return nullptr;
}

// return `status` after printing "cuda_emu: note: CALLER: STATUS: why" the first time this text comes up
__attribute__((format(printf, 3, 4)))
static cublasStatus_t refuse(cublasStatus_t status, const char* caller, const char* fmt, ...) {
    static std::set<std::string> said;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    std::string line = std::string(caller) + ": " + cublasGetStatusName(status) + ": " + why;
    if (said.insert(line).second) {
        fflush(stdout);
        fprintf(stderr, "cuda_emu: note: %s (said once per reason)\n", line.c_str());
    }
    return status;
}

static cublasStatus_t refuse_unknown(const char* caller, uint32_t epilogue) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, caller, "epilogue %u is not emulated (dev/cuda_emu/README.md lists "
                  "what is)", epilogue);
}

cublasStatus_t emu_lt_check_algorithm(const char* caller, uint32_t epilogue, int32_t transa, int32_t transb) {
    const lt_epilogue_use* e = find_epilogue(epilogue);
    if (e == nullptr) { return refuse_unknown(caller, epilogue); }
    // rule 1
    if (e->reduces == REDUCES_A && transa != CUBLAS_OP_N) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, caller,
                      "no algorithm for epilogue BGRADA with op(A)=T: it needs A stored as m x k (op(A)=N)");
    }
    if (e->reduces == REDUCES_B && transb == CUBLAS_OP_N) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, caller,
                      "no algorithm for epilogue BGRADB with op(B)=N: it needs B stored as n x k (op(B)=T)");
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t emu_lt_check_pointers(const char* caller, uint32_t epilogue, const void* bias, const void* aux,
                                     int64_t aux_ld, uint64_t rows) {
    const lt_epilogue_use* e = find_epilogue(epilogue);
    if (e == nullptr) { return refuse_unknown(caller, epilogue); }
    // rules 2 and 3: the bias pointer
    if (bias != nullptr && e->bias == BIAS_UNUSED) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, caller,
                      "epilogue %s uses no bias, but CUBLASLT_MATMUL_DESC_BIAS_POINTER is set: set it only for "
                      "the *_BIAS and *BGRAD* epilogues", e->name);
    }
    if (bias == nullptr && e->bias != BIAS_UNUSED) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, caller, "epilogue %s %s a bias, but CUBLASLT_MATMUL_DESC_BIAS_POINTER "
                      "is not set", e->name, e->bias == BIAS_ADDED ? "adds" : "writes the gradient of");
    }
    // rules 4 to 6: the aux pointer
    if (aux == nullptr && e->aux == AUX_READ) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, caller, "epilogue %s reads the GELU input from aux, but "
                      "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER is not set", e->name);
    }
    if (aux == nullptr && e->aux == AUX_WRITTEN) {
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, caller, "epilogue %s writes the GELU input to aux, but "
                      "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER is not set", e->name);
    }
    if (aux != nullptr && e->aux == AUX_UNUSED && e->activation != NO_ACTIVATION) {
        const char* instead = e->activation != GELU_ACTIVATION ? ""
                              : e->bias == BIAS_ADDED          ? ", or use GELU_AUX_BIAS to keep the GELU input"
                                                               : ", or use GELU_AUX to keep the GELU input";
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, caller, "epilogue %s writes no aux, but "
                      "CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER is set: unset it%s", e->name, instead);
    }
    // rule 7
    if (e->aux != AUX_UNUSED && (aux_ld < 0 || (uint64_t)aux_ld < rows)) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, caller, "epilogue %s: CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD is %lld, "
                      "less than D's %llu rows", e->name, (long long)aux_ld, (unsigned long long)rows);
    }
    return CUBLAS_STATUS_SUCCESS;
}

// the largest power of two up to 256 that divides p's address: how p is aligned, for the notes
static unsigned alignment_of(const void* p) {
    unsigned a = 256;
    while (a > 1 && (uintptr_t)p % a != 0) { a /= 2; }
    return a;
}

static const unsigned LT_WORKSPACE_ALIGNMENT = 256;

cublasStatus_t emu_lt_check_alignment(const char* caller, const void* const operands[EMU_LT_OPERANDS],
                                      const uint32_t min_alignment[EMU_LT_OPERANDS], const void* workspace,
                                      size_t workspace_bytes) {
    static const char* const NAMES = "ABCD";
    // rule 8
    for (int i = 0; i < EMU_LT_OPERANDS; i++) {
        uint32_t need = min_alignment[i];
        if (operands[i] == nullptr || need == 0 || (uintptr_t)operands[i] % need == 0) { continue; }
        return refuse(CUBLAS_STATUS_INVALID_VALUE, caller,
                      "matrix %c is %u-byte aligned, below the %u bytes its algorithm was chosen for "
                      "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES, default 256): carve it at a multiple of %u "
                      "bytes, or ask the heuristic with the pointer's own alignment", NAMES[i],
                      alignment_of(operands[i]), need, NAMES[i], need);
    }
    // rule 9
    if (workspace != nullptr && workspace_bytes > 0 && (uintptr_t)workspace % LT_WORKSPACE_ALIGNMENT != 0) {
        return refuse(CUBLAS_STATUS_INVALID_VALUE, caller, "the workspace is %u-byte aligned: cuBLASLt needs %u "
                      "(carve it at a multiple of %u bytes)", alignment_of(workspace), LT_WORKSPACE_ALIGNMENT,
                      LT_WORKSPACE_ALIGNMENT);
    }
    return CUBLAS_STATUS_SUCCESS;
}
