/* edgespec's GGUF matrix product as an ONNX Runtime custom operator.
 *
 *   edgespec.gguf::GgufMatMul(X float [..., K], W uint8 [N, row bytes], addend float [N] or
 *       [..., N] (optional: a bias or a residual, added)) -> Y float [..., N]
 *   attributes: ggml_type (2 = Q4_0, 3 = Q4_1, 6 = Q5_0, 7 = Q5_1, 8 = Q8_0, 10 = Q2_K,
 *   11 = Q3_K, 12 = Q4_K, 13 = Q5_K, 14 = Q6_K, 20 = IQ4_NL, 23 = IQ4_XS: ggml's type ids;
 *   the id + 1024 when W is in the rows-of-8 layout of gguf_rows8.c), in_features K,
 *   out_features N
 *   edgespec.gguf::GgufGather(ids int64 [...], W) -> rows of W dequantized, float [..., K]
 *   (the embedding lookup, so a tied embedding is stored once, as the file's blocks)
 *
 * W holds the GGUF file's own blocks, row n being output n's K inputs, byte for byte. Each
 * row of X is quantized to int8 per block of the weight's type (256 inputs for the K-quants
 * and IQ4_XS, 32 for the legacy types and IQ4_NL; one float scale per block, the int8 sums
 * kept for the offset and minimum terms), and every output is an integer dot product per
 * block scaled into one float accumulator per (row, output), as llama.cpp computes them.
 *
 * The arithmetic of output (m, n) depends only on row m of X and row n of W: never on how
 * many rows X has, how the outputs are split between threads, or which other rows share the
 * call. So a one-token step and a verify pass over many tokens give the same bits for the
 * same token, and the runtime needs no padding to keep speculative decoding exact. Row
 * blocks of X share each unpacked weight block, so a pass over several tokens reads and
 * unpacks the weights once.
 *
 * Paths: AVX2 (x86-64), its VNNI forms (avx-vnni; avx512-vnni, whose several-row passes run
 * on 512-bit registers: gguf_rows8_x86.h, gguf_rows8_zmm.h), NEON with or without the
 * dot-product instructions (AArch64: gguf_neon.c), each chosen at run time when the CPU has
 * it, and portable C. Every path gives the same bits; a process uses one path for every call. */
#include "gguf_common.h"

#if defined(ES_ARM) && defined(__linux__)
#include <sys/auxv.h>
#endif




/* Q4_K's and Q5_K's 6-bit scales and minimums of their 8 blocks of 32 (scales[12] at sc). */
static inline __attribute__((always_inline)) void unpack_k_factors(const uint8_t *sc, Unpacked *u) {
    for (int j = 0; j < 8; j++) {
        int scale, minimum;
        if (j < 4) {
            scale = sc[j] & 63;
            minimum = sc[j + 4] & 63;
        } else {
            scale = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
            minimum = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        }
        set_scale(u, 2 * j, scale, minimum);
        set_scale(u, 2 * j + 1, scale, minimum);
    }
}

static inline __attribute__((always_inline)) void unpack_q4_k(const uint8_t *b, Unpacked *u) {
    const uint8_t *qs = b + 16;
    u->d = half_to_float(read_u16(b));
    u->dmin = half_to_float(read_u16(b + 2));
    unpack_k_factors(b + 4, u);
    for (int c = 0; c < 4; c++) { /* 32 bytes: block 2c in the low nibbles, 2c + 1 high */
        for (int i = 0; i < 32; i++) {
            u->code[64 * c + i] = qs[32 * c + i] & 0x0F;
            u->code[64 * c + 32 + i] = qs[32 * c + i] >> 4;
        }
    }
}

/* Q5_K: Q4_K's fields with qh[32] before the nibbles; bit s of qh[i] is the fifth bit of
 * input 32s + i (block s of 32). */
static inline __attribute__((always_inline)) void unpack_q5_k(const uint8_t *b, Unpacked *u) {
    const uint8_t *qh = b + 16, *qs = b + 48;
    u->d = half_to_float(read_u16(b));
    u->dmin = half_to_float(read_u16(b + 2));
    unpack_k_factors(b + 4, u);
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < 32; i++) {
            u->code[64 * c + i] = (uint8_t)((qs[32 * c + i] & 0x0F) | (((qh[i] >> (2 * c)) & 1) << 4));
            u->code[64 * c + 32 + i] = (uint8_t)((qs[32 * c + i] >> 4) | (((qh[i] >> (2 * c + 1)) & 1) << 4));
        }
    }
}

/* Q2_K: input 128c + 32j + l is bits 2j, 2j + 1 of qs[32c + l]; its block of 16 has
 * scales[i / 16]: the scale in the low nibble, the minimum in the high one. */
static inline __attribute__((always_inline)) void unpack_q2_k(const uint8_t *b, Unpacked *u) {
    const uint8_t *qs = b + 16;
    u->d = half_to_float(read_u16(b + 80));
    u->dmin = half_to_float(read_u16(b + 82));
    for (int k = 0; k < SUB; k++) set_scale(u, k, b[k] & 0x0F, b[k] >> 4);
    for (int i = 0; i < QK; i++) u->code[i] = (qs[32 * (i / 128) + i % 32] >> (2 * (i % 128 / 32))) & 3;
}

/* Q3_K: 3-bit codes (the value + 4): the low bits as Q2_K's, the third bit of input
 * 128c + 32j + l bit 4c + j of hmask[l]; the 16 scales of 6 bits (the value + 32) as
 * ggml packs them in scales[12]: low nibbles in bytes 0-7 (scales 0-7 low, 8-15 high),
 * the top bit pairs in bytes 8-11 (scale k's at bits 2 (k / 4) of byte 8 + k % 4). */
static inline int q3_k_scale(const uint8_t *sc, int k) {
    const int low = k < 8 ? sc[k] & 0x0F : sc[k - 8] >> 4;
    return (low | ((sc[8 + k % 4] >> (2 * (k / 4))) & 3) << 4) - 32;
}
static inline __attribute__((always_inline)) void unpack_q3_k(const uint8_t *b, Unpacked *u) {
    const uint8_t *hmask = b, *qs = b + 32;
    u->d = half_to_float(read_u16(b + 108));
    u->dmin = u->d;
    for (int k = 0; k < SUB; k++) {
        const int scale = q3_k_scale(b + 96, k);
        set_scale(u, k, scale, 4 * scale);
    }
    for (int i = 0; i < QK; i++) {
        const int c = i / 128, j = i % 128 / 32, l = i % 32;
        u->code[i] = (uint8_t)(((qs[32 * c + l] >> (2 * j)) & 3) | (((hmask[l] >> (4 * c + j)) & 1) << 2));
    }
}

