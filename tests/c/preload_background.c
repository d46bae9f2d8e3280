/* The engine's background thread under the preload library, and the same
 * program under glibc for reference (tests/preload/background.rs):
 *
 *   threads            the threads of the process before and after the
 *                      first huge malloc (and after a second), and the
 *                      nice values of the program's thread and of
 *                      ckalloc-bg
 *   promote MIB        a written MIB MiB block: its huge pages
 *                      (AnonHugePages of its mapping) every 100 ms until
 *                      all are huge or 10 s passed
 *   idle-release CALLS malloc(1 GiB), write it, free it, then 3 s idle
 *                      (CALLS = 1: a 3 MiB malloc/free pair every 10 ms
 *                      meanwhile); the resident set at the end
 *   realtime           the program's thread at SCHED_FIFO makes the first
 *                      huge malloc: the scheduling policies of the program's
 *                      thread then and of ckalloc-bg ("not permitted"
 *                      where SCHED_FIFO cannot be had)
 *   fork               after a huge malloc, fork: the child's threads
 *                      after a huge malloc of its own, and its ckalloc-bg's
 *                      nice value
 *   check              a written 4 MiB block every 20 ms for 1.2 s (kept),
 *                      then 1 s idle: the library's fault-check counters
 *                      (ckalloc_stats_json) after each, and the bytes of
 *                      the blocks whose mapping is advised MADV_HUGEPAGE
 *                      (VmFlags "hg" in /proc/self/smaps); then an advised
 *                      block grown to 64 MiB: whether it is advised
 *
 * Each mode prints "name: value" lines and exits 0, or prints what failed
 * and exits 1. */
#define _GNU_SOURCE
#include <dirent.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "procfs.h"
#include "stats_json.h"

#define MIB (1024L * 1024L)

/* AnonHugePages (kB) of the mappings overlapping [p, p + len). */
static long huge_kb(const void *p, size_t len) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    long kb = 0;
    int in = 0;
    uintptr_t a = (uintptr_t)p, b = a + len;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long s, e;
        if (sscanf(line, "%lx-%lx ", &s, &e) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = s < b && e > a;
            continue;
        }
        if (in && !strncmp(line, "AnonHugePages:", 14)) kb += atol(line + 14);
    }
    fclose(f);
    return kb;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Field FIELD of /proc/self/task/TID/stat (proc(5): 19 is the nice value,
 * 41 the scheduling policy) of the thread named NAME, or of the calling
 * thread for NULL; -100 when there is none. The library's thread names
 * itself once it runs: up to 10 s of waiting for it. */
static long task_field(const char *name, int field) {
    char path[300], buf[512];
    for (int tries = 0; tries < 1000; tries++) {
        DIR *d = opendir("/proc/self/task");
        struct dirent *e;
        if (!d) return -100;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            if (name) {
                snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
                FILE *f = fopen(path, "r");
                if (!f) continue;
                int same = fgets(buf, sizeof buf, f) && !strncmp(buf, name, strlen(name)) &&
                           buf[strlen(name)] == '\n';
                fclose(f);
                if (!same) continue;
            } else if (atol(e->d_name) != (long)gettid()) {
                continue;
            }
            snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
            FILE *f = fopen(path, "r");
            long value = -100;
            if (f && fgets(buf, sizeof buf, f)) {
                /* Fields after the ")" that ends the name: state is field 3. */
                char *p = strrchr(buf, ')');
                for (int i = 2; p && i < field; i++) p = strchr(p + 1, ' ');
                if (p) value = atol(p + 1);
            }
            if (f) fclose(f);
            closedir(d);
            return value;
        }
        closedir(d);
        usleep(10000);
    }
    return -100;
}

/* Keeps the compiler from eliding a malloc/free pair. */
static void *volatile sink;

static int threads(void) {
    /* The program runs at nice 5: the library's thread, started by its
     * malloc, runs at 5 too. */
    if (setpriority(PRIO_PROCESS, 0, 5)) return puts("setpriority failed"), 1;
    printf("threads before: %ld\n", status_field("Threads"));
    char *p = malloc(8 * MIB);
    sink = p;
    memset(p, 1, 8 * MIB);
    printf("threads after: %ld\n", status_field("Threads"));
    char *q = malloc(8 * MIB);
    sink = q;
    printf("threads after another: %ld\n", status_field("Threads"));
    printf("program nice: %ld\n", task_field(NULL, 19));
    /* No thread to wait for under glibc or with the thread off. */
    printf("background nice: %ld\n", status_field("Threads") > 1 ? task_field("ckalloc-bg", 19) : -100);
    free(q);
    free(p);
    return 0;
}

static int promote(long mib) {
    size_t len = (size_t)mib * MIB;
    char *p = malloc(len);
    if (!p) return puts("malloc failed"), 1;
    sink = p;
    double t0 = now_s();
    memset(p, 1, len);
    printf("touched in ms: %.1f\n", (now_s() - t0) * 1e3);
    long kb = 0;
    while (now_s() - t0 < 10.0) {
        kb = huge_kb(p, len);
        if (kb >= (long)(len / 1024)) break;
        usleep(100 * 1000);
    }
    printf("huge after ms: %.0f\n", (now_s() - t0) * 1e3);
    printf("huge kB: %ld of %zu\n", kb, len / 1024);
    for (size_t i = 0; i < len; i += 4096)
        if (p[i] != 1) return printf("byte %zu changed\n", i), 1;
    free(p);
    return 0;
}

