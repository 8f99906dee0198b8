/* An I/O fault a test can switch on and off under a live process (LD_PRELOAD).
 *
 * While the file named by $LL_FAULT_SWITCH exists, every write, pwrite and ftruncate to a file
 * whose path starts with $LL_FAULT_DIR fails with EIO, as on a disk that stopped taking writes;
 * each such failure appends a line to $LL_FAULT_SWITCH.log, so the test can assert that the
 * fault really happened. Everything else (reads, the log on stderr, other files) is untouched.
 * Removing the switch heals the "disk".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int faulty(int fd) {
    const char *sw = getenv("LL_FAULT_SWITCH");
    const char *dir = getenv("LL_FAULT_DIR");
    if (!sw || !dir || access(sw, F_OK) != 0) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    if (strncmp(path, dir, strlen(dir)) != 0) return 0;
    char log[4200];
    snprintf(log, sizeof log, "%s.log", sw);
    FILE *f = fopen(log, "a");
    if (f) {
        fprintf(f, "EIO %s\n", path);
        fclose(f);
    }
    return 1;
}

#define REAL(ret, name, ...) \
    static ret (*real)(__VA_ARGS__); \
    if (!real) real = (ret (*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

ssize_t write(int fd, const void *buf, size_t count) {
    REAL(ssize_t, "write", int, const void *, size_t);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t off) {
    REAL(ssize_t, "pwrite", int, const void *, size_t, off_t);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real(fd, buf, count, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t off) {
    REAL(ssize_t, "pwrite64", int, const void *, size_t, off_t);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real(fd, buf, count, off);
}

int ftruncate(int fd, off_t len) {
    REAL(int, "ftruncate", int, off_t);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real(fd, len);
}

int ftruncate64(int fd, off_t len) {
    REAL(int, "ftruncate64", int, off_t);
    if (faulty(fd)) { errno = EIO; return -1; }
    return real(fd, len);
}
