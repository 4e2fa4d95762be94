/* GGUF's block types in rows of 8: the file's blocks with
 * their bits moved, none added or dropped, so that one 256-bit register holds 4 codes of each
 * of 8 outputs and a one-row product needs no horizontal sums.
 *
 * Why: in the file's layout each block of 32 codes is one output's, and an integer dot product
 * over it ends in a sum across the register per output; with the 5-bit types' fifth bits
 * spread per block as well, a one-token step spent more time unpacking and folding than
 * reading (Q5_0: 4.6 GB/s on one core). Here the 8 outputs are the 8 lanes of the result, the
 * activations are broadcast 4 bytes at a time, the fifth bits are bit planes a shift away
 * from their place, and the symmetric types' centre (8 or 16) moves into a minimum term, so
 * the codes go into the unsigned side of maddubs as they are.
 *
 * Rows n = 8g .. 8g + 7 form group g: W's bytes [8g * row bytes, 8(g + 1) * row bytes) hold
 * the group's blocks b = 0 .. K/32 - 1 in order, each as one group block of 8 file blocks'
 * bytes:
 *   d[8] (float16: lane i is output 8g + i), m[8] (float16; Q4_1, Q5_1),
 *   fifth bits H[32] (Q5_0, Q5_1), codes: 4 registers of 32 bytes (4- and 5-bit types) or 8
 *   (Q8_0).
 * Code register j (inputs 4j .. 4j + 3 of the block) has byte 4i + t = output i's input
 * 4j + t. The 4- and 5-bit types store registers j and j + 4 as the low and high nibbles of
 * one 32 bytes, and bit j of H's byte 4i + t is the fifth bit of the same code in register j.
 *
 * The K-quants in the same way, 8 super-blocks of 256 inputs per group block (the register
 * layout above for every 32 inputs):
 *   Q4_K (1,152 bytes): d[8], dmin[8] (float16); the 6-bit scales SC and minimums MN of the
 *     8 sub-blocks of 32 as SC[8s + i] (sub-block s, output i) in 96 bytes: low nibbles of SC
 *     (32 bytes: SC[q] low, SC[q + 32] high), of MN (the same), then byte q's bit pairs:
 *     SC[q] >> 4, SC[q + 32] >> 4, MN[q] >> 4, MN[q + 32] >> 4; then the codes, 128 bytes per
 *     sub-block.
 *   Q6_K (1,680 bytes): d[8]; the int8 scales of the 16 sub-blocks of 16 as SC[8s + i] (128
 *     bytes); then per 32 inputs the low nibbles (128 bytes, as Q4_0's) and the high bit
 *     pairs of registers 0-3 and 4-7 (32 bytes each: bits 2j, 2j + 1 for register j mod 4).
 * The importer writes this layout (edgespec.graph.rows8); es_rows8_file_block and
 * es_rows8_unpack_k read one block back out of it. */
#include "gguf_common.h"

int es_rows8_supported(int ggml_type, int64_t n) { return block_bytes(ggml_type) && n % 8 == 0; }

/* Super-block b of output n, unpacked as unpack_q4_k / unpack_q6_k unpack the file's. */
void es_rows8_unpack_k(const uint8_t *w, int ggml_type, int64_t k, int64_t n, int64_t b,
                       Unpacked *u) {
    const int lane = (int)(n % 8), q4 = ggml_type == GGML_Q4_K;
    const uint8_t *group = w + (size_t)(n / 8) * 8 * row_bytes(ggml_type, k) +
                           (size_t)b * (q4 ? Q4_K_GROUP : Q6_K_GROUP);
    u->d = half_to_float(read_u16(group + 2 * lane));
    if (q4) {
        u->dmin = half_to_float(read_u16(group + 16 + 2 * lane));
        const uint8_t *sc = group + Q4_K_FACTORS, *mn = sc + 32, *high = sc + 64;
        for (int s = 0; s < 8; s++) {
            const int q = 8 * s + lane, at = q % 32, upper = q >= 32;
            int scale = upper ? sc[at] >> 4 : sc[at] & 0x0F;
            int minimum = upper ? mn[at] >> 4 : mn[at] & 0x0F;
            scale |= ((high[at] >> (upper ? 2 : 0)) & 3) << 4;
            minimum |= ((high[at] >> (upper ? 6 : 4)) & 3) << 4;
            set_scale(u, 2 * s, scale, minimum);
            set_scale(u, 2 * s + 1, scale, minimum);
        }
        for (int i = 0; i < QK; i++) {
            const int s = i / 32, j = i % 32 / 4, t = i % 4;
            const uint8_t packed = group[Q4_K_CODES + 128 * s + 32 * (j % 4) + 4 * lane + t];
            u->code[i] = j < 4 ? packed & 0x0F : packed >> 4;
        }
        return;
    }
    u->dmin = u->d;
    for (int s = 0; s < SUB; s++) {
        const int scale = (int8_t)group[Q6_K_SCALES + 8 * s + lane];
        set_scale(u, s, scale, 32 * scale);
    }
    for (int i = 0; i < QK; i++) {
        const int c = i / 32, j = i % 32 / 4, at = 4 * lane + i % 4;
        const uint8_t *chunk = group + Q6_K_CODES + Q6_K_CHUNK * c;
        const uint8_t packed = chunk[32 * (j % 4) + at];
        const int high = (chunk[128 + 32 * (j / 4) + at] >> (2 * (j % 4))) & 3;
        u->code[i] = (uint8_t)((j < 4 ? packed & 0x0F : packed >> 4) | high << 4);
    }
}

