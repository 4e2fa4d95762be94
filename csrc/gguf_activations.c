/* The activations quantized with AVX2: X's rows as int8 per block, the same values as the
 * scalar loop in gguf_kernels.c (the same float operations in the same order, and
 * _mm256_cvtps_epi32 rounds to nearest even as lrintf does under the default rounding mode).
 *
 * Why: the scalar loop runs before every product, on every row of a step, a verify pass or a
 * prefill, and took a measurable share of a step (docs/architecture.md, the GGUF kernels). */
#include "gguf_common.h"

/* SwiGLU's epilogue for one task: `both` [rows, 16] holds 8 gates then their 8 ups per row;
 * y[r * y_stride + i] = silu(gate i) * up i for i < 8. */
void es_swiglu_portable(const float *both, int64_t rows, float *y, int64_t y_stride) {
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < 8; i++) {
            const float gate = both[16 * r + i];
            y[r * y_stride + i] = gate / (1.0f + expf(-gate)) * both[16 * r + 8 + i];
        }
}

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
