/* Host backend: every segment is a sealed memfd, counted against a byte
 * capacity. Invariant: in_use is the sum of the sizes of the segments created
 * and not yet released, and never exceeds capacity. The memfd's pages are
 * allocated lazily, on first touch by whoever maps it. */
#include "backend.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_GRANULARITY (2ull << 20)          /* bytes: a huge page, so a segment can use THP */
#define HOST_DEFAULT_CAPACITY_MAX (8ull << 30) /* bytes */
/* Sealed so that no holder of the fd can grow it past what was charged. Not
 * F_SEAL_SHRINK: a segment is mapped by its one session's process only (a
 * holder that shrinks it hurts only its own mapping), and host_mapped()
 * truncates released memory to nothing. Not F_SEAL_SEAL: host_mapped() adds
 * F_SEAL_WRITE to learn whether any writable mapping is left (the kernel
 * refuses it with EBUSY while one is). */
#define HOST_SEALS F_SEAL_GROW

static int host_create(gm_backend_t *b, uint64_t size, gm_phys_t *ret_phys) {
        if (size == 0 || size % b->granularity != 0)
                return -EINVAL;
        if (size > b->capacity - b->in_use)
                return -ENOMEM;

        int fd = memfd_create("gpumem-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, (off_t) size) < 0 || fcntl(fd, F_ADD_SEALS, HOST_SEALS) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        b->in_use += size;
        *ret_phys = (gm_phys_t){.fd = fd, .size = size, .handle = 0};
        return 0;
}

static void host_release(gm_backend_t *b, gm_phys_t *phys) {
        assert(phys->size <= b->in_use);
        close(phys->fd);
        phys->fd = -1;
        b->in_use -= phys->size;
}

static int host_adopt(gm_backend_t *b, int fd, uint64_t size, gm_phys_t *ret_phys) {
        struct stat st;
        int seals = fcntl(fd, F_GET_SEALS);
        if (fstat(fd, &st) < 0 || (uint64_t) st.st_size != size || seals < 0 || (seals & HOST_SEALS) != HOST_SEALS ||
            size == 0 || size % b->granularity != 0) {
                close(fd);
                return -EINVAL;
        }
        b->in_use += size; /* it exists: counted even beyond the capacity */
        *ret_phys = (gm_phys_t){.fd = fd, .size = size, .handle = 0};
        return 0;
}

static int host_mem_info(gm_backend_t *b, uint64_t *ret_free, uint64_t *ret_total) {
        *ret_free = b->capacity - b->in_use;
        *ret_total = b->capacity;
        return 0;
}

static void host_destroy(gm_backend_t *b) {
        free(b);
}

/* Asked only when the memory is on its way out (its session is over, or
 * its client said it unmapped it): the pages are punched out of the memfd
 * first, so the data is gone for every copy a client kept (the fd, a
 * private or read-only mapping). Sealing writes then succeeds only once no
 * shared writable mapping is left anywhere (a punch after the seal is
 * refused, so it comes first). Once sealed, the file is cut to size 0 and
 * sealed against growing and shrinking: a kept mapping now lies past the
 * end of the file (a touch is SIGBUS, never a new page), a kept fd can
 * neither write nor fallocate, so no holder can pin memory again. */
static int host_mapped(gm_backend_t *b, const gm_phys_t *phys) {
        fallocate(phys->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t) phys->size);
        if (fcntl(phys->fd, F_ADD_SEALS, F_SEAL_WRITE) < 0)
                return errno == EBUSY ? 1 : 0;
        if (ftruncate(phys->fd, 0) == 0)
                fcntl(phys->fd, F_ADD_SEALS, F_SEAL_SHRINK);
        return 0;
}

/* A staging memfd was created without F_SEAL_SEAL (HOST_SEALS), so the
 * seals that make it immutable can still be added; the kernel refuses
 * F_SEAL_WRITE with EBUSY while a shared writable mapping exists. From
 * then on a PROT_WRITE mmap of it is refused to every holder. */
static int host_freeze(gm_backend_t *b, const gm_phys_t *phys) {
        (void) b;
        if (fcntl(phys->fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
                return -errno;
        return 0;
}

static const gm_backend_ops_t host_ops = {
        .name = "host",
        .caps = &gm_kind_host_caps,
        .create = host_create,
        .release = host_release,
        .adopt = host_adopt,
        .mapped = host_mapped,
        .freeze = host_freeze,
        .mem_info = host_mem_info,
        .destroy = host_destroy,
};

/* min(8 GiB, physical RAM / 4), or 0 when RAM cannot be determined. */
static uint64_t default_capacity(void) {
        long pages = sysconf(_SC_PHYS_PAGES);
        long page_size = sysconf(_SC_PAGESIZE);
        if (pages <= 0 || page_size <= 0)
                return 0;
        uint64_t quarter = (uint64_t) pages / 4 * (uint64_t) page_size;
        return quarter < HOST_DEFAULT_CAPACITY_MAX ? quarter : HOST_DEFAULT_CAPACITY_MAX;
}

int gm_backend_host_open(const gm_backend_options_t *opts, gm_backend_t **ret_backend, char *reterr,
                         size_t reterr_len) {
        uint64_t capacity = opts->capacity ? opts->capacity : default_capacity();
        /* Only whole granules can be handed out. */
        capacity -= capacity % HOST_GRANULARITY;
        if (capacity == 0) {
                if (opts->capacity)
                        snprintf(reterr, reterr_len, "host capacity %llu bytes is below the 2 MiB granularity",
                                 (unsigned long long) opts->capacity);
                else
                        snprintf(reterr, reterr_len, "cannot determine the physical memory size; set a capacity");
                return -EINVAL;
        }

        gm_backend_t *b = calloc(1, sizeof(*b));
        if (!b) {
                snprintf(reterr, reterr_len, "out of memory");
                return -ENOMEM;
        }
        b->ops = &host_ops;
        b->device = opts->device;
        b->capacity = capacity;
        b->granularity = HOST_GRANULARITY;
        *ret_backend = b;
        return 0;
}
