/*
mma.h, the emulator's: nvcuda::wmma (the warp-level matrix products of CUDA's <mma.h>) for the
emulated device. emu.mk puts dev/cuda_emu/include before the toolkit's include directory on the
emulated build's command line only, so `#include <mma.h>` finds this file there and the toolkit's
under nvcc (whose header declares the functions for device code only, which g++ cannot compile).

    #include <mma.h>
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(a, A, lda);                 // all 32 lanes of the warp, same arguments
    wmma::load_matrix_sync(b, B, ldb);
    wmma::mma_sync(acc, a, b, acc);                    // acc += A * B
    for (int i = 0; i < acc.num_elements; i++) { acc.x[i] *= scale; }   // uniform elementwise only
    wmma::store_matrix_sync(D, acc, ldd, wmma::mem_row_major);

What it declares, exactly as CUDA's header does for these (anything else is a compile error here):
  - fragment<matrix_a | matrix_b, 16, 16, 16, __nv_bfloat16 | __half, row_major | col_major> and
    fragment<accumulator, 16, 16, 16, float>, with num_elements, num_storage_elements, element_type,
    storage_element_type and x[]; num_elements is CUDA's: 8 for bf16 a and b and for the float
    accumulator, 16 for half a and b (CUDA sizes those for sm_70, so each element is held twice);
  - layout_t (mem_row_major, mem_col_major) and the tags row_major, col_major, matrix_a, matrix_b,
    accumulator; fill_fragment, load_matrix_sync, store_matrix_sync (float accumulator) and
    mma_sync(d, a, b, c) with float c and d.
Not here: half accumulators, the 32x8x16 and 8x32x16 shapes, tf32, double, integer and sub-byte
fragments.

Semantics (emu_wmma.cpp implements them; README.md "wmma" says what is checked):
  - which lane holds which element is a fixed scramble unlike any hardware's, so code that assumes
    a mapping (rather than operating on every x[i] alike) gets wrong answers here;
  - load_matrix_sync, store_matrix_sync and mma_sync are warp collectives: all 32 lanes of the
    warp must reach the same call with the same arguments (pointer, ldm, layout);
  - mma_sync: d[m][n] = c[m][n] + a[m][0]*b[0][n] + ... + a[m][15]*b[15][n], added in that order in
    fp32, each sum rounded to fp32; the products of bf16 or half values are exact in fp32;
  - ldm is in elements, a multiple of 8 for bf16 and half and of 4 for float (16 bytes); pointers
    are 32-byte (256-bit) aligned. A violation stops the program with an error (CUDA leaves it
    undefined).

The call site of each collective (for error messages) comes from __builtin_FILE()/__builtin_LINE()
as default arguments: g++ evaluates them where the function is called, so the public signatures
stay CUDA's (the shuffles use macros for the same purpose; a macro could not live in a namespace).
*/
#ifndef CUDA_EMU_MMA_H
#define CUDA_EMU_MMA_H

#ifndef CUDA_EMU
#error "dev/cuda_emu/include/mma.h is the emulated device's; an nvcc build must use the toolkit's (remove -Idev/cuda_emu/include)"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

// ----------------------------------------------------------------------------
// what the runtime (emu_wmma.cpp) knows of one lane's fragment

enum emu_wmma_use { EMU_WMMA_MATRIX_A, EMU_WMMA_MATRIX_B, EMU_WMMA_ACCUMULATOR };
enum emu_wmma_element { EMU_WMMA_BF16, EMU_WMMA_HALF, EMU_WMMA_FLOAT };
struct emu_wmma_fragment_ref {
    emu_wmma_use use;
    emu_wmma_element element;
    bool col_major;   // matrix_a and matrix_b: the fragment's layout (an accumulator has none)
    void* x;          // this lane's elements
};
// elements per lane: CUDA's numbers (a 16x16 tile is 256 elements over 32 lanes; half a and b hold
// each one twice)
enum { EMU_WMMA_PER_LANE = 8, EMU_WMMA_PER_LANE_HALF_AB = 16 };

// warp collectives: every lane of the warp calls one; the last to arrive does the work for all
// mem_layout: a wmma::layout_t (0 row major, 1 column major), checked there
void emu_wmma_load(emu_wmma_fragment_ref f, const void* p, unsigned ldm, int mem_layout, const char* file, int line);
void emu_wmma_store(void* p, emu_wmma_fragment_ref f, unsigned ldm, int mem_layout, const char* file, int line);
void emu_wmma_mma(emu_wmma_fragment_ref d, emu_wmma_fragment_ref a, emu_wmma_fragment_ref b,
                  emu_wmma_fragment_ref c, const char* file, int line);

