/* The int8 fast path's attention and its whole decoder-layer loop (declared in mars_kernels.h; the Python
   side is mars/runtime/cpu_layers.py), built on the kernels of kernels.c. */
#include "mars_internal.h"

/* Attention, one query row of one head at a time, in an order that does not depend on what else is in its
   pass (the lossless modes' AR check compares a row with itself in a 1-token pass):
   - score j = (q . k_j) * scale, the dot product in 16 lanes (lane l sums q[d] k_j[d] for d = l, l + 16, ...
     by fma, d ascending) added in a fixed tree (l + l+8, then + l+4, + l+2, + l+1): lane_tree. With AVX-512,
     16 keys' lanes at once and the same tree as a transpose (reduce16); with AVX2, 8 keys' (scores8).
   - p_j = exp_poly(score_j - max over the allowed keys), 0 for a key not allowed; the sum of the allowed
     keys' p in 16 lanes, the r-th allowed key in lane r mod 16, lanes added in order; out = (sum_j p_j v_j,
     j ascending by fma, keys not allowed skipped) * (1/sum).
   So a row's result depends only on its query and its allowed keys in order, not on where they sit among
   masked columns: a left-padded batch row equals the row alone, and a tree node whose ancestors sit apart
   equals the same tokens fed as a chain. Every build (AVX-512, AVX2, plain C) gives the same bits. */
static inline float lane_tree(const float *v) {
    float a[8], b[4];
    for (int l = 0; l < 8; l++) a[l] = v[l] + v[l + 8];
    for (int l = 0; l < 4; l++) b[l] = a[l] + a[l + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline float dot_row(const float *a, const float *b, int64_t hd) {
#if defined(__AVX512F__)
    if (hd % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < hd; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
        const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
        const __m128 b4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
        const __m128 c2 = _mm_add_ps(b4, _mm_movehl_ps(b4, b4));  /* b0 + b2, b1 + b3 */
        return _mm_cvtss_f32(_mm_add_ss(c2, _mm_shuffle_ps(c2, c2, 1)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (hd % 16 == 0) {
        __m256 lo = _mm256_setzero_ps(), hi = lo;
        for (int64_t d = 0; d < hd; d += 16) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), hi);
        }
        const __m256 a8 = _mm256_add_ps(lo, hi);
        const __m128 b4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
        const __m128 c2 = _mm_add_ps(b4, _mm_movehl_ps(b4, b4));
        return _mm_cvtss_f32(_mm_add_ss(c2, _mm_shuffle_ps(c2, c2, 1)));
    }
#endif
    float lane[16] = {0};
    for (int64_t d = 0; d < hd; d++) lane[d & 15] = fmaf(a[d], b[d], lane[d & 15]);
    return lane_tree(lane);
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ATT512 1
#endif

#if defined(ATT512)
/* lane_tree of 16 vectors at once: v[j] holds key j's 16 lanes; returns the 16 sums, key j in lane j. Each
   level adds the lanes at distance 8, 4, 2, 1 of two keys' halves side by side, as lane_tree does for one. */
static inline __m512 reduce16(const __m512 *v) {
    __m512 w[8], u[4], t[2];
    for (int p = 0; p < 8; p++)  /* distance 8: [a 0..7 + a 8..15 | b 0..7 + b 8..15] */
        w[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
    for (int p = 0; p < 4; p++)  /* distance 4: quarter k = key 4p + k, its 4 partial sums */
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * p], w[2 * p + 1], 0xDD));
    for (int p = 0; p < 2; p++)  /* distance 2: per quarter [key 8p + k: 2 sums | key 8p + 4 + k: 2 sums] */
        t[p] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0xEE));
    /* distance 1: lane 4k + e holds key 4e + k */
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x88), _mm512_shuffle_ps(t[0], t[1], 0xDD));
    const __m512i idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    return _mm512_permutexvar_ps(idx, r);
}
#endif
#if defined(ATT512)
/* 16 keys' scores from key row k0 on (nk <= 16 of them real, the rest 0), nc = hd / 16 vectors of q. Called
   with constant nc and nk == 16 where it can be, so that the compiler keeps acc in registers. */
ALWAYS_INLINE __m512 scores16(const __m512 *qv, const float *k0, int64_t hd, int64_t nc, int64_t nk) {
    __m512 acc[16];
    for (int64_t j = 0; j < 16; j++) {
        acc[j] = _mm512_setzero_ps();
        if (j < nk)
            for (int64_t c = 0; c < nc; c++) acc[j] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k0 + j * hd + 16 * c), acc[j]);
    }
    return reduce16(acc);
}

ALWAYS_INLINE __m512 scores_block(const __m512 *qv, const float *k0, int64_t hd, int64_t nc, int64_t nk) {
    if (nk == 16) {
        if (nc == 4) return scores16(qv, k0, 64, 4, 16);  /* hd 64: the default model's */
        return scores16(qv, k0, hd, nc, 16);
    }
    return scores16(qv, k0, hd, nc, nk);
}
#endif

#if !defined(ATT512) && defined(VL) && VL == 8
#define ATT256 1
#endif

