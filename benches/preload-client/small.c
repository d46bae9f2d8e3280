/* The preload client's small-request loop, for callgrind: N pairs of
 * malloc(64) + free, N from the first argument. The driver counts the
 * instructions of two runs, N and 2N, and divides the difference by N, so
 * start-up and exit cancel out.
 *
 * Usage: small N */
#include <stdlib.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : -1;
    if (n < 0) return 2;
    for (long i = 0; i < n; i++) {
        /* volatile: the compiler may not drop the pair. */
        void *volatile p = malloc(64);
        if (!p) return 1;
        free(p);
    }
    return 0;
}
