/* The rows-of-8 products on x86-64, included by gguf_x86.c once per instruction set: AVX2
 * (maddubs, 16-bit sums, madd) and the VNNI extensions (dpbusd: 4 byte products summed into
 * each 32-bit lane in one instruction, VEX-encoded as AVX-VNNI or EVEX-encoded as AVX512-VNNI
 * with VL). The includer defines
 *   ES_X86_NAME(name), ES_X86_TARGET    the build's function names and target attribute
 *   ES_DOT_FOUR(dot, c, y)              dot [8 int32] = sum over registers j < 8 of c[j]'s
 *                                       bytes 4i .. 4i + 3 (unsigned, below 16) times y's
 *                                       4j .. 4j + 3 (int8), per lane i
 *   ES_DOT_FIVE(dot, c, y)              the same for 5-bit codes (below 32)
 *   ES_DOT_SIGNED(dot, magnitude, c, y) the same for signed codes (Q8_0's, IQ4_NL's and
 *                                       IQ4_XS's values; |c| in magnitude)
 *   ES_ADD_DOT_SCALED(acc, c, y, scale, scale32)
 *                                       acc + ES_DOT_FOUR times each output's integer scale
 *                                       (scale: 16-bit in both halves of a lane; scale32: 32-bit)
 *   ES_ADD_PAIRS(acc, a, b)             acc + madd(a, b): each lane's two 16-bit products
 *   ES_DOT_HALVES(c, y, first, second, first32, second32)
 *                                       Q6_K's 6-bit codes (or Q5_K's 5-bit ones): registers
 *                                       0-3 times `first`, 4-7 times `second` (16- and 32-bit
 *                                       forms)
 *   ES_DOT_HALVES_SHORT(c, y, first, second, first16, second16)
 *                                       the same where each half's dot fits in 16 bits (Q2_K,
 *                                       Q3_K), first16 and second16 the scales in the low 16
 *                                       bits of each lane, 0 above
 *   ES_LEGACY_SHARED(c)                 declarations from a legacy block's codes c[8] that
 *                                       its rows' ES_DOT forms share (or nothing)
 *   ES_IQ4_UNSIGNED                     1 where ES_DOT_FOUR sums bytes up to 255 exactly
 *                                       (dpbusd): the IQ4 types' codes as unsigned bytes
 *                                       (rows8_outputs, rows8_iq4_xs), else 0
 * Every sum is an exact integer either way, so the builds' outputs are the same bits. */