/* Block b of output n as the file stores it (block_bytes(ggml_type) bytes into out). */
void es_rows8_file_block(const uint8_t *w, int ggml_type, int64_t k, int64_t n, int64_t b,
                         uint8_t *out) {
    const Rows8Layout layout = rows8_layout(ggml_type);
    const int lane = (int)(n % 8);
    const uint8_t *group = w + (size_t)(n / 8) * 8 * row_bytes(ggml_type, k) + (size_t)b * layout.size;
    memcpy(out, group + 2 * lane, 2);
    if (ggml_type == GGML_Q8_0) {
        for (int i = 0; i < LEGACY; i++) out[2 + i] = group[layout.codes + 32 * (i / 4) + 4 * lane + i % 4];
        return;
    }
    if (layout.minimum >= 0) memcpy(out + 2, group + layout.minimum + 2 * lane, 2);
    uint8_t code[LEGACY];
    uint32_t fifth = 0;
    for (int i = 0; i < LEGACY; i++) {
        const int j = i / 4, at = 4 * lane + i % 4;
        const uint8_t packed = group[layout.codes + 32 * (j % 4) + at];
        code[i] = j < 4 ? packed & 0x0F : packed >> 4;
        if (layout.high >= 0) fifth |= (uint32_t)((group[layout.high + at] >> j) & 1) << i;
    }
    const int qs = layout.high >= 0 ? (layout.minimum >= 0 ? 8 : 6) : (layout.minimum >= 0 ? 4 : 2);
    if (layout.high >= 0) memcpy(out + qs - 4, &fifth, 4); /* little-endian, as ggml reads it */
    for (int j = 0; j < 16; j++) out[qs + j] = (uint8_t)(code[j] | (code[j + 16] << 4));
}

#ifdef ES_X86
#include <immintrin.h>

enum { FOUR_BITS, FIVE_BITS, EIGHT_BITS };

/* Four activation bytes (inputs 4j .. 4j + 3) in every 32-bit lane. */
ES_AVX2 static inline __m256i broadcast4(const int8_t *y) {
    int32_t word;
    memcpy(&word, y, 4);
    return _mm256_set1_epi32(word);
}

