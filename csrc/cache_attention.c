/* Attention over an in-place KV cache, as an ONNX Runtime custom operator.
 *
 *   edgespec.gguf::CacheAttention(query float [1, S, heads × D], key float [1, S, kv_heads × D],
 *       value float [1, S, kv_heads × D], past_key float [1, kv_heads, C, D],
 *       past_value float [1, kv_heads, C, D], seqlens_k int32 [1], total_sequence_length int32)
 *       -> output float [1, S, heads × D], present_key, present_value (past's shapes)
 *   attributes: num_heads, kv_num_heads, window (0: none; else the row at position t sees
 *   positions t - window + 1 .. t only: llama.cpp's sliding window), sink (0: none; with a
 *   window, a multiple of ATTENTION_BLOCK: positions 0 .. sink - 1 stay visible to every row
 *   too, the "attention sink" a model not trained with a window needs to keep its softmax's
 *   mass where it learnt to put it: a draft run over a window of its history), softcap (0:
 *   none; else each score s becomes softcap * tanh(s / softcap) before the softmax: Gemma 2's 50)
 *
 * The lengths read as GroupQueryAttention's: past P = total_sequence_length - S, and
 * R = seqlens_k + 1 - P real rows (the rest is padding: not written, output zeros). Query and
 * key arrive rotated; query head h reads KV head h / (heads / kv_heads). Row r's key and value
 * go to position P + r of the cache. Bound to past's buffers (the runtime's in-place path),
 * present is written in place; otherwise past's first P positions are copied into it first.
 *
 * Why not GroupQueryAttention: on the CPU it multiplies every query head by all T positions
 * (a sliding window only zeroes probabilities after the products), and runs one thread per
 * (batch, head), so a model with one KV head (Gemma 3 270M, folded) attends on one core.
 * Here a task is one KV head over one block of ATTENTION_BLOCK positions, for every query head
 * sharing it (each key and value read once per row), blocks outside a row's window skipped.
 *
 * Batch invariance: a row's output depends on its own query and the cache only. Its sum over
 * positions splits at fixed absolute positions (multiples of ATTENTION_BLOCK), each block's
 * partial softmax (maximum, sum, weighted values) is computed in position order, and the
 * partials merge in block order: the same arithmetic whatever the pass's width, the thread
 * count or which other rows share the call. Paths: AVX2 + FMA where the GGUF kernels run
 * AVX2 (cache_attention_x86.h), NEON where they run NEON (cache_attention_neon.h: the same bits
 * as AVX2's), portable C otherwise; one path per process. The operator's table: ort_ops.c.
 *
 * edgespec.gguf::CacheAttentionHalf: the same with float16 caches (past_key, past_value,
 * present_key, present_value), as llama.cpp keeps its cache: half the memory and half the
 * bytes read per position. It computes as llama.cpp does over its float16 cache: a new row's
 * key and value are rounded to float16 (to nearest even) as they are written, the query is
 * rounded too (the key products multiply float16 numbers), and the softmax is normalized over
 * all of a row's positions before its probabilities, rounded to float16, weigh the values.
 * So it runs in two passes over the blocks: the scores and each block's maximum; then, after
 * each row's probabilities are formed (summed block by block in order), the weighted values,
 * added in block order. A block's keys and values are widened to float exactly before the
 * float arithmetic, so a row's bits still depend on its query and the cache only. */
#include "gguf_common.h"
#include "ort_ops.h"

#define ATTENTION_BLOCK 128 /* positions per task */
#define MAX_GROUP 16        /* query heads per KV head */

typedef struct {
    const OrtApiTable *api;
    int64_t heads, kv_heads, window, sink;
    int64_t softcap; /* Gemma 2's cap of the scores (0: none): cap * tanh(score / cap) */
    int half;        /* float16 caches */
} AttentionKernel;

/* One call's operands; partial [kv_heads, blocks, R, group, D + 2]: each block's maximum,
 * sum of exponentials and weighted values for one (row, query head). */
