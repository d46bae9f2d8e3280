/* The C ABI from C: a huge-page buffer with ck_huge_alloc, then a bump arena
 * over a weights file with ck_bump_alloc_init (arena offset == file offset).
 *
 *   examples/c/run [WEIGHTS_FILE]     builds the library and this program, runs it
 *
 * With WEIGHTS_FILE (for example a weights.bump), the whole file is the
 * weights region [0, file size) and the runtime region follows it; the
 * program prints the file's first 8 bytes read through the arena (the magic,
 * "BUMPWGT5", for a weights.bump). */
#define _POSIX_C_SOURCE 200809L
#include "ckernel_alloc.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int main(int argc, char **argv) {
    /* 1. 64 MiB of zeroed memory: hugetlb, THP or normal pages, 2 MiB aligned. */
    size_t bytes = (size_t)64 << 20;
    unsigned char *buf = ck_huge_alloc(bytes);
    if (buf == NULL) {
        const char *why = ck_last_error();
        fprintf(stderr, "ck_huge_alloc: %s\n", why);
        return 1;
    }
    memset(buf, 1, bytes);
    printf("ck_huge_alloc: 64 MiB at %p (2 MiB aligned: %s)\n", (void *)buf,
           ((size_t)buf % ((size_t)2 << 20)) == 0 ? "yes" : "no");
    ck_huge_free(buf, bytes);

    /* 2. A bump arena: weights region [0, file size), 16 MiB of runtime region after it. */
    const char *path = argc > 1 ? argv[1] : NULL;
    size_t weights_len = 0;
    if (path != NULL) {
        struct stat st;
        if (stat(path, &st) != 0) {
            perror(path);
            return 1;
        }
        weights_len = (size_t)st.st_size;
    }
    ck_bump_alloc_t arena;
    if (ck_bump_alloc_init(&arena, path, weights_len + ((size_t)16 << 20), 0, weights_len) != 0) {
        const char *why = ck_last_error();
        fprintf(stderr, "ck_bump_alloc_init: %s\n", why);
        return 1;
    }
    if (path != NULL && arena.mode == CK_BUMP_MODE_ANON &&
        ck_bump_alloc_materialize_weights(&arena, path) != 0) {
        const char *why = ck_last_error();
        fprintf(stderr, "ck_bump_alloc_materialize_weights: %s\n", why);
        ck_bump_alloc_free(&arena);
        return 1;
    }
    printf("arena: %zu bytes, mode %s, weights [%zu, %zu)\n", arena.total_size,
           arena.mode == CK_BUMP_MODE_ANON ? "anonymous" : "mixed file-backed",
           arena.weights_base, arena.activations_base);
    if (weights_len >= 8) {
        printf("first 8 bytes of the weights region: %.8s\n", (const char *)arena.base);
    }
    /* The runtime region is the caller's to carve up: here one float buffer. */
    float *activations = (float *)(arena.base + arena.activations_base);
    for (int i = 0; i < 1024; i++) activations[i] = (float)i;
    printf("activations[1023] = %.1f\n", activations[1023]);

    ck_bump_alloc_free(&arena);
    return 0;
}
