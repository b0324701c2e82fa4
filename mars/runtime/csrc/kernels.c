/* The int8 fast path's kernels (declared in mars_kernels.h; mars/runtime/kernels.py builds and calls them):
   rows to one uint8 row and its outliers, the blocked int8 product with its rescale, bias, residual and gated delta fused in,
   and the scoring of logits. */
#include "mars_internal.h"

/* The stage timers (mars_internal.h): read and reset. */
#if defined(MARS_STAGES)
double mars_stage_s[MARS_STAGE_COUNT];
int mars_stages(double *out) {
    for (int i = 0; i < MARS_STAGE_COUNT; i++) { out[i] = mars_stage_s[i]; mars_stage_s[i] = 0.0; }
    return MARS_STAGE_COUNT;
}
#else
int mars_stages(double *out) { (void)out; return 0; }
#endif


/* One row as one uint8 row and its outliers, bit for bit as mars.runtime.quant.quantize_rows: the NOUT values
   of largest |x| (the earlier column first among equal ones) go to ov / oi as they are; the rest, scaled by
   u = x * ((1 / amax) * 127) with amax the largest |x| left, are rounded to q = round(u) and stored as q + 128
   (the outliers' columns as 0 + 128); amax / 127 is returned. round = nearbyintf in the default mode: half to
   even, as torch.round. A row of k <= NOUT values is all outliers (a zero row: q all 0). */
#define NOUT MARS_OUTLIERS
static inline float quant_row(const float *row, int64_t k, uint8_t *q, float *ov, int32_t *oi) {
    /* the NOUT + 1 largest |x|, descending, in one pass: the last one is amax of the rest. A block of values
       none above the list's last is skipped with one vector compare (most blocks, once the list fills). */
    float bv[NOUT + 1];
    int64_t bi[NOUT + 1];
    for (int c = 0; c <= NOUT; c++) { bv[c] = -1.0f; bi[c] = -1; }
    int64_t j = 0;
    while (j < k) {
#if defined(VL)
        if (j + VL <= k) {
            const vf thr = VSET1(bv[NOUT]);
            if (VEQ(VMAX(VABS(VLOAD(row + j)), thr), thr) == (int)((1u << VL) - 1u)) {
                j += VL;
                continue;
            }
        }
        const int64_t end = j + VL <= k ? j + VL : k;
#else
        const int64_t end = j + 1;
#endif
        for (; j < end; j++) {
            const float a = fabsf(row[j]);
            if (!(a > bv[NOUT])) continue;
            int c = NOUT;
            while (c > 0 && a > bv[c - 1]) { bv[c] = bv[c - 1]; bi[c] = bi[c - 1]; c--; }
            bv[c] = a;
            bi[c] = j;
        }
    }
    for (int c = 0; c < NOUT; c++) {
        ov[c] = bi[c] >= 0 ? row[bi[c]] : 0.0f;
        oi[c] = bi[c] >= 0 ? (int32_t)bi[c] : 0;
    }
    const float amax = bv[NOUT];
    if (!(amax >= FLT_MIN)) {  /* nothing left but zeros: zeros (127 / FLT_MIN would overflow to inf) */
        memset(q, 128, (size_t)k);
        return FLT_MIN / 127.0f;
    }
    const float inv = (1.0f / amax) * 127.0f;
    j = 0;
    /* u clamped to [-127, 127]: no change for the rest (|u| <= 127 up to rounding), and the outliers' bytes,
       overwritten below, stay defined */
#if defined(VL)
    const vf iv = VSET1(inv), off = VSET1(128.0f), lo = VSET1(-127.0f), hi = VSET1(127.0f);
    for (; j + VL <= k; j += VL) VSTORE_U8(q + j, VADD(VROUND(VMIN(VMAX(VMUL(VLOAD(row + j), iv), lo), hi)), off));
#endif
    for (; j < k; j++) {
        float u = row[j] * inv;
        u = u < -127.0f ? -127.0f : (u > 127.0f ? 127.0f : u);
        q[j] = (uint8_t)(int)(nearbyintf(u) + 128.0f);
    }
    for (int c = 0; c < NOUT; c++)
        if (bi[c] >= 0) q[bi[c]] = 128;
    return amax / 127.0f;
}

/* The row loops below split their rows across threads from two rows on: a row costs ~1.5 us (576 values:
   RMSNorm, the outlier search, rounding) to ~4 (a 1536-wide SiLU row), about what a team's fork and join
   costs, and a second row done by the same thread is the largest part of what a 2-input pass adds to a
   1-input one (kernel_ab, 2 threads: W=2 0.15-0.3 ms cheaper than with a threshold of 4096 values). */
#define PAR_ROWS(n) ((n) > 1)

static inline void quant_row_to(const float *row, int64_t k, const qrows *o, int64_t i) {
    o->sx[i] = quant_row(row, k, o->q + i * o->ldo, o->ov + i * NOUT, o->oi + i * NOUT);
}