/* A work item's keys come as runs: nr ranges [runs[2 r], runs[2 r + 1]) of ascending keys, each starting at a
   multiple of 16 and ending at one or at T; the item's queries see no key outside them (mars_attend builds them
   from the blocks of 16 keys its rows may see). A causal row's keys are one run; a row of the acceptance lab
   sees two (its answer's ~200 clean keys and its group's masks among ~3000 keys), and the blocks between are
   never visited. The blocks of 8 and 16 keys stay where they were, so the runs change no bit. j0 walks every
   run in steps of `step`, je its run's end. */
#define FOR_RUNS(j0, je, step) \
    for (int64_t ri_ = 0; ri_ < nr; ri_++) \
        for (int64_t j0 = runs[2 * ri_], je = runs[2 * ri_ + 1]; j0 < je; j0 += (step))
#define ATT_Q 2  /* queries per values call: 2 x 4 vectors = 8 independent fma chains */
#if defined(ATT256)
#define ATT_G 16  /* queries per work item in a wide pass (attend_probs8, attend_values): keys read once for 16 */
#else
#define ATT_G ATT_Q
#endif

#if defined(ATT256)
/* lane_tree of 8 keys at once, in two halves of 4 keys (quad) so that a half's 8 fma chains and its part of the
   tree fit the 16 registers. Key K's 16 lanes are dot_row's chains lo (lanes 0-7) and hi (8-15); the tree adds
   lo + hi (distance 8), then the lanes at distance 4, 2 and 1, here for 2 to 4 keys side by side.
   quad: keys K0..K3 (rows k0 + K hd; a K >= nk is no key: 0) down to distance 2: [K0: 2 | K2: 2 | K1: 2 | K3: 2]
   (each pair b0 + b2, b1 + b3 of lane_tree's b). Called with constant hd and nk where it can be. */
ALWAYS_INLINE __m256 quad(const float *q, const float *k0, int64_t hd, int64_t nk, int64_t K0, int64_t K1,
                          int64_t K2, int64_t K3) {
    const int64_t ks[4] = {K0, K1, K2, K3};
    __m256 lo[4], hi[4], a[4];
    for (int j = 0; j < 4; j++) lo[j] = hi[j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < hd; d += 16) {
        const __m256 ql = _mm256_loadu_ps(q + d), qh = _mm256_loadu_ps(q + d + 8);
        for (int j = 0; j < 4; j++) {
            if (ks[j] >= nk) continue;
            lo[j] = _mm256_fmadd_ps(ql, _mm256_loadu_ps(k0 + ks[j] * hd + d), lo[j]);
            hi[j] = _mm256_fmadd_ps(qh, _mm256_loadu_ps(k0 + ks[j] * hd + d + 8), hi[j]);
        }
    }
    for (int j = 0; j < 4; j++) a[j] = _mm256_add_ps(lo[j], hi[j]);  /* distance 8 */
    /* distance 4: [K0: 4 | K1: 4], [K2: 4 | K3: 4] */
    const __m256 u0 = _mm256_add_ps(_mm256_permute2f128_ps(a[0], a[1], 0x20), _mm256_permute2f128_ps(a[0], a[1], 0x31));
    const __m256 u1 = _mm256_add_ps(_mm256_permute2f128_ps(a[2], a[3], 0x20), _mm256_permute2f128_ps(a[2], a[3], 0x31));
    return _mm256_add_ps(_mm256_shuffle_ps(u0, u1, 0x44), _mm256_shuffle_ps(u0, u1, 0xEE));  /* distance 2 */
}

/* 8 keys' scores from key row k0 on (nk <= 8 of them real, the rest 0), key j in lane j: the halves hold keys
   0 4 1 5 and 2 6 3 7, so that distance 1 (of [A0 A2 B0 B2 | A1 A3 B1 B3]) lands them in order */
ALWAYS_INLINE __m256 scores8(const float *q, const float *k0, int64_t hd, int64_t nk) {
    __m256 ta, tb;
    if (nk == 8 && hd == 64) {  /* the default model's */
        ta = quad(q, k0, 64, 8, 0, 4, 1, 5);
        tb = quad(q, k0, 64, 8, 2, 6, 3, 7);
    } else if (nk == 8) {
        ta = quad(q, k0, hd, 8, 0, 4, 1, 5);
        tb = quad(q, k0, hd, 8, 2, 6, 3, 7);
    } else {
        ta = quad(q, k0, hd, nk, 0, 4, 1, 5);
        tb = quad(q, k0, hd, nk, 2, 6, 3, 7);
    }
    return _mm256_add_ps(_mm256_shuffle_ps(ta, tb, 0x88), _mm256_shuffle_ps(ta, tb, 0xDD));  /* distance 1 */
}

/* the allow bytes of keys [j0, j0 + nk) (nk <= 8), side by side: 0 where none is allowed */
static inline uint64_t bytes8(const uint8_t *al, int64_t nk) {
    uint64_t bytes = 0;
    if (nk == 8) memcpy(&bytes, al, 8);
    else memcpy(&bytes, al, (size_t)nk);
    return bytes;
}

/* bytes8 as lanes: all bits set where the key is allowed */
static inline __m256 allowed8(uint64_t bytes) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bytes));
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(b, _mm256_setzero_si256()));
}
#endif

#if defined(ATT256)
/* The rest of one query's probabilities (the AVX2 branch of attend_probs, for attend_probs8): s holds its
   scores over the runs' keys (T rounded up to 8), mx their max over the allowed keys; s becomes the p, packed (T
   rounded up to 16) the allowed keys' p side by side. Returns 1 / their sum, 0 where no key is allowed. */
