/* Where glibc puts the requests the preload library leaves to it: prints
 * "mapped N", the mappings glibc's mallinfo2 counts (hblks) while one
 * 1 MiB block is live, then "heap_after_free N", the bytes of glibc's main
 * heap (arena) after three 1 MiB blocks at its top were freed. glibc's
 * defaults map the first 1 MiB block (M_MMAP_THRESHOLD starts at 128 KiB)
 * and, their dynamic threshold grown to that block, trim a free top over
 * about 2 MiB; the preload library's thresholds take the block from the
 * heap and leave the freed 3 MiB in place (M_TRIM_THRESHOLD 4 MiB). Then
 * "heap_after_big_free N", the same after a 12 MiB block was written and
 * freed and eight 1 MiB blocks at the heap's top were freed: glibc alone
 * maps the 12 MiB block and raises its trim threshold to 24 MiB at its
 * free, and so does the library, and either keeps the 8 MiB. Then
 * "heap_after_huge_free N", the same after a 40 MiB block and thirty 1 MiB
 * blocks: a mapping over 32 MiB raises nothing, so the 24 MiB threshold
 * gives the 30 MiB back. Last,
 * "json " and the keys of the library's ckalloc_stats_json from the glibc
 * ones to the end of "preload" ("json none" without the library). With "dlopen LIB" as arguments the program
 * opens LIB with dlopen first (the library is then not the process's
 * malloc). With "twice" as the argument it runs itself again with two
 * GLIBC_TUNABLES entries in its environment, as a raw execve can pass
 * them: the first names no threshold, the second sets glibc's mmap
 * threshold to 4 MiB (glibc reads every entry; getenv finds the first).
 * With "mallopt" as the argument it sets M_TRIM_THRESHOLD to 128 KiB
 * first, as a program may after the library loaded; with
 * PRELOAD_TEST_MALLOPT_EARLY=1 it does so from its .preinit_array, before
 * any library's constructor (the preload library's too) runs; with
 * PRELOAD_TEST_CALLS_EARLY=1 it calls malloc_usable_size and malloc_trim
 * there.
 * With "cycle" as the argument it runs ten rounds of requests instead:
 * each writes six 1 MiB blocks and frees them from the heap's top down, and
 * it prints "cycle_faults N", the minor page faults of the last four
 * rounds (the first rounds of aligned requests grow the heap past the
 * fragments glibc's memalign leaves before its top is freed whole).
 * The freed 6 MiB top is over the trim threshold: glibc alone (trim
 * threshold 2 MiB once a 1 MiB mapping was freed) gives it back at every
 * round and faults it in again at the next; the library sees the heap
 * grow into the top it trimmed and raises the trim threshold above it.
 * "cycle_trim" writes three blocks a round and calls malloc_trim(0) after
 * freeing them: the program's own trim raises nothing. "cycle_aligned"
 * is "cycle" with posix_memalign(64), as PyTorch's CPU allocator asks;
 * "cycle_idle" is "cycle" with 300 ms of sleep between rounds. "oneoff"
 * writes and frees twenty 1 MiB blocks once (glibc trims them), then
 * keeps 64 KiB blocks until the heap grows once: a little growth after a
 * one-off free raises the threshold by no more than it grew. "trim_thread"
 * runs rounds of three 1 MiB blocks (a top under the trim threshold, which
 * glibc's free never trims) for a second while another thread calls
 * malloc_trim(0) every 200 microseconds: the program's trims raise
 * nothing. "fork_cycle" forks while another thread calls malloc_trim(0)
 * in a loop, and runs "cycle" in the child: a trim the fork cut short
 * does not keep the child from raising. "fork_fresh" writes and frees
 * twenty 1 MiB blocks from the top down (glibc trims them), forks, and
 * has the child write twelve 1 MiB blocks it keeps: new memory, not the
 * parent's trimmed top growing back.
 * The program takes malloc's address, which built without PIE
 * makes the program's own PLT entry malloc's address in the whole process
 * (preload_glibc_thresholds_nopie.c). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

void *(*volatile malloc_address)(size_t) = malloc;

extern char **environ;

/* Run this program again with GLIBC_TUNABLES given twice. */
static int run_with_tunables_twice(void) {
    static char *envp[4096];
    size_t n = 0;
    envp[n++] = "GLIBC_TUNABLES=glibc.malloc.arena_max=4";
    envp[n++] = "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304";
    for (char **e = environ; *e && n + 1 < sizeof envp / sizeof *envp; e++)
        if (strncmp(*e, "GLIBC_TUNABLES=", 15) != 0) envp[n++] = *e;
    envp[n] = NULL;
    char *args[] = {"preload_glibc_thresholds", NULL};
    execve("/proc/self/exe", args, envp);
    perror("execve");
    return 2;
}

