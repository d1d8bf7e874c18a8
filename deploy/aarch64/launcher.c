/* dist/aarch64/bmoe: a static launcher for the bundled glibc build (scripts/build-aarch64).
 *
 * Android has no /lib/ld-linux-aarch64.so.1 and no /bin/sh, and a program interpreter (PT_INTERP)
 * cannot be relative to the executable. So this static binary, which needs nothing from the
 * system, runs lib/bmoe through the loader shipped next to it, with the library path pinned to
 * lib/. ggml then finds its CPU variant modules (libggml-cpu-*.so) in lib/ as "the executable's
 * folder" (/proc/self/exe is the loader there).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "bmoe launcher: cannot read /proc/self/exe: %s\n", strerror(errno));
        return 2;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) *slash = '\0';
    char loader[PATH_MAX], libdir[PATH_MAX], prog[PATH_MAX];
    snprintf(loader, sizeof loader, "%s/lib/ld-linux-aarch64.so.1", self);
    snprintf(libdir, sizeof libdir, "%s/lib", self);
    snprintf(prog, sizeof prog, "%s/lib/bmoe", self);
    char **args = calloc((size_t)argc + 6, sizeof *args);
    if (!args) return 2;
    int k = 0;
    args[k++] = loader;
    args[k++] = "--library-path";
    args[k++] = libdir;
    args[k++] = "--argv0";
    args[k++] = argv[0];
    args[k++] = prog;
    for (int i = 1; i < argc; i++) args[k++] = argv[i];
    args[k] = NULL;
    execv(loader, args);
    fprintf(stderr, "bmoe launcher: cannot run %s: %s\n", loader, strerror(errno));
    return 2;
}