/* Outputs n0 .. n1 - 1 (multiples of 8) for every row: `codes` is a constant at each call. */
ES_X86_TARGET static inline __attribute__((always_inline)) void ES_X86_NAME(rows8_outputs)(
    const Product *p, int64_t n0, int64_t n1, const int codes) {
    const Rows8Layout layout = rows8_layout(p->ggml_type);
    const int64_t blocks = p->k / LEGACY;
    /* Q4_0 and Q5_0: d * (code - centre) = d * code + (-centre * d), a minimum term. */
    const float centre = p->ggml_type == GGML_Q4_0 ? 8.0f : p->ggml_type == GGML_Q5_0 ? 16.0f : 0.0f;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    /* signed codes (Q8_0, IQ4_NL's looked-up values): no minimum term */
    const int is_signed = codes == EIGHT_BITS || codes == TABLE_BITS;
#if ES_IQ4_UNSIGNED
    /* IQ4_NL with dpbusd: the values + 128 as unsigned codes, the dot less 128 times the
     * activations' sum: the signed form's integer, without moving signs per row */
    const __m256i values = _mm256_xor_si256(iq4_values(), _mm256_set1_epi8((char)0x80));
    const int unsigned_table = codes == TABLE_BITS;
#else
    const __m256i values = iq4_values();
    const int unsigned_table = 0;
#endif
    __m256 acc[ROWS_PER_PASS];
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {
        const int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;
        for (int64_t g = n0 / 8; g < n1 / 8; g++) {
            for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
            const uint8_t *group = p->w + (size_t)g * 8 * p->row_bytes;
            for (int64_t b = 0; b < blocks; b++, group += layout.size) {
                for (int line = 0; line < layout.size; line += 64)
                    _mm_prefetch((const char *)group + ES_ROWS8_PREFETCH_BYTES + line, ES_ROWS8_PREFETCH_HINT);
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)group));
                const __m256 minimum =
                    layout.minimum >= 0
                        ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + layout.minimum)))
                        : _mm256_mul_ps(d, _mm256_set1_ps(-centre));
                /* c[j]: register j's 32 codes, unsigned (4-, 5-bit) or signed (Q8_0, IQ4_NL). */
                __m256i c[8], magnitude[8];
                if (codes == EIGHT_BITS) {
                    for (int j = 0; j < 8; j++) {
                        c[j] = _mm256_loadu_si256((const __m256i *)(group + layout.codes + 32 * j));
                        magnitude[j] = _mm256_sign_epi8(c[j], c[j]);
                    }
                } else {
                    for (int j = 0; j < 4; j++) {
                        __m256i packed =
                            _mm256_loadu_si256((const __m256i *)(group + layout.codes + 32 * j));
                        c[j] = _mm256_and_si256(packed, low4);
                        c[j + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
                    }
                    if (codes == FIVE_BITS) add_fifth_bits(group + layout.high, c);
                    for (int j = 0; j < 8 && codes == TABLE_BITS; j++) {
                        c[j] = _mm256_shuffle_epi8(values, c[j]);
                        if (!unsigned_table) magnitude[j] = _mm256_sign_epi8(c[j], c[j]);
                    }
                }
                ES_LEGACY_SHARED(c)
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t row = m0 + r;
                    const int8_t *y = p->x.q + row * p->k + b * LEGACY;
                    __m256i dot; /* lane i: output 8g + i's integer dot product over the block */
                    if (is_signed && !unsigned_table)
                        ES_DOT_SIGNED(dot, magnitude, c, y);
                    else if (codes == FIVE_BITS)
                        ES_DOT_FIVE(dot, c, y);
                    else
                        ES_DOT_FOUR(dot, c, y);
                    if (unsigned_table)
                        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(128 * p->x.sums[row * blocks + b]));
                    const float scale = p->x.scale[row * blocks + b];
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                             _mm256_mul_ps(d, _mm256_set1_ps(scale)), acc[r]);
                    if (!is_signed)
                        acc[r] = _mm256_fmadd_ps(
                            minimum, _mm256_set1_ps(scale * (float)p->x.sums[row * blocks + b]),
                            acc[r]);
                }
            }
            for (int64_t r = 0; r < rows; r++)
                _mm256_storeu_ps(p->y + (m0 + r) * p->n + 8 * g, acc[r]);
        }
    }
}

#ifndef ES_ROWS8_K_LOOP_BEGIN
/* A K-quant product's loops down to one group block b of group g, for every pass of rows:
 * dots[r] (of type DOTS, zeroed as DOTS_ZERO) and offsets[r] start at zero for each block. */
#define ES_ROWS8_K_LOOP_BEGIN(GROUP) ES_ROWS8_K_LOOP_WITH(GROUP, __m256i, _mm256_setzero_si256())
#define ES_ROWS8_K_LOOP_WITH(GROUP, DOTS, DOTS_ZERO)                                             \
    const int64_t blocks = p->k / QK;                                                            \
    const __m256i ones = _mm256_set1_epi16(1);                                                   \
    (void)ones;                                                                                  \
    __m256 acc[ROWS_PER_PASS];                                                                   \
    DOTS dots[ROWS_PER_PASS];                                                                    \
    __m256i offsets[ROWS_PER_PASS];                                                              \
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {                                    \
        const int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;        \
        for (int64_t g = n0 / 8; g < n1 / 8; g++) {                                              \
            for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();                     \
            const uint8_t *group = p->w + (size_t)g * 8 * p->row_bytes;                          \
            for (int64_t b = 0; b < blocks; b++, group += GROUP) {                               \
                for (int line = 0; line < GROUP; line += 64)                                     \
                    _mm_prefetch((const char *)group + ES_ROWS8_PREFETCH_BYTES + line, ES_ROWS8_PREFETCH_HINT); \
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)group));        \
                for (int64_t r = 0; r < rows; r++) {                                             \
                    dots[r] = DOTS_ZERO;                                                         \
                    offsets[r] = _mm256_setzero_si256();                                         \
                }

