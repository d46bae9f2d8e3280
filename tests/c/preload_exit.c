/* Allocates one huge and one small block, then leaves by exit(0), or by
 * _exit(0) when given "quick": CKALLOC_SHOW_STATS prints at exit only. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char *big = malloc(5u << 20);
    char *small = malloc(100);
    if (!big || !small) return 2;
    memset(big, 1, 5u << 20);
    free(big);
    free(small);
    if (argc > 1 && strcmp(argv[1], "quick") == 0) _exit(0);
    return 0;
}