static inline __attribute__((always_inline)) void unpack_q6_k(const uint8_t *b, Unpacked *u) {
    const int8_t *sc = (const int8_t *)(b + 192);
    u->d = half_to_float(read_u16(b + 208));
    u->dmin = u->d;
    for (int k = 0; k < SUB; k++) set_scale(u, k, sc[k], 32 * sc[k]);
    for (int h = 0; h < 2; h++) { /* each half: 64 bytes of low nibbles, 32 of high pairs */
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        uint8_t *code = u->code + 128 * h;
        for (int l = 0; l < 32; l++) {
            code[l] = (uint8_t)((ql[l] & 0x0F) | ((qh[l] & 3) << 4));
            code[l + 32] = (uint8_t)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
            code[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            code[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}


/* IQ4_XS: block s of 32 has a 6-bit scale (the value + 32: its low nibble in scales_l[s / 2]
 * at bit 4 (s % 2), its high bits at bit 2s of scales_h) and Q4_0's nibbles (qs[16 s + j]:
 * input 32 s + j low, 32 s + 16 + j high), indices into IQ4_VALUES. The codes are the values
 * + 128 (unsigned), the offset 128 * scale. */
static inline int iq4_xs_scale(const uint8_t *b, int s) {
    return (((b[4 + s / 2] >> (4 * (s % 2))) & 0x0F) | ((read_u16(b + 2) >> (2 * s)) & 3) << 4) - 32;
}
static inline __attribute__((always_inline)) void unpack_iq4_xs(const uint8_t *b, Unpacked *u) {
    u->d = half_to_float(read_u16(b));
    u->dmin = u->d;
    for (int s = 0; s < 8; s++) {
        const int scale = iq4_xs_scale(b, s);
        set_scale(u, 2 * s, scale, 128 * scale);
        set_scale(u, 2 * s + 1, scale, 128 * scale);
        const uint8_t *qs = b + 8 + 16 * s;
        for (int j = 0; j < 16; j++) {
            u->code[32 * s + j] = (uint8_t)(IQ4_VALUES[qs[j] & 0x0F] + 128);
            u->code[32 * s + 16 + j] = (uint8_t)(IQ4_VALUES[qs[j] >> 4] + 128);
        }
    }
}

static void quantize_rows(const float *x, int64_t rows, int64_t k, int64_t block, int64_t span,
                          Quantized *out) {
    int64_t blocks = k / block;
    for (int64_t m = 0; m < rows; m++) {
        for (int64_t b = 0; b < blocks; b++) {
            const float *v = x + m * k + b * block;
            int8_t *q = out->q + m * k + b * block;
            float amax = 0.0f;
            for (int64_t i = 0; i < block; i++) amax = fmaxf(amax, fabsf(v[i]));
            float scale = amax / 127.0f;
            float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
            out->scale[m * blocks + b] = scale;
            for (int64_t i = 0; i < block; i++) {
                int value = (int)lrintf(v[i] * inverse);
                q[i] = (int8_t)(value > 127 ? 127 : (value < -127 ? -127 : value));
            }
        }
        for (int64_t s = 0; s < k / span; s++) {
            int sum = 0;
            for (int64_t i = 0; i < span; i++) sum += out->q[m * k + s * span + i];
            out->sums[m * (k / span) + s] = (int16_t)sum;
        }
    }
}

static void free_quantized(Quantized *x) {
    free(x->q), free(x->scale), free(x->sums);
}

/* Allocates and fills the quantized activations (with AVX2 or NEON where `vectorized`); 0 on
 * success. */
static int quantized_rows(const float *x, int64_t rows, int64_t k, int ggml_type, int vectorized,
                          Quantized *out) {
    int64_t block = block_inputs(ggml_type), span = sum_span(ggml_type);
    out->q = malloc((size_t)(rows * k));
    out->scale = malloc(sizeof(float) * (size_t)(rows * (k / block)));
    out->sums = malloc(sizeof(int16_t) * (size_t)(rows * (k / span)));
    if (!out->q || !out->scale || !out->sums) {
        free_quantized(out);
        return -1;
    }
#ifdef ES_X86
    if (vectorized) {
        es_quantize_rows_avx2(x, rows, k, block, span, out);
        return 0;
    }
#endif
#ifdef ES_ARM
    if (vectorized) {
        es_quantize_rows_neon(x, rows, k, block, span, out);
        return 0;
    }
#endif
    (void)vectorized;
    quantize_rows(x, rows, k, block, span, out);
    return 0;
}

/* ---- the product ------------------------------------------------------------------ */


typedef void (*unpack_fn)(const uint8_t *, Unpacked *);

static void unpack_q4_k_portable(const uint8_t *b, Unpacked *u) { unpack_q4_k(b, u); }
static void unpack_q5_k_portable(const uint8_t *b, Unpacked *u) { unpack_q5_k(b, u); }
static void unpack_q2_k_portable(const uint8_t *b, Unpacked *u) { unpack_q2_k(b, u); }
static void unpack_q3_k_portable(const uint8_t *b, Unpacked *u) { unpack_q3_k(b, u); }
static void unpack_q6_k_portable(const uint8_t *b, Unpacked *u) { unpack_q6_k(b, u); }
static void unpack_iq4_xs_portable(const uint8_t *b, Unpacked *u) { unpack_iq4_xs(b, u); }

/* Block b of output n as the file stores it: in W, or rebuilt into `scratch` from the rows-of-8
 * layout. */
static const uint8_t *legacy_block(const uint8_t *w, int ggml_type, int rows8, int64_t k,
                                   int64_t n, int64_t b, uint8_t scratch[34]) {
    if (!rows8) return w + (size_t)n * row_bytes(ggml_type, k) + (size_t)b * block_bytes(ggml_type);
    es_rows8_file_block(w, ggml_type, k, n, b, scratch);
    return scratch;
}

static void outputs_legacy_portable(const Product *p, int64_t n0, int64_t n1) {
    int64_t blocks = p->k / LEGACY;
    uint8_t scratch[34];
    int8_t code[LEGACY];
    float d, minimum, acc[ROWS_PER_PASS];
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {
        int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;
        for (int64_t n = n0; n < n1; n++) {
            for (int64_t r = 0; r < rows; r++) acc[r] = 0.0f;
            for (int64_t b = 0; b < blocks; b++) {
                unpack_legacy(legacy_block(p->w, p->ggml_type, p->rows8, p->k, n, b, scratch),
                              p->ggml_type, code, &d, &minimum);
                for (int64_t r = 0; r < rows; r++) {
                    int64_t m = m0 + r;
                    const int8_t *q = p->x.q + m * p->k + b * LEGACY;
                    int32_t dot = 0;
                    for (int i = 0; i < LEGACY; i++) dot += code[i] * q[i];
                    float scale = p->x.scale[m * blocks + b];
                    acc[r] += d * scale * (float)dot +
                              minimum * scale * (float)p->x.sums[m * blocks + b];
                }
            }
            for (int64_t r = 0; r < rows; r++) p->y[(m0 + r) * p->n + n] = acc[r];
        }
    }
}

static void outputs_portable(const Product *p, int64_t n0, int64_t n1) {
    if (!is_k_quant(p->ggml_type)) {
        outputs_legacy_portable(p, n0, n1);
        return;
    }
    int64_t blocks = p->k / QK;
    unpack_fn unpack = p->ggml_type == GGML_Q2_K   ? unpack_q2_k_portable
                       : p->ggml_type == GGML_Q3_K ? unpack_q3_k_portable
                       : p->ggml_type == GGML_Q4_K ? unpack_q4_k_portable
                       : p->ggml_type == GGML_Q5_K ? unpack_q5_k_portable
                       : p->ggml_type == GGML_Q6_K ? unpack_q6_k_portable
                                                   : unpack_iq4_xs_portable;
    const int centred = code_centre(p->ggml_type) != 0;
    const size_t size = block_bytes(p->ggml_type);
    Unpacked u;
    float acc[ROWS_PER_PASS];
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {
        int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;
        for (int64_t n = n0; n < n1; n++) {
            for (int64_t r = 0; r < rows; r++) acc[r] = 0.0f;
            for (int64_t b = 0; b < blocks; b++) {
                if (p->rows8)
                    es_rows8_unpack_k(p->w, p->ggml_type, p->k, n, b, &u);
                else
                    unpack(p->w + n * p->row_bytes + b * size, &u);
                for (int64_t r = 0; r < rows; r++) {
                    int64_t m = m0 + r;
                    const int8_t *q = p->x.q + m * p->k + b * QK;
                    const int16_t *sums = p->x.sums + (m * blocks + b) * (QK / SUB);
                    int32_t dot = 0, offsets = 0;
                    for (int s = 0; s < SUB; s++) {
                        int32_t part = 0;
                        for (int i = 0; i < SUB; i++) part += u.code[s * SUB + i] * q[s * SUB + i];
                        dot += part * (int16_t)(u.scale_pair[s] & 0xFFFF);
                        offsets += u.offset[s] * sums[s];
                    }
                    float scale = p->x.scale[m * blocks + b];
                    if (centred) /* the offsets are most of `dot`: subtracted as integers */
                        acc[r] += u.d * scale * (float)(dot - offsets);
                    else
                        acc[r] += u.d * scale * (float)dot - u.dmin * scale * (float)offsets;
                }
            }
            for (int64_t r = 0; r < rows; r++) p->y[(m0 + r) * p->n + n] = acc[r];
        }
    }
}

#ifdef ES_X86

ES_AVX2 static inline float half_avx2(const uint8_t *p) {
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(read_u16(p))));
}

ES_AVX2 static inline float sum_lanes(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Shuffle masks that spread one factor byte over 16 bytes (SAME[j]: byte j everywhere) or two
 * (PAIR[j]: byte 2j in the first 8, 2j + 1 in the last 8). */
#define ES_MASK8(a) a, a, a, a, a, a, a, a
static const uint8_t SAME[8][16] __attribute__((aligned(16))) = {
    {ES_MASK8(0), ES_MASK8(0)}, {ES_MASK8(1), ES_MASK8(1)}, {ES_MASK8(2), ES_MASK8(2)},
    {ES_MASK8(3), ES_MASK8(3)}, {ES_MASK8(4), ES_MASK8(4)}, {ES_MASK8(5), ES_MASK8(5)},
    {ES_MASK8(6), ES_MASK8(6)}, {ES_MASK8(7), ES_MASK8(7)}};
static const uint8_t PAIR[8][16] __attribute__((aligned(16))) = {
    {ES_MASK8(0), ES_MASK8(1)},   {ES_MASK8(2), ES_MASK8(3)},   {ES_MASK8(4), ES_MASK8(5)},
    {ES_MASK8(6), ES_MASK8(7)},   {ES_MASK8(8), ES_MASK8(9)},   {ES_MASK8(10), ES_MASK8(11)},
    {ES_MASK8(12), ES_MASK8(13)}, {ES_MASK8(14), ES_MASK8(15)}};

/* Sixteen 16-bit lanes of factor bytes from v, placed by a mask above. */
ES_AVX2 static inline __m256i spread(__m128i v, const uint8_t mask[16]) {
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(v, _mm_load_si128((const __m128i *)mask)));
}

/* Q4_K: the eight 6-bit scales and minimums as bytes (scales[12] read as three words). */
ES_AVX2 static inline void q4_k_factors(const uint8_t *packed, __m128i *scales, __m128i *mins) {
    uint32_t a, b, c;
    memcpy(&a, packed, 4), memcpy(&b, packed + 4, 4), memcpy(&c, packed + 8, 4);
    uint64_t s = (uint64_t)(a & 0x3F3F3F3Fu) |
                 (uint64_t)((c & 0x0F0F0F0Fu) | (((a >> 6) & 0x03030303u) << 4)) << 32;
    uint64_t m = (uint64_t)(b & 0x3F3F3F3Fu) |
                 (uint64_t)(((c >> 4) & 0x0F0F0F0Fu) | (((b >> 6) & 0x03030303u) << 4)) << 32;
    *scales = _mm_cvtsi64_si128((long long)s);
    *mins = _mm_cvtsi64_si128((long long)m);
}

/* The rows of a pass in groups of ROW_GROUP: each group shares every unpacked 32 codes, which
 * stay in registers while the group's rows take their products (then the last rows one by
 * one). A row's arithmetic is the same in a group or alone. */
#define ROW_GROUP 4

/* Q4_K block `block` against rows m .. m + R - 1 (R is a constant at each call). */
ES_AVX2 static inline __attribute__((always_inline)) void q4_k_block_rows(
    const Product *p, const uint8_t *block, int64_t b, int64_t m, int R, __m256 *acc) {
    const int64_t blocks = p->k / QK;
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    /* Minimums per 16 inputs: byte j / 2 of the minimums for lane j. */
    const __m128i mins_per_16 = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const float d = half_avx2(block), dmin = half_avx2(block + 2);
    __m128i scales, mins;
    q4_k_factors(block + 4, &scales, &mins);
    const uint8_t *qs = block + 16;
    __m256i dot[ROW_GROUP];
    for (int r = 0; r < R; r++) dot[r] = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i packed = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(packed, nibble);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
        __m256i scale_lo = spread(scales, SAME[2 * c]), scale_hi = spread(scales, SAME[2 * c + 1]);
        for (int r = 0; r < R; r++) {
            const int8_t *q = p->x.q + (m + r) * p->k + b * QK + 64 * c;
            __m256i p_lo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q));
            __m256i p_hi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 32)));
            dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(p_lo, scale_lo));
            dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(p_hi, scale_hi));
        }
    }
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(mins, mins_per_16));
    for (int r = 0; r < R; r++) {
        const int64_t row = m + r;
        __m256i sums = _mm256_loadu_si256(
            (const __m256i *)(p->x.sums + (row * blocks + b) * (QK / SUB)));
        __m256i offset = _mm256_madd_epi16(sums, mins16);
        const float scale = p->x.scale[row * blocks + b];
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_set1_ps(d * scale), acc[r]);
        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offset), _mm256_set1_ps(dmin * scale),
                                  acc[r]);
    }
}

