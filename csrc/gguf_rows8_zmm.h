/* The rows-of-8 products of several rows with 512-bit dpbusd (AVX512-VNNI), included by
 * gguf_x86.c: the K-quants' here, the legacy 4- and 5-bit types' through gguf_rows8_x86.h's
 * ES_LEGACY_SHARED and this file's pair helpers.
 *
 * Why: a pass over several rows shares each unpacked block of codes, so past a few rows the
 * products are bound by their multiply-adds rather than by memory: on a 2-core AVX-512 Xeon
 * the 1.5B's 5-token pass cost 1.8-2.1 one-token steps. A 512-bit dpbusd does twice a 256-bit
 * one's byte products, and the Xeon issues 1.6 a cycle against 1.85 of the 256-bit form.
 *
 * A zmm register holds two code registers of the rows-of-8 layout interleaved by 32-bit lane:
 * lane 2i register j's 4 codes of output i, lane 2i + 1 register j + 1's, so that one 8-byte
 * broadcast of the activations (inputs 4j .. 4j + 7) meets both. Four such products cover 32
 * inputs; the lanes of a pair hold parts of the same output's dot, multiplied by the same
 * scale, and are summed once per super-block. Every sum is the exact integer that the 256-bit
 * forms compute, and the float steps after it are theirs, so the outputs are the same bits. */
#define ES_ZMM __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

/* Registers j and j + 1 (ymm each) interleaved by 32-bit lane into one zmm. */
ES_ZMM static inline __m512i interleave_pair(__m256i even, __m256i odd) {
    const __m512i order = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    return _mm512_permutex2var_epi32(_mm512_castsi256_si512(even), order, _mm512_castsi256_si512(odd));
}

/* Each output's 32-bit factor in both lanes of its pair. */
ES_ZMM static inline __m512i pair_factors(__m256i factors) {
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_epi32(twice, _mm512_castsi256_si512(factors));
}

/* Inputs 4j .. 4j + 7 of y in every pair of lanes. */
ES_ZMM static inline __m512i broadcast8(const int8_t *y) {
    int64_t word;
    memcpy(&word, y, 8);
    return _mm512_set1_epi64(word);
}

/* The sum of each pair of lanes: output i's dot in lane i. */
ES_ZMM static inline __m256i pair_sums(__m512i dots) {
    return _mm512_cvtepi64_epi32(_mm512_add_epi32(dots, _mm512_srli_epi64(dots, 32)));
}

/* 32 inputs of one row: z[q] holds registers 2q and 2q + 1; dots of registers 0-3 (z[0], z[1])
 * and 4-7 (z[2], z[3]). */
#define ZMM_DOT_FIRST(z, y)                                                                      \
    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), z[0], broadcast8(y)), z[1],   \
                        broadcast8((y) + 8))
#define ZMM_DOT_SECOND(z, y)                                                                     \
    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), z[2], broadcast8((y) + 16)),  \
                        z[3], broadcast8((y) + 24))

/* All 8 registers: one chain of 4 products (its lanes pair up into 8 dots). */
#define ZMM_DOT_EIGHT(z, y)                                                                      \
    _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ZMM_DOT_FIRST(z, y), z[2], broadcast8((y) + 16)),     \
                        z[3], broadcast8((y) + 24))

#define ZMM_K_LOOP_BEGIN(GROUP) ES_ROWS8_K_LOOP_WITH(GROUP, __m512i, _mm512_setzero_si512())
#define ZMM_K_LOOP_END ES_ROWS8_K_LOOP_END

