/* GGUF's products with AVX2 over the file's own layout (weights whose outputs do not form
 * groups of 8): Q4_K and Q6_K per super-block, the legacy types four outputs at a time; the
 * other K-quants on the portable reference. */
#include "gguf_common.h"

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

ES_AVX2 void es_file_outputs_avx2(const Product *p, int64_t n0, int64_t n1) {
    if (p->ggml_type == GGML_Q4_K)
        outputs_q4_k_avx2(p, n0, n1);
    else if (p->ggml_type == GGML_Q6_K)
        outputs_q6_k_avx2(p, n0, n1);
    else if (is_k_quant(p->ggml_type)) /* Q2_K, Q3_K, Q5_K, IQ4_XS: in rows of 8 where they can be */
        es_outputs_portable(p, n0, n1);
    else
        outputs_legacy_avx2(p, n0, n1);
}
#endif