/* Runs before any library's constructor and before environ is set up:
 * reads the environment it is given. */
static void early(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    for (char **e = envp; *e; e++) {
        if (strcmp(*e, "PRELOAD_TEST_MALLOPT_EARLY=1") == 0 && mallopt(M_TRIM_THRESHOLD, 128 << 10) != 1)
            _exit(2);
        if (strcmp(*e, "PRELOAD_TEST_CALLS_EARLY=1") == 0) {
            char *p = malloc(100);
            if (!p || malloc_usable_size(p) < 100) _exit(2);
            free(p);
            malloc_trim(0);
        }
    }
}

__attribute__((section(".preinit_array"), used)) static void (*preinit)(int, char **, char **) = early;

/* Write a block of n MiB and free it. */
static int write_and_free(size_t n) {
    char *p = malloc(n * MIB);
    if (!p) return 0;
    memset(p, 1, n * MIB);
    free(p);
    return 1;
}

/* Write n 1 MiB blocks, free them from the last (the heap's top) down,
 * and print the bytes of glibc's main heap after "label". */
static int print_heap_after_free(const char *label, int n) {
    char *blocks[32];
    for (int i = 0; i < n; i++) {
        blocks[i] = malloc(MIB);
        if (!blocks[i]) return 0;
        memset(blocks[i], 1, MIB);
    }
    for (int i = n - 1; i >= 0; i--) free(blocks[i]);
    printf("%s %zu\n", label, mallinfo2().arena);
    return 1;
}

/* Print "json " and the keys of ckalloc_stats_json from "glibc_thresholds"
 * to the end of "preload" (or of "ahead", when set), or "json none" without
 * the library. */
static int print_json(void *lib) {
    size_t (*stats_json)(char *, size_t) =
        (size_t (*)(char *, size_t))dlsym(lib, "ckalloc_stats_json");
    if (!stats_json) {
        printf("json none\n");
        return 0;
    }
    static char json[65536];
    stats_json(json, sizeof json);
    char *keys = strstr(json, "\"glibc_thresholds\"");
    char *end = keys ? strchr(keys, '}') : NULL;
    if (!end) return 3;
    printf("json %.*s\n", (int)(end - keys), keys);
    return 0;
}

/* Ten rounds of n 1 MiB blocks (64-byte aligned with posix_memalign when
 * aligned is set) written and freed from the top down (then
 * malloc_trim(0) when trim is set); prints the minor faults of the last
 * four. */
static int cycle(int n, int trim, int aligned, int idle_ms) {
    long faults = 0;
    for (int round = 0; round < 10; round++) {
        if (round > 0 && idle_ms > 0) usleep(idle_ms * 1000);
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        char *blocks[8];
        for (int i = 0; i < n; i++) {
            if (aligned ? posix_memalign((void **)&blocks[i], 64, MIB) != 0
                        : !(blocks[i] = malloc(MIB)))
                return 2;
            memset(blocks[i], 1, MIB);
        }
        for (int i = n - 1; i >= 0; i--) free(blocks[i]);
        if (trim) malloc_trim(0);
        getrusage(RUSAGE_SELF, &r1);
        if (round >= 6) faults += r1.ru_minflt - r0.ru_minflt;
    }
    printf("cycle_faults %ld\n", faults);
    return print_json(RTLD_DEFAULT);
}

/* Write 20 MiB of 1 MiB blocks on glibc's main heap and free them from
 * the top down, so that glibc trims its top: 0, or 2 when malloc fails. */
static int grow_and_trim(void) {
    char *blocks[20];
    for (int i = 0; i < 20; i++) {
        if (!(blocks[i] = malloc(MIB))) return 2;
        memset(blocks[i], 1, MIB);
    }
    for (int i = 19; i >= 0; i--) free(blocks[i]);
    return 0;
}