/* Rows of x (out->n x k, row stride ldx) -> out. Columns k..ldo of out->q are left as they are (the product's
   zero-padded weights ignore them). */
void mars_quant_rows(const float *x, int64_t k, int64_t ldx, const qrows *out) {
    const int64_t n = out->n;
    #pragma omp parallel for schedule(static) if (PAR_ROWS(n))
    for (int64_t i = 0; i < n; i++) quant_row_to(x + i * ldx, k, out, i);
}

/* RMSNorm then quantize: h = x * (1 / sqrt(mean(x^2) + eps)) * w (written to h, n x k: the gated adapter's
   deltas read it), then h's rows as mars_quant_rows. The mean is summed in double, in 8 interleaved partial
   sums added in a fixed order (the same bits for any vector width). */
void mars_rmsnorm_quant(const float *x, int64_t k, int64_t ldx, const float *w, float eps, float *h, const qrows *out) {
    const int64_t n = out->n;
    #pragma omp parallel for schedule(static) if (PAR_ROWS(n))
    for (int64_t i = 0; i < n; i++) {
        const float *row = x + i * ldx;
        double part[8] = {0};
        int64_t j = 0;
#if defined(__AVX512F__)
        {  /* the same 8 partial sums, one per lane (a float's square is exact in double: no rounding to order) */
            __m512d acc = _mm512_setzero_pd();
            for (; j + 8 <= k; j += 8) {
                const __m512d d = _mm512_cvtps_pd(_mm256_loadu_ps(row + j));
                acc = _mm512_add_pd(acc, _mm512_mul_pd(d, d));
            }
            _mm512_storeu_pd(part, acc);
        }
#elif defined(VL)
        {
            __m256d lo = _mm256_setzero_pd(), hi = lo;
            for (; j + 8 <= k; j += 8) {
                const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(row + j)), b = _mm256_cvtps_pd(_mm_loadu_ps(row + j + 4));
                lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
                hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
            }
            _mm256_storeu_pd(part, lo);
            _mm256_storeu_pd(part + 4, hi);
        }
#endif
        for (; j + 8 <= k; j += 8)
            for (int l = 0; l < 8; l++) part[l] += (double)row[j + l] * row[j + l];
        for (; j < k; j++) part[0] += (double)row[j] * row[j];
        const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
        const float r = 1.0f / sqrtf((float)(ss / (double)k) + eps);
        float *hr = h + i * k;
        j = 0;
#if defined(VL)
        for (const vf rv = VSET1(r); j + VL <= k; j += VL) VSTORE(hr + j, VMUL(VMUL(VLOAD(row + j), rv), VLOAD(w + j)));
#endif
        for (; j < k; j++) hr[j] = row[j] * r * w[j];
        quant_row_to(hr, k, out, i);
    }
}


/* The MLP's activation then quantize: gu (n x 2k, row stride ld) = [gate | up]; a = silu(gate) * up
   (written to a, n x k), then a's rows as mars_quant_rows. */
void mars_silu_mul_quant(const float *gu, int64_t k, int64_t ld, float *a, const qrows *out) {
    const int64_t n = out->n;
    #pragma omp parallel for schedule(static) if (PAR_ROWS(n))
    for (int64_t i = 0; i < n; i++) {
        const float *g = gu + i * ld, *u = g + k;
        float *ar = a + i * k;
        int64_t j = 0;
#if defined(VL)
        for (const vf one = VSET1(1.0f); j + VL <= k; j += VL) {
            const vf gv = VLOAD(g + j);
            VSTORE(ar + j, VMUL(VDIV(gv, VADD(one, vexp_poly(VSUB(VZERO(), gv)))), VLOAD(u + j)));
        }
#endif
        for (; j < k; j++) ar[j] = g[j] / (1.0f + exp_poly(-g[j])) * u[j];
        quant_row_to(ar, k, out, i);
    }
}

/* One output: (acc * sx + out) * sw (+ bias) (+ res), in this order (mars.runtime.quant's tensor ops' order):
   acc the exact integer sum of the int8 row against the int8 weights, out the sum of the row's outliers
   against them in float (block_outliers). */
static inline float rescale(float acc, float out, float sx, float sw, const float *bias, const float *res) {
    float v = (acc * sx + out) * sw;
    if (bias) v += *bias;
    if (res) v = *res + v;
    return v;
}

/* The gated adapter's delta at a few rows, added in place: y[g] += B (A h[g]) for each row index g in rows
   (row g of h and of y), as mars.runtime.linear.Linear._delta adds it at the rows whose gate is 1 (the other
   rows got + 0 there, and nothing here). A and B are stored in int8 with a float scale per row of A and per
   output of B (LoraWeights: the adapter's values to 1/254 of each row's largest, half the bytes of its
   float16: the delta's cost is these bytes, streamed every pass that has a mask row). A is stored transposed
   (k x R, R a multiple of 16) and B as segments, one per fused module (seg[5s..5s+4] = first output, outputs,
   first column of t, columns, offset of the segment's B in bt, stored by blocks of outputs: range_delta):
   block_diag's zero blocks are never read.
   t = A h is summed over two fixed halves of k (one per thread; with one thread the same two sums), then
   scaled, so the result does not depend on the thread count; then y += B t, split across threads by output. */
