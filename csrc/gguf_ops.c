/* GgufMatMul and GgufGather computed (their tables: ort_ops.c).
 *
 *   edgespec.gguf::GgufMatMul(X float [..., K], W uint8 [N, row bytes], addend float [N] or
 *       [..., N] (optional: a bias or a residual, added)) -> Y float [..., N]
 *   attributes: ggml_type (2 = Q4_0, 3 = Q4_1, 6 = Q5_0, 7 = Q5_1, 8 = Q8_0, 10 = Q2_K,
 *   11 = Q3_K, 12 = Q4_K, 13 = Q5_K, 14 = Q6_K, 20 = IQ4_NL, 23 = IQ4_XS: ggml's type ids;
 *   the id + 1024 when W is in the rows-of-8 layout of gguf_rows8.h), in_features K,
 *   out_features N, activation (optional: 1 for SwiGLU)
 *   edgespec.gguf::GgufGather(ids int64 [...], W) -> rows of W dequantized, float [..., K]
 *   (the embedding lookup, so a tied embedding is stored once, as the file's blocks)
 *
 * W holds the GGUF file's own blocks, row n being output n's K inputs, byte for byte (or
 * moved into rows of 8). The product runs on the process's path (gguf_dispatch.c), its tasks
 * on ONNX Runtime's threads. */
#include "gguf_common.h"
#include "ort_ops.h"

typedef struct {
    const OrtApiTable *api;
    int64_t ggml_type, k, n;
    int rows8; /* W in the rows-of-8 layout (the attribute was ggml_type + ES_ROWS8) */
    int activation; /* GgufMatMul's optional attribute `activation`: ES_PLAIN or ES_SWIGLU */
} Kernel;

OrtStatus *es_gguf_create(const void *op, const OrtApiTable *api, const OrtKernelInfo *info,
                          void **out) {
    (void)op;
    Kernel *kernel = calloc(1, sizeof *kernel);
    if (!kernel) return es_ort_fail("GgufMatMul: out of memory");
    es_kernel_info_get_attribute_int64_fn attribute = ES_ORT_CALL(
        api, ES_ORT_SLOT_KERNEL_INFO_GET_ATTRIBUTE_INT64, es_kernel_info_get_attribute_int64_fn);
    const char *names[3] = {"ggml_type", "in_features", "out_features"};
    int64_t *fields[3] = {&kernel->ggml_type, &kernel->k, &kernel->n};
    for (int i = 0; i < 3; i++) {
        OrtStatus *status = attribute(info, names[i], fields[i]);
        if (status) {
            free(kernel);
            return status;
        }
    }
    int64_t activation = ES_PLAIN;
    OrtStatus *absent = attribute(info, "activation", &activation);
    if (absent) /* an optional attribute: its absence is ES_PLAIN */
        ES_ORT_CALL(api, ES_ORT_SLOT_RELEASE_STATUS, es_release_status_fn)(absent), activation = ES_PLAIN;
    if (activation != ES_PLAIN && (activation != ES_SWIGLU || kernel->n % 16)) {
        free(kernel);
        return es_ort_fail("GgufMatMul: activation must be 0 (none) or 1 (SwiGLU, with out_features "
                    "a multiple of 16: gates and ups in alternate groups of 8)");
    }
    kernel->activation = (int)activation;
    if (kernel->ggml_type >= ES_ROWS8) kernel->rows8 = 1, kernel->ggml_type -= ES_ROWS8;
    int type = (int)kernel->ggml_type;
    if (!block_bytes(type) || kernel->k <= 0 || kernel->k % block_inputs(type) || kernel->n <= 0) {
        free(kernel);
        return es_ort_fail("GgufMatMul/GgufGather: ggml_type must be Q4_0 (2), Q4_1 (3), Q5_0 (6), "
                    "Q5_1 (7), Q8_0 (8), Q2_K (10), Q3_K (11), Q4_K (12), Q5_K (13), Q6_K (14), "
                    "IQ4_NL (20) or IQ4_XS (23), with in_features a multiple of its block (32, or "
                    "256 for the K-quants and IQ4_XS)");
    }
    if (kernel->rows8 && !es_rows8_supported(type, kernel->n)) {
        free(kernel);
        return es_ort_fail("GgufMatMul/GgufGather: the rows-of-8 layout (ggml_type + 1024) takes "
                    "out_features a multiple of 8");
    }
    kernel->api = api;
    *out = kernel;
    return NULL;
}

/* Both operators' inputs: the first one (X or ids) with its shape, and W; then the output
 * of shape dims[0 .. rank - 1] + [width] (X's last dimension replaced when it is `replace`). */
typedef struct {
    const void *first, *w;
    void *y;
    int64_t dims[8];
    size_t rank;
} Operands;

