/* C ABI test: ck_huge_alloc / ck_huge_free through both tiers, edge cases. */
#include "ckernel_alloc.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n",   \
                    __FILE__, __LINE__, #cond, ck_last_error());             \
            failures++;                                                      \
        }                                                                    \
    } while (0)

#define MIB ((size_t)1 << 20)

int main(void) {
    size_t sizes[] = {1, 4096, 2 * MIB, 3 * MIB + 5, 64 * MIB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        uint8_t *p = ck_huge_alloc(n);
        CHECK(p != NULL);
        if (!p) continue;
        CHECK(((uintptr_t)p % (2 * MIB)) == 0);
        CHECK(p[0] == 0 && p[n - 1] == 0); /* zero-filled */
        memset(p, 0x5a, n);
        CHECK(p[n / 2] == 0x5a);
        ck_huge_free(p, n);
    }
    /* bytes == 0 on free still releases the block (registry). */
    void *q = ck_huge_alloc(5 * MIB);
    CHECK(q != NULL);
    ck_huge_free(q, 0);
    /* Double free and foreign pointers are ignored, with a reason. */
    ck_huge_free(q, 5 * MIB);
    CHECK(strstr(ck_last_error(), "not returned by ck_huge_alloc") != NULL);
    int local = 0;
    ck_huge_free(&local, 4);
    ck_huge_free(NULL, 123);
    /* Zero and overflowing sizes fail cleanly. */
    CHECK(ck_huge_alloc(0) == NULL);
    CHECK(ck_huge_alloc(SIZE_MAX) == NULL);
    CHECK(strlen(ck_last_error()) > 0);
    CHECK(ck_huge_alloc(SIZE_MAX - 2 * MIB + 2) == NULL);
    CHECK(ck_huge_alloc((SIZE_MAX >> 1) + 1) == NULL);

    if (failures) {
        fprintf(stderr, "test_huge: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_huge: ok\n");
    return 0;
}