#if defined(VL)
/* part[r][j0 .. j0 + NV VL) for NR rows hr over c in [c0, c1): NR x NV independent fma chains, one per
   (row, vector of t), each over c ascending. Called with constant NR and NV (LP_CASE's switch) so that the
   accumulators stay in registers and the loop has no branch: with a runtime row count the loop ran ~3x
   slower than its fma chains allow (measured in isolation: R 48, one row, 1.36 us a half). */
ALWAYS_INLINE void lp_tile(const int8_t *at, int64_t R, int64_t c0, int64_t c1, const float *const *hr,
                           const int NR, const int NV, int64_t j0, float part[][MAXR]) {
    vf acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = VZERO();
    for (int64_t c = c0; c < c1; c++) {
        const int8_t *ar = at + c * R + j0;
        vf av[4];
        for (int v = 0; v < NV; v++) av[v] = VLOADI8(ar + v * VL);
        for (int r = 0; r < NR; r++) {
            const vf hb = VSET1(hr[r][c]);
            for (int v = 0; v < NV; v++) acc[r][v] = VFMA(av[v], hb, acc[r][v]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) VSTORE(part[r] + j0 + v * VL, acc[r][v]);
}
#define LP_CASE(NV, OUT) \
    switch (nr) { \
    case 1: lp_tile(at, R, c0, c1, hr, 1, NV, j0, OUT); break; \
    case 2: lp_tile(at, R, c0, c1, hr, 2, NV, j0, OUT); break; \
    case 3: lp_tile(at, R, c0, c1, hr, 3, NV, j0, OUT); break; \
    default: lp_tile(at, R, c0, c1, hr, 4, NV, j0, OUT); break; \
    }
#endif
/* part[i][j] = sum over c in half p of k of at[c R + j] * h[rows[i]][c]: t = A h is the sum of the two halves
   times sa (lora_t) */
static void lora_part(const lora_w *lw, int p, const float *h, int64_t ldh, const int64_t *rows, int64_t n,
                      float part[][MAXR]) {
    const int64_t k = lw->k, R = lw->R;
    const int8_t *at = lw->at;
    const int64_t c0 = p ? k / 2 : 0, c1 = p ? k : k / 2;
#if defined(VL)
    /* up to 4 rows by up to 4 vectors of t (AVX2: 2, its 16 registers) at a time */
    const int64_t vmax = VL == 16 ? 4 : 2;
    for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int64_t nr = n - i0 < 4 ? n - i0 : 4;
        const float *hr[4];
        for (int64_t r = 0; r < 4; r++) hr[r] = h + rows[i0 + (r < nr ? r : 0)] * ldh;
        for (int64_t j0 = 0; j0 < R;) {  /* R is a multiple of 16 */
            const int64_t nv = (R - j0) / VL < vmax ? (R - j0) / VL : vmax;
            if (nv == 4) { LP_CASE(4, part + i0) }
            else if (nv == 3) { LP_CASE(3, part + i0) }
            else if (nv == 2) { LP_CASE(2, part + i0) }
            else { LP_CASE(1, part + i0) }
            j0 += nv * VL;
        }
    }
#else
    for (int64_t i = 0; i < n; i++) {
        const float *hr = h + rows[i] * ldh;
        for (int64_t j = 0; j < R; j++) {
            float acc = 0.0f;
            for (int64_t c = c0; c < c1; c++) acc = fmaf((float)at[c * R + j], hr[c], acc);
            part[i][j] = acc;
        }
    }
#endif
}

#define LB MARS_LORA_BLOCK
#if defined(VL)
/* NV vectors of outputs from o (B pieces bb[v] for each) for NR rows: NR x NV independent fma chains, each
   output its own chain over jj ascending, then added to y. Constant NR and NV (BD_CASE's switch). */
ALWAYS_INLINE void bd_tile(const int8_t *const *bb, int64_t r_n, float t[][MAXR], int64_t r_lo, const int64_t *rows,
                           const int NR, const int NV, int64_t o, const float *sb, float *y, int64_t ldy) {
    vf acc[4][4];
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = VZERO();
    for (int64_t jj = 0; jj < r_n; jj++) {
        vf bv[4];
        for (int v = 0; v < NV; v++) bv[v] = VLOADI8(bb[v] + jj * LB);
        for (int r = 0; r < NR; r++) {
            const vf tb = VSET1(t[r][r_lo + jj]);
            for (int v = 0; v < NV; v++) acc[r][v] = VFMA(bv[v], tb, acc[r][v]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) {
            float *yo = y + rows[r] * ldy + o + v * VL;
            VSTORE(yo, VADD(VLOAD(yo), VMUL(acc[r][v], VLOAD(sb + o + v * VL))));
        }
}
#define BD_CASE(NV) \
    switch (nr) { \
    case 1: bd_tile(bb, r_n, t + i0, r_lo, rows + i0, 1, NV, o, sb, y, ldy); break; \
    case 2: bd_tile(bb, r_n, t + i0, r_lo, rows + i0, 2, NV, o, sb, y, ldy); break; \
    case 3: bd_tile(bb, r_n, t + i0, r_lo, rows + i0, 3, NV, o, sb, y, ldy); break; \
    default: bd_tile(bb, r_n, t + i0, r_lo, rows + i0, 4, NV, o, sb, y, ldy); break; \
    }
#endif
/* y[rows[i]][o] += (B t[i])[o] for the outputs o in [o0, o1) (any range: a thread's share of a product, after
   it). A segment's B is stored in blocks of LB outputs, each block's columns one after another (LB int8
   each), so a block of outputs reads one contiguous piece. Each output is its own sum of fmas over jj
   ascending, times its scale sb[o], then added to y: the same bits from every caller, vector width, thread or range. Vectors: up to 4
   rows by 4 vectors of outputs at a time (AVX2: 2), so that even one row has independent chains (one vector
   at a time left the core waiting on each fma). */
static void range_delta(const lora_w *lw, float t[][MAXR], const int64_t *rows, int64_t n, int64_t o0,
                        int64_t o1, float *y, int64_t ldy) {
    for (int64_t s = 0; s < lw->nseg; s++) {
        const int64_t *sg = lw->seg + 5 * s;
        const int64_t o_lo = sg[0], lo = o0 > o_lo ? o0 : o_lo, hi = o1 < o_lo + sg[1] ? o1 : o_lo + sg[1];
        if (lo >= hi) continue;
        const int64_t r_lo = sg[2], r_n = sg[3];
        const int8_t *bs = lw->bt + sg[4];
        const float *sb = lw->sb;
        int64_t o_vec = lo;  /* outputs [lo, o_vec) are done by vectors, the rest one by one */
#if defined(VL)
        if ((lo - o_lo) % VL == 0) {
            const int64_t vmax = VL == 16 ? 4 : 2;
            o_vec = lo + (hi - lo) / VL * VL;
            for (int64_t o = lo; o < o_vec;) {
                const int64_t nv = (o_vec - o) / VL < vmax ? (o_vec - o) / VL : vmax;
                const int8_t *bb[4];
                for (int64_t v = 0; v < nv; v++) {
                    const int64_t d = o + v * VL - o_lo, q = d % LB;
                    bb[v] = bs + (d - q) * r_n + q;  /* output o + v VL's value for column jj: bb[v][jj * LB] */
                }
                for (int64_t i0 = 0; i0 < n; i0 += 4) {
                    const int64_t nr = n - i0 < 4 ? n - i0 : 4;
                    if (nv == 4) { BD_CASE(4) }
                    else if (nv == 3) { BD_CASE(3) }
                    else if (nv == 2) { BD_CASE(2) }
                    else { BD_CASE(1) }
                }
                o += nv * VL;
            }
        }
#endif
        for (int64_t i = 0; i < n; i++) {
            float *yr = y + rows[i] * ldy;
            const float *ti = t[i] + r_lo;
            for (int64_t o = o_vec; o < hi; o++) {
                const int64_t d = o - o_lo, q = d % LB;
                const int8_t *bb = bs + (d - q) * r_n + q;
                float acc = 0.0f;
                for (int64_t jj = 0; jj < r_n; jj++) acc = fmaf((float)bb[jj * LB], ti[jj], acc);
                yr[o] = yr[o] + acc * sb[o];
            }
        }
    }
}

/* A thread's share [lo, hi) of n items: contiguous, fixed by the thread count (a product and its delta split
   the blocks alike, so a thread adds the delta to the outputs it wrote, with no barrier between) */
static inline void thread_share(int64_t n, int64_t *lo, int64_t *hi) {
#if defined(_OPENMP)
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
#else
    const int64_t nt = 1, tid = 0;
#endif
    *lo = n * tid / nt;
    *hi = n * (tid + 1) / nt;
}

void mars_lora_rows(const float *h, int64_t ldh, const int64_t *rows, int64_t n, const lora_w *lw, float *y,
                    int64_t ldy) {
    if (n == 0 || lw->nseg == 0) return;  /* no gated row, or B all zeros (an adapter before training) */
    const int64_t *last = lw->seg + 5 * (lw->nseg - 1), m = last[0] + last[1];  /* past the last adapted output */
    float part[2][MAXROWS][MAXR];
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int p = 0; p < 2; p++) lora_part(lw, p, h, ldh, rows, n, part[p]);
        /* y[g] += B t, split by blocks of outputs across threads: each thread sums the halves itself */
        float t[MAXROWS][MAXR];
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < lw->R; j++) t[i][j] = (part[0][i][j] + part[1][i][j]) * lw->sa[j];
        int64_t b_lo, b_hi;
        thread_share((m + LB - 1) / LB, &b_lo, &b_hi);
        range_delta(lw, t, rows, n, b_lo * LB, b_hi * LB < m ? b_hi * LB : m, y, ldy);
    }
}

