/* What edgespec's GGUF kernel sources share: ggml's block types and their sizes, a legacy
 * block unpacked, the quantized activations and one product's operands. */
#ifndef EDGESPEC_GGUF_COMMON_H
#define EDGESPEC_GGUF_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ort_abi.h"

#if defined(__x86_64__) || defined(_M_X64)
#define ES_X86 1
#include <immintrin.h>
/* The VNNI forms need a compiler that knows AVX-VNNI (GCC 11, Clang 12 and later). */
#if !defined(ES_NO_VNNI) && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define ES_VNNI 1
#endif
#endif
#if defined(__aarch64__)
#define ES_ARM 1
#endif

#if defined(_WIN32)
#define ES_EXPORT __declspec(dllexport)
#else
#define ES_EXPORT __attribute__((visibility("default")))
#endif

#define QK 256          /* inputs per K-quant super-block */
#define SUB 16          /* inputs per offset sum */
#define ROWS_PER_PASS 32 /* rows of X sharing one unpacked weight block */
#define OUTPUTS_PER_TASK 16
#ifndef ES_BATCHES
#define ES_BATCHES 0 /* ONNX Runtime splits the tasks into one batch per thread */
#endif
/* How far ahead of the group block being read the rows-of-8 products prefetch, in bytes, and
 * into which cache (x86; NEON keeps 4 KiB into L1, unmeasured). 8 KiB into L2 (prefetcht1)
 * rather than 4 KiB into L1: lines fetched far ahead into L1 evict the rows' activations there
 * (a few rows of a down projection's inputs fill a 32 KB L1), while the core's own L1
 * prefetcher brings lines up from L2 as the loop reaches them. Measured on steps and verify
 * passes of every catalog model: docs/benchmarks/gguf-types.md, "IQ4_XS files, on a 2-core AMD EPYC with
 * AVX-512 (Zen 4)". */
#ifndef ES_ROWS8_PREFETCH_BYTES
#define ES_ROWS8_PREFETCH_BYTES 8192
#endif
#ifndef ES_ROWS8_PREFETCH_HINT
#define ES_ROWS8_PREFETCH_HINT _MM_HINT_T1
#endif
#ifndef ES_PREFETCH
#define ES_PREFETCH 16 /* blocks ahead: measured best of 4, 8, 16 for one row */
#endif

enum {
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q2_K = 10,
    GGML_Q3_K = 11,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_IQ4_NL = 20,
    GGML_IQ4_XS = 23,
};
/* IQ4_NL's and IQ4_XS's 16 values: a 4-bit code is an index into this table (ggml's
 * kvalues_iq4nl), the weight d * value (IQ4_XS: d * (6-bit scale - 32) * value). */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
#define LEGACY 32 /* inputs per block of the legacy types (Q4_0 ... Q8_0) */

