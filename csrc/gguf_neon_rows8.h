/* The rows-of-8 products on NEON, included twice by gguf_neon.c: once with the dot-product
 * instructions, once without. The includer defines
 *   ES_NEON_NAME(name)   the build's function name (name_dotprod, name_plain)
 *   ES_NEON_TARGET       the build's target attribute (empty without dotprod)
 *   ES_DOT_LANE(acc, c, y, lane)
 *                        acc [4 int32] += for each 32-bit lane i: the dot product of c's bytes
 *                        4i .. 4i + 3 with y's bytes 4 lane .. 4 lane + 3 (int8; lane constant)
 *
 * The layout is gguf_rows8.h's: one 256-bit code register of 8 outputs is two 128-bit halves
 * here, outputs 0-3 (half 0) and 4-7 (half 1), so each half's int32 lanes are 4 outputs and
 * the 32 activations of a block are two registers, inputs 0-15 (registers j = 0-3, lane j)
 * and 16-31 (j = 4-7, lane j - 4). Every integer sum is exact, and the float steps are the
 * AVX2 path's, in its order, so the outputs equal the AVX2 path's bit for bit. */

/* Register j of both halves of one 32-input block against rows' activations y0 (inputs
 * 0-15) and y1 (16-31): dot[h] lane i = output 4h + i's integer dot product. */
#define ES_DOT_BLOCK(dot, c, y0, y1)                                                              \
    do {                                                                                          \
        for (int h_ = 0; h_ < 2; h_++) {                                                          \
            int32x4_t s_ = vdupq_n_s32(0);                                                        \
            s_ = ES_DOT_LANE(s_, c[h_][0], y0, 0);                                                \
            s_ = ES_DOT_LANE(s_, c[h_][1], y0, 1);                                                \
            s_ = ES_DOT_LANE(s_, c[h_][2], y0, 2);                                                \
            s_ = ES_DOT_LANE(s_, c[h_][3], y0, 3);                                                \
            s_ = ES_DOT_LANE(s_, c[h_][4], y1, 0);                                                \
            s_ = ES_DOT_LANE(s_, c[h_][5], y1, 1);                                                \
            s_ = ES_DOT_LANE(s_, c[h_][6], y1, 2);                                                \
            s_ = ES_DOT_LANE(s_, c[h_][7], y1, 3);                                                \
            dot[h_] = s_;                                                                         \
        }                                                                                         \
    } while (0)

/* A K-quant product's loops (rows8_q4_k, rows8_q6_k): passes of rows, groups of 8 outputs,
 * super-blocks; `dots` and `offsets` start at 0 in each super-block, `acc` in each group. */
#define ES_NEON_K_LOOP_BEGIN(GROUP)                                                               \
    const int64_t blocks = p->k / QK;                                                             \
    float32x4_t acc[ROWS_PER_PASS][2];                                                            \
    int32x4_t dots[ROWS_PER_PASS][2], offsets[ROWS_PER_PASS][2];                                  \
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {                                     \
        const int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;         \
        for (int64_t g = n0 / 8; g < n1 / 8; g++) {                                               \
            for (int64_t r = 0; r < rows; r++) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);         \
            const uint8_t *group = p->w + (size_t)g * 8 * p->row_bytes;                           \
            for (int64_t b = 0; b < blocks; b++, group += GROUP) {                                \
                for (int line = 0; line < GROUP; line += 64)                                      \
                    __builtin_prefetch(group + ES_ROWS8_PREFETCH_BYTES + line, 0, 3);                     \
                for (int64_t r = 0; r < rows; r++)                                                \
                    dots[r][0] = dots[r][1] = offsets[r][0] = offsets[r][1] = vdupq_n_s32(0);

#define ES_NEON_K_LOOP_END                                                                        \
            }                                                                                     \
            for (int64_t r = 0; r < rows; r++) {                                                  \
                vst1q_f32(p->y + (m0 + r) * p->n + 8 * g, acc[r][0]);                             \
                vst1q_f32(p->y + (m0 + r) * p->n + 8 * g + 4, acc[r][1]);                         \
            }                                                                                     \
        }                                                                                         \
    }

/* Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL: one float step per block of 32 (gguf_rows8_x86.h's
 * rows8_outputs). */
ES_NEON_TARGET static inline __attribute__((always_inline)) void ES_NEON_NAME(rows8_legacy)(
    const Product *p, int64_t n0, int64_t n1, const int codes) {
    const Rows8Layout layout = rows8_layout(p->ggml_type);
    const int64_t blocks = p->k / LEGACY;
    const float centre = p->ggml_type == GGML_Q4_0 ? 8.0f : p->ggml_type == GGML_Q5_0 ? 16.0f : 0.0f;
    const uint8x16_t low4 = vdupq_n_u8(0x0F), fifth = vdupq_n_u8(0x10);
    const int8x16_t values = vld1q_s8(IQ4_VALUES);
    /* signed codes (Q8_0, IQ4_NL's looked-up values): no minimum term */
    const int is_signed = codes == ES_EIGHT_BITS || codes == ES_TABLE_BITS;
    float32x4_t acc[ROWS_PER_PASS][2];
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {
        const int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;
        for (int64_t g = n0 / 8; g < n1 / 8; g++) {
            for (int64_t r = 0; r < rows; r++) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
            const uint8_t *group = p->w + (size_t)g * 8 * p->row_bytes;
            for (int64_t b = 0; b < blocks; b++, group += layout.size) {
                for (int line = 0; line < layout.size; line += 64)
                    __builtin_prefetch(group + ES_ROWS8_PREFETCH_BYTES + line, 0, 3);
                float32x4_t d[2], minimum[2];
                int8x16_t c[2][8]; /* [half][register j]: unsigned (4-, 5-bit) or signed (Q8_0, IQ4_NL) */
                for (int h = 0; h < 2; h++) {
                    d[h] = es_halves4(group + 8 * h);
                    minimum[h] = layout.minimum >= 0 ? es_halves4(group + layout.minimum + 8 * h)
                                                     : vmulq_n_f32(d[h], -centre);
                    const uint8_t *at = group + layout.codes + 16 * h;
                    if (codes == ES_EIGHT_BITS) {
                        for (int j = 0; j < 8; j++) c[h][j] = vld1q_s8((const int8_t *)(at + 32 * j));
                        continue;
                    }
                    for (int j = 0; j < 4; j++) {
                        const uint8x16_t packed = vld1q_u8(at + 32 * j);
                        c[h][j] = vreinterpretq_s8_u8(vandq_u8(packed, low4));
                        c[h][j + 4] = vreinterpretq_s8_u8(vshrq_n_u8(packed, 4));
                    }
                    if (codes == ES_FIVE_BITS) { /* bit j of H's byte to bit 4 of register j's */
                        const uint8x16_t high = vld1q_u8(group + layout.high + 16 * h);
                        for (int j = 0; j < 8; j++)
                            c[h][j] = vorrq_s8(c[h][j], vreinterpretq_s8_u8(vandq_u8(
                                                            vshlq_u8(high, vdupq_n_s8((int8_t)(4 - j))), fifth)));
                    }
                    for (int j = 0; j < 8 && codes == ES_TABLE_BITS; j++)
                        c[h][j] = vqtbl1q_s8(values, vreinterpretq_u8_s8(c[h][j]));
                }
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t row = m0 + r;
                    const int8_t *y = p->x.q + row * p->k + b * LEGACY;
                    const int8x16_t y0 = vld1q_s8(y), y1 = vld1q_s8(y + 16);
                    int32x4_t dot[2];
                    ES_DOT_BLOCK(dot, c, y0, y1);
                    const float scale = p->x.scale[row * blocks + b];
                    for (int h = 0; h < 2; h++) {
                        acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(dot[h]), vmulq_n_f32(d[h], scale));
                        if (!is_signed)
                            acc[r][h] = vfmaq_f32(acc[r][h], minimum[h],
                                                  vdupq_n_f32(scale * (float)p->x.sums[row * blocks + b]));
                    }
                }
            }
            for (int64_t r = 0; r < rows; r++) {
                vst1q_f32(p->y + (m0 + r) * p->n + 8 * g, acc[r][0]);
                vst1q_f32(p->y + (m0 + r) * p->n + 8 * g + 4, acc[r][1]);
            }
        }
    }
}

