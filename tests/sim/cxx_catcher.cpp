// A C++ library that plays torch's role for the exception test: it loads liboomshim.so (as
// ctypes does), calls its allocator and catches what it throws. A C program dlopens this library
// RTLD_LOCAL, as Python loads torch's extension, so libstdc++ is in no global scope: the shim
// must still find the C++ runtime to throw (tests/clients/torch_alloc_local.c).

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include <exception>

typedef void *(*alloc_fn)(size_t, int, void *);

extern "C" int cxxcatch_alloc(const char *lib, size_t bytes, char *what, size_t cap) {
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) return -2;
    alloc_fn alloc = (alloc_fn)dlsym(h, "oomshim_torch_alloc");
    if (alloc == NULL) return -2;
    try {
        void *p = alloc(bytes, 0, NULL);
        return p != NULL ? 0 : -1;
    } catch (const std::exception &e) {
        snprintf(what, cap, "%s", e.what());
        return 1;
    }
}