#define ES_ROWS8_K_LOOP_END                                                                      \
            }                                                                                    \
            for (int64_t r = 0; r < rows; r++)                                                   \
                _mm256_storeu_ps(p->y + (m0 + r) * p->n + 8 * g, acc[r]);                         \
        }                                                                                        \
    }
#endif

/* Q4_K and Q5_K (`five`, a constant at each call): per sub-block of 32, the 8 outputs' integer
 * dots times their 6-bit scales, summed in 32 bits; the minimums times the activations' sums
 * per 32; one float step per super-block. Q5_K's dots are scaled per register half, as Q6_K's
 * (a lane's 16 products of 5-bit codes can pass 2^15). */
ES_X86_TARGET static inline __attribute__((always_inline)) void ES_X86_NAME(rows8_q4_q5_k)(
    const Product *p, int64_t n0, int64_t n1, const int five) {
    const int GROUP = five ? Q5_K_GROUP : Q4_K_GROUP, CHUNK = five ? Q5_K_CHUNK : 128;
    ES_ROWS8_K_LOOP_BEGIN(GROUP)
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + 16)));
    __m256i scales[2], minimums[2];
    q4_k_group_factors(group + Q4_K_FACTORS, scales, minimums);
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        __m256i c[8];
        if (five)
            q5_k_registers(group + Q4_K_CODES + CHUNK * s, c);
        else
            nibble_registers(group + Q4_K_CODES + CHUNK * s, c);
        const __m256i scale32 = q4_k_sub_block(scales, s);
        /* each output's scale in both 16-bit halves of its lane */
        const __m256i scale = factor_pairs(scale32);
        (void)scale; /* AVX2 multiplies by the 16-bit form, VNNI by scale32 */
        /* MN[8s + i] in both 16-bit halves of lane i, against sub-block s's two sums of 16 */
        const __m256i minimum = factor_pairs(q4_k_sub_block(minimums, s));
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = m0 + r;
            const int8_t *y = p->x.q + row * p->k + b * QK + 32 * s;
            if (five)
                dots[r] = _mm256_add_epi32(dots[r], ES_DOT_HALVES(c, y, scale, scale, scale32, scale32));
            else
                dots[r] = ES_ADD_DOT_SCALED(dots[r], c, y, scale, scale32);
            offsets[r] = ES_ADD_PAIRS(offsets[r], minimum, sums_of(p, row, b, 2 * s));
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const __m256 scale = _mm256_set1_ps(p->x.scale[(m0 + r) * blocks + b]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[r]), _mm256_mul_ps(d, scale), acc[r]);
        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offsets[r]), _mm256_mul_ps(dmin, scale), acc[r]);
    }
    ES_ROWS8_K_LOOP_END
}
ES_X86_TARGET static void ES_X86_NAME(rows8_q4_k)(const Product *p, int64_t n0, int64_t n1) {
    ES_X86_NAME(rows8_q4_q5_k)(p, n0, n1, 0);
}
ES_X86_TARGET static void ES_X86_NAME(rows8_q5_k)(const Product *p, int64_t n0, int64_t n1) {
    ES_X86_NAME(rows8_q4_q5_k)(p, n0, n1, 1);
}

/* Q2_K and Q3_K (`three`, a constant at each call): per chunk of 32 inputs the dots of its two
 * sub-blocks of 16 times their scales (q2_q3_k_chunk); Q2_K's minimums, as Q4_K's, times the
 * activations' sums in a second float step; Q3_K's offsets (4 * scale: the codes are the
 * value + 4) subtracted in 32 bits, as Q6_K's. */
