/* GGUF's products on ARM NEON (AArch64): the rows-of-8 layout of gguf_rows8.h, and the
 * activations quantized as the portable loop in gguf_reference.c quantizes them.
 *
 * Why: on a Jetson, a phone or a Raspberry Pi the portable C loops unpack every block one
 * output at a time. The rows-of-8 layout suits NEON as it suits AVX2: a 128-bit register of
 * codes holds 4 inputs of each of 4 outputs, so one `sdot` by a lane of the activations adds
 * 4 products into each output's own 32-bit lane, with no horizontal sums.
 *
 * Two builds of the same products (gguf_neon_rows8.h, included twice): with ARMv8.2's
 * optional dot-product instructions (Cortex-A55/A75 and later, Jetson Orin's A78AE, Apple
 * M1 and later) and without them (ARMv8.0: Cortex-A53/A72, Raspberry Pi 4), where each `sdot`
 * is two widening multiplies and two pairwise adds. The integer sums are the same either way,
 * and the float steps are the AVX2 path's in its order: every output equals the AVX2 path's
 * bit for bit (tests/test_neon_kernels.py runs both builds under qemu-aarch64). The
 * file-layout products (weights the importer could not put in rows of 8) run the portable
 * loops. setup.py builds the library with -ffp-contract=off on AArch64, so that no scalar
 * multiply and add elsewhere fuses where x86-64's cannot (CacheAttention's merge). */
#include "gguf_common.h"

#ifdef ES_ARM
#include <arm_neon.h>

/* gguf_x86.c's kinds of legacy codes: 4-, 5-bit, Q8_0's bytes, IQ4_NL's table indices. */
enum { ES_FOUR_BITS, ES_FIVE_BITS, ES_EIGHT_BITS, ES_TABLE_BITS };

/* Four float16 factors as float32 (exact). */
static inline float32x4_t es_halves4(const uint8_t *p) {
    uint16_t bits[4];
    memcpy(bits, p, sizeof bits);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(bits)));
}

/* ---- with the dot-product instructions ---------------------------------------------- */

#if defined(__clang__)
#define ES_NEON_TARGET __attribute__((target("dotprod")))
#else
#define ES_NEON_TARGET __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
#define ES_NEON_NAME(name) name##_dotprod
#define ES_DOT_LANE(acc, c, y, lane) vdotq_laneq_s32(acc, c, y, lane)
#include "gguf_neon_rows8.h"
#undef ES_NEON_TARGET
#undef ES_NEON_NAME
#undef ES_DOT_LANE

/* ---- ARMv8.0 NEON ------------------------------------------------------------------- */

/* vdotq_laneq_s32 without the instruction: acc lane i += the dot product of c's bytes
 * 4i .. 4i + 3 with `four` (the activations' 4 bytes in every 32-bit lane). The 16-bit pair
 * sums stay exact: 2 * 128 * 127 < 2^15. */
static inline int32x4_t es_dot_lane_plain(int32x4_t acc, int8x16_t c, int8x16_t four) {
    const int16x8_t low = vmull_s8(vget_low_s8(c), vget_low_s8(four));
    const int16x8_t high = vmull_high_s8(c, four);
    return vpadalq_s16(acc, vpaddq_s16(low, high));
}

#define ES_NEON_TARGET
#define ES_NEON_NAME(name) name##_plain
#define ES_DOT_LANE(acc, c, y, lane)                                                              \
    es_dot_lane_plain(acc, c, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(y), lane)))
#include "gguf_neon_rows8.h"
#undef ES_NEON_TARGET
#undef ES_NEON_NAME
#undef ES_DOT_LANE

/* ---- SwiGLU's epilogue ---------------------------------------------------------------- */

/* exp8 (gguf_x86.c) on 4 lanes: the same clamp, polynomial and FMAs. */
static inline float32x4_t es_exp4(float32x4_t x) {
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.3f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f)); /* ln 2 in two parts */
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t poly = vdupq_n_f32(1.9875691500e-4f);
    poly = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), poly, r);
    poly = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), poly, r);
    poly = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), poly, r);
    poly = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), poly, r);
    poly = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), poly, r);
    poly = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), poly, vmulq_f32(r, r));
    const int32x4_t two_n = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vmulq_f32(poly, vreinterpretq_f32_s32(two_n));
}

/* es_swiglu_avx2 on 4 lanes: y[r * y_stride + i] = silu(gate i) * up i, i < 8, from `both`
 * [rows, 16] (8 gates, then their 8 ups). */
void es_swiglu_neon(const float *both, int64_t rows, float *y, int64_t y_stride) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    for (int64_t r = 0; r < rows; r++)
        for (int h = 0; h < 2; h++) {
            const float32x4_t gate = vld1q_f32(both + 16 * r + 4 * h);
            const float32x4_t up = vld1q_f32(both + 16 * r + 8 + 4 * h);
            const float32x4_t silu = vdivq_f32(gate, vaddq_f32(one, es_exp4(vnegq_f32(gate))));
            vst1q_f32(y + r * y_stride + 4 * h, vmulq_f32(silu, up));
        }
}

/* ---- the activations ---------------------------------------------------------------- */

/* es_quantize_rows_portable (gguf_reference.c) with 4 lanes: the same float operations per
 * element, and vcvtnq rounds to nearest even as lrintf does under the default rounding mode, so the bytes,
 * scales and sums are the scalar loop's. block: 32 or 256 inputs; span: 16 or 32. */
void es_quantize_rows_neon(const float *x, int64_t rows, int64_t k, int64_t block, int64_t span,
                           Quantized *out) {
    const int64_t blocks = k / block, spans = k / span;
    const int8x16_t lowest = vdupq_n_s8(-127);
    for (int64_t m = 0; m < rows; m++) {
        for (int64_t b = 0; b < blocks; b++) {
            const float *v = x + m * k + b * block;
            int8_t *q = out->q + m * k + b * block;
            float32x4_t top = vdupq_n_f32(0.0f);
            for (int64_t i = 0; i < block; i += 4) top = vmaxnmq_f32(top, vabsq_f32(vld1q_f32(v + i)));
            const float amax = vmaxnmvq_f32(top);
            const float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
            out->scale[m * blocks + b] = amax / 127.0f;
            int sum = 0;
            for (int64_t i = 0; i < block; i += 16) {
                int32x4_t n[4]; /* inputs i + 4j .. i + 4j + 3, rounded */
                for (int j = 0; j < 4; j++) n[j] = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(v + i + 4 * j), inverse));
                const int16x8_t first = vcombine_s16(vqmovn_s32(n[0]), vqmovn_s32(n[1]));
                const int16x8_t second = vcombine_s16(vqmovn_s32(n[2]), vqmovn_s32(n[3]));
                const int8x16_t bytes = vmaxq_s8(vcombine_s8(vqmovn_s16(first), vqmovn_s16(second)), lowest);
                vst1q_s8(q + i, bytes);
                sum += vaddlvq_s8(bytes);
                if ((i + 16) % span == 0) {
                    out->sums[m * spans + (b * block + i + 16) / span - 1] = (int16_t)sum;
                    sum = 0;
                }
            }
        }
    }
}
#endif
