/* CacheAttention's block functions with AVX2 + FMA (included by cache_attention.c, after the
 * portable ones): the scores, exponentials and weighted values of one block of positions, a
 * float16 block widened and floats rounded to float16. */
#ifdef ES_X86
/* Four 8-lane sums to four floats, each as ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)):
 * the same for every dot product, whichever others share the call. */
ES_AVX2 static inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 e) {
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, e));
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

/* One tile of scores: `heads` query heads (q [heads, d]) by `positions` key rows from j
 * (rows past n read row j and are not stored), heads x positions a multiple of 4. Each score
 * is an 8-lane FMA chain over d in order, then reduce4, then times scale: the same arithmetic
 * in every tile shape, so a score's bits do not depend on which heads share its tile. */
ES_AVX2 static inline __attribute__((always_inline)) void score_tile(
    const float *q, const float *k, int64_t j, int64_t n, int64_t d, __m128 factor, float *out,
    int64_t stride, const int heads, const int positions) {
    const float *rows[4];
    for (int p = 0; p < positions; p++) rows[p] = k + (j + p < n ? j + p : j) * d;
    __m256 acc[8];
    for (int t = 0; t < heads * positions; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) {
        __m256 c[4];
        for (int p = 0; p < positions; p++) c[p] = _mm256_loadu_ps(rows[p] + i);
        for (int h = 0; h < heads; h++) {
            const __m256 x = _mm256_loadu_ps(q + h * d + i);
            for (int p = 0; p < positions; p++)
                acc[h * positions + p] = _mm256_fmadd_ps(x, c[p], acc[h * positions + p]);
        }
    }
    float s[8]; /* [heads, positions] */
    for (int t = 0; t < heads * positions; t += 4)
        _mm_storeu_ps(s + t, _mm_mul_ps(reduce4(acc[t], acc[t + 1], acc[t + 2], acc[t + 3]), factor));
    for (int h = 0; h < heads; h++)
        for (int p = 0; p < positions && j + p < n; p++) out[h * stride + j + p] = s[h * positions + p];
}

/* Scores of `group` query heads against n positions of k [n, d] (d a multiple of 8):
 * out[g * stride + j]. Four heads by two positions at a time (each key row read once per four
 * heads); the heads left over by two by four positions, a last one by four positions, so no
 * tile computes a head twice (groups of 6, 7 and 3 would otherwise pay 33%, 14% and 33%). */
ES_AVX2 static void scores_avx2(const float *q, int64_t group, const float *k, int64_t n,
                                int64_t d, float scale, float *out, int64_t stride) {
    const __m128 factor = _mm_set1_ps(scale);
    for (int64_t g = 0; g < group;) {
        const float *qg = q + g * d;
        float *og = out + g * stride;
        if (group - g >= 4) {
            for (int64_t j = 0; j < n; j += 2) score_tile(qg, k, j, n, d, factor, og, stride, 4, 2);
            g += 4;
        } else if (group - g >= 2) {
            for (int64_t j = 0; j < n; j += 4) score_tile(qg, k, j, n, d, factor, og, stride, 2, 4);
            g += 2;
        } else {
            for (int64_t j = 0; j < n; j += 4) score_tile(qg, k, j, n, d, factor, og, stride, 1, 4);
            g += 1;
        }
    }
}

/* e^x for x <= 0, 8 at a time: x = m ln 2 + f (|f| <= ln 2 / 2), e^f by its Taylor polynomial
 * to degree 7 (error below float's rounding), scaled by 2^m; 0 below -87 (the scores past
 * the window's or block's end are padded with -inf). */
ES_AVX2 static inline __m256 exp_avx2(__m256 x) {
    const __m256 low = _mm256_set1_ps(-87.0f);
    __m256 zero_mask = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
    x = _mm256_max_ps(x, low);
    __m256 m = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(m, _mm256_set1_ps(0.693359375f), x);
    f = _mm256_fnmadd_ps(m, _mm256_set1_ps(-2.12194440e-4f), f);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(m),
                                                          _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(exponent));
    return _mm256_andnot_ps(zero_mask, p);
}

