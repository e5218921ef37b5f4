/* Cuda backend: every segment is one cuMemCreate allocation of pinned device
 * memory, exported as a POSIX file descriptor that the daemon passes to the
 * owning client. Invariant: in_use is the sum of the sizes of the segments
 * created and not yet released, and never exceeds capacity. The device's
 * primary context stays retained for the backend's life and is made current on
 * the calling thread before each driver call. A failure's text is left in
 * gm_cuda_last_error() (the ops have no reterr). */
#include "backend.h"
#include "cuda_loader.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cuda_backend {
        gm_backend_t base; /* first: the ops receive &base */
        const gm_cuda_t *cu;
        CUdevice dev;
        CUcontext ctx; /* the device's primary context, retained */
        CUmemAllocationProp prop;
} cuda_backend_t;

static int make_current(cuda_backend_t *cb) {
        CUresult r = cb->cu->CtxSetCurrent(cb->ctx);
        return r == CUDA_SUCCESS ? 0 : gm_cuda_fail(cb->cu, r, "cuCtxSetCurrent");
}

static int set_cloexec(int fd) {
        int flags = fcntl(fd, F_GETFD);
        if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0)
                return -errno;
        return 0;
}

static int cuda_create(gm_backend_t *b, uint64_t size, gm_phys_t *ret_phys) {
        cuda_backend_t *cb = (cuda_backend_t *)b;
        const gm_cuda_t *cu = cb->cu;

        if (size == 0 || size % b->granularity != 0)
                return gm_cuda_fail_errno(-EINVAL, "segment size %" PRIu64 " is not a multiple of the granularity %" PRIu64,
                                          size, b->granularity);
        if (size > b->capacity - b->in_use)
                return gm_cuda_fail_errno(-ENOMEM,
                                          "cuda backend capacity: %" PRIu64 " of %" PRIu64 " bytes in use, %" PRIu64
                                          " more requested",
                                          b->in_use, b->capacity, size);
        int r = make_current(cb);
        if (r < 0)
                return r;

        CUmemGenericAllocationHandle handle;
        CUresult cr = cu->MemCreate(&handle, size, &cb->prop, 0);
        if (cr != CUDA_SUCCESS)
                return gm_cuda_fail(cu, cr, "cuMemCreate");
        int fd = -1;
        cr = cu->MemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (cr != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuMemExportToShareableHandle");
                goto fail_release;
        }
        /* The driver does not promise CLOEXEC on the fd it creates. */
        r = set_cloexec(fd);
        if (r < 0) {
                gm_cuda_fail_errno(r, "fcntl(FD_CLOEXEC) on an exported handle: %s", strerror(-r));
                close(fd);
                goto fail_release;
        }
        b->in_use += size;
        *ret_phys = (gm_phys_t){.fd = fd, .size = size, .handle = handle};
        return 0;

fail_release:
        cu->MemRelease(handle);
        return r;
}

static void cuda_release(gm_backend_t *b, gm_phys_t *phys) {
        cuda_backend_t *cb = (cuda_backend_t *)b;
        assert(phys->size <= b->in_use);
        close(phys->fd);
        phys->fd = -1;
        CUresult cr = cb->cu->MemRelease((CUmemGenericAllocationHandle)phys->handle);
        if (cr != CUDA_SUCCESS)
                gm_cuda_fail(cb->cu, cr, "cuMemRelease");
        b->in_use -= phys->size;
}