static int idle_release(int calls) {
    size_t len = 1024 * MIB;
    char *p = malloc(len);
    if (!p) return puts("malloc failed"), 1;
    sink = p;
    memset(p, 2, len);
    free(p);
    double t0 = now_s();
    while (now_s() - t0 < 3.0) {
        if (calls) {
            char *q = malloc(3 * MIB);
            sink = q;
            q[0] = 1;
            free(q);
        }
        usleep(10 * 1000);
    }
    printf("rss kB: %ld\n", status_field("VmRSS"));
    return 0;
}

static int realtime(void) {
    struct sched_param fifo = {.sched_priority = 1}, normal = {.sched_priority = 0};
    /* An unprivileged thread may take SCHED_FIFO up to RLIMIT_RTPRIO
     * (sched(7)): the soft limit is raised to the hard one first. */
    struct rlimit rt;
    if (!getrlimit(RLIMIT_RTPRIO, &rt) && rt.rlim_cur < 1) {
        rt.rlim_cur = rt.rlim_max;
        setrlimit(RLIMIT_RTPRIO, &rt);
    }
    if (sched_setscheduler(0, SCHED_FIFO, &fifo)) return puts("realtime: not permitted"), 0;
    char *p = malloc(8 * MIB);
    sink = p;
    memset(p, 1, 8 * MIB);
    printf("program policy: %d\n", sched_getscheduler(0));
    /* Back to the normal class before waiting for the thread's name. */
    if (sched_setscheduler(0, SCHED_OTHER, &normal)) return puts("SCHED_OTHER failed"), 1;
    printf("background policy: %ld\n", task_field("ckalloc-bg", 41));
    free(p);
    return 0;
}

static int forked(void) {
    /* At nice 4, which the child inherits and its thread with it. */
    if (setpriority(PRIO_PROCESS, 0, 4)) return puts("setpriority failed"), 1;
    char *p = malloc(8 * MIB);
    sink = p;
    memset(p, 1, 8 * MIB);
    printf("parent threads: %ld\n", status_field("Threads"));
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return puts("fork failed"), 1;
    if (pid == 0) {
        long before = status_field("Threads");
        char *q = malloc(8 * MIB);
        sink = q;
        memset(q, 3, 8 * MIB);
        printf("child threads: %ld then %ld\n", before, status_field("Threads"));
        printf("child background nice: %ld\n", task_field("ckalloc-bg", 19));
        for (size_t i = 0; i < 8 * MIB; i += 4096)
            if (p[i] != 1 || q[i] != 3) return printf("child byte %zu wrong\n", i), 1;
        free(q);
        free(p);
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return printf("child status %d\n", st), 1;
    free(p);
    puts("ok: child");
    return 0;
}

/* The number after "\"NAME\":" in the library's ckalloc_stats_json, or -1. */
static long long stat_of(const char *name) {
    const char *json = library_stats_json();
    char key[96];
    if (!json) return -1;
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *at = strstr(json, key);
    return at ? strtoll(at + strlen(key), NULL, 10) : -1;
}

static void print_checks(const char *when) {
    static const char *const names[] = {"huge_checks", "huge_checks_dear",
                                        "huge_page_first_bytes", "base_page_first_bytes"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        printf("%s %s: %lld\n", when, names[i], stat_of(names[i]));
}

/* Whether the mapping holding p is advised MADV_HUGEPAGE (VmFlags "hg"),
 * or -1 when smaps has no such mapping. */
static int advised_huge(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int in = 0, found = -1;
    uintptr_t a = (uintptr_t)p;
    if (!f) return -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        unsigned long s, e;
        if (sscanf(line, "%lx-%lx ", &s, &e) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = s <= a && a < e;
            continue;
        }
        if (in && !strncmp(line, "VmFlags:", 8)) found = strstr(line, " hg") != NULL;
    }
    fclose(f);
    return found;
}

static int check(void) {
    enum { BLOCKS = 60 };
    static char *kept[BLOCKS];
    long long advised = 0;
    for (int i = 0; i < BLOCKS; i++) {
        kept[i] = malloc(4 * MIB);
        if (!kept[i]) return puts("malloc failed"), 1;
        memset(kept[i], 1, 4 * MIB);
        usleep(20 * 1000);
    }
    for (int i = 0; i < BLOCKS; i++) {
        int hg = advised_huge(kept[i]);
        if (hg < 0) return printf("no mapping for block %d\n", i), 1;
        advised += hg ? 4 * MIB : 0;
    }
    print_checks("active");
    printf("active advised_bytes: %lld\n", advised);
    usleep(1000 * 1000);
    print_checks("idle");
    for (int i = 0; i < BLOCKS; i++) {
        if (advised_huge(kept[i]) != 1) continue;
        char *grown = realloc(kept[i], 64 * MIB);
        if (!grown) return puts("realloc failed"), 1;
        kept[i] = grown;
        for (size_t k = 0; k < 4 * MIB; k += 4096)
            if (grown[k] != 1) return printf("grown byte %zu changed\n", k), 1;
        printf("grown advised: %d\n", advised_huge(grown));
        break;
    }
    for (int i = 0; i < BLOCKS; i++) free(kept[i]);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "threads")) return threads();
    if (argc >= 3 && !strcmp(argv[1], "promote")) return promote(atol(argv[2]));
    if (argc >= 3 && !strcmp(argv[1], "idle-release")) return idle_release(atoi(argv[2]));
    if (argc >= 2 && !strcmp(argv[1], "fork")) return forked();
    if (argc >= 2 && !strcmp(argv[1], "realtime")) return realtime();
    if (argc >= 2 && !strcmp(argv[1], "check")) return check();
    fprintf(stderr, "usage: %s threads | promote MIB | idle-release 0|1 | realtime | fork | check\n",
            argv[0]);
    return 2;
}
