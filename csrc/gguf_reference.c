/* The portable reference of GGUF's products, in plain C: each type's blocks unpacked into
 * integer codes and factors (the file's layout, or read back from the rows-of-8 layout of
 * gguf_rows8.h), the activations quantized to int8 per block, the products and the lookups'
 * rows. The x86 (gguf_x86.c) and ARM (gguf_neon.c) forms compute the same integer sums; every
 * form is checked against this one (tests/kernels/test_kernel_paths.py).
 *
 * Each row of X is quantized to int8 per block of the weight's type (256 inputs for the
 * K-quants and IQ4_XS, 32 for the legacy types and IQ4_NL; one float scale per block, the int8
 * sums kept for the offset and minimum terms), and every output is an integer dot product per
 * block scaled into one float accumulator per (row, output), as llama.cpp computes them. */
#include "gguf_common.h"


/* Q4_K's and Q5_K's 6-bit scales and minimums of their 8 blocks of 32 (scales[12] at sc). */
static inline __attribute__((always_inline)) void unpack_k_factors(const uint8_t *sc, Unpacked *u) {
    for (int j = 0; j < 8; j++) {
        int scale, minimum;
        if (j < 4) {
            scale = sc[j] & 63;
            minimum = sc[j + 4] & 63;
        } else {
            scale = (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
            minimum = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        }
        set_scale(u, 2 * j, scale, minimum);
        set_scale(u, 2 * j + 1, scale, minimum);
    }
}

static inline __attribute__((always_inline)) void unpack_q4_k(const uint8_t *b, Unpacked *u) {
    const uint8_t *qs = b + 16;
    u->d = half_to_float(read_u16(b));
    u->dmin = half_to_float(read_u16(b + 2));
    unpack_k_factors(b + 4, u);
    for (int c = 0; c < 4; c++) { /* 32 bytes: block 2c in the low nibbles, 2c + 1 high */
        for (int i = 0; i < 32; i++) {
            u->code[64 * c + i] = qs[32 * c + i] & 0x0F;
            u->code[64 * c + 32 + i] = qs[32 * c + i] >> 4;
        }
    }
}

/* Q5_K: Q4_K's fields with qh[32] before the nibbles; bit s of qh[i] is the fifth bit of
 * input 32s + i (block s of 32). */
static inline __attribute__((always_inline)) void unpack_q5_k(const uint8_t *b, Unpacked *u) {
    const uint8_t *qh = b + 16, *qs = b + 48;
    u->d = half_to_float(read_u16(b));
    u->dmin = half_to_float(read_u16(b + 2));
    unpack_k_factors(b + 4, u);
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < 32; i++) {
            u->code[64 * c + i] = (uint8_t)((qs[32 * c + i] & 0x0F) | (((qh[i] >> (2 * c)) & 1) << 4));
            u->code[64 * c + 32 + i] = (uint8_t)((qs[32 * c + i] >> 4) | (((qh[i] >> (2 * c + 1)) & 1) << 4));
        }
    }
}

/* Q2_K: input 128c + 32j + l is bits 2j, 2j + 1 of qs[32c + l]; its block of 16 has
 * scales[i / 16]: the scale in the low nibble, the minimum in the high one. */
static inline __attribute__((always_inline)) void unpack_q2_k(const uint8_t *b, Unpacked *u) {
    const uint8_t *qs = b + 16;
    u->d = half_to_float(read_u16(b + 80));
    u->dmin = half_to_float(read_u16(b + 82));
    for (int k = 0; k < SUB; k++) set_scale(u, k, b[k] & 0x0F, b[k] >> 4);
    for (int i = 0; i < QK; i++) u->code[i] = (qs[32 * (i / 128) + i % 32] >> (2 * (i % 128 / 32))) & 3;
}

/* Q3_K: 3-bit codes (the value + 4): the low bits as Q2_K's, the third bit of input
 * 128c + 32j + l bit 4c + j of hmask[l]; the 16 scales of 6 bits (the value + 32) as
 * ggml packs them in scales[12]: low nibbles in bytes 0-7 (scales 0-7 low, 8-15 high),
 * the top bit pairs in bytes 8-11 (scale k's at bits 2 (k / 4) of byte 8 + k % 4). */
