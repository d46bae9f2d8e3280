/* The preload library at the process's limits, run by tests/preload/limits.rs
 * with and without LD_PRELOAD (glibc is the reference):
 *
 *   preload_limits vmas N SIZE     N live, untouched malloc(SIZE): prints the
 *                                  VMAs they added to /proc/self/maps
 *   preload_limits rss N SIZE      N live malloc(SIZE), every byte written:
 *                                  prints the resident set they added (MiB)
 *   preload_limits map-count       at vm.max_map_count, realloc shrinks a
 *                                  32 MiB block to 3 MiB in place, and a
 *                                  freed block malloc_trim gives back never
 *                                  stays mapped
 *   preload_limits locked-calloc   a block freed mlock'ed and read-only: the
 *                                  next calloc reuses it, zeroed and writable;
 *                                  malloc_trim leaves nothing locked
 *   preload_limits protected-reuse a block freed with PROT_NONE pages inside
 *                                  (not locked): the next calloc, and a malloc
 *                                  after malloc_trim, reuse it writable
 *   preload_limits as-promise MIB  under RLIMIT_AS (VmSize + MIB): requests
 *                                  that fit beside what is live are served
 *   preload_limits as-3mib MIB     under the same limit: how many live
 *                                  malloc(3 MiB) fit
 *
 * Each mode prints "ok" lines or numbers and exits 0, or prints what failed
 * and exits 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "procfs.h"

#define MIB ((size_t)1 << 20)

static int fail(const char *what) {
    printf("FAIL: %s (errno %d)\n", what, errno);
    return 1;
}

static long maps_lines(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    long n = 0;
    int c;
    if (!f) return -1;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}


static int vmas(long n, size_t size) {
    void **blocks = calloc((size_t)n, sizeof *blocks);
    if (!blocks) return fail("calloc of the table");
    long before = maps_lines();
    for (long i = 0; i < n; i++)
        if (!(blocks[i] = malloc(size))) return fail("malloc");
    long after = maps_lines();
    printf("added VMAs: %ld\n", after - before);
    for (long i = 0; i < n; i++) free(blocks[i]);
    free(blocks);
    return 0;
}

/* Map pages of alternating protection (they never merge) until the
 * process is at vm.max_map_count; returns how many, 0 on failure. */