/* Codes of 32 inputs x 8 outputs: registers j (low nibbles) and j + 4 (high) of both halves. */
ES_NEON_TARGET static inline __attribute__((always_inline)) void ES_NEON_NAME(nibbles)(
    const uint8_t *at, int8x16_t c[2][8]) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++) {
            const uint8x16_t packed = vld1q_u8(at + 32 * j + 16 * h);
            c[h][j] = vreinterpretq_s8_u8(vandq_u8(packed, low4));
            c[h][j + 4] = vreinterpretq_s8_u8(vshrq_n_u8(packed, 4));
        }
}

/* Eight unsigned or signed bytes (one factor per output) as two int32x4: outputs 0-3, 4-7. */
static inline void ES_NEON_NAME(factors)(const uint8_t *eight, int is_signed, int32x4_t out[2]) {
    const int16x8_t wide = is_signed ? vmovl_s8(vld1_s8((const int8_t *)eight))
                                     : vreinterpretq_s16_u16(vmovl_u8(vld1_u8(eight)));
    out[0] = vmovl_s16(vget_low_s16(wide));
    out[1] = vmovl_s16(vget_high_s16(wide));
}

/* Q4_K and Q5_K (`five`, a constant at each call): per sub-block of 32 the integer dots times
 * the 6-bit scales and the minimums times the activations' sums, in 32 bits; one float step
 * per super-block (rows8_q4_k, rows8_q5_k). */