/* Q4_K (Q5_K with `five`, IQ4_XS with `iq4`) for R rows m .. m + R - 1 (R at most ZMM_TILE;
 * R, `five` and `iq4` constants at each call) and the 8 outputs of group g, over all of K:
 * the rows' dots, minimum terms and float sums stay in registers from the first block to the
 * last (the 32-row passes of the other types keep them in memory, a load and a store per row
 * and sub-block), and the group's blocks (1,152 bytes each, 1,408 for Q5_K, 1,088 for
 * IQ4_XS, in L1 after the first tile) are unpacked once per tile. Per output and row the
 * arithmetic is rows8_q4_k's (rows8_q5_k's, rows8_iq4_xs's VNNI form): the same exact
 * integers per block, then the same float steps in block order, so the bits do not depend on
 * R or on which rows share a tile. Q6_K's tiles measured no faster (its scales multiply by
 * vpmulld, two uops, whichever loop order), so it keeps the 32-row passes; IQ4_XS's, also by
 * vpmulld, are faster than its 32-row passes on zmm (both: docs/benchmarks/kernels.md, "Q4_K's
 * several-row passes in register tiles", and docs/benchmarks/gguf-types.md, IQ4_XS). */
#define ZMM_TILE 8
ES_ZMM static inline __attribute__((always_inline)) void q4_k_zmm_tile(const Product *p, int64_t g,
                                                                        int64_t m, const int R,
                                                                        const int five, const int iq4) {
    const int64_t blocks = p->k / QK;
    const int GROUP = iq4 ? IQ4_XS_GROUP : five ? Q5_K_GROUP : Q4_K_GROUP, CHUNK = five ? Q5_K_CHUNK : 128;
    const int CODES = iq4 ? IQ4_XS_CODES : Q4_K_CODES;
    /* IQ4_XS: the values + 128, looked up per 128-bit lane (rows8_iq4_xs's VNNI form) */
    const __m512i values = _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128((const __m128i *)IQ4_VALUES), _mm_set1_epi8((char)0x80)));
    /* Q5_K's fifth bits (bit j of H for register j) to bit 4 of each code register's bytes:
     * shifts per register pair (lanes 2i, 2i + 1: registers j, j + 1), left for j < 4 */
    const __m512i to_bit4[4] = {_mm512_set1_epi64(0x0000000300000004), _mm512_set1_epi64(0x0000000100000002),
                                _mm512_set1_epi64(0x0000000100000000), _mm512_set1_epi64(0x0000000300000002)};
    const __m512i fifth = _mm512_set1_epi8(0x10);
    const uint8_t *group = p->w + (size_t)g * 8 * p->row_bytes;
    const int8_t *x = p->x.q + m * p->k;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m256 acc[ZMM_TILE];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++, group += GROUP) {
        for (int line = 0; line < GROUP; line += 64)
            _mm_prefetch((const char *)group + ES_ROWS8_PREFETCH_BYTES + line, ES_ROWS8_PREFETCH_HINT);
        __m256i scales[2], minimums[2];
        if (iq4)
            iq4_xs_group_scales(group + IQ4_XS_SCALES, scales);
        else
            q4_k_group_factors(group + Q4_K_FACTORS, scales, minimums);
        __m512i dots[ZMM_TILE];
        __m256i offsets[ZMM_TILE];
        for (int r = 0; r < R; r++) dots[r] = _mm512_setzero_si512(), offsets[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) {
            const uint8_t *at = group + CODES + CHUNK * s;
            /* packed registers 0-3: low nibbles registers 0-3, high nibbles 4-7 */
            const __m512i first = interleave_pair(_mm256_loadu_si256((const __m256i *)at),
                                                  _mm256_loadu_si256((const __m256i *)(at + 32)));
            const __m512i second = interleave_pair(_mm256_loadu_si256((const __m256i *)(at + 64)),
                                                   _mm256_loadu_si256((const __m256i *)(at + 96)));
            __m512i z[4] = {_mm512_and_si512(first, low4), _mm512_and_si512(second, low4),
                            _mm512_and_si512(_mm512_srli_epi16(first, 4), low4),
                            _mm512_and_si512(_mm512_srli_epi16(second, 4), low4)};
            if (five) {
                const __m512i h = pair_factors(_mm256_loadu_si256((const __m256i *)(at + 128)));
                z[0] = _mm512_or_si512(z[0], _mm512_and_si512(_mm512_sllv_epi32(h, to_bit4[0]), fifth));
                z[1] = _mm512_or_si512(z[1], _mm512_and_si512(_mm512_sllv_epi32(h, to_bit4[1]), fifth));
                z[2] = _mm512_or_si512(z[2], _mm512_and_si512(_mm512_srlv_epi32(h, to_bit4[2]), fifth));
                z[3] = _mm512_or_si512(z[3], _mm512_and_si512(_mm512_srlv_epi32(h, to_bit4[3]), fifth));
            }
            for (int q = 0; iq4 && q < 4; q++) z[q] = _mm512_shuffle_epi8(values, z[q]);
            if (iq4) { /* the scale - 32 by vpmulld (16 products of codes to 241 pass 16 bits);
                        * the offsets 128 * scale against the sums */
                const __m256i scale32 = _mm256_sub_epi32(q4_k_sub_block(scales, s), _mm256_set1_epi32(32));
                const __m512i scale = pair_factors(scale32);
                const __m256i pair = signed_pairs(scale32);
                for (int r = 0; r < R; r++) {
                    const int8_t *y = x + r * p->k + b * QK + 32 * s;
                    dots[r] = _mm512_add_epi32(dots[r], _mm512_mullo_epi32(ZMM_DOT_EIGHT(z, y), scale));
                    offsets[r] = _mm256_dpwssd_epi32(offsets[r], pair, sums_of(p, m + r, b, 2 * s));
                }
                continue;
            }
            const __m512i scale = pair_factors(q4_k_sub_block(scales, s));
            const __m256i minimum = factor_pairs(q4_k_sub_block(minimums, s));
            for (int r = 0; r < R; r++) {
                const int8_t *y = x + r * p->k + b * QK + 32 * s;
                /* dpwssd by the scale (high half 0) multiplies and adds in one instruction,
                 * exactly while a lane's dot fits in 16 bits: Q4_K's 16 products do (16 * 15 *
                 * 128 < 2^15), Q5_K's in two halves of 8 (8 * 31 * 128 < 2^15) */
                if (five)
                    dots[r] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(dots[r], ZMM_DOT_FIRST(z, y), scale),
                                                  ZMM_DOT_SECOND(z, y), scale);
                else
                    dots[r] = _mm512_dpwssd_epi32(dots[r], ZMM_DOT_EIGHT(z, y), scale);
                offsets[r] = _mm256_dpwssd_epi32(offsets[r], minimum, sums_of(p, m + r, b, 2 * s));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)group));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + 16)));
        for (int r = 0; r < R; r++) {
            const __m256 scale = _mm256_set1_ps(p->x.scale[(m + r) * blocks + b]);
            if (iq4) {
                const __m256i total = _mm256_sub_epi32(pair_sums(dots[r]), _mm256_slli_epi32(offsets[r], 7));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, scale), acc[r]);
                continue;
            }
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair_sums(dots[r])), _mm256_mul_ps(d, scale), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offsets[r]), _mm256_mul_ps(dmin, scale), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(p->y + (m + r) * p->n + 8 * g, acc[r]);
}

