/* The ONNX Runtime operator glue of edgespec's kernels, once for every operator: the tables
 * ONNX Runtime reads (names, input and output types and counts, optional inputs, create,
 * compute, destroy) and RegisterCustomOps, which adds them to the domain edgespec.gguf.
 *
 *   GgufMatMul(X float [..., K], W uint8 [N, row bytes], addend float [N] or [..., N]
 *       (optional: a bias or a residual)) -> Y float [..., N]
 *   GgufGather(ids int64 [...], W) -> rows of W dequantized, float [..., K]
 *   CacheAttention(query, key, value, past_key, past_value float, seqlens_k,
 *       total_sequence_length int32) -> output, present_key, present_value float
 *   CacheAttentionHalf: the same with float16 caches (past and present)
 * gguf_ops.c and cache_attention.c describe their attributes and compute them. */
#include <stdlib.h>

#include "gguf_common.h"
#include "ort_ops.h"

static const OrtApiTable *ort;

OrtStatus *es_ort_fail(const char *message) {
    return ES_ORT_CALL(ort, ES_ORT_SLOT_CREATE_STATUS, es_create_status_fn)(
        ES_ORT_INVALID_ARGUMENT, message);
}

OrtStatus *es_ort_shape(const OrtApiTable *api, const OrtValue *value, size_t max_rank,
                        int64_t *dims, size_t *rank) {
    OrtTensorTypeAndShapeInfo *info;
    OrtStatus *status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_TYPE_AND_SHAPE,
                                    es_get_tensor_type_and_shape_fn)(value, &info);
    if (status) return status;
    status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_DIMENSIONS_COUNT, es_get_dimensions_count_fn)(info,
                                                                                         rank);
    if (!status && *rank > max_rank)
        status = es_ort_fail("edgespec.gguf: an input has a rank the operator does not take");
    if (!status && *rank)
        status = ES_ORT_CALL(api, ES_ORT_SLOT_GET_DIMENSIONS, es_get_dimensions_fn)(info, dims,
                                                                                  *rank);
    ES_ORT_CALL(api, ES_ORT_SLOT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO,
                es_release_tensor_type_and_shape_info_fn)(info);
    return status;
}

/* ---- the callbacks every table shares: answers from the EsOp ------------------------- */

#define ES_OP_OF(op) ((const EsOp *)(op))

int es_op_variant(const void *op) { return ES_OP_OF(op)->variant; }
static const char *op_name(const void *op) { return ES_OP_OF(op)->name; }
static const char *op_provider(const void *op) { (void)op; return "CPUExecutionProvider"; }
static int op_input_type(const void *op, size_t i) {
    return i < ES_OP_OF(op)->inputs ? ES_OP_OF(op)->input_types[i] : 0;
}
static size_t op_input_count(const void *op) { return ES_OP_OF(op)->inputs; }
static int op_output_type(const void *op, size_t i) {
    return i < ES_OP_OF(op)->outputs ? ES_OP_OF(op)->output_types[i] : 0;
}
static size_t op_output_count(const void *op) { return ES_OP_OF(op)->outputs; }
/* 0: required, 1: optional (ONNX Runtime's OrtCustomOpInputOutputCharacteristic). */
static int op_input_characteristic(const void *op, size_t i) {
    return i >= ES_OP_OF(op)->optional_from ? 1 : 0;
}
static int op_output_characteristic(const void *op, size_t i) { (void)op, (void)i; return 0; }
static int op_memory(const void *op, size_t i) { (void)op, (void)i; return 0; }
static int op_one(const void *op) { (void)op; return 1; }
static int op_zero(const void *op) { (void)op; return 0; }
static void op_destroy(void *kernel) { free(kernel); }

#define ES_OP_TABLE(create, compute)                                                             \
    {16, NULL, op_name, op_provider, op_input_type, op_input_count, op_output_type,              \
     op_output_count, NULL, op_destroy, op_input_characteristic, op_output_characteristic,      \
     op_memory, op_one, op_zero, op_one, op_zero, create, compute}

static const EsOp ops[] = {
    {ES_OP_TABLE(es_gguf_create, es_gguf_matmul_compute), "GgufMatMul", 3, 1,
     {ES_ORT_FLOAT, ES_ORT_UINT8, ES_ORT_FLOAT}, {ES_ORT_FLOAT}, 2, 0},
    {ES_OP_TABLE(es_gguf_create, es_gguf_gather_compute), "GgufGather", 2, 1,
     {ES_ORT_INT64, ES_ORT_UINT8}, {ES_ORT_FLOAT}, 2, 0},
    {ES_OP_TABLE(es_attention_create, es_attention_compute), "CacheAttention", 7, 3,
     {ES_ORT_FLOAT, ES_ORT_FLOAT, ES_ORT_FLOAT, ES_ORT_FLOAT, ES_ORT_FLOAT, ES_ORT_INT32,
      ES_ORT_INT32},
     {ES_ORT_FLOAT, ES_ORT_FLOAT, ES_ORT_FLOAT}, 7, 0},
    {ES_OP_TABLE(es_attention_create, es_attention_compute), "CacheAttentionHalf", 7, 3,
     {ES_ORT_FLOAT, ES_ORT_FLOAT, ES_ORT_FLOAT, ES_ORT_FLOAT16, ES_ORT_FLOAT16, ES_ORT_INT32,
      ES_ORT_INT32},
     {ES_ORT_FLOAT, ES_ORT_FLOAT16, ES_ORT_FLOAT16}, 7, 1},
};

static OrtCustomOpDomain *domain;

ES_EXPORT OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    const OrtApiTable *api = base->GetApi(ES_ORT_API_VERSION_NEEDED);
    if (!api) return NULL; /* too old a runtime to ask for status: ONNX Runtime reports the op */
    ort = api;
    edgespec_gguf_kernel_path();
    OrtStatus *status;
    if (!domain) {
        if ((status = ES_ORT_CALL(api, ES_ORT_SLOT_CREATE_CUSTOM_OP_DOMAIN,
                                  es_create_custom_op_domain_fn)("edgespec.gguf", &domain)))
            return status;
        es_custom_op_domain_add_fn add =
            ES_ORT_CALL(api, ES_ORT_SLOT_CUSTOM_OP_DOMAIN_ADD, es_custom_op_domain_add_fn);
        for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
            if ((status = add(domain, &ops[i].table))) return status;
    }
    return ES_ORT_CALL(api, ES_ORT_SLOT_ADD_CUSTOM_OP_DOMAIN, es_add_custom_op_domain_fn)(options,
                                                                                        domain);
}
