/* This machine's memory read bandwidth: the ceiling of a one-token step, which reads every
 * weight once. Each thread sums its own buffer (larger than the last-level cache) `rounds`
 * times; the figure is bytes read over the wall time.
 *
 *     cc -O3 -march=native -pthread benchmarks/read_bandwidth.c -o /tmp/read_bandwidth
 *     /tmp/read_bandwidth [threads 2] [MiB per thread 512] [rounds 5]
 *
 * Compare a step's bytes over its time (benchmarks/step_cost.py; the weights' size from
 * `edgespec info`) in the same minute: this machine's bandwidth moves with its neighbours. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    uint64_t *words;
    size_t count;
    int rounds;
    uint64_t sum;
} Reader;

static void *read_all(void *data) {
    Reader *reader = data;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (int round = 0; round < reader->rounds; round++) {
        reader->words[round] += (uint64_t)round; /* a store: the next round cannot be hoisted */
        for (size_t i = 0; i < reader->count; i += 4) {
            a += reader->words[i];
            b += reader->words[i + 1];
            c += reader->words[i + 2];
            d += reader->words[i + 3];
        }
    }
    reader->sum = a + b + c + d;
    return NULL;
}

static double seconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    const size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 512;
    const int rounds = argc > 3 ? atoi(argv[3]) : 5;
    if (threads < 1 || threads > 256 || mib < 1 || rounds < 1) {
        fprintf(stderr, "usage: read_bandwidth [threads 1-256] [MiB per thread] [rounds]\n");
        return 2;
    }
    Reader *readers = calloc((size_t)threads, sizeof *readers);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    if (!readers || !ids) return 1;
    for (int t = 0; t < threads; t++) {
        readers[t].count = mib * 1024 * 1024 / sizeof(uint64_t);
        readers[t].rounds = rounds;
        readers[t].words = malloc(readers[t].count * sizeof(uint64_t));
        if (!readers[t].words) {
            fprintf(stderr, "read_bandwidth: cannot allocate %zu MiB; pass fewer MiB\n", mib);
            return 1;
        }
        memset(readers[t].words, t + 1, readers[t].count * sizeof(uint64_t)); /* pages in */
    }
    const double start = seconds();
    for (int t = 0; t < threads; t++) pthread_create(&ids[t], NULL, read_all, &readers[t]);
    uint64_t total = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        total += readers[t].sum;
    }
    const double elapsed = seconds() - start;
    const double bytes = (double)threads * (double)rounds * (double)(mib * 1024 * 1024);
    printf("{\"threads\": %d, \"GB_per_s\": %.2f, \"checksum\": %llu}\n", threads,
           bytes / elapsed / 1e9, (unsigned long long)(total & 0xFFFF));
    return 0;
}