static size_t fill_map_count(void **pages, size_t cap) {
    size_t used = 0;
    while (used < cap) {
        int prot = used % 2 ? PROT_READ : PROT_NONE;
        void *q = mmap(NULL, 4096, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (q == MAP_FAILED) break;
        pages[used++] = q;
    }
    return used < cap ? used : 0;
}

static void unmap_pages(void **pages, size_t used) {
    for (size_t i = 0; i < used; i++) munmap(pages[i], 4096);
}

/* At vm.max_map_count: a 32 MiB block (carved from a longer freed one, so
 * that cutting its tail off would split a mapping) shrinks to 3 MiB in
 * place; a freed block between two live ones (retained) is given back by
 * malloc_trim. Once everything is freed and trimmed the address space is
 * back. */
static int map_count(void) {
    size_t cap = 1 << 17;
    void **pages = malloc(cap * sizeof *pages);
    if (!pages) return fail("malloc of the table");
    long vm_before = status_field("VmSize");
    unsigned char *volatile longer = malloc(64 * MIB);
    if (!longer) return fail("malloc 64 MiB");
    longer[0] = 1;
    free(longer);
    unsigned char *p = malloc(32 * MIB);
    if (!p) return fail("malloc 32 MiB");
    memset(p, 0x5a, 32 * MIB);
    size_t used = fill_map_count(pages, cap);
    if (!used) return fail("no VMA limit reached");
    unsigned char *r = realloc(p, 3 * MIB);
    int bad = !r;
    if (r) {
        for (size_t i = 0; i < 3 * MIB; i += 4096) bad |= r[i] != 0x5a;
        printf("ok: shrunk at the VMA limit (%zu mappings), %s\n", used,
               r == p ? "in place" : "moved");
    }
    unmap_pages(pages, used);
    free(r ? r : p);
    /* Three pieces of one freed block; the middle one freed. */
    longer = malloc(64 * MIB);
    if (!longer) return fail("malloc 64 MiB");
    longer[0] = 1;
    free(longer);
    unsigned char *a = malloc(16 * MIB), *b = malloc(16 * MIB), *c = malloc(16 * MIB);
    if (!a || !b || !c) return fail("malloc 16 MiB");
    memset(b, 1, 16 * MIB);
    free(b);
    used = fill_map_count(pages, cap);
    if (!used) return fail("no VMA limit reached");
    malloc_trim(0);
    unmap_pages(pages, used);
    free(a);
    free(c);
    free(pages);
    malloc_trim(0);
    long kept = status_field("VmSize") - vm_before;
    printf("address space kept after malloc_trim: %ld kB\n", kept);
    if (kept > 2048) return fail("memory stays mapped");
    return bad ? fail("realloc at the VMA limit") : 0;
}

/* Write every byte of `q` (a fault kills the program: the test sees a
 * signal, not an exit status) and check it holds them. */
static int writable(unsigned char *q, size_t len, const char *what) {
    memset(q, 0x3c, len);
    for (size_t i = 0; i < len; i += 4096)
        if (q[i] != 0x3c) return fail(what);
    return 0;
}

/* Free a 6 MiB block whose second 2 MiB page holds three PROT_NONE pages. */
static unsigned char *free_protected(size_t len) {
    unsigned char *p = malloc(len);
    if (!p) return NULL;
    memset(p, 0xa5, len);
    unsigned char *a = (unsigned char *)(((uintptr_t)p + 2 * MIB) & ~(uintptr_t)4095);
    if (mprotect(a, 3 * 4096, PROT_NONE)) return NULL;
    free(p);
    return p;
}

static int protected_reuse(void) {
    size_t len = 6 * MIB;
    unsigned char *p = free_protected(len);
    if (!p) return fail("malloc or mprotect");
    unsigned char *q = calloc(1, len);
    if (!q) return fail("calloc");
    for (size_t i = 0; i < len; i++)
        if (q[i]) return fail("calloc reads non-zero");
    if (writable(q, len, "calloc block")) return 1;
    printf("ok: calloc %s the block, zeroed and writable\n", q == p ? "reused" : "did not reuse");
    free(q);
    p = free_protected(len);
    if (!p) return fail("malloc or mprotect");
    malloc_trim(0);
    q = malloc(len);
    if (!q) return fail("malloc");
    if (writable(q, len, "malloc block after malloc_trim")) return 1;
    printf("ok: malloc after malloc_trim %s the block, writable\n", q == p ? "reused" : "did not reuse");
    free(q);
    return 0;
}

static int locked_calloc(void) {
    size_t len = 16 * MIB;
    unsigned char *p = malloc(len);
    if (!p) return fail("malloc");
    memset(p, 0xa5, len);
    /* The whole pages of the block (glibc's blocks start past a header;
     * a hugetlb block is all whole pages and takes no other range). */
    unsigned char *a = (unsigned char *)(((uintptr_t)p + 4095) & ~(uintptr_t)4095);
    size_t alen = (len - (size_t)(a - p)) & ~(size_t)4095;
    if (mlock(a, alen)) {
        printf("SKIP: mlock of 16 MiB (errno %d; RLIMIT_MEMLOCK too low)\n", errno);
        free(p);
        return 0;
    }
    if (mprotect(a, alen, PROT_READ)) return fail("mprotect");
    free(p);
    unsigned char *q = calloc(1, len);
    if (!q) return fail("calloc");
    for (size_t i = 0; i < len; i++)
        if (q[i]) return fail("calloc reads non-zero");
    memset(q, 1, len);
    printf("ok: calloc %s the block, zeroed and writable\n", q == p ? "reused" : "did not reuse");
    free(q);
    malloc_trim(0);
    long locked = status_field("VmLck");
    printf("locked after malloc_trim: %ld kB\n", locked);
    return locked == 0 ? 0 : fail("memory stays locked");
}

static int limit_as(size_t mib) {
    long vm = status_field("VmSize");
    if (vm < 0) return fail("VmSize");
    struct rlimit rl = {(rlim_t)vm * 1024 + mib * MIB, (rlim_t)vm * 1024 + mib * MIB};
    return setrlimit(RLIMIT_AS, &rl) ? fail("setrlimit") : 0;
}

/* Requests glibc serves beside what is live under the limit: after a
 * freed block (retained) and after a block carved from a freed one. */
static int as_promise(size_t mib) {
    if (limit_as(mib)) return 1;
    size_t big = mib * MIB * 3 / 4, small = mib * MIB / 8;
    char *a = malloc(big);
    if (!a) return fail("first block");
    memset(a, 1, big);
    free(a);
    char *b = malloc(big + 8 * MIB);
    if (!b) return fail("a block as long again beside a freed one");
    memset(b, 2, big);
    free(b);
    char *c = malloc(small);
    if (!c) return fail("a short block");
    char *d = malloc(big);
    if (!d) return fail("a long block beside a short live one");
    memset(d, 3, big);
    free(c);
    free(d);
    printf("ok: every request served under the limit\n");
    return 0;
}

static int as_3mib(size_t mib) {
    if (limit_as(mib)) return 1;
    size_t cap = 1 << 16, n = 0;
    void **blocks = malloc(cap * sizeof *blocks);
    if (!blocks) return fail("malloc of the table");
    while (n < cap && (blocks[n] = malloc(3 * MIB))) n++;
    printf("3 MiB blocks: %zu\n", n);
    for (size_t i = 0; i < n; i++) free(blocks[i]);
    free(blocks);
    return 0;
}

static int rss(long n, size_t size) {
    char **blocks = calloc((size_t)n, sizeof *blocks);
    if (!blocks) return fail("calloc of the table");
    long before = status_field("VmRSS");
    for (long i = 0; i < n; i++) {
        if (!(blocks[i] = malloc(size))) return fail("malloc");
        memset(blocks[i], 1, size);
    }
    printf("added RSS: %ld MiB for %zu MiB asked\n", (status_field("VmRSS") - before) / 1024,
           (size_t)n * size / MIB);
    for (long i = 0; i < n; i++) free(blocks[i]);
    free(blocks);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "rss")) return rss(atol(argv[2]), strtoull(argv[3], NULL, 0));
    if (argc >= 4 && !strcmp(argv[1], "vmas")) return vmas(atol(argv[2]), strtoull(argv[3], NULL, 0));
    if (argc >= 2 && !strcmp(argv[1], "map-count")) return map_count();
    if (argc >= 2 && !strcmp(argv[1], "locked-calloc")) return locked_calloc();
    if (argc >= 2 && !strcmp(argv[1], "protected-reuse")) return protected_reuse();
    if (argc >= 3 && !strcmp(argv[1], "as-promise")) return as_promise(strtoull(argv[2], NULL, 0));
    if (argc >= 3 && !strcmp(argv[1], "as-3mib")) return as_3mib(strtoull(argv[2], NULL, 0));
    fprintf(stderr, "usage: see the comment at the top of preload_limits.c\n");
    return 2;
}
