/*
 * drv_next_helper.c — built as libdrvnext.so, loaded after the preloaded shim. Its
 * drvnext_lookup() asks dlsym(RTLD_NEXT, name): glibc answers relative to the *caller* (this
 * library), so for a symbol only this library and earlier objects define, the answer is NULL.
 * An interposed dlsym that made itself the caller would find this library's own definition.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

int drvnext_target(void) { return 42; }

void *drvnext_lookup(const char *name) { return dlsym(RTLD_NEXT, name); }
