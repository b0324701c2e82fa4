/* The int8 fast path's C kernels: every function Python calls and every struct it fills, declared once.

   mars/runtime/kernels.py reads this file to declare the library's functions to ctypes and to lay out the
   structs (mars/runtime/c_header.py: a strict parser of what is written here and nothing more; it fails on
   anything else). So a prototype or a field changes here and only here. What it reads:
     - #define NAME <integer>                the limits below (Python reads them as numbers);
     - typedef struct { fields; } name;     fields: int64_t, float or a pointer, or a struct declared above;
     - <void|int|int64_t|float> name(args); the functions, each argument an int64_t, int, float or pointer.
   The #ifndef guard and the #include lines pass through unread. */
#ifndef MARS_KERNELS_H
#define MARS_KERNELS_H

#include <stdint.h>

/* Limits the kernels are built with (Python's MAX_C_ROWS, OUTLIERS, MAX_LORA_COLUMNS, LORA_BLOCK, PAD, MAX_HEAD_DIM) */
#define MARS_MAX_ROWS 64          /* rows (one per token) one C product or one layer-loop call takes at most */
#define MARS_OUTLIERS 8           /* a row's largest values carried in float beside its int8 row */
#define MARS_MAX_LORA_COLUMNS 256 /* values of t = A h per row the gated delta holds (A's rank, padded to 16) */
#define MARS_LORA_BLOCK 16        /* outputs per stored block of the delta's B */
#define MARS_PAD 64               /* the product reads rows of a multiple of this many bytes (one AVX-512 register) */
#define MARS_MAX_HEAD_DIM 512     /* mars_attend's rotary buffer */
#define MARS_STAGE_COUNT 13       /* timers mars_stages reads (built with -DMARS_STAGES) */

/* What mars_isa says a build's vector code is (kernels.status() names it) */
#define MARS_ISA_PLAIN 0          /* the plain C loops */
#define MARS_ISA_AVX2 1
#define MARS_ISA_AVX512 2
#define MARS_ISA_AVX512_VNNI 3

/* One fused Linear's gated deltas (LoraWeights in Python), in int8 with float scales: see mars_lora_rows. */
typedef struct {
    const int8_t *at;    /* A transposed, k x R: A[j][c] = at[c R + j] * sa[j] */
    const float *sa;     /* R scales, one per row of A */
    int64_t R, k;
    const int8_t *bt;    /* the segments' B, by blocks of outputs: B[o][j] = value * sb[o] */
    const float *sb;     /* one scale per output (every output of the fused Linear) */
    const int64_t *seg;  /* 5 per segment: first output, outputs, first column of t, columns, offset in bt */
    int64_t nseg;
} lora_w;

/* One fused Linear for the layer loop: the C product's blocked weights and its rescale, and its deltas. */
typedef struct {
    const int8_t *w;
    const int32_t *wsum;
    int64_t m, kp;
    const float *sw, *bias;
    const lora_w *lw;  /* NULL: no gated delta */
} lin_c;

/* One decoder layer for mars_layers: its two RMSNorms and four fused Linears. */
typedef struct {
    const float *ln1, *ln2;
    float eps1, eps2;
    lin_c qkv, o, gu, down;
} layer_c;

/* Rows quantized for the product (QRows in Python): n rows of one int8 row each (stored + 128, ldo bytes
   apart), its scale, and its MARS_OUTLIERS largest values (by magnitude) kept apart in float: see quant_row. */
typedef struct {
    uint8_t *q;
    int64_t n, ldo;
    float *sx;
    float *ov;    /* n x MARS_OUTLIERS values */
    int32_t *oi;  /* n x MARS_OUTLIERS their columns */
} qrows;

/* kernels.c: the int8 matrices' steps and the scoring of logits */
void mars_quant_rows(const float *x, int64_t k, int64_t ldx, const qrows *out);
void mars_rmsnorm_quant(const float *x, int64_t k, int64_t ldx, const float *w, float eps, float *h, const qrows *out);
void mars_silu_mul_quant(const float *gu, int64_t k, int64_t ld, float *a, const qrows *out);
void mars_lora_rows(const float *h, int64_t ldh, const int64_t *rows, int64_t n, const lora_w *lw, float *y,
                    int64_t ldy);
int mars_block(void);
int mars_isa(void);
int mars_has_amx(void);
int mars_amx_init(void);
void mars_gemv_rows(const qrows *x, const int8_t *w, const int32_t *wsum, int64_t m, int64_t kp, const float *sw,
                    const float *bias, const float *res, int64_t ldr, float *y, int64_t ldy, const float *h,
                    int64_t ldh, const int64_t *grows, int64_t ng, const lora_w *lw);
void mars_gemv_amx(const qrows *x, const int8_t *w, const int32_t *wsum, int64_t m, int64_t kp, const float *sw,
                   const float *bias, const float *res, int64_t ldr, float *y, int64_t ldy, const float *h,
                   int64_t ldh, const int64_t *grows, int64_t ng, const lora_w *lw);
void mars_argmax_conf(const float *x, int64_t n, int64_t V, int64_t ld, int64_t *tok, float *conf);
void mars_top_probs(const float *x, int64_t n, int64_t V, int64_t ld, int64_t k, int64_t *idx, float *prob);
int mars_stages(double *out);

/* layers.c: the attention and the whole layer loop */
int mars_attend(float *qkv, int64_t b, int64_t W, int64_t H, int64_t KV, int64_t hd, const float *cos,
                const float *sin, float *kc, float *vc, int64_t cap, int64_t C, const uint8_t *allowed, float *out,
                const int64_t *at, int64_t n);
int mars_layers(const layer_c *L, int64_t nl, float *x, int64_t b, int64_t W, int64_t D, int64_t I, int64_t H,
                int64_t KV, int64_t hd, float *kbase, float *vbase, int64_t cap, int64_t C, const float *cos,
                const float *sin, const uint8_t *allowed, const int64_t *grows, int64_t ng, int amx,
                const int64_t *at, int64_t n);

#endif
