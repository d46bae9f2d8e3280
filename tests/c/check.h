/* Shared by the C ABI test programs: a non-aborting CHECK that counts
 * failures and prints the library's last error. */
#ifndef CKALLOC_TEST_CHECK_H
#define CKALLOC_TEST_CHECK_H

#include <stddef.h>
#include <stdio.h>

#include "ckernel_alloc.h"

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

#endif /* CKALLOC_TEST_CHECK_H */
