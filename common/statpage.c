/* The statistics page: creation, mapping and the sequence lock. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "statpage.h"

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

int gm_statpage_create(size_t payload_size, int *ret_fd) {
        if (payload_size > GM_STATPAGE_PAYLOAD_MAX)
                return -EINVAL;
        int fd = memfd_create("gpumem-stats", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        gm_statpage_t header = {.magic = GM_STATPAGE_MAGIC, .payload_size = (uint32_t) payload_size};
        int r = 0;
        if (ftruncate(fd, GM_STATPAGE_SIZE) < 0 || pwrite(fd, &header, sizeof(header), 0) != sizeof(header) ||
            fcntl(fd, F_ADD_SEALS, SEALS) < 0)
                r = -errno;
        if (r < 0) {
                close(fd);
                return r;
        }
        *ret_fd = fd;
        return 0;
}

int gm_statpage_map(int fd, bool writable, gm_statpage_t **ret_page) {
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (st.st_size != GM_STATPAGE_SIZE)
                return -EBADF;
        if (writable) {
                int seals = fcntl(fd, F_GET_SEALS);
                if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
                        return -EBADF;
        }
        void *p = mmap(NULL, GM_STATPAGE_SIZE, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
                return -errno;
        gm_statpage_t *page = p;
        if (writable && (page->magic != GM_STATPAGE_MAGIC || page->payload_size > GM_STATPAGE_PAYLOAD_MAX)) {
                munmap(p, GM_STATPAGE_SIZE);
                return -EBADMSG;
        }
        *ret_page = page;
        return 0;
}

void gm_statpage_unmap(gm_statpage_t *page) {
        if (page)
                munmap(page, GM_STATPAGE_SIZE);
}

static _Atomic uint64_t *seq_of(const gm_statpage_t *page) {
        return (_Atomic uint64_t *) &((gm_statpage_t *) page)->seq;
}

int gm_statpage_read(const gm_statpage_t *page, void *dst, size_t len, unsigned max_tries) {
        return gm_statpage_read_at(page, 0, dst, len, max_tries);
}

int gm_statpage_read_at(const gm_statpage_t *page, size_t offset, void *dst, size_t len, unsigned max_tries) {
        if (offset > GM_STATPAGE_PAYLOAD_MAX || len > GM_STATPAGE_PAYLOAD_MAX - offset)
                return -EINVAL;
        const _Atomic uint64_t *seq = seq_of(page);
        for (unsigned i = 0; i < max_tries; i++) {
                uint64_t before = atomic_load_explicit(seq, memory_order_acquire);
                if (before & 1)
                        continue;
                memcpy(dst, (const uint8_t *) page + GM_STATPAGE_PAYLOAD_OFFSET + offset, len);
                atomic_thread_fence(memory_order_acquire);
                if (atomic_load_explicit(seq, memory_order_relaxed) != before)
                        continue;
                return __atomic_load_n(&page->magic, __ATOMIC_RELAXED) == GM_STATPAGE_MAGIC ? 0 : -EBADMSG;
        }
        return -EAGAIN;
}