static float softmax8(float *s, const int64_t *runs, int64_t nr, const uint8_t *al, float mx, float *packed) {
    if (mx == -INFINITY) return 0.0f;
    const __m256 mv = _mm256_set1_ps(mx);
    int64_t cnt = 0;
    FOR_RUNS(j0, je, 8) {
        const int64_t nk = je - j0 < 8 ? je - j0 : 8;
        const uint64_t bytes = bytes8(al + j0, nk);
        if (!bytes) continue;  /* s not written: its keys' p are never read */
        const __m256 ok = allowed8(bytes);
        const __m256 p = _mm256_and_ps(ok, vexp_poly(_mm256_sub_ps(_mm256_loadu_ps(s + j0), mv)));
        _mm256_storeu_ps(s + j0, p);
        const int bits = _mm256_movemask_ps(ok);
        if (bits == 0xFF) {
            _mm256_storeu_ps(packed + cnt, p);
            cnt += 8;
        } else {
            for (int64_t j = 0; j < nk; j++)
                if (bits >> j & 1) packed[cnt++] = s[j0 + j];
        }
    }
    /* the sum's 16 lanes: the tail's missing lanes add +0, no bit changes */
    for (int64_t i = cnt; i < (cnt + 15) / 16 * 16; i++) packed[i] = 0.0f;
    __m256 sum_lo = _mm256_setzero_ps(), sum_hi = sum_lo;
    for (int64_t i0 = 0; i0 < cnt; i0 += 16) {
        sum_lo = _mm256_add_ps(sum_lo, _mm256_loadu_ps(packed + i0));
        sum_hi = _mm256_add_ps(sum_hi, _mm256_loadu_ps(packed + i0 + 8));
    }
    float lanes[16], total = 0.0f;
    _mm256_storeu_ps(lanes, sum_lo);
    _mm256_storeu_ps(lanes + 8, sum_hi);
    for (int l = 0; l < 16; l++) total += lanes[l];
    return 1.0f / total;
}

/* attend_probs for nq <= ATT_G queries over the same keys: each block of 8 keys is scored for every query in
   turn while it sits in L1 (a wide pass's keys are read from L2 once per group, not once per query); each
   query's own operations are those it has alone, on the blocks of 8 keys where it may see one. s[i]: query
   i's p (T rounded up to 16; blocks it may not see are not written: never read), inv[i]: 1 / their sum. */
static void attend_probs8(const float *const *q, int nq, const float *kc, const int64_t *runs, int64_t nr,
                          int64_t hd, const uint8_t *const *al, float scale, float *const *s, float *packed,
                          float *inv) {
    const __m256 sv = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 m[ATT_G];
    for (int i = 0; i < nq; i++) m[i] = ninf;
    FOR_RUNS(j0, je, 8) {
        const int64_t nk = je - j0 < 8 ? je - j0 : 8;
        for (int i = 0; i < nq; i++) {
            const uint64_t bytes = bytes8(al[i] + j0, nk);
            if (!bytes) continue;  /* none of these keys allowed: a causal window's later rows, the acceptance
                                      lab's packed rows (~200 of ~2000 keys) */
            const __m256 sc = _mm256_mul_ps(scores8(q[i], kc + j0 * hd, hd, nk), sv);
            _mm256_storeu_ps(s[i] + j0, sc);
            m[i] = _mm256_max_ps(m[i], _mm256_blendv_ps(ninf, sc, allowed8(bytes)));
        }
    }
    for (int i = 0; i < nq; i++) {
        const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m[i]), _mm256_extractf128_ps(m[i], 1));
        const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        inv[i] = softmax8(s[i], runs, nr, al[i], _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1))), packed);
    }
}
#endif

/* One query's probabilities over the runs' keys (row stride hd in kc), written to s (T rounded up to 16);
   returns 1 / their sum, or 0 where no key is allowed (the output is then zeros). packed: scratch (T rounded up
   to 16), the allowed keys' p side by side for the sum. */
static float attend_probs(const float *q, const float *kc, const int64_t *runs, int64_t nr, int64_t hd,
                          const uint8_t *al, float scale, float *s, float *packed) {
    float mx = -INFINITY, lanes[16] = {0};
#if defined(ATT512)
    if (hd % 16 == 0 && hd <= 256) {
        __m512 qv[16], m = _mm512_set1_ps(-INFINITY);
        const int64_t nc = hd / 16;
        for (int64_t c = 0; c < nc; c++) qv[c] = _mm512_loadu_ps(q + 16 * c);
        const __m512 sv = _mm512_set1_ps(scale);
        FOR_RUNS(j0, je, 16) {
            const int64_t nk = je - j0 < 16 ? je - j0 : 16;
            const __mmask16 live = (__mmask16)((1u << nk) - 1u);
            const __mmask16 ok = _mm_mask_cmpneq_epi8_mask(live, _mm_maskz_loadu_epi8(live, al + j0), _mm_setzero_si128());
            const __m512 sc = _mm512_mul_ps(scores_block(qv, kc + j0 * hd, hd, nc, nk), sv);
            _mm512_storeu_ps(s + j0, sc);
            m = _mm512_mask_max_ps(m, ok, m, sc);
        }
        mx = _mm512_reduce_max_ps(m);
        if (mx == -INFINITY) return 0.0f;
        const __m512 mv = _mm512_set1_ps(mx);
        int64_t cnt = 0;
        FOR_RUNS(j0, je, 16) {
            const int64_t nk = je - j0 < 16 ? je - j0 : 16;
            const __mmask16 live = (__mmask16)((1u << nk) - 1u);
            const __mmask16 ok = _mm_mask_cmpneq_epi8_mask(live, _mm_maskz_loadu_epi8(live, al + j0), _mm_setzero_si128());
            const __m512 p = _mm512_maskz_mov_ps(ok, vexp_poly(_mm512_sub_ps(_mm512_loadu_ps(s + j0), mv)));
            _mm512_storeu_ps(s + j0, p);
            _mm512_mask_compressstoreu_ps(packed + cnt, ok, p);
            cnt += __builtin_popcount((unsigned)ok);
        }
        __m512 sum = _mm512_setzero_ps();
        for (int64_t i0 = 0; i0 < cnt; i0 += 16) {  /* the tail's missing lanes add +0: no bit changes */
            const __mmask16 live = (__mmask16)(cnt - i0 >= 16 ? 0xFFFFu : (1u << (cnt - i0)) - 1u);
            sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(live, packed + i0));
        }
        _mm512_storeu_ps(lanes, sum);
    } else