/* Outputs n0 .. n1 - 1 (multiples of 8) for every row: `codes` is a constant at each call. */
ES_AVX2 static inline __attribute__((always_inline)) void rows8_outputs(
    const Product *p, int64_t n0, int64_t n1, const int codes) {
    const Rows8Layout layout = rows8_layout(p->ggml_type);
    const int64_t blocks = p->k / LEGACY;
    /* Q4_0 and Q5_0: d * (code - centre) = d * code + (-centre * d), a minimum term. */
    const float centre = p->ggml_type == GGML_Q4_0 ? 8.0f : p->ggml_type == GGML_Q5_0 ? 16.0f : 0.0f;
    const __m256i low4 = _mm256_set1_epi8(0x0F), fifth = _mm256_set1_epi8(0x10);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[ROWS_PER_PASS];
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {
        const int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;
        for (int64_t g = n0 / 8; g < n1 / 8; g++) {
            for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
            const uint8_t *group = p->w + (size_t)g * 8 * p->row_bytes;
            for (int64_t b = 0; b < blocks; b++, group += layout.size) {
                for (int line = 0; line < layout.size; line += 64)
                    _mm_prefetch((const char *)group + 2 * layout.size + line, _MM_HINT_T0);
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)group));
                const __m256 minimum =
                    layout.minimum >= 0
                        ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + layout.minimum)))
                        : _mm256_mul_ps(d, _mm256_set1_ps(-centre));
                /* c[j]: register j's 32 codes, unsigned (4-, 5-bit) or signed (Q8_0). */
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
                    if (codes == FIVE_BITS) { /* bit j of H to bit 4 of register j's bytes */
                        const __m256i h = _mm256_loadu_si256((const __m256i *)(group + layout.high));
                        c[0] = _mm256_or_si256(c[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), fifth));
                        c[1] = _mm256_or_si256(c[1], _mm256_and_si256(_mm256_slli_epi16(h, 3), fifth));
                        c[2] = _mm256_or_si256(c[2], _mm256_and_si256(_mm256_slli_epi16(h, 2), fifth));
                        c[3] = _mm256_or_si256(c[3], _mm256_and_si256(_mm256_slli_epi16(h, 1), fifth));
                        c[4] = _mm256_or_si256(c[4], _mm256_and_si256(h, fifth));
                        c[5] = _mm256_or_si256(c[5], _mm256_and_si256(_mm256_srli_epi16(h, 1), fifth));
                        c[6] = _mm256_or_si256(c[6], _mm256_and_si256(_mm256_srli_epi16(h, 2), fifth));
                        c[7] = _mm256_or_si256(c[7], _mm256_and_si256(_mm256_srli_epi16(h, 3), fifth));
                    }
                }
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t row = m0 + r;
                    const int8_t *y = p->x.q + row * p->k + b * LEGACY;
                    __m256i dot; /* lane i: output 8g + i's integer dot product over the block */
                    if (codes == EIGHT_BITS) {
                        dot = _mm256_setzero_si256();
                        for (int j = 0; j < 8; j++) {
                            __m256i pairs = _mm256_maddubs_epi16(
                                magnitude[j], _mm256_sign_epi8(broadcast4(y + 4 * j), c[j]));
                            dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, ones));
                        }
                    } else if (codes == FIVE_BITS) {
                        /* 16-bit sums of 4 registers at most: 4 * 2 * 31 * 127 < 2^15 */
                        __m256i first = _mm256_maddubs_epi16(c[0], broadcast4(y));
                        __m256i second = _mm256_maddubs_epi16(c[4], broadcast4(y + 16));
                        for (int j = 1; j < 4; j++) {
                            first = _mm256_add_epi16(first, _mm256_maddubs_epi16(c[j], broadcast4(y + 4 * j)));
                            second = _mm256_add_epi16(
                                second, _mm256_maddubs_epi16(c[j + 4], broadcast4(y + 16 + 4 * j)));
                        }
                        dot = _mm256_add_epi32(_mm256_madd_epi16(first, ones),
                                               _mm256_madd_epi16(second, ones));
                    } else {
                        /* 16-bit sums of all 8 registers: 8 * 2 * 15 * 127 < 2^15 */
                        __m256i sum = _mm256_maddubs_epi16(c[0], broadcast4(y));
                        for (int j = 1; j < 8; j++)
                            sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(c[j], broadcast4(y + 4 * j)));
                        dot = _mm256_madd_epi16(sum, ones);
                    }
                    const float scale = p->x.scale[row * blocks + b];
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                             _mm256_mul_ps(d, _mm256_set1_ps(scale)), acc[r]);
                    if (codes != EIGHT_BITS)
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

/* Codes of 32 inputs x 8 outputs as 8 registers: 4 registers of nibbles (j low, j + 4 high). */
ES_AVX2 static inline __attribute__((always_inline)) void nibble_registers(const uint8_t *at,
                                                                           __m256i c[8]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        __m256i packed = _mm256_loadu_si256((const __m256i *)(at + 32 * j));
        c[j] = _mm256_and_si256(packed, low4);
        c[j + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    }
}

/* Eight int8 or uint8 factors (one per output) as 16-bit values in both halves of each
 * 32-bit lane: what madd multiplies a pair of 16-bit partial sums by. */
ES_AVX2 static inline __m256i lane_factors(const uint8_t *eight, int is_signed) {
    __m128i bytes = _mm_loadl_epi64((const __m128i *)eight);
    __m256i v = is_signed ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes);
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

/* Two sub-blocks' factors (s, s + 1) as 16-bit pairs per 32-bit lane. */
ES_AVX2 static inline __m256i lane_pairs(const uint8_t *first, const uint8_t *second, int is_signed) {
    __m128i bytes = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)first),
                                      _mm_loadl_epi64((const __m128i *)second));
    return is_signed ? _mm256_cvtepi8_epi16(bytes) : _mm256_cvtepu8_epi16(bytes);
}

