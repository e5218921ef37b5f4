/* Sealed read-only memfds: see memfd.h. */
#include "memfd.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)

int gm_memfd_sealed(const char *name, size_t len, gm_memfd_fill_fn *fill, const void *ctx, int *ret_fd) {
        int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        int r = 0;
        void *map = MAP_FAILED;
        if (ftruncate(fd, (off_t) len) < 0 ||
            (len && (map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED))
                r = -errno;
        if (r == 0 && len) {
                fill(map, len, ctx);
                munmap(map, len); /* F_SEAL_WRITE refuses while a writable mapping exists */
        }
        if (r == 0 && fcntl(fd, F_ADD_SEALS, SEALS) < 0)
                r = -errno;
        if (r < 0) {
                close(fd);
                return r;
        }
        *ret_fd = fd;
        return 0;
}
