/* How long the program's own mmap + munmap pairs wait while the preload
 * library's background thread collapses a block (MADV_COLLAPSE holds the
 * mm's lock for writing during each huge page's copy). It writes a 64 MiB
 * block in base pages (the thread's spans are unadvised where THP's defrag
 * mode compacts synchronously), keeps it live, and for SECONDS times one
 * mmap, write, munmap of 4 KiB every millisecond. Prints one JSON line: the
 * pairs timed, their p50, p99, p99.9 (nearest rank) and longest time in ms,
 * and the process's AnonHugePages in KiB at the end (the collapse's
 * progress; the 64 MiB block and a first block of 4 MiB: 68 MiB when all
 * are huge). Exits 1 with a message on stderr when a call fails.
 *
 * Usage, beside two CPU-bound processes or not; the runs in
 * benches/README.md alternate the libraries, idle then beside
 * `stress-ng --cpu 2`, round by round:
 *   cc -O2 -o lock_hold lock_hold.c
 *   stress-ng --cpu 2 -q &                      # optional
 *   LD_PRELOAD=.../libckalloc_preload.so ./lock_hold 6
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_PAIRS 200000

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double took[MAX_PAIRS];

/* The value of rank P in 1000 of the n sorted times (nearest rank). */
static double rank(size_t n, size_t per_mille) {
    size_t r = (n * per_mille + 999) / 1000;
    return took[r ? r - 1 : 0];
}

static int fail(const char *what) {
    perror(what);
    return 1;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 6;
    if (!(seconds > 0 && seconds <= 100))
        return fputs("usage: lock_hold [SECONDS, 0 to 100]\n", stderr), 2;
    size_t len = 64 << 20, n = 0;
    /* Written through volatile pointers, so the compiler keeps the
     * blocks and their writes. A first huge-path block starts the
     * library's thread. */
    volatile char *first = malloc(4 << 20);
    if (!first) return fail("malloc");
    for (size_t i = 0; i < (4 << 20); i += 4096) first[i] = 1;
    usleep(300000);
    volatile char *block = malloc(len);
    if (!block) return fail("malloc");
    for (size_t i = 0; i < len; i += 4096) block[i] = 1;
    double start = now_ms();
    while (now_ms() - start < seconds * 1e3) {
        if (n == MAX_PAIRS) return fputs("lock_hold: too many pairs\n", stderr), 1;
        double t = now_ms();
        char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return fail("mmap");
        *(volatile char *)p = 1;
        if (munmap(p, 4096)) return fail("munmap");
        took[n++] = now_ms() - t;
        usleep(1000);
    }
    if (n == 0) return fputs("lock_hold: no pair timed\n", stderr), 1;
    qsort(took, n, sizeof took[0], by_value);
    long huge_kib = -1;
    char line[256];
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "AnonHugePages:", 14)) huge_kib = atol(line + 14);
    if (f) fclose(f);
    printf("{\"pairs\":%zu,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"p999_ms\":%.3f,\"max_ms\":%.3f,"
           "\"anon_huge_kib\":%ld}\n",
           n, rank(n, 500), rank(n, 990), rank(n, 999), took[n - 1], huge_kib);
    if (block[0] != 1 || first[0] != 1) return fputs("lock_hold: a block lost its bytes\n", stderr), 1;
    free((void *)block);
    free((void *)first);
    return 0;
}
