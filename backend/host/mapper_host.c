/* Host backend mapping: a segment's range is a PROT_NONE reservation; each
 * piece is a MAP_SHARED|MAP_FIXED mapping of its memfd, not inherited by
 * fork() children (MADV_DONTFORK) so a child never pins its parent's memory. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mapper.h"

static int host_reserve(gm_mapper_t *m, uint64_t va_size, uint64_t *ret_base) {
        void *p = mmap(NULL, va_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
                return -errno;
        *ret_base = (uint64_t) (uintptr_t) p;
        return 0;
}

static int map_with(uint64_t base, uint64_t offset, uint64_t length, int fd, int prot) {
        void *want = (void *) (uintptr_t) (base + offset);
        void *p = mmap(want, length, prot, MAP_SHARED | MAP_FIXED, fd, 0);
        int r = p == MAP_FAILED ? -errno : 0;
        close(fd);
        if (r < 0)
                return r;
        if (madvise(p, length, MADV_DONTFORK) < 0) {
                r = -errno;
                mmap(want, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
                return r;
        }
        return 0;
}

static int host_map(gm_mapper_t *m, uint64_t base, uint64_t offset, uint64_t length, int fd) {
        return map_with(base, offset, length, fd, PROT_READ | PROT_WRITE);
}

static int host_map_read(gm_mapper_t *m, uint64_t base, uint64_t offset, uint64_t length, int fd) {
        return map_with(base, offset, length, fd, PROT_READ);
}

static int host_unmap(gm_mapper_t *m, uint64_t base, uint64_t offset, uint64_t length) {
        /* Replacing the mapping drops the memfd reference and keeps the reservation. */
        void *p = mmap((void *) (uintptr_t) (base + offset), length, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        return p == MAP_FAILED ? -errno : 0;
}

static int host_move(gm_mapper_t *m, uint64_t from, uint64_t to, uint64_t length) {
        /* mremap with old_size 0 maps the same shared pages once more: the
         * memory is at both places until the old one goes. */
        void *p = mremap((void *) (uintptr_t) from, 0, length, MREMAP_MAYMOVE | MREMAP_FIXED, (void *) (uintptr_t) to);
        if (p == MAP_FAILED)
                return -errno;
        int r = madvise(p, length, MADV_DONTFORK) < 0 ? -errno : host_unmap(m, from, 0, length);
        if (r < 0)
                host_unmap(m, to, 0, length);
        return r;
}

static int host_copy_to_host(gm_mapper_t *m, void *host, uint64_t device, uint64_t length) {
        memcpy(host, (const void *) (uintptr_t) device, length);
        return 0;
}

static int host_copy_from_host(gm_mapper_t *m, uint64_t device, const void *host, uint64_t length) {
        memcpy((void *) (uintptr_t) device, host, length);
        return 0;
}

static int host_unreserve(gm_mapper_t *m, uint64_t base, uint64_t va_size) {
        return munmap((void *) (uintptr_t) base, va_size) < 0 ? -errno : 0;
}

static void host_destroy(gm_mapper_t *m) {
        free(m);
}

static const gm_mapper_ops_t host_ops = {
        .backend = "host",
        .caps = &gm_kind_host_caps,
        .reserve = host_reserve,
        .map = host_map,
        .map_read = host_map_read,
        .unmap = host_unmap,
        .move = host_move,
        .copy_to_host = host_copy_to_host,
        .copy_from_host = host_copy_from_host,
        .unreserve = host_unreserve,
        .destroy = host_destroy,
};

int gm_mapper_host_new(uint64_t granularity, gm_mapper_t **ret) {
        gm_mapper_t *m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->ops = &host_ops;
        m->granularity = granularity;
        *ret = m;
        return 0;
}
