/* Allocates one huge and one small block, then leaves by exit(0); with an
 * argument first: "quick" leaves by _exit(0), "clearenv" clears the
 * environment, "reuse-stderr FILE" closes descriptor 2 and opens FILE in
 * its place, "close-stderr-at-exit" closes descriptor 2 in an atexit
 * handler (as GNU coreutils' close_stdout does), "close-all FILE" closes
 * every descriptor from 2 to 1023 and opens FILE under 2 and 512.
 * CKALLOC_SHOW_STATS prints at exit only, into the stderr the program
 * started with. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void close_stderr(void) { close(2); }

int main(int argc, char **argv) {
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
    return 0;
}
