/* The preload client's large-block microbenchmark: under whatever allocator
 * the environment preloads, allocate a block, write one byte per 4 KiB page,
 * free it; repeated, on 1 or 2 threads. One row per block size (2, 8, 32,
 * 128, 256 MiB) and one for a mix of those sizes. Prints one line per row:
 * "ROW name threads ns_per_op".
 *
 * Usage: blocks THREADS [ITERATIONS_SCALE] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MIB ((size_t)1 << 20)

struct job {
    const size_t *sizes;
    int nsizes;
    int iters;
    unsigned sum;
};

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void *work(void *arg) {
    struct job *j = arg;
    for (int i = 0; i < j->iters; i++) {
        size_t n = j->sizes[i % j->nsizes];
        volatile unsigned char *p = malloc(n);
        if (!p) { fprintf(stderr, "malloc(%zu) failed\n", n); exit(1); }
        for (size_t k = 0; k < n; k += 4096) p[k] = (unsigned char)k;
        j->sum += p[n / 2];
        free((void *)p);
    }
    return NULL;
}

static void row(const char *name, const size_t *sizes, int nsizes, int threads, int iters) {
    struct job jobs[2];
    pthread_t t[2];
    for (int i = 0; i < threads; i++) jobs[i] = (struct job){sizes, nsizes, iters, 0};
    double t0 = now_ns();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, &jobs[i]);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    double ns = now_ns() - t0;
    printf("ROW %s %d %.0f\n", name, threads, ns / iters);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    int scale = argc > 2 ? atoi(argv[2]) : 1;
    if (threads < 1 || threads > 2 || scale < 1) return 2;
    static const size_t s2[] = {2 * MIB}, s8[] = {8 * MIB}, s32[] = {32 * MIB},
                        s128[] = {128 * MIB}, s256[] = {256 * MIB},
                        mix[] = {2 * MIB, 8 * MIB + 4096, 32 * MIB, 3 * MIB, 128 * MIB, 8 * MIB, 256 * MIB};
    row("2MiB", s2, 1, threads, 400 * scale);
    row("8MiB", s8, 1, threads, 200 * scale);
    row("32MiB", s32, 1, threads, 60 * scale);
    row("128MiB", s128, 1, threads, 16 * scale);
    row("256MiB", s256, 1, threads, 8 * scale);
    row("mix", mix, 7, threads, 28 * scale);
    return 0;
}
