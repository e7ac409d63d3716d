/*
test_ptx.cu: the instructions of cuda/ptx.cuh against the PTX ISA's element-to-lane tables, which
this file writes out again from the documentation (the isa_* functions below, each with its
section), independently of the emulator's emu_ptx.cpp. Ordinary CUDA: nvcc builds it too (make
emu-nvcc-check) and make gpu-check runs it on a GPU, where the same tables must hold.

  - mma.sync m16n8k16 bf16: each lane builds its A, B and C registers from memory by the tables,
    the warp multiplies, each lane stores its D elements where the table says: D must be the
    reference product (small integers: exact in any order), every element written once;
  - ldmatrix x1, x2, x4, each with and without .trans, from padded shared rows: every register of
    every lane holds the elements the table names;
  - cp.async (.cg and .ca, 16 bytes, with a zero-filled tail): two groups, wait_group 1 then 0;
    emulated only: the second group's destination reads NaN between the two waits;
  - wrong-table (an argument; run_tests.sh expects it to fail): the same checks with A's rows g and
    g+8 swapped and .trans's expectation exchanged for the plain one, so a lane mapping off by one
    of these shows as FAIL (what a wrong mapping in the emulator would do).

With another argument, a misuse that must stop the emulated program with a message (run_tests.sh
expect_error; undefined on a GPU, never run there):
  ldmatrix-global      ldmatrix from global memory
  ldmatrix-misaligned  a row address 8 bytes past a 16-byte boundary
  mma-split            the two halves of the warp at mma.sync on two different lines
  mma-partial-warp     mma.sync in a block of 16 threads
  cp-async-to-global   a cp.async whose destination is global memory
  cp-async-from-shared a cp.async whose source is shared memory
  missing-wait         the data read after commit_group without wait_group: must FAIL (NaN)
*/
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <vector>
#include "check.h"
#include "cuda/ptx.cuh"

static const int WARP = 32;
static const int M = 16, N = 8, K = 16;  // mma.m16n8k16
static const int MAT = 8;                // ldmatrix's 8x8 matrices
static const int ROW_LD = 24;            // elements between shared rows: 16 padding bytes, 16-byte aligned
static const int COPY_FLOATS = 4;        // a 16-byte cp.async
static const int TAIL_BYTES = 12;        // the last thread's first copy reads 12 bytes, 4 are zero-filled

// ----------------------------------------------------------------------------
// the PTX ISA's tables, as the documentation states them (groupID = laneid >> 2,
// threadID_in_group = laneid % 4). `wrong` plants a wrong mapping (wrong-table).

// "Matrix Fragments for mma.m16n8k16 with floating point type", multiplicand A (.bf16), ai:
//   row = groupID for 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise
//   col = threadID_in_group * 2 + (i & 0x1) for i < 4, + 8 for i >= 4
__host__ __device__ static int isa_a_row(int lane, int i, bool wrong) {
    int g = lane >> 2;
    bool top = i < 2 || (4 <= i && i < 6);
    return top != wrong ? g : g + 8;
}
__host__ __device__ static int isa_a_col(int lane, int i) {
    int t = lane % 4;
    return i < 4 ? t * 2 + (i & 0x1) : t * 2 + (i & 0x1) + 8;
}
// multiplicand B (.bf16), bi: row = threadID_in_group * 2 + (i & 0x1) for i < 2, + 8 for i >= 2;
//   col = groupID
__host__ __device__ static int isa_b_row(int lane, int i) {
    int t = lane % 4;
    return i < 2 ? t * 2 + (i & 0x1) : t * 2 + (i & 0x1) + 8;
}
__host__ __device__ static int isa_b_col(int lane) { return lane >> 2; }
// accumulators C and D (.f32), ci: row = groupID for i < 2, groupID + 8 for i >= 2;
//   col = threadID_in_group * 2 + (i & 0x1)
__host__ __device__ static int isa_c_row(int lane, int i) { return i < 2 ? lane >> 2 : (lane >> 2) + 8; }
__host__ __device__ static int isa_c_col(int lane, int i) { return (lane % 4) * 2 + (i & 0x1); }

// "Warp-level matrix load instruction: ldmatrix": addresses addr0..addr7 (lanes 0..7) are the rows
// of the first matrix, addr8..addr15 of the second, ...; "a group of four threads loads an entire
// row", thread 0 receiving the first fragment: lane l holds row l/4, elements 2(l%4) and 2(l%4)+1
// (low half first) of each matrix, one register per matrix. .trans: "the matrix is loaded in
// column-major format": lane l holds column l/4, rows 2(l%4) and 2(l%4)+1.
static void isa_ldmatrix_element(int lane, int half, bool trans, int* row, int* col) {
    int r = lane / 4, c = 2 * (lane % 4) + half;
    *row = trans ? c : r;
    *col = trans ? r : c;
}

