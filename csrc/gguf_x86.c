/* GGUF's products on x86-64: the rows-of-8 layout (gguf_rows8.h) with AVX2 (maddubs, 16-bit
 * sums, madd) and, where the compiler knows them, the VNNI forms (dpbusd: AVX-VNNI, and
 * AVX512-VNNI on 256 and 512 bits): gguf_rows8_x86.h included once per instruction set,
 * gguf_rows8_zmm.h for the 512-bit passes. Then the activations quantized with AVX2 (the same
 * values as the portable loop in gguf_reference.c: the same float operations in the same order,
 * and _mm256_cvtps_epi32 rounds to nearest even as lrintf does under the default rounding mode)
 * and SwiGLU's epilogue.
 *
 * Why the quantizer is vectorized: it runs before every product, on every row of a step, a
 * verify pass or a prefill, and took a measurable share of a step (docs/architecture.md, the
 * GGUF kernels). */
#include "gguf_common.h"

#ifdef ES_X86
#include <immintrin.h>

/* A legacy block's codes: 4- or 5-bit (unsigned, a minimum term for the centre), Q8_0's
 * signed bytes, or IQ4_NL's 4-bit indices into IQ4_VALUES (signed once looked up). */
enum { FOUR_BITS, FIVE_BITS, EIGHT_BITS, TABLE_BITS };

/* Four activation bytes (inputs 4j .. 4j + 3) in every 32-bit lane. */
ES_AVX2 static inline __m256i broadcast4(const int8_t *y) {
    int32_t word;
    memcpy(&word, y, 4);
    return _mm256_set1_epi32(word);
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

/* Q6_K's codes of 32 inputs x 8 outputs (6 bits, unsigned) from the chunk at `at`: the low
 * nibbles as Q4_0's, then the high bit pairs of registers 0-3 and 4-7. */
ES_AVX2 static inline __attribute__((always_inline)) void q6_k_registers(const uint8_t *at,
                                                                         __m256i c[8]) {
    const __m256i bits45 = _mm256_set1_epi8(0x30);
    nibble_registers(at, c);
    for (int half = 0; half < 2; half++) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)(at + 128 + 32 * half));
        __m256i *four = c + 4 * half; /* bits 2j, 2j + 1 of h to bits 4, 5 of register j */
        four[0] = _mm256_or_si256(four[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45));
        four[1] = _mm256_or_si256(four[1], _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45));
        four[2] = _mm256_or_si256(four[2], _mm256_and_si256(h, bits45));
        four[3] = _mm256_or_si256(four[3], _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45));
    }
}
/* The fifth bits H (32 bytes at `at`) into 5-bit codes: bit j of H's byte to bit 4 of
 * register j's. */
ES_AVX2 static inline __attribute__((always_inline)) void add_fifth_bits(const uint8_t *at,
                                                                         __m256i c[8]) {
    const __m256i fifth = _mm256_set1_epi8(0x10);
    const __m256i h = _mm256_loadu_si256((const __m256i *)at);
    c[0] = _mm256_or_si256(c[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), fifth));
    c[1] = _mm256_or_si256(c[1], _mm256_and_si256(_mm256_slli_epi16(h, 3), fifth));
    c[2] = _mm256_or_si256(c[2], _mm256_and_si256(_mm256_slli_epi16(h, 2), fifth));
    c[3] = _mm256_or_si256(c[3], _mm256_and_si256(_mm256_slli_epi16(h, 1), fifth));
    c[4] = _mm256_or_si256(c[4], _mm256_and_si256(h, fifth));
    c[5] = _mm256_or_si256(c[5], _mm256_and_si256(_mm256_srli_epi16(h, 1), fifth));
    c[6] = _mm256_or_si256(c[6], _mm256_and_si256(_mm256_srli_epi16(h, 2), fifth));
    c[7] = _mm256_or_si256(c[7], _mm256_and_si256(_mm256_srli_epi16(h, 3), fifth));
}