typedef struct {
    const float *query;        /* [S, heads × D] */
    const void *keys, *values; /* caches [kv_heads, C, D], float or float16 (half) */
    float *partial, *output;
    int64_t rows, past, heads, kv_heads, group, d, capacity, window, first_block, blocks;
    /* with a sink: the sink's blocks come first (tasks 0 .. sink_blocks - 1), then the window's
     * from first_block on; 0 where the window reaches back into the sink (one run of blocks) */
    int64_t sink, sink_blocks;
    float scale;
    int vectorized, half;
    int phase; /* float16 caches: 0 the scores' pass, 1 the values' */
    /* float16 caches: each block's scores, then probabilities, [kv_heads, blocks, R, group,
     * ATTENTION_BLOCK], position lo of the row's part of the block first */
    float *probabilities;
    volatile int out_of_memory; /* a task could not get its scratch */
    float softcap;              /* 0: none; else scores become softcap * tanh(score / softcap) */
} Attention;
/* ---- one block of positions for one row ------------------------------------------- */

static void scores_portable(const float *q, int64_t group, const float *k, int64_t n,
                            int64_t d, float scale, float *out, int64_t stride) {
    for (int64_t g = 0; g < group; g++)
        for (int64_t j = 0; j < n; j++) {
            float dot = 0.0f;
            for (int64_t i = 0; i < d; i++) dot += q[g * d + i] * k[j * d + i];
            out[g * stride + j] = dot * scale;
        }
}

static float exponentials_portable(float *s, int64_t n, float maximum) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) sum += s[j] = expf(s[j] - maximum);
    return sum;
}

static void weighted_values_portable(float *acc, int64_t stride, const float *p, int64_t p_stride,
                                     int64_t group, const float *v, int64_t n, int64_t d) {
    for (int64_t g = 0; g < group; g++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < d; i++) acc[g * stride + i] += p[g * p_stride + j] * v[j * d + i];
}

/* ---- float16 caches ------------------------------------------------------------- */

/* A calling thread's scratch of at least `floats` floats, grown as needed and kept between
 * calls (a prefill pass's would otherwise be mapped and faulted in afresh each call): *buffer
 * and *capacity are the caller's thread-local state. NULL when out of memory. */
static float *thread_buffer(float **buffer, size_t *capacity, size_t floats) {
    if (floats > *capacity) {
        free(*buffer);
        *buffer = malloc(sizeof(float) * floats);
        *capacity = *buffer ? floats : 0;
    }
    return *buffer;
}

/* A block's keys or values widened to float (exact). */

static void widen_portable(const uint16_t *h, float *f, int64_t n) {
    for (int64_t i = 0; i < n; i++) f[i] = half_to_float(h[i]);
}

/* x rounded to float16 and back into y, n floats (the query, so that the key products multiply
 * float16 numbers, as llama.cpp's over its float16 cache do, its matrix product converting the
 * float operand to the cache's type; the probabilities). To nearest even on every path. */
static void round_to_half_portable(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = half_to_float(float_to_half(x[i]));
}

#include "cache_attention_x86.h"
#include "cache_attention_neon.h"

static void round_to_half(int vectorized, const float *x, float *y, int64_t n) {
#if defined(ES_X86)
    if (vectorized) round_to_half_avx2(x, y, n);
    else
#elif defined(ES_ARM)
    if (vectorized) round_to_half_neon(x, y, n);
    else
#endif
        round_to_half_portable(x, y, n);
}

/* The first position of the call's block bi (its blocks: the sink's, then the window's). */
static inline int64_t block_begin(const Attention *a, int64_t bi) {
    return (bi < a->sink_blocks ? bi : a->first_block + bi - a->sink_blocks) * ATTENTION_BLOCK;
}

/* Row r's positions [*lo, *hi) within the block starting at `begin` (empty: *lo >= *hi); a
 * block of the sink is seen whole, up to the row itself. */
static inline void visible_range(const Attention *a, int64_t r, int64_t begin, int64_t *lo,
                                 int64_t *hi) {
    const int64_t t = a->past + r;
    const int64_t first = a->window && begin >= a->sink && t - a->window + 1 > 0 ? t - a->window + 1 : 0;
    *lo = first > begin ? first : begin;
    *hi = t + 1 < begin + ATTENTION_BLOCK ? t + 1 : begin + ATTENTION_BLOCK;
}

