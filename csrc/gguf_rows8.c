/* The rows-of-8 layout (specified in gguf_rows8.h) read back: one block of one output as the
 * file stores it (the legacy types) or unpacked (the K-quants and IQ4_XS), for the portable
 * reference and the lookups; and the activations paired for the 512-bit forms. */
#include "gguf_common.h"

int es_rows8_supported(int ggml_type, int64_t n) { return block_bytes(ggml_type) && n % 8 == 0; }

/* Value q (0-63) of the 6-bit array SC (first) or MN in Q4_K's 96 bytes of factors at f:
 * low nibbles of SC[q % 32] (q < 32) or of SC[q - 32] (high), the same for MN, then bit pairs
 * SC[q] >> 4, SC[q + 32] >> 4, MN[q] >> 4, MN[q + 32] >> 4 of byte q % 32. */
static int rows8_six_bits(const uint8_t *f, int first, int q) {
    const int at = q % 32, upper = q >= 32;
    const uint8_t low = f[(first ? 0 : 32) + at];
    return (upper ? low >> 4 : low & 0x0F) | ((f[64 + at] >> ((first ? 0 : 4) + (upper ? 2 : 0))) & 3) << 4;
}

/* IQ4_XS's SC[q] (6 bits) from its 48 bytes at f (see above). */
static int rows8_iq4_xs_scale(const uint8_t *f, int q) {
    const uint8_t low = f[q % 32];
    return (q < 32 ? low & 0x0F : low >> 4) | ((f[32 + q % 16] >> (2 * (q / 16))) & 3) << 4;
}

/* Super-block b of output n, unpacked as unpack_q4_k / unpack_q5_k / unpack_q6_k /
 * unpack_iq4_xs unpack the file's. */
void es_rows8_unpack_k(const uint8_t *w, int ggml_type, int64_t k, int64_t n, int64_t b,
                       Unpacked *u) {
    const int lane = (int)(n % 8), q6 = ggml_type == GGML_Q6_K, q5 = ggml_type == GGML_Q5_K;
    const uint8_t *group = w + (size_t)(n / 8) * 8 * row_bytes(ggml_type, k) +
                           (size_t)b * (size_t)(8 * block_bytes(ggml_type));
    u->d = half_to_float(read_u16(group + 2 * lane));
    if (ggml_type == GGML_IQ4_XS) {
        u->dmin = u->d;
        for (int s = 0; s < 8; s++) {
            const int scale = rows8_iq4_xs_scale(group + IQ4_XS_SCALES, 8 * s + lane) - 32;
            set_scale(u, 2 * s, scale, 128 * scale);
            set_scale(u, 2 * s + 1, scale, 128 * scale);
        }
        for (int i = 0; i < QK; i++) {
            const int s = i / 32, j = i % 32 / 4, at = 4 * lane + i % 4;
            const uint8_t packed = group[IQ4_XS_CODES + 128 * s + 32 * (j % 4) + at];
            u->code[i] = (uint8_t)(IQ4_VALUES[j < 4 ? packed & 0x0F : packed >> 4] + 128);
        }
        return;
    }
    if (ggml_type == GGML_Q2_K || ggml_type == GGML_Q3_K) {
        const int q3 = ggml_type == GGML_Q3_K;
        u->dmin = q3 ? u->d : half_to_float(read_u16(group + 16 + 2 * lane));
        for (int k = 0; k < SUB; k++) {
            if (q3) {
                const int scale = rows8_six_bits(group + Q3_K_FACTORS, k < 8, 8 * (k % 8) + lane) - 32;
                set_scale(u, k, scale, 4 * scale);
            } else {
                const uint8_t packed = group[Q2_K_SCALES + 8 * k + lane];
                set_scale(u, k, packed & 0x0F, packed >> 4);
            }
        }
        for (int i = 0; i < QK; i++) {
            const int c = i / 32, j = i % 32 / 4, at = 4 * lane + i % 4;
            const uint8_t *codes = group + (q3 ? Q3_K_CODES + Q3_K_CHUNK * c : Q2_K_CODES + Q2_K_CHUNK * c);
            u->code[i] = (codes[32 * (j % 2) + at] >> (2 * (j / 2))) & 3;
            if (q3) u->code[i] |= (uint8_t)(((codes[64 + at] >> j) & 1) << 2);
        }
        return;
    }
    if (!q6) {
        u->dmin = half_to_float(read_u16(group + 16 + 2 * lane));
        for (int s = 0; s < 8; s++) {
            const int scale = rows8_six_bits(group + Q4_K_FACTORS, 1, 8 * s + lane);
            const int minimum = rows8_six_bits(group + Q4_K_FACTORS, 0, 8 * s + lane);
            set_scale(u, 2 * s, scale, minimum);
            set_scale(u, 2 * s + 1, scale, minimum);
        }
        const int chunk = q5 ? Q5_K_CHUNK : 128;
        for (int i = 0; i < QK; i++) {
            const int s = i / 32, j = i % 32 / 4, at = 4 * lane + i % 4;
            const uint8_t *codes = group + Q4_K_CODES + chunk * s;
            const uint8_t packed = codes[32 * (j % 4) + at];
            u->code[i] = j < 4 ? packed & 0x0F : packed >> 4;
            if (q5) u->code[i] |= (uint8_t)(((codes[128 + at] >> j) & 1) << 4);
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

void es_rows8_pair_inputs(int8_t *q, int64_t rows, int64_t k) {
    for (int64_t at = 0; at + 32 <= rows * k; at += 32) {
        uint32_t group[8], paired[8];
        memcpy(group, q + at, 32);
        for (int j = 0; j < 4; j++) paired[2 * j] = group[j], paired[2 * j + 1] = group[j + 4];
        memcpy(q + at, paired, 32);
    }
}
