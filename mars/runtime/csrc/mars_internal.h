/* What kernels.c and layers.c share and Python never sees: the vector macros, the inline helpers both use,
   the stage timers. Every function here is static inline, so each file that includes it compiles on its own. */
#ifndef MARS_INTERNAL_H
#define MARS_INTERNAL_H

#include "mars_kernels.h"
#include <stdint.h>
#include <math.h>
#include <float.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif
#include <stdlib.h>

/* Stage timers, compiled in only with -DMARS_STAGES (benchmarks/kernel_ab.py --stages): seconds spent in each
   step of the layer loop, summed over layers and calls, read and reset by mars_stages (kernels.c). */
#if defined(MARS_STAGES)
#include <time.h>
extern double mars_stage_s[MARS_STAGE_COUNT];
static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define STAGE_START double t_stage = now_s();
#define STAGE(i) { const double t_now = now_s(); mars_stage_s[i] += t_now - t_stage; t_stage = t_now; }
#define STAGE0(i) if (omp_get_thread_num() == 0) STAGE(i)  /* inside a parallel region: thread 0's time */
#else
#define STAGE_START
#define STAGE(i)
#define STAGE0(i)
#endif

/* Weights stream from memory once per pass, and one core only keeps a few misses in flight: while it
   computes (the rescale, more rows, the adapter's delta) its stream stalls. Asking for the bytes PF_AHEAD
   ahead keeps them coming (measured on the default model, int8, 2 threads: a pass of 4 inputs 1.32x a
   1-input pass -> 1.16x, the 1-input pass itself ~3% faster; 4 and 16 KB did no better than 8). Prefetches
   change no result. */
#define PF_AHEAD 8192
#define PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 3)
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Vectors of VL floats (AVX-512: 16, AVX2: 8; none: the plain C loops). Every loop that uses them does, lane by
   lane, the operations of its plain C loop in the same order, so 16 lanes, 8 lanes or none give the same bits. */
#if defined(__AVX512F__)
#define VL 16
typedef __m512 vf;
#define VLOADH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VLOADI8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))  /* 16 int8 */
#define VSET1 _mm512_set1_ps
#define VFMA _mm512_fmadd_ps
#define VZERO _mm512_setzero_ps
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VADD _mm512_add_ps
#define VMAX _mm512_max_ps
#define VEQ(a, b) ((int)_mm512_cmp_ps_mask((a), (b), _CMP_EQ_OQ))
#define VMUL _mm512_mul_ps
#define VSUB _mm512_sub_ps
#define VDIV _mm512_div_ps
#define VMIN _mm512_min_ps
#define VABS _mm512_abs_ps
#define VROUND(x) _mm512_roundscale_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* 16 floats holding whole numbers in [0, 255] -> 16 bytes at p */
#define VSTORE_U8(p, x) _mm_storeu_si128((__m128i *)(p), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(x)))
/* 2^n for 16 floats holding whole numbers n in [-126, 127] */
#define VPOW2I(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#elif defined(__F16C__) && defined(__AVX2__) && defined(__FMA__)
#define VL 8
typedef __m256 vf;
#define VLOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VLOADI8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))  /* 8 int8 */
#define VSET1 _mm256_set1_ps
#define VFMA _mm256_fmadd_ps
#define VZERO _mm256_setzero_ps
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VADD _mm256_add_ps
#define VMAX _mm256_max_ps
#define VEQ(a, b) _mm256_movemask_ps(_mm256_cmp_ps((a), (b), _CMP_EQ_OQ))
#define VMUL _mm256_mul_ps
#define VSUB _mm256_sub_ps
#define VDIV _mm256_div_ps
#define VMIN _mm256_min_ps
#define VABS(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), (x))
#define VROUND(x) _mm256_round_ps((x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
static inline void vstore_u8(uint8_t *p, __m256 x) {  /* 8 whole numbers in [0, 255] -> 8 bytes */
    const __m256i b = _mm256_shuffle_epi8(_mm256_cvttps_epi32(x), _mm256_set1_epi32(0x0c080400));
    const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
    _mm_storel_epi64((__m128i *)p, _mm_unpacklo_epi32(lo, hi));
}
#define VSTORE_U8(p, x) vstore_u8((p), (x))
#define VPOW2I(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#endif

/* rows (one per token) of a product; the delta's t = A h per row */
#define MAXROWS MARS_MAX_ROWS
#define MAXR MARS_MAX_LORA_COLUMNS

/* exp(x) for the SiLU: Cephes' expf (a degree-6 polynomial on x - n ln2, then 2^n; within 2 ulp) written
   without branches or calls, so that the compiler vectorizes the loop that uses it, and with the same
   operations in every lane: every build gives the same bits (libm's expf is one call per value). x is
   clamped to [-87, 88] (exp(-87) ~ 1.6e-38 against a SiLU's ~0 there; exp(88) is below FLT_MAX). */
static inline float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p * r, r, r) + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}

#if defined(VL)
/* exp_poly in VL lanes: the same operations in the same order, so the same bits (the SiLU's and the C
   attention's softmax) */
static inline vf vexp_poly(vf x) {
    x = VMIN(VMAX(x, VSET1(-87.0f)), VSET1(88.0f));
    const vf n = VROUND(VMUL(x, VSET1(1.44269504088896341f)));
    vf r = VFMA(n, VSET1(-0.693359375f), x);
    r = VFMA(n, VSET1(2.12194440e-4f), r);
    vf p = VSET1(1.9875691500e-4f);
    p = VFMA(p, r, VSET1(1.3981999507e-3f));
    p = VFMA(p, r, VSET1(8.3334519073e-3f));
    p = VFMA(p, r, VSET1(4.1665795894e-2f));
    p = VFMA(p, r, VSET1(1.6666665459e-1f));
    p = VFMA(p, r, VSET1(5.0000001201e-1f));
    p = VADD(VFMA(VMUL(p, r), r, r), VSET1(1.0f));
    return VMUL(p, VPOW2I(n));
}
#endif

#endif
