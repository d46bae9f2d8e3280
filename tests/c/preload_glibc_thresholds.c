/* Where glibc puts the requests the preload library leaves to it: prints
 * "mapped N", the mappings glibc's mallinfo2 counts (hblks) while one
 * 1 MiB block is live, then "heap_after_free N", the bytes of glibc's main
 * heap (arena) after eight 1 MiB blocks at its top were freed. glibc's
 * defaults map the first 1 MiB block (M_MMAP_THRESHOLD starts at 128 KiB);
 * the preload library's thresholds take it from the heap and leave the
 * freed 8 MiB in place (M_TRIM_THRESHOLD 16 MiB). Last, "json " and the
 * glibc keys of the library's ckalloc_stats_json ("json none" without the
 * library). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#define MIB ((size_t)1 << 20)

int main(void) {
    char *one = malloc(MIB);
    if (!one) return 2;
    memset(one, 1, MIB);
    printf("mapped %zu\n", mallinfo2().hblks);
    free(one);
    char *blocks[8];
    for (int i = 0; i < 8; i++) {
        blocks[i] = malloc(MIB);
        if (!blocks[i]) return 2;
        memset(blocks[i], 1, MIB);
    }
    for (int i = 7; i >= 0; i--) free(blocks[i]);
    printf("heap_after_free %zu\n", mallinfo2().arena);
    size_t (*stats_json)(char *, size_t) =
        (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "ckalloc_stats_json");
    if (!stats_json) {
        printf("json none\n");
        return 0;
    }
    static char json[65536];
    stats_json(json, sizeof json);
    char *keys = strstr(json, "\"glibc_thresholds\"");
    char *end = keys ? strchr(keys, '}') : NULL;
    if (!end) return 3;
    printf("json %.*s\n", (int)(end - keys), keys);
    return 0;
}
