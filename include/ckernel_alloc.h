/*
 * ckernel_alloc.h - C interface of ckalloc (https://crates.io/crates/ckalloc),
 * source-compatible with the C-Kernel-Engine allocator header of the same name.
 *
 * Link: cc prog.c -I<ckalloc>/include -L<ckalloc>/target/release -lckalloc
 *       (add -Wl,-rpath,<ckalloc>/target/release for the shared library, or
 *        link target/release/libckalloc.a with -lpthread -ldl -lm).
 *
 * All functions are thread-safe. None prints; failures are reported by the
 * return value, and ck_last_error() gives the reason on the calling thread.
 * A child of fork() may call every function, whatever the parent's other
 * threads were doing (pthread_atfork handlers; see docs/reliability.md,
 * "Fork safety").
 */
#ifndef CKERNEL_ALLOC_H
#define CKERNEL_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Return a block of `bytes` of zeroed memory, rounded up to a multiple of
 * 2 MiB and 2 MiB aligned, from ckalloc's huge-page engine: explicit hugetlb
 * pages, else transparent huge pages, else normal pages (docs/engine.md has
 * the rules). Returns NULL when `bytes` is 0, when rounding it up would
 * overflow, or when no memory can be had (see ck_last_error()).
 */
void *ck_huge_alloc(size_t bytes);

/*
 * Free a block returned by ck_huge_alloc. The whole block is freed whatever
 * `bytes` says (the library finds its length from `ptr`), so 0 is accepted.
 * The engine may keep the freed memory and hand the same address out again
 * at the next ck_huge_alloc. NULL and a pointer that is not the start of a
 * live block are ignored, and the latter sets ck_last_error(). As with
 * free(), free each block once: a second free after the address was handed
 * out again frees the new block.
 */
void ck_huge_free(void *ptr, size_t bytes);

/* How a bump arena is backed. */
typedef enum {
    CK_BUMP_MODE_UNINITIALIZED = 0,
    CK_BUMP_MODE_ANON = 1,              /* anonymous memory; weights copied in */
    CK_BUMP_MODE_MIXED_FILE_BACKED = 2, /* weights pages map the file read-only */
} ck_bump_mode_t;

/* One contiguous arena [base, base + total_size): weights at
 * [weights_base, activations_base), runtime data from activations_base on.
 * Offsets are relative to base and equal the weights file's offsets. */
typedef struct {
    uint8_t *base;
    size_t total_size;
    size_t weights_base;
    size_t activations_base;
    size_t mapped_len;        /* bytes of address space the arena occupies */
    size_t weights_file_size; /* size of the weights file, 0 without one */
    ck_bump_mode_t mode;
} ck_bump_alloc_t;

/*
 * Set up an arena of `total_size` bytes. Anonymous memory is tried first; on
 * Linux, when that fails and `weights_path` names a weights file, the weights
 * pages map that file read-only and the runtime region stays anonymous
 * (mixed mode, for inference only: the weights cannot be written).
 * CK_BUMP_FORCE_MIXED / CK_BUMP_DISABLE_MIXED in the environment force or
 * forbid mixed mode. `weights_path` may be NULL.
 * Returns 0 and fills every field, or returns -1, zeroes *alloc (mode
 * CK_BUMP_MODE_UNINITIALIZED), maps nothing, and sets ck_last_error().
 * Calling it again on a live arena without ck_bump_alloc_free() first leaks
 * that arena (the struct may hold garbage, so it cannot be detected).
 */
int ck_bump_alloc_init(ck_bump_alloc_t *alloc,
                       const char *weights_path,
                       size_t total_size,
                       size_t weights_base,
                       size_t activations_base);

/* Release the arena and zero *alloc. Safe on a zeroed struct, twice, or NULL. */
void ck_bump_alloc_free(ck_bump_alloc_t *alloc);

/* 1 unless the arena is in mixed mode (the weights are already in place);
 * also 1 for NULL or an uninitialized struct. */
int ck_bump_alloc_needs_weight_materialization(const ck_bump_alloc_t *alloc);

/* ---- ckalloc additions ---- */

/* The reason for the last failure on this thread ("" if none). The string
 * stays valid until the next failing call on the same thread. Call it after
 * the failing call has returned, not as another argument of the same call
 * (C leaves the order in which arguments are evaluated unspecified). */
const char *ck_last_error(void);

/* Copy bytes [weights_base, activations_base) of the weights file into an
 * anonymous arena; a NULL `weights_path` reads the file given to
 * ck_bump_alloc_init (a failure when that was NULL too). A no-op returning 0
 * in mixed mode and when weights_base equals activations_base. 0 on success,
 * -1 on failure (see ck_last_error()); the arena stays usable either way. */
int ck_bump_alloc_materialize_weights(ck_bump_alloc_t *alloc, const char *weights_path);

#ifdef __cplusplus
}
#endif

#endif /* CKERNEL_ALLOC_H */
