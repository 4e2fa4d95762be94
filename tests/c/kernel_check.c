/* A command-line driver of the GGUF kernels' plain C entry points, for checking a build for
 * another CPU (tests/test_neon_kernels.py cross-compiles it for AArch64 with the kernel
 * sources and runs it under qemu-aarch64).
 *
 *   kernel_check matmul IN OUT    IN: int64 ggml_type (+ 1024 for rows of 8), rows, k, n,
 *                                 activation (0, or 1: SwiGLU), then x float32 [rows, k] and
 *                                 W's bytes; OUT: y [rows, n] (SwiGLU: [rows, n / 2])
 *   kernel_check quantize IN OUT  IN: int64 ggml_type, rows, k, then x; OUT: the vectorized
 *                                 quantizer's q, scale, sums, then the scalar one's
 *   kernel_check attention IN OUT IN: int64 rows, past, heads, kv_heads, d, capacity, window,
 *                                 then query float32 [rows, heads × d], keys and values
 *                                 [kv_heads, capacity, d]; OUT: CacheAttention's output
 * All print the kernels' path ("neon-dotprod", "neon", "avx2", "portable") on stdout. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *edgespec_gguf_kernel_path(void);
int edgespec_gguf_matmul(const float *x, const uint8_t *w, float *y, int64_t rows, int64_t k,
                         int64_t n, int ggml_type, int activation);
int edgespec_gguf_quantize(const float *x, int64_t rows, int64_t k, int ggml_type,
                           int vectorized, int8_t *q, float *scale, int16_t *sums);
int edgespec_cache_attention(const float *query, const float *keys, const float *values,
                             float *output, int64_t rows, int64_t past, int64_t heads,
                             int64_t kv_heads, int64_t d, int64_t capacity, int64_t window);

static void *read_all(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *data = malloc((size_t)*size);
    if (data && fread(data, 1, (size_t)*size, f) != (size_t)*size) data = NULL;
    fclose(f);
    return data;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: kernel_check matmul|quantize IN OUT\n");
        return 2;
    }
    long size = 0;
    int64_t *header = read_all(argv[2], &size);
    if (!header) {
        fprintf(stderr, "kernel_check: cannot read %s\n", argv[2]);
        return 2;
    }
    FILE *out = fopen(argv[3], "wb");
    if (!out) return 2;
    const int type = (int)header[0];
    const int64_t rows = header[1], k = header[2];
    if (strcmp(argv[1], "attention") == 0) {
        const int64_t heads = header[2], kv_heads = header[3], d = header[4], capacity = header[5];
        const float *query = (const float *)(header + 7);
        const float *keys = query + header[0] * heads * d, *values = keys + kv_heads * capacity * d;
        float *y = calloc((size_t)(header[0] * heads * d), sizeof(float));
        if (edgespec_cache_attention(query, keys, values, y, header[0], header[1], heads, kv_heads,
                                     d, capacity, header[6]))
            return 1;
        fwrite(y, sizeof(float), (size_t)(header[0] * heads * d), out);
    } else if (strcmp(argv[1], "matmul") == 0) {
        const int64_t n = header[3], width = header[4] ? n / 2 : n;
        const float *x = (const float *)(header + 5);
        const uint8_t *w = (const uint8_t *)(x + rows * k);
        float *y = calloc((size_t)(rows * width), sizeof(float));
        if (edgespec_gguf_matmul(x, w, y, rows, k, n, type, (int)header[4])) return 1;
        fwrite(y, sizeof(float), (size_t)(rows * width), out);
    } else {
        const float *x = (const float *)(header + 3);
        const int64_t blocks = k / ((type == 12 || type == 14) ? 256 : 32);
        const int64_t spans = k / ((type == 12 || type == 14) ? 16 : 32);
        int8_t *q = malloc((size_t)(rows * k));
        float *scale = malloc(sizeof(float) * (size_t)(rows * blocks));
        int16_t *sums = malloc(sizeof(int16_t) * (size_t)(rows * spans));
        for (int vectorized = 1; vectorized >= 0; vectorized--) {
            if (edgespec_gguf_quantize(x, rows, k, type, vectorized, q, scale, sums)) return 1;
            fwrite(q, 1, (size_t)(rows * k), out);
            fwrite(scale, sizeof(float), (size_t)(rows * blocks), out);
            fwrite(sums, sizeof(int16_t), (size_t)(rows * spans), out);
        }
    }
    fclose(out);
    printf("%s\n", edgespec_gguf_kernel_path());
    return 0;
}
