/* Shared by the preload test programs: the library's statistics as JSON
 * (`ckalloc_stats_json`, looked up with dlsym, so a program also runs
 * without the library). Needs _GNU_SOURCE (RTLD_DEFAULT). */
#ifndef CKALLOC_TEST_STATS_JSON_H
#define CKALLOC_TEST_STATS_JSON_H

#include <dlfcn.h>
#include <stddef.h>

/* The library's statistics in a static buffer, or NULL when the library
 * is not there or the JSON does not fit. */
static const char *library_stats_json(void) {
    static char json[65536];
    size_t (*stats_json)(char *, size_t) =
        (size_t (*)(char *, size_t))dlsym(RTLD_DEFAULT, "ckalloc_stats_json");
    return stats_json && stats_json(json, sizeof json) < sizeof json ? json : NULL;
}

#endif