/* Q5_K's codes of one sub-block of 32 inputs x 8 outputs (5 bits, unsigned) from its chunk
 * at `at`: the nibbles, then the fifth bits. */
ES_AVX2 static inline __attribute__((always_inline)) void q5_k_registers(const uint8_t *at,
                                                                         __m256i c[8]) {
    nibble_registers(at, c);
    add_fifth_bits(at + 128, c);
}
/* 2-bit codes of 32 inputs x 8 outputs from 64 bytes (Q2_K, Q3_K's low bits): byte
 * 32q + 4i + t holds registers q, q + 2, q + 4, q + 6 in bits 0-1, 2-3, 4-5, 6-7. */
ES_AVX2 static inline __attribute__((always_inline)) void two_bit_registers(const uint8_t *at,
                                                                            __m256i c[8]) {
    const __m256i low2 = _mm256_set1_epi8(3);
    for (int q = 0; q < 2; q++) {
        const __m256i packed = _mm256_loadu_si256((const __m256i *)(at + 32 * q));
        c[q] = _mm256_and_si256(packed, low2);
        c[q + 2] = _mm256_and_si256(_mm256_srli_epi16(packed, 2), low2);
        c[q + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low2);
        c[q + 6] = _mm256_and_si256(_mm256_srli_epi16(packed, 6), low2);
    }
}

/* Q3_K's 3-bit codes of one chunk of 32 inputs: the low bits, then bit j of H (32 bytes after
 * them) to bit 2 of register j's bytes. */
ES_AVX2 static inline __attribute__((always_inline)) void q3_k_registers(const uint8_t *at,
                                                                         __m256i c[8]) {
    const __m256i third = _mm256_set1_epi8(4);
    two_bit_registers(at, c);
    const __m256i h = _mm256_loadu_si256((const __m256i *)(at + 64));
    c[0] = _mm256_or_si256(c[0], _mm256_and_si256(_mm256_slli_epi16(h, 2), third));
    c[1] = _mm256_or_si256(c[1], _mm256_and_si256(_mm256_slli_epi16(h, 1), third));
    c[2] = _mm256_or_si256(c[2], _mm256_and_si256(h, third));
    for (int j = 3; j < 8; j++)
        c[j] = _mm256_or_si256(c[j], _mm256_and_si256(_mm256_srli_epi16(h, j - 2), third));
}

/* IQ4_VALUES in both 128-bit halves: what vpshufb looks 4-bit indices up in. */
ES_AVX2 static inline __m256i iq4_values(void) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4_VALUES));
}

/* IQ4_XS's codes of one sub-block of 32 inputs x 8 outputs (signed, looked up from the
 * nibble registers at `at`) and their magnitudes, the unsigned side of the products. */
ES_AVX2 static inline __attribute__((always_inline)) void iq4_registers(const uint8_t *at,
                                                                        __m256i values,
                                                                        __m256i c[8],
                                                                        __m256i magnitude[8]) {
    nibble_registers(at, c);
    for (int j = 0; j < 8; j++) {
        c[j] = _mm256_shuffle_epi8(values, c[j]);
        magnitude[j] = _mm256_sign_epi8(c[j], c[j]);
    }
}

/* IQ4_XS's 64 six-bit scales SC[8s + i] from their 48 bytes at `factors` as bytes in
 * registers, SC[0..31] in scales[0] and SC[32..63] in scales[1] (q4_k_sub_block's form): the
 * 16 bytes of bit pairs serve both 128-bit halves, pairs 0 and 1 (or 2 and 3) by half. */
ES_AVX2 static inline __attribute__((always_inline)) void iq4_xs_group_scales(
    const uint8_t *factors, __m256i scales[2]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    const __m256i sc = _mm256_loadu_si256((const __m256i *)factors);
    const __m256i hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(factors + 32)));
    const __m256i first = _mm256_blend_epi32(_mm256_slli_epi16(hi, 4), _mm256_slli_epi16(hi, 2), 0xF0);
    const __m256i second = _mm256_blend_epi32(hi, _mm256_srli_epi16(hi, 2), 0xF0);
    scales[0] = _mm256_or_si256(_mm256_and_si256(sc, low4), _mm256_and_si256(first, bits45));
    scales[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(sc, 4), low4),
                                _mm256_and_si256(second, bits45));
}

