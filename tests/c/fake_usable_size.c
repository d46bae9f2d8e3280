/* A library that defines malloc_usable_size as every allocator does, with a
 * wrong answer: preloaded after libckalloc_preload.so, it must not be asked
 * about glibc's blocks. */
#include <stddef.h>

size_t malloc_usable_size(void *p) {
    (void)p;
    return 1;
}
