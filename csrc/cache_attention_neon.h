/* CacheAttention's block functions on NEON (included by cache_attention.c, after the portable
 * ones): the AVX2 forms' arithmetic bit for bit (cache_attention_x86.h). */
#ifdef ES_ARM
#include <arm_neon.h>

/* The AVX2 functions' arithmetic on NEON, bit for bit: an 8-lane float vector is two 4-lane
 * halves, every lane runs the same FMA chain, and sums reduce in reduce4's order. */

/* ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)) of x = (low, high). */
static inline float sum8_neon(float32x4_t low, float32x4_t high) {
    const float32x4_t pairs = vpaddq_f32(low, high);
    const float32x2_t quads = vpadd_f32(vget_low_f32(pairs), vget_high_f32(pairs));
    return vget_lane_f32(quads, 0) + vget_lane_f32(quads, 1);
}

/* scores_avx2's scores: lanes l and l + 4 of 8 accumulate inputs i = l (mod 8) in order. */
static void scores_neon(const float *q, int64_t group, const float *k, int64_t n, int64_t d,
                        float scale, float *out, int64_t stride) {
    for (int64_t j = 0; j < n; j++) {
        const float *key = k + j * d;
        for (int64_t g = 0; g < group; g++) {
            const float *x = q + g * d;
            float32x4_t low = vdupq_n_f32(0.0f), high = vdupq_n_f32(0.0f);
            for (int64_t i = 0; i < d; i += 8) {
                low = vfmaq_f32(low, vld1q_f32(x + i), vld1q_f32(key + i));
                high = vfmaq_f32(high, vld1q_f32(x + i + 4), vld1q_f32(key + i + 4));
            }
            out[g * stride + j] = sum8_neon(low, high) * scale;
        }
    }
}

/* exp_avx2 on 4 lanes. */
static inline float32x4_t exp_neon(float32x4_t x) {
    const float32x4_t low = vdupq_n_f32(-87.0f);
    const uint32x4_t zero_mask = vcltq_f32(x, low);
    x = vmaxq_f32(x, low);
    const float32x4_t m = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t f = vfmsq_f32(x, m, vdupq_n_f32(0.693359375f));
    f = vfmsq_f32(f, m, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.0f / 5040.0f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 720.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, f);
    const int32x4_t exponent = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(m), vdupq_n_s32(127)), 23);
    p = vmulq_f32(p, vreinterpretq_f32_s32(exponent));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(p), zero_mask));
}

/* exponentials_avx2: n a multiple of 8 (the pad holds -inf). */
static float exponentials_neon(float *s, int64_t n, float maximum) {
    float32x4_t low = vdupq_n_f32(0.0f), high = vdupq_n_f32(0.0f);
    const float32x4_t shift = vdupq_n_f32(maximum);
    for (int64_t j = 0; j < n; j += 8) {
        const float32x4_t e0 = exp_neon(vsubq_f32(vld1q_f32(s + j), shift));
        const float32x4_t e1 = exp_neon(vsubq_f32(vld1q_f32(s + j + 4), shift));
        vst1q_f32(s + j, e0);
        vst1q_f32(s + j + 4, e1);
        low = vaddq_f32(low, e0);
        high = vaddq_f32(high, e1);
    }
    return sum8_neon(low, high);
}

/* weighted_values_avx2: one FMA per term, positions in order, 16 outputs of a head at a time
 * in registers (d a multiple of 8). */
static void weighted_values_neon(float *acc, int64_t stride, const float *p, int64_t p_stride,
                                 int64_t group, const float *v, int64_t n, int64_t d) {
    for (int64_t g = 0; g < group; g++) {
        float *ag = acc + g * stride;
        const float *pg = p + g * p_stride;
        for (int64_t i = 0; i < d;) {
            const int regs = i + 16 <= d ? 4 : 2;
            float32x4_t a[4];
            for (int r = 0; r < regs; r++) a[r] = vld1q_f32(ag + i + 4 * r);
            for (int64_t j = 0; j < n; j++)
                for (int r = 0; r < regs; r++) a[r] = vfmaq_n_f32(a[r], vld1q_f32(v + j * d + i + 4 * r), pg[j]);
            for (int r = 0; r < regs; r++) vst1q_f32(ag + i + 4 * r, a[r]);
            i += 4 * regs;
        }
    }
}

static void widen_neon(const uint16_t *h, float *f, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(f + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h + i))));
    widen_portable(h + i, f + i, n - i);
}

static void round_to_half_neon(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vcvt_f32_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    round_to_half_portable(x + i, y + i, n - i);
}
#define ES_ATTENTION_VECTOR(name) name##_neon
#endif