/* Inside a parallel region: t = A h at the gated rows when there is a delta to add (lora), for the products
   below to add B t to the outputs each thread wrote (range_delta, after its share of the blocks): one call and
   one thread team for the product and its delta. part is shared (one half of k per thread), t each thread's
   own sum of the halves. */
#define LORA_T                                                                                              \
    if (lora) {                                                                                             \
        _Pragma("omp for schedule(static) nowait")                                                          \
        for (int p = 0; p < 2; p++) lora_part(lw, p, h, ldh, grows, ng, part[p]);                         \
        STAGE0(12)                                                                                          \
        _Pragma("omp barrier")                                                                              \
        for (int64_t i = 0; i < ng; i++)                                                                    \
            for (int64_t j = 0; j < lw->R; j++) t[i][j] = (part[0][i][j] + part[1][i][j]) * lw->sa[j];     \
    }

/* The integer product for up to MARS_MAX_ROWS rows, fused with the rescale: y (n x m, row stride ldy) from
   x (qrows: n uint8 rows q + 128, their scales and outliers) and the 7-bit int8 weights (|w| <= 64) in blocks
   of OB output channels: w[blk][t][c][q] = W[blk * OB + c, 4 t + q] (kp a multiple of 64, m of OB,
   zero-padded), so that one instruction multiplies 4 bytes of a row (broadcast) by 4 bytes of OB channels at
   once, with no horizontal sums:
     acc[i, o] = sum_j (x[i, j] - 128) * W[o, j] = sum_j x[i, j] * W[o, j] - 128 * wsum[o]      (exact int32)
     out[i, o] = sum over the row's outliers c, in order, of ov[i, c] * W[o, oi[i, c]]         (float)
     y[i, o]   = (acc[i, o] * sx[i] + out[i, o]) * sw[o] (+ bias[o]) (+ res[i, o])            (rescale)
   AVX-512 VNNI: vpdpbusd, OB = 16; AVX2: vpmaddubsw (u8 x s8 pair sums: 2 * 255 * 64 < 2^15, no saturation)
   then vpmaddwd, OB = 8; otherwise plain C, OB = 8. Blocks are split across OpenMP threads (torch's own
   pool: the library loads after torch, and libgomp is found by its soname). With lw (and ng > 0 gated rows
   grows of h) the gated adapter's delta is added to each thread's outputs after its blocks (LORA_T, range_delta). */
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
#define OB 16
#else
#define OB 8
#endif

