/* Which form of GGUF's products runs, and a product split into tasks for ONNX Runtime's threads.
 *
 * Paths: AVX2 (x86-64), its VNNI forms (avx-vnni; avx512-vnni, whose several-row passes run
 * on 512-bit registers: gguf_rows8_x86.h, gguf_rows8_zmm.h), NEON with or without the
 * dot-product instructions (AArch64: gguf_neon.c), each chosen at run time when the CPU has
 * it, and the portable reference (gguf_reference.c). Every path computes the same integer
 * sums; a process uses one path for every call.
 *
 * The arithmetic of output (m, n) depends only on row m of X and row n of W: never on how
 * many rows X has, how the outputs are split between tasks and threads, or which other rows
 * share the call. So a one-token step and a verify pass over many tokens give the same bits
 * for the same token, and the runtime needs no padding to keep speculative decoding exact. */
#include "gguf_common.h"

#if defined(ES_ARM) && defined(__linux__)
#include <sys/auxv.h>
#endif

static const EsKernelPath PORTABLE = {"portable", es_outputs_portable, 0, 0};

/* Weights in the file's own layout run the portable reference on every path. The exporter
 * stores every weight whose outputs form groups of 8 in rows of 8 (export/gguf/raw_blocks.py,
 * RawBlocks.rows8), and every catalog model's matrices have output counts that are multiples
 * of 8: the file layout is left to odd shapes (a test model's, a vocabulary of an odd size),
 * where a product is rare enough that a form of its own per instruction set would be code no
 * model runs. */
#ifdef ES_X86
static void outputs_avx2(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_avx2(p, n0, n1);
    else
        es_outputs_portable(p, n0, n1);
}
static const EsKernelPath AVX2 = {"avx2", outputs_avx2, 1, 0};
#ifdef ES_VNNI
/* The rows-of-8 products with dpbusd; everything else as on AVX2. */
static void outputs_avxvnni(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_avxvnni(p, n0, n1);
    else
        outputs_avx2(p, n0, n1);
}

/* AVX512-VNNI: the K-quants' several-row passes on 512-bit dpbusd; the rest on 256-bit
 * dpbusd, VEX-encoded where the CPU has AVX-VNNI. */
static int has_avxvnni;
static void outputs_avx512vnni(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_zmm(p, n0, n1, has_avxvnni);
    else
        outputs_avx2(p, n0, n1);
}
static const EsKernelPath AVX_VNNI = {"avx-vnni", outputs_avxvnni, 1, 0};
static const EsKernelPath AVX512_VNNI = {"avx512-vnni", outputs_avx512vnni, 1, 1};
#endif
#endif

#ifdef ES_ARM
/* The rows-of-8 products on NEON; weights in the file's layout on the portable reference. */
static void outputs_neon_dotprod(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_neon_dotprod(p, n0, n1);
    else
        es_outputs_portable(p, n0, n1);
}

static void outputs_neon_plain(const Product *p, int64_t n0, int64_t n1) {
    if (p->rows8)
        es_rows8_outputs_neon_plain(p, n0, n1);
    else
        es_outputs_portable(p, n0, n1);
}
static const EsKernelPath NEON_DOTPROD = {"neon-dotprod", outputs_neon_dotprod, 1, 0};
static const EsKernelPath NEON = {"neon", outputs_neon_plain, 1, 0};

/* ARMv8.2's dot-product instructions: Linux and Android say so in the auxiliary vector
 * (HWCAP_ASIMDDP, bit 20); every Apple arm64 chip has them. */
static int cpu_has_dotprod(void) {
#if defined(__APPLE__)
    return 1;
#elif defined(__linux__)
    return (getauxval(AT_HWCAP) >> 20) & 1;
#else
    return 0;
#endif
}
#endif

const EsKernelPath *es_kernel_path_named(const char *name) {
    if (strcmp(name, "portable") == 0) return &PORTABLE;
#ifdef ES_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("f16c"))
        return NULL;
    if (strcmp(name, "avx2") == 0) return &AVX2;
#ifdef ES_VNNI
    has_avxvnni = __builtin_cpu_supports("avxvnni");
    if (strcmp(name, "avx-vnni") == 0) return has_avxvnni ? &AVX_VNNI : NULL;
    if (strcmp(name, "avx512-vnni") == 0)
        return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512f")
                   ? &AVX512_VNNI
                   : NULL;
#endif
#endif
#ifdef ES_ARM
    if (strcmp(name, "neon") == 0) return &NEON;
    if (strcmp(name, "neon-dotprod") == 0) return cpu_has_dotprod() ? &NEON_DOTPROD : NULL;
#endif
    return NULL;
}

/* EDGESPEC_GGUF_KERNEL_PATH names a path to take where the CPU has it (tests and comparisons):
 * "portable", "avx2", "avx-vnni" (on a CPU with AVX-VNNI, though it has AVX512-VNNI too),
 * "neon" (on one with dotprod); otherwise the CPU decides, best first. */