static inline void scores_of(const Attention *a, const float *q, const float *k, int64_t n,
                             float *out) {
#ifdef ES_ATTENTION_VECTOR
    if (a->vectorized)
        ES_ATTENTION_VECTOR(scores)(q, a->group, k, n, a->d, a->scale, out, ATTENTION_BLOCK);
    else
#endif
        scores_portable(q, a->group, k, n, a->d, a->scale, out, ATTENTION_BLOCK);
    if (a->softcap != 0.0f) /* scalar on every path, so every path keeps the same bits */
        for (int64_t g = 0; g < a->group; g++)
            for (int64_t j = 0; j < n; j++)
                out[g * ATTENTION_BLOCK + j] = a->softcap * tanhf(out[g * ATTENTION_BLOCK + j] / a->softcap);
}

/* s[0 .. n) = e^(s - maximum), s padded with -inf to a multiple of 8; their sum. */
static inline float exponentials_of(const Attention *a, float *s, int64_t n, float maximum) {
    const int64_t padded = (n + 7) / 8 * 8;
    for (int64_t j = n; j < padded; j++) s[j] = -INFINITY;
#ifdef ES_ATTENTION_VECTOR
    if (a->vectorized) return ES_ATTENTION_VECTOR(exponentials)(s, padded, maximum);
#endif
    return exponentials_portable(s, n, maximum);
}

static inline void weighted_values_of(const Attention *a, float *acc, const float *p,
                                      const float *v, int64_t n) {
#ifdef ES_ATTENTION_VECTOR
    if (a->vectorized)
        ES_ATTENTION_VECTOR(weighted_values)(acc, a->d + 2, p, ATTENTION_BLOCK, a->group, v, n, a->d);
    else
#endif
        weighted_values_portable(acc, a->d + 2, p, ATTENTION_BLOCK, a->group, v, n, a->d);
}

/* Positions begin .. end - 1 of KV head h's float16 cache (keys or values) widened into this
 * thread's scratch; returns where position p's row would be (p * D floats on), NULL when out
 * of memory. */
static const float *widened_block(const Attention *a, const void *cache, int64_t h,
                                  int64_t begin) {
    static __thread float *state;
    static __thread size_t capacity;
    const int64_t d = a->d;
    const int64_t end = a->past + a->rows < begin + ATTENTION_BLOCK ? a->past + a->rows
                                                                    : begin + ATTENTION_BLOCK;
    float *widened = thread_buffer(&state, &capacity, (size_t)(ATTENTION_BLOCK * d));
    if (!widened) return NULL;
    const uint16_t *from = (const uint16_t *)cache + (h * a->capacity + begin) * d;
    const int64_t n = (end - begin) * d;
#if defined(ES_X86)
    if (a->vectorized) widen_avx2(from, widened, n);
    else
#elif defined(ES_ARM)
    if (a->vectorized) widen_neon(from, widened, n);
    else
#endif
        widen_portable(from, widened, n);
    return widened - begin * d;
}

/* Float caches: one block of positions for every row, the softmax's partial sums over the
 * block (its maximum, the sum of exponentials and the weighted values). */
static void block_task(void *data, size_t task) {
    const Attention *a = (const Attention *)data;
    const int64_t h = (int64_t)task / a->blocks, bi = (int64_t)task % a->blocks;
    const int64_t d = a->d, group = a->group, begin = block_begin(a, bi);
    const float *keys = (const float *)a->keys + h * a->capacity * d;
    const float *values = (const float *)a->values + h * a->capacity * d;
    float scores[MAX_GROUP * ATTENTION_BLOCK]; /* [group, positions], padded with -inf to 8 */
    for (int64_t r = 0; r < a->rows; r++) {
        int64_t lo, hi;
        visible_range(a, r, begin, &lo, &hi);
        float *out = a->partial + ((h * a->blocks + bi) * a->rows + r) * group * (d + 2);
        for (int64_t g = 0; g < group; g++) {
            out[g * (d + 2)] = -INFINITY;
            out[g * (d + 2) + 1] = 0.0f;
            memset(out + g * (d + 2) + 2, 0, sizeof(float) * (size_t)d);
        }
        if (lo >= hi) continue;
        const int64_t n = hi - lo;
        scores_of(a, a->query + r * a->heads * d + h * group * d, keys + lo * d, n, scores);
        for (int64_t g = 0; g < group; g++) {
            float *s = scores + g * ATTENTION_BLOCK, maximum = -INFINITY;
            for (int64_t j = 0; j < n; j++) maximum = s[j] > maximum ? s[j] : maximum;
            out[g * (d + 2)] = maximum;
            out[g * (d + 2) + 1] = exponentials_of(a, s, n, maximum);
        }
        weighted_values_of(a, out + 2, scores, values + lo * d, n);
    }
}