/* Two 16-bit activation sums in every 32-bit lane. */
ES_AVX2 static inline __m256i sum_pair(int first, int second) {
    return _mm256_set1_epi32((int)(((uint32_t)(uint16_t)second << 16) | (uint16_t)first));
}

#define ES_ROWS8_K_LOOP_BEGIN(GROUP)                                                            \
    const int64_t blocks = p->k / QK;                                                            \
    const __m256i ones = _mm256_set1_epi16(1);                                                   \
    (void)ones;                                                                                  \
    __m256 acc[ROWS_PER_PASS];                                                                   \
    __m256i dots[ROWS_PER_PASS], offsets[ROWS_PER_PASS];                                         \
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {                                    \
        const int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;        \
        for (int64_t g = n0 / 8; g < n1 / 8; g++) {                                              \
            for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();                     \
            const uint8_t *group = p->w + (size_t)g * 8 * p->row_bytes;                          \
            for (int64_t b = 0; b < blocks; b++, group += GROUP) {                               \
                for (int line = 0; line < GROUP; line += 64)                                     \
                    _mm_prefetch((const char *)group + GROUP + line, _MM_HINT_T0);               \
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)group));        \
                for (int64_t r = 0; r < rows; r++)                                               \
                    dots[r] = offsets[r] = _mm256_setzero_si256();

#define ES_ROWS8_K_LOOP_END                                                                      \
            }                                                                                    \
            for (int64_t r = 0; r < rows; r++)                                                   \
                _mm256_storeu_ps(p->y + (m0 + r) * p->n + 8 * g, acc[r]);                         \
        }                                                                                        \
    }

/* Q4_K: per sub-block of 32, the 8 outputs' integer dots times their 6-bit scales, summed in
 * 32 bits; the minimums times the activations' sums per 32; one float step per super-block. */
ES_AVX2 static void rows8_q4_k(const Product *p, int64_t n0, int64_t n1) {
    ES_ROWS8_K_LOOP_BEGIN(Q4_K_GROUP)
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + 16)));
    /* SC[64], MN[64] (index 8s + i) from their 96 bytes, kept in registers: SC[0..31] in
     * scales[0], SC[32..63] in scales[1]. Through a stack array, each 8-byte read of a
     * 32-byte store cost more (12% of a one-row product in cache). */
    __m256i scales[2], minimums[2];
    {
        const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
        const __m256i sc = _mm256_loadu_si256((const __m256i *)(group + Q4_K_FACTORS));
        const __m256i mn = _mm256_loadu_si256((const __m256i *)(group + Q4_K_FACTORS + 32));
        const __m256i hi = _mm256_loadu_si256((const __m256i *)(group + Q4_K_FACTORS + 64));
        scales[0] = _mm256_or_si256(_mm256_and_si256(sc, low4),
                                    _mm256_and_si256(_mm256_slli_epi16(hi, 4), bits45));
        scales[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(sc, 4), low4),
                                    _mm256_and_si256(_mm256_slli_epi16(hi, 2), bits45));
        minimums[0] = _mm256_or_si256(_mm256_and_si256(mn, low4), _mm256_and_si256(hi, bits45));
        minimums[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(mn, 4), low4),
                                      _mm256_and_si256(_mm256_srli_epi16(hi, 2), bits45));
    }
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        __m256i c[8];
        nibble_registers(group + Q4_K_CODES + 128 * s, c);
        /* bytes 8s' .. 8s' + 15 (s' = s rounded down to even) of SC and MN: the 128-bit half
         * (s & 2) of register s >> 2, sub-block s in its low (s even) or high 8 bytes */
        const __m128i sc16 = (s & 2) ? _mm256_extracti128_si256(scales[s >> 2], 1)
                                     : _mm256_castsi256_si128(scales[s >> 2]);
        const __m256i scale32 = _mm256_cvtepu8_epi32((s & 1) ? _mm_unpackhi_epi64(sc16, sc16) : sc16);
        /* each output's scale in both 16-bit halves of its lane */
        const __m256i scale = _mm256_or_si256(scale32, _mm256_slli_epi32(scale32, 16));
        __m256i minimum_pair = _mm256_setzero_si256(); /* (MN[8s + i], MN[8s + 8 + i]) */
        if (!(s & 1)) {
            const __m128i mn16 = (s & 2) ? _mm256_extracti128_si256(minimums[s >> 2], 1)
                                         : _mm256_castsi256_si128(minimums[s >> 2]);
            minimum_pair = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn16, _mm_srli_si128(mn16, 8)));
        }
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = m0 + r;
            const int8_t *y = p->x.q + row * p->k + b * QK + 32 * s;
            /* 16-bit sums of all 8 registers: 8 * 2 * 15 * 127 < 2^15 */
            __m256i sum = _mm256_maddubs_epi16(c[0], broadcast4(y));
            for (int j = 1; j < 8; j++)
                sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(c[j], broadcast4(y + 4 * j)));
            dots[r] = _mm256_add_epi32(dots[r], _mm256_madd_epi16(sum, scale));
            if (!(s & 1)) { /* the minimums of sub-blocks s and s + 1 against their sums */
                const int16_t *sums = p->x.sums + (row * blocks + b) * (QK / SUB) + 2 * s;
                offsets[r] = _mm256_add_epi32(offsets[r], _mm256_madd_epi16(minimum_pair,
                                              sum_pair(sums[0] + sums[1], sums[2] + sums[3])));
            }
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const __m256 scale = _mm256_set1_ps(p->x.scale[(m0 + r) * blocks + b]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots[r]), _mm256_mul_ps(d, scale), acc[r]);
        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offsets[r]), _mm256_mul_ps(dmin, scale), acc[r]);
    }
    ES_ROWS8_K_LOOP_END
}