/* Q6_K block `block` against rows m .. m + R - 1. */
ES_AVX2 static inline __attribute__((always_inline)) void q6_k_block_rows(
    const Product *p, const uint8_t *block, int64_t b, int64_t m, int R, __m256 *acc) {
    const int64_t blocks = p->k / QK;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i bits01 = _mm256_set1_epi8(0x03), bits23 = _mm256_set1_epi8(0x0C);
    const __m256i bits45 = _mm256_set1_epi8(0x30), bits67 = _mm256_set1_epi8((char)0xC0);
    const float d = half_avx2(block + 208);
    const __m128i scales = _mm_loadu_si128((const __m128i *)(block + 192));
    __m256i dot[ROW_GROUP];
    for (int r = 0; r < R; r++) dot[r] = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = block + 64 * h, *qh = block + 128 + 32 * h;
        __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i high = _mm256_loadu_si256((const __m256i *)qh);
        __m256i codes[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, low4),
                            _mm256_slli_epi16(_mm256_and_si256(high, bits01), 4)),
            _mm256_or_si256(_mm256_and_si256(l1, low4),
                            _mm256_slli_epi16(_mm256_and_si256(high, bits23), 2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                            _mm256_and_si256(high, bits45)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                            _mm256_srli_epi16(_mm256_and_si256(high, bits67), 2)),
        };
        for (int j = 0; j < 4; j++) {
            __m256i scale = spread(scales, PAIR[4 * h + j]);
            for (int r = 0; r < R; r++) {
                const int8_t *y = p->x.q + (m + r) * p->k + b * QK + 128 * h + 32 * j;
                __m256i product =
                    _mm256_maddubs_epi16(codes[j], _mm256_loadu_si256((const __m256i *)y));
                dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(product, scale));
            }
        }
    }
    /* The codes are stored 32 above their value: take 32 * scale * sum(y). */
    const __m256i scales16 = _mm256_cvtepi8_epi16(scales);
    for (int r = 0; r < R; r++) {
        const int64_t row = m + r;
        __m256i sums = _mm256_loadu_si256(
            (const __m256i *)(p->x.sums + (row * blocks + b) * (QK / SUB)));
        __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sums, scales16), 5);
        const float scale = p->x.scale[row * blocks + b];
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot[r], offset)),
                                 _mm256_set1_ps(d * scale), acc[r]);
    }
}

