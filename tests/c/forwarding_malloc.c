/* A shared object that defines the allocator functions and passes every
 * call straight to glibc's own (__libc_*), as an allocator or a tracer
 * preloaded ahead of libckalloc_preload.so would take them: the program's
 * calls then never reach the library. malloc_usable_size and
 * posix_memalign are left to whatever comes next; with FORWARD_MALLOC_ONLY
 * defined, everything but malloc. */
#include <stddef.h>

extern void *__libc_malloc(size_t size);
extern void __libc_free(void *p);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);

void *malloc(size_t size) { return __libc_malloc(size); }
#ifndef FORWARD_MALLOC_ONLY
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t size) { return __libc_calloc(n, size); }
void *realloc(void *p, size_t size) { return __libc_realloc(p, size); }
#endif