#endif
    {
        FOR_RUNS(j, je, 1) {
            if (!al[j]) continue;
            s[j] = dot_row(q, kc + j * hd, hd) * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        if (mx == -INFINITY) return 0.0f;
        int64_t r = 0;
        FOR_RUNS(j, je, 1) {
            s[j] = al[j] ? exp_poly(s[j] - mx) : 0.0f;
            if (al[j]) lanes[r++ & 15] += s[j];
        }
        (void)packed;
    }
    float total = 0.0f;
    for (int l = 0; l < 16; l++) total += lanes[l];
    return 1.0f / total;
}

/* The weighted sums of nq <= ATT_G queries sharing one head's values: out[i] = (sum_j p[i][j] v_j) * inv[i],
   keys j ascending, each output its own chain of fmas (the queries only share the loads of v). With more than
   ATT_Q queries, in blocks of ATT_KB keys (a block's values stay in L1 for all the queries; the chains wait in
   out between blocks, stored and loaded exactly), VQ queries at a time: the keys they may all see without a
   test per key (values_dense), the keys only some may see by pairs, testing each (values_cols), the keys none
   may see skipped. */
#define ATT_KB 64
#if defined(VL)
/* columns [d0, d0 + nv VL) for nq <= ATT_Q queries, keys [j0, j1): from 0 where first, else from what out
   holds; scaled by inv where last. dense: every key of the block allowed for every query (no test per key).
   Called with constant nq, nv and dense so that acc stays in registers. */
ALWAYS_INLINE void values_cols(const float *const *p, const float *inv, int nq, const float *vc, int64_t j0,
                               int64_t j1, int64_t hd, const uint8_t *const *al, float *const *out, int64_t d0,
                               int64_t nv, int first, int last, int dense) {
    vf acc[ATT_Q][4];
    for (int i = 0; i < nq; i++)
        for (int64_t v = 0; v < nv; v++) acc[i][v] = first ? VZERO() : VLOAD(out[i] + d0 + v * VL);
    for (int64_t j = j0; j < j1; j++) {
        const float *vr = vc + j * hd + d0;
        for (int i = 0; i < nq; i++) {
            if (!dense && !al[i][j]) continue;
            const vf pj = VSET1(p[i][j]);
            for (int64_t v = 0; v < nv; v++) acc[i][v] = VFMA(pj, VLOAD(vr + v * VL), acc[i][v]);
        }
    }
    for (int i = 0; i < nq; i++) {
        const vf iv = VSET1(inv[i]);
        for (int64_t v = 0; v < nv; v++) VSTORE(out[i] + d0 + v * VL, last ? VMUL(acc[i][v], iv) : acc[i][v]);
    }
}
#endif

#if defined(VL)
#define VQ 6  /* values_dense: 6 queries x 2 vectors = 12 fma chains, each v loaded once for 6 (measured on an */
#define VV 2  /* AVX2 EPYC, 64 rows x 200 keys: a few % faster than 2 x 4, 3 x 4, 4 x 2 or 8 x 1) */
/* keys [j0, j1) that every one of nq queries may see, columns [d0, d0 + nv VL): values_cols without the tests,
   from what out holds and back to it */
ALWAYS_INLINE void values_dense(const float *const *p, int nq, const float *vc, int64_t j0, int64_t j1,
                                int64_t hd, float *const *out, int64_t d0, int64_t nv) {
    vf acc[VQ][VV];
    for (int i = 0; i < nq; i++)
        for (int64_t v = 0; v < nv; v++) acc[i][v] = VLOAD(out[i] + d0 + v * VL);
    for (int64_t j = j0; j < j1; j++) {
        const float *vr = vc + j * hd + d0;
        vf x[VV];
        for (int64_t v = 0; v < nv; v++) x[v] = VLOAD(vr + v * VL);
        for (int i = 0; i < nq; i++) {
            const vf pj = VSET1(p[i][j]);
            for (int64_t v = 0; v < nv; v++) acc[i][v] = VFMA(pj, x[v], acc[i][v]);
        }
    }
    for (int i = 0; i < nq; i++)
        for (int64_t v = 0; v < nv; v++) VSTORE(out[i] + d0 + v * VL, acc[i][v]);
}