int mars_block(void) { return OB; }

int mars_isa(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    return MARS_ISA_AVX512_VNNI;
#elif defined(__AVX512F__)
    return MARS_ISA_AVX512;
#elif defined(VL)
    return MARS_ISA_AVX2;
#else
    return MARS_ISA_PLAIN;
#endif
}

/* sums s[r][c] (r < rows <= 4) of rows x + r * ldx (kp bytes each) against one block of channels */
static inline void block_sums(const uint8_t *x, int64_t rows, int64_t ldx, const int8_t *wb, int64_t kp,
                              int32_t s[][OB]) {
    const int64_t T = kp / 4;
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
    /* two sets of accumulators (even and odd t): vpdpbusd's latency is ~5 cycles, so 4 dependent chains
       would leave its ports idle; 8 keep them busy (measured: a 5-wide pass's products 1.6x -> 1.4x a 1-wide) */
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t t = 0; t < T; t += 2) {  /* T = kp / 4 is a multiple of 16 */
        PREFETCH(wb + t * OB * 4 + PF_AHEAD);
        PREFETCH(wb + t * OB * 4 + PF_AHEAD + 64);
        const __m512i w = _mm512_loadu_si512((const void *)(wb + t * OB * 4));
        const __m512i u = _mm512_loadu_si512((const void *)(wb + (t + 1) * OB * 4));
        int32_t v, z;
#define STEP(A, B, R) memcpy(&v, x + (R) * ldx + 4 * t, 4); memcpy(&z, x + (R) * ldx + 4 * t + 4, 4); \
        A = _mm512_dpbusd_epi32(A, _mm512_set1_epi32(v), w); B = _mm512_dpbusd_epi32(B, _mm512_set1_epi32(z), u);
        STEP(a0, b0, 0)
        if (rows > 1) { STEP(a1, b1, 1) }
        if (rows > 2) { STEP(a2, b2, 2) }
        if (rows > 3) { STEP(a3, b3, 3) }
#undef STEP
    }
    _mm512_storeu_si512((void *)s[0], _mm512_add_epi32(a0, b0));
    if (rows > 1) _mm512_storeu_si512((void *)s[1], _mm512_add_epi32(a1, b1));
    if (rows > 2) _mm512_storeu_si512((void *)s[2], _mm512_add_epi32(a2, b2));
    if (rows > 3) _mm512_storeu_si512((void *)s[3], _mm512_add_epi32(a3, b3));