/* Q6_K as rows8_q6_k (gguf_rows8_x86.h), the dots on zmm, each lane pair holding both
 * sub-blocks of a chunk: lane 2i register j's 4 codes of output i (sub-block 2 chunk), lane
 * 2i + 1 register j + 4's (sub-block 2 chunk + 1), so that one chain of 4 dpbusd gives every
 * output's two sub-block dots (16 products each: at most 16 * 63 * 127 < 2^17) and one vpmulld
 * scales both. The activations' 4-byte groups were paired to match (es_rows8_pair_q6_k_inputs:
 * groups j, j + 4 of each 32 side by side). Against one chain per sub-block (two vpmulld and
 * an add more per row and chunk) the sums are the same integers, so the bits are. */
ES_ZMM static void rows8_q6_k_zmm(const Product *p, int64_t n0, int64_t n1) {
    ZMM_K_LOOP_BEGIN(Q6_K_GROUP)
    const uint8_t *scales = group + Q6_K_SCALES;
    for (int chunk = 0; chunk < 8; chunk++) { /* 32 inputs: sub-blocks 2 chunk, 2 chunk + 1 */
        __m256i c[8];
        q6_k_registers(group + Q6_K_CODES + Q6_K_CHUNK * chunk, c);
        const __m512i z[4] = {interleave_pair(c[0], c[4]), interleave_pair(c[1], c[5]),
                              interleave_pair(c[2], c[6]), interleave_pair(c[3], c[7])};
        const __m256i pair = lane_pairs(scales + 16 * chunk, scales + 16 * chunk + 8, 1);
        const __m512i both = interleave_pair(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(scales + 16 * chunk))),
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(scales + 16 * chunk + 8))));
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = m0 + r;
            const int8_t *y = p->x.q + row * p->k + b * QK + 32 * chunk;
            dots[r] = _mm512_add_epi32(dots[r], _mm512_mullo_epi32(ZMM_DOT_EIGHT(z, y), both));
            offsets[r] = _mm256_dpwssd_epi32(offsets[r], pair, sums_of(p, row, b, 2 * chunk));
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const __m256 scale = _mm256_set1_ps(p->x.scale[(m0 + r) * blocks + b]);
        const __m256i total = _mm256_sub_epi32(pair_sums(dots[r]), _mm256_slli_epi32(offsets[r], 5));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, scale), acc[r]);
    }
    ZMM_K_LOOP_END
}