/* values_cols over keys [j0, j1) by pairs of queries, all columns, from what out holds and back to it */
static void values_pairs(const float *const *p, const float *inv, int nq, const float *vc, int64_t j0, int64_t j1,
                         int64_t hd, const uint8_t *const *al, float *const *out, int dense) {
    for (int i = 0; i < nq; i += ATT_Q) {
        const int n2 = nq - i < ATT_Q ? nq - i : ATT_Q;
        for (int64_t d0 = 0; d0 < hd; d0 += 4 * VL) {
            const int64_t nv = (hd - d0) / VL < 4 ? (hd - d0) / VL : 4;
            if (nv == 4 && n2 == 2 && dense)
                values_cols(p + i, inv + i, 2, vc, j0, j1, hd, al + i, out + i, d0, 4, 0, 0, 1);
            else if (nv == 4 && n2 == 2)
                values_cols(p + i, inv + i, 2, vc, j0, j1, hd, al + i, out + i, d0, 4, 0, 0, 0);
            else if (nv == 4 && n2 == 1)
                values_cols(p + i, inv + i, 1, vc, j0, j1, hd, al + i, out + i, d0, 4, 0, 0, 0);
            else
                values_cols(p + i, inv + i, n2, vc, j0, j1, hd, al + i, out + i, d0, nv, 0, 0, 0);
        }
    }
}
#endif

/* the first allowed key in [f, e), or e: 8 bytes at a time */
static inline int64_t first_allowed(const uint8_t *a, int64_t f, int64_t e) {
    uint64_t w;
    while (f + 8 <= e && (memcpy(&w, a + f, 8), !w)) f += 8;
    while (f < e && !a[f]) f++;
    return f;
}

/* one past the last allowed key in [f, e), or f */
static inline int64_t last_allowed(const uint8_t *a, int64_t f, int64_t e) {
    uint64_t w;
    while (e - 8 >= f && (memcpy(&w, a + e - 8, 8), !w)) e -= 8;
    while (e > f && !a[e - 1]) e--;
    return e;
}

/* The outputs over the runs' keys. Each output is its own chain of fmas in key order, carried in out from one
   run or block to the next (stored and loaded exactly), so neither changes a bit. */
static void attend_values(const float *const *p, const float *inv, int nq, const float *vc, const int64_t *runs,
                          int64_t nr, int64_t hd, const uint8_t *const *al, float *const *out) {
#if defined(VL)
    if (hd % VL == 0 && nq <= ATT_Q) {  /* every key at once (always so in the AVX-512 build) */
        for (int64_t d0 = 0; d0 < hd; d0 += 4 * VL) {
            const int64_t nv = (hd - d0) / VL < 4 ? (hd - d0) / VL : 4;
            if (nr <= 1) {  /* one run (a causal row's keys; none: zeros): constant flags, acc in registers */
                const int64_t j0 = nr ? runs[0] : 0, j1 = nr ? runs[1] : 0;
                if (nv == 4 && nq == 2) values_cols(p, inv, 2, vc, j0, j1, hd, al, out, d0, 4, 1, 1, 0);
                else if (nv == 4 && nq == 1) values_cols(p, inv, 1, vc, j0, j1, hd, al, out, d0, 4, 1, 1, 0);
                else values_cols(p, inv, nq, vc, j0, j1, hd, al, out, d0, nv, 1, 1, 0);
            } else {
                for (int64_t r = 0; r < nr; r++)
                    values_cols(p, inv, nq, vc, runs[2 * r], runs[2 * r + 1], hd, al, out, d0, nv, r == 0,
                                r == nr - 1, 0);
            }
        }
        return;
    }
    if (hd % VL == 0) {  /* blocks of ATT_KB keys; VQ queries at a time */
        for (int i = 0; i < nq; i++) memset(out[i], 0, (size_t)hd * 4);
        FOR_RUNS(j0, rend, ATT_KB) {
            const int64_t j1 = rend - j0 < ATT_KB ? rend : j0 + ATT_KB;
            for (int i0 = 0; i0 < nq; i0 += VQ) {
                const int nc = nq - i0 < VQ ? nq - i0 : VQ;
                /* keys [js, jd): every query of these may see them; [jd, je): some may (a causal window's, a
                   sparse mask's); none outside [js, je) */
                int64_t js = j1, jd = j1, je = j0;
                for (int k = 0; k < nc; k++) {
                    const uint8_t *a = al[i0 + k];
                    const int64_t f = first_allowed(a, j0, j1), e = last_allowed(a, f, j1);
                    js = f < js ? f : js;
                    je = e > je ? e : je;
                }
                if (je <= js) continue;
                for (int k = 0; k < nc; k++) {
                    const uint8_t *a = al[i0 + k], *z = (const uint8_t *)memchr(a + js, 0, (size_t)(j1 - js));
                    jd = z && z - a < jd ? z - a : jd;
                }
                if (jd > js && hd % (VV * VL) == 0)
                    for (int64_t d0 = 0; d0 < hd; d0 += VV * VL)
                        switch (nc) {  /* constant counts: acc in registers */
                            case 6: values_dense(p + i0, 6, vc, js, jd, hd, out + i0, d0, VV); break;
                            case 5: values_dense(p + i0, 5, vc, js, jd, hd, out + i0, d0, VV); break;
                            case 4: values_dense(p + i0, 4, vc, js, jd, hd, out + i0, d0, VV); break;
                            case 3: values_dense(p + i0, 3, vc, js, jd, hd, out + i0, d0, VV); break;
                            case 2: values_dense(p + i0, 2, vc, js, jd, hd, out + i0, d0, VV); break;
                            default: values_dense(p + i0, 1, vc, js, jd, hd, out + i0, d0, VV);
                        }
                else if (jd > js)
                    values_pairs(p + i0, inv + i0, nc, vc, js, jd, hd, al + i0, out + i0, 1);
                else
                    jd = js;
                if (je > jd) values_pairs(p + i0, inv + i0, nc, vc, jd, je, hd, al + i0, out + i0, 0);
            }
        }
        for (int i = 0; i < nq; i++) {
            const vf iv = VSET1(inv[i]);
            for (int64_t d0 = 0; d0 < hd; d0 += VL) VSTORE(out[i] + d0, VMUL(VLOAD(out[i] + d0), iv));
        }
        return;
    }
#endif
    for (int i = 0; i < nq; i++) {
        float *o = out[i];
        for (int64_t d = 0; d < hd; d++) o[d] = 0.0f;
        FOR_RUNS(j, rend, 1) {
            if (!al[i][j]) continue;
            const float *vr = vc + j * hd;
            for (int64_t d = 0; d < hd; d++) o[d] = fmaf(p[i][j], vr[d], o[d]);
        }
        for (int64_t d = 0; d < hd; d++) o[d] = o[d] * inv[i];
    }
}