/* Float16 caches, as llama.cpp computes over its float16 cache: the softmax normalized over
 * all positions, then the probabilities rounded to float16 before they weigh the values.
 * Phase 0: one block's scores for every row, stored, and the block's maximum (partial[0];
 * partial[1] is 1 where the row sees the block). Phase 1: the block's values weighed by the
 * stored probabilities (partial[2 ..]). */
static void half_block_task(void *data, size_t task) {
    const Attention *a = (const Attention *)data;
    const int64_t h = (int64_t)task / a->blocks, bi = (int64_t)task % a->blocks;
    const int64_t d = a->d, group = a->group, begin = block_begin(a, bi);
    const float *cache = widened_block(a, a->phase ? a->values : a->keys, h, begin);
    if (!cache) {
        ((Attention *)data)->out_of_memory = 1;
        return;
    }
    for (int64_t r = 0; r < a->rows; r++) {
        int64_t lo, hi;
        visible_range(a, r, begin, &lo, &hi);
        const int64_t at = ((h * a->blocks + bi) * a->rows + r) * group;
        float *out = a->partial + at * (d + 2), *p = a->probabilities + at * ATTENTION_BLOCK;
        if (a->phase) {
            for (int64_t g = 0; g < group; g++)
                memset(out + g * (d + 2) + 2, 0, sizeof(float) * (size_t)d);
            if (lo < hi) weighted_values_of(a, out + 2, p, cache + lo * d, hi - lo);
            continue;
        }
        for (int64_t g = 0; g < group; g++) out[g * (d + 2)] = -INFINITY, out[g * (d + 2) + 1] = 0.0f;
        if (lo >= hi) continue;
        scores_of(a, a->query + r * a->heads * d + h * group * d, cache + lo * d, hi - lo, p);
        for (int64_t g = 0; g < group; g++) {
            const float *s = p + g * ATTENTION_BLOCK;
            float maximum = -INFINITY;
            for (int64_t j = 0; j < hi - lo; j++) maximum = s[j] > maximum ? s[j] : maximum;
            out[g * (d + 2)] = maximum, out[g * (d + 2) + 1] = 1.0f;
        }
    }
}

/* Float16 caches, between the phases: row r's stored scores become probabilities, for each
 * query head e^(s - maximum) over every position the row sees, divided by their sum (summed
 * block by block in order), rounded to float16. */
static void half_normalize_task(void *data, size_t task) {
    const Attention *a = (const Attention *)data;
    const int64_t r = (int64_t)task, d = a->d, group = a->group;
    for (int64_t head = 0; head < a->heads; head++) {
        const int64_t h = head / group, g = head % group;
        float maximum = -INFINITY, sum = 0.0f;
        for (int64_t bi = 0; bi < a->blocks; bi++) {
            const float *part = a->partial + (((h * a->blocks + bi) * a->rows + r) * group + g) * (d + 2);
            maximum = part[0] > maximum ? part[0] : maximum;
        }
        for (int pass = 0; pass < 2; pass++)
            for (int64_t bi = 0; bi < a->blocks; bi++) {
                const int64_t at = ((h * a->blocks + bi) * a->rows + r) * group + g;
                int64_t lo, hi;
                visible_range(a, r, block_begin(a, bi), &lo, &hi);
                if (lo >= hi) continue;
                float *s = a->probabilities + at * ATTENTION_BLOCK;
                if (pass == 0) {
                    sum += exponentials_of(a, s, hi - lo, maximum);
                    continue;
                }
                const float inverse = 1.0f / sum;
                for (int64_t j = 0; j < hi - lo; j++) s[j] *= inverse;
                round_to_half(a->vectorized, s, s, hi - lo);
            }
    }
}