/* Q6_K: unsigned 6-bit codes (the file's code - 32 is its value), scaled per 16 inputs; the
 * 32 moves into an offset of 32 * scale times the activations' sums per 16. */
ES_AVX2 static void rows8_q6_k(const Product *p, int64_t n0, int64_t n1) {
    ES_ROWS8_K_LOOP_BEGIN(Q6_K_GROUP)
    const uint8_t *scales = group + Q6_K_SCALES;
    const __m256i bits45 = _mm256_set1_epi8(0x30);
    for (int chunk = 0; chunk < 8; chunk++) { /* 32 inputs: sub-blocks 2 chunk, 2 chunk + 1 */
        const uint8_t *at = group + Q6_K_CODES + Q6_K_CHUNK * chunk;
        __m256i c[8];
        nibble_registers(at, c);
        for (int half = 0; half < 2; half++) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(at + 128 + 32 * half));
            __m256i *four = c + 4 * half; /* bits 2j, 2j + 1 of h to bits 4, 5 of register j */
            four[0] = _mm256_or_si256(four[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45));
            four[1] = _mm256_or_si256(four[1], _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45));
            four[2] = _mm256_or_si256(four[2], _mm256_and_si256(h, bits45));
            four[3] = _mm256_or_si256(four[3], _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45));
        }
        const __m256i first = lane_factors(scales + 16 * chunk, 1);
        const __m256i second = lane_factors(scales + 16 * chunk + 8, 1);
        const __m256i pair = lane_pairs(scales + 16 * chunk, scales + 16 * chunk + 8, 1);
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = m0 + r;
            const int8_t *y = p->x.q + row * p->k + b * QK + 32 * chunk;
            /* 16-bit sums of 2 registers at most: 2 * 2 * 63 * 127 < 2^15 */
            __m256i dot = _mm256_setzero_si256();
            for (int j = 0; j < 8; j += 2) {
                __m256i two = _mm256_add_epi16(_mm256_maddubs_epi16(c[j], broadcast4(y + 4 * j)),
                                               _mm256_maddubs_epi16(c[j + 1], broadcast4(y + 4 * j + 4)));
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(two, j < 4 ? first : second));
            }
            dots[r] = _mm256_add_epi32(dots[r], dot);
            const int16_t *sums = p->x.sums + (row * blocks + b) * (QK / SUB) + 2 * chunk;
            offsets[r] = _mm256_add_epi32(offsets[r],
                                          _mm256_madd_epi16(pair, sum_pair(sums[0], sums[1])));
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const __m256 scale = _mm256_set1_ps(p->x.scale[(m0 + r) * blocks + b]);
        const __m256i total = _mm256_sub_epi32(dots[r], _mm256_slli_epi32(offsets[r], 5));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, scale), acc[r]);
    }
    ES_ROWS8_K_LOOP_END
}

ES_AVX2 void es_rows8_outputs_avx2(const Product *p, int64_t n0, int64_t n1) {
    switch (p->ggml_type) {
    case GGML_Q4_K: rows8_q4_k(p, n0, n1); break;
    case GGML_Q6_K: rows8_q6_k(p, n0, n1); break;
    case GGML_Q8_0: rows8_outputs(p, n0, n1, EIGHT_BITS); break;
    case GGML_Q5_0:
    case GGML_Q5_1: rows8_outputs(p, n0, n1, FIVE_BITS); break;
    default: rows8_outputs(p, n0, n1, FOUR_BITS); break;
    }
}
#endif