ES_X86_TARGET static inline __attribute__((always_inline)) void ES_X86_NAME(rows8_q2_q3_k)(
    const Product *p, int64_t n0, int64_t n1, const int three) {
    const int GROUP = three ? Q3_K_GROUP : Q2_K_GROUP;
    const __m256i low16 = _mm256_set1_epi32(0xFFFF);
    ES_ROWS8_K_LOOP_BEGIN(GROUP)
    __m256i six[2][2]; /* Q3_K: the 6-bit scales of sub-blocks 0-7 and 8-15 */
    if (three) q4_k_group_factors(group + Q3_K_FACTORS, six[0], six[1]);
#pragma GCC unroll 8
    for (int chunk = 0; chunk < 8; chunk++) {
        __m256i c[8], first32, second32, pair;
        q2_q3_k_chunk(group, chunk, three, six, c, &first32, &second32, &pair);
        const __m256i first16 = _mm256_and_si256(first32, low16), second16 = _mm256_and_si256(second32, low16);
        const __m256i first = signed_pairs(first32), second = signed_pairs(second32);
        (void)first, (void)second, (void)first16, (void)second16; /* AVX2's forms, VNNI's */
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = m0 + r;
            const int8_t *y = p->x.q + row * p->k + b * QK + 32 * chunk;
            dots[r] = _mm256_add_epi32(dots[r], ES_DOT_HALVES_SHORT(c, y, first, second, first16, second16));
            offsets[r] = ES_ADD_PAIRS(offsets[r], pair, sums_of(p, row, b, 2 * chunk));
        }
    }
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + 16)));
    for (int64_t r = 0; r < rows; r++) {
        const __m256 scale = _mm256_set1_ps(p->x.scale[(m0 + r) * blocks + b]);
        if (three) {
            const __m256i total = _mm256_sub_epi32(dots[r], _mm256_slli_epi32(offsets[r], 2));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, scale), acc[r]);
        } else {
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[r]), _mm256_mul_ps(d, scale), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offsets[r]), _mm256_mul_ps(dmin, scale), acc[r]);
        }
    }
    ES_ROWS8_K_LOOP_END
}
ES_X86_TARGET static void ES_X86_NAME(rows8_q2_k)(const Product *p, int64_t n0, int64_t n1) {
    ES_X86_NAME(rows8_q2_q3_k)(p, n0, n1, 0);
}
ES_X86_TARGET static void ES_X86_NAME(rows8_q3_k)(const Product *p, int64_t n0, int64_t n1) {
    ES_X86_NAME(rows8_q2_q3_k)(p, n0, n1, 1);
}

/* Q6_K: unsigned 6-bit codes (the file's code - 32 is its value), scaled per 16 inputs; the
 * 32 moves into an offset of 32 * scale times the activations' sums per 16. */
ES_X86_TARGET static void ES_X86_NAME(rows8_q6_k)(const Product *p, int64_t n0, int64_t n1) {
    ES_ROWS8_K_LOOP_BEGIN(Q6_K_GROUP)
    const uint8_t *scales = group + Q6_K_SCALES;
    for (int chunk = 0; chunk < 8; chunk++) { /* 32 inputs: sub-blocks 2 chunk, 2 chunk + 1 */
        const uint8_t *at = group + Q6_K_CODES + Q6_K_CHUNK * chunk;
        __m256i c[8];
        q6_k_registers(at, c);
        const __m256i first = lane_factors(scales + 16 * chunk, 1);
        const __m256i second = lane_factors(scales + 16 * chunk + 8, 1);
        const __m256i pair = lane_pairs(scales + 16 * chunk, scales + 16 * chunk + 8, 1);
        const __m256i first32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(scales + 16 * chunk)));
        const __m256i second32 =
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(scales + 16 * chunk + 8)));
        (void)first, (void)second, (void)first32, (void)second32; /* 16-bit forms for AVX2 */
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = m0 + r;
            const int8_t *y = p->x.q + row * p->k + b * QK + 32 * chunk;
            const __m256i dot = ES_DOT_HALVES(c, y, first, second, first32, second32);
            dots[r] = _mm256_add_epi32(dots[r], dot);
            offsets[r] = ES_ADD_PAIRS(offsets[r], pair, sums_of(p, row, b, 2 * chunk));
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const __m256 scale = _mm256_set1_ps(p->x.scale[(m0 + r) * blocks + b]);
        const __m256i total = _mm256_sub_epi32(dots[r], _mm256_slli_epi32(offsets[r], 5));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, scale), acc[r]);
    }
    ES_ROWS8_K_LOOP_END
}

