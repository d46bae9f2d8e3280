/* LD_PRELOAD shim for tests/cli_truncation.rs: truncates a file while the
 * process reads it, at a chosen point, so that the test needs no sleeps.
 *
 * Build: cc -shared -fPIC -O1 -o libtrunc.so truncate_shim.c -ldl
 *
 * It interposes pread/pread64 and mmap/mmap64 (the real functions come from
 * dlsym(RTLD_NEXT, ...)). The file is recognised by device and inode: fstat
 * of the descriptor against stat(TRUNC_PATH) taken when the shim loads.
 * Without TRUNC_PATH and TRUNC_AFTER it does nothing but pass calls on.
 *
 *   TRUNC_PATH        the file to truncate
 *   TRUNC_TO          its new length in bytes (default 0)
 *   TRUNC_AFTER       pread: truncate once, right after the first successful
 *                            pread of the file that returned at least
 *                            TRUNC_MIN_LEN bytes at an offset of at least
 *                            TRUNC_MIN_OFFSET (both default 0);
 *                     mmap:  truncate once, right after the first successful
 *                            mmap of the file;
 *                     any:   truncate once, after whichever of the two comes
 *                            first (a reader that maps the file instead of
 *                            reading it is caught too);
 *                     fault: no truncation; at the first pread of the file
 *                            after an mmap of it, fault with SIGBUS in a
 *                            mapping of the shim's own (one page of a memfd
 *                            shrunk to 0 bytes under it), so the process
 *                            sees a SIGBUS outside every mapping it made.
 *                            Only with a SIGBUS handler installed after
 *                            the mapping (the tool's; the Rust runtime's
 *                            own is there from the start), else exit 99;
 *                            with RLIMIT_CORE 0; and with an alarm(120)
 *                            that ends a handler returning into the fault
 *                            forever;
 *                     none (or unset): nothing.
 *
 * "Once" is an atomic flag: the materialize copy preads on several threads.
 * A failed truncate(2) or a failed set-up of the fault prints one line
 * starting "truncate_shim:" and _exit(99)s, so a test cannot pass by the
 * shim silently doing nothing. */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

enum trigger { T_NONE, T_PREAD, T_MMAP, T_ANY, T_FAULT };

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef ssize_t (*pread64_fn)(int, void *, size_t, off64_t);
typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef void *(*mmap64_fn)(void *, size_t, int, int, int, off64_t);

static enum trigger trigger = T_NONE;
static const char *target_path;
static dev_t target_dev;
static ino_t target_ino;
static off_t trunc_to;
static unsigned long long min_len;
static unsigned long long min_offset;

/* Set by the first thread that acts; the others only pass calls on. */
static atomic_int done = 0;
/* T_FAULT: the file has been mapped. */
static atomic_int mapped = 0;
/* T_FAULT: the SIGBUS handler when the file was mapped (the Rust runtime
 * installs one of its own at start-up; the tool's comes later). */
static _Atomic(void *) handler_at_map;

static _Atomic(pread_fn) real_pread;
static _Atomic(pread64_fn) real_pread64;
static _Atomic(mmap_fn) real_mmap;
static _Atomic(mmap64_fn) real_mmap64;

/* One line on stderr and _exit(99): the shim could not do its job. */
static void die(const char *what) {
    char buf[256];
    int n = snprintf(buf, sizeof buf, "truncate_shim: %s (errno %d)\n", what, errno);
    if (n > 0) {
        ssize_t w = write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
        (void)w;
    }
    _exit(99);
}

static unsigned long long env_u64(const char *name) {
    const char *v = getenv(name);
    return v ? strtoull(v, NULL, 10) : 0;
}

/* Resolving in the constructor keeps dlsym (which may allocate) away from
 * the first interposed call; the wrappers resolve again if a call comes
 * before the constructor ran. */
static void resolve(void) {
    atomic_store(&real_pread, (pread_fn)dlsym(RTLD_NEXT, "pread"));
    atomic_store(&real_pread64, (pread64_fn)dlsym(RTLD_NEXT, "pread64"));
    atomic_store(&real_mmap, (mmap_fn)dlsym(RTLD_NEXT, "mmap"));
    atomic_store(&real_mmap64, (mmap64_fn)dlsym(RTLD_NEXT, "mmap64"));
}

__attribute__((constructor)) static void init(void) {
    resolve();
    const char *after = getenv("TRUNC_AFTER");
    target_path = getenv("TRUNC_PATH");
    if (!after || !target_path) {
        return;
    }
    struct stat st;
    if (stat(target_path, &st) != 0) {
        die("stat(TRUNC_PATH) failed");
    }
    target_dev = st.st_dev;
    target_ino = st.st_ino;
    trunc_to = (off_t)env_u64("TRUNC_TO");
    min_len = env_u64("TRUNC_MIN_LEN");
    min_offset = env_u64("TRUNC_MIN_OFFSET");
    if (strcmp(after, "pread") == 0) {
        trigger = T_PREAD;
    } else if (strcmp(after, "mmap") == 0) {
        trigger = T_MMAP;
    } else if (strcmp(after, "any") == 0) {
        trigger = T_ANY;
    } else if (strcmp(after, "fault") == 0) {
        trigger = T_FAULT;
    }
}