#define ES_K_OUTPUTS(name, block_rows, size)                                                     \
    ES_AVX2 static void name(const Product *p, int64_t n0, int64_t n1) {                          \
        const int64_t blocks = p->k / QK;                                                        \
        __m256 acc[ROWS_PER_PASS];                                                               \
        for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {                                \
            int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;          \
            int64_t grouped = rows - rows % ROW_GROUP;                                           \
            for (int64_t n = n0; n < n1; n++) {                                                  \
                for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();                 \
                const uint8_t *block = p->w + n * p->row_bytes;                                  \
                for (int64_t b = 0; b < blocks; b++, block += size) {                            \
                    for (int line = 0; line < size; line += 64)                                  \
                        _mm_prefetch((const char *)block + ES_PREFETCH * size + line,            \
                                     _MM_HINT_T0);                                               \
                    int64_t r = 0;                                                               \
                    for (; r < grouped; r += ROW_GROUP)                                          \
                        block_rows(p, block, b, m0 + r, ROW_GROUP, acc + r);                     \
                    for (; r < rows; r++) block_rows(p, block, b, m0 + r, 1, acc + r);           \
                }                                                                                \
                for (int64_t r = 0; r < rows; r++) p->y[(m0 + r) * p->n + n] = sum_lanes(acc[r]); \
            }                                                                                    \
        }                                                                                        \
    }

ES_K_OUTPUTS(outputs_q4_k_avx2, q4_k_block_rows, 144)
ES_K_OUTPUTS(outputs_q6_k_avx2, q6_k_block_rows, 210)

/* A legacy block's 32 codes in one register: signed for the symmetric types (Q4_0, Q5_0,
 * Q8_0, IQ4_NL), 0..31 for the types with a minimum (Q4_1, Q5_1). */
ES_AVX2 static inline __m256i legacy_codes_avx2(const uint8_t *block, int ggml_type) {
    if (ggml_type == GGML_Q8_0) return _mm256_loadu_si256((const __m256i *)(block + 2));
    if (ggml_type == GGML_IQ4_NL) { /* the nibbles index the table: signed codes */
        const __m128i packed = _mm_loadu_si128((const __m128i *)(block + 2)), low4 = _mm_set1_epi8(0x0F);
        const __m128i values = _mm_loadu_si128((const __m128i *)IQ4_VALUES);
        return _mm256_set_m128i(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(packed, 4), low4)),
                                _mm_shuffle_epi8(values, _mm_and_si128(packed, low4)));
    }
    const int five = ggml_type == GGML_Q5_0 || ggml_type == GGML_Q5_1;
    const int offset = ggml_type == GGML_Q4_0 ? 2 : ggml_type == GGML_Q4_1 ? 4 : ggml_type == GGML_Q5_0 ? 6 : 8;
    const __m128i packed = _mm_loadu_si128((const __m128i *)(block + offset));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    /* Inputs 0-15 in the low nibbles, 16-31 in the high ones. */
    __m256i codes = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low4),
                                     _mm_and_si128(packed, low4));
    if (five) { /* bit j of the 32-bit word is input j's fifth bit */
        uint32_t high;
        memcpy(&high, block + (ggml_type == GGML_Q5_0 ? 2 : 4), 4);
        const __m256i quarter = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)high), quarter);
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        codes = _mm256_or_si256(codes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    }
    if (!legacy_has_minimum(ggml_type))
        codes = _mm256_sub_epi8(codes, _mm256_set1_epi8((char)(five ? 16 : 8)));
    return codes;
}

/* A legacy block against rows m .. m + R - 1 (R is a constant at each call). */
ES_AVX2 static inline __attribute__((always_inline)) void legacy_block_rows(
    const Product *p, const uint8_t *block, int64_t b, int64_t m, int R, __m256 *acc) {
    const int64_t blocks = p->k / LEGACY;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i codes = legacy_codes_avx2(block, p->ggml_type);
    const int minimum = legacy_has_minimum(p->ggml_type);
    const float d = half_avx2(block), low = minimum ? half_avx2(block + 2) : 0.0f;
    /* maddubs takes unsigned bytes times signed ones: signed codes go in as their magnitudes
     * with their signs moved onto the activations. */
    const __m256i magnitudes = minimum ? codes : _mm256_sign_epi8(codes, codes);
    for (int r = 0; r < R; r++) {
        const int64_t row = m + r;
        __m256i y = _mm256_loadu_si256((const __m256i *)(p->x.q + row * p->k + b * LEGACY));
        if (!minimum) y = _mm256_sign_epi8(y, codes);
        __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes, y), ones);
        const float scale = p->x.scale[row * blocks + b];
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(d * scale), acc[r]);
        if (minimum)
            acc[r] = _mm256_add_ps(
                acc[r], _mm256_setr_ps(low * scale * (float)p->x.sums[row * blocks + b], 0.0f,
                                       0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f));
    }
}

ES_AVX2 static void outputs_legacy_single_avx2(const Product *p, int64_t n0, int64_t n1) {
    const int64_t blocks = p->k / LEGACY;
    const size_t size = block_bytes(p->ggml_type);
    /* Two accumulators per row, for even and odd blocks: one chain of additions per 32
     * inputs would wait on the adder's latency more than on memory. */
    __m256 even[ROWS_PER_PASS], odd[ROWS_PER_PASS];
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {
        int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;
        int64_t grouped = rows - rows % ROW_GROUP;
        for (int64_t n = n0; n < n1; n++) {
            for (int64_t r = 0; r < rows; r++) even[r] = odd[r] = _mm256_setzero_ps();
            const uint8_t *block = p->w + n * p->row_bytes;
            for (int64_t b = 0; b < blocks; b++, block += size) {
                _mm_prefetch((const char *)block + ES_PREFETCH * size, _MM_HINT_T0);
                __m256 *acc = b & 1 ? odd : even;
                int64_t r = 0;
                for (; r < grouped; r += ROW_GROUP)
                    legacy_block_rows(p, block, b, m0 + r, ROW_GROUP, acc + r);
                for (; r < rows; r++) legacy_block_rows(p, block, b, m0 + r, 1, acc + r);
            }
            for (int64_t r = 0; r < rows; r++)
                p->y[(m0 + r) * p->n + n] = sum_lanes(_mm256_add_ps(even[r], odd[r]));
        }
    }
}