static const EsKernelPath *chosen_path(void) {
    static const char *const best_first[] = {"avx512-vnni", "avx-vnni", "avx2", "neon-dotprod",
                                             "neon"};
    const char *forced = getenv("EDGESPEC_GGUF_KERNEL_PATH");
    const EsKernelPath *named = forced && *forced ? es_kernel_path_named(forced) : NULL;
    if (named) return named;
    for (size_t i = 0; i < sizeof best_first / sizeof *best_first; i++)
        if ((named = es_kernel_path_named(best_first[i]))) return named;
    return &PORTABLE;
}

static const EsKernelPath *path;

const EsKernelPath *es_kernel_path(void) {
    if (!path) path = chosen_path();
    return path;
}

ES_EXPORT const char *edgespec_gguf_kernel_path(void) { return es_kernel_path()->name; }

/* ---- the activations ---------------------------------------------------------------- */

void es_free_quantized(Quantized *x) {
    free(x->q), free(x->scale), free(x->sums);
}

int es_quantized_rows(const float *x, int64_t rows, int64_t k, int ggml_type, int vectorized,
                      Quantized *out) {
    int64_t block = block_inputs(ggml_type), span = sum_span(ggml_type);
    out->q = malloc((size_t)(rows * k));
    out->scale = malloc(sizeof(float) * (size_t)(rows * (k / block)));
    out->sums = malloc(sizeof(int16_t) * (size_t)(rows * (k / span)));
    if (!out->q || !out->scale || !out->sums) {
        es_free_quantized(out);
        return -1;
    }
#ifdef ES_X86
    if (vectorized) {
        es_quantize_rows_avx2(x, rows, k, block, span, out);
        return 0;
    }
#endif
#ifdef ES_ARM
    if (vectorized) {
        es_quantize_rows_neon(x, rows, k, block, span, out);
        return 0;
    }
#endif
    (void)vectorized;
    es_quantize_rows_portable(x, rows, k, block, span, out);
    return 0;
}

/* ---- one product in tasks ------------------------------------------------------------ */

/* The activations: x [rows, k] quantized for P's type, in the order the path reads them. */
int es_product_start(EsProductRun *run, const float *x) {
    Product *p = &run->p;
    if (es_quantized_rows(x, p->rows, p->k, p->ggml_type, run->path->simd, &p->x)) return -1;
#if defined(ES_X86) && defined(ES_VNNI)
    if (run->path->zmm_pairs && es_rows8_zmm_pairs_inputs(p))
        es_rows8_pair_inputs(p->x.q, p->rows, p->k);
#endif
    return 0;
}

void es_product_end(EsProductRun *run) { es_free_quantized(&run->p.x); }

size_t es_product_tasks(const Product *p) {
    return (size_t)((p->n + OUTPUTS_PER_TASK - 1) / OUTPUTS_PER_TASK);
}

/* A task of a SwiGLU product: its 16 stored outputs (8 gates, 8 ups; N is a multiple of 16)
 * into a scratch [rows, 16], then silu(gate) * up into Y [rows, N / 2]. Past 64 rows the
 * scratch is allocated; if that fails, the task's outputs are NaN and it returns -1. */
static int swiglu_task(const EsProductRun *run, int64_t n0) {
    const Product *p = &run->p;
    float small[16 * 64];
    float *both = p->rows <= 64 ? small : malloc(sizeof(float) * 16 * (size_t)p->rows);
    float *y = p->y + n0 / 2;
    if (!both) {
        for (int64_t m = 0; m < p->rows; m++)
            for (int i = 0; i < 8; i++) y[m * (p->n / 2) + i] = NAN;
        return -1;
    }
    Product task = *p;
    task.y = both - n0, task.n = 16; /* the paths write y[row * n + output] */
    run->path->outputs(&task, n0, n0 + 16);
#ifdef ES_X86
    if (run->path->simd)
        es_swiglu_avx2(both, p->rows, y, p->n / 2);
    else
#endif
#ifdef ES_ARM
    if (run->path->simd)
        es_swiglu_neon(both, p->rows, y, p->n / 2);
    else
#endif
        es_swiglu_portable(both, p->rows, y, p->n / 2);
    if (both != small) free(both);
    return 0;
}

void es_product_task(void *data, size_t task) {
    const EsProductRun *run = (const EsProductRun *)data;
    const Product *p = &run->p;
    int64_t n0 = (int64_t)task * OUTPUTS_PER_TASK;
    int64_t n1 = n0 + OUTPUTS_PER_TASK < p->n ? n0 + OUTPUTS_PER_TASK : p->n;
    if (p->activation == ES_SWIGLU) {
        swiglu_task(run, n0);
        return;
    }
    run->path->outputs(p, n0, n1);
    if (p->addend)
        for (int64_t m = 0; m < p->rows; m++)
            for (int64_t n = n0; n < n1; n++)
                p->y[m * p->n + n] += p->addend[m * p->addend_stride + n];
}