/* "oneoff": see the top of this file. */
static int oneoff(void) {
    if (grow_and_trim()) return 2;
    void *trimmed = sbrk(0);
    static char *keep[4096];
    int k = 0;
    while (sbrk(0) == trimmed && k < 4096) {
        if (!(keep[k] = malloc(64 << 10))) return 2;
        memset(keep[k++], 1, 64 << 10);
    }
    printf("cycle_faults 0\n");
    int rc = print_json(RTLD_DEFAULT);
    while (k > 0) free(keep[--k]);
    return rc;
}

static volatile int trimmer_stop;

static void *trimmer(void *arg) {
    (void)arg;
    while (!trimmer_stop) {
        malloc_trim(0);
        usleep(200);
    }
    return NULL;
}

/* "trim_thread": see the top of this file. */
static int trim_thread(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, trimmer, NULL) != 0) return 2;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        char *blocks[3];
        for (int i = 0; i < 3; i++) {
            if (!(blocks[i] = malloc(MIB))) return 2;
            memset(blocks[i], 1, 4096);
        }
        for (int i = 2; i >= 0; i--) free(blocks[i]);
        clock_gettime(CLOCK_MONOTONIC, &t1);
    } while (t1.tv_sec - t0.tv_sec < 1);
    trimmer_stop = 1;
    pthread_join(t, NULL);
    printf("cycle_faults 0\n");
    return print_json(RTLD_DEFAULT);
}

static void *trim_loop(void *arg) {
    (void)arg;
    while (!trimmer_stop) malloc_trim(0);
    return NULL;
}

/* "fork_cycle": see the top of this file. */
static int fork_cycle(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, trim_loop, NULL) != 0) return 2;
    usleep(20000);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        int rc = cycle(6, 0, 0, 0);
        fflush(stdout);
        _exit(rc);
    }
    trimmer_stop = 1;
    pthread_join(t, NULL);
    int status;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 2;
    return WEXITSTATUS(status);
}

/* "fork_fresh": see the top of this file. */
static int fork_fresh(void) {
    if (grow_and_trim()) return 2;
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        char *blocks[12];
        for (int i = 0; i < 12; i++) {
            if (!(blocks[i] = malloc(MIB))) _exit(2);
            memset(blocks[i], 1, MIB);
        }
        printf("cycle_faults 0\n");
        int rc = print_json(RTLD_DEFAULT);
        fflush(stdout);
        _exit(rc);
    }
    int status;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 2;
    return WEXITSTATUS(status);
}

int main(int argc, char **argv) {
    void *lib = RTLD_DEFAULT;
    if (argc == 2 && strcmp(argv[1], "cycle") == 0) return cycle(6, 0, 0, 0);
    if (argc == 2 && strcmp(argv[1], "cycle_aligned") == 0) return cycle(6, 0, 1, 0);
    if (argc == 2 && strcmp(argv[1], "cycle_idle") == 0) return cycle(6, 0, 0, 300);
    if (argc == 2 && strcmp(argv[1], "cycle_trim") == 0) return cycle(3, 1, 0, 0);
    if (argc == 2 && strcmp(argv[1], "oneoff") == 0) return oneoff();
    if (argc == 2 && strcmp(argv[1], "trim_thread") == 0) return trim_thread();
    if (argc == 2 && strcmp(argv[1], "fork_cycle") == 0) return fork_cycle();
    if (argc == 2 && strcmp(argv[1], "fork_fresh") == 0) return fork_fresh();
    if (argc == 2 && strcmp(argv[1], "twice") == 0) return run_with_tunables_twice();
    if (argc == 2 && strcmp(argv[1], "mallopt") == 0 && mallopt(M_TRIM_THRESHOLD, 128 << 10) != 1)
        return 2;
    if (argc == 3 && strcmp(argv[1], "dlopen") == 0) {
        lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 2;
        }
    }
    char *one = malloc_address(MIB);
    if (!one) return 2;
    memset(one, 1, MIB);
    printf("mapped %zu\n", mallinfo2().hblks);
    free(one);
    if (!print_heap_after_free("heap_after_free", 3)) return 2;
    if (!write_and_free(12) || !print_heap_after_free("heap_after_big_free", 8)) return 2;
    if (!write_and_free(40) || !print_heap_after_free("heap_after_huge_free", 30)) return 2;
    return print_json(lib);
}