/* Float16 caches, after phase 1: row r's blocks' weighted values added in block order. */
static void half_merge_task(void *data, size_t task) {
    const Attention *a = (const Attention *)data;
    const int64_t r = (int64_t)task, d = a->d, group = a->group;
    for (int64_t head = 0; head < a->heads; head++) {
        const int64_t h = head / group, g = head % group;
        float *y = a->output + (r * a->heads + head) * d;
        memset(y, 0, sizeof(float) * (size_t)d);
        for (int64_t bi = 0; bi < a->blocks; bi++) {
            const float *part = a->partial + (((h * a->blocks + bi) * a->rows + r) * group + g) * (d + 2);
            if (part[1] == 0.0f) continue; /* no visible position in the block */
            for (int64_t i = 0; i < d; i++) y[i] += part[2 + i];
        }
    }
}

/* Row r's blocks merged in block order into its output, one query head at a time. */
static void merge_task(void *data, size_t task) {
    const Attention *a = (const Attention *)data;
    const int64_t r = (int64_t)task, d = a->d, group = a->group;
    for (int64_t head = 0; head < a->heads; head++) {
        const int64_t h = head / group, g = head % group;
        float *y = a->output + (r * a->heads + head) * d, maximum = -INFINITY, sum = 0.0f;
        for (int64_t bi = 0; bi < a->blocks; bi++) {
            const float *part = a->partial + (((h * a->blocks + bi) * a->rows + r) * group + g) * (d + 2);
            maximum = part[0] > maximum ? part[0] : maximum;
        }
        memset(y, 0, sizeof(float) * (size_t)d);
        for (int64_t bi = 0; bi < a->blocks; bi++) {
            const float *part = a->partial + (((h * a->blocks + bi) * a->rows + r) * group + g) * (d + 2);
            if (part[1] == 0.0f) continue; /* no visible position in the block */
            float factor = expf(part[0] - maximum);
            sum += part[1] * factor;
            for (int64_t i = 0; i < d; i++) y[i] += part[2 + i] * factor;
        }
        float inverse = 1.0f / sum;
        for (int64_t i = 0; i < d; i++) y[i] *= inverse;
    }
}

/* ---- the operator ------------------------------------------------------------------- */

static __thread float *partial_state;
static __thread size_t partial_capacity;

/* One call's operands: query [rows, heads × D], the caches [kv_heads, capacity, D] (float16
 * if half) holding positions 0 .. past + rows - 1, output [rows, heads × D]; the blocks of
 * positions any row's window (and sink) reaches; partial NULL when out of memory. */
static Attention attention_of(const float *query, const void *keys, const void *values,
                              float *output, int64_t rows, int64_t past, int64_t heads,
                              int64_t kv_heads, int64_t d, int64_t capacity, int64_t window,
                              int64_t sink, int half) {
    const int64_t start = window && past - window + 1 > 0 ? past - window + 1 : 0;
    int64_t first_block = start / ATTENTION_BLOCK, sink_blocks = window ? sink / ATTENTION_BLOCK : 0;
    if (first_block <= sink_blocks) first_block = 0, sink_blocks = 0; /* one run from block 0 */
    const int64_t blocks =
        sink_blocks + (past + rows + ATTENTION_BLOCK - 1) / ATTENTION_BLOCK - first_block;
    Attention a = {query, keys, values, NULL, output, rows, past, heads, kv_heads, heads / kv_heads,
                   d, capacity, window, first_block, blocks, window ? sink : 0, sink_blocks,
                   1.0f / sqrtf((float)d), 0, 0, 0, NULL, 0};
    a.vectorized = strcmp(edgespec_gguf_kernel_path(), "portable") != 0 && d % 8 == 0;
    const size_t partial = (size_t)(kv_heads * blocks * rows * a.group * (d + 2));
    const int64_t query_floats = half ? rows * heads * d : 0;
    const size_t probabilities = half ? (size_t)(kv_heads * blocks * rows * a.group * ATTENTION_BLOCK) : 0;
    a.partial = thread_buffer(&partial_state, &partial_capacity,
                              partial + (size_t)query_floats + probabilities);
    a.half = half;
    if (half && a.partial) {
        float *rounded = a.partial + partial;
        a.probabilities = rounded + query_floats;
        round_to_half(a.vectorized, query, rounded, query_floats);
        a.query = rounded;
    }
    return a;
}

/* The operator's arithmetic as a plain C entry point (tests, benchmarks): every task on the
 * calling thread. Returns 0, or -1 for shapes the operator refuses or no memory. */
