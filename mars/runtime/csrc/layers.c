/* The int8 fast path's attention and its whole decoder-layer loop (declared in mars_kernels.h; the Python
   side is mars/runtime/cpu_layers.py), built on the kernels of kernels.c. */
#include "mars_internal.h"

/* Attention, one query row of one head at a time, in an order that does not depend on what else is in its
   pass (the lossless modes' AR check compares a row with itself in a 1-token pass):
   - score j = (q . k_j) * scale, the dot product in 16 lanes (lane l sums q[d] k_j[d] for d = l, l + 16, ...
     by fma, d ascending) added in a fixed tree (l + l+8, then + l+4, + l+2, + l+1): lane_tree. With AVX-512,
     16 keys' lanes at once and the same tree as a transpose (reduce16); with AVX2, a key at a time.
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

/* One query's probabilities over keys [0, T) (row stride hd in kc), written to s (T rounded up to 16); returns
   1 / their sum, or 0 where no key is allowed (the output is then zeros). packed: scratch (T rounded up to 16),
   the allowed keys' p side by side for the sum. */
static float attend_probs(const float *q, const float *kc, int64_t T, int64_t hd, const uint8_t *al, float scale,
                          float *s, float *packed) {
    float mx = -INFINITY, lanes[16] = {0};
#if defined(ATT512)
    if (hd % 16 == 0 && hd <= 256) {
        __m512 qv[16], m = _mm512_set1_ps(-INFINITY);
        const int64_t nc = hd / 16;
        for (int64_t c = 0; c < nc; c++) qv[c] = _mm512_loadu_ps(q + 16 * c);
        const __m512 sv = _mm512_set1_ps(scale);
        for (int64_t j0 = 0; j0 < T; j0 += 16) {
            const int64_t nk = T - j0 < 16 ? T - j0 : 16;
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
        for (int64_t j0 = 0; j0 < T; j0 += 16) {
            const int64_t nk = T - j0 < 16 ? T - j0 : 16;
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
        for (int64_t j = 0; j < T; j++) {
            if (!al[j]) continue;
            s[j] = dot_row(q, kc + j * hd, hd) * scale;
            mx = s[j] > mx ? s[j] : mx;
        }
        if (mx == -INFINITY) return 0.0f;
        int64_t r = 0;
        for (int64_t j = 0; j < T; j++) {
            s[j] = al[j] ? exp_poly(s[j] - mx) : 0.0f;
            if (al[j]) lanes[r++ & 15] += s[j];
        }
        (void)packed;
    }
    float total = 0.0f;
    for (int l = 0; l < 16; l++) total += lanes[l];
    return 1.0f / total;
}

/* The weighted sums of nq queries sharing one head's values: out[i] = (sum_j p[i][j] v_j) * inv[i], keys j
   ascending, each output its own chain of fmas (the queries only share the loads of v). */
#define ATT_Q 2  /* queries per work item: 2 x 4 vectors = 8 independent fma chains */
#if defined(VL)
/* columns [d0, d0 + nv VL) for nq queries; called with constant nq and nv so that acc stays in registers */
ALWAYS_INLINE void values_cols(const float *const *p, const float *inv, int nq, const float *vc, int64_t T,
                               int64_t hd, const uint8_t *const *al, float *const *out, int64_t d0, int64_t nv) {
    vf acc[ATT_Q][4];
    for (int i = 0; i < nq; i++)
        for (int64_t v = 0; v < nv; v++) acc[i][v] = VZERO();
    for (int64_t j = 0; j < T; j++) {
        const float *vr = vc + j * hd + d0;
        for (int i = 0; i < nq; i++) {
            if (!al[i][j]) continue;
            const vf pj = VSET1(p[i][j]);
            for (int64_t v = 0; v < nv; v++) acc[i][v] = VFMA(pj, VLOAD(vr + v * VL), acc[i][v]);
        }
    }
    for (int i = 0; i < nq; i++) {
        const vf iv = VSET1(inv[i]);
        for (int64_t v = 0; v < nv; v++) VSTORE(out[i] + d0 + v * VL, VMUL(acc[i][v], iv));
    }
}
#endif

static void attend_values(const float *const *p, const float *inv, int nq, const float *vc, int64_t T, int64_t hd,
                          const uint8_t *const *al, float *const *out) {
#if defined(VL)
    if (hd % VL == 0) {
        for (int64_t d0 = 0; d0 < hd; d0 += 4 * VL) {
            const int64_t nv = (hd - d0) / VL < 4 ? (hd - d0) / VL : 4;
            if (nv == 4 && nq == 2) values_cols(p, inv, 2, vc, T, hd, al, out, d0, 4);
            else if (nv == 4 && nq == 1) values_cols(p, inv, 1, vc, T, hd, al, out, d0, 4);
            else values_cols(p, inv, nq, vc, T, hd, al, out, d0, nv);
        }
        return;
    }
#endif
    for (int i = 0; i < nq; i++) {
        float *o = out[i];
        for (int64_t d = 0; d < hd; d++) o[d] = 0.0f;
        for (int64_t j = 0; j < T; j++) {
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

/* The rotary, the cache write and attention for n of a pass's b x W rows.
   at (n, ascending) names them: row k is the pass's row at[k] = bi W + i (batch row bi, window column i); NULL:
   every row, n = b W. The rows not named are computed by nobody: no query may see their keys (the caller's
   padding). qkv (n x (H + 2 KV) hd): per row [q heads | k heads | v heads], rotated in place (q and k):
   x * cos + roll(x, hd/2) * sin, sin's first half negated (mars.runtime.fastpath.FastLM.rope_table); cos, sin
   (n x hd) for each row's position. The rotated k and the v of row (bi, i) go to cache column C + i of batch
   row bi: kc, vc (b x KV x cap x hd). allowed (b x W x (C + W)) 0/1, for every row of the pass. out (n x H hd):
   each query head's attention over its KV head's keys (query head h uses KV head h / (H / KV)), scaled by
   1/sqrt(hd). A row's result does not depend on which other rows are named. */
int mars_attend(float *qkv, int64_t b, int64_t W, int64_t H, int64_t KV, int64_t hd, const float *cos,
                 const float *sin, float *kc, float *vc, int64_t cap, int64_t C, const uint8_t *allowed, float *out,
                 const int64_t *at, int64_t n) {
    const int64_t F = (H + 2 * KV) * hd, half = hd / 2, T = C + W;
    if (!at) n = b * W;
    else if (b > MAXROWS || n > MAXROWS) return 1;  /* the caller checks: mars.runtime.cpu_layers */
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
            for (int64_t d = 0; d < hd; d++) {
                const float rot = x[d < half ? d + half : d - half];
                const float a = x[d] * c[d], bb = rot * sn[d];
                tmp[d] = a + bb;
            }
            memcpy(x, tmp, (size_t)hd * 4);
        }
        for (int64_t g = 0; g < KV; g++) {
            const int64_t pos = ((bi * KV + g) * cap + C + i) * hd;
            memcpy(kc + pos, row + (H + g) * hd, (size_t)hd * 4);
            memcpy(vc + pos, row + (H + KV + g) * hd, (size_t)hd * 4);
        }
    }
    /* work items: per batch row and KV head, its rep x (its rows) queries (the query heads that share its keys,
       every row of its window) by ATT_Q: the values' loads are shared, and 2 threads split even a 1-token pass */
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t rep = H / KV, per = (rep * most + ATT_Q - 1) / ATT_Q, items = b * KV * per;
    const int64_t Tp = (T + 15) / 16 * 16;
    int failed = 0;
    #pragma omp parallel for schedule(static) if (items > 1)
    for (int64_t it = 0; it < items; it++) {
        const int64_t bi = it / (KV * per), g = (it / per) % KV, q0 = (it % per) * ATT_Q;
        const int64_t nq = rep * (FIRST(bi + 1) - FIRST(bi));
        if (q0 >= nq) continue;
        const int nk = (int)(nq - q0 < ATT_Q ? nq - q0 : ATT_Q);
        float *buf = att_scratch((ATT_Q + 1) * Tp);  /* each query's p, then the packed sum's scratch */
        if (!buf) { failed = 1; continue; }
        const int64_t base = (bi * KV + g) * cap * hd;
        const float *pr[ATT_Q];
        const uint8_t *alr[ATT_Q];
        float inv[ATT_Q], *outr[ATT_Q];
        for (int k = 0; k < nk; k++) {
            const int64_t qi = q0 + k, kk = FIRST(bi) + qi / rep, h = g * rep + qi % rep, r = at ? at[kk] : kk;
            float *s = buf + k * Tp;
            alr[k] = allowed + r * T;
            inv[k] = attend_probs(qkv + kk * F + h * hd, kc + base, T, hd, alr[k], scale, s, buf + ATT_Q * Tp);
            pr[k] = s;
            outr[k] = out + kk * H * hd + h * hd;
        }
        attend_values(pr, inv, nk, vc + base, T, hd, alr, outr);
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
    float sx[MAXROWS], ov[MAXROWS * MARS_OUTLIERS];
    int32_t oi[MAXROWS * MARS_OUTLIERS];
    if (!h || !qkv || !att || !gu || !q) {
        free(h); free(qkv); free(att); free(gu); free(q);
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
        if (mars_attend(qkv, b, W, H, KV, hd, cos, sin, kbase + l * lstride, vbase + l * lstride, cap, C, allowed, att,
                        at, n)) {
            free(h); free(qkv); free(att); free(gu); free(q);
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
    free(h); free(qkv); free(att); free(gu); free(q);
    return 0;
}