/* Eight signed 32-bit factors as 16-bit values in both halves of each lane (madd's form). */
ES_AVX2 static inline __m256i signed_pairs(__m256i factors) {
    return _mm256_or_si256(_mm256_and_si256(factors, _mm256_set1_epi32(0xFFFF)),
                           _mm256_slli_epi32(factors, 16));
}

/* The 6-bit arrays SC[64] and MN[64] (index 8s + i: sub-block s, output i; Q4_K's scales and
 * minimums, Q3_K's scales of sub-blocks 0-7 and 8-15) from their 96 bytes at `factors`, as
 * bytes in registers: SC[0..31] in scales[0], SC[32..63] in scales[1], MN the same. Through a
 * stack array, each 8-byte read of a 32-byte store costs more (a store-forwarding stall). */
ES_AVX2 static inline __attribute__((always_inline)) void q4_k_group_factors(
    const uint8_t *factors, __m256i scales[2], __m256i minimums[2]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    const __m256i sc = _mm256_loadu_si256((const __m256i *)factors);
    const __m256i mn = _mm256_loadu_si256((const __m256i *)(factors + 32));
    const __m256i hi = _mm256_loadu_si256((const __m256i *)(factors + 64));
    scales[0] = _mm256_or_si256(_mm256_and_si256(sc, low4),
                                _mm256_and_si256(_mm256_slli_epi16(hi, 4), bits45));
    scales[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(sc, 4), low4),
                                _mm256_and_si256(_mm256_slli_epi16(hi, 2), bits45));
    minimums[0] = _mm256_or_si256(_mm256_and_si256(mn, low4), _mm256_and_si256(hi, bits45));
    minimums[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(mn, 4), low4),
                                  _mm256_and_si256(_mm256_srli_epi16(hi, 2), bits45));
}
/* Sub-block s's 8 factors (SC or MN, as q4_k_group_factors leaves them) as 32-bit lanes: bytes
 * 8s .. 8s + 7 are in the 128-bit half (s & 2) of register s >> 2, low (s even) or high. */