ES_EXPORT int edgespec_cache_attention(const float *query, const float *keys, const float *values,
                                       float *output, int64_t rows, int64_t past, int64_t heads,
                                       int64_t kv_heads, int64_t d, int64_t capacity,
                                       int64_t window) {
    if (kv_heads < 1 || heads % kv_heads || heads / kv_heads > MAX_GROUP || rows < 1 || past < 0 ||
        past + rows > capacity || window < 0)
        return -1;
    Attention a = attention_of(query, keys, values, output, rows, past, heads, kv_heads, d,
                               capacity, window, 0, 0);
    if (!a.partial) return -1;
    for (size_t task = 0; task < (size_t)(kv_heads * a.blocks); task++) block_task(&a, task);
    for (size_t r = 0; r < (size_t)rows; r++) merge_task(&a, r);
    return 0;
}

OrtStatus *es_attention_compute(void *data, OrtKernelContext *context) {
    const AttentionKernel *kernel = (const AttentionKernel *)data;
    const OrtApiTable *api = kernel->api;
    es_kernel_context_get_input_fn input =
        ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_INPUT, es_kernel_context_get_input_fn);
    es_kernel_context_get_output_fn output =
        ES_ORT_CALL(api, ES_ORT_SLOT_KERNEL_CONTEXT_GET_OUTPUT, es_kernel_context_get_output_fn);
    es_get_tensor_mutable_data_fn data_of =
        ES_ORT_CALL(api, ES_ORT_SLOT_GET_TENSOR_MUTABLE_DATA, es_get_tensor_mutable_data_fn);
    const OrtValue *in[7];
    void *ptr[7];
    OrtStatus *status;
    for (size_t i = 0; i < 7; i++) {
        if ((status = input(context, i, &in[i]))) return status;
        if (!in[i]) return es_ort_fail("CacheAttention: every input is required");
        if ((status = data_of((OrtValue *)in[i], &ptr[i]))) return status;
    }
    int64_t qdims[4], cdims[4];
    size_t qrank, crank;
    if ((status = es_ort_shape(api, in[0], 4, qdims, &qrank)) ||
        (status = es_ort_shape(api, in[3], 4, cdims, &crank)))
        return status;
    const int64_t heads = kernel->heads, kv_heads = kernel->kv_heads;
    if (qrank != 3 || qdims[0] != 1 || crank != 4 || cdims[0] != 1 || cdims[1] != kv_heads ||
        qdims[2] != heads * cdims[3])
        return es_ort_fail("CacheAttention: query is not [1, S, heads × D] or the caches "
                                   "not [1, kv_heads, C, D]");
    const int64_t s = qdims[1], capacity = cdims[2], d = cdims[3];
    const int64_t total = *(const int32_t *)ptr[6], last = *(const int32_t *)ptr[5];
    const int64_t past = total - s, rows = last + 1 - past;
    if (past < 0 || rows < 1 || rows > s || past + rows > capacity)
        return es_ort_fail("CacheAttention: seqlens_k and total_sequence_length do not fit "
                                   "the pass and the cache");
    OrtValue *out[3];
    int64_t odims[3] = {1, s, heads * d};
    if ((status = output(context, 0, odims, 3, &out[0])) ||
        (status = output(context, 1, cdims, 4, &out[1])) ||
        (status = output(context, 2, cdims, 4, &out[2])))
        return status;
    float *y;
    void *caches[2];
    if ((status = data_of(out[0], (void **)&y)) || (status = data_of(out[1], &caches[0])) ||
        (status = data_of(out[2], &caches[1])))
        return status;
    const size_t item = kernel->half ? sizeof(uint16_t) : sizeof(float); /* a cache element */
    for (int kind = 0; kind < 2; kind++) { /* the new rows into the cache, after its past */
        const char *past_cache = (const char *)ptr[3 + kind];
        const float *fresh = (const float *)ptr[1 + kind];
        char *cache = (char *)caches[kind];
        for (int64_t h = 0; h < kv_heads; h++) {
            char *head = cache + (size_t)(h * capacity * d) * item;
            if (cache != past_cache) {
                memcpy(head, past_cache + (size_t)(h * capacity * d) * item, item * (size_t)(past * d));
                memset(head + (size_t)((past + rows) * d) * item, 0,
                       item * (size_t)((capacity - past - rows) * d));
            }
            for (int64_t r = 0; r < rows; r++) {
                const float *row = fresh + (r * kv_heads + h) * d;
                if (kernel->half) {
                    uint16_t *to = (uint16_t *)head + (past + r) * d;
                    for (int64_t i = 0; i < d; i++) to[i] = float_to_half(row[i]);
                } else {
                    memcpy((float *)head + (past + r) * d, row, sizeof(float) * (size_t)d);
                }
            }
        }
    }
    if (rows < s) memset(y + rows * heads * d, 0, sizeof(float) * (size_t)((s - rows) * heads * d));
    Attention a = attention_of((const float *)ptr[0], caches[0], caches[1], y, rows, past, heads,
                               kv_heads, d, capacity, kernel->window, kernel->sink, kernel->half);
    if (!a.partial) return es_ort_fail("CacheAttention: out of memory for the partial sums");
    a.softcap = (float)kernel->softcap;
    es_kernel_context_parallel_for_fn parallel_for = ES_ORT_CALL(
        api, ES_ORT_SLOT_KERNEL_CONTEXT_PARALLEL_FOR, es_kernel_context_parallel_for_fn);
    const size_t tasks = (size_t)(kv_heads * a.blocks);
    if (!kernel->half) {
        status = parallel_for(context, block_task, tasks, ES_BATCHES, &a);
        if (!status) status = parallel_for(context, merge_task, (size_t)rows, ES_BATCHES, &a);
        return status;
    }
    status = parallel_for(context, half_block_task, tasks, ES_BATCHES, &a);
    if (!status && !a.out_of_memory)
        status = parallel_for(context, half_normalize_task, (size_t)rows, ES_BATCHES, &a);
    a.phase = 1;
    if (!status && !a.out_of_memory) status = parallel_for(context, half_block_task, tasks, ES_BATCHES, &a);
    if (!status && a.out_of_memory)
        return es_ort_fail("CacheAttention: out of memory for a block's widened cache");
    if (!status) status = parallel_for(context, half_merge_task, (size_t)rows, ES_BATCHES, &a);
    return status;
}