ES_NEON_TARGET static inline __attribute__((always_inline)) void ES_NEON_NAME(rows8_q4_q5_k)(
    const Product *p, int64_t n0, int64_t n1, const int five) {
    const int GROUP = five ? Q5_K_GROUP : Q4_K_GROUP, CHUNK = five ? Q5_K_CHUNK : 128;
    const uint8x16_t fifth = vdupq_n_u8(0x10);
    ES_NEON_K_LOOP_BEGIN(GROUP)
                /* SC[8s + i] and MN[8s + i] (sub-block s, output i), 6 bits each, from their
                 * 96 bytes: low nibbles of SC (SC[q] low, SC[q + 32] high), of MN, then bit
                 * pairs SC[q] >> 4, SC[q + 32] >> 4, MN[q] >> 4, MN[q + 32] >> 4 of byte q. */
                uint8_t scales[64], minimums[64];
                const uint8x16_t low4 = vdupq_n_u8(0x0F), bits45 = vdupq_n_u8(0x30);
                for (int t = 0; t < 2; t++) {
                    const uint8x16_t sc = vld1q_u8(group + Q4_K_FACTORS + 16 * t);
                    const uint8x16_t mn = vld1q_u8(group + Q4_K_FACTORS + 32 + 16 * t);
                    const uint8x16_t hi = vld1q_u8(group + Q4_K_FACTORS + 64 + 16 * t);
                    vst1q_u8(scales + 16 * t, vorrq_u8(vandq_u8(sc, low4), vandq_u8(vshlq_n_u8(hi, 4), bits45)));
                    vst1q_u8(scales + 32 + 16 * t, vorrq_u8(vshrq_n_u8(sc, 4), vandq_u8(vshlq_n_u8(hi, 2), bits45)));
                    vst1q_u8(minimums + 16 * t, vorrq_u8(vandq_u8(mn, low4), vandq_u8(hi, bits45)));
                    vst1q_u8(minimums + 32 + 16 * t, vorrq_u8(vshrq_n_u8(mn, 4), vandq_u8(vshrq_n_u8(hi, 2), bits45)));
                }
                for (int s = 0; s < 8; s++) {
                    int8x16_t c[2][8];
                    const uint8_t *at = group + Q4_K_CODES + CHUNK * s;
                    ES_NEON_NAME(nibbles)(at, c);
                    for (int h = 0; five && h < 2; h++) { /* bit j of H's byte to bit 4 */
                        const uint8x16_t high = vld1q_u8(at + 128 + 16 * h);
                        for (int j = 0; j < 8; j++)
                            c[h][j] = vorrq_s8(c[h][j], vreinterpretq_s8_u8(vandq_u8(
                                                            vshlq_u8(high, vdupq_n_s8((int8_t)(4 - j))), fifth)));
                    }
                    int32x4_t scale[2], minimum[2];
                    ES_NEON_NAME(factors)(scales + 8 * s, 0, scale);
                    ES_NEON_NAME(factors)(minimums + 8 * s, 0, minimum);
                    for (int64_t r = 0; r < rows; r++) {
                        const int64_t row = m0 + r;
                        const int8_t *y = p->x.q + row * p->k + b * QK + 32 * s;
                        const int16_t *sums = p->x.sums + (row * blocks + b) * (QK / SUB) + 2 * s;
                        const int8x16_t y0 = vld1q_s8(y), y1 = vld1q_s8(y + 16);
                        int32x4_t dot[2];
                        ES_DOT_BLOCK(dot, c, y0, y1);
                        for (int h = 0; h < 2; h++) {
                            dots[r][h] = vmlaq_s32(dots[r][h], dot[h], scale[h]);
                            offsets[r][h] = vmlaq_n_s32(offsets[r][h], minimum[h], sums[0] + sums[1]);
                        }
                    }
                }
                const float32x4_t d[2] = {es_halves4(group), es_halves4(group + 8)};
                const float32x4_t dmin[2] = {es_halves4(group + 16), es_halves4(group + 24)};
                for (int64_t r = 0; r < rows; r++) {
                    const float scale = p->x.scale[(m0 + r) * blocks + b];
                    for (int h = 0; h < 2; h++) {
                        acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(dots[r][h]), vmulq_n_f32(d[h], scale));
                        acc[r][h] = vfmsq_f32(acc[r][h], vcvtq_f32_s32(offsets[r][h]), vmulq_n_f32(dmin[h], scale));
                    }
                }
    ES_NEON_K_LOOP_END
}
ES_NEON_TARGET static void ES_NEON_NAME(rows8_q4_k)(const Product *p, int64_t n0, int64_t n1) {
    ES_NEON_NAME(rows8_q4_q5_k)(p, n0, n1, 0);
}
ES_NEON_TARGET static void ES_NEON_NAME(rows8_q5_k)(const Product *p, int64_t n0, int64_t n1) {
    ES_NEON_NAME(rows8_q4_q5_k)(p, n0, n1, 1);
}

/* Q2_K's codes (and Q3_K's low bits) of 32 inputs x 8 outputs from 64 bytes: byte
 * 32q + 4i + t holds registers q, q + 2, q + 4, q + 6 in bit pairs 0, 2, 4, 6. */
ES_NEON_TARGET static inline __attribute__((always_inline)) void ES_NEON_NAME(two_bits)(
    const uint8_t *at, int8x16_t c[2][8]) {
    const uint8x16_t low2 = vdupq_n_u8(3);
    for (int h = 0; h < 2; h++)
        for (int q = 0; q < 2; q++) {
            const uint8x16_t packed = vld1q_u8(at + 32 * q + 16 * h);
            c[h][q] = vreinterpretq_s8_u8(vandq_u8(packed, low2));
            c[h][q + 2] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(packed, 2), low2));
            c[h][q + 4] = vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(packed, 4), low2));
            c[h][q + 6] = vreinterpretq_s8_u8(vshrq_n_u8(packed, 6));
        }
}

/* A chunk of 32 inputs against one row: lower = registers 0-3 (the first sub-block of 16),
 * upper = 4-7, per output half h. */
