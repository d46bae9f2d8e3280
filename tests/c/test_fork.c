/* C ABI test: fork() while other threads are inside ck_huge_alloc / ck_huge_free.
 *
 * Two threads loop ck_huge_alloc(4 MiB) / ck_huge_free; the main thread forks
 * FORKS times, and each child calls ck_huge_alloc + ck_huge_free under a 5 s
 * alarm and exits with _exit. Every child must exit with status 0 (a child
 * that inherits a lock held by one of the threads hangs and dies of SIGALRM).
 * Usage: test_fork [FORKS] (default 500). */
#define _POSIX_C_SOURCE 200809L

#include "ckernel_alloc.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static atomic_int stop = 0;

static void *churn(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        char *p = ck_huge_alloc(4 * MIB);
        if (p) {
            p[0] = 1;
            ck_huge_free(p, 4 * MIB);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    long forks = argc > 1 ? strtol(argv[1], NULL, 10) : 500;
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&threads[i], NULL, churn, NULL) == 0);

    long completed = 0, hung = 0, failed = 0;
    for (long i = 0; i < forks; i++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid < 0) break;
        if (pid == 0) {
            alarm(5);
            char *p = ck_huge_alloc(4 * MIB);
            if (!p) _exit(2);
            memset(p, 0xAB, 4 * MIB);
            ck_huge_free(p, 4 * MIB);
            _exit(0);
        }
        int status = 0;
        pid_t r;
        while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
        }
        CHECK(r == pid);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            completed++;
        } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
            hung++;
            fprintf(stderr, "fork %ld: the child hung\n", i + 1);
        } else {
            failed++;
            fprintf(stderr, "fork %ld: the child failed (status %#x)\n", i + 1, (unsigned)status);
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) CHECK(pthread_join(threads[i], NULL) == 0);

    printf("test_fork: %ld forks, %ld completed, %ld hung, %ld failed\n", forks, completed, hung,
           failed);
    CHECK(completed == forks);
    CHECK(hung == 0 && failed == 0);
    if (failures) return 1;
    printf("test_fork: ok\n");
    return 0;
}