ES_AVX2 static inline __attribute__((always_inline)) __m256i q4_k_sub_block(const __m256i factors[2],
                                                                            int s) {
    const __m128i half = (s & 2) ? _mm256_extracti128_si256(factors[s >> 2], 1)
                                 : _mm256_castsi256_si128(factors[s >> 2]);
    return _mm256_cvtepu8_epi32((s & 1) ? _mm_unpackhi_epi64(half, half) : half);
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

/* A row's activation sums of 16 inputs `span` and `span` + 1 of K-quant block b, as the
 * 16-bit halves of every 32-bit lane (one 4-byte load: they are adjacent). */
ES_AVX2 static inline __m256i sums_of(const Product *p, int64_t row, int64_t b, int span) {
    int32_t pair;
    memcpy(&pair, p->x.sums + (row * (p->k / QK) + b) * (QK / SUB) + span, 4);
    return _mm256_set1_epi32(pair);
}
/* Each output's 16-bit factor (below 2^15) in both halves of its 32-bit lane. */
ES_AVX2 static inline __m256i factor_pairs(__m256i factors) {
    return _mm256_or_si256(factors, _mm256_slli_epi32(factors, 16));
}

/* Q2_K's or Q3_K's chunk of 32 inputs (its sub-blocks of 16: 2 chunk, 2 chunk + 1): the codes
 * c[8]; each sub-block's scale per output as 32-bit lanes (first32, second32; Q3_K's the
 * value - 32, signed); the offset factors of the two sub-blocks as a 16-bit pair per lane,
 * against the activations' two sums (Q2_K: its minimums; Q3_K: its scales, the offset being
 * 4 * scale). six: Q3_K's scales as q4_k_group_factors leaves them. */
ES_AVX2 static inline __attribute__((always_inline)) void q2_q3_k_chunk(
    const uint8_t *group, int chunk, const int three, const __m256i six[2][2], __m256i c[8],
    __m256i *first32, __m256i *second32, __m256i *pair) {
    if (three) {
        const __m256i centre = _mm256_set1_epi32(32);
        q3_k_registers(group + Q3_K_CODES + Q3_K_CHUNK * chunk, c);
        const __m256i *factors = six[chunk >= 4];
        *first32 = _mm256_sub_epi32(q4_k_sub_block(factors, (2 * chunk) % 8), centre);
        *second32 = _mm256_sub_epi32(q4_k_sub_block(factors, (2 * chunk + 1) % 8), centre);
        *pair = _mm256_or_si256(_mm256_and_si256(*first32, _mm256_set1_epi32(0xFFFF)),
                                _mm256_slli_epi32(*second32, 16));
        return;
    }
    const __m128i low4 = _mm_set1_epi8(0x0F);
    two_bit_registers(group + Q2_K_CODES + Q2_K_CHUNK * chunk, c);
    /* [sub-block 2 chunk: outputs 0-7][2 chunk + 1: 0-7], scale low, minimum high */
    const __m128i packed = _mm_loadu_si128((const __m128i *)(group + Q2_K_SCALES + 16 * chunk));
    const __m128i scales = _mm_and_si128(packed, low4);
    const __m128i minimums = _mm_and_si128(_mm_srli_epi16(packed, 4), low4);
    *first32 = _mm256_cvtepu8_epi32(scales);
    *second32 = _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(scales, scales));
    *pair = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(minimums, _mm_unpackhi_epi64(minimums, minimums)));
}

/* ---- the products, once per instruction set (gguf_rows8_x86.h) --------------------------- */

/* dot = sum over registers j < 8 of DPBUSD's 4 byte products per lane, in 4 independent
 * chains (dpbusd's latency, not its throughput, would bound one chain). */
#define ES_DOT_FOUR_WITH(dot, c, y, DPBUSD)                                                       \
    do {                                                                                          \
        __m256i chain_[4];                                                                        \
        for (int j_ = 0; j_ < 4; j_++)                                                            \
            chain_[j_] = DPBUSD(_mm256_setzero_si256(), c[j_], broadcast4(y + 4 * j_));           \
        for (int j_ = 4; j_ < 8; j_++)                                                            \
            chain_[j_ - 4] = DPBUSD(chain_[j_ - 4], c[j_], broadcast4(y + 4 * j_));               \
        dot = _mm256_add_epi32(_mm256_add_epi32(chain_[0], chain_[1]),                            \
                               _mm256_add_epi32(chain_[2], chain_[3]));                           \
    } while (0)
#define ES_DOT_SIGNED_WITH(dot, magnitude, c, y, DPBUSD)                                          \
    do {                                                                                          \
        dot = _mm256_setzero_si256();                                                             \
        for (int j_ = 0; j_ < 8; j_++)                                                            \
            dot = DPBUSD(dot, magnitude[j_], _mm256_sign_epi8(broadcast4(y + 4 * j_), c[j_]));    \
    } while (0)

/* AVX2: byte products in pairs (maddubs), summed in 16 bits while they cannot overflow, then
 * to 32 bits by madd (by ones, or by each output's scale where one applies). */