#define ES_NEON_HALF_DOTS(lower, upper, c, h, y0, y1)                                             \
    do {                                                                                          \
        lower = vdupq_n_s32(0), upper = vdupq_n_s32(0);                                           \
        lower = ES_DOT_LANE(lower, c[h][0], y0, 0);                                               \
        lower = ES_DOT_LANE(lower, c[h][1], y0, 1);                                               \
        lower = ES_DOT_LANE(lower, c[h][2], y0, 2);                                               \
        lower = ES_DOT_LANE(lower, c[h][3], y0, 3);                                               \
        upper = ES_DOT_LANE(upper, c[h][4], y1, 0);                                               \
        upper = ES_DOT_LANE(upper, c[h][5], y1, 1);                                               \
        upper = ES_DOT_LANE(upper, c[h][6], y1, 2);                                               \
        upper = ES_DOT_LANE(upper, c[h][7], y1, 3);                                               \
    } while (0)

/* A chunk of 32 inputs (sub-blocks of 16: 2 chunk, 2 chunk + 1) of super-block b against the
 * pass's rows m0 .. m0 + rows - 1: dots += each half's dot times `first` or `second`, offsets
 * += `low` and `high` times the activations' two sums (Q2_K, Q3_K, Q6_K). */
ES_NEON_TARGET static inline __attribute__((always_inline)) void ES_NEON_NAME(chunk_rows)(
    const Product *p, int64_t m0, int64_t rows, int64_t b, int chunk, int8x16_t c[2][8],
    const int32x4_t first[2], const int32x4_t second[2], const int32x4_t low[2],
    const int32x4_t high[2], int32x4_t dots[][2], int32x4_t offsets[][2]) {
    const int64_t blocks = p->k / QK;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t row = m0 + r;
        const int8_t *y = p->x.q + row * p->k + b * QK + 32 * chunk;
        const int16_t *sums = p->x.sums + (row * blocks + b) * (QK / SUB) + 2 * chunk;
        const int8x16_t y0 = vld1q_s8(y), y1 = vld1q_s8(y + 16);
        for (int h = 0; h < 2; h++) {
            int32x4_t lower, upper;
            ES_NEON_HALF_DOTS(lower, upper, c, h, y0, y1);
            dots[r][h] = vmlaq_s32(vmlaq_s32(dots[r][h], lower, first[h]), upper, second[h]);
            offsets[r][h] = vmlaq_n_s32(vmlaq_n_s32(offsets[r][h], low[h], sums[0]), high[h], sums[1]);
        }
    }
}

/* Q2_K and Q3_K (`three`, a constant at each call): per chunk of 32 inputs the dots of its two
 * sub-blocks of 16 times their scales; Q2_K's minimums (Q3_K: 4 * its scales) times the
 * activations' sums; the float steps of rows8_q2_k and rows8_q3_k. */
