/* GGUF's products as plain C entry points, without ONNX Runtime: tests (tests/kernels, and
 * tests/c/kernel_check.c cross-compiled for AArch64), benchmarks. Every task runs on the
 * calling thread. */
#include "gguf_common.h"

/* The activations as a product of `ggml_type` quantizes them (tests: the AVX2 quantizer
 * against the scalar one): q [rows, k], scale [rows, k / block], sums [rows, k / span].
 * Returns 0, or -1 for an unknown type or a `vectorized` request on the portable path. */
ES_EXPORT int edgespec_gguf_quantize(const float *x, int64_t rows, int64_t k, int ggml_type,
                                     int vectorized, int8_t *q, float *scale, int16_t *sums) {
    if (!block_bytes(ggml_type) || k % block_inputs(ggml_type)) return -1;
    if (vectorized && !es_kernel_path()->simd) return -1;
    Quantized out;
    if (es_quantized_rows(x, rows, k, ggml_type, vectorized, &out)) return -1;
    memcpy(q, out.q, (size_t)(rows * k));
    memcpy(scale, out.scale, sizeof(float) * (size_t)(rows * (k / block_inputs(ggml_type))));
    memcpy(sums, out.sums, sizeof(int16_t) * (size_t)(rows * (k / sum_span(ggml_type))));
    es_free_quantized(&out);
    return 0;
}

/* edgespec_gguf_matmul on the path named `path` ("portable", "avx2", "avx-vnni",
 * "avx512-vnni", "neon-dotprod", "neon"): returns 0, -1 for an unsupported type or width, or
 * -2 where this CPU (or this build) lacks the path. The kernel harness compares every path
 * against "portable" in one process this way. */
ES_EXPORT int edgespec_gguf_matmul_on(const char *path, const float *x, const uint8_t *w,
                                      float *y, int64_t rows, int64_t k, int64_t n,
                                      int ggml_type, int activation) {
    const EsKernelPath *chosen = es_kernel_path_named(path);
    if (!chosen) return -2;
    const int rows8 = ggml_type >= ES_ROWS8;
    if (rows8) ggml_type -= ES_ROWS8;
    if (!block_bytes(ggml_type) || k % block_inputs(ggml_type)) return -1;
    if (rows8 && !es_rows8_supported(ggml_type, n)) return -1;
    if (activation == ES_SWIGLU && n % 16) return -1;
    EsProductRun run = {{ggml_type, k, n, rows, row_bytes(ggml_type, k), w, {NULL, NULL, NULL},
                         y, NULL, 0, rows8, activation == ES_SWIGLU ? ES_SWIGLU : ES_PLAIN},
                        chosen};
    if (es_product_start(&run, x)) return -1;
    for (size_t t = 0; t < es_product_tasks(&run.p); t++) es_product_task(&run, t);
    es_product_end(&run);
    return 0;
}

/* y [rows, n] = x [rows, k] @ W.T on the process's path, or with `activation` ES_SWIGLU
 * y [rows, n / 2] = SwiGLU of W's alternate groups of 8 gates and ups; returns 0, or -1 for an
 * unsupported type or width. */
ES_EXPORT int edgespec_gguf_matmul(const float *x, const uint8_t *w, float *y, int64_t rows,
                                   int64_t k, int64_t n, int ggml_type, int activation) {
    return edgespec_gguf_matmul_on(edgespec_gguf_kernel_path(), x, w, y, rows, k, n, ggml_type,
                                   activation);
}

/* W [n, row bytes] of `ggml_type` (+ ES_ROWS8 in the rows-of-8 layout) dequantized into
 * out [n, k], as GgufGather reads rows: 0, or -1 for an unsupported type or width. Tests read a
 * weight back from both layouts this way (the rows-of-8 writer against this reader). */
ES_EXPORT int edgespec_gguf_dequantize(const uint8_t *w, int ggml_type, int64_t k, int64_t n,
                                       float *out) {
    const int rows8 = ggml_type >= ES_ROWS8;
    if (rows8) ggml_type -= ES_ROWS8;
    if (!block_bytes(ggml_type) || k % block_inputs(ggml_type)) return -1;
    if (rows8 && !es_rows8_supported(ggml_type, n)) return -1;
    for (int64_t row = 0; row < n; row++) es_dequantize_row(w, ggml_type, rows8, k, row, out + row * k);
    return 0;
}