/* Whether es_rows8_outputs_zmm reads P's activations with their 4-byte groups paired
 * (rows8_q6_k_zmm). */
int es_rows8_zmm_pairs_inputs(const Product *p) { return p->rows8 && p->rows > 1 && p->ggml_type == GGML_Q6_K; }

/* Q2_K and Q3_K (`three`, a constant at each call) as rows8_q2_k and rows8_q3_k
 * (gguf_rows8_x86.h), the dots on zmm: a half's dot fits in 16 bits, so dpwssd scales it. */
ES_ZMM static inline __attribute__((always_inline)) void rows8_q2_q3_k_zmm(const Product *p, int64_t n0,
                                                                            int64_t n1, const int three) {
    const int GROUP = three ? Q3_K_GROUP : Q2_K_GROUP;
    const __m256i low16 = _mm256_set1_epi32(0xFFFF);
    ZMM_K_LOOP_BEGIN(GROUP)
    __m256i six[2][2]; /* Q3_K: the 6-bit scales of sub-blocks 0-7 and 8-15 */
    if (three) q4_k_group_factors(group + Q3_K_FACTORS, six[0], six[1]);
#pragma GCC unroll 8
    for (int chunk = 0; chunk < 8; chunk++) { /* 32 inputs: sub-blocks 2 chunk, 2 chunk + 1 */
        __m256i c[8], first32, second32, pair;
        q2_q3_k_chunk(group, chunk, three, six, c, &first32, &second32, &pair);
        const __m256i first16 = _mm256_and_si256(first32, low16), second16 = _mm256_and_si256(second32, low16);
        const __m512i z[4] = {interleave_pair(c[0], c[1]), interleave_pair(c[2], c[3]),
                              interleave_pair(c[4], c[5]), interleave_pair(c[6], c[7])};
        const __m512i first = pair_factors(first16), second = pair_factors(second16);
        for (int64_t r = 0; r < rows; r++) {
            const int64_t row = m0 + r;
            const int8_t *y = p->x.q + row * p->k + b * QK + 32 * chunk;
            dots[r] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(dots[r], ZMM_DOT_FIRST(z, y), first),
                                          ZMM_DOT_SECOND(z, y), second);
            offsets[r] = _mm256_dpwssd_epi32(offsets[r], pair, sums_of(p, row, b, 2 * chunk));
        }
    }
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(group + 16)));
    for (int64_t r = 0; r < rows; r++) {
        const __m256 scale = _mm256_set1_ps(p->x.scale[(m0 + r) * blocks + b]);
        if (three) {
            const __m256i total = _mm256_sub_epi32(pair_sums(dots[r]), _mm256_slli_epi32(offsets[r], 2));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, scale), acc[r]);
        } else {
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair_sums(dots[r])), _mm256_mul_ps(d, scale), acc[r]);
            acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(offsets[r]), _mm256_mul_ps(dmin, scale), acc[r]);
        }
    }
    ZMM_K_LOOP_END
}

