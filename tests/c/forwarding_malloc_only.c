/* forwarding_malloc.c's malloc alone: an object ahead of
 * libckalloc_preload.so that takes only the program's malloc calls. */
#define FORWARD_MALLOC_ONLY
#include "forwarding_malloc.c"