/* Four outputs' float16 factors at byte `at` of their blocks, as [f0 f1 f2 f3 f0 f1 f2 f3]. */
ES_AVX2 static inline __m256 four_halves(const uint8_t *const block[4], int at) {
    __m128i bits = _mm_setr_epi16((short)read_u16(block[0] + at), (short)read_u16(block[1] + at),
                                  (short)read_u16(block[2] + at), (short)read_u16(block[3] + at),
                                  0, 0, 0, 0);
    __m128 four = _mm_cvtph_ps(bits);
    return _mm256_set_m128(four, four);
}

/* Four outputs (n .. n + 3) at once: each activation block is loaded once for the four, and
 * their four integer dot products are folded into one register (lanes 0-3: the four outputs'
 * sums over inputs 0-15 of the block, lanes 4-7: over inputs 16-31), scaled by one product of
 * factors. Every output of a weight goes through this path or the single one by its index
 * alone (tasks are multiples of four outputs), so its arithmetic never depends on the pass. */
ES_AVX2 static void legacy_four_outputs_avx2(const Product *p, int64_t n) {
    const int64_t blocks = p->k / LEGACY;
    const size_t size = block_bytes(p->ggml_type);
    const int minimum = legacy_has_minimum(p->ggml_type);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS_PER_PASS];
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {
        int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;
        for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
        const uint8_t *block[4];
        for (int c = 0; c < 4; c++) block[c] = p->w + (n + c) * p->row_bytes;
        for (int64_t b = 0; b < blocks; b++) {
            __m256i codes[4], magnitudes[4];
            for (int c = 0; c < 4; c++) {
                _mm_prefetch((const char *)block[c] + ES_PREFETCH * size, _MM_HINT_T0);
                codes[c] = legacy_codes_avx2(block[c], p->ggml_type);
                magnitudes[c] = minimum ? codes[c] : _mm256_sign_epi8(codes[c], codes[c]);
            }
            const __m256 d = four_halves(block, 0);
            const __m256 low = minimum ? four_halves(block, 2) : _mm256_setzero_ps();
            for (int64_t r = 0; r < rows; r++) {
                const int64_t row = m0 + r;
                const __m256i y =
                    _mm256_loadu_si256((const __m256i *)(p->x.q + row * p->k + b * LEGACY));
                __m256i dot[4];
                for (int c = 0; c < 4; c++) {
                    __m256i signed_y = minimum ? y : _mm256_sign_epi8(y, codes[c]);
                    dot[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes[c], signed_y), ones);
                }
                __m256i folded = _mm256_hadd_epi32(_mm256_hadd_epi32(dot[0], dot[1]),
                                                   _mm256_hadd_epi32(dot[2], dot[3]));
                const float scale = p->x.scale[row * blocks + b];
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(folded),
                                         _mm256_mul_ps(d, _mm256_set1_ps(scale)), acc[r]);
                if (minimum) { /* half of each minimum term per half of the lanes */
                    float sum = 0.5f * scale * (float)p->x.sums[row * blocks + b];
                    acc[r] = _mm256_fmadd_ps(low, _mm256_set1_ps(sum), acc[r]);
                }
            }
            for (int c = 0; c < 4; c++) block[c] += size;
        }
        for (int64_t r = 0; r < rows; r++) {
            __m128 four = _mm_add_ps(_mm256_castps256_ps128(acc[r]),
                                     _mm256_extractf128_ps(acc[r], 1));
            _mm_storeu_ps(p->y + (m0 + r) * p->n + n, four);
        }
    }
}

ES_AVX2 static void outputs_legacy_avx2(const Product *p, int64_t n0, int64_t n1) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) legacy_four_outputs_avx2(p, n);
    if (n < n1) outputs_legacy_single_avx2(p, n, n1);
}

ES_AVX2 static void outputs_avx2(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_avx2(p, n0, n1);
    else if (p->ggml_type == GGML_Q4_K)
        outputs_q4_k_avx2(p, n0, n1);
    else if (p->ggml_type == GGML_Q6_K)
        outputs_q6_k_avx2(p, n0, n1);
    else if (is_k_quant(p->ggml_type)) /* Q2_K, Q3_K, Q5_K, IQ4_XS: in rows of 8 where they can be */
        outputs_portable(p, n0, n1);
    else
        outputs_legacy_avx2(p, n0, n1);
}
#ifdef ES_VNNI
/* The rows-of-8 products with dpbusd; everything else as on AVX2. */
ES_AVX2 static void outputs_avxvnni(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_avxvnni(p, n0, n1);
    else
        outputs_avx2(p, n0, n1);
}

/* AVX512-VNNI: the K-quants' several-row passes on 512-bit dpbusd; the rest on 256-bit
 * dpbusd, VEX-encoded where the CPU has AVX-VNNI. */
static int has_avxvnni;
ES_AVX2 static void outputs_avx512vnni(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_zmm(p, n0, n1, has_avxvnni);
    else
        outputs_avx2(p, n0, n1);
}
#endif
#endif

typedef void (*outputs_fn)(const Product *, int64_t, int64_t);

#ifdef ES_ARM
/* The rows-of-8 products on NEON; weights in the file's layout on the portable loops. */
static void outputs_neon_dotprod(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_neon_dotprod(p, n0, n1);
    else
        outputs_portable(p, n0, n1);
}

static void outputs_neon_plain(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_neon_plain(p, n0, n1);
    else
        outputs_portable(p, n0, n1);
}

/* ARMv8.2's dot-product instructions: Linux and Android say so in the auxiliary vector
 * (HWCAP_ASIMDDP, bit 20); every Apple arm64 chip has them. */
static int cpu_has_dotprod(void) {
#if defined(__APPLE__)
    return 1;
#elif defined(__linux__)
    return (getauxval(AT_HWCAP) >> 20) & 1;
#else
    return 0;
#endif
}
#endif

/* EDGESPEC_GGUF_KERNEL_PATH names a path to take where the CPU has it (tests and comparisons):
 * "portable", "avx2", or "avx-vnni" on a CPU with AVX-VNNI and AVX512-VNNI, "neon" on one
 * with dotprod;
 * otherwise the CPU decides. */
static int forced_path(const char *name) {
    const char *forced = getenv("EDGESPEC_GGUF_KERNEL_PATH");
    return forced && strcmp(forced, name) == 0;
}

static outputs_fn chosen_path(void) {
    if (forced_path("portable")) return outputs_portable;
#ifdef ES_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        if (forced_path("avx2")) return outputs_avx2;
#ifdef ES_VNNI
        has_avxvnni = __builtin_cpu_supports("avxvnni");
        if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512f") &&
            !(has_avxvnni && forced_path("avx-vnni")))
            return outputs_avx512vnni;
        if (has_avxvnni) return outputs_avxvnni;
#endif
        return outputs_avx2;
    }
#endif
#ifdef ES_ARM
    if (forced_path("neon")) return outputs_neon_plain;
    return cpu_has_dotprod() ? outputs_neon_dotprod : outputs_neon_plain;
#endif
    return outputs_portable;
}

static outputs_fn path;

static int swiglu_task(const Product *p, int64_t n0);