ES_NEON_TARGET static inline __attribute__((always_inline)) void ES_NEON_NAME(rows8_q2_q3_k)(
    const Product *p, int64_t n0, int64_t n1, const int three) {
    const int GROUP = three ? Q3_K_GROUP : Q2_K_GROUP;
    const uint8x16_t third = vdupq_n_u8(4), low4 = vdupq_n_u8(0x0F), bits45 = vdupq_n_u8(0x30);
    ES_NEON_K_LOOP_BEGIN(GROUP)
                /* the scales per [sub-block of 16][output] (Q3_K: the value + 32, from the
                 * 6-bit packing of rows8_q4_k's factors) and Q2_K's minimums */
                uint8_t scales[128], minimums[128];
                for (int t = 0; t < 8 && !three; t++) {
                    const uint8x16_t packed = vld1q_u8(group + Q2_K_SCALES + 16 * t);
                    vst1q_u8(scales + 16 * t, vandq_u8(packed, low4));
                    vst1q_u8(minimums + 16 * t, vshrq_n_u8(packed, 4));
                }
                for (int t = 0; t < 2 && three; t++) {
                    const uint8x16_t sc = vld1q_u8(group + Q3_K_FACTORS + 16 * t);
                    const uint8x16_t mn = vld1q_u8(group + Q3_K_FACTORS + 32 + 16 * t);
                    const uint8x16_t hi = vld1q_u8(group + Q3_K_FACTORS + 64 + 16 * t);
                    vst1q_u8(scales + 16 * t, vorrq_u8(vandq_u8(sc, low4), vandq_u8(vshlq_n_u8(hi, 4), bits45)));
                    vst1q_u8(scales + 32 + 16 * t, vorrq_u8(vshrq_n_u8(sc, 4), vandq_u8(vshlq_n_u8(hi, 2), bits45)));
                    vst1q_u8(scales + 64 + 16 * t, vorrq_u8(vandq_u8(mn, low4), vandq_u8(hi, bits45)));
                    vst1q_u8(scales + 96 + 16 * t, vorrq_u8(vshrq_n_u8(mn, 4), vandq_u8(vshrq_n_u8(hi, 2), bits45)));
                }
                for (int chunk = 0; chunk < 8; chunk++) { /* sub-blocks 2 chunk, 2 chunk + 1 */
                    const uint8_t *at = group + (three ? Q3_K_CODES + Q3_K_CHUNK * chunk
                                                       : Q2_K_CODES + Q2_K_CHUNK * chunk);
                    int8x16_t c[2][8];
                    ES_NEON_NAME(two_bits)(at, c);
                    for (int h = 0; three && h < 2; h++) { /* bit j of H's byte to bit 2 */
                        const uint8x16_t high = vld1q_u8(at + 64 + 16 * h);
                        for (int j = 0; j < 8; j++)
                            c[h][j] = vorrq_s8(c[h][j], vreinterpretq_s8_u8(vandq_u8(
                                                            vshlq_u8(high, vdupq_n_s8((int8_t)(2 - j))), third)));
                    }
                    int32x4_t first[2], second[2], low_min[2], high_min[2];
                    ES_NEON_NAME(factors)(scales + 16 * chunk, 0, first);
                    ES_NEON_NAME(factors)(scales + 16 * chunk + 8, 0, second);
                    for (int h = 0; three && h < 2; h++) {
                        first[h] = vsubq_s32(first[h], vdupq_n_s32(32));
                        second[h] = vsubq_s32(second[h], vdupq_n_s32(32));
                    }
                    if (!three) {
                        ES_NEON_NAME(factors)(minimums + 16 * chunk, 0, low_min);
                        ES_NEON_NAME(factors)(minimums + 16 * chunk + 8, 0, high_min);
                    } else {
                        for (int h = 0; h < 2; h++) low_min[h] = first[h], high_min[h] = second[h];
                    }
                    ES_NEON_NAME(chunk_rows)(p, m0, rows, b, chunk, c, first, second, low_min, high_min,
                                             dots, offsets);
                }
                const float32x4_t d[2] = {es_halves4(group), es_halves4(group + 8)};
                const float32x4_t dmin[2] = {es_halves4(group + 16), es_halves4(group + 24)};
                for (int64_t r = 0; r < rows; r++) {
                    const float scale = p->x.scale[(m0 + r) * blocks + b];
                    for (int h = 0; h < 2; h++) {
                        if (three) {
                            const int32x4_t total = vsubq_s32(dots[r][h], vshlq_n_s32(offsets[r][h], 2));
                            acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(total), vmulq_n_f32(d[h], scale));
                        } else {
                            acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(dots[r][h]), vmulq_n_f32(d[h], scale));
                            acc[r][h] = vfmsq_f32(acc[r][h], vcvtq_f32_s32(offsets[r][h]),
                                                  vmulq_n_f32(dmin[h], scale));
                        }
                    }
                }
    ES_NEON_K_LOOP_END
}
ES_NEON_TARGET static void ES_NEON_NAME(rows8_q2_k)(const Product *p, int64_t n0, int64_t n1) {
    ES_NEON_NAME(rows8_q2_q3_k)(p, n0, n1, 0);
}
ES_NEON_TARGET static void ES_NEON_NAME(rows8_q3_k)(const Product *p, int64_t n0, int64_t n1) {
    ES_NEON_NAME(rows8_q2_q3_k)(p, n0, n1, 1);
}