#elif defined(__AVX2__)
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < T; t++) {
        if (!(t & 1)) PREFETCH(wb + t * OB * 4 + PF_AHEAD);
        const __m256i w = _mm256_loadu_si256((const __m256i *)(wb + t * OB * 4));
        int32_t v;
#define STEP(A, R) memcpy(&v, x + (R) * ldx + 4 * t, 4); \
        A = _mm256_add_epi32(A, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(v), w), ones));
        STEP(a0, 0)
        if (rows > 1) { STEP(a1, 1) }
        if (rows > 2) { STEP(a2, 2) }
        if (rows > 3) { STEP(a3, 3) }
#undef STEP
    }
    _mm256_storeu_si256((__m256i *)s[0], a0);
    if (rows > 1) _mm256_storeu_si256((__m256i *)s[1], a1);
    if (rows > 2) _mm256_storeu_si256((__m256i *)s[2], a2);
    if (rows > 3) _mm256_storeu_si256((__m256i *)s[3], a3);
#else
    for (int64_t r = 0; r < rows; r++)
        for (int c = 0; c < OB; c++) {
            int32_t acc = 0;
            for (int64_t t = 0; t < T; t++)
                for (int q = 0; q < 4; q++) acc += (int32_t)x[r * ldx + 4 * t + q] * (int32_t)wb[(t * OB + c) * 4 + q];
            s[r][c] = acc;
        }
#endif
}

/* out[i][c] = sum over row i's outliers, in order (the first product, then + each next), of ov * W[o0 + c, oi],
   read from the block's own weights
   (in cache: the product just streamed them): byte oi % 4 of each channel's 4-byte group at t = oi / 4. */
static inline void block_outliers(const int8_t *wb, int64_t n, const float *ov, const int32_t *oi, float out[][OB]) {
    for (int64_t i = 0; i < n; i++) {
        const float *v = ov + i * NOUT;
        const int32_t *ix = oi + i * NOUT;
#if OB == 16 && defined(__AVX512F__)
        __m512 acc = _mm512_setzero_ps();
        for (int c = 0; c < NOUT; c++) {
            const __m512i g = _mm512_loadu_si512((const void *)(wb + (int64_t)(ix[c] >> 2) * OB * 4));
            const __m512i b = _mm512_srai_epi32(_mm512_sllv_epi32(g, _mm512_set1_epi32(24 - 8 * (ix[c] & 3))), 24);
            const __m512 p = _mm512_mul_ps(_mm512_set1_ps(v[c]), _mm512_cvtepi32_ps(b));
            acc = c ? _mm512_add_ps(acc, p) : p;
        }
        _mm512_storeu_ps(out[i], acc);
#elif OB == 8 && defined(__AVX2__)
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < NOUT; c++) {
            const __m256i g = _mm256_loadu_si256((const __m256i *)(wb + (int64_t)(ix[c] >> 2) * OB * 4));
            const __m256i b = _mm256_srai_epi32(_mm256_sllv_epi32(g, _mm256_set1_epi32(24 - 8 * (ix[c] & 3))), 24);
            const __m256 p = _mm256_mul_ps(_mm256_set1_ps(v[c]), _mm256_cvtepi32_ps(b));
            acc = c ? _mm256_add_ps(acc, p) : p;
        }
        _mm256_storeu_ps(out[i], acc);
#else
        for (int o = 0; o < OB; o++) {
            float acc = 0.0f;
            for (int c = 0; c < NOUT; c++) {
                const float p = v[c] * (float)wb[((int64_t)(ix[c] >> 2) * OB + o) * 4 + (ix[c] & 3)];
                acc = c ? acc + p : p;
            }
            out[i][o] = acc;
        }
#endif
    }
}

/* The rescale of one block's sums s (n rows x OB) and the rows' outliers into y. */
static inline void block_rescale(const int8_t *wb, int32_t s[][OB], const qrows *x, int64_t o0, int64_t o1,
                                 const int32_t *wsum, const float *sw, const float *bias, const float *res,
                                 int64_t ldr, float *y, int64_t ldy) {
    float out[MAXROWS][OB];
    block_outliers(wb, x->n, x->ov, x->oi, out);
#if OB == 8 && defined(__AVX2__)
    if (o1 - o0 == OB) {  /* a whole block: rescale's operations in its order, 8 outputs a vector (the same bits) */
        const __m256i ws = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(wsum + o0)), 7);  /* 128 wsum */
        const __m256 swv = _mm256_loadu_ps(sw + o0);
        for (int64_t i = 0; i < x->n; i++) {
            const __m256 acc = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)s[i]), ws));
            __m256 v = _mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(acc, _mm256_set1_ps(x->sx[i])), _mm256_loadu_ps(out[i])), swv);
            if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + o0));
            if (res) v = _mm256_add_ps(_mm256_loadu_ps(res + i * ldr + o0), v);
            _mm256_storeu_ps(y + i * ldy + o0, v);
        }
        return;
    }