ES_AVX2 static inline __m256i sum16_avx2(const __m256i *c, const int8_t *y, int count) {
    __m256i sum = _mm256_maddubs_epi16(c[0], broadcast4(y));
    for (int j = 1; j < count; j++)
        sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(c[j], broadcast4(y + 4 * j)));
    return sum;
}
/* dpbusd in AVX2: one register's 4 byte products per lane, in 32 bits. */
ES_AVX2 static inline __m256i dpbusd_avx2(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

#define ES_LEGACY_SHARED(c)
#define ES_IQ4_UNSIGNED 0
#define ES_X86_NAME(name) name##_avx2
#define ES_X86_TARGET ES_AVX2
/* 8 * 2 * 15 * 127 < 2^15: all 8 registers in 16 bits */
#define ES_DOT_FOUR(dot, c, y) dot = _mm256_madd_epi16(sum16_avx2(c, y, 8), _mm256_set1_epi16(1))
/* 4 * 2 * 31 * 127 < 2^15: 4 registers at a time */
#define ES_DOT_FIVE(dot, c, y)                                                                    \
    dot = _mm256_add_epi32(_mm256_madd_epi16(sum16_avx2(c, y, 4), _mm256_set1_epi16(1)),          \
                           _mm256_madd_epi16(sum16_avx2(c + 4, y + 16, 4), _mm256_set1_epi16(1)))
#define ES_DOT_SIGNED(dot, magnitude, c, y) ES_DOT_SIGNED_WITH(dot, magnitude, c, y, dpbusd_avx2)
#define ES_ADD_DOT_SCALED(acc, c, y, scale, scale32) _mm256_add_epi32(acc, _mm256_madd_epi16(sum16_avx2(c, y, 8), scale))
#define ES_ADD_PAIRS(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
/* 2 * 2 * 63 * 127 < 2^15: 2 registers at a time */
#define ES_DOT_HALVES(c, y, first, second, first32, second32)                                     \
    _mm256_add_epi32(                                                                             \
        _mm256_add_epi32(_mm256_madd_epi16(sum16_avx2(c, y, 2), first),                           \
                         _mm256_madd_epi16(sum16_avx2(c + 2, y + 8, 2), first)),                  \
        _mm256_add_epi32(_mm256_madd_epi16(sum16_avx2(c + 4, y + 16, 2), second),                 \
                         _mm256_madd_epi16(sum16_avx2(c + 6, y + 24, 2), second)))
#define ES_DOT_HALVES_SHORT(c, y, first, second, first16, second16)                               \
    ES_DOT_HALVES(c, y, first, second, first16, second16)
#include "gguf_rows8_x86.h"
#undef ES_X86_NAME
#undef ES_X86_TARGET
#undef ES_DOT_FOUR
#undef ES_DOT_FIVE
#undef ES_DOT_SIGNED
#undef ES_ADD_DOT_SCALED
#undef ES_ADD_PAIRS
#undef ES_DOT_HALVES
#undef ES_DOT_HALVES_SHORT
#undef ES_IQ4_UNSIGNED

#ifdef ES_VNNI
#define ES_IQ4_UNSIGNED 1
/* VNNI: dpbusd adds a register's 4 byte products per lane into 32 bits in one instruction,
 * and the scales multiply the 32-bit sums: the same integers as AVX2's. */
#define ES_DOT_FOUR(dot, c, y) ES_DOT_FOUR_WITH(dot, c, y, ES_DPBUSD)
#define ES_DOT_FIVE(dot, c, y) ES_DOT_FOUR_WITH(dot, c, y, ES_DPBUSD)
#define ES_DOT_SIGNED(dot, magnitude, c, y) ES_DOT_SIGNED_WITH(dot, magnitude, c, y, ES_DPBUSD)
/* dpwssd multiplies each lane's low 16 bits by the scale's (its high half is 0) and adds in
 * one instruction, where mullo took two: exact while a lane's dot fits in 16 bits, as dot4's 16
 * products of 4-bit codes do (16 * 15 * 127 < 2^15). Chained from zero, then one add: a chain
 * through the accumulator itself made a one-row pass wait on dpwssd's latency. */
#define ES_ADD_DOT_SCALED(acc, c, y, scale, scale32)                                              \
    _mm256_add_epi32(acc, ES_DPWSSD(ES_DPWSSD(_mm256_setzero_si256(), ES_X86_NAME(dot4)(c, y), scale32), \
                                    ES_X86_NAME(dot4)(c + 4, y + 16), scale32))
#define ES_ADD_PAIRS(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#define ES_DOT_HALVES(c, y, first, second, first32, second32)                                     \
    _mm256_add_epi32(_mm256_mullo_epi32(ES_X86_NAME(dot4)(c, y), first32),                        \
                     _mm256_mullo_epi32(ES_X86_NAME(dot4)(c + 4, y + 16), second32))
/* Where a half's dot fits in 16 bits (Q2_K's and Q3_K's codes: 16 * 7 * 128 < 2^15), by
 * dpwssd as ES_ADD_DOT_SCALED: first16 and second16 hold each scale in a lane's low 16 bits,
 * the high ones 0. */
#define ES_DOT_HALVES_SHORT(c, y, first, second, first16, second16)                               \
    ES_DPWSSD(ES_DPWSSD(_mm256_setzero_si256(), ES_X86_NAME(dot4)(c, y), first16),                \
              ES_X86_NAME(dot4)(c + 4, y + 16), second16)
/* Registers j < 4 (inputs 4j .. 4j + 3 of y) and all 8, summed per lane in 32 bits, in
 * independent chains. */
#define ES_VNNI_HELPERS                                                                           \
    ES_X86_TARGET static inline __m256i ES_X86_NAME(dot4)(const __m256i *c, const int8_t *y) {    \
        __m256i even = ES_DPBUSD(_mm256_setzero_si256(), c[0], broadcast4(y));                    \
        __m256i odd = ES_DPBUSD(_mm256_setzero_si256(), c[1], broadcast4(y + 4));                 \
        even = ES_DPBUSD(even, c[2], broadcast4(y + 8));                                          \
        odd = ES_DPBUSD(odd, c[3], broadcast4(y + 12));                                           \
        return _mm256_add_epi32(even, odd);                                                       \
    }                                                                                             \
    ES_X86_TARGET static inline __m256i ES_X86_NAME(dot8)(const __m256i *c, const int8_t *y) {    \
        return _mm256_add_epi32(ES_X86_NAME(dot4)(c, y), ES_X86_NAME(dot4)(c + 4, y + 16));       \
    }

#define ES_X86_NAME(name) name##_avxvnni
#define ES_X86_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define ES_DPBUSD _mm256_dpbusd_avx_epi32
#define ES_DPWSSD _mm256_dpwssd_avx_epi32
ES_VNNI_HELPERS
#include "gguf_rows8_x86.h"
#undef ES_X86_NAME
#undef ES_X86_TARGET
#undef ES_DPBUSD
#undef ES_DPWSSD

#define ES_X86_NAME(name) name##_avx512vnni
#define ES_X86_TARGET __attribute__((target("avx2,fma,f16c,avx512vnni,avx512vl")))
#define ES_DPBUSD _mm256_dpbusd_epi32
#define ES_DPWSSD _mm256_dpwssd_epi32
ES_VNNI_HELPERS
#include "gguf_rows8_x86.h"
#undef ES_X86_NAME
#undef ES_X86_TARGET
#undef ES_DOT_FOUR
#undef ES_DOT_FIVE
#undef ES_LEGACY_SHARED
#include "gguf_rows8_zmm.h"
/* The legacy 4- and 5-bit types' several-row passes with 512-bit dpbusd: each block's codes
 * as 4 zmm pairs (shared by the rows), each row's dot in 4 products and one sum of lane pairs
 * (Q8_0's signed codes and the K-quants as in the 256-bit build above). */
#define ES_X86_NAME(name) name##_avx512vnni_rows
#define ES_X86_TARGET ES_ZMM
#define ES_LEGACY_SHARED(c)                                                                      \
    const __m512i zc[4] = {interleave_pair(c[0], c[1]), interleave_pair(c[2], c[3]),            \
                           interleave_pair(c[4], c[5]), interleave_pair(c[6], c[7])};           \
    (void)zc;
#define ES_DOT_FOUR(dot, c, y) dot = pair_sums(ZMM_DOT_EIGHT(zc, y))
#define ES_DOT_FIVE(dot, c, y) dot = pair_sums(ZMM_DOT_EIGHT(zc, y))
ES_VNNI_HELPERS
#include "gguf_rows8_x86.h"
#endif

/* ---- the activations ---------------------------------------------------------------- */

/* The largest of 8 floats. */
ES_AVX2 static inline float max8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* The sum of 8 int32 lanes (at most 32 * 127: exact). */
ES_AVX2 static inline int sum8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* e^x for 8 floats (Cephes' expf: x = n ln 2 + r, |r| <= ln 2 / 2, a degree-7 polynomial in
 * r, then 2^n from the exponent bits); relative error about 2e-7. x is clamped to
 * [-87.3, 88.3], where 2^n stays a normal float. */
ES_AVX2 static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln 2 in two parts */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 poly = _mm256_set1_ps(1.9875691500e-4f);
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.3981999507e-3f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(8.3334519073e-3f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(4.1665795894e-2f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.6666665459e-1f));
    poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(5.0000001201e-1f));
    poly = _mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i two_n = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(poly, _mm256_castsi256_ps(two_n));
}