/* IQ4_XS: per sub-block of 32 the 8 outputs' integer dots of their values times their scales
 * (the 6-bit value - 32), summed in 32 bits (a dot reaches 32 * 127 * 127, past 16 bits); one
 * float step per super-block. AVX2 multiplies the signed values (their magnitudes against the
 * activations with the values' signs). With VNNI (ES_IQ4_UNSIGNED) the codes are the values +
 * 128, unsigned, which dpbusd sums exactly without moving signs; the 128 returns as an offset
 * of 128 * scale times the activations' sums, as Q6_K's 32 does. The integers are the same. */
ES_X86_TARGET static void ES_X86_NAME(rows8_iq4_xs)(const Product *p, int64_t n0, int64_t n1) {
    const __m256i centre = _mm256_set1_epi32(32);
#if ES_IQ4_UNSIGNED
    const __m256i values = _mm256_xor_si256(iq4_values(), _mm256_set1_epi8((char)0x80));
#else
    const __m256i values = iq4_values();
#endif
    ES_ROWS8_K_LOOP_BEGIN(IQ4_XS_GROUP)
    __m256i six[2];
    iq4_xs_group_scales(group + IQ4_XS_SCALES, six);
    for (int s = 0; s < 8; s++) {
        __m256i c[8], magnitude[8];
        const __m256i scale32 = _mm256_sub_epi32(q4_k_sub_block(six, s), centre);
#if ES_IQ4_UNSIGNED
        nibble_registers(group + IQ4_XS_CODES + 128 * s, c);
        for (int j = 0; j < 8; j++) c[j] = _mm256_shuffle_epi8(values, c[j]);
        const __m256i pair = signed_pairs(scale32); /* against the sub-block's two sums of 16 */
        (void)magnitude;
#else
        iq4_registers(group + IQ4_XS_CODES + 128 * s, values, c, magnitude);
#endif
        for (int64_t r = 0; r < rows; r++) {
            const int8_t *y = p->x.q + (m0 + r) * p->k + b * QK + 32 * s;
            __m256i dot;
#if ES_IQ4_UNSIGNED
            ES_DOT_FOUR_WITH(dot, c, y, ES_DPBUSD);
            offsets[r] = ES_ADD_PAIRS(offsets[r], pair, sums_of(p, m0 + r, b, 2 * s));
#else
            ES_DOT_SIGNED(dot, magnitude, c, y);
#endif
            dots[r] = _mm256_add_epi32(dots[r], _mm256_mullo_epi32(dot, scale32));
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const __m256 scale = _mm256_set1_ps(p->x.scale[(m0 + r) * blocks + b]);
        const __m256i total = _mm256_sub_epi32(dots[r], _mm256_slli_epi32(offsets[r], 7));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, scale), acc[r]);
    }
    ES_ROWS8_K_LOOP_END
}

ES_X86_TARGET void ES_X86_NAME(es_rows8_outputs)(const Product *p, int64_t n0, int64_t n1) {
    switch (p->ggml_type) {
    case GGML_Q2_K: ES_X86_NAME(rows8_q2_k)(p, n0, n1); break;
    case GGML_Q3_K: ES_X86_NAME(rows8_q3_k)(p, n0, n1); break;
    case GGML_Q4_K: ES_X86_NAME(rows8_q4_k)(p, n0, n1); break;
    case GGML_Q5_K: ES_X86_NAME(rows8_q5_k)(p, n0, n1); break;
    case GGML_Q6_K: ES_X86_NAME(rows8_q6_k)(p, n0, n1); break;
    case GGML_IQ4_XS: ES_X86_NAME(rows8_iq4_xs)(p, n0, n1); break;
    case GGML_Q8_0: ES_X86_NAME(rows8_outputs)(p, n0, n1, EIGHT_BITS); break;
    case GGML_IQ4_NL: ES_X86_NAME(rows8_outputs)(p, n0, n1, TABLE_BITS); break;
    case GGML_Q5_0:
    case GGML_Q5_1: ES_X86_NAME(rows8_outputs)(p, n0, n1, FIVE_BITS); break;
    default: ES_X86_NAME(rows8_outputs)(p, n0, n1, FOUR_BITS); break;
    }
}