#endif
    for (int64_t i = 0; i < x->n; i++)
        for (int64_t o = o0; o < o1; o++)
            y[i * ldy + o] = rescale((float)(s[i][o - o0] - 128 * wsum[o]), out[i][o - o0], x->sx[i], sw[o],
                                     bias ? bias + o : NULL, res ? res + i * ldr + o : NULL);
}

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && OB == 16
/* AMX: one tile instruction multiplies up to 16 rows by a 64-byte slice of 16 channels (the blocked layout's
   16 consecutive t-rows are exactly a B tile), so a pass of 8 tokens costs about what one costs. The OS
   must grant the tile state to the process first (mars_amx_init); each thread loads its tile shapes. */
#include <sys/syscall.h>
#include <unistd.h>
typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

int mars_amx_init(void) {
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
}

/* rows <= 32: tiles 0/1 (sums/rows) hold rows 0-15, tiles 3/4 rows 16-31, tile 2 the weights; more rows run
   mars_gemv_rows (VNNI) */
void mars_gemv_amx(const qrows *x, const int8_t *w, const int32_t *wsum, int64_t m, int64_t kp, const float *sw,
                   const float *bias, const float *res, int64_t ldr, float *y, int64_t ldy, const float *h,
                   int64_t ldh, const int64_t *grows, int64_t ng, const lora_w *lw) {
    const int64_t n = x->n, blocks = (m + OB - 1) / OB;
    if (n > 32) {
        mars_gemv_rows(x, w, wsum, m, kp, sw, bias, res, ldr, y, ldy, h, ldh, grows, ng, lw);
        return;
    }
    const int lo = n < 16 ? (int)n : 16, hi = (int)n - lo;
    const int lora = lw != NULL && ng > 0;
    float part[2][MAXROWS][MAXR];
    #pragma omp parallel
    {
        float t[MAXROWS][MAXR];
        STAGE_START
        LORA_T
        STAGE0(9)
        tile_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette_id = 1;
        cfg.rows[0] = cfg.rows[1] = (uint8_t)lo;
        cfg.rows[2] = 16;
        cfg.colsb[0] = cfg.colsb[1] = cfg.colsb[2] = 64;
        if (hi) {
            cfg.rows[3] = cfg.rows[4] = (uint8_t)hi;
            cfg.colsb[3] = cfg.colsb[4] = 64;
        }
        _tile_loadconfig(&cfg);
        int32_t s[MAXROWS][OB];
        int64_t b_lo, b_hi;
        thread_share(blocks, &b_lo, &b_hi);
        for (int64_t blk = b_lo; blk < b_hi; blk++) {
            const int8_t *wb = w + blk * kp * OB;
            _tile_zero(0);
            if (hi) _tile_zero(3);
            for (int64_t kc = 0; kc < kp; kc += 64) {
                for (int l = 0; l < 16; l++) PREFETCH(wb + kc * OB + PF_AHEAD + 64 * l);  /* into the next block's */
                _tile_loadd(2, wb + kc * OB, 64);  /* t-rows kc/4 .. kc/4 + 15: 16 x 64 bytes */
                _tile_loadd(1, x->q + kc, x->ldo);
                _tile_dpbusd(0, 1, 2);
                if (hi) {
                    _tile_loadd(4, x->q + 16 * x->ldo + kc, x->ldo);
                    _tile_dpbusd(3, 4, 2);
                }
            }
            _tile_stored(0, s, OB * 4);
            if (hi) _tile_stored(3, s + 16, OB * 4);
            const int64_t o0 = blk * OB, o1 = o0 + OB < m ? o0 + OB : m;
            block_rescale(wb, s, x, o0, o1, wsum, sw, bias, res, ldr, y, ldy);
        }
        _tile_release();
        STAGE0(10)
        if (lora) range_delta(lw, t, grows, ng, b_lo * OB, b_hi * OB < m ? b_hi * OB : m, y, ldy);
        STAGE0(11)
    }
}
int mars_has_amx(void) { return 1; }
#else
int mars_amx_init(void) { return 0; }
void mars_gemv_amx(const qrows *x, const int8_t *w, const int32_t *wsum, int64_t m, int64_t kp, const float *sw,
                   const float *bias, const float *res, int64_t ldr, float *y, int64_t ldy, const float *h,
                   int64_t ldh, const int64_t *grows, int64_t ng, const lora_w *lw) {
    mars_gemv_rows(x, w, wsum, m, kp, sw, bias, res, ldr, y, ldy, h, ldh, grows, ng, lw);
}
int mars_has_amx(void) { return 0; }
#endif

