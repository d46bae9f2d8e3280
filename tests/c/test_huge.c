/* C ABI test: ck_huge_alloc / ck_huge_free through both tiers, edge cases. */
#include "ckernel_alloc.h"

/* C-Kernel-Engine's header declarations, repeated verbatim: C accepts a compatible
 * redeclaration and rejects any difference in parameter or return types, so
 * this proves code written against C-Kernel-Engine's header compiles against our header. */
void *ck_huge_alloc(size_t bytes);
void ck_huge_free(void *ptr, size_t bytes);
int ck_bump_alloc_init(ck_bump_alloc_t *alloc, const char *weights_path, size_t total_size,
                       size_t weights_base, size_t activations_base);
void ck_bump_alloc_free(ck_bump_alloc_t *alloc);
int ck_bump_alloc_needs_weight_materialization(const ck_bump_alloc_t *alloc);
_Static_assert(CK_BUMP_MODE_UNINITIALIZED == 0 && CK_BUMP_MODE_ANON == 1 &&
                   CK_BUMP_MODE_MIXED_FILE_BACKED == 2,
               "ck_bump_mode_t values as in C-Kernel-Engine");

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

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