static int cuda_adopt(gm_backend_t *b, int fd, uint64_t size, gm_phys_t *ret_phys) {
        cuda_backend_t *cb = (cuda_backend_t *)b;
        if (size == 0 || size % b->granularity != 0) {
                close(fd);
                return gm_cuda_fail_errno(-EINVAL, "stored segment of %" PRIu64 " bytes", size);
        }
        int r = make_current(cb);
        if (r < 0) {
                close(fd);
                return r;
        }
        CUmemGenericAllocationHandle handle;
        CUresult cr = cb->cu->MemImportFromShareableHandle(&handle, (void *)(uintptr_t)fd,
                                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (cr != CUDA_SUCCESS) {
                close(fd);
                return gm_cuda_fail(cb->cu, cr, "cuMemImportFromShareableHandle");
        }
        b->in_use += size; /* it exists: counted even beyond the capacity */
        *ret_phys = (gm_phys_t){.fd = fd, .size = size, .handle = (uint64_t)handle};
        return 0;
}

static int cuda_mem_info(gm_backend_t *b, uint64_t *ret_free, uint64_t *ret_total) {
        cuda_backend_t *cb = (cuda_backend_t *)b;
        int r = make_current(cb);
        if (r < 0)
                return r;
        size_t free_bytes, total_bytes;
        CUresult cr = cb->cu->MemGetInfo(&free_bytes, &total_bytes);
        if (cr != CUDA_SUCCESS)
                return gm_cuda_fail(cb->cu, cr, "cuMemGetInfo");
        *ret_free = free_bytes;
        *ret_total = total_bytes;
        return 0;
}

static void cuda_destroy(gm_backend_t *b) {
        cuda_backend_t *cb = (cuda_backend_t *)b;
        cb->cu->DevicePrimaryCtxRelease(cb->dev);
        free(cb);
}

static const gm_backend_ops_t cuda_ops = {
        .name = "cuda",
        .create = cuda_create,
        .release = cuda_release,
        .adopt = cuda_adopt,
        .mem_info = cuda_mem_info,
        .destroy = cuda_destroy,
};

int gm_backend_cuda_open(const gm_backend_options_t *opts, gm_backend_t **ret_backend, char *reterr, size_t reterr_len) {
        const gm_cuda_t *cu;
        cuda_backend_t *cb = NULL;
        int ordinal;
        CUresult cr;
        int r = gm_cuda_load(&cu);
        if (r < 0)
                goto fail;
        cb = calloc(1, sizeof(*cb));
        if (!cb) {
                r = gm_cuda_fail_errno(-ENOMEM, "out of memory");
                goto fail;
        }
        cb->cu = cu;
        r = gm_cuda_find_device(cu, opts->device, opts->device_uuid, &cb->dev, &ordinal);
        if (r < 0)
                goto fail_free;
        cr = cu->DevicePrimaryCtxRetain(&cb->ctx, cb->dev);
        if (cr != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuDevicePrimaryCtxRetain");
                goto fail_free;
        }
        r = make_current(cb);
        if (r < 0)
                goto fail_ctx;

        cb->prop = gm_cuda_alloc_prop(ordinal);
        size_t granularity = 0;
        cr = cu->MemGetAllocationGranularity(&granularity, &cb->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (cr != CUDA_SUCCESS) {
                r = gm_cuda_fail(cu, cr, "cuMemGetAllocationGranularity (POSIX fd handles)");
                goto fail_ctx;
        }
        if (granularity == 0) {
                r = gm_cuda_fail_errno(-EIO, "cuMemGetAllocationGranularity returned 0");
                goto fail_ctx;
        }
        uint64_t capacity = opts->capacity;
        if (capacity == 0) {
                size_t total;
                cr = cu->DeviceTotalMem(&total, cb->dev);
                if (cr != CUDA_SUCCESS) {
                        r = gm_cuda_fail(cu, cr, "cuDeviceTotalMem");
                        goto fail_ctx;
                }
                capacity = total;
        }
        cb->base = (gm_backend_t){
                .ops = &cuda_ops,
                .device = ordinal,
                .capacity = capacity,
                .granularity = granularity,
        };
        *ret_backend = &cb->base;
        return 0;

fail_ctx:
        cu->DevicePrimaryCtxRelease(cb->dev);
fail_free:
        free(cb);
fail:
        if (reterr && reterr_len > 0)
                snprintf(reterr, reterr_len, "%s", gm_cuda_last_error());
        return r;
}