static void run_task(void *data, size_t task) {
    const Product *p = (const Product *)data;
    int64_t n0 = (int64_t)task * OUTPUTS_PER_TASK;
    int64_t n1 = n0 + OUTPUTS_PER_TASK < p->n ? n0 + OUTPUTS_PER_TASK : p->n;
    if (p->activation == ES_SWIGLU) {
        swiglu_task(p, n0);
        return;
    }
    path(p, n0, n1);
    if (p->addend)
        for (int64_t m = 0; m < p->rows; m++)
            for (int64_t n = n0; n < n1; n++)
                p->y[m * p->n + n] += p->addend[m * p->addend_stride + n];
}

/* A task of a SwiGLU product: its 16 stored outputs (8 gates, 8 ups; N is a multiple of 16)
 * into a scratch [rows, 16], then silu(gate) * up into Y [rows, N / 2]. Past 64 rows the
 * scratch is allocated; if that fails, the task's outputs are NaN and it returns -1. */
static int swiglu_task(const Product *p, int64_t n0) {
    float small[16 * 64];
    float *both = p->rows <= 64 ? small : malloc(sizeof(float) * 16 * (size_t)p->rows);
    float *y = p->y + n0 / 2;
    if (!both) {
        for (int64_t m = 0; m < p->rows; m++)
            for (int i = 0; i < 8; i++) y[m * (p->n / 2) + i] = NAN;
        return -1;
    }
    Product task = *p;
    task.y = both - n0, task.n = 16; /* the paths write y[row * n + output] */
    path(&task, n0, n0 + 16);
#ifdef ES_X86
    if (path != outputs_portable)
        es_swiglu_avx2(both, p->rows, y, p->n / 2);
    else
#endif
#ifdef ES_ARM
    if (path != outputs_portable)
        es_swiglu_neon(both, p->rows, y, p->n / 2);
    else
#endif
        es_swiglu_portable(both, p->rows, y, p->n / 2);
    if (both != small) free(both);
    return 0;
}

/* ---- a plain C entry point (tests, benchmarks, the fallback-free reference) ----------- */

ES_EXPORT const char *edgespec_gguf_kernel_path(void) {
    if (!path) path = chosen_path();
#ifdef ES_X86
#ifdef ES_VNNI
    if (path == outputs_avxvnni) return "avx-vnni";
    if (path == outputs_avx512vnni) return "avx512-vnni";
#endif
    if (path == outputs_avx2) return "avx2";
#endif
#ifdef ES_ARM
    if (path == outputs_neon_dotprod) return "neon-dotprod";
    if (path == outputs_neon_plain) return "neon";
#endif
    return "portable";
}

/* The activations as a product of `ggml_type` quantizes them (tests: the AVX2 quantizer
 * against the scalar one): q [rows, k], scale [rows, k / block], sums [rows, k / span].
 * Returns 0, or -1 for an unknown type or a `vectorized` request on the portable path. */
ES_EXPORT int edgespec_gguf_quantize(const float *x, int64_t rows, int64_t k, int ggml_type,
                                     int vectorized, int8_t *q, float *scale, int16_t *sums) {
    if (!block_bytes(ggml_type) || k % block_inputs(ggml_type)) return -1;
    edgespec_gguf_kernel_path();
    if (vectorized && path == outputs_portable) return -1;
    Quantized out;
    if (quantized_rows(x, rows, k, ggml_type, vectorized, &out)) return -1;
    memcpy(q, out.q, (size_t)(rows * k));
    memcpy(scale, out.scale, sizeof(float) * (size_t)(rows * (k / block_inputs(ggml_type))));
    memcpy(sums, out.sums, sizeof(int16_t) * (size_t)(rows * (k / sum_span(ggml_type))));
    free_quantized(&out);
    return 0;
}

/* P's activations: x [rows, k] quantized for P's type (0, or -1 out of memory), in the order
 * P's path reads them. */
static int product_activations(Product *p, const float *x) {
    if (quantized_rows(x, p->rows, p->k, p->ggml_type, path != outputs_portable, &p->x)) return -1;
#if defined(ES_X86) && defined(ES_VNNI)
    if (path == outputs_avx512vnni && es_rows8_zmm_pairs_inputs(p)) es_rows8_pair_inputs(p->x.q, p->rows, p->k);
#endif
    return 0;
}

/* y [rows, n] = x [rows, k] @ W.T, or with `activation` ES_SWIGLU y [rows, n / 2] = SwiGLU
 * of W's alternate groups of 8 gates and ups; returns 0, or -1 for an unsupported type or
 * width. */
ES_EXPORT int edgespec_gguf_matmul(const float *x, const uint8_t *w, float *y, int64_t rows,
                                   int64_t k, int64_t n, int ggml_type, int activation) {
    const int rows8 = ggml_type >= ES_ROWS8;
    if (rows8) ggml_type -= ES_ROWS8;
    if (!block_bytes(ggml_type) || k % block_inputs(ggml_type)) return -1;
    if (rows8 && !es_rows8_supported(ggml_type, n)) return -1;
    edgespec_gguf_kernel_path();
    if (activation == ES_SWIGLU && n % 16) return -1;
    Product p = {ggml_type, k, n, rows, row_bytes(ggml_type, k), w, {NULL, NULL, NULL}, y, NULL, 0, rows8,
                 activation == ES_SWIGLU ? ES_SWIGLU : ES_PLAIN};
    if (product_activations(&p, x)) return -1;
    size_t tasks = (size_t)((n + OUTPUTS_PER_TASK - 1) / OUTPUTS_PER_TASK);
    for (size_t t = 0; t < tasks; t++) run_task(&p, t);
    free_quantized(&p.x);
    return 0;
}

/* ---- the ONNX Runtime operator ------------------------------------------------------ */

typedef struct {
    const OrtApiTable *api;
    int64_t ggml_type, k, n;
    int rows8; /* W in the rows-of-8 layout (the attribute was ggml_type + ES_ROWS8) */
    int activation; /* GgufMatMul's optional attribute `activation`: ES_PLAIN or ES_SWIGLU */
} Kernel;

static const OrtApiTable *ort;

static OrtStatus *fail(const char *message) {
    return ES_ORT_CALL(ort, ES_ORT_SLOT_CREATE_STATUS, es_create_status_fn)(
        ES_ORT_INVALID_ARGUMENT, message);
}