/* ---- float16 ---------------------------------------------------------------------- */

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exponent = (h >> 10) & 0x1F;
    uint32_t mantissa = h & 0x3FF;
    uint32_t bits;
    if (exponent == 0) {
        if (mantissa == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            exponent = 127 - 15 + 1;
            while (!(mantissa & 0x400)) {
                mantissa <<= 1;
                exponent--;
            }
            mantissa &= 0x3FF;
            bits = sign | (exponent << 23) | (mantissa << 13);
        }
    } else if (exponent == 31) {
        bits = sign | 0x7F800000 | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* float to float16, rounding to nearest even (IEEE's conversion: what F16C and NEON compute);
 * overflow gives infinity, NaN stays NaN. */
static inline uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000, magnitude = x & 0x7FFFFFFF;
    if (magnitude > 0x7F800000) return (uint16_t)(sign | 0x7E00 | ((magnitude >> 13) & 0x3FF));
    if (magnitude >= 0x477FF000) return (uint16_t)(sign | 0x7C00); /* 65520 and up: infinity */
    if (magnitude < 0x33000000) return (uint16_t)sign;             /* 2^-25 and below: zero */
    uint32_t q, rest, half;
    if (magnitude < 0x38800000) { /* a float16 subnormal: units of 2^-24 */
        const uint32_t shift = 126 - (magnitude >> 23), m = (magnitude & 0x7FFFFF) | 0x800000;
        q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    } else { /* the exponent rebiased from 127 to 15, 13 mantissa bits dropped */
        q = (magnitude - 0x38000000) >> 13, rest = magnitude & 0x1FFF, half = 0x1000;
    }
    if (rest > half || (rest == half && (q & 1))) q++; /* a carry into the exponent is right */
    return (uint16_t)(sign | q);
}

static inline uint16_t read_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline size_t block_bytes(int ggml_type) {
    switch (ggml_type) {
    case GGML_Q4_0: return 18;  /* d (f16), qs[16] */
    case GGML_Q4_1: return 20;  /* d, m (f16), qs[16] */
    case GGML_Q5_0: return 22;  /* d (f16), qh[4], qs[16] */
    case GGML_Q5_1: return 24;  /* d, m (f16), qh[4], qs[16] */
    case GGML_Q8_0: return 34;  /* d (f16), qs[32] (int8) */
    case GGML_Q2_K: return 84;  /* scales[16] (4-bit scale, 4-bit minimum), qs[64], d, dmin (f16) */
    case GGML_Q3_K: return 110; /* hmask[32], qs[64], scales[12] (6-bit), d (f16) */
    case GGML_Q4_K: return 144; /* d, dmin (f16), scales[12], qs[128] */
    case GGML_Q5_K: return 176; /* d, dmin (f16), scales[12], qh[32], qs[128] */
    case GGML_Q6_K: return 210; /* ql[128], qh[64], scales[16] (int8), d (f16) */
    case GGML_IQ4_NL: return 18; /* d (f16), qs[16] (indices into IQ4_VALUES) */
    case GGML_IQ4_XS: return 136; /* d (f16), scales_h (u16), scales_l[4], qs[128] */
    default: return 0;
    }
}

static inline int64_t block_inputs(int ggml_type);

static inline int is_k_quant(int ggml_type) {
    return ggml_type == GGML_Q2_K || ggml_type == GGML_Q3_K || ggml_type == GGML_Q4_K ||
           ggml_type == GGML_Q5_K || ggml_type == GGML_Q6_K || ggml_type == GGML_IQ4_XS;
}

/* Inputs per block: activations are quantized per block of the same size (IQ4_XS, of 256, is
 * one of the super-block types here). */
static inline int64_t block_inputs(int ggml_type) { return is_k_quant(ggml_type) ? QK : LEGACY; }

static inline size_t row_bytes(int ggml_type, int64_t k) {
    return (size_t)(k / block_inputs(ggml_type)) * block_bytes(ggml_type);
}

/* Inputs per activation sum: the K-quants' factors change every 16 inputs. */
static inline int64_t sum_span(int ggml_type) { return is_k_quant(ggml_type) ? SUB : LEGACY; }

/* A legacy block as 32 integer codes: w[i] = d * code[i] + m (m = 0 for the symmetric types,
 * whose codes are signed). */
static inline int legacy_has_minimum(int ggml_type) {
    return ggml_type == GGML_Q4_1 || ggml_type == GGML_Q5_1;
}

static inline void unpack_legacy(const uint8_t *b, int ggml_type, int8_t code[LEGACY], float *d,
                          float *m) {
    *d = half_to_float(read_u16(b));
    *m = legacy_has_minimum(ggml_type) ? half_to_float(read_u16(b + 2)) : 0.0f;
    if (ggml_type == GGML_Q8_0) {
        memcpy(code, b + 2, LEGACY);
        return;
    }
    if (ggml_type == GGML_IQ4_NL) { /* Q4_0's nibbles as indices into the table */
        for (int j = 0; j < 16; j++) {
            code[j] = IQ4_VALUES[b[2 + j] & 0x0F];
            code[j + 16] = IQ4_VALUES[b[2 + j] >> 4];
        }
        return;
    }
    int five = ggml_type == GGML_Q5_0 || ggml_type == GGML_Q5_1;
    const uint8_t *qs = b + (ggml_type == GGML_Q4_0 ? 2 : ggml_type == GGML_Q4_1 ? 4 : ggml_type == GGML_Q5_0 ? 6 : 8);
    uint32_t high = 0;
    if (five) memcpy(&high, b + (ggml_type == GGML_Q5_0 ? 2 : 4), 4);
    int centre = legacy_has_minimum(ggml_type) ? 0 : (five ? 16 : 8);
    for (int j = 0; j < 16; j++) { /* input j in the low nibble of byte j, j + 16 high */
        int lo = qs[j] & 0x0F, hi = qs[j] >> 4;
        if (five) {
            lo |= (int)((high >> j) & 1) << 4;
            hi |= (int)((high >> (j + 16)) & 1) << 4;
        }
        code[j] = (int8_t)(lo - centre);
        code[j + 16] = (int8_t)(hi - centre);
    }
}
/* ---- activations -------------------------------------------------------------------- */

/* X's rows as int8 per block of the weight's type (256 inputs for the K-quants, 32 for the
 * legacy types): value ~ scale[m][b] * q[m][i]; sums[m][i / span] is the sum of q over each
 * span of inputs (16 for the K-quants, 32 for the legacy types). */
typedef struct {
    int8_t *q;      /* [M][K] */
    float *scale;   /* [M][K / block] */
    int16_t *sums;  /* [M][K / span] */
} Quantized;
typedef struct {
    int ggml_type;
    int64_t k, n, rows;
    size_t row_bytes;
    const uint8_t *w;
    Quantized x;
    float *y;
    /* Added to the outputs, when given: a bias [N] (stride 0 between rows) or a residual
     * [rows, N] (stride N). */
    const float *addend;
    int64_t addend_stride;
    /* W in the rows-of-8 layout (gguf_rows8.h) rather than the file's row by row. */
    int rows8;
    /* ES_SWIGLU: W's outputs are gate and up in alternate groups of 8 (stored outputs
     * 16j .. 16j + 7 gate 8j .. 8j + 7, the next 8 their ups) and Y [rows, N / 2] is
     * silu(gate) * up; ES_PLAIN: Y is the product. */
    int activation;
} Product;
enum { ES_PLAIN = 0, ES_SWIGLU = 1 };

/* ---- one weight block, unpacked ----------------------------------------------------- */

/* A super-block as unsigned codes and per-16 integer factors:
 *   w[i] = d * scale[i / 16] * code[i] - dmin * offset[i / 16]
 * (Q4_K, Q5_K: scale and offset are the 6-bit scale and minimum of i's block of 32; Q2_K: the
 * 4-bit scale and minimum of i's block of 16; Q6_K: code is the 6-bit value, offset = 32 *
 * scale and dmin = d; Q3_K the same with 3-bit codes, offset = 4 * scale, scale the 6-bit
 * value - 32; IQ4_XS: code is the table's value + 128, scale the 6-bit scale - 32 of i's
 * block of 32, offset = 128 * scale). scale_pair[k] holds scale[k] in both 16-bit halves,
 * the form the AVX2 dot broadcasts from. */
typedef struct {
    uint8_t code[QK];
    int16_t offset[SUB];
    int32_t scale_pair[SUB];
    float d;
    float dmin;
} Unpacked;

/* The codes' centre where a type's offset is the centre times its scale (dmin = d: Q3_K 4,
 * Q6_K 32, IQ4_XS 128), else 0. Then a block's dot less its offsets is the exact integer
 * d multiplies, as the vectorized paths sum it, and a weight is d * scale * (code - centre),
 * as ggml dequantizes it. */
static inline int code_centre(int ggml_type) {
    return ggml_type == GGML_Q3_K    ? 4
           : ggml_type == GGML_Q6_K  ? 32
           : ggml_type == GGML_IQ4_XS ? 128
                                      : 0;
}

static inline void set_scale(Unpacked *u, int k, int scale, int offset) {
    u->scale_pair[k] = (int32_t)((uint32_t)(uint16_t)scale * 0x10001u);
    u->offset[k] = (int16_t)offset;
}

/* ---- what the sources give each other ---------------------------------------------- */

/* Outputs n0 .. n1 - 1 of P for every row of X: one instruction set's form of the product. */
typedef void (*es_outputs_fn)(const Product *p, int64_t n0, int64_t n1);

/* The portable reference (gguf_reference.c): every type in either layout, in plain C. */
void es_outputs_portable(const Product *p, int64_t n0, int64_t n1);
void es_quantize_rows_portable(const float *x, int64_t rows, int64_t k, int64_t block,
                               int64_t span, Quantized *out);
void es_swiglu_portable(const float *both, int64_t rows, float *y, int64_t y_stride);
/* Row n of W (k inputs of `ggml_type`, in the rows-of-8 layout where `rows8`) as floats. */
void es_dequantize_row(const uint8_t *w, int ggml_type, int rows8, int64_t k, int64_t n,
                       float *out);

#ifdef ES_X86
#define ES_AVX2 __attribute__((target("avx2,fma,f16c")))
/* gguf_x86.c: the rows-of-8 products with AVX2 (maddubs) and, where the compiler knows them,
 * with dpbusd (AVX-VNNI; AVX512-VNNI on 256 and 512 bits); the activations and SwiGLU's
 * epilogue with AVX2. */
void es_rows8_outputs_avx2(const Product *p, int64_t n0, int64_t n1);
#ifdef ES_VNNI
void es_rows8_outputs_avxvnni(const Product *p, int64_t n0, int64_t n1);
void es_rows8_outputs_avx512vnni(const Product *p, int64_t n0, int64_t n1);
/* The K-quants' several-row passes with 512-bit dpbusd (gguf_rows8_zmm.h), everything else on
 * the 256-bit forms (AVX-VNNI's when `avxvnni`). */
void es_rows8_outputs_zmm(const Product *p, int64_t n0, int64_t n1, int avxvnni);
/* Whether es_rows8_outputs_zmm reads P's activations paired: X's 4-byte groups j and j + 4 of
 * every 32 side by side (es_rows8_pair_inputs), so that a 512-bit lane pair meets two
 * sub-blocks of 16. */
int es_rows8_zmm_pairs_inputs(const Product *p);
#endif
void es_quantize_rows_avx2(const float *x, int64_t rows, int64_t k, int64_t block, int64_t span,
                           Quantized *out);
void es_swiglu_avx2(const float *both, int64_t rows, float *y, int64_t y_stride);
#endif
#ifdef ES_ARM
/* gguf_neon.c: the rows-of-8 products with the dot-product instructions (ARMv8.2 dotprod) and
 * without (ARMv8.0 NEON), the activations quantized and SwiGLU's epilogue with NEON. */
void es_rows8_outputs_neon_dotprod(const Product *p, int64_t n0, int64_t n1);
void es_rows8_outputs_neon_plain(const Product *p, int64_t n0, int64_t n1);
void es_quantize_rows_neon(const float *x, int64_t rows, int64_t k, int64_t block, int64_t span,
                           Quantized *out);
void es_swiglu_neon(const float *both, int64_t rows, float *y, int64_t y_stride);
#endif

/* gguf_dispatch.c: one path of the product per process (or one named, for tests). */
typedef struct {
    const char *name; /* what edgespec_gguf_kernel_path reports */
    es_outputs_fn outputs;
    int simd;      /* the activations quantized and SwiGLU's epilogue with AVX2 or NEON */
    int zmm_pairs; /* the activations paired where es_rows8_zmm_pairs_inputs says so */
} EsKernelPath;
/* The process's path, chosen once (EDGESPEC_GGUF_KERNEL_PATH, else the CPU). */
const EsKernelPath *es_kernel_path(void);
/* The path of that name where this CPU has it, else NULL. */
const EsKernelPath *es_kernel_path_named(const char *name);
/* One product on one path: es_product_start quantizes X (0, or -1 out of memory), then
 * es_product_task runs each of es_product_tasks(&run->p) tasks (on any thread, in any order),
 * and es_product_end frees the activations. */
typedef struct {
    Product p;
    const EsKernelPath *path;
} EsProductRun;
int es_product_start(EsProductRun *run, const float *x);
size_t es_product_tasks(const Product *p);
void es_product_task(void *run, size_t task);
void es_product_end(EsProductRun *run);
/* The activations quantized for `ggml_type` (with AVX2 or NEON where `vectorized`), allocated
 * into *out (0, or -1 out of memory); es_free_quantized frees them. */
int es_quantized_rows(const float *x, int64_t rows, int64_t k, int ggml_type, int vectorized,
                      Quantized *out);
void es_free_quantized(Quantized *x);

/* "avx-vnni", "avx512-vnni", "avx2", "neon-dotprod", "neon" or "portable": the one code path every operator of the library runs in this process. */
ES_EXPORT const char *edgespec_gguf_kernel_path(void);

#include "gguf_rows8.h"

#endif
