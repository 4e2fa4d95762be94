/* The slice of ONNX Runtime's C ABI that a custom-operator library needs, declared here
 * because the onnxruntime wheels ship the library without its headers.
 *
 * ONNX Runtime's API table (OrtApi) is a struct of function pointers whose order is frozen
 * once a version ships: new functions are only appended. A library asks OrtApiBase::GetApi
 * for a table version and calls through fixed slots, so the slot numbers below are the
 * whole contract. Each slot is an index into that table of pointers (all pointers are one
 * word, so the index fixes the offset). The table grows by version; the highest slot used
 * here (ES_ORT_SLOT_KERNEL_CONTEXT_PARALLEL_FOR) exists from table version 18 on, which
 * is why RegisterCustomOps asks for that version and refuses older runtimes. */
#ifndef EDGESPEC_ORT_ABI_H
#define EDGESPEC_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;

/* The API table, seen as an array of untyped slots. */
typedef struct OrtApiTable {
    void *slot[1];
} OrtApiTable;

typedef struct OrtApiBase {
    const OrtApiTable *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

#define ES_ORT_API_VERSION_NEEDED 18

/* Slot numbers in the API table. */
enum {
    ES_ORT_SLOT_CREATE_STATUS = 0,
    ES_ORT_SLOT_GET_ERROR_MESSAGE = 2,
    ES_ORT_SLOT_CREATE_CUSTOM_OP_DOMAIN = 26,
    ES_ORT_SLOT_CUSTOM_OP_DOMAIN_ADD = 27,
    ES_ORT_SLOT_ADD_CUSTOM_OP_DOMAIN = 28,
    ES_ORT_SLOT_GET_TENSOR_MUTABLE_DATA = 51,
    ES_ORT_SLOT_GET_DIMENSIONS_COUNT = 61,
    ES_ORT_SLOT_GET_DIMENSIONS = 62,
    ES_ORT_SLOT_GET_TENSOR_SHAPE_ELEMENT_COUNT = 64,
    ES_ORT_SLOT_GET_TENSOR_TYPE_AND_SHAPE = 65,
    ES_ORT_SLOT_KERNEL_INFO_GET_ATTRIBUTE_INT64 = 86,
    ES_ORT_SLOT_KERNEL_CONTEXT_GET_INPUT_COUNT = 88,
    ES_ORT_SLOT_KERNEL_CONTEXT_GET_INPUT = 90,
    ES_ORT_SLOT_KERNEL_CONTEXT_GET_OUTPUT = 91,
    ES_ORT_SLOT_RELEASE_STATUS = 93,
    ES_ORT_SLOT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99,
    ES_ORT_SLOT_KERNEL_CONTEXT_PARALLEL_FOR = 274,
};

/* The signatures behind those slots (C calling convention on every platform but 32-bit
 * Windows, which this library does not target). */
typedef OrtStatus *(*es_create_status_fn)(int code, const char *message);
typedef const char *(*es_get_error_message_fn)(const OrtStatus *status);
typedef OrtStatus *(*es_create_custom_op_domain_fn)(const char *domain, OrtCustomOpDomain **out);
typedef OrtStatus *(*es_custom_op_domain_add_fn)(OrtCustomOpDomain *domain, const void *op);
typedef OrtStatus *(*es_add_custom_op_domain_fn)(OrtSessionOptions *options,
                                                 OrtCustomOpDomain *domain);
typedef OrtStatus *(*es_get_tensor_mutable_data_fn)(OrtValue *value, void **out);
typedef OrtStatus *(*es_get_dimensions_count_fn)(const OrtTensorTypeAndShapeInfo *info,
                                                 size_t *out);
typedef OrtStatus *(*es_get_dimensions_fn)(const OrtTensorTypeAndShapeInfo *info, int64_t *dims,
                                           size_t count);
typedef OrtStatus *(*es_get_tensor_shape_element_count_fn)(
    const OrtTensorTypeAndShapeInfo *info, size_t *out);
typedef OrtStatus *(*es_kernel_context_get_input_count_fn)(const OrtKernelContext *context,
                                                           size_t *out);
typedef OrtStatus *(*es_get_tensor_type_and_shape_fn)(const OrtValue *value,
                                                      OrtTensorTypeAndShapeInfo **out);
typedef OrtStatus *(*es_kernel_info_get_attribute_int64_fn)(const OrtKernelInfo *info,
                                                            const char *name, int64_t *out);
typedef OrtStatus *(*es_kernel_context_get_input_fn)(const OrtKernelContext *context,
                                                     size_t index, const OrtValue **out);
typedef OrtStatus *(*es_kernel_context_get_output_fn)(OrtKernelContext *context, size_t index,
                                                      const int64_t *dims, size_t count,
                                                      OrtValue **out);
typedef void (*es_release_status_fn)(OrtStatus *status);
typedef void (*es_release_tensor_type_and_shape_info_fn)(OrtTensorTypeAndShapeInfo *info);
typedef OrtStatus *(*es_kernel_context_parallel_for_fn)(const OrtKernelContext *context,
                                                        void (*fn)(void *, size_t), size_t total,
                                                        size_t num_batch, void *user_data);

#define ES_ORT_CALL(api, index, type) ((type)((api)->slot[(index)]))

/* ONNX element types and error codes used here. */
enum { ES_ORT_FLOAT = 1, ES_ORT_UINT8 = 2, ES_ORT_INT32 = 6, ES_ORT_INT64 = 7, ES_ORT_FLOAT16 = 10 };
enum { ES_ORT_FAIL = 1, ES_ORT_INVALID_ARGUMENT = 2 };

/* The custom operator description ONNX Runtime reads. Its layout is frozen like the API
 * table's; ONNX Runtime reads only the fields that exist at the struct version the library
 * states (16 here: the fields through KernelComputeV2). */
typedef struct OrtCustomOpV16 {
    uint32_t version;
    void *(*CreateKernel)(const void *op, const OrtApiTable *api, const OrtKernelInfo *info);
    const char *(*GetName)(const void *op);
    const char *(*GetExecutionProviderType)(const void *op);
    int (*GetInputType)(const void *op, size_t index);
    size_t (*GetInputTypeCount)(const void *op);
    int (*GetOutputType)(const void *op, size_t index);
    size_t (*GetOutputTypeCount)(const void *op);
    void (*KernelCompute)(void *kernel, OrtKernelContext *context);
    void (*KernelDestroy)(void *kernel);
    int (*GetInputCharacteristic)(const void *op, size_t index);
    int (*GetOutputCharacteristic)(const void *op, size_t index);
    int (*GetInputMemoryType)(const void *op, size_t index);
    int (*GetVariadicInputMinArity)(const void *op);
    int (*GetVariadicInputHomogeneity)(const void *op);
    int (*GetVariadicOutputMinArity)(const void *op);
    int (*GetVariadicOutputHomogeneity)(const void *op);
    OrtStatus *(*CreateKernelV2)(const void *op, const OrtApiTable *api,
                                 const OrtKernelInfo *info, void **kernel);
    OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *context);
} OrtCustomOpV16;

#endif