static OrtStatus *create_kernel(const void *op, const OrtApiTable *api, const OrtKernelInfo *info,
                                void **out) {
    (void)op;
    Kernel *kernel = calloc(1, sizeof *kernel);
    if (!kernel) return fail("GgufMatMul: out of memory");
    es_kernel_info_get_attribute_int64_fn attribute = ES_ORT_CALL(
        api, ES_ORT_SLOT_KERNEL_INFO_GET_ATTRIBUTE_INT64, es_kernel_info_get_attribute_int64_fn);
    const char *names[3] = {"ggml_type", "in_features", "out_features"};
    int64_t *fields[3] = {&kernel->ggml_type, &kernel->k, &kernel->n};
    for (int i = 0; i < 3; i++) {
        OrtStatus *status = attribute(info, names[i], fields[i]);
        if (status) {
            free(kernel);
            return status;
        }
    }
    int64_t activation = ES_PLAIN;
    OrtStatus *absent = attribute(info, "activation", &activation);
    if (absent) /* an optional attribute: its absence is ES_PLAIN */
        ES_ORT_CALL(api, ES_ORT_SLOT_RELEASE_STATUS, es_release_status_fn)(absent), activation = ES_PLAIN;
    if (activation != ES_PLAIN && (activation != ES_SWIGLU || kernel->n % 16)) {
        free(kernel);
        return fail("GgufMatMul: activation must be 0 (none) or 1 (SwiGLU, with out_features "
                    "a multiple of 16: gates and ups in alternate groups of 8)");
    }
    kernel->activation = (int)activation;
    if (kernel->ggml_type >= ES_ROWS8) kernel->rows8 = 1, kernel->ggml_type -= ES_ROWS8;
    int type = (int)kernel->ggml_type;
    if (!block_bytes(type) || kernel->k <= 0 || kernel->k % block_inputs(type) || kernel->n <= 0) {
        free(kernel);
        return fail("GgufMatMul/GgufGather: ggml_type must be Q4_0 (2), Q4_1 (3), Q5_0 (6), "
                    "Q5_1 (7), Q8_0 (8), Q2_K (10), Q3_K (11), Q4_K (12), Q5_K (13), Q6_K (14), "
                    "IQ4_NL (20) or IQ4_XS (23), with in_features a multiple of its block (32, or "
                    "256 for the K-quants and IQ4_XS)");
    }
    if (kernel->rows8 && !es_rows8_supported(type, kernel->n)) {
        free(kernel);
        return fail("GgufMatMul/GgufGather: the rows-of-8 layout (ggml_type + 1024) takes "
                    "out_features a multiple of 8");
    }
    kernel->api = api;
    *out = kernel;
    return NULL;
}

/* Both operators' inputs: the first one (X or ids) with its shape, and W; then the output
 * of shape dims[0 .. rank - 1] + [width] (X's last dimension replaced when it is `replace`). */
typedef struct {
    const void *first, *w;
    void *y;
    int64_t dims[8];
    size_t rank;
} Operands;

static OrtStatus *operands(const Kernel *kernel, OrtKernelContext *context, size_t max_rank,
                           int replace, int64_t width, Operands *out) {
    const OrtApiTable *api = kernel->api;
    const OrtValue *first, *w;
    OrtValue *y;
    OrtStatus *status;
    es_kernel_context_get_input_fn input =
        ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_INPUT, es_kernel_context_get_input_fn);
    es_get_tensor_mutable_data_fn data_of =
        ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_MUTABLE_DATA, es_get_tensor_mutable_data_fn);
    if ((status = input(context, 0, &first)) || (status = input(context, 1, &w))) return status;
    OrtTensorTypeAndShapeInfo *info;
    if ((status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_TYPE_AND_SHAPE,
                              es_get_tensor_type_and_shape_fn)(first, &info)))
        return status;
    status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_DIMENSIONS_COUNT, es_get_dimensions_count_fn)(
        info, &out->rank);
    if (!status && (out->rank > max_rank || (replace && out->rank == 0)))
        status = fail("edgespec.gguf: an input has a rank the operator does not take");
    if (!status && out->rank)
        status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_DIMENSIONS, es_get_dimensions_fn)(
            info, out->dims, out->rank);
    ES_ORT_CALL(api, ES_ORT_SLOT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO,
                es_release_tensor_type_and_shape_info_fn)(info);
    if (status) return status;
    size_t output_rank = replace ? out->rank : out->rank + 1;
    if (replace && out->dims[out->rank - 1] != kernel->k)
        return fail("GgufMatMul: X's last dimension is not in_features");
    out->dims[output_rank - 1] = width;
    void *first_data, *w_data;
    if ((status = ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_OUTPUT,
                              es_kernel_context_get_output_fn)(context, 0, out->dims,
                                                               output_rank, &y)) ||
        (status = data_of((OrtValue *)first, &first_data)) ||
        (status = data_of((OrtValue *)w, &w_data)) || (status = data_of(y, &out->y)))
        return status;
    out->first = first_data, out->w = w_data;
    return NULL;
}

/* GgufMatMul's optional input `index`: *data and its element count, or *data NULL when the
 * node leaves it out. */
static OrtStatus *optional_input(const Kernel *kernel, OrtKernelContext *context, size_t index,
                                 void **data, int64_t *elements) {
    const OrtApiTable *api = kernel->api;
    size_t count = 0;
    const OrtValue *value = NULL;
    OrtStatus *status = ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_INPUT_COUNT,
                                    es_kernel_context_get_input_count_fn)(context, &count);
    *data = NULL;
    if (status || count <= index) return status;
    if ((status = ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_INPUT,
                              es_kernel_context_get_input_fn)(context, index, &value)) ||
        !value)
        return status;
    OrtTensorTypeAndShapeInfo *info;
    if ((status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_TYPE_AND_SHAPE,
                              es_get_tensor_type_and_shape_fn)(value, &info)))
        return status;
    size_t count_elements = 0;
    status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_SHAPE_ELEMENT_COUNT,
                         es_get_tensor_shape_element_count_fn)(info, &count_elements);
    ES_ORT_CALL(api, ES_ORT_SLOT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO,
                es_release_tensor_type_and_shape_info_fn)(info);
    if (status) return status;
    *elements = (int64_t)count_elements;
    return ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_MUTABLE_DATA,
                       es_get_tensor_mutable_data_fn)((OrtValue *)value, data);
}

/* GgufMatMul's optional third input: a bias [N] or a residual of Y's shape, added to Y (one
 * kernel instead of a matrix product and an Add). */
static OrtStatus *addend(const Kernel *kernel, OrtKernelContext *context, int64_t rows,
                         Product *p) {
    void *data;
    int64_t elements = 0;
    OrtStatus *status = optional_input(kernel, context, 2, &data, &elements);
    if (status || !data) return status;
    if (elements != kernel->n && elements != rows * kernel->n)
        return fail("GgufMatMul: the addend is neither [out_features] nor Y's shape");
    p->addend = (const float *)data;
    p->addend_stride = elements == kernel->n ? 0 : kernel->n;
    return NULL;
}

/* GgufMatMul's optional fourth input: int64 [K], X's columns in the order W's inputs are
 * stored (x'[.., j] = x[.., order[j]]: a graph that regroups attention heads, where the
 * blocks of W cannot move). *out is the reordered copy, or NULL without the input. */
static OrtStatus *input_order(const Kernel *kernel, OrtKernelContext *context, int64_t rows,
                              const float *x, float **out) {
    void *data;
    int64_t elements = 0;
    OrtStatus *status = optional_input(kernel, context, 3, &data, &elements);
    *out = NULL;
    if (status || !data) return status;
    if (elements != kernel->k) return fail("GgufMatMul: input_order is not [in_features]");
    const int64_t *order = (const int64_t *)data, k = kernel->k;
    for (int64_t j = 0; j < k; j++)
        if (order[j] < 0 || order[j] >= k) return fail("GgufMatMul: input_order is outside X");
    float *ordered = malloc(sizeof(float) * (size_t)(rows * k));
    if (!ordered) return fail("GgufMatMul: out of memory for the reordered activations");
    for (int64_t m = 0; m < rows; m++)
        for (int64_t j = 0; j < k; j++) ordered[m * k + j] = x[m * k + order[j]];
    *out = ordered;
    return NULL;
}