/* a thread's scratch for the probabilities, kept between calls (a pass calls this once per layer) */
static float *att_scratch(int64_t n) {
    static __thread float *buf = NULL;
    static __thread int64_t cap = 0;
    if (n > cap) {
        free(buf);
        cap = n;
        buf = (float *)aligned_alloc(64, (size_t)((cap * 4 + 63) / 64 * 64));
        if (!buf) cap = 0;
    }
    return buf;
}

/* Per named row (as mars_attend's at, n), a bit for each block of 16 of its T keys it may see one of (2 loads a
   block): (T + 15) / 16 bits a row, in words of 64, row after row. The same for every head of every layer of a
   pass, so built once a pass (mars_layers) or once a call (mars_attend). NULL where it cannot be allocated. */
static uint64_t *key_blocks(const uint8_t *allowed, int64_t T, const int64_t *at, int64_t n) {
    const int64_t nb = (T + 15) / 16, words = (nb + 63) / 64;
    uint64_t *seen = (uint64_t *)calloc((size_t)(n * words), 8);
    if (!seen) return NULL;
    #pragma omp parallel for schedule(static) if (n * nb > 4096)
    for (int64_t k = 0; k < n; k++) {
        const uint8_t *a = allowed + (at ? at[k] : k) * T;
        uint64_t *bits = seen + k * words;
        for (int64_t bl = 0; bl < nb; bl++) {
            const int64_t j0 = bl * 16;
            uint64_t w0 = 0, w1 = 0;
            if (j0 + 16 <= T) {
                memcpy(&w0, a + j0, 8);
                memcpy(&w1, a + j0 + 8, 8);
            } else {
                memcpy(&w0, a + j0, (size_t)(T - j0 < 8 ? T - j0 : 8));
                if (T - j0 > 8) memcpy(&w1, a + j0 + 8, (size_t)(T - j0 - 8));
            }
            if (w0 | w1) bits[bl >> 6] |= 1ull << (bl & 63);
        }
    }
    return seen;
}

static int attend(float *qkv, int64_t b, int64_t W, int64_t H, int64_t KV, int64_t hd, const float *cos,
                  const float *sin, float *kc, float *vc, int64_t cap, int64_t C, const uint8_t *allowed, float *out,
                  const int64_t *at, int64_t n, const uint64_t *seen);

/* The rotary, the cache write and attention for n of a pass's b x W rows.
   at (n, ascending) names them: row k is the pass's row at[k] = bi W + i (batch row bi, window column i); NULL:
   every row, n = b W. The rows not named are computed by nobody: no query may see their keys (the caller's
   padding). qkv (n x (H + 2 KV) hd): per row [q heads | k heads | v heads], rotated in place (q and k):
   x * cos + roll(x, hd/2) * sin, sin's first half negated (mars.runtime.fastpath.FastLM.rope_table); cos, sin
   (n x hd) for each row's position. The rotated k and the v of row (bi, i) go to cache column C + i of batch
   row bi: kc, vc (b x KV x cap x hd). allowed (b x W x (C + W)) 0/1, for every row of the pass. out (n x H hd):
   each query head's attention over its KV head's keys (query head h uses KV head h / (H / KV)), scaled by
   1/sqrt(hd). A row's result does not depend on which other rows are named. A work item visits only the blocks
   of 16 keys one of its rows may see (FOR_RUNS, key_blocks). */
int mars_attend(float *qkv, int64_t b, int64_t W, int64_t H, int64_t KV, int64_t hd, const float *cos,
                 const float *sin, float *kc, float *vc, int64_t cap, int64_t C, const uint8_t *allowed, float *out,
                 const int64_t *at, int64_t n) {
    if (!at) n = b * W;
    uint64_t *seen = key_blocks(allowed, C + W, at, n);
    if (!seen) return 2;
    const int rc = attend(qkv, b, W, H, KV, hd, cos, sin, kc, vc, cap, C, allowed, out, at, n, seen);
    free(seen);
    return rc;
}

