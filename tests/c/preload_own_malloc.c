/* preload_glibc_thresholds.c in a program that defines malloc, free,
 * calloc and realloc itself (forwarding_malloc.c's, which pass every call
 * to glibc): the program's calls, and libc's, go to its own first. */
#include "forwarding_malloc.c"
#include "preload_glibc_thresholds.c"