static OrtStatus *compute(void *data, OrtKernelContext *context) {
    const Kernel *kernel = (const Kernel *)data;
    Operands io;
    const int64_t width = kernel->activation == ES_SWIGLU ? kernel->n / 2 : kernel->n;
    OrtStatus *status = operands(kernel, context, 8, 1, width, &io);
    if (status) return status;
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < io.rank; i++) rows *= io.dims[i];
    if (rows == 0) return NULL;
    int type = (int)kernel->ggml_type;
    Product p = {type, kernel->k, kernel->n, rows, row_bytes(type, kernel->k), io.w,
                 {NULL, NULL, NULL}, io.y, NULL, 0, kernel->rows8, kernel->activation};
    if ((status = addend(kernel, context, rows, &p))) return status;
    if (p.addend && p.activation != ES_PLAIN)
        return fail("GgufMatMul: an addend and an activation do not go together");
    const float *x = (const float *)io.first;
    float *ordered = NULL;
    if ((status = input_order(kernel, context, rows, x, &ordered))) return status;
    int failed = product_activations(&p, ordered ? ordered : x);
    free(ordered);
    if (failed) return fail("GgufMatMul: out of memory for the quantized activations");
    size_t tasks = (size_t)((p.n + OUTPUTS_PER_TASK - 1) / OUTPUTS_PER_TASK);
    status = ES_ORT_CALL(kernel->api, ES_ORT_SLOT_KERNEL_CONTEXT_PARALLEL_FOR,
                         es_kernel_context_parallel_for_fn)(context, run_task, tasks, ES_BATCHES,
                                                            &p);
    free_quantized(&p.x);
    return status;
}

/* One row of W as floats: w[i] = d * scale * code - dmin * offset per 16 inputs (K-quants),
 * d * code + m (legacy types). */
static void dequantize_row(const Kernel *kernel, const uint8_t *w, int64_t n, float *out) {
    const int ggml_type = (int)kernel->ggml_type;
    const int64_t k = kernel->k;
    const uint8_t *row = w + (size_t)n * row_bytes(ggml_type, k);
    if (!is_k_quant(ggml_type)) {
        uint8_t scratch[34];
        int8_t code[LEGACY];
        float d, m;
        for (int64_t b = 0; b < k / LEGACY; b++) {
            unpack_legacy(legacy_block(w, ggml_type, kernel->rows8, k, n, b, scratch), ggml_type,
                          code, &d, &m);
            for (int i = 0; i < LEGACY; i++) out[b * LEGACY + i] = d * (float)code[i] + m;
        }
        return;
    }
    Unpacked u;
    for (int64_t b = 0; b < k / QK; b++) {
        if (kernel->rows8)
            es_rows8_unpack_k(w, ggml_type, k, n, b, &u);
        else if (ggml_type == GGML_Q4_K)
            unpack_q4_k(row + b * 144, &u);
        else if (ggml_type == GGML_Q5_K)
            unpack_q5_k(row + b * 176, &u);
        else if (ggml_type == GGML_Q2_K)
            unpack_q2_k(row + b * 84, &u);
        else if (ggml_type == GGML_Q3_K)
            unpack_q3_k(row + b * 110, &u);
        else if (ggml_type == GGML_Q6_K)
            unpack_q6_k(row + b * 210, &u);
        else
            unpack_iq4_xs(row + b * 136, &u);
        const int centre = code_centre(ggml_type);
        for (int i = 0; i < QK; i++) {
            float scale = (float)(int16_t)(u.scale_pair[i / SUB] & 0xFFFF);
            if (centre)
                out[b * QK + i] = u.d * scale * (float)(u.code[i] - centre);
            else
                out[b * QK + i] = u.d * scale * (float)u.code[i] - u.dmin * (float)u.offset[i / SUB];
        }
    }
}

static OrtStatus *gather(void *data, OrtKernelContext *context) {
    const Kernel *kernel = (const Kernel *)data;
    Operands io;
    OrtStatus *status = operands(kernel, context, 7, 0, kernel->k, &io);
    if (status) return status;
    int64_t count = 1;
    for (size_t i = 0; i < io.rank; i++) count *= io.dims[i];
    for (int64_t i = 0; i < count; i++) {
        int64_t id = ((const int64_t *)io.first)[i];
        if (id < 0 || id >= kernel->n) return fail("GgufGather: a token id is outside the table");
        dequantize_row(kernel, (const uint8_t *)io.w, id, (float *)io.y + i * kernel->k);
    }
    return NULL;
}

static void destroy_kernel(void *kernel) { free(kernel); }
static const char *matmul_name(const void *op) { (void)op; return "GgufMatMul"; }
static const char *gather_name(const void *op) { (void)op; return "GgufGather"; }
static const char *op_provider(const void *op) { (void)op; return "CPUExecutionProvider"; }
static int matmul_input_type(const void *op, size_t i) {
    (void)op;
    return i == 1 ? ES_ORT_UINT8 : i == 3 ? ES_ORT_INT64 : ES_ORT_FLOAT;
}
static int gather_input_type(const void *op, size_t i) { (void)op; return i == 0 ? ES_ORT_INT64 : ES_ORT_UINT8; }
static size_t matmul_input_count(const void *op) { (void)op; return 4; }
static size_t gather_input_count(const void *op) { (void)op; return 2; }
static int output_type(const void *op, size_t i) { (void)op, (void)i; return ES_ORT_FLOAT; }
static size_t output_count(const void *op) { (void)op; return 1; }
static int required(const void *op, size_t i) { (void)op, (void)i; return 0; }
static int matmul_input_characteristic(const void *op, size_t i) { (void)op; return i >= 2 ? 1 : 0; }
static int default_memory(const void *op, size_t i) { (void)op, (void)i; return 0; }
static int one(const void *op) { (void)op; return 1; }
static int zero(const void *op) { (void)op; return 0; }

static const OrtCustomOpV16 gguf_matmul_op = {
    16,           NULL,         matmul_name,  op_provider, matmul_input_type, matmul_input_count,
    output_type,  output_count, NULL,         destroy_kernel, matmul_input_characteristic, required,
    default_memory, one,        zero,         one,         zero,              create_kernel,
    compute,
};

static const OrtCustomOpV16 gguf_gather_op = {
    16,           NULL,         gather_name,  op_provider, gather_input_type, gather_input_count,
    output_type,  output_count, NULL,         destroy_kernel, required,       required,
    default_memory, one,        zero,         one,         zero,              create_kernel,
    gather,
};

static OrtCustomOpDomain *domain;

ES_EXPORT OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    const OrtApiTable *api = base->GetApi(ES_ORT_API_VERSION_NEEDED);
    if (!api) return NULL; /* too old a runtime to ask for status: ONNX Runtime reports the op */
    ort = api;
    edgespec_gguf_kernel_path();
    OrtStatus *status;
    if (!domain) {
        if ((status = ES_ORT_CALL(api, ES_ORT_SLOT_CREATE_CUSTOM_OP_DOMAIN,
                                  es_create_custom_op_domain_fn)("edgespec.gguf", &domain)))
            return status;
        es_custom_op_domain_add_fn add =
            ES_ORT_CALL(api, ES_ORT_SLOT_CUSTOM_OP_DOMAIN_ADD, es_custom_op_domain_add_fn);
        if ((status = add(domain, &gguf_matmul_op)) || (status = add(domain, &gguf_gather_op)) ||
            (status = add(domain, &es_cache_attention_op)) ||
            (status = add(domain, &es_cache_attention_half_op)))
            return status;
    }
    return ES_ORT_CALL(api, ES_ORT_SLOT_ADD_CUSTOM_OP_DOMAIN, es_add_custom_op_domain_fn)(options,
                                                                                        domain);
}
