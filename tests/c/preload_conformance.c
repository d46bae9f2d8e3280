/* The C allocation API under libckalloc_preload.so (LD_PRELOAD), checked
 * against glibc 2.36's semantics: every exported function, sizes at and
 * around the threshold and page boundaries, every alignment to 1 GiB,
 * realloc across the threshold both ways, calloc zeroing (also of retained
 * blocks), errno values, usable sizes, free of glibc's own pointers, 8
 * threads, and a fork storm with threads churning.
 *
 * Usage: preload_conformance THRESHOLD_BYTES
 * Prints "preload conformance: ok" and exits 0 when every check holds. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static int failures = 0;
#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            failures++;                                                      \
        }                                                                    \
    } while (0)

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define HUGE_PAGE (2 * MIB)

static size_t threshold;

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* A ckalloc block: 2 MiB aligned, usable size the request rounded to 2 MiB. */
static int is_ckalloc(void *p, size_t size) {
    return ((uintptr_t)p % HUGE_PAGE) == 0 &&
           malloc_usable_size(p) == round_up(size, HUGE_PAGE);
}

static void fill(void *p, size_t n, unsigned seed) {
    unsigned char *b = p;
    for (size_t i = 0; i < n; i += 509) b[i] = (unsigned char)(seed + i / 509);
    if (n) b[n - 1] = (unsigned char)(seed ^ 0x5a);
}

/* Whether the first `upto` bytes of `p` still hold what fill(p, n, seed)
 * wrote there. */
static int holds_upto(const void *p, size_t n, size_t upto, unsigned seed) {
    const unsigned char *b = p;
    if (upto > n) upto = n;
    for (size_t i = 0; i < upto; i += 509)
        if (i != n - 1 && b[i] != (unsigned char)(seed + i / 509)) return 0;
    if (n && n - 1 < upto && b[n - 1] != (unsigned char)(seed ^ 0x5a)) return 0;
    return 1;
}

static int holds(const void *p, size_t n, unsigned seed) { return holds_upto(p, n, n, seed); }

static int all_zero(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

static void sizes_around_boundaries(void) {
    size_t t = threshold;
    size_t sizes[] = {0, 1, 15, 16, 17, 4095, 4096, 4097, 64 * KIB, 128 * KIB + 1,
                      t - 1, t, t + 1, HUGE_PAGE - 1, HUGE_PAGE, HUGE_PAGE + 1,
                      HUGE_PAGE + 4096, 2 * HUGE_PAGE - 1, 2 * HUGE_PAGE,
                      9 * MIB + 7, 64 * MIB + 4096};
    void *zero_a = malloc(0), *zero_b = malloc(0);
    CHECK(zero_a != NULL && zero_b != NULL && zero_a != zero_b);
    free(zero_a);
    free(zero_b);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *p = malloc(n);
        CHECK(p != NULL);
        if (!p) continue;
        CHECK(((uintptr_t)p % 16) == 0);
        size_t usable = malloc_usable_size(p);
        CHECK(usable >= n);
        CHECK((n >= t) == is_ckalloc(p, n));
        /* Every usable byte may be written. */
        memset(p, 0xa5, usable);
        fill(p, n, (unsigned)i);
        CHECK(holds(p, n, (unsigned)i));
        free(p);
    }
    free(NULL);
}

static void alignments(void) {
    for (size_t a = sizeof(void *); a <= GIB; a <<= 1) {
        size_t sizes[] = {1, 100, threshold, threshold + 4096};
        for (size_t k = 0; k < 4; k++) {
            size_t n = sizes[k];
            void *p = NULL;
            CHECK(posix_memalign(&p, a, n) == 0);
            CHECK(p != NULL && ((uintptr_t)p % a) == 0);
            if (p) {
                CHECK(malloc_usable_size(p) >= n);
                memset(p, 1, n);
                free(p);
            }
            void *q = aligned_alloc(a, n);
            CHECK(q != NULL && ((uintptr_t)q % a) == 0);
            if (q) memset(q, 2, n);
            free(q);
            void *r = memalign(a, n);
            CHECK(r != NULL && ((uintptr_t)r % a) == 0);
            if (r) memset(r, 3, n);
            free(r);
        }
    }
    /* glibc 2.36: alignments that are not powers of two are rounded up. */
    void *p = memalign(24, threshold);
    CHECK(p != NULL && ((uintptr_t)p % 32) == 0);
    free(p);
    p = aligned_alloc(3 * MIB, threshold);
    CHECK(p != NULL && ((uintptr_t)p % (4 * MIB)) == 0);
    free(p);
    void *v = valloc(threshold + 1);
    CHECK(v != NULL && ((uintptr_t)v % 4096) == 0 && is_ckalloc(v, threshold + 1));
    free(v);
    v = valloc(100);
    CHECK(v != NULL && ((uintptr_t)v % 4096) == 0);
    free(v);
    v = pvalloc(threshold + 1);
    CHECK(v != NULL && ((uintptr_t)v % 4096) == 0 && malloc_usable_size(v) >= threshold + 1);
    free(v);
    v = pvalloc(1);
    CHECK(v != NULL && ((uintptr_t)v % 4096) == 0 && malloc_usable_size(v) >= 4096);
    free(v);
}