static inline int q3_k_scale(const uint8_t *sc, int k) {
    const int low = k < 8 ? sc[k] & 0x0F : sc[k - 8] >> 4;
    return (low | ((sc[8 + k % 4] >> (2 * (k / 4))) & 3) << 4) - 32;
}
static inline __attribute__((always_inline)) void unpack_q3_k(const uint8_t *b, Unpacked *u) {
    const uint8_t *hmask = b, *qs = b + 32;
    u->d = half_to_float(read_u16(b + 108));
    u->dmin = u->d;
    for (int k = 0; k < SUB; k++) {
        const int scale = q3_k_scale(b + 96, k);
        set_scale(u, k, scale, 4 * scale);
    }
    for (int i = 0; i < QK; i++) {
        const int c = i / 128, j = i % 128 / 32, l = i % 32;
        u->code[i] = (uint8_t)(((qs[32 * c + l] >> (2 * j)) & 3) | (((hmask[l] >> (4 * c + j)) & 1) << 2));
    }
}

static inline __attribute__((always_inline)) void unpack_q6_k(const uint8_t *b, Unpacked *u) {
    const int8_t *sc = (const int8_t *)(b + 192);
    u->d = half_to_float(read_u16(b + 208));
    u->dmin = u->d;
    for (int k = 0; k < SUB; k++) set_scale(u, k, sc[k], 32 * sc[k]);
    for (int h = 0; h < 2; h++) { /* each half: 64 bytes of low nibbles, 32 of high pairs */
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        uint8_t *code = u->code + 128 * h;
        for (int l = 0; l < 32; l++) {
            code[l] = (uint8_t)((ql[l] & 0x0F) | ((qh[l] & 3) << 4));
            code[l + 32] = (uint8_t)((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4));
            code[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            code[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
        }
    }
}


/* IQ4_XS: block s of 32 has a 6-bit scale (the value + 32: its low nibble in scales_l[s / 2]
 * at bit 4 (s % 2), its high bits at bit 2s of scales_h) and Q4_0's nibbles (qs[16 s + j]:
 * input 32 s + j low, 32 s + 16 + j high), indices into IQ4_VALUES. The codes are the values
 * + 128 (unsigned), the offset 128 * scale. */
static inline int iq4_xs_scale(const uint8_t *b, int s) {
    return (((b[4 + s / 2] >> (4 * (s % 2))) & 0x0F) | ((read_u16(b + 2) >> (2 * s)) & 3) << 4) - 32;
}
static inline __attribute__((always_inline)) void unpack_iq4_xs(const uint8_t *b, Unpacked *u) {
    u->d = half_to_float(read_u16(b));
    u->dmin = u->d;
    for (int s = 0; s < 8; s++) {
        const int scale = iq4_xs_scale(b, s);
        set_scale(u, 2 * s, scale, 128 * scale);
        set_scale(u, 2 * s + 1, scale, 128 * scale);
        const uint8_t *qs = b + 8 + 16 * s;
        for (int j = 0; j < 16; j++) {
            u->code[32 * s + j] = (uint8_t)(IQ4_VALUES[qs[j] & 0x0F] + 128);
            u->code[32 * s + 16 + j] = (uint8_t)(IQ4_VALUES[qs[j] >> 4] + 128);
        }
    }
}

/* The activations: X's rows as int8 per block of `block` inputs, value ~ scale * q (the
 * largest magnitude of the block to 127, rounded to nearest even), and the sums of q over
 * each `span` inputs. */
void es_quantize_rows_portable(const float *x, int64_t rows, int64_t k, int64_t block,
                               int64_t span, Quantized *out) {
    int64_t blocks = k / block;
    for (int64_t m = 0; m < rows; m++) {
        for (int64_t b = 0; b < blocks; b++) {
            const float *v = x + m * k + b * block;
            int8_t *q = out->q + m * k + b * block;
            float amax = 0.0f;
            for (int64_t i = 0; i < block; i++) amax = fmaxf(amax, fabsf(v[i]));
            float scale = amax / 127.0f;
            float inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
            out->scale[m * blocks + b] = scale;
            for (int64_t i = 0; i < block; i++) {
                int value = (int)lrintf(v[i] * inverse);
                q[i] = (int8_t)(value > 127 ? 127 : (value < -127 ? -127 : value));
            }
        }
        for (int64_t s = 0; s < k / span; s++) {
            int sum = 0;
            for (int64_t i = 0; i < span; i++) sum += out->q[m * k + s * span + i];
            out->sums[m * (k / span) + s] = (int16_t)sum;
        }
    }
}

/* ---- the product ------------------------------------------------------------------ */

typedef void (*unpack_fn)(const uint8_t *, Unpacked *);

static void unpack_q4_k_portable(const uint8_t *b, Unpacked *u) { unpack_q4_k(b, u); }
static void unpack_q5_k_portable(const uint8_t *b, Unpacked *u) { unpack_q5_k(b, u); }
static void unpack_q2_k_portable(const uint8_t *b, Unpacked *u) { unpack_q2_k(b, u); }
static void unpack_q3_k_portable(const uint8_t *b, Unpacked *u) { unpack_q3_k(b, u); }
static void unpack_q6_k_portable(const uint8_t *b, Unpacked *u) { unpack_q6_k(b, u); }
static void unpack_iq4_xs_portable(const uint8_t *b, Unpacked *u) { unpack_iq4_xs(b, u); }

/* Block b of output n as the file stores it: in W, or rebuilt into `scratch` from the rows-of-8
 * layout. */
static const uint8_t *legacy_block(const uint8_t *w, int ggml_type, int rows8, int64_t k,
                                   int64_t n, int64_t b, uint8_t scratch[34]) {
    if (!rows8) return w + (size_t)n * row_bytes(ggml_type, k) + (size_t)b * block_bytes(ggml_type);
    es_rows8_file_block(w, ggml_type, k, n, b, scratch);
    return scratch;
}

static void outputs_legacy_portable(const Product *p, int64_t n0, int64_t n1) {
    int64_t blocks = p->k / LEGACY;
    uint8_t scratch[34];
    int8_t code[LEGACY];
    float d, minimum, acc[ROWS_PER_PASS];
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {
        int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;
        for (int64_t n = n0; n < n1; n++) {
            for (int64_t r = 0; r < rows; r++) acc[r] = 0.0f;
            for (int64_t b = 0; b < blocks; b++) {
                unpack_legacy(legacy_block(p->w, p->ggml_type, p->rows8, p->k, n, b, scratch),
                              p->ggml_type, code, &d, &minimum);
                for (int64_t r = 0; r < rows; r++) {
                    int64_t m = m0 + r;
                    const int8_t *q = p->x.q + m * p->k + b * LEGACY;
                    int32_t dot = 0;
                    for (int i = 0; i < LEGACY; i++) dot += code[i] * q[i];
                    float scale = p->x.scale[m * blocks + b];
                    acc[r] += d * scale * (float)dot +
                              minimum * scale * (float)p->x.sums[m * blocks + b];
                }
            }
            for (int64_t r = 0; r < rows; r++) p->y[(m0 + r) * p->n + n] = acc[r];
        }
    }
}

void es_outputs_portable(const Product *p, int64_t n0, int64_t n1) {
    if (!is_k_quant(p->ggml_type)) {
        outputs_legacy_portable(p, n0, n1);
        return;
    }
    int64_t blocks = p->k / QK;
    unpack_fn unpack = p->ggml_type == GGML_Q2_K   ? unpack_q2_k_portable
                       : p->ggml_type == GGML_Q3_K ? unpack_q3_k_portable
                       : p->ggml_type == GGML_Q4_K ? unpack_q4_k_portable
                       : p->ggml_type == GGML_Q5_K ? unpack_q5_k_portable
                       : p->ggml_type == GGML_Q6_K ? unpack_q6_k_portable
                                                   : unpack_iq4_xs_portable;
    const int centred = code_centre(p->ggml_type) != 0;
    const size_t size = block_bytes(p->ggml_type);
    Unpacked u;
    float acc[ROWS_PER_PASS];
    for (int64_t m0 = 0; m0 < p->rows; m0 += ROWS_PER_PASS) {
        int64_t rows = p->rows - m0 < ROWS_PER_PASS ? p->rows - m0 : ROWS_PER_PASS;
        for (int64_t n = n0; n < n1; n++) {
            for (int64_t r = 0; r < rows; r++) acc[r] = 0.0f;
            for (int64_t b = 0; b < blocks; b++) {
                if (p->rows8)
                    es_rows8_unpack_k(p->w, p->ggml_type, p->k, n, b, &u);
                else
                    unpack(p->w + n * p->row_bytes + b * size, &u);
                for (int64_t r = 0; r < rows; r++) {
                    int64_t m = m0 + r;
                    const int8_t *q = p->x.q + m * p->k + b * QK;
                    const int16_t *sums = p->x.sums + (m * blocks + b) * (QK / SUB);
                    int32_t dot = 0, offsets = 0;
                    for (int s = 0; s < SUB; s++) {
                        int32_t part = 0;
                        for (int i = 0; i < SUB; i++) part += u.code[s * SUB + i] * q[s * SUB + i];
                        dot += part * (int16_t)(u.scale_pair[s] & 0xFFFF);
                        offsets += u.offset[s] * sums[s];
                    }
                    float scale = p->x.scale[m * blocks + b];
                    if (centred) /* the offsets are most of `dot`: subtracted as integers */
                        acc[r] += u.d * scale * (float)(dot - offsets);
                    else
                        acc[r] += u.d * scale * (float)dot - u.dmin * scale * (float)offsets;
                }
            }
            for (int64_t r = 0; r < rows; r++) p->y[(m0 + r) * p->n + n] = acc[r];
        }
    }
}

/* SwiGLU's epilogue for one task: `both` [rows, 16] holds 8 gates then their 8 ups per row;
 * y[r * y_stride + i] = silu(gate i) * up i for i < 8. */
void es_swiglu_portable(const float *both, int64_t rows, float *y, int64_t y_stride) {
    for (int64_t r = 0; r < rows; r++)
        for (int i = 0; i < 8; i++) {
            const float gate = both[16 * r + i];
            y[r * y_stride + i] = gate / (1.0f + expf(-gate)) * both[16 * r + 8 + i];
        }
}

/* One row of W as floats: w[i] = d * scale * code - dmin * offset per 16 inputs (K-quants),
 * d * code + m (legacy types). */
void es_dequantize_row(const uint8_t *w, int ggml_type, int rows8, int64_t k, int64_t n,
                       float *out) {
    const uint8_t *row = w + (size_t)n * row_bytes(ggml_type, k);
    if (!is_k_quant(ggml_type)) {
        uint8_t scratch[34];
        int8_t code[LEGACY];
        float d, m;
        for (int64_t b = 0; b < k / LEGACY; b++) {
            unpack_legacy(legacy_block(w, ggml_type, rows8, k, n, b, scratch), ggml_type,
                          code, &d, &m);
            for (int i = 0; i < LEGACY; i++) out[b * LEGACY + i] = d * (float)code[i] + m;
        }
        return;
    }
    Unpacked u;
    for (int64_t b = 0; b < k / QK; b++) {
        if (rows8)
            es_rows8_unpack_k(w, ggml_type, k, n, b, &u);
        else if (ggml_type == GGML_Q4_K)
            unpack_q4_k(row + b * 144, &u);
        else if (ggml_type == GGML_Q5_K)
            unpack_q5_k(row + b * 176, &u);
        else if (ggml_type == GGML_Q2_K)
            unpack_q2_k(row + b * 84, &u);
        else if (ggml_type == GGML_Q3_K)
            unpack_q3_k(row + b * 110, &u);
        else if (ggml_type == GGML_Q6_K)
            unpack_q6_k(row + b * 210, &u);
        else
            unpack_iq4_xs(row + b * 136, &u);
        const int centre = code_centre(ggml_type);
        for (int i = 0; i < QK; i++) {
            float scale = (float)(int16_t)(u.scale_pair[i / SUB] & 0xFFFF);
            if (centre)
                out[b * QK + i] = u.d * scale * (float)(u.code[i] - centre);
            else
                out[b * QK + i] = u.d * scale * (float)u.code[i] - u.dmin * (float)u.offset[i / SUB];
        }
    }
}