/* x->n <= MAXROWS rows; m: the real channels (the blocked weights may hold padding channels past m) */
void mars_gemv_rows(const qrows *x, const int8_t *w, const int32_t *wsum, int64_t m, int64_t kp, const float *sw,
                    const float *bias, const float *res, int64_t ldr, float *y, int64_t ldy, const float *h,
                    int64_t ldh, const int64_t *grows, int64_t ng, const lora_w *lw) {
    const int64_t blocks = (m + OB - 1) / OB, rows = x->n;
    const int lora = lw != NULL && ng > 0;
    float part[2][MAXROWS][MAXR];
    #pragma omp parallel
    {
        float t[MAXROWS][MAXR];
        STAGE_START
        LORA_T
        int64_t b_lo, b_hi;
        thread_share(blocks, &b_lo, &b_hi);
        for (int64_t blk = b_lo; blk < b_hi; blk++) {
            int32_t s[MAXROWS][OB];
            const int8_t *wb = w + blk * kp * OB;
            for (int64_t r0 = 0; r0 < rows; r0 += 4)
                block_sums(x->q + r0 * x->ldo, rows - r0 < 4 ? rows - r0 : 4, x->ldo, wb, kp, s + r0);
            const int64_t o0 = blk * OB, o1 = o0 + OB < m ? o0 + OB : m;
            block_rescale(wb, s, x, o0, o1, wsum, sw, bias, res, ldr, y, ldy);
        }
        if (lora) range_delta(lw, t, grows, ng, b_lo * OB, b_hi * OB < m ? b_hi * OB : m, y, ldy);
    }
}


/* Greedy choice and its probability, per row of logits x (n x V, row stride ld): tok = the first index of
   the largest value (as torch's argmax), conf = p(tok) = 1 / sum_v exp(x_v - max). The sum runs in 16 lanes
   added in a fixed order (the same bits for any vector width), exp as exp_poly. Rows split across threads. */
static inline float row_max(const float *row, int64_t V) {  /* exact in any order */
    float mx = -INFINITY;
    int64_t j = 0;
#if defined(VL)
    vf m = VSET1(-INFINITY);
    for (; j + VL <= V; j += VL) m = VMAX(m, VLOAD(row + j));
    float lane[VL];
    VSTORE(lane, m);
    for (int l = 0; l < VL; l++) mx = lane[l] > mx ? lane[l] : mx;
#endif
    for (; j < V; j++) mx = row[j] > mx ? row[j] : mx;
    return mx;
}

static inline float row_expsum(const float *row, int64_t V, float mx) {  /* sum exp(x - mx), 16 fixed lanes */
    float sum[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= V; j += 16)
        for (int l = 0; l < 16; l++) sum[l] += exp_poly(row[j + l] - mx);
    for (; j < V; j++) sum[0] += exp_poly(row[j] - mx);
    float total = 0.0f;
    for (int l = 0; l < 16; l++) total += sum[l];
    return total;
}

void mars_argmax_conf(const float *x, int64_t n, int64_t V, int64_t ld, int64_t *tok, float *conf) {
    #pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t i = 0; i < n; i++) {
        const float *row = x + i * ld;
        const float mx = row_max(row, V);  /* the maximum, then its first index */
        int64_t at = 0;
#if defined(VL)
        const vf mv = VSET1(mx);
        for (; at + VL <= V; at += VL) {
            const int hit = VEQ(VLOAD(row + at), mv);
            if (hit) {
                at += __builtin_ctz((unsigned)hit);
                break;
            }
        }
#endif
        while (at < V && !(row[at] == mx)) at++;
        if (at >= V) at = 0;  /* none (all NaN) */
        tok[i] = at;
        conf[i] = 1.0f / row_expsum(row, V, mx);
    }
}

/* The k likeliest tokens per row and their probabilities (softmax as above): idx, prob (n x k), descending,
   the earlier index first among equal values. One pass keeps the k best so far; a block of values that holds
   none above the k-th best is skipped with one vector compare. */
void mars_top_probs(const float *x, int64_t n, int64_t V, int64_t ld, int64_t k, int64_t *idx, float *prob) {
    #pragma omp parallel for schedule(static) if (n > 1)
    for (int64_t i = 0; i < n; i++) {
        const float *row = x + i * ld;
        int64_t *bi = idx + i * k;
        float *bv = prob + i * k;
        for (int64_t c = 0; c < k; c++) { bv[c] = -INFINITY; bi[c] = 0; }
        int64_t j = 0;
        while (j < V) {
#if defined(VL)
            if (j + VL <= V) {  /* every value of the block at or below the k-th best: skip it */
                const vf thr = VSET1(bv[k - 1]);
                if (VEQ(VMAX(VLOAD(row + j), thr), thr) == (1 << VL) - 1) {
                    j += VL;
                    continue;
                }
            }
            const int64_t end = j + VL <= V ? j + VL : V;
#else
            const int64_t end = j + 1;
#endif
            for (; j < end; j++) {
                const float v = row[j];
                if (!(v > bv[k - 1])) continue;
                int64_t c = k - 1;
                while (c > 0 && v > bv[c - 1]) { bv[c] = bv[c - 1]; bi[c] = bi[c - 1]; c--; }
                bv[c] = v;
                bi[c] = j;
            }
        }
        const float mx = bv[0], inv = 1.0f / row_expsum(row, V, mx);
        for (int64_t c = 0; c < k; c++) bv[c] = bv[c] == -INFINITY ? 0.0f : exp_poly(bv[c] - mx) * inv;
    }
}
