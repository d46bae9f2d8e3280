/* C ABI test: bump arenas in anon and forced-mixed mode over a weights.bump
 * file, weights read back through base + offset, bad arguments, double free.
 * Usage: test_bump WEIGHTS_PATH WEIGHTS_BASE ACTIVATIONS_BASE */
#define _POSIX_C_SOURCE 200809L
#include "ckernel_alloc.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(ck_bump_alloc_t) == 56, "ck_bump_alloc_t is 56 bytes on 64-bit");
_Static_assert(offsetof(ck_bump_alloc_t, mode) == 48, "mode at offset 48");
_Static_assert(offsetof(ck_bump_alloc_t, weights_file_size) == 40, "weights_file_size at 40");

#include "check.h"

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int is_zeroed(const ck_bump_alloc_t *a) {
    static const ck_bump_alloc_t zero;
    return a->base == NULL && a->total_size == 0 && a->mapped_len == 0 &&
           a->mode == CK_BUMP_MODE_UNINITIALIZED && memcmp(&zero.total_size, &a->total_size, 5 * sizeof(size_t)) == 0;
}

static void check_arena(const char *path, size_t wb, size_t ab, const uint8_t *file, size_t file_len,
                        int force_mixed) {
    ck_bump_alloc_t a;
    memset(&a, 0xAB, sizeof a); /* garbage in, as C callers often pass */
    size_t total = ab + 64 * MIB;
    if (force_mixed) setenv("CK_BUMP_FORCE_MIXED", "1", 1);
    int rc = ck_bump_alloc_init(&a, path, total, wb, ab);
    if (force_mixed) unsetenv("CK_BUMP_FORCE_MIXED");
    CHECK(rc == 0);
    if (rc != 0) return;
    CHECK(a.base != NULL);
    CHECK(a.total_size == total && a.weights_base == wb && a.activations_base == ab);
    CHECK(a.mapped_len >= total);
    CHECK(a.weights_file_size == file_len);
    if (force_mixed) {
        CHECK(a.mode == CK_BUMP_MODE_MIXED_FILE_BACKED);
        CHECK(ck_bump_alloc_needs_weight_materialization(&a) == 0);
        CHECK(ck_bump_alloc_materialize_weights(&a, path) == 0); /* no-op */
    } else {
        CHECK(a.mode == CK_BUMP_MODE_ANON);
        CHECK(ck_bump_alloc_needs_weight_materialization(&a) == 1);
        CHECK(a.base[wb] == 0); /* not copied yet */
        CHECK(ck_bump_alloc_materialize_weights(&a, path) == 0);
        CHECK(ck_bump_alloc_needs_weight_materialization(&a) == 1); /* a property of the mode */
    }
    /* The weights region equals the file at the same offsets. */
    CHECK(memcmp(a.base + wb, file + wb, ab - wb) == 0);
    /* The runtime region is writable and zeroed. */
    CHECK(a.base[ab] == 0 && a.base[total - 1] == 0);
    memset(a.base + ab, 0x77, total - ab);
    CHECK(a.base[total - 1] == 0x77);
    ck_bump_alloc_free(&a);
    CHECK(is_zeroed(&a));
    ck_bump_alloc_free(&a); /* twice is fine */
    CHECK(is_zeroed(&a));
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s WEIGHTS_PATH WEIGHTS_BASE ACTIVATIONS_BASE\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    size_t wb = strtoull(argv[2], NULL, 10), ab = strtoull(argv[3], NULL, 10);
    size_t file_len = 0;
    uint8_t *file = read_file(path, &file_len);
    CHECK(file != NULL);
    if (!file) return 1;

    check_arena(path, wb, ab, file, file_len, 0);
    check_arena(path, wb, ab, file, file_len, 1);

    /* An arena without weights; NULL path. */
    ck_bump_alloc_t a;
    CHECK(ck_bump_alloc_init(&a, NULL, 8 * MIB, 0, 0) == 0);
    CHECK(a.mode == CK_BUMP_MODE_ANON && a.weights_file_size == 0);
    a.base[8 * MIB - 1] = 1;
    CHECK(ck_bump_alloc_materialize_weights(&a, NULL) == 0); /* empty weights region: nothing to copy */
    ck_bump_alloc_free(&a);

    /* Bad arguments: -1, struct zeroed, a reason, nothing mapped. */
    CHECK(ck_bump_alloc_init(NULL, path, 8 * MIB, 0, 0) == -1);
    CHECK(strstr(ck_last_error(), "NULL") != NULL);
    memset(&a, 0xCD, sizeof a);
    CHECK(ck_bump_alloc_init(&a, path, 0, 0, 0) == -1);
    CHECK(is_zeroed(&a));
    CHECK(strlen(ck_last_error()) > 0);
    memset(&a, 0xCD, sizeof a);
    CHECK(ck_bump_alloc_init(&a, path, 64 * MIB, ab, wb == ab ? ab - 1 : wb) == -1);
    CHECK(is_zeroed(&a));
    CHECK(ck_bump_alloc_init(&a, "/nonexistent/weights.bump", 64 * MIB, wb, ab) == -1);
    CHECK(strstr(ck_last_error(), "/nonexistent/weights.bump") != NULL);
    CHECK(is_zeroed(&a));
    CHECK(ck_bump_alloc_init(&a, path, SIZE_MAX, wb, ab) == -1);
    CHECK(is_zeroed(&a));
    CHECK(ck_bump_alloc_init(&a, NULL, SIZE_MAX, 0, 0) == -1);
    /* CK_BUMP_FORCE_MIXED without a weights file: the reason names what a
     * C caller can do about it. */
    setenv("CK_BUMP_FORCE_MIXED", "1", 1);
    CHECK(ck_bump_alloc_init(&a, NULL, 8 * MIB, 0, 0) == -1);
    unsetenv("CK_BUMP_FORCE_MIXED");
    CHECK(strstr(ck_last_error(), "CK_BUMP_FORCE_MIXED") != NULL);
    CHECK(strstr(ck_last_error(), "give a weights file") != NULL);
    CHECK(is_zeroed(&a));
    /* A file too small for the weights region. */
    CHECK(ck_bump_alloc_init(&a, path, file_len + 64 * MIB, 0, file_len + 8 * MIB) == -1);
    CHECK(is_zeroed(&a));

    /* Zeroed, NULL and uninitialized structs. */
    memset(&a, 0, sizeof a);
    ck_bump_alloc_free(&a);
    ck_bump_alloc_free(NULL);
    CHECK(ck_bump_alloc_needs_weight_materialization(NULL) == 1);
    CHECK(ck_bump_alloc_needs_weight_materialization(&a) == 1);
    CHECK(ck_bump_alloc_materialize_weights(&a, path) == -1);
    CHECK(ck_bump_alloc_materialize_weights(NULL, path) == -1);

    free(file);
    if (failures) {
        fprintf(stderr, "test_bump: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_bump: ok\n");
    return 0;
}