/* s[0 .. n) = e^(s - maximum), n rounded up to 8 (the pad holds -inf); returns their sum, in
 * 8 lanes over the positions in order, then reduced as reduce4's first lane. */
ES_AVX2 static float exponentials_avx2(float *s, int64_t n, float maximum) {
    __m256 sum = _mm256_setzero_ps(), shift = _mm256_set1_ps(maximum);
    for (int64_t j = 0; j < n; j += 8) {
        __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), shift));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    __m256 zero = _mm256_setzero_ps();
    return _mm_cvtss_f32(reduce4(sum, zero, zero, zero));
}

/* acc[h * stride + i + o] += sum over j of p[h * p_stride + j] * v[j, i + o] for `heads`
 * heads and o < 8 * regs, j in order, one FMA per term, in registers: each value row is read
 * once per tile. The same arithmetic for an output in every tile shape. */
ES_AVX2 static inline __attribute__((always_inline)) void value_tile(
    float *acc, int64_t stride, const float *p, int64_t p_stride, const float *v, int64_t n,
    int64_t d, int64_t i, const int heads, const int regs) {
    __m256 a[8];
    for (int h = 0; h < heads; h++)
        for (int r = 0; r < regs; r++) a[h * regs + r] = _mm256_loadu_ps(acc + h * stride + i + 8 * r);
    for (int64_t j = 0; j < n; j++) {
        __m256 x[8];
        for (int r = 0; r < regs; r++) x[r] = _mm256_loadu_ps(v + j * d + i + 8 * r);
        for (int h = 0; h < heads; h++) {
            const __m256 weight = _mm256_broadcast_ss(p + h * p_stride + j);
            for (int r = 0; r < regs; r++) a[h * regs + r] = _mm256_fmadd_ps(weight, x[r], a[h * regs + r]);
        }
    }
    for (int h = 0; h < heads; h++)
        for (int r = 0; r < regs; r++) _mm256_storeu_ps(acc + h * stride + i + 8 * r, a[h * regs + r]);
}

/* acc[g * stride + i] += sum over j of p[g * p_stride + j] * v[j, i] (d a multiple of 8):
 * 16 outputs of four heads at a time, then 32 of two, then 64 of one (the rest of d 8 at a
 * time), so no tile weighs a head twice. */
ES_AVX2 static void weighted_values_avx2(float *acc, int64_t stride, const float *p,
                                         int64_t p_stride, int64_t group, const float *v,
                                         int64_t n, int64_t d) {
    for (int64_t g = 0; g < group;) {
        float *ag = acc + g * stride;
        const float *pg = p + g * p_stride;
        if (group - g >= 4) {
            int64_t i = 0;
            for (; i + 16 <= d; i += 16) value_tile(ag, stride, pg, p_stride, v, n, d, i, 4, 2);
            for (; i < d; i += 8) value_tile(ag, stride, pg, p_stride, v, n, d, i, 4, 1);
            g += 4;
        } else if (group - g >= 2) {
            int64_t i = 0;
            for (; i + 32 <= d; i += 32) value_tile(ag, stride, pg, p_stride, v, n, d, i, 2, 4);
            for (; i < d; i += 8) value_tile(ag, stride, pg, p_stride, v, n, d, i, 2, 1);
            g += 2;
        } else {
            int64_t i = 0;
            for (; i + 64 <= d; i += 64) value_tile(ag, stride, pg, p_stride, v, n, d, i, 1, 8);
            for (; i < d; i += 8) value_tile(ag, stride, pg, p_stride, v, n, d, i, 1, 1);
            g += 1;
        }
    }
}

ES_AVX2 static void widen_avx2(const uint16_t *h, float *f, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    widen_portable(h + i, f + i, n - i);
}

ES_AVX2 static void round_to_half_avx2(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
    }
    round_to_half_portable(x + i, y + i, n - i);
}
#define ES_ATTENTION_VECTOR(name) name##_avx2
#endif