/* Sizes the compiler cannot see, so that it keeps calls it would refuse. */
static volatile size_t size_max = SIZE_MAX;
static volatile size_t two_pow_33 = (size_t)1 << 33;
/* A pointer the compiler cannot follow: a block a failed realloc leaves
 * live would otherwise draw a use-after-free warning. */
static void *volatile launder;
static void *kept(void *p) { launder = p; return launder; }

static void errno_values(void) {
    void *p;
    const size_t SMAX = size_max;
    errno = 0;
    CHECK(malloc(SMAX) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(malloc(SMAX / 2 + 1) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(SMAX / 2, 3) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(two_pow_33, two_pow_33) == NULL && errno == ENOMEM);
    p = (void *)1;
    CHECK(posix_memalign(&p, 3, 64) == EINVAL && p == (void *)1);
    CHECK(posix_memalign(&p, 4, 64) == EINVAL && p == (void *)1);
    CHECK(posix_memalign(&p, 0, 64) == EINVAL && p == (void *)1);
    CHECK(posix_memalign(&p, 64, SMAX - 4096) == ENOMEM && p == (void *)1);
    errno = 0;
    CHECK(memalign(SMAX / 2 + 2, 64) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(pvalloc(SMAX) == NULL && errno == ENOMEM);
    char *q = malloc(threshold);
    CHECK(q != NULL);
    fill(q, threshold, 9);
    errno = 0;
    CHECK(reallocarray(kept(q), SMAX / 2, 3) == NULL && errno == ENOMEM);
    q = kept(q);
    CHECK(holds(q, threshold, 9));
    errno = 0;
    CHECK(realloc(kept(q), SMAX - 4096) == NULL && errno == ENOMEM);
    q = kept(q);
    CHECK(holds(q, threshold, 9));
    /* A successful huge allocation leaves errno alone. */
    errno = 12345;
    char *r = malloc(threshold + 1);
    CHECK(r != NULL && errno == 12345);
    free(r);
    free(q);
}

static void realloc_across_threshold(void) {
    size_t t = threshold;
    /* small -> huge -> bigger huge -> smaller huge -> small, contents kept */
    size_t steps[] = {100, t - 1, t, t + 1, 3 * t + 12345, 40 * MIB + 5, 5 * MIB + 3,
                      t + 1, t - 1, 4096, 7};
    char *p = NULL;
    size_t have = 0;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        size_t n = steps[i];
        char *q = realloc(p, n);
        CHECK(q != NULL);
        if (!q) break;
        if (have) CHECK(holds_upto(q, have, n, 77));
        CHECK((n >= t) == is_ckalloc(q, n));
        fill(q, n, 77);
        p = q;
        have = n;
    }
    /* realloc(NULL, n) is malloc; realloc(p, 0) frees and returns NULL. */
    char *m = realloc(NULL, t + 5);
    CHECK(m != NULL && is_ckalloc(m, t + 5));
    CHECK(realloc(m, 0) == NULL);
    CHECK(realloc(p, 0) == NULL);
    /* reallocarray as realloc */
    int *arr = reallocarray(NULL, t / sizeof(int) + 1, sizeof(int));
    CHECK(arr != NULL);
    for (size_t i = 0; i < t / sizeof(int) + 1; i += 1000) arr[i] = (int)i;
    arr = reallocarray(arr, 10, sizeof(int));
    CHECK(arr != NULL && arr[0] == 0);
    free(arr);
}

static void calloc_zeroes(void) {
    size_t sizes[] = {1, 4096, threshold - 1, threshold, 8 * MIB + 1, 24 * MIB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        /* dirty a block of the same size, free it (retained), then calloc */
        char *d = malloc(n);
        CHECK(d != NULL);
        if (d) memset(d, 0xee, malloc_usable_size(d));
        free(d);
        char *z = calloc(1, n);
        CHECK(z != NULL && all_zero(z, n));
        free(z);
        z = calloc(n, 1);
        CHECK(z != NULL && all_zero(z, n));
        free(z);
    }
}

static void glibc_pointers(void) {
    void *a = __libc_malloc(100);
    CHECK(a != NULL && malloc_usable_size(a) >= 100);
    free(a);
    void *b = __libc_malloc(8 * MIB);
    CHECK(b != NULL && malloc_usable_size(b) >= 8 * MIB);
    b = realloc(b, 16 * MIB);
    CHECK(b != NULL);
    free(b);
    /* A glibc block that happens to be 2 MiB aligned is still glibc's. With
     * glibc's mmap threshold out of its way, glibc takes it from its heap
     * and gives back what the alignment left after it, so its usable size
     * is far below the 2 MiB of a ckalloc block; then the threshold the
     * library set (the `threshold` argument, within glibc's range) again. */
    CHECK(mallopt(M_MMAP_THRESHOLD, 32 * MIB) == 1);
    void *c = __libc_memalign(HUGE_PAGE, 64);
    CHECK(c != NULL && ((uintptr_t)c % HUGE_PAGE) == 0 && malloc_usable_size(c) < HUGE_PAGE);
    free(c);
    size_t glibc_threshold = threshold < 128 * 1024 ? 128 * 1024 : threshold > 32 * MIB ? 32 * MIB : threshold;
    CHECK(mallopt(M_MMAP_THRESHOLD, (int)glibc_threshold) == 1);
    CHECK(malloc_trim(0) >= 0);
}

/* Resident bytes of this process (smaps_rollup's Rss), 0 when unreadable. */
static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    size_t kib = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Rss: %zu kB", &kib) == 1) break;
    fclose(f);
    return kib * KIB;
}