static int is_target(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == target_dev && st.st_ino == target_ino;
}

static void truncate_once(void) {
    if (atomic_exchange(&done, 1) == 0 && truncate(target_path, trunc_to) != 0) {
        die("truncate(TRUNC_PATH) failed");
    }
}

/* A genuine SIGBUS fault at an address no part of ckalloc mapped: read a
 * page of a file mapping past the (now zero) end of the file. */
static void fault_once(void) {
    if (atomic_exchange(&done, 1) != 0) {
        return;
    }
    /* The point is a SIGBUS the tool's handler sees: refuse to fault
     * without one (the default action would pass the test by itself). */
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) != 0) {
        die("sigaction(SIGBUS) query failed");
    }
    void *handler = (void *)now.sa_sigaction;
    if (now.sa_handler == SIG_DFL || now.sa_handler == SIG_IGN ||
        handler == atomic_load(&handler_at_map)) {
        errno = 0;
        die("no SIGBUS handler installed since the file was mapped");
    }
    /* A handler that returns without ending the process faults again
     * forever: end that with SIGALRM instead of hanging the test. */
    alarm(120);
    /* SIGBUS's default action dumps core; none is wanted from a test. */
    struct rlimit no_core = {0, 0};
    (void)setrlimit(RLIMIT_CORE, &no_core);
    int fd = memfd_create("truncate_shim", MFD_CLOEXEC);
    if (fd < 0) {
        die("memfd_create failed");
    }
    long page = sysconf(_SC_PAGESIZE);
    if (ftruncate(fd, page) != 0) {
        die("ftruncate(memfd, page) failed");
    }
    mmap_fn m = atomic_load(&real_mmap);
    volatile char *p = m(NULL, (size_t)page, PROT_READ, MAP_SHARED, fd, 0);
    if ((void *)p == MAP_FAILED) {
        die("mmap of the memfd failed");
    }
    if (ftruncate(fd, 0) != 0) {
        die("ftruncate(memfd, 0) failed");
    }
    char c = p[0]; /* SIGBUS */
    (void)c;
    die("reading past the end of its own mapping raised no SIGBUS");
}

static void after_pread(int fd, ssize_t n, unsigned long long offset) {
    if ((trigger != T_PREAD && trigger != T_ANY) || n <= 0 || atomic_load(&done)) {
        return;
    }
    if ((unsigned long long)n >= min_len && offset >= min_offset && is_target(fd)) {
        truncate_once();
    }
}

static void before_pread(int fd) {
    if (trigger == T_FAULT && atomic_load(&mapped) && !atomic_load(&done) && is_target(fd)) {
        fault_once();
    }
}

static void after_mmap(int fd, void *p) {
    if (trigger == T_NONE || trigger == T_PREAD || p == MAP_FAILED || fd < 0 ||
        atomic_load(&done) || !is_target(fd)) {
        return;
    }
    if (trigger == T_MMAP || trigger == T_ANY) {
        truncate_once();
    } else if (trigger == T_FAULT && !atomic_load(&mapped)) {
        struct sigaction at_map;
        if (sigaction(SIGBUS, NULL, &at_map) != 0) {
            die("sigaction(SIGBUS) query failed");
        }
        atomic_store(&handler_at_map, (void *)at_map.sa_sigaction);
        atomic_store(&mapped, 1);
    }
}

ssize_t pread(int fd, void *buf, size_t count, off_t offset) {
    pread_fn f = atomic_load(&real_pread);
    if (!f) {
        resolve();
        f = atomic_load(&real_pread);
    }
    before_pread(fd);
    ssize_t n = f(fd, buf, count, offset);
    int saved = errno;
    after_pread(fd, n, (unsigned long long)offset);
    errno = saved;
    return n;
}

ssize_t pread64(int fd, void *buf, size_t count, off64_t offset) {
    pread64_fn f = atomic_load(&real_pread64);
    if (!f) {
        resolve();
        f = atomic_load(&real_pread64);
    }
    before_pread(fd);
    ssize_t n = f(fd, buf, count, offset);
    int saved = errno;
    after_pread(fd, n, (unsigned long long)offset);
    errno = saved;
    return n;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset) {
    mmap_fn f = atomic_load(&real_mmap);
    if (!f) {
        resolve();
        f = atomic_load(&real_mmap);
    }
    void *p = f(addr, len, prot, flags, fd, offset);
    int saved = errno;
    after_mmap(fd, p);
    errno = saved;
    return p;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t offset) {
    mmap64_fn f = atomic_load(&real_mmap64);
    if (!f) {
        resolve();
        f = atomic_load(&real_mmap64);
    }
    void *p = f(addr, len, prot, flags, fd, offset);
    int saved = errno;
    after_mmap(fd, p);
    errno = saved;
    return p;
}