/* Q4_K and Q5_K as rows8_q4_k and rows8_q5_k (gguf_rows8_x86.h), the dots on zmm: every row of groups n0 / 8 ..
 * n1 / 8 - 1 in the fewest tiles of at most ZMM_TILE rows (6 past 16 rows, which measured
 * faster there), their sizes within one of each other (10 rows: 5 + 5, not 8 + 2: a tile's
 * unpacking is paid per tile, its rows' products per row). */
ES_ZMM static inline __attribute__((always_inline)) void rows8_k_zmm_tiles(const Product *p, int64_t n0,
                                                                            int64_t n1, const int five,
                                                                            const int iq4) {
    const int64_t most = p->rows > 16 ? 6 : ZMM_TILE;
    const int64_t tiles = (p->rows + most - 1) / most;
    for (int64_t g = n0 / 8; g < n1 / 8; g++)
        for (int64_t t = 0, m = 0; t < tiles; t++) {
            const int64_t size = p->rows / tiles + (t < p->rows % tiles);
            switch (size) { /* R a constant in each call: the tile's arrays stay in registers */
            case 8: q4_k_zmm_tile(p, g, m, 8, five, iq4); break;
            case 7: q4_k_zmm_tile(p, g, m, 7, five, iq4); break;
            case 6: q4_k_zmm_tile(p, g, m, 6, five, iq4); break;
            case 5: q4_k_zmm_tile(p, g, m, 5, five, iq4); break;
            case 4: q4_k_zmm_tile(p, g, m, 4, five, iq4); break;
            case 3: q4_k_zmm_tile(p, g, m, 3, five, iq4); break;
            case 2: q4_k_zmm_tile(p, g, m, 2, five, iq4); break;
            default: q4_k_zmm_tile(p, g, m, 1, five, iq4); break;
            }
            m += size;
        }
}
ES_ZMM static void rows8_q4_k_zmm(const Product *p, int64_t n0, int64_t n1) { rows8_k_zmm_tiles(p, n0, n1, 0, 0); }
ES_ZMM static void rows8_q5_k_zmm(const Product *p, int64_t n0, int64_t n1) { rows8_k_zmm_tiles(p, n0, n1, 1, 0); }
ES_ZMM static void rows8_iq4_xs_tiles(const Product *p, int64_t n0, int64_t n1) { rows8_k_zmm_tiles(p, n0, n1, 0, 1); }

void es_rows8_outputs_avx512vnni_rows(const Product *p, int64_t n0, int64_t n1);

/* Q4_K's, Q5_K's and IQ4_XS's passes and steps on zmm tiles; the other types' passes of several rows on zmm
 * (Q8_0's on 256-bit dpbusd) and their one-row steps on the 256-bit forms: AVX-VNNI's where
 * the CPU has it, else AVX512-VNNI's. A one-row Q4_K tile steps faster than the 256-bit form;
 * the other types' one-row steps on zmm measured no faster in their models (docs/benchmarks/kernels.md,
 * "The kernels' instruction sets"). */
ES_ZMM void es_rows8_outputs_zmm(const Product *p, int64_t n0, int64_t n1, int avxvnni) {
    if (p->ggml_type == GGML_Q4_K)
        rows8_q4_k_zmm(p, n0, n1);
    else if (p->ggml_type == GGML_Q5_K)
        rows8_q5_k_zmm(p, n0, n1);
    else if (p->ggml_type == GGML_IQ4_XS)
        rows8_iq4_xs_tiles(p, n0, n1);
    else if (es_rows8_zmm_pairs_inputs(p)) /* Q6_K's passes of several rows */
        rows8_q6_k_zmm(p, n0, n1);
    else if (p->rows > 1 && p->ggml_type == GGML_Q2_K)
        rows8_q2_q3_k_zmm(p, n0, n1, 0);
    else if (p->rows > 1 && p->ggml_type == GGML_Q3_K)
        rows8_q2_q3_k_zmm(p, n0, n1, 1);
    else if (p->rows > 1)
        es_rows8_outputs_avx512vnni_rows(p, n0, n1);
    else if (avxvnni)
        es_rows8_outputs_avxvnni(p, n0, n1);
    else
        es_rows8_outputs_avx512vnni(p, n0, n1);
}
