/* preload_glibc_thresholds.c, for a build without PIE (-no-pie -fno-pic),
 * as Debian builds python3: the process's malloc address is the program's
 * PLT entry, and the library must still see that it was preloaded. */
#include "preload_glibc_thresholds.c"
