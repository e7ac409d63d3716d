/*
test_cublaslt_table.cu: which cuBLASLt matmul descriptors are accepted, against what a real GPU
answered. For every epilogue the emulator implements x fp32/bf16 x bias and aux pointers set or not
x odd or multiple-of-8 leading dimensions x the four transposes (288 descriptors), it asks
cublasLtMatmulAlgoGetHeuristic for an algorithm and, when one is found, runs cublasLtMatmul, then
compares the statuses with the recorded table (the format is described at the top of the table).

    test_cublaslt_table                 compare with tests/data/cublaslt_h100_cuda13.0_driver580.txt
    test_cublaslt_table --table FILE    compare with another recorded table
    test_cublaslt_table --print         print this device's answers in the table's format (to record
                                        a table on a new GPU, CUDA or driver version)

Run it from the repository root (run_tests.sh and gpu_check.sh do). One check per epilogue and
pointer setting (16 descriptors each), and one that the table and the descriptors match one to one.
*/
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <map>
#include <string>
#include <vector>
#include "check.h"

static const char* DEFAULT_TABLE = "dev/cuda_emu/tests/data/cublaslt_h100_cuda13.0_driver580.txt";
static const int NOT_CALLED = -1;          // the table's matmul status when no algorithm was found
static const int LD_PADDING = 3;           // "odd" leading dimensions: rows + 3
static const size_t BUFFER_ELEMENTS = 4096; // more than any matrix, bias or aux below needs

// the descriptor's settings, one line of the table without its answers
struct lt_variant {
    cublasLtEpilogue_t epilogue;
    const char* epilogue_name;
    cudaDataType type;
    bool pointers;            // bias, aux and aux_ld set
    bool aligned;             // multiple-of-8 leading dimensions (else rows + LD_PADDING)
    cublasOperation_t ta, tb;
};

// what the library answered
struct lt_answer {
    int heuristic;   // cublasStatus_t
    int found;       // algorithms returned
    int matmul;      // cublasStatus_t, or NOT_CALLED
    int cuda;        // cudaError_t after synchronizing
};

static std::string variant_key(const lt_variant& v) {
    char key[96];
    snprintf(key, sizeof key, "%s %s ptrs=%d ld=%s op=%c%c", v.epilogue_name, v.type == CUDA_R_32F ? "fp32" : "bf16",
             v.pointers ? 1 : 0, v.aligned ? "x8" : "odd", v.ta == CUBLAS_OP_N ? 'N' : 'T',
             v.tb == CUBLAS_OP_N ? 'N' : 'T');
    return key;
}

static std::string answer_text(const lt_answer& a) {
    char text[64];
    snprintf(text, sizeof text, "heur=%d found=%d matmul=%d cuda=%d", a.heuristic, a.found, a.matmul, a.cuda);
    return text;
}

// ----------------------------------------------------------------------------
// asking the library

struct device_buffers {
    void *a, *b, *d, *bias, *aux;
};

static lt_answer ask(cublasLtHandle_t lt, const device_buffers& buf, const lt_variant& v) {
    int m = v.aligned ? 16 : 6, n = v.aligned ? 8 : 5, k = v.aligned ? 8 : 7;
    int pad = v.aligned ? 0 : LD_PADDING;
    int a_rows = v.ta == CUBLAS_OP_N ? m : k, b_rows = v.tb == CUBLAS_OP_N ? k : n;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatrixLayoutCreate(&la, v.type, a_rows, v.ta == CUBLAS_OP_N ? k : m, a_rows + pad);
    cublasLtMatrixLayoutCreate(&lb, v.type, b_rows, v.tb == CUBLAS_OP_N ? n : k, b_rows + pad);
    cublasLtMatrixLayoutCreate(&ld, v.type, m, n, m + pad);

    cublasLtMatmulDesc_t desc;
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    int32_t ta = v.ta, tb = v.tb;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &v.epilogue, sizeof v.epilogue);
    if (v.pointers) {
        int64_t aux_ld = m + pad;
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &buf.bias, sizeof buf.bias);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &buf.aux, sizeof buf.aux);
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    }
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t workspace_bytes = 0;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                         sizeof workspace_bytes);

    lt_answer answer = {0, 0, NOT_CALLED, 0};
    cublasLtMatmulHeuristicResult_t heuristic;
    answer.heuristic = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &heuristic, &answer.found);
    if (answer.found > 0) {
        float alpha = 1.0f, beta = 0.0f;
        answer.matmul = cublasLtMatmul(lt, desc, &alpha, buf.a, la, buf.b, lb, &beta, buf.d, ld, buf.d, ld,
                                       &heuristic.algo, nullptr, 0, 0);
    }
    answer.cuda = cudaDeviceSynchronize();

    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(desc);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    return answer;
}

static std::vector<lt_variant> all_variants() {
    const struct { cublasLtEpilogue_t epilogue; const char* name; } epilogues[] = {
        {CUBLASLT_EPILOGUE_DEFAULT, "DEFAULT"},   {CUBLASLT_EPILOGUE_BIAS, "BIAS"},
        {CUBLASLT_EPILOGUE_GELU, "GELU"},         {CUBLASLT_EPILOGUE_GELU_BIAS, "GELU_BIAS"},
        {CUBLASLT_EPILOGUE_GELU_AUX, "GELU_AUX"}, {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, "GELU_AUX_BIAS"},
        {CUBLASLT_EPILOGUE_DGELU, "DGELU"},       {CUBLASLT_EPILOGUE_BGRADA, "BGRADA"},
        {CUBLASLT_EPILOGUE_BGRADB, "BGRADB"},
    };
    const cublasOperation_t ops[] = {CUBLAS_OP_N, CUBLAS_OP_T};
    std::vector<lt_variant> variants;
    for (const auto& e : epilogues) {
        for (bool pointers : {false, true}) {
            for (bool aligned : {false, true}) {
                for (cublasOperation_t ta : ops) {
                    for (cublasOperation_t tb : ops) {
                        for (cudaDataType type : {CUDA_R_32F, CUDA_R_16BF}) {
                            variants.push_back(lt_variant{e.epilogue, e.name, type, pointers, aligned, ta, tb});
                        }
                    }
                }
            }
        }
    }
    return variants;
}