/* es_swiglu_portable with 8 lanes at once. */
ES_AVX2 void es_swiglu_avx2(const float *both, int64_t rows, float *y, int64_t y_stride) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int64_t r = 0; r < rows; r++) {
        const __m256 gate = _mm256_loadu_ps(both + 16 * r);
        const __m256 up = _mm256_loadu_ps(both + 16 * r + 8);
        const __m256 silu = _mm256_div_ps(gate, _mm256_add_ps(one, exp8(_mm256_xor_ps(gate, sign))));
        _mm256_storeu_ps(y + r * y_stride, _mm256_mul_ps(silu, up));
    }
}

/* block: 32 or 256 inputs; span: 16 or 32 (both multiples of 16 dividing 32). */
ES_AVX2 void es_quantize_rows_avx2(const float *x, int64_t rows, int64_t k, int64_t block,
                                   int64_t span, Quantized *out) {
    const __m256 magnitude_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    /* dword order after the two packs: [i0 0-3, i1 0-3, i2 0-3, i3 0-3 | i0 4-7, ...] */
    const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i lowest = _mm256_set1_epi8(-127);
    const int64_t blocks = k / block, spans = k / span;
    for (int64_t m = 0; m < rows; m++) {
        for (int64_t b = 0; b < blocks; b++) {
            const float *v = x + m * k + b * block;
            int8_t *q = out->q + m * k + b * block;
            __m256 top = _mm256_setzero_ps();
            for (int64_t i = 0; i < block; i += 8)
                top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(v + i), magnitude_mask));
            const float amax = max8(top);
            const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
            out->scale[m * blocks + b] = amax / 127.0f;
            const __m256 by = _mm256_set1_ps(inverse);
            for (int64_t i = 0; i < block; i += 32) {
                __m256i n[4]; /* inputs i + 8j .. i + 8j + 7 as int32 in [-127, 127] */
                for (int j = 0; j < 4; j++)
                    n[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8 * j), by));
                __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]),
                                                   _mm256_packs_epi32(n[2], n[3]));
                bytes = _mm256_max_epi8(_mm256_permutevar8x32_epi32(bytes, in_order), lowest);
                _mm256_storeu_si256((__m256i *)(q + i), bytes);
                int16_t *sums = out->sums + m * spans + (b * block + i) / span;
                if (span == 16) {
                    sums[0] = (int16_t)sum8(_mm256_add_epi32(n[0], n[1]));
                    sums[1] = (int16_t)sum8(_mm256_add_epi32(n[2], n[3]));
                } else {
                    sums[0] = (int16_t)sum8(_mm256_add_epi32(_mm256_add_epi32(n[0], n[1]),
                                                             _mm256_add_epi32(n[2], n[3])));
                }
            }
        }
    }
}
#endif