/* Q6_K: unsigned 6-bit codes scaled per 16 inputs; the centre 32 moves into an offset of
 * 32 * scale times the activations' sums per 16 (rows8_q6_k). */
ES_NEON_TARGET static void ES_NEON_NAME(rows8_q6_k)(const Product *p, int64_t n0, int64_t n1) {
    const uint8x16_t bits45 = vdupq_n_u8(0x30);
    ES_NEON_K_LOOP_BEGIN(Q6_K_GROUP)
                for (int chunk = 0; chunk < 8; chunk++) { /* sub-blocks 2 chunk, 2 chunk + 1 */
                    const uint8_t *at = group + Q6_K_CODES + Q6_K_CHUNK * chunk;
                    int8x16_t c[2][8];
                    ES_NEON_NAME(nibbles)(at, c);
                    for (int h = 0; h < 2; h++)
                        for (int half = 0; half < 2; half++) { /* bits 2j, 2j + 1 to bits 4, 5 */
                            const uint8x16_t high = vld1q_u8(at + 128 + 32 * half + 16 * h);
                            int8x16_t *four = c[h] + 4 * half;
                            four[0] = vorrq_s8(four[0], vreinterpretq_s8_u8(vandq_u8(vshlq_n_u8(high, 4), bits45)));
                            four[1] = vorrq_s8(four[1], vreinterpretq_s8_u8(vandq_u8(vshlq_n_u8(high, 2), bits45)));
                            four[2] = vorrq_s8(four[2], vreinterpretq_s8_u8(vandq_u8(high, bits45)));
                            four[3] = vorrq_s8(four[3], vreinterpretq_s8_u8(vandq_u8(vshrq_n_u8(high, 2), bits45)));
                        }
                    int32x4_t first[2], second[2];
                    ES_NEON_NAME(factors)(group + Q6_K_SCALES + 16 * chunk, 1, first);
                    ES_NEON_NAME(factors)(group + Q6_K_SCALES + 16 * chunk + 8, 1, second);
                    ES_NEON_NAME(chunk_rows)(p, m0, rows, b, chunk, c, first, second, first, second,
                                             dots, offsets);
                }
                const float32x4_t d[2] = {es_halves4(group), es_halves4(group + 8)};
                for (int64_t r = 0; r < rows; r++) {
                    const float scale = p->x.scale[(m0 + r) * blocks + b];
                    for (int h = 0; h < 2; h++) {
                        const int32x4_t total = vsubq_s32(dots[r][h], vshlq_n_s32(offsets[r][h], 5));
                        acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(total), vmulq_n_f32(d[h], scale));
                    }
                }
    ES_NEON_K_LOOP_END
}

/* IQ4_XS: per sub-block of 32 the integer dots of the signed values times the scales (the
 * 6-bit value - 32), in 32 bits; one float step per super-block (rows8_iq4_xs). */