// ----------------------------------------------------------------------------
// the recorded table: "EPILOGUE TYPE ptrs=P ld=L op=XY heur=H found=F matmul=M cuda=C", '#' comments

static bool read_table(const char* path, std::map<std::string, lt_answer>* table) {
    FILE* f = fopen(path, "r");
    if (f == nullptr) {
        fprintf(stderr, "error: cannot open the recorded table %s\n  hint: run from the repository root, or "
                "pass --table FILE\n", path);
        return false;
    }
    char line[256];
    int line_number = 0;
    bool ok = true;
    while (fgets(line, sizeof line, f) != nullptr) {
        line_number++;
        if (line[0] == '#' || strspn(line, " \t\r\n") == strlen(line)) { continue; }
        char epilogue[32], type[8], ld[8], op[4];
        int pointers;
        lt_answer a;
        int fields = sscanf(line, "%31s %7s ptrs=%d ld=%7s op=%3s heur=%d found=%d matmul=%d cuda=%d", epilogue, type,
                            &pointers, ld, op, &a.heuristic, &a.found, &a.matmul, &a.cuda);
        if (fields != 9) {
            fprintf(stderr, "error: %s:%d does not read as a table line: %s", path, line_number, line);
            ok = false;
            continue;
        }
        char key[96];
        snprintf(key, sizeof key, "%s %s ptrs=%d ld=%s op=%s", epilogue, type, pointers, ld, op);
        if (!table->emplace(key, a).second) {
            fprintf(stderr, "error: %s:%d repeats the descriptor '%s'\n", path, line_number, key);
            ok = false;
        }
    }
    fclose(f);
    return ok;
}

// ----------------------------------------------------------------------------

int main(int argc, char** argv) {
    const char* table_path = DEFAULT_TABLE;
    bool print = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--print") == 0) {
            print = true;
        } else if (strcmp(argv[i], "--table") == 0 && i + 1 < argc) {
            table_path = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--table FILE | --print]\n", argv[0]);
            return EXIT_FAILURE;
        }
    }

    cublasLtHandle_t lt;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "error: cublasLtCreate failed (is there a CUDA device?)\n");
        return EXIT_FAILURE;
    }
    device_buffers buf;
    for (void** p : {&buf.a, &buf.b, &buf.d, &buf.bias, &buf.aux}) {
        CUDA_CHECK(cudaMalloc(p, BUFFER_ELEMENTS * sizeof(float)));
        CUDA_CHECK(cudaMemset(*p, 0, BUFFER_ELEMENTS * sizeof(float)));
    }
    std::vector<lt_variant> variants = all_variants();

    if (print) {
        for (const lt_variant& v : variants) {
            printf("%s %s\n", variant_key(v).c_str(), answer_text(ask(lt, buf, v)).c_str());
        }
        return EXIT_SUCCESS;
    }

    std::map<std::string, lt_answer> table;
    if (!read_table(table_path, &table)) { return EXIT_FAILURE; }
    printf("(answers recorded in %s)\n", table_path);

    // one check per epilogue and pointer setting: all its descriptors answer as recorded
    size_t matched = 0;
    for (size_t first = 0; first < variants.size();) {
        const lt_variant& group = variants[first];
        int count = 0, mismatches = 0;
        std::string detail;
        size_t i = first;
        for (; i < variants.size() && variants[i].epilogue == group.epilogue && variants[i].pointers == group.pointers;
             i++) {
            std::string key = variant_key(variants[i]);
            lt_answer got = ask(lt, buf, variants[i]);
            count++;
            auto recorded = table.find(key);
            if (recorded == table.end()) {
                mismatches++;
                if (detail.empty()) { detail = key + ": not in the table"; }
                continue;
            }
            matched++;
            const lt_answer& want = recorded->second;
            bool same = got.heuristic == want.heuristic && (got.found > 0) == (want.found > 0) &&
                        got.matmul == want.matmul && got.cuda == want.cuda;
            if (!same) {
                mismatches++;
                if (detail.empty()) { detail = key + ": got " + answer_text(got) + ", recorded " + answer_text(want); }
            }
        }
        char name[96];
        snprintf(name, sizeof name, "epilogue %s, pointers %s: %d descriptors answer as recorded",
                 group.epilogue_name, group.pointers ? "set" : "not set", count);
        check(mismatches == 0, name, "%d differ; first: %s", mismatches, detail.c_str());
        first = i;
    }
    check(matched == variants.size() && table.size() == variants.size(),
          "the table and the descriptors asked match one to one", "%zu descriptors, %zu table lines, %zu matched",
          variants.size(), table.size(), matched);

    for (void* p : {buf.a, buf.b, buf.d, buf.bias, buf.aux}) { CUDA_CHECK(cudaFree(p)); }
    cublasLtDestroy(lt);
    return check_summary();
}
