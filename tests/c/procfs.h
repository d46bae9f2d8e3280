/* Shared by the preload test programs: a field of /proc/self/status
 * (proc(5)), read with stdio. */
#ifndef CKALLOC_TEST_PROCFS_H
#define CKALLOC_TEST_PROCFS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number after "FIELD:" in /proc/self/status (kB for the Vm* fields,
 * a count for Threads); -1 when it cannot be read. */
static long status_field(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':') v = atol(line + n + 1);
    fclose(f);
    return v;
}

#endif /* CKALLOC_TEST_PROCFS_H */