// ----------------------------------------------------------------------------
// kernels

static __device__ uint16_t bf16_bits(__nv_bfloat16 x) {
    uint16_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

// d (16x8, row major, prefilled NaN) = a (16x16 row major) b (16x8 row major) + c, one warp
__global__ void mma_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, bool wrong) {
    int lane = threadIdx.x % WARP;
    uint32_t ra[4] = {0, 0, 0, 0}, rb[2] = {0, 0};
    float rc[4], rd[4];
    for (int i = 0; i < 8; i++) {
        ra[i / 2] |= (uint32_t)bf16_bits(a[isa_a_row(lane, i, wrong) * K + isa_a_col(lane, i)]) << (16 * (i % 2));
    }
    for (int i = 0; i < 4; i++) { rb[i / 2] |= (uint32_t)bf16_bits(b[isa_b_row(lane, i) * N + isa_b_col(lane)]) << (16 * (i % 2)); }
    for (int i = 0; i < 4; i++) { rc[i] = c[isa_c_row(lane, i) * N + isa_c_col(lane, i)]; }
    ptx_mma_bf16_16816(rd, ra, rb, rc);
    ptx_mma_bf16_16816(rc, ra, rb, rc);  // d = c: the same product in place
    for (int i = 0; i < 4; i++) {
        d[isa_c_row(lane, i) * N + isa_c_col(lane, i)] = rd[i] == rc[i] ? rd[i] : NAN;  // in place must agree
    }
}

// out[lane * 4 + j] = register j of ldmatrix<NUM, TRANS> over four 8x8 matrices held in padded
// shared rows, element (m, r, c) = src[(m * 8 + r) * 8 + c]
template <int NUM, bool TRANS>
__global__ void ldmatrix_kernel(uint32_t* out, const __nv_bfloat16* src) {
    __shared__ __align__(16) __nv_bfloat16 rows[4 * MAT][ROW_LD];
    int lane = threadIdx.x % WARP;
    for (int i = lane; i < 4 * MAT * MAT; i += WARP) { rows[i / MAT][i % MAT] = src[i]; }
    __syncwarp();
    uint32_t r[4] = {0, 0, 0, 0};
    int row = lane < MAT * NUM ? lane : 0;  // lanes past 8 NUM: any valid address (unused)
    ptx_ldmatrix<NUM, TRANS>(r, &rows[row][0]);
    for (int j = 0; j < 4; j++) { out[lane * 4 + j] = r[j]; }
}

// out (2 x 32 x 4 floats) = in, through shared memory in two cp.async groups; in_flight[t]: emulated,
// whether thread t's second copy read NaN between wait_group 1 and 0 (1) or not (0). `ca`: .ca.
// skip_wait: no wait_group at all (missing-wait)
__global__ void cp_async_kernel(float* out, int* in_flight, const float* in, bool ca, bool skip_wait) {
    __shared__ __align__(16) float stage[2][WARP * COPY_FLOATS];
    int t = threadIdx.x;
    for (int g = 0; g < 2; g++) {
        int bytes = g == 0 && t == WARP - 1 ? TAIL_BYTES : 16;
        const float* src = in + (g * WARP + t) * COPY_FLOATS;
        if (ca) {
            ptx_cp_async_ca16(&stage[g][t * COPY_FLOATS], src, bytes);
        } else {
            ptx_cp_async_cg16(&stage[g][t * COPY_FLOATS], src, bytes);
        }
        ptx_cp_async_commit();
    }
    if (!skip_wait) {
        ptx_cp_async_wait<1>();
        in_flight[t] = isnan(stage[1][t * COPY_FLOATS]) ? 1 : 0;
        ptx_cp_async_wait<0>();
    }
    __syncthreads();
    for (int i = t; i < 2 * WARP * COPY_FLOATS; i += WARP) { out[i] = stage[i / (WARP * COPY_FLOATS)][i % (WARP * COPY_FLOATS)]; }
}

// ----------------------------------------------------------------------------
// checks