/* mars_attend with the rows' key blocks given (key_blocks of the same allowed, at, n) */
static int attend(float *qkv, int64_t b, int64_t W, int64_t H, int64_t KV, int64_t hd, const float *cos,
                  const float *sin, float *kc, float *vc, int64_t cap, int64_t C, const uint8_t *allowed, float *out,
                  const int64_t *at, int64_t n, const uint64_t *seen) {
    const int64_t F = (H + 2 * KV) * hd, half = hd / 2, T = C + W;
    if (at && (b > MAXROWS || n > MAXROWS)) return 1;  /* first[] below; the caller checks: mars.runtime.cpu_layers */
    /* batch row bi's rows are [FIRST(bi), FIRST(bi + 1)) */
    int64_t first[MAXROWS + 1], most = W;
#define FIRST(bi) (at ? first[bi] : (bi) * W)
    if (at) {
        most = 0;
        for (int64_t bi = 0, k = 0; bi <= b; bi++) {
            while (k < n && at[k] < bi * W) k++;
            first[bi] = k;
            if (bi && first[bi] - first[bi - 1] > most) most = first[bi] - first[bi - 1];
        }
    }
    for (int64_t k = 0; k < n; k++) {
        float *row = qkv + k * F;
        const float *c = cos + k * hd, *sn = sin + k * hd;
        const int64_t r = at ? at[k] : k, bi = r / W, i = r % W;
        for (int64_t hh = 0; hh < H + KV; hh++) {
            float *x = row + hh * hd, tmp[MARS_MAX_HEAD_DIM];
            for (int64_t d = 0; d < half; d++) tmp[d] = x[d] * c[d] + x[d + half] * sn[d];  /* two loops, */
            for (int64_t d = half; d < hd; d++) tmp[d] = x[d] * c[d] + x[d - half] * sn[d];  /* vectorized */
            memcpy(x, tmp, (size_t)hd * 4);
        }
        for (int64_t g = 0; g < KV; g++) {
            const int64_t pos = ((bi * KV + g) * cap + C + i) * hd;
            memcpy(kc + pos, row + (H + g) * hd, (size_t)hd * 4);
            memcpy(vc + pos, row + (H + KV + g) * hd, (size_t)hd * 4);
        }
    }
    /* work items: per batch row and KV head, its rep x (its rows) queries (the query heads that share its keys,
       every row of its window) by G: the keys' and values' loads are shared (attend_probs8, attend_values); G
       as large as leaves 8 items per thread, so that the threads' shares are even, and 2 threads split even a
       1-token pass. A query's result does not depend on G. */
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t rep = H / KV, Tp = (T + 15) / 16 * 16;
    const int64_t nb = Tp / 16, words = (nb + 63) / 64;  /* seen's shape (key_blocks) */
#if defined(_OPENMP)
    const int64_t threads = omp_get_max_threads();
#else
    const int64_t threads = 1;
#endif
    int64_t G = ATT_G;
    while (G > ATT_Q && b * KV * ((rep * most + G - 1) / G) < 8 * threads) G /= 2;
    const int64_t per = (rep * most + G - 1) / G, items = b * KV * per;
    int failed = 0;
    #pragma omp parallel for schedule(static) if (items > 1)
    for (int64_t it = 0; it < items; it++) {
        const int64_t bi = it / (KV * per), g = (it / per) % KV, q0 = (it % per) * G;
        const int64_t nq = rep * (FIRST(bi + 1) - FIRST(bi));
        if (q0 >= nq) continue;
        const int nk = (int)(nq - q0 < G ? nq - q0 : G);
        /* each query's p, the packed sum's scratch, then the item's blocks (words) and runs (at most nb / 2 + 1) */
        float *buf = att_scratch((G + 1) * Tp + 2 * words + 2 * nb + 4);
        if (!buf) { failed = 1; continue; }
        uint64_t *um = (uint64_t *)(buf + (G + 1) * Tp);  /* 8-byte aligned: Tp is a multiple of 16 */
        int64_t *runs = (int64_t *)(um + words), nr = 0;
        const int64_t base = (bi * KV + g) * cap * hd;
        const float *pr[ATT_G], *qr[ATT_G];
        float *sr[ATT_G];
        const uint8_t *alr[ATT_G];
        float inv[ATT_G], *outr[ATT_G];
        memset(um, 0, (size_t)words * 8);
        for (int k = 0; k < nk; k++) {
            const int64_t qi = q0 + k, kk = FIRST(bi) + qi / rep, h = g * rep + qi % rep, r = at ? at[kk] : kk;
            pr[k] = sr[k] = buf + k * Tp;
            qr[k] = qkv + kk * F + h * hd;
            alr[k] = allowed + r * T;
            outr[k] = out + kk * H * hd + h * hd;
            if (!k || kk != FIRST(bi) + (qi - 1) / rep)  /* a row's heads come one after another */
                for (int64_t w = 0; w < words; w++) um[w] |= seen[kk * words + w];
        }
        for (int64_t bl = 0; bl < nb;) {  /* the blocks as runs of keys */
            while (bl < nb && !(um[bl >> 6] >> (bl & 63) & 1)) bl++;
            if (bl == nb) break;
            const int64_t b0 = bl;
            while (bl < nb && (um[bl >> 6] >> (bl & 63) & 1)) bl++;
            runs[2 * nr] = b0 * 16;
            runs[2 * nr + 1] = bl * 16 < T ? bl * 16 : T;
            nr++;
        }
#if defined(ATT256)
        if (hd % 16 == 0)
            attend_probs8(qr, nk, kc + base, runs, nr, hd, alr, scale, sr, buf + G * Tp, inv);
        else
#endif
        for (int k = 0; k < nk; k++)
            inv[k] = attend_probs(qr[k], kc + base, runs, nr, hd, alr[k], scale, sr[k], buf + G * Tp);
        attend_values(pr, inv, nk, vc + base, runs, nr, hd, alr, outr);
    }
#undef FIRST
    return failed;
}


