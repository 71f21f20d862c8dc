/*
 * dl_idiom: dlopen(3)'s idiom for telling a failed dlsym from a NULL symbol, on libraries that
 * are not CUDA (as GLib's g_module_symbol and many plugin loaders do): clear dlerror(), call
 * dlsym, and take a non-NULL dlerror() as failure. Under the shim every answer must be the one
 * the program gets bare: no message the shim's own lookups left behind.
 *
 * Output (stdout): one line per problem, then "problems <n>". Exit code: the number of problems.
 */
#include <dlfcn.h>
#include <stdio.h>

static int problems;

static void expect_found(void *handle, const char *what, const char *name) {
    dlerror();
    void *f = dlsym(handle, name);
    const char *e = dlerror();
    if (e != NULL || f == NULL) {
        printf("dlsym(%s, %s) reported a failure: %s\n", what, name, e ? e : "(NULL result)");
        problems++;
    }
}

int main(void) {
    const char *e = dlerror();
    if (e != NULL) {
        printf("an error was pending when main started: %s\n", e);
        problems++;
    }
    void *libm = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    e = dlerror();
    if (libm == NULL || e != NULL) {
        printf("dlopen(libm.so.6) reported a failure: %s\n", e ? e : "(NULL handle)");
        return 1;
    }
    expect_found(libm, "libm", "cos");
    expect_found(libm, "libm", "sqrt");
    void *self = dlopen(NULL, RTLD_NOW);
    expect_found(self, "the program", "printf");
    /* A real failure is still one. */
    dlerror();
    void *f = dlsym(libm, "no_such_symbol_anywhere");
    e = dlerror();
    if (f != NULL || e == NULL) {
        printf("a missing symbol was not reported as one\n");
        problems++;
    }
    printf("problems %d\n", problems);
    return problems > 125 ? 125 : problems;
}