template <typename T>
static T* upload(const std::vector<T>& x) {
    T* d;
    CUDA_CHECK(cudaMalloc(&d, x.size() * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(d, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T>
static std::vector<T> download(const T* d, size_t n) {
    std::vector<T> x(n);
    CUDA_CHECK(cudaMemcpy(x.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return x;
}

static uint16_t host_bf16_bits(float x) {  // x: an integer of at most 8 significant bits, exact in bf16
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (uint16_t)(u >> 16);
}

// small integers: every product and sum is exact, so any order of addition gives the reference
static void check_mma(bool wrong) {
    std::vector<float> a(M * K), b(K * N), c(M * N);
    std::vector<__nv_bfloat16> ab(M * K), bb(K * N);
    for (int i = 0; i < M * K; i++) { a[i] = (float)((i * 7) % 13 - 6); ab[i] = __float2bfloat16(a[i]); }
    for (int i = 0; i < K * N; i++) { b[i] = (float)((i * 5) % 11 - 5); bb[i] = __float2bfloat16(b[i]); }
    for (int i = 0; i < M * N; i++) { c[i] = (float)(i % 17); }
    __nv_bfloat16 *a_d = upload(ab), *b_d = upload(bb);
    float *c_d = upload(c), *d_d = upload(std::vector<float>(M * N, NAN));
    mma_kernel<<<1, WARP>>>(d_d, a_d, b_d, c_d, wrong);
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> d = download(d_d, M * N);
    int bad = 0, first = -1;
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            float want = c[m * N + n];
            for (int k = 0; k < K; k++) { want += a[m * K + k] * b[k * N + n]; }
            if (!(d[m * N + n] == want)) { bad++; if (first < 0) { first = m * N + n; } }
        }
    }
    check(bad == 0, wrong ? "mma.sync m16n8k16 with A's rows g and g+8 swapped (must fail)" : "mma.sync m16n8k16 bf16: every lane's A, B, C, D by the ISA's tables",
          "%d of %d elements of D differ (first: row %d col %d)", bad, M * N, first / N, first % N);
    for (void* p : {(void*)a_d, (void*)b_d, (void*)c_d, (void*)d_d}) { CUDA_CHECK(cudaFree(p)); }
}

template <int NUM, bool TRANS>
static void check_ldmatrix(bool wrong) {
    std::vector<__nv_bfloat16> src(4 * MAT * MAT);
    for (int i = 0; i < 4 * MAT * MAT; i++) { src[i] = __float2bfloat16((float)i); }  // 0..255: exact in bf16
    __nv_bfloat16* src_d = upload(src);
    uint32_t* out_d = upload(std::vector<uint32_t>(WARP * 4, 0));
    ldmatrix_kernel<NUM, TRANS><<<1, WARP>>>(out_d, src_d);
    CUDA_CHECK(cudaGetLastError());
    std::vector<uint32_t> out = download(out_d, WARP * 4);
    int bad = 0;
    for (int lane = 0; lane < WARP; lane++) {
        for (int j = 0; j < NUM; j++) {
            for (int half = 0; half < 2; half++) {
                int row, col;
                isa_ldmatrix_element(lane, half, TRANS != wrong, &row, &col);
                uint16_t want = host_bf16_bits((float)((j * MAT + row) * MAT + col));
                uint16_t got = (uint16_t)(out[lane * 4 + j] >> (16 * half));
                bad += got != want;
            }
        }
    }
    char name[96];
    snprintf(name, sizeof name, "ldmatrix .x%d%s%s", NUM, TRANS ? ".trans" : "",
             wrong ? " against the other transpose's table (must fail)" : ": every lane's registers by the ISA's table");
    check(bad == 0, name, "%d of %d elements differ", bad, WARP * NUM * 2);
    CUDA_CHECK(cudaFree(src_d));
    CUDA_CHECK(cudaFree(out_d));
}

static void check_cp_async(bool ca, bool skip_wait) {
    const int n = 2 * WARP * COPY_FLOATS;
    std::vector<float> in(n);
    for (int i = 0; i < n; i++) { in[i] = (float)i + 0.5f; }
    float *in_d = upload(in), *out_d = upload(std::vector<float>(n, 0.0f));
    int* flight_d = upload(std::vector<int>(WARP, -1));
    cp_async_kernel<<<1, WARP>>>(out_d, flight_d, in_d, ca, skip_wait);
    CUDA_CHECK(cudaGetLastError());
    std::vector<float> out = download(out_d, n);
    std::vector<int> flight = download(flight_d, WARP);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        bool zero_filled = i >= (WARP - 1) * COPY_FLOATS + TAIL_BYTES / 4 && i < WARP * COPY_FLOATS;
        bad += !(out[i] == (zero_filled ? 0.0f : in[i]));
    }
    const char* name = skip_wait ? "cp.async read without wait_group (must fail)"
                       : ca      ? "cp.async.ca: two groups, a zero-filled tail, wait_group 1 then 0"
                                 : "cp.async.cg: two groups, a zero-filled tail, wait_group 1 then 0";
    check(bad == 0, name, "%d of %d floats differ (read before their copy landed: NaN)", bad, n);
#ifdef CUDA_EMU
    if (!skip_wait) {
        int landed_early = 0;
        for (int t = 0; t < WARP; t++) { landed_early += flight[t] != 1; }
        check(landed_early == 0, "cp.async: the second group is still in flight (NaN) after wait_group 1",
              "%d threads saw data", landed_early);
    }
#endif
    for (void* p : {(void*)in_d, (void*)out_d, (void*)flight_d}) { CUDA_CHECK(cudaFree(p)); }
}

static void check_all(bool wrong) {
    check_mma(wrong);
    check_ldmatrix<1, false>(wrong);
    check_ldmatrix<2, false>(wrong);
    check_ldmatrix<4, false>(wrong);
    check_ldmatrix<1, true>(wrong);
    check_ldmatrix<2, true>(wrong);
    check_ldmatrix<4, true>(wrong);
}

// ----------------------------------------------------------------------------
// misuses (each must stop the emulated program)

__global__ void ldmatrix_from_kernel(const __nv_bfloat16* global_rows, int offset_elements) {
    __shared__ __align__(16) __nv_bfloat16 rows[MAT][ROW_LD];
    for (int i = threadIdx.x; i < MAT * ROW_LD; i += WARP) { rows[i / ROW_LD][i % ROW_LD] = __float2bfloat16(0.0f); }
    __syncwarp();
    uint32_t r[1];
    const __nv_bfloat16* p = global_rows != nullptr ? global_rows + threadIdx.x % MAT * MAT : &rows[threadIdx.x % MAT][0];
    ptx_ldmatrix<1, false>(r, p + offset_elements);
}

__global__ void mma_split_kernel(float* out) {
    uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float c[4] = {0, 0, 0, 0};
    if (threadIdx.x < WARP / 2) {
        ptx_mma_bf16_16816(c, a, b, c);
    } else {
        ptx_mma_bf16_16816(c, a, b, c);
    }
    out[threadIdx.x] = c[0];
}

__global__ void cp_async_misuse_kernel(float* global_dst, const float* src, bool from_shared) {
    __shared__ __align__(16) float stage[2][WARP * COPY_FLOATS];
    int t = threadIdx.x;
    const float* from = from_shared ? &stage[1][t * COPY_FLOATS] : src + t * COPY_FLOATS;
    void* to = global_dst != nullptr ? (void*)(global_dst + t * COPY_FLOATS) : (void*)&stage[0][t * COPY_FLOATS];
    ptx_cp_async_cg16(to, from, 16);
    ptx_cp_async_commit();
    ptx_cp_async_wait<0>();
}

static int run_misuse(const char* name) {
    if (strcmp(name, "wrong-table") == 0) {
        check_all(true);
        return check_summary();
    }
    if (strcmp(name, "missing-wait") == 0) {
        check_cp_async(false, true);
        return check_summary();
    }
    float* buf;
    CUDA_CHECK(cudaMalloc(&buf, 2 * WARP * COPY_FLOATS * sizeof(float)));
    CUDA_CHECK(cudaMemset(buf, 0, 2 * WARP * COPY_FLOATS * sizeof(float)));
    const int misaligned_elements = 4;  // 8 bytes
    if (strcmp(name, "ldmatrix-global") == 0) {
        ldmatrix_from_kernel<<<1, WARP>>>((const __nv_bfloat16*)buf, 0);
    } else if (strcmp(name, "ldmatrix-misaligned") == 0) {
        ldmatrix_from_kernel<<<1, WARP>>>(nullptr, misaligned_elements);
    } else if (strcmp(name, "mma-split") == 0) {
        mma_split_kernel<<<1, WARP>>>(buf);
    } else if (strcmp(name, "mma-partial-warp") == 0) {
        mma_split_kernel<<<1, WARP / 2>>>(buf);
    } else if (strcmp(name, "cp-async-to-global") == 0) {
        cp_async_misuse_kernel<<<1, WARP>>>(buf + WARP * COPY_FLOATS, buf, false);
    } else if (strcmp(name, "cp-async-from-shared") == 0) {
        cp_async_misuse_kernel<<<1, WARP>>>(nullptr, buf, true);
    } else {
        fprintf(stderr, "usage: test_ptx [wrong-table | missing-wait | ldmatrix-global | ldmatrix-misaligned | mma-split | "
                        "mma-partial-warp | cp-async-to-global | cp-async-from-shared]\n");
        return EXIT_FAILURE;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("the kernel finished: the emulator should have stopped it\n");
    return EXIT_SUCCESS;
}

int main(int argc, char** argv) {
    if (argc > 1) { return run_misuse(argv[1]); }
    check_all(false);
    check_cp_async(false, false);
    check_cp_async(true, false);
    return check_summary();
}