static inline void lin_run(const lin_c *L, int amx, qrows *xq, const float *res, int64_t ldr, float *y,
                           const float *h, int64_t ldh, const int64_t *grows, int64_t ng) {
    const lora_w *lw = ng > 0 ? L->lw : NULL;
    (amx ? mars_gemv_amx : mars_gemv_rows)(xq, L->w, L->wsum, L->m, L->kp, L->sw, L->bias, res, ldr, y, L->m,
                                           lw ? h : NULL, ldh, lw ? grows : NULL, lw ? ng : 0, lw);
}

/* Every layer of n <= MARS_MAX_ROWS rows of a pass of b x W: the rows `at` names (as mars_attend; NULL: all,
   n = b W). x (n x D) the residual stream, updated in place. D: the hidden size, I: the MLP's. kbase, vbase: the
   cache (layers x b x KV x cap x hd). grows (ng): the gated rows, indices into x's n. The steps and kernels of
   mars.runtime.quant.Int8Linear's normed / add_to / add_silu_to, in order: every step but the attention works
   row by row, so the rows not named cost nothing. */
int mars_layers(const layer_c *L, int64_t nl, float *x, int64_t b, int64_t W, int64_t D, int64_t I, int64_t H,
                int64_t KV, int64_t hd, float *kbase, float *vbase, int64_t cap, int64_t C, const float *cos,
                const float *sin, const uint8_t *allowed, const int64_t *grows, int64_t ng, int amx,
                const int64_t *at, int64_t n) {
    if (!at) n = b * W;
    const int64_t F = (H + 2 * KV) * hd, A = H * hd, lstride = b * KV * cap * hd;
    const int64_t kmax = (D > I ? D : I) > A ? (D > I ? D : I) : A, kpmax = (kmax + MARS_PAD - 1) / MARS_PAD * MARS_PAD;
    if (n > MAXROWS || ng > MAXROWS) return 1;
    float *h = (float *)malloc((size_t)(n * kmax) * 4), *qkv = (float *)malloc((size_t)(n * F) * 4);
    float *att = (float *)malloc((size_t)(n * A) * 4), *gu = (float *)malloc((size_t)(n * 2 * I) * 4);
    uint8_t *q = (uint8_t *)calloc((size_t)(n * kpmax), 1);
    uint64_t *seen = key_blocks(allowed, C + W, at, n);  /* every layer's attention reads the same mask */
    float sx[MAXROWS], ov[MAXROWS * MARS_OUTLIERS];
    int32_t oi[MAXROWS * MARS_OUTLIERS];
    if (!h || !qkv || !att || !gu || !q || !seen) {
        free(h); free(qkv); free(att); free(gu); free(q); free(seen);
        return 2;
    }
    /* the rows of each product, laid out for its padded width (the q bytes past k stay 0: the weights' zero
       padding ignores them either way) */
    qrows xq = {q, n, 0, sx, ov, oi};
    for (int64_t l = 0; l < nl; l++) {
        const layer_c *ly = L + l;
        STAGE_START
        xq.ldo = ly->qkv.kp;
        mars_rmsnorm_quant(x, D, D, ly->ln1, ly->eps1, h, &xq);
        STAGE(0)
        lin_run(&ly->qkv, amx, &xq, NULL, 0, qkv, h, D, grows, ng);
        STAGE(1)
        if (attend(qkv, b, W, H, KV, hd, cos, sin, kbase + l * lstride, vbase + l * lstride, cap, C, allowed, att, at,
                   n, seen)) {
            free(h); free(qkv); free(att); free(gu); free(q); free(seen);
            return 2;
        }
        STAGE(2)
        xq.ldo = ly->o.kp;
        mars_quant_rows(att, A, A, &xq);
        STAGE(3)
        lin_run(&ly->o, amx, &xq, x, D, x, att, A, grows, ng);
        STAGE(4)
        xq.ldo = ly->gu.kp;
        mars_rmsnorm_quant(x, D, D, ly->ln2, ly->eps2, h, &xq);
        STAGE(5)
        lin_run(&ly->gu, amx, &xq, NULL, 0, gu, h, D, grows, ng);
        STAGE(6)
        xq.ldo = ly->down.kp;
        mars_silu_mul_quant(gu, I, 2 * I, h, &xq);
        STAGE(7)
        lin_run(&ly->down, amx, &xq, x, D, x, h, I, grows, ng);
        STAGE(8)
    }
    free(h); free(qkv); free(att); free(gu); free(q); free(seen);
    return 0;
}
