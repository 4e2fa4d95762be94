/* The activations quantized with AVX2: X's rows as int8 per block, the same values as the
 * scalar loop in gguf_kernels.c (the same float operations in the same order, and
 * _mm256_cvtps_epi32 rounds to nearest even as lrintf does under the default rounding mode).
 *
 * Why: the scalar loop took about 10 ns an element on one thread before every product, so a
 * one-token step of the 1.5B (about 400,000 inputs across its products) spent about 4 ms
 * there and each further row of a verify pass or a prefill as much again. */
#include "gguf_common.h"

#ifdef ES_X86

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