/* Memory a program never writes stays uncommitted, as with glibc: at most
 * the first 2 MiB page of a fresh block is faulted in at allocation. */
static void untouched_stays_uncommitted(void) {
    size_t before = rss_bytes();
    char *p = malloc(256 * MIB + 12345);
    CHECK(p != NULL);
    size_t after = rss_bytes();
    CHECK(before > 0 && after < before + 8 * MIB);
    if (p) p[100 * MIB] = 1;
    free(p);
}

static void *churn(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *slots[16] = {0};
    size_t sizes[16] = {0};
    for (int round = 0; round < 400; round++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 8) % 16);
        if (slots[k]) {
            if (!holds(slots[k], sizes[k], (unsigned)k)) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
            if (seed & 1) {
                free(slots[k]);
                slots[k] = NULL;
                continue;
            }
        }
        size_t n = (seed >> 12) % 3 == 0 ? threshold + (seed % (6 * MIB)) : 1 + seed % 5000;
        void *q = slots[k] ? realloc(slots[k], n) : malloc(n);
        if (!q) { __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED); continue; }
        fill(q, n, (unsigned)k);
        slots[k] = q;
        sizes[k] = n;
    }
    for (int k = 0; k < 16; k++) free(slots[k]);
    return NULL;
}

static void threads(int n) {
    pthread_t t[8];
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
}

static volatile int stop_churn = 0;
static void *churn_until_stopped(void *arg) {
    while (!stop_churn) churn(arg);
    return NULL;
}

static void fork_storm(void) {
    pthread_t t[3];
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, churn_until_stopped, (void *)(uintptr_t)(100 + i));
    for (int i = 0; i < 40; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            void *a = malloc(threshold + 12345);
            void *b = malloc(100);
            void *c = calloc(1, 3 * threshold);
            int ok = a && b && c && all_zero(c, 3 * threshold);
            if (a) memset(a, 1, threshold + 12345);
            free(a);
            free(b);
            free(c);
            _exit(ok ? 0 : 3);
        }
        CHECK(pid > 0);
        int status = 0;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    stop_churn = 1;
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
}

int main(int argc, char **argv) {
    threshold = argc > 1 ? strtoull(argv[1], NULL, 10) : 2 * MIB;
    sizes_around_boundaries();
    alignments();
    errno_values();
    realloc_across_threshold();
    calloc_zeroes();
    glibc_pointers();
    untouched_stays_uncommitted();
    threads(8);
    fork_storm();
    if (failures) {
        fprintf(stderr, "preload conformance: %d failures\n", failures);
        return 1;
    }
    printf("preload conformance: ok\n");
    return 0;
}