namespace nvcuda {
namespace wmma {

// ----------------------------------------------------------------------------
// tags and fragments (CUDA's declarations; the tags are never defined there either)

struct row_major;
struct col_major;
struct matrix_a;
struct matrix_b;
struct accumulator;

enum layout_t { mem_row_major, mem_col_major };

// CUDA's __frag_base: a plain array of the lane's elements, 8-byte aligned as there
template <typename T, int size>
struct alignas(8) emu_frag_base {
    enum { num_elements = size };
    enum { num_storage_elements = size };  // no packed (sub-byte) types here
    typedef T element_type;
    typedef T storage_element_type;
    storage_element_type x[num_storage_elements];
};

template <typename Use, int m, int n, int k, typename T, typename Layout = void> class fragment;

template <> class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, row_major> : public emu_frag_base<__nv_bfloat16, EMU_WMMA_PER_LANE> {};
template <> class fragment<matrix_a, 16, 16, 16, __nv_bfloat16, col_major> : public emu_frag_base<__nv_bfloat16, EMU_WMMA_PER_LANE> {};
template <> class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, row_major> : public emu_frag_base<__nv_bfloat16, EMU_WMMA_PER_LANE> {};
template <> class fragment<matrix_b, 16, 16, 16, __nv_bfloat16, col_major> : public emu_frag_base<__nv_bfloat16, EMU_WMMA_PER_LANE> {};
template <> class fragment<matrix_a, 16, 16, 16, __half, row_major> : public emu_frag_base<__half, EMU_WMMA_PER_LANE_HALF_AB> {};
template <> class fragment<matrix_a, 16, 16, 16, __half, col_major> : public emu_frag_base<__half, EMU_WMMA_PER_LANE_HALF_AB> {};
template <> class fragment<matrix_b, 16, 16, 16, __half, row_major> : public emu_frag_base<__half, EMU_WMMA_PER_LANE_HALF_AB> {};
template <> class fragment<matrix_b, 16, 16, 16, __half, col_major> : public emu_frag_base<__half, EMU_WMMA_PER_LANE_HALF_AB> {};
template <> class fragment<accumulator, 16, 16, 16, float> : public emu_frag_base<float, EMU_WMMA_PER_LANE> {};

// ----------------------------------------------------------------------------
// a fragment as the runtime sees it

template <typename Use> struct emu_use_of;
template <> struct emu_use_of<matrix_a> { static const emu_wmma_use value = EMU_WMMA_MATRIX_A; };
template <> struct emu_use_of<matrix_b> { static const emu_wmma_use value = EMU_WMMA_MATRIX_B; };
template <> struct emu_use_of<accumulator> { static const emu_wmma_use value = EMU_WMMA_ACCUMULATOR; };
template <typename T> struct emu_element_of;
template <> struct emu_element_of<__nv_bfloat16> { static const emu_wmma_element value = EMU_WMMA_BF16; };
template <> struct emu_element_of<__half> { static const emu_wmma_element value = EMU_WMMA_HALF; };
template <> struct emu_element_of<float> { static const emu_wmma_element value = EMU_WMMA_FLOAT; };
template <typename Layout> struct emu_is_col_major { static const bool value = false; };
template <> struct emu_is_col_major<col_major> { static const bool value = true; };

template <typename Use, typename T, typename Layout>
inline emu_wmma_fragment_ref emu_ref(const fragment<Use, 16, 16, 16, T, Layout>& f) {
    return emu_wmma_fragment_ref{emu_use_of<Use>::value, emu_element_of<T>::value, emu_is_col_major<Layout>::value,
                                 const_cast<T*>(f.x)};
}

// ----------------------------------------------------------------------------
// the API

// every element of this lane's fragment = v (a per-lane operation, no collective, as in CUDA)
template <typename T, int size>
inline void fill_fragment(emu_frag_base<T, size>& f, const typename emu_same<T>::type& v) {
    for (int i = 0; i < size; i++) { f.x[i] = v; }
}

// matrix_a or matrix_b from a 16x16 tile in the fragment's own layout, ldm elements apart
template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const typename emu_same<T>::type* p,
                             unsigned ldm, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    static_assert(!std::is_same<Use, accumulator>::value,
                  "wmma::load_matrix_sync of an accumulator takes its memory layout: wmma::mem_row_major or mem_col_major");
    emu_wmma_load(emu_ref(f), p, ldm, emu_is_col_major<Layout>::value ? mem_col_major : mem_row_major, file, line);
}

// the accumulator from a 16x16 tile in either layout
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu_wmma_load(emu_ref(f), p, ldm, layout, file, line);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    emu_wmma_store(p, emu_ref(f), ldm, layout, file, line);
}

// d = a * b + c (d may be c)
template <typename T, typename LayoutA, typename LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
    emu_wmma_mma(emu_ref(d), emu_ref(a), emu_ref(b), emu_ref(c), file, line);
}

}  // namespace wmma
}  // namespace nvcuda

#endif  // CUDA_EMU_MMA_H
