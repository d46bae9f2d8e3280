/* Allocates one huge and one small block, then leaves by exit(0); with an
 * argument first: "quick" leaves by _exit(0), "clearenv" clears the
 * environment, "reuse-stderr FILE" closes descriptor 2 and opens FILE in
 * its place, "close-stderr-at-exit" closes descriptor 2 in an atexit
 * handler (as GNU coreutils' close_stdout does), "close-all FILE" closes
 * every descriptor from 2 to 1023 and opens FILE under 2 and 512,
 * "small-only" allocates no huge block, "print-lines" leaves two lines in
 * stdout's buffer, "locked-stdout" exits while another thread holds
 * stdout's lock, "fork" has a child allocate a huge block and exit first,
 * "chdir DIR" changes directory before exit, "fork-after" forks after its
 * huge block and has the child exit serving none, "at-secure DIR" prints
 * first "at_secure N" (getauxval(AT_SECURE)), "dir_writable N" (whether
 * the effective user could create a file in DIR) and "settings_from_env N"
 * (how many settings of ckalloc_stats_json, when the library is there,
 * came from the environment). CKALLOC_SHOW_STATS prints at
 * exit only, into the stderr the program started with. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/auxv.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

#include "stats_json.h"

static void close_stderr(void) { close(2); }

static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;

static void *hold_stdout(void *arg) {
    (void)arg;
    flockfile(stdout);
    fputs("held\n", stdout);
    pthread_mutex_unlock(&held);
    for (;;) pause();
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (argc > 2 && strcmp(mode, "at-secure") == 0) {
        printf("at_secure %lu\n", getauxval(AT_SECURE));
        char path[4096];
        snprintf(path, sizeof path, "%s/written-by-euid", argv[2]);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
        printf("dir_writable %d\n", fd >= 0);
        if (fd >= 0) {
            close(fd);
            unlink(path);
        }
        const char *json = library_stats_json();
        int from_env = -1;
        if (json) {
            from_env = 0;
            for (const char *at = json; (at = strstr(at, "\"source\":\"environment\"")); at++)
                from_env++;
        }
        printf("settings_from_env %d\n", from_env);
    }
    if (strcmp(mode, "small-only") == 0) {
        char *small = malloc(100);
        if (!small) return 2;
        free(small);
        return 0;
    }
    if (strcmp(mode, "fork") == 0) {
        pid_t child = fork();
        if (child < 0) return 5;
        if (child > 0) {
            int status = 0;
            if (waitpid(child, &status, 0) != child || status != 0) return 6;
        }
    }
    char *big = malloc(5u << 20);
    char *small = malloc(100);
    if (!big || !small) return 2;
    memset(big, 1, 5u << 20);
    free(big);
    free(small);
    if (argc > 1 && strcmp(argv[1], "quick") == 0) _exit(0);
    if (argc > 1 && strcmp(argv[1], "clearenv") == 0) clearenv();
    if (argc > 2 && strcmp(argv[1], "reuse-stderr") == 0) {
        close(2);
        if (open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0600) != 2) return 3;
    }
    if (argc > 1 && strcmp(argv[1], "close-stderr-at-exit") == 0) atexit(close_stderr);
    if (argc > 2 && strcmp(argv[1], "close-all") == 0) {
        for (int fd = 2; fd < 1024; fd++) close(fd);
        if (open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0600) != 2) return 3;
        if (dup2(2, 512) != 512) return 4;
    }
    if (strcmp(mode, "fork-after") == 0) {
        pid_t child = fork();
        if (child < 0) return 5;
        if (child == 0) exit(0);
        int status = 0;
        if (waitpid(child, &status, 0) != child || status != 0) return 6;
    }
    if (strcmp(mode, "print-lines") == 0) printf("first line\nlast line\n");
    if (strcmp(mode, "locked-stdout") == 0) {
        pthread_t t;
        pthread_mutex_lock(&held);
        if (pthread_create(&t, NULL, hold_stdout, NULL) != 0) return 7;
        pthread_mutex_lock(&held);
    }
    if (argc > 2 && strcmp(mode, "chdir") == 0 && chdir(argv[2]) != 0) return 8;
    return 0;
}