static OrtStatus *operands(const Kernel *kernel, OrtKernelContext *context, size_t max_rank,
                           int replace, int64_t width, Operands *out) {
    const OrtApiTable *api = kernel->api;
    const OrtValue *first, *w;
    OrtValue *y;
    OrtStatus *status;
    es_kernel_context_get_input_fn input =
        ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_INPUT, es_kernel_context_get_input_fn);
    es_get_tensor_mutable_data_fn data_of =
        ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_MUTABLE_DATA, es_get_tensor_mutable_data_fn);
    if ((status = input(context, 0, &first)) || (status = input(context, 1, &w))) return status;
    if ((status = es_ort_shape(api, first, max_rank, out->dims, &out->rank))) return status;
    if (replace && out->rank == 0)
        return es_ort_fail("edgespec.gguf: an input has a rank the operator does not take");
    size_t output_rank = replace ? out->rank : out->rank + 1;
    if (replace && out->dims[out->rank - 1] != kernel->k)
        return es_ort_fail("GgufMatMul: X's last dimension is not in_features");
    out->dims[output_rank - 1] = width;
    void *first_data, *w_data;
    if ((status = ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_OUTPUT,
                              es_kernel_context_get_output_fn)(context, 0, out->dims,
                                                               output_rank, &y)) ||
        (status = data_of((OrtValue *)first, &first_data)) ||
        (status = data_of((OrtValue *)w, &w_data)) || (status = data_of(y, &out->y)))
        return status;
    out->first = first_data, out->w = w_data;
    return NULL;
}

/* GgufMatMul's optional input `index`: *data and its element count, or *data NULL when the
 * node leaves it out. */
static OrtStatus *optional_input(const Kernel *kernel, OrtKernelContext *context, size_t index,
                                 void **data, int64_t *elements) {
    const OrtApiTable *api = kernel->api;
    size_t count = 0;
    const OrtValue *value = NULL;
    OrtStatus *status = ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_INPUT_COUNT,
                                    es_kernel_context_get_input_count_fn)(context, &count);
    *data = NULL;
    if (status || count <= index) return status;
    if ((status = ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_INPUT,
                              es_kernel_context_get_input_fn)(context, index, &value)) ||
        !value)
        return status;
    OrtTensorTypeAndShapeInfo *info;
    if ((status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_TYPE_AND_SHAPE,
                              es_get_tensor_type_and_shape_fn)(value, &info)))
        return status;
    size_t count_elements = 0;
    status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_SHAPE_ELEMENT_COUNT,
                         es_get_tensor_shape_element_count_fn)(info, &count_elements);
    ES_ORT_CALL(api, ES_ORT_SLOT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO,
                es_release_tensor_type_and_shape_info_fn)(info);
    if (status) return status;
    *elements = (int64_t)count_elements;
    return ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_MUTABLE_DATA,
                       es_get_tensor_mutable_data_fn)((OrtValue *)value, data);
}

/* GgufMatMul's optional third input: a bias [N] or a residual of Y's shape, added to Y (one
 * kernel instead of a matrix product and an Add). */
static OrtStatus *addend(const Kernel *kernel, OrtKernelContext *context, int64_t rows,
                         Product *p) {
    void *data;
    int64_t elements = 0;
    OrtStatus *status = optional_input(kernel, context, 2, &data, &elements);
    if (status || !data) return status;
    if (elements != kernel->n && elements != rows * kernel->n)
        return es_ort_fail("GgufMatMul: the addend is neither [out_features] nor Y's shape");
    p->addend = (const float *)data;
    p->addend_stride = elements == kernel->n ? 0 : kernel->n;
    return NULL;
}

OrtStatus *es_gguf_matmul_compute(void *data, OrtKernelContext *context) {
    const Kernel *kernel = (const Kernel *)data;
    Operands io;
    const int64_t width = kernel->activation == ES_SWIGLU ? kernel->n / 2 : kernel->n;
    OrtStatus *status = operands(kernel, context, 8, 1, width, &io);
    if (status) return status;
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < io.rank; i++) rows *= io.dims[i];
    if (rows == 0) return NULL;
    int type = (int)kernel->ggml_type;
    EsProductRun run = {{type, kernel->k, kernel->n, rows, row_bytes(type, kernel->k), io.w,
                         {NULL, NULL, NULL}, io.y, NULL, 0, kernel->rows8, kernel->activation},
                        es_kernel_path()};
    Product *p = &run.p;
    if ((status = addend(kernel, context, rows, p))) return status;
    if (p->addend && p->activation != ES_PLAIN)
        return es_ort_fail("GgufMatMul: an addend and an activation do not go together");
    if (es_product_start(&run, (const float *)io.first)) return es_ort_fail("GgufMatMul: out of memory for the quantized activations");
    status = ES_ORT_CALL(kernel->api, ES_ORT_SLOT_KERNEL_CONTEXT_PARALLEL_FOR,
                         es_kernel_context_parallel_for_fn)(context, es_product_task,
                                                            es_product_tasks(p), ES_BATCHES, &run);
    es_product_end(&run);
    return status;
}

OrtStatus *es_gguf_gather_compute(void *data, OrtKernelContext *context) {
    const Kernel *kernel = (const Kernel *)data;
    Operands io;
    OrtStatus *status = operands(kernel, context, 7, 0, kernel->k, &io);
    if (status) return status;
    int64_t count = 1;
    for (size_t i = 0; i < io.rank; i++) count *= io.dims[i];
    for (int64_t i = 0; i < count; i++) {
        int64_t id = ((const int64_t *)io.first)[i];
        if (id < 0 || id >= kernel->n) return es_ort_fail("GgufGather: a token id is outside the table");
        es_dequantize_row((const uint8_t *)io.w, (int)kernel->ggml_type, kernel->rows8, kernel->k, id,
                          (float *)io.y + i * kernel->k);
    }
    return NULL;
}
