/* The rows-of-8 layout of GGUF's block types, specified here once (gguf_rows8.c reads it,
 * the exporter's rows8.py writes it). GGUF's block types in rows of 8: the file's blocks with
 * their bits moved, none added or dropped, so that one 256-bit register holds 4 codes of each
 * of 8 outputs and a one-row product needs no horizontal sums.
 *
 * Why: in the file's layout each block of 32 codes is one output's, and an integer dot product
 * over it ends in a sum across the register per output; with the 5-bit types' fifth bits
 * spread per block as well, a one-token step spent more time unpacking and folding than
 * reading (measured: docs/architecture.md, "Rows of 8"). Here the 8 outputs are the 8 lanes of the result, the
 * activations are broadcast 4 bytes at a time, the fifth bits are bit planes a shift away
 * from their place, and the symmetric types' centre (8 or 16) moves into a minimum term, so
 * the codes go into the unsigned side of maddubs as they are.
 *
 * Rows n = 8g .. 8g + 7 form group g: W's bytes [8g * row bytes, 8(g + 1) * row bytes) hold
 * the group's blocks b = 0 .. K/32 - 1 in order, each as one group block of 8 file blocks'
 * bytes:
 *   d[8] (float16: lane i is output 8g + i), m[8] (float16; Q4_1, Q5_1),
 *   fifth bits H[32] (Q5_0, Q5_1), codes: 4 registers of 32 bytes (4- and 5-bit types, IQ4_NL's
 *   indices) or 8 (Q8_0).
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
 *   Q5_K (1,408 bytes): Q4_K's, each sub-block's 128 bytes of low nibbles followed by its
 *     fifth bits H[32] as the legacy types' (bit j of byte 4i + t: register j's code).
 *   Q2_K (672 bytes): d[8], dmin[8]; the file's scale bytes of the 16 sub-blocks of 16 as
 *     S[8s + i] (128 bytes: scale in the low nibble, minimum in the high); then per 32 inputs
 *     64 bytes of 2-bit codes, byte 32q + 4i + t (q = 0, 1) holding registers q, q + 2, q + 4,
 *     q + 6 in bits 0-1, 2-3, 4-5, 6-7.
 *   Q3_K (880 bytes): d[8]; the 16 scales of 6 bits (value + 32) in Q4_K's 96 bytes, SC
 *     for sub-blocks of 16 0-7 and MN for 8-15; then per 32 inputs Q2_K's 64 bytes of low
 *     bits and the third bits H[32] (bit j of byte 4i + t: register j's code).
 *   Q6_K (1,680 bytes): d[8]; the int8 scales of the 16 sub-blocks of 16 as SC[8s + i] (128
 *     bytes); then per 32 inputs the low nibbles (128 bytes, as Q4_0's) and the high bit
 *     pairs of registers 0-3 and 4-7 (32 bytes each: bits 2j, 2j + 1 for register j mod 4).
 *   IQ4_XS (1,088 bytes): d[8]; the 6-bit scales (value + 32) of the 8 sub-blocks of 32 as
 *     SC[8s + i] in 48 bytes: low nibbles (32 bytes: SC[q] low, SC[q + 32] high), then byte
 *     t's bit pairs SC[t] >> 4, SC[t + 16] >> 4, SC[t + 32] >> 4, SC[t + 48] >> 4 (t < 16);
 *     then per sub-block the 128 bytes of nibble registers, as Q4_K's (indices into the
 *     table of 16 values).
 * The exporter writes this layout (export/gguf/rows8.py, installed as
 * edgespec.export.gguf.rows8); es_rows8_file_block and
 * es_rows8_unpack_k read one block back out of it. */
#ifndef EDGESPEC_GGUF_ROWS8_H
#define EDGESPEC_GGUF_ROWS8_H

#include "gguf_common.h"

/* The rows-of-8 layout (specified above): an operator's ggml_type attribute is the legacy type's
 * id plus ES_ROWS8 when W holds it. */
#define ES_ROWS8 1024
#define Q4_K_GROUP 1152 /* bytes of a group block: 8 super-blocks */
#define Q2_K_GROUP 672
#define Q3_K_GROUP 880
#define Q2_K_SCALES 32 /* byte offsets within a group block */
#define Q2_K_CODES 160
#define Q2_K_CHUNK 64  /* bytes of codes per 32 inputs: 2-bit registers j, j + 2, j + 4, j + 6 */
#define Q3_K_FACTORS 16
#define Q3_K_CODES 112
#define Q3_K_CHUNK 96 /* Q2_K's 64 bytes of low bits, then 32 of third bits */
#define Q5_K_GROUP 1408
#define Q6_K_GROUP 1680
#define Q4_K_FACTORS 32 /* byte offsets within a group block */
#define Q4_K_CODES 128 /* Q5_K's sub-blocks of 32 start here as well, Q5_K_CHUNK bytes each: */
#define Q5_K_CHUNK 160 /* 128 bytes of nibbles, then 32 of fifth bits */
#define Q6_K_SCALES 16
#define Q6_K_CODES 144
#define Q6_K_CHUNK 192 /* bytes of codes per 32 inputs */
#define IQ4_XS_GROUP 1088
#define IQ4_XS_SCALES 16 /* byte offsets within a group block */
#define IQ4_XS_CODES 64  /* then 128 bytes of nibble indices per sub-block of 32 */

typedef struct {
    int minimum; /* byte offset of m[8], or -1 */
    int high;    /* byte offset of H[32], or -1 */
    int codes;   /* byte offset of the code registers */
    int size;    /* bytes of one group block: 8 file blocks */
} Rows8Layout;

static inline Rows8Layout rows8_layout(int ggml_type) {
    Rows8Layout layout;
    int at = 16;
    layout.minimum = legacy_has_minimum(ggml_type) ? at : -1;
    if (layout.minimum >= 0) at += 16;
    layout.high = ggml_type == GGML_Q5_0 || ggml_type == GGML_Q5_1 ? at : -1;
    if (layout.high >= 0) at += 32;
    layout.codes = at;
    layout.size = 8 * (int)block_bytes(ggml_type);
    return layout;
}

int es_rows8_supported(int ggml_type, int64_t n);
void es_rows8_file_block(const uint8_t *w, int ggml_type, int64_t k, int64_t n, int64_t b,
                         uint8_t *out);
void es_rows8_unpack_k(const uint8_t *w, int ggml_type, int64_t k, int64_t n, int64_t b,
                       Unpacked *u);
/* X's quantized inputs reordered in place within every 32: 4-byte groups 0, 4, 1, 5, 2, 6, 3, 7
 * (the sums of 16 are left as quantized: they describe the inputs' original order). */
void es_rows8_pair_inputs(int8_t *q, int64_t rows, int64_t k);

#endif