OrtStatus *es_attention_create(const void *op, const OrtApiTable *api,
                                   const OrtKernelInfo *info, void **out) {
    AttentionKernel *kernel = calloc(1, sizeof *kernel);
    if (!kernel) return es_ort_fail("CacheAttention: out of memory");
    es_kernel_info_get_attribute_int64_fn attribute = ES_ORT_CALL(
        api, ES_ORT_SLOT_KERNEL_INFO_GET_ATTRIBUTE_INT64, es_kernel_info_get_attribute_int64_fn);
    OrtStatus *status;
    if ((status = attribute(info, "num_heads", &kernel->heads)) ||
        (status = attribute(info, "kv_num_heads", &kernel->kv_heads))) {
        free(kernel);
        return status;
    }
    if ((status = attribute(info, "window", &kernel->window))) /* optional: none */
        ES_ORT_CALL(api, ES_ORT_SLOT_RELEASE_STATUS, es_release_status_fn)(status), kernel->window = 0;
    if ((status = attribute(info, "sink", &kernel->sink))) /* optional: none */
        ES_ORT_CALL(api, ES_ORT_SLOT_RELEASE_STATUS, es_release_status_fn)(status), kernel->sink = 0;
    if ((status = attribute(info, "softcap", &kernel->softcap))) /* optional: none */
        ES_ORT_CALL(api, ES_ORT_SLOT_RELEASE_STATUS, es_release_status_fn)(status), kernel->softcap = 0;
    if (kernel->kv_heads < 1 || kernel->heads % kernel->kv_heads ||
        kernel->heads / kernel->kv_heads > MAX_GROUP || kernel->window < 0 || kernel->softcap < 0 ||
        kernel->sink < 0 || kernel->sink % ATTENTION_BLOCK) {
        free(kernel);
        return es_ort_fail("CacheAttention: num_heads must be a multiple of kv_num_heads "
                                   "(at most 16 query heads per KV head), window and softcap 0 "
                                   "or more, sink 0 or a multiple of 128");
    }
    kernel->api = api;
    kernel->half = es_op_variant(op);
    *out = kernel;
    return NULL;
}

