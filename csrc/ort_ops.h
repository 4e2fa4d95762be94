/* edgespec's ONNX Runtime operators, described once (ort_ops.c): each operator's table of
 * callbacks answers from an EsOp (name, input and output types and counts, which inputs are
 * optional), and the sources computing them give only their create and compute functions. */
#ifndef EDGESPEC_ORT_OPS_H
#define EDGESPEC_ORT_OPS_H

#include "ort_abi.h"

#define ES_OP_MAX_INPUTS 8
#define ES_OP_MAX_OUTPUTS 4

typedef struct {
    OrtCustomOpV16 table; /* first: the `op` ONNX Runtime passes back is the EsOp's address */
    const char *name;
    size_t inputs, outputs;
    int input_types[ES_OP_MAX_INPUTS]; /* ES_ORT_FLOAT ... */
    int output_types[ES_OP_MAX_OUTPUTS];
    size_t optional_from; /* inputs from this index on may be left out */
    int variant;          /* told to the operator's create function (es_op_variant) */
} EsOp;

/* The operator's `variant` (CacheAttentionHalf: 1, float16 caches). */
int es_op_variant(const void *op);

/* A status of ONNX Runtime's INVALID_ARGUMENT with `message` (the API table that
 * RegisterCustomOps was given). */
OrtStatus *es_ort_fail(const char *message);

/* The shape of `value`: its rank into *rank (refused above max_rank) and dims. */
OrtStatus *es_ort_shape(const OrtApiTable *api, const OrtValue *value, size_t max_rank,
                        int64_t *dims, size_t *rank);

/* The create and compute functions behind the table (gguf_ops.c, cache_attention.c). */
OrtStatus *es_gguf_create(const void *op, const OrtApiTable *api, const OrtKernelInfo *info,
                          void **kernel);
OrtStatus *es_gguf_matmul_compute(void *kernel, OrtKernelContext *context);
OrtStatus *es_gguf_gather_compute(void *kernel, OrtKernelContext *context);
OrtStatus *es_attention_create(const void *op, const OrtApiTable *api, const OrtKernelInfo *info,
                               void **kernel);
OrtStatus *es_attention_compute(void *kernel, OrtKernelContext *context);

#endif