ES_NEON_TARGET static void ES_NEON_NAME(rows8_iq4_xs)(const Product *p, int64_t n0, int64_t n1) {
    const int8x16_t values = vld1q_s8(IQ4_VALUES);
    const uint8x16_t low4 = vdupq_n_u8(0x0F), bits45 = vdupq_n_u8(0x30);
    ES_NEON_K_LOOP_BEGIN(IQ4_XS_GROUP)
                /* SC[8s + i] from the 48 bytes: low nibbles (SC[q] low, SC[q + 32] high), then
                 * byte t's bit pairs for SC[t], SC[t + 16], SC[t + 32], SC[t + 48] */
                uint8_t scales[64];
                const uint8x16_t sc0 = vld1q_u8(group + IQ4_XS_SCALES);
                const uint8x16_t sc1 = vld1q_u8(group + IQ4_XS_SCALES + 16);
                const uint8x16_t hi = vld1q_u8(group + IQ4_XS_SCALES + 32);
                vst1q_u8(scales, vorrq_u8(vandq_u8(sc0, low4), vandq_u8(vshlq_n_u8(hi, 4), bits45)));
                vst1q_u8(scales + 16, vorrq_u8(vandq_u8(sc1, low4), vandq_u8(vshlq_n_u8(hi, 2), bits45)));
                vst1q_u8(scales + 32, vorrq_u8(vshrq_n_u8(sc0, 4), vandq_u8(hi, bits45)));
                vst1q_u8(scales + 48, vorrq_u8(vshrq_n_u8(sc1, 4), vandq_u8(vshrq_n_u8(hi, 2), bits45)));
                for (int s = 0; s < 8; s++) {
                    int8x16_t c[2][8];
                    ES_NEON_NAME(nibbles)(group + IQ4_XS_CODES + 128 * s, c);
                    for (int h = 0; h < 2; h++)
                        for (int j = 0; j < 8; j++) c[h][j] = vqtbl1q_s8(values, vreinterpretq_u8_s8(c[h][j]));
                    int32x4_t scale[2];
                    ES_NEON_NAME(factors)(scales + 8 * s, 0, scale);
                    for (int h = 0; h < 2; h++) scale[h] = vsubq_s32(scale[h], vdupq_n_s32(32));
                    for (int64_t r = 0; r < rows; r++) {
                        const int8_t *y = p->x.q + (m0 + r) * p->k + b * QK + 32 * s;
                        const int8x16_t y0 = vld1q_s8(y), y1 = vld1q_s8(y + 16);
                        int32x4_t dot[2];
                        ES_DOT_BLOCK(dot, c, y0, y1);
                        for (int h = 0; h < 2; h++) dots[r][h] = vmlaq_s32(dots[r][h], dot[h], scale[h]);
                    }
                }
                const float32x4_t d[2] = {es_halves4(group), es_halves4(group + 8)};
                for (int64_t r = 0; r < rows; r++) {
                    const float scale = p->x.scale[(m0 + r) * blocks + b];
                    for (int h = 0; h < 2; h++)
                        acc[r][h] = vfmaq_f32(acc[r][h], vcvtq_f32_s32(dots[r][h]), vmulq_n_f32(d[h], scale));
                }
    ES_NEON_K_LOOP_END
}

ES_NEON_TARGET void ES_NEON_NAME(es_rows8_outputs_neon)(const Product *p, int64_t n0, int64_t n1) {
    switch (p->ggml_type) {
    case GGML_Q2_K: ES_NEON_NAME(rows8_q2_k)(p, n0, n1); break;
    case GGML_Q3_K: ES_NEON_NAME(rows8_q3_k)(p, n0, n1); break;
    case GGML_Q4_K: ES_NEON_NAME(rows8_q4_k)(p, n0, n1); break;
    case GGML_Q5_K: ES_NEON_NAME(rows8_q5_k)(p, n0, n1); break;
    case GGML_Q6_K: ES_NEON_NAME(rows8_q6_k)(p, n0, n1); break;
    case GGML_IQ4_XS: ES_NEON_NAME(rows8_iq4_xs)(p, n0, n1); break;
    case GGML_Q8_0: ES_NEON_NAME(rows8_legacy)(p, n0, n1, ES_EIGHT_BITS); break;
    case GGML_IQ4_NL: ES_NEON_NAME(rows8_legacy)(p, n0, n1, ES_TABLE_BITS); break;
    case GGML_Q5_0:
    case GGML_Q5_1: ES_NEON_NAME(rows8_legacy)(p, n0, n1, ES_FIVE_BITS); break;
    default: ES_NEON_NAME(rows8_legacy)(p, n0, n1, ES_FOUR_BITS); break;
    }
}

#undef ES_DOT_BLOCK
#undef ES_NEON_K_LOOP_BEGIN
#undef ES_NEON_K_LOOP_END
